"""How KempnerForge trains, as four training options: pure bf16 (``master_weights: false``),
FSDP's ``no_sync`` accumulation (``fsdp_no_sync``), the loss on gathered 16-bit logits
(``cross_entropy: replicated``) and the token embedding whole on every tp rank
(``vocab_parallel_embedding: false``). Every figure is a hand calculation written here; the sources
are KempnerInstitute/KempnerForge@5666d0d (``scripts/train.py``, ``kempnerforge/training/
grad.py``, ``kempnerforge/distributed/tensor_parallel.py``, ``kempnerforge/training/loss.py``)
and PyTorch's FSDP2 (``_fsdp_param.py`` ``to_accumulated_grad_if_needed``,
``_fsdp_collectives.py`` ``foreach_reduce``)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner.catalog import load_catalog
from planner.cli import main
from planner.exports import export_files
from planner.plan import make_plan, read_plan, write_plan
from planner.study_config import load_study_config
from search_spaces.frameworks import why_not
from simcore import estimate
from simcore.megatron.batched import estimate_many
from simcore.megatron.calls import embedding_calls, head_calls
from simcore.megatron.plan import StepPlan
from simcore.megatron.stack import uses_fp32_shards
from simcore.megatron.states import model_state_bytes
from simcore.network import Collective
from simcore.specs import (
    Axis,
    Convention,
    CrossEntropy,
    Recompute,
    Strategy,
    TrainingSpec,
    ZeroStage,
)

GB = 1e9
# Llama 3 8B at sequence 4096, micro-batch 4, KempnerForge's 7B: 4 x 4096 tokens, vocabulary
# 128256 (its experiment 05: tp 4 on one node of 4 H200).
TOKENS, VOCAB = 4 * 4096, 128256
PURE = TrainingSpec(global_batch=8, seq_len=4096, master_weights=False, flash_attention=True,
                    transformer_engine=False, cross_entropy=CrossEntropy.PYTORCH)


def _estimate(training: TrainingSpec, strategy: Strategy, system: str = "kempner-h200-4"):
    c = load_catalog()
    return estimate(c.model("llama3-8b"), c.system(system), training, strategy)


def _with_and_without_no_sync(global_batch: int):
    """dp 2 x tp 4 FSDP, micro-batch 4, fp32 reduction, on two Kempner nodes: without and with
    ``fsdp_no_sync`` (global batch 16: two micro-batches a step; 8: one)."""
    training = replace(PURE, global_batch=global_batch, bytes_per_param_grads=4)
    fsdp = Strategy(dp=2, tp=4, zero=ZeroStage.PARAMETERS, micro_batch=4,
                    recompute=Recompute.FULL)
    return (_estimate(training, fsdp, "kempner-h200-8"),
            _estimate(replace(training, fsdp_no_sync=True), fsdp, "kempner-h200-8"))


def test_pure_bf16_states_are_eight_bytes_a_parameter() -> None:
    # 2 (bf16 weight) + 2 (bf16 gradient) + 2 x 2 (Adam's moments in bf16), not 2 + 2 + 12
    assert PURE.optimizer_bytes == 4
    assert model_state_bytes(1e9, PURE, ZeroStage.NONE, 1) == (2e9, 2e9, 4e9)
    # FSDP over 4 ranks shards all three: (2 + 2 + 4) / 4 bytes a parameter
    assert model_state_bytes(1e9, PURE, ZeroStage.PARAMETERS, 4) == (0.5e9, 0.5e9, 1e9)
    mixed = replace(PURE, master_weights=True)
    assert model_state_bytes(1e9, mixed, ZeroStage.NONE, 1) == (2e9, 2e9, 12e9)


def test_pure_bf16_fsdp_shards_the_16_bit_parameter_not_an_fp32_one() -> None:
    system = load_catalog().system("kempner-h200-4")
    assert uses_fp32_shards(system, replace(PURE, master_weights=True), ZeroStage.PARAMETERS)
    assert not uses_fp32_shards(system, PURE, ZeroStage.PARAMETERS)


def test_master_weights_and_an_optimizer_size_are_not_both_given() -> None:
    with pytest.raises(ValueError, match="master_weights"):
        TrainingSpec(global_batch=8, seq_len=4096, master_weights=False,
                     bytes_per_param_optimizer=8)


def test_a_runs_row_giving_both_is_a_value_to_fix(tmp_path: Path, capsys) -> None:
    # an explicit optimizer_bytes 12 (the default) beside master_weights false was read as left
    # empty, and 10 was refused naming the spec's field (bytes_per_param_optimizer): both are
    # one line naming the row's cells
    header = ("name,model,system,global_batch,seq_len,dp,tp,pp,micro_batch,step_time_s,"
              "master_weights,optimizer_bytes")
    for size in ("12", "10"):
        runs = tmp_path / "runs.csv"
        runs.write_text(f"{header}\nr,llama3-8b,kempner-h200-1,8,4096,1,1,1,2,3.1,false,{size}\n")
        assert main(["validate", str(runs)]) == 1
        out = capsys.readouterr()
        said = out.out + out.err
        assert f"{runs}:2 (r): optimizer_bytes='{size}' with master_weights false" in said
        assert "bytes_per_param" not in said
    study = tmp_path / "study.yaml"  # and a study's training, whatever the size
    study.write_text(STUDY.format(framework="any", master="false")
                     .replace("  fsdp_no_sync", "  optimizer_bytes: 12\n  fsdp_no_sync"))
    assert main(["run", str(study), "--storage", str(tmp_path / "s.db")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "training.optimizer_bytes: master_weights false sets the optimizer state" in line
    with pytest.raises(ValueError, match="give optimizer_bytes or master_weights, not both"):
        TrainingSpec(global_batch=8, seq_len=4096, master_weights=False,
                     bytes_per_param_optimizer=10)


def test_pure_bf16_takes_eight_bytes_a_parameter_less_optimizer_state_on_one_gpu() -> None:
    one = Strategy(dp=1, micro_batch=2, recompute=Recompute.FULL)
    pure = _estimate(PURE, one, "kempner-h200-1")
    mixed = _estimate(replace(PURE, master_weights=True), one, "kempner-h200-1")
    params = mixed.memory.optimizer / 12  # the estimate's own count of the parameters
    assert params == pytest.approx(8.03e9, rel=0.01)  # Llama 3 8B
    assert mixed.memory.optimizer - pure.memory.optimizer == pytest.approx(8 * params)


def test_no_sync_keeps_the_whole_gradient_in_the_reduction_s_type() -> None:
    # dp 2 x tp 4, micro-batch 4, batch 16: two micro-batches a step, so FSDP2 keeps each
    # layer's unsharded gradient between them, upcast to its fp32 reduce_dtype (grad_bytes 4).
    plain, synced = _with_and_without_no_sync(global_batch=16)
    local = plain.memory.weights * 2 / 2  # the bf16 shard (2 bytes) is one of 2: the tp rank's
    assert local == pytest.approx(8.03e9 / 4, rel=0.01)  # parameters, Llama 3 8B over tp 4
    # each micro-batch reduce-scatters: the rank's half of the fp32 gradient, 4 / 2 bytes
    assert plain.memory.gradients == pytest.approx(local * 4 / 2)
    # no_sync: the whole fp32 gradient, 4 bytes, and not its shard beside it (the last
    # micro-batch frees each layer's whole gradient as it makes the shard)
    assert synced.memory.gradients == pytest.approx(local * 4)
    # one reduce-scatter a step, not one a micro-batch: the FSDP time falls, nothing else moves
    assert synced.time.compute == plain.time.compute
    assert synced.step_time < plain.step_time


def test_no_sync_changes_nothing_with_one_micro_batch() -> None:
    plain, synced = _with_and_without_no_sync(global_batch=8)
    assert synced.memory == plain.memory
    assert synced.step_time == plain.step_time


def test_replicated_loss_holds_every_logit_in_16_bits() -> None:
    tp4 = Strategy(dp=1, tp=4, micro_batch=4, recompute=Recompute.FULL)
    vocab_parallel = _estimate(PURE, tp4)
    replicated = _estimate(replace(PURE, cross_entropy=CrossEntropy.REPLICATED), tp4)
    # pytorch on the rank's vocabulary shard: 12 bytes a logit over V / 4, i.e. 3 T V;
    # replicated: 8 bytes a logit over the whole V (the logits the loop holds, the
    # log-softmax output, the two gradients), 8 T V. The difference: 5 T V bytes.
    diff = replicated.memory.activations - vocab_parallel.memory.activations
    assert diff == pytest.approx(5 * TOKENS * VOCAB)  # 10.5 GB
    assert replicated.step_time > vocab_parallel.step_time


def test_replicated_loss_gathers_the_16_bit_logits_forward_only() -> None:
    c = load_catalog()
    tp4 = Strategy(dp=1, tp=4, micro_batch=4, recompute=Recompute.FULL)
    training = replace(PURE, cross_entropy=CrossEntropy.REPLICATED)
    plan = StepPlan(c.model("llama3-8b"), c.system("kempner-h200-4"), training, tp4)
    forward = head_calls(plan, backward=False)
    # sequence parallelism's gather of (b, s, h), then the logits' (b, s, V / 4 a rank, bf16)
    assert [call[1] for call in forward] == [Collective.ALL_GATHER, Collective.ALL_GATHER]
    assert forward[1][2] == TOKENS * VOCAB * 2 / 4
    assert [call[1] for call in head_calls(plan, backward=True)] == [Collective.REDUCE_SCATTER]


EMBEDDING = VOCAB * 4096  # Llama 3 8B's token embedding: 525,336,576 parameters


def test_a_whole_token_embedding_on_every_tp_rank_keeps_all_its_states() -> None:
    tp4 = Strategy(dp=1, tp=4, micro_batch=4, recompute=Recompute.FULL)
    split = _estimate(PURE, tp4)
    whole = _estimate(replace(PURE, vocab_parallel_embedding=False), tp4)
    kept = EMBEDDING * (1 - 1 / 4)  # the three quarters a split table leaves to the others
    assert whole.memory.weights - split.memory.weights == pytest.approx(kept * 2)  # bf16
    assert whole.memory.gradients - split.memory.gradients == pytest.approx(kept * 2)
    assert whole.memory.optimizer - split.memory.optimizer == pytest.approx(kept * 4)
    assert whole.memory.activations == split.memory.activations
    one = Strategy(dp=4, micro_batch=2, recompute=Recompute.FULL)  # tp 1: nothing to split
    assert (_estimate(replace(PURE, vocab_parallel_embedding=False), one).memory
            == _estimate(PURE, one).memory)


def test_a_whole_token_embedding_needs_no_collective() -> None:
    c = load_catalog()
    tp4 = Strategy(dp=1, tp=4, micro_batch=4, recompute=Recompute.FULL,
                   sequence_parallel=True)
    split = StepPlan(c.model("llama3-8b"), c.system("kempner-h200-4"), PURE, tp4)
    # Megatron-LM's VocabParallelEmbedding: the (b, s, h) output reduce-scattered under SP
    assert embedding_calls(split) == [(Axis.TP, Collective.REDUCE_SCATTER, TOKENS * 4096 * 2)]
    whole = StepPlan(c.model("llama3-8b"), c.system("kempner-h200-4"),
                     replace(PURE, vocab_parallel_embedding=False), tp4)
    assert embedding_calls(whole) == []


def test_frameworks_that_keep_master_weights_refuse_pure_bf16() -> None:
    model = load_catalog().model("llama3-8b")
    plan = Strategy(dp=8)
    for framework in ("megatron", "deepspeed", "torchtitan"):
        assert "master_weights false" in why_not(framework, model, PURE, plan)
        assert "fsdp_no_sync" in why_not(
            framework, model, replace(PURE, master_weights=True, fsdp_no_sync=True), plan)
        assert "vocab_parallel_embedding false" in why_not(
            framework, model, replace(PURE, master_weights=True,
                                      vocab_parallel_embedding=False), plan)
    assert why_not("any", model, PURE, plan) is None


def test_planner_estimate_takes_the_four_options(capsys) -> None:
    args = ["estimate", "--model", "llama3-8b", "--system", "kempner-h200-8", "--dp", "2",
            "--tp", "4", "--fsdp", "--micro-batch", "4", "--global-batch", "16",
            "--seq-len", "4096", "--recompute", "full", "--no-transformer-engine",
            "--grad-bytes", "4", "--json"]
    assert main(args) == 0
    base = json.loads(capsys.readouterr().out)
    assert main([*args, "--no-master-weights", "--fsdp-no-sync",
                 "--cross-entropy", "replicated"]) == 0
    kempner = json.loads(capsys.readouterr().out)
    assert kempner["memory"]["optimizer"] < base["memory"]["optimizer"]
    assert kempner["memory"]["gradients"] > base["memory"]["gradients"]
    assert main([*args, "--no-master-weights", "--fsdp-no-sync", "--cross-entropy", "replicated",
                 "--no-vocab-parallel-embedding"]) == 0
    whole = json.loads(capsys.readouterr().out)
    # three quarters of the table's 2-byte weights over dp 2 more on each rank
    assert whole["memory"]["weights"] - kempner["memory"]["weights"] == pytest.approx(
        EMBEDDING * 3 / 4 * 2 / 2, rel=1e-6)


STUDY = """model: llama3-8b
system: kempner-h200-8
framework: {framework}
training:
  global_batch: 32
  seq_len: 4096
  master_weights: {master}
  fsdp_no_sync: true
  cross_entropy: replicated
space: {{tp: [1, 2, 4], pp: [1], zero: [3], recompute: [full]}}
"""


def test_a_study_takes_them_and_a_framework_that_cannot_run_them_says_why(
        tmp_path: Path, capsys) -> None:
    study = tmp_path / "study.yaml"
    study.write_text(STUDY.format(framework="any", master="false"))
    training = load_study_config(study).training
    assert (training.master_weights, training.fsdp_no_sync) == (False, True)
    assert training.cross_entropy is CrossEntropy.REPLICATED
    assert main(["run", str(study), "--storage", str(tmp_path / "a.db")]) == 0
    capsys.readouterr()
    study.write_text(STUDY.format(framework="megatron", master="false"))
    assert main(["run", str(study), "--storage", str(tmp_path / "m.db")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fsdp_no_sync" in err[0] and "framework any" in err[0]
    study.write_text(STUDY.format(framework="any", master="2"))
    assert main(["run", str(study), "--storage", str(tmp_path / "b.db")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "training.master_weights" in err[0]


def test_a_plan_file_keeps_them_and_estimates_the_same(tmp_path: Path) -> None:
    c = load_catalog()
    training = replace(PURE, global_batch=16, bytes_per_param_grads=4, fsdp_no_sync=True,
                       cross_entropy=CrossEntropy.REPLICATED, vocab_parallel_embedding=False)
    strategy = Strategy(dp=2, tp=4, zero=ZeroStage.PARAMETERS, micro_batch=4,
                        recompute=Recompute.FULL)
    plan = make_plan(c.model("llama3-8b"), c.system("kempner-h200-8"), training, strategy,
                     Convention.MEGATRON)
    path = tmp_path / "plan.yaml"
    write_plan(plan, path)
    again = read_plan(path)
    assert again.training == training
    assert again.estimate.step_time == plan.estimate.step_time
    assert again.estimate.memory == plan.estimate.memory
    # no framework but any runs a whole embedding on every tp rank: the exports say so
    for fmt in ("megatron", "torchtitan", "deepspeed"):
        with pytest.raises(ValueError, match="vocab_parallel_embedding false"):
            export_files(again, fmt)


def test_the_batched_estimate_prices_them_as_the_scalar_one(tmp_path: Path) -> None:
    # A study's many plans go through the batched path: the same figures, plan by plan.
    study = tmp_path / "study.yaml"
    study.write_text(STUDY.format(framework="any", master="false").replace(
        "  cross_entropy: replicated\n",
        "  cross_entropy: replicated\n  vocab_parallel_embedding: false\n").replace(
        "space: {tp: [1, 2, 4], pp: [1], zero: [3], recompute: [full]}",
        "space: {tp: [1, 2, 4], pp: [1, 2], zero: [0, 1, 3], recompute: [full, none],"
        " micro_batch: [1, 2]}"))
    config = load_study_config(study)
    assert not config.training.vocab_parallel_embedding
    plans = config.space.valid
    assert len(plans) > 20
    result = estimate_many(config.model, config.system, config.training, plans)
    for i, strategy in enumerate(plans):
        est = estimate(config.model, config.system, config.training, strategy)
        assert float(result.step_time[i]) == pytest.approx(est.step_time, rel=1e-9)
        assert float(result.peak_memory[i]) == pytest.approx(est.memory.total, rel=1e-9)
