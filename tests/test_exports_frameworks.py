"""The Megatron-LM, DeepSpeed and torchtitan exporters against hand-written expected files.

The expected files in ``tests/data/exports/frameworks/`` were written by hand from the frameworks'
own sources (see that folder's README.md), each number derived from the plan:
Llama-3-70B on 1,024 H100 (``dgx-h100-1024``), global batch 2048 x seq 8192, dp=8 tp=8 pp=4
sp=4, interleaved 1F1B with v=2, selective recompute, ZeRO-1, micro-batch 1. So:
micro-batches per step = 2048 / (1 * 8) = 256, layers per virtual stage = 80 / (4 * 2) = 10.

Option and field names checked in:
- Megatron-LM d98e8a64 ``megatron/training/arguments.py`` (and the dataclass fields it turns into
  options: ``megatron/core/model_parallel_config.py``,
  ``megatron/core/transformer/transformer_config.py``, ``megatron/training/config/*.py``);
- DeepSpeed edaa7221 ``docs/_pages/config-json.md``, ``deepspeed/runtime/config.py``
  (``_batch_assertion``), ``deepspeed/runtime/zero/config.py``; Megatron-DeepSpeed 4efb479d
  ``megatron/arguments.py``;
- torchtitan v0.2.2 ``torchtitan/config/job_config.py`` (TOML) and main b5bcd76c
  ``torchtitan/trainer.py``, ``torchtitan/config/configs.py`` (Python ``Trainer.Config``).
"""

from __future__ import annotations

import ast
import json
import re
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

import simcore
from planner.catalog import load_catalog
from planner.exports import export_files
from planner.exports._deepspeed import ds_config, launcher_args
from planner.plan import Plan, make_plan
from search_spaces.frameworks import with_framework_defaults
from simcore.specs import (
    Convention,
    CpComm,
    CrossEntropy,
    Recompute,
    Schedule,
    SelectiveRecompute,
    Strategy,
    TrainingSpec,
    ZeroStage,
)

DATA = Path(__file__).parent / "data" / "exports" / "frameworks"
STEM = "llama3-70b-dp8-tp8-pp4-sp4"


# -- plans ------------------------------------------------------------------------------------
def _plan(model: str = "llama3-70b", system: str = "dgx-h100-1024", global_batch: int = 2048,
          seq_len: int = 8192, selective: SelectiveRecompute | None = None,
          cp_comm: CpComm | None = None, **strategy: object) -> Plan:
    c = load_catalog()
    knobs: dict[str, object] = {"dp": 8, "tp": 8, "pp": 4, "sp": 4,
                                "zero": ZeroStage.OPTIMIZER, "recompute": Recompute.SELECTIVE,
                                "micro_batch": 1, "schedule": Schedule.INTERLEAVED, "v": 2}
    knobs.update(strategy)
    return make_plan(c.model(model), c.system(system),
                     TrainingSpec(global_batch=global_batch, seq_len=seq_len,
                                  selective_recompute=selective, cp_comm=cp_comm),
                     Strategy(**knobs), Convention.MEGATRON)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def plan() -> Plan:
    return _plan()


@pytest.fixture(scope="module")
def torchtitan_plan() -> Plan:
    """The plan as a torchtitan study makes it: its selective recompute per-op."""
    return _plan(selective=SelectiveRecompute.OP)


@pytest.fixture(scope="module")
def zero3_plan() -> Plan:
    """ZeRO-3 / FSDP, no pipeline, no tensor parallelism: dp=128 tp=1 pp=1 sp=8."""
    return _plan(dp=128, tp=1, pp=1, sp=8, zero=ZeroStage.PARAMETERS, recompute=Recompute.FULL,
                 schedule=Schedule.ONE_F_ONE_B, v=1)


@pytest.fixture(scope="module")
def gpipe_plan() -> Plan:
    """GPipe on GPT-3 175B (multi-head attention, tied embeddings): 8 x 128 = 1024 devices."""
    return _plan(model="gpt3-175b", global_batch=1536, seq_len=2048, dp=8, tp=8, pp=16, sp=1,
                 zero=ZeroStage.NONE, recompute=Recompute.NONE, schedule=Schedule.GPIPE, v=1)


@pytest.fixture(scope="module")
def gpt3_plan() -> Plan:
    """The GPipe plan's layout with 1F1B, which Megatron-LM and DeepSpeed run."""
    return _plan(model="gpt3-175b", global_batch=1536, seq_len=2048, dp=8, tp=8, pp=16, sp=1,
                 zero=ZeroStage.NONE, recompute=Recompute.NONE, schedule=Schedule.ONE_F_ONE_B,
                 v=1)


def _args(script: str) -> list[str]:
    """The script's lines that are not comments or blank (what bash runs)."""
    return [ln.strip() for ln in script.splitlines()
            if ln.strip() and not ln.strip().startswith("#")]


# -- Megatron-LM ------------------------------------------------------------------------------
def test_megatron_matches_hand_written_script(plan: Plan) -> None:
    expected = (DATA / f"{STEM}.megatron.sh").read_text()
    expected = expected.replace("<STEP_TIME>", f"{plan.estimate.step_time:.3f}")
    expected = expected.replace("<PEAK_MEMORY>", f"{plan.estimate.peak_memory / 1e9:.1f}")
    assert export_files(plan, "megatron") == {"megatron.sh": expected}
    # the jit-fused loss's 6 bytes a logit more: 8,192 / cp 4 tokens x 128,256 / tp 8 logits
    assert f"about {6 * 8192 / 4 * 128256 / 8 / 1e9:.1f} GB more on the last stage" in expected


def _llama3_8b_h100(seq_len: int, tp: int, micro_batch: int) -> Plan:
    """Llama 3 8B on 8 H100 (85.52 GB each), ZeRO-1, full recompute, one stage."""
    return _plan(model="llama3-8b", system="dgx-h100-8", global_batch=64, seq_len=seq_len,
                 dp=8 // tp, tp=tp, pp=1, sp=1, recompute=Recompute.FULL,
                 micro_batch=micro_batch, schedule=Schedule.ONE_F_ONE_B, v=1)


def _more(plan: Plan, loss: CrossEntropy) -> float:
    """Bytes the last stage holds under ``loss`` beyond the plan's estimate."""
    training = replace(plan.training, cross_entropy=loss)
    return (simcore.estimate(plan.model, plan.system, training, plan.strategy, plan.convention)
            .stages[-1].memory.total - plan.estimate.stages[-1].memory.total)


def test_megatron_runs_its_unfused_loss_where_its_jit_fused_one_does_not_fit() -> None:
    # Priced with Transformer Engine's in-place loss (4 bytes a logit), which d98e8a64 refuses.
    # 4 x 16,384 tokens x 128,256 / tp 2 logits: its jit-fused loss (10 bytes) holds
    # 6 x 4.20 G = 25.2 GB more, its unfused one (6 bytes, no flag) 2 x 4.20 G = 8.4 GB.
    plan = _llama3_8b_h100(16384, tp=2, micro_batch=4)
    logits = 4 * 16384 * 128256 / 2
    assert _more(plan, CrossEntropy.MEGATRON_FUSED) == pytest.approx(6 * logits)
    assert _more(plan, CrossEntropy.MEGATRON) == pytest.approx(2 * logits)
    assert plan.estimate.fits and plan.estimate.memory.total + 6 * logits > 85.52e9
    assert plan.estimate.memory.total + 2 * logits < 85.52e9
    script = export_files(plan, "megatron")["megatron.sh"]
    assert "--cross-entropy-loss-fusion" not in _args(script)
    assert f"# runs (6 bytes a logit): about {2 * logits / 1e9:.1f} GB more" in script


def test_megatron_refuses_a_plan_none_of_its_losses_fits() -> None:
    # 4 x 8,192 tokens x 128,256 logits at tp 1: 2 bytes a logit more (the unfused loss) is
    # 8.4 GB over an estimate of 83.4 GB, past the 85.52 GB an H100 has.
    plan = _llama3_8b_h100(8192, tp=1, micro_batch=4)
    assert plan.estimate.fits
    assert plan.estimate.memory.total + 2 * 4 * 8192 * 128256 > 85.52e9
    with pytest.raises(ValueError, match="over the 85.52 GB it has: d98e8a64 refuses Transformer"
                       " Engine's in-place loss .* run the study with cross_entropy: megatron"):
        export_files(plan, "megatron")


def test_megatron_zero3_uses_megatron_fsdp(zero3_plan: Plan) -> None:
    script = export_files(zero3_plan, "megatron")["megatron.sh"]
    args = _args(script)
    assert "--use-megatron-fsdp" in args
    assert "--data-parallel-sharding-strategy optim_grads_params" in args
    assert "--ckpt-format fsdp_dtensor" in args
    assert "--use-distributed-optimizer" not in args  # Megatron-FSDP sets it itself
    assert "unset CUDA_DEVICE_MAX_CONNECTIONS" in args
    assert not any(a.startswith("export CUDA_DEVICE_MAX_CONNECTIONS") for a in args)
    assert "--context-parallel-size 8" in args
    assert ["--recompute-granularity full", "--recompute-method uniform",
            "--recompute-num-layers 1"] == [a for a in args if a.startswith("--recompute")]


def test_megatron_no_sequence_parallel_flag_when_tp_is_1(zero3_plan: Plan) -> None:
    assert zero3_plan.strategy.sequence_parallel  # asked for, but tp=1
    assert "--sequence-parallel" not in _args(export_files(zero3_plan, "megatron")["megatron.sh"])


def test_megatron_no_sequence_parallel_flag_when_not_asked(plan: Plan) -> None:
    p = _plan(sequence_parallel=False)
    assert "--sequence-parallel" not in _args(export_files(p, "megatron")["megatron.sh"])
    assert "--sequence-parallel" in _args(export_files(plan, "megatron")["megatron.sh"])


def test_megatron_refuses_gpipe(gpipe_plan: Plan) -> None:
    # megatron/core/pipeline_parallel/schedules.py: no GPipe schedule (it used to run 1F1B)
    with pytest.raises(ValueError, match="schedule gpipe: Megatron-LM has no GPipe"):
        export_files(gpipe_plan, "megatron")


def test_megatron_1f1b_pipeline(gpt3_plan: Plan) -> None:
    script = export_files(gpt3_plan, "megatron")["megatron.sh"]
    assert "# 1F1B is Megatron's default schedule when pp > 1" in script
    args = _args(script)
    assert not any("virtual" in a for a in args)
    assert "--pipeline-model-parallel-size 16" in args
    # 1536 / (1 * 8) = 192 micro-batches
    assert "# batch: 192 micro-batches per step per replica = 1536 / (1 * 8)" in script


def test_megatron_zero2_uses_megatron_fsdp_optim_grads(gpt3_plan: Plan) -> None:
    # docs/user-guide/features/megatron_fsdp.md: optim_grads shards gradients + optimizer (ZeRO-2)
    args = _args(export_files(replace(gpt3_plan, strategy=replace(
        gpt3_plan.strategy, zero=ZeroStage.GRADIENTS)), "megatron")["megatron.sh"])
    assert "--use-megatron-fsdp" in args
    assert "--data-parallel-sharding-strategy optim_grads" in args
    assert "--use-distributed-optimizer" not in args


def test_megatron_gqa_flags_only_with_kv_heads(plan: Plan, gpt3_plan: Plan) -> None:
    gqa = _args(export_files(plan, "megatron")["megatron.sh"])
    assert "--group-query-attention" in gqa and "--num-query-groups 8" in gqa
    mha = _args(export_files(gpt3_plan, "megatron")["megatron.sh"])
    assert "--group-query-attention" not in mha
    assert not any(a.startswith("--num-query-groups") for a in mha)
    # GPT-3: GELU, tied embeddings, learned positions
    assert "--swiglu" not in mha and "--untie-embeddings-and-output-weights" not in mha
    assert "--use-distributed-optimizer" not in mha  # ZeRO 0


# -- DeepSpeed --------------------------------------------------------------------------------
def test_deepspeed_matches_hand_written_json(plan: Plan) -> None:
    # The reference plan (Ulysses sp=4 with tp 8 and pp 4, interleaved) is one DeepSpeed refuses
    # to run (search_spaces/frameworks.py); its JSON mapping is still checked key by key.
    expected = json.loads((DATA / f"{STEM}.ds_config.json").read_text())
    assert ds_config(plan) == expected
    with pytest.raises(ValueError, match="schedule interleaved"):
        export_files(plan, "deepspeed")


def test_deepspeed_batch_identity(plan: Plan, zero3_plan: Plan, gpipe_plan: Plan) -> None:
    # deepspeed/runtime/config.py _batch_assertion: train_batch_size ==
    # train_micro_batch_size_per_gpu * gradient_accumulation_steps * data-parallel world size
    for p in (plan, zero3_plan, gpipe_plan):
        c = ds_config(p)
        assert c["train_batch_size"] == (c["train_micro_batch_size_per_gpu"]
                                         * c["gradient_accumulation_steps"] * p.strategy.dp)
    assert ds_config(zero3_plan)["gradient_accumulation_steps"] == 2048 // (1 * 128)


def test_deepspeed_readme_has_launcher_args(plan: Plan) -> None:
    # Megatron-DeepSpeed's megatron/initialize.py raises if --sequence-parallel (Megatron's, in
    # tp) comes with --ds-sequence-parallel-size > 1 (Ulysses), so sp=4 leaves the former out.
    expected = ["--deepspeed", "--deepspeed_config ds_config.json", "--zero-stage 1",
                "--tensor-model-parallel-size 8", "--pipeline-model-parallel-size 4",
                "--ds-sequence-parallel-size 4",
                "--micro-batch-size 1", "--global-batch-size 2048",
                "--recompute-granularity selective", "--deepspeed-activation-checkpointing",
                "--bf16",
                # Llama 3 70B (Dubey et al. 2024, Table 3: 80 layers, model dimension 8,192,
                # FFN 28,672, 64 heads, 8 key/value heads) at sequence 8,192, in
                # Megatron-DeepSpeed's names (4efb479d megatron/arguments.py)
                "--num-layers 80", "--hidden-size 8192", "--ffn-hidden-size 28672",
                "--num-attention-heads 64", "--num-key-value-heads 8", "--seq-length 8192",
                "--max-position-embeddings 8192", "--swiglu", "--normalization rmsnorm",
                "--use-rotary-position-embeddings", "--disable-bias-linear",
                "--untie-embeddings-and-output-weights",
                "--attention-dropout 0.0", "--hidden-dropout 0.0",  # Llama: none
                "--use-flash-attn-v2"]  # estimated with flash attention (llama on H100)
    assert launcher_args(plan) == expected
    # estimated as Ulysses runs it (cp_comm a2a, what a deepspeed study sets); a plan whose
    # training names the ring is refused, one that leaves it open is priced again as Ulysses
    # (full recompute: under Ulysses Megatron-DeepSpeed does not run the selective one)
    full = Recompute.FULL
    ring = _plan(dp=256, tp=1, pp=1, sp=4, schedule=Schedule.ONE_F_ONE_B, v=1,
                 cp_comm=CpComm.P2P, recompute=full)
    with pytest.raises(ValueError, match="cp_comm p2p: deepspeed's context parallelism is"):
        export_files(ring, "deepspeed")
    open_ring = _plan(dp=256, tp=1, pp=1, sp=4, schedule=Schedule.ONE_F_ONE_B, v=1,
                      recompute=full)
    launch = export_files(open_ring, "deepspeed")["deepspeed-launch.txt"]
    assert "--ds-sequence-parallel-size 4" in launch
    assert "the stack its study left open; as DeepSpeed runs the plan" in launch
    ulysses = _plan(dp=256, tp=1, pp=1, sp=4, schedule=Schedule.ONE_F_ONE_B, v=1,
                    cp_comm=CpComm.A2A, recompute=full)
    readme = export_files(ulysses, "deepspeed")["deepspeed-launch.txt"]
    for a in launcher_args(ulysses):
        assert f"  {a}\n" in readme
    assert "--ds-sequence-parallel-size 4" in launcher_args(ulysses)
    assert "DeepSpeed-Ulysses" in readme
    no_ulysses = _plan(dp=32, tp=8, pp=4, sp=1)
    assert "--sequence-parallel" in launcher_args(no_ulysses)
    assert not any(a.startswith("--ds-sequence") for a in launcher_args(no_ulysses))
    assert "train_batch_size 2048 = train_micro_batch_size_per_gpu 1" in readme


def test_deepspeed_zero3_and_no_recompute(zero3_plan: Plan, gpipe_plan: Plan) -> None:
    z3 = ds_config(zero3_plan)
    assert z3["zero_optimization"] == {"stage": 3, "overlap_comm": True,
                                       "contiguous_gradients": True, "reduce_scatter": True,
                                       "allgather_partitions": True}
    assert "activation_checkpointing" in z3
    assert "--no-pipeline-parallel" in launcher_args(zero3_plan)
    assert "--sequence-parallel" not in launcher_args(zero3_plan)  # tp=1
    z0 = ds_config(gpipe_plan)
    assert z0["zero_optimization"] == {"stage": 0}
    assert "activation_checkpointing" not in z0
    with pytest.raises(ValueError, match="schedule gpipe: DeepSpeed's pipeline engine"):
        export_files(gpipe_plan, "deepspeed")


def test_deepspeed_rejects_a_broken_batch(plan: Plan) -> None:
    broken = replace(plan, training=replace(plan.training, global_batch=2047))
    with pytest.raises(ValueError, match="micro_batch"):
        ds_config(broken)


# -- torchtitan -------------------------------------------------------------------------------
def _drop_docstrings(tree: ast.Module) -> ast.Module:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:]  # type: ignore[attr-defined]
    return tree


def _python_ast(text: str) -> str:
    compile(text, "torchtitan_config.py", "exec")  # well-formed Python
    return ast.dump(_drop_docstrings(ast.parse(text)))


def test_torchtitan_toml_matches_hand_written(torchtitan_plan: Plan) -> None:
    files = export_files(torchtitan_plan, "torchtitan")
    assert set(files) == {"torchtitan.toml", "torchtitan_config.py"}
    expected = tomllib.loads((DATA / f"{STEM}.torchtitan.toml").read_text())
    assert tomllib.loads(files["torchtitan.toml"]) == expected


def test_torchtitan_python_matches_hand_written(torchtitan_plan: Plan) -> None:
    text = export_files(torchtitan_plan, "torchtitan")["torchtitan_config.py"]
    expected = (DATA / f"{STEM}.torchtitan_config.py").read_text()
    assert _python_ast(text) == _python_ast(expected)
    step = torchtitan_plan.estimate.step_time
    assert f"step time {step:.3f} s" in ast.get_docstring(ast.parse(text))


def test_a_selective_recompute_is_exported_only_where_it_runs(
        plan: Plan, torchtitan_plan: Plan) -> None:
    # Megatron-LM's selective recompute (the attention core) is not torchtitan's (per-op), and
    # per-op checkpointing is torchtitan's alone: each, said so, is refused where the other
    # runs, with the setting that fixes it. A plan whose training names neither (an `any`
    # study's) exports to each as its own, torchtitan's with its figures (its checkpointing).
    megatron = replace(plan, training=replace(plan.training,
                                              selective_recompute=SelectiveRecompute.ATTENTION))
    with pytest.raises(ValueError, match="selective_recompute: op"):
        export_files(megatron, "torchtitan")
    toml = export_files(plan, "torchtitan")["torchtitan.toml"]
    assert 'selective_ac_option = "op"' in toml
    per_op = simcore.estimate(plan.model, plan.system, replace(
        with_framework_defaults(plan.training, "torchtitan", True),
        cross_entropy=CrossEntropy.PYTORCH), plan.strategy)
    assert f"all the logits, 12 bytes a logit)): step time {per_op.step_time:.3f} s" in toml
    one_f_one_b = _plan(selective=SelectiveRecompute.OP, schedule=Schedule.ONE_F_ONE_B, v=1,
                        dp=32, sp=1)
    for framework, op_plan in (("megatron", torchtitan_plan), ("deepspeed", one_f_one_b)):
        with pytest.raises(ValueError, match="per-op checkpointing is torchtitan's"):
            export_files(op_plan, framework)


def test_torchtitan_zero3_is_fsdp_resharding_after_forward(zero3_plan: Plan) -> None:
    files = export_files(zero3_plan, "torchtitan")
    par = tomllib.loads(files["torchtitan.toml"])["parallelism"]
    assert par == {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": 128,
                   "fsdp_reshard_after_forward": "always", "tensor_parallel_degree": 1,
                   "pipeline_parallel_degree": 1, "context_parallel_degree": 8}
    training = tomllib.loads(files["torchtitan.toml"])["training"]
    # pp=1: local batch = micro_batch 1, gradient accumulation 2048 / (1 * 128) = 16
    assert training["local_batch_size"] == 1 and training["global_batch_size"] == 2048
    text = files["torchtitan_config.py"]
    assert 'fsdp_reshard_after_forward="always"' in text.replace("'", '"')
    assert "num_pp_microbatches=1," in text
    assert "activation_checkpoint=FullAC.Config()" in text
    # eager as priced: the trainer captures CUDA graphs by default since torchtitan f84224af
    # (at pp 1 too; an MoE plan's all-to-all dispatcher refuses them)
    assert "disable_cuda_graphs=True," in text
    assert tomllib.loads(files["torchtitan.toml"])["activation_checkpoint"] == {"mode": "full"}
    compile(text, "torchtitan_config.py", "exec")


def test_torchtitan_zero0_replicates_and_gpipe(gpipe_plan: Plan) -> None:
    files = export_files(gpipe_plan, "torchtitan")
    # v0.2.2 runs ZeRO 0 over dp 8 as DDP, which parallelize.py (73a0e697) refuses beside tp or
    # pp: "DDP has not supported > 1D parallelism"; main runs it as FSDP of shard degree 1
    assert "torchtitan.toml" not in files
    text = files["torchtitan_config.py"]
    assert "No torchtitan.toml: torchtitan v0.2.2 runs ZeRO 0 over dp 8 as DDP" in text
    assert "data_parallel_replicate_degree=8," in text
    assert "data_parallel_shard_degree=1," in text
    # the same layout with ZeRO-1 (FSDP that keeps the parameters gathered): v0.2.2 runs it
    plan = _plan(model="gpt3-175b", global_batch=1536, seq_len=2048, dp=8, tp=8, pp=16, sp=1,
                 zero=ZeroStage.OPTIMIZER, recompute=Recompute.NONE, schedule=Schedule.GPIPE,
                 v=1)
    doc = tomllib.loads(export_files(plan, "torchtitan")["torchtitan.toml"])
    par = doc["parallelism"]
    assert par["data_parallel_replicate_degree"] == 1
    assert par["data_parallel_shard_degree"] == 8
    assert par["fsdp_reshard_after_forward"] == "never"
    assert par["pipeline_parallel_schedule"] == "GPipe"
    assert par["pipeline_parallel_layers_per_stage"] == 96 // 16
    # pp > 1: local_batch_size = micro_batch * micro-batches = 1 * 1536 / (1 * 8) = 192
    assert doc["training"]["local_batch_size"] == 192
    assert doc["activation_checkpoint"] == {"mode": "none"}
    assert "model" not in doc or "flavor" not in doc.get("model", {})  # no GPT flavor
    assert "activation_checkpoint=None" in text
    assert "num_pp_microbatches=192," in text
    assert "raise NotImplementedError('gpt3-175b')" in text
    compile(text, "torchtitan_config.py", "exec")


def test_torchtitan_ddp_alone_keeps_its_toml() -> None:
    # ZeRO 0 over dp 8 with nothing else is one-dimensional DDP, which v0.2.2 runs
    plan = _plan(model="llama3-8b", global_batch=64, seq_len=2048, dp=8, tp=1, pp=1, sp=1,
                 zero=ZeroStage.NONE, recompute=Recompute.FULL, schedule=Schedule.ONE_F_ONE_B,
                 v=1, system="dgx-h100-8")
    par = tomllib.loads(export_files(plan, "torchtitan")["torchtitan.toml"])["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (8, 1)


def test_torchtitan_schedule_names() -> None:
    from planner.exports._torchtitan import SCHEDULES
    # torch/distributed/pipelining/schedules.py get_schedule_class accepts these names
    assert SCHEDULES == {Schedule.GPIPE: "GPipe", Schedule.ONE_F_ONE_B: "1F1B",
                         Schedule.INTERLEAVED: "Interleaved1F1B", Schedule.ZBV: "ZBVZeroBubble"}


@pytest.mark.parametrize(("system", "grad_bytes", "flag"), [
    # Megatron-LM d98e8a64 megatron/training/arguments.py: bf16 training keeps fp32 main
    # gradients unless --grad-reduce-in-bf16; fp16 training keeps 16-bit ones unless
    # --accumulate-allreduce-grads-in-fp32
    ("dgx-h100-1024", 2, "--grad-reduce-in-bf16"),
    ("dgx-h100-1024", 4, None),
    ("dgx1-v100-16", 2, None),
    ("dgx1-v100-16", 4, "--accumulate-allreduce-grads-in-fp32"),
])
def test_megatron_runs_the_gradients_in_the_type_they_were_priced_in(system, grad_bytes,
                                                                     flag) -> None:
    c = load_catalog()
    gpus = c.system(system).devices
    plan = make_plan(c.model("gpt-1.7b"), c.system(system),
                     TrainingSpec(global_batch=gpus, seq_len=2048,
                                  bytes_per_param_grads=grad_bytes),
                     Strategy(dp=gpus, zero=ZeroStage.OPTIMIZER), Convention.MEGATRON)
    args = _args(export_files(plan, "megatron")["megatron.sh"])
    grad_flags = {"--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32"}
    assert [a for a in args if a in grad_flags] == ([flag] if flag else [])
    with pytest.raises(ValueError, match="grad_bytes must be 2 .* or 4"):
        TrainingSpec(global_batch=8, seq_len=2048, bytes_per_param_grads=3)


@pytest.mark.parametrize(("grad_bytes", "flag"), [(4, "--megatron-fsdp-main-grads-dtype fp32"),
                                                (2, None)])
def test_megatron_fsdp_runs_the_gradients_in_the_type_they_were_priced_in(grad_bytes,
                                                                          flag) -> None:
    # Megatron-FSDP's main gradients take the model's compute type (bf16) unless
    # --megatron-fsdp-main-grads-dtype says otherwise (d98e8a64 arguments.py: default auto;
    # megatron_fsdp/mixed_precision.py: None "will match the dtype of the model compute
    # parameters"); it reads neither --grad-reduce-in-bf16 nor Megatron-LM's fp32 default.
    c = load_catalog()
    plan = make_plan(c.model("gpt-1.7b"), c.system("dgx-h100-8"),
                     TrainingSpec(global_batch=8, seq_len=2048, bytes_per_param_grads=grad_bytes,
                                  transformer_engine=True),
                     Strategy(dp=8, zero=ZeroStage.PARAMETERS), Convention.MEGATRON)
    args = _args(export_files(plan, "megatron")["megatron.sh"])
    assert "--use-megatron-fsdp" in args
    grad_flags = {"--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32",
                  "--megatron-fsdp-main-grads-dtype fp32"}
    assert [a for a in args if a in grad_flags] == ([flag] if flag else [])


def test_torchtitan_compiles_a_plan_priced_with_fused_ops_and_not_an_eager_one() -> None:
    """torchtitan leaves torch.compile off by default (v0.2.2 ``Compile.enable`` false; main
    b5bcd76c ``CompileConfig.enable`` False), and eager it runs its Llama's RMSNorm, rotary
    embedding and SwiGLU as PyTorch's ops. A plan priced with them fused (the estimate's
    default) is exported compiled; one whose training says any of them is unfused, eager."""
    c = load_catalog()
    model, system = c.model("llama3-8b"), c.system("dgx-h100-8")
    training = TrainingSpec(global_batch=16, seq_len=8192)
    strategy = Strategy(dp=8, micro_batch=1, zero=ZeroStage.PARAMETERS,
                        recompute=Recompute.SELECTIVE)
    for flags, expected in (({}, True), ({"rope_fusion": False}, False),
                            ({"fused_norm": False}, False), ({"swiglu_fusion": False}, False)):
        plan = make_plan(model, system, replace(training, **flags), strategy,
                         Convention.MEGATRON)
        files = export_files(plan, "torchtitan")
        toml = tomllib.loads(files["torchtitan.toml"])
        assert toml["compile"] == {"enable": expected, "components": ["model", "loss"]}
        assert (f"compile_config = CompileConfig(enable={expected}, components=[\"model\","
                ' "loss"])') in files["torchtitan_config.py"]
        assert "compile=compile_config," in files["torchtitan_config.py"]


def test_the_deepspeed_launcher_says_megatron_deepspeed_runs_swiglu_and_rope_unfused() -> None:
    """Megatron-DeepSpeed (deepspeedai/Megatron-DeepSpeed@4efb479d) runs SwiGLU as
    ``F.silu(x[0]) * x[1]`` and the rotary embedding through ``_rotate_half``: PyTorch's ops. A
    Llama plan priced with them fused says so, with the step priced as it runs. Hand
    calculation, Llama 3 8B at sequence 4096, micro-batch 1, full recompute on A100 80GB
    (2,039 GB/s x 0.705 = 1.437 TB/s): the rotary embedding moves 8 more units of Q and K's
    4096 x 5120 x 2 bytes (233 us forward), the SwiGLU 2 more of its 4096 x 14336 x 2 (163 us);
    forward, recompute and a backward of twice the forward: 4 x 396 us = 1.586 ms a layer, x 32
    layers x 8 micro-batches (64 / dp 8) = 0.406 s more."""
    c = load_catalog()
    training = TrainingSpec(global_batch=64, seq_len=4096)
    strategy = Strategy(dp=8, micro_batch=1, zero=ZeroStage.OPTIMIZER, recompute=Recompute.FULL)
    plan = make_plan(c.model("llama3-8b"), c.system("dgx-a100-8"), training, strategy,
                     Convention.MEGATRON)
    text = " ".join(export_files(plan, "deepspeed")["deepspeed-launch.txt"].split())
    said = re.search(r"runs the model's SwiGLU and rotary embedding as PyTorch's element-wise"
                     r" ops; .* says swiglu_fusion: false, rope_fusion: false prices what it"
                     r" runs \((\d+\.\d+) s a step against (\d+\.\d+) s\)", text)
    # against the step as DeepSpeed runs the plan fused (estimate --framework deepspeed)
    fused = simcore.estimate(plan.model, plan.system, with_framework_defaults(
        training, "deepspeed", plan.system.device.transformer_engine), strategy)
    assert said and float(said.group(2)) == pytest.approx(fused.step_time, abs=5e-4)
    assert float(said.group(1)) - float(said.group(2)) == pytest.approx(0.406, abs=0.005)
    eager = replace(training, swiglu_fusion=False, rope_fusion=False)
    for model, t in (("llama3-8b", eager), ("gpt-1.7b", training)):
        other = make_plan(c.model(model), c.system("dgx-a100-8"), t, strategy,
                          Convention.MEGATRON)
        assert "element-wise ops" not in export_files(other, "deepspeed")["deepspeed-launch.txt"]


def test_megatron_runs_the_stack_and_loss_the_plan_was_priced_with() -> None:
    # Megatron-LM d98e8a64: transformer_impl defaults to transformer_engine
    # (transformer_config.py), cross_entropy_loss_fusion to False (model_parallel_config.py).
    # A plan priced on the classic stack with Megatron-LM's unfused loss launched TE with it;
    # one priced with the fused loss launched the unfused one.
    c = load_catalog()
    strategy = Strategy(dp=4, tp=2, zero=ZeroStage.OPTIMIZER)

    def script(**training: object) -> str:
        plan = make_plan(c.model("llama3-8b"), c.system("dgx-h100-8"),
                         TrainingSpec(global_batch=64, seq_len=4096, **training),  # type: ignore[arg-type]
                         strategy, Convention.MEGATRON)
        return export_files(plan, "megatron")["megatron.sh"]

    classic = script(transformer_engine=False, flash_attention=False,
                     cross_entropy=CrossEntropy.MEGATRON)
    assert "  --transformer-impl local\n" in classic
    assert "--attention-backend unfused" in classic
    assert "--cross-entropy-loss-fusion" not in classic
    # Megatron-Core's own layers have no flash attention (megatron/core/models/backends.py
    # LocalSpecProvider.core_attention: DotProductAttention): a plan priced with it keeps
    # Transformer Engine's layers
    flash = script(transformer_engine=False)
    assert "--transformer-impl" not in flash and "--attention-backend flash" in flash
    assert "have no flash attention, which the plan was priced with" in flash
    te = script()  # the H100's default stack, the fused loss
    assert "--transformer-impl" not in te and "  --cross-entropy-loss-fusion\n" in te
    # its attention priced as TE's cuDNN kernel (the H100's fused_attention_efficiency):
    # `flash` would force TE's FlashAttention (language_module.py: NVTE_FUSED_ATTN=0)
    assert "  --attention-backend fused\n" in te and "--attention-backend flash" not in te
    with pytest.raises(ValueError, match="cross_entropy pytorch: Megatron-LM's loss is its"):
        script(cross_entropy=CrossEntropy.PYTORCH)


def test_torchtitan_prices_the_gradients_it_reduces_in_float32(torchtitan_plan: Plan) -> None:
    # mixed_precision_reduce is Literal["float32"] (torchtitan/config/job_config.py at
    # 73a0e697): a plan priced with 2-byte gradients is exported with torchtitan's figures,
    # those of 4-byte ones
    files = export_files(torchtitan_plan, "torchtitan")
    assert tomllib.loads(files["torchtitan.toml"])["training"]["mixed_precision_reduce"] == (
        "float32")
    assert torchtitan_plan.training.bytes_per_param_grads == 2
    fp32 = replace(with_framework_defaults(torchtitan_plan.training, "torchtitan", True),
                   cross_entropy=CrossEntropy.PYTORCH)
    assert fp32.bytes_per_param_grads == 4
    run = simcore.estimate(torchtitan_plan.model, torchtitan_plan.system, fp32,
                           torchtitan_plan.strategy)
    assert f"step time {run.step_time:.3f} s" in files["torchtitan.toml"]
