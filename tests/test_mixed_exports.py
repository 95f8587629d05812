"""Mixed-cluster plans as FlagScale and Megatron-LM run them, and the rule that says which can.

The checks each framework makes are restated here from their source, so a file that either
framework would refuse fails the test:
- FlagScale (FlagOpen/FlagScale@6b238b7 flagscale/train/arguments.py, ``pre_validate_args``):
  meshes are flat ``[tp, cp, ep, dp, pp]`` groups; the pipeline size is the sum of the meshes'
  pp; the layer split has one entry per stage and sums to ``num_layers``; mesh ``i`` runs
  ``dp_0 * micro_batch_size / dp_i`` sequences per replica, which must be whole; one device type
  per mesh; tied embeddings need equal tp on the first and last mesh.
- Megatron-LM (NVIDIA/Megatron-LM@b1030e9
  megatron/core/transformer/pipeline_parallel_layer_layout.py, ``parse_str_to_list`` and
  ``validate_layer_layout``): commas are cosmetic, ``x*n`` repeats, ``|`` separates stages;
  embedding first, loss last, each once, decoder layers adding up to ``num_layers``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from planner.catalog import load_catalog
from planner.cli import main
from planner.exports import export_files
from planner.exports._megatron import model_args
from planner.exports.hetero import export_hetero, layout, meshes, runs_on, why_not
from planner.mixed_config import load_mixed_study
from planner.plan import make_plan
from simcore import Convention, Strategy, TrainingSpec
from simcore.mixed import MixedPlan, MixedStage, estimate_mixed
from simcore.specs import CrossEntropy, ZeroStage

ROOT = Path(__file__).resolve().parent.parent
MIXED = ROOT / "studies" / "mixed"


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(user=False)


@pytest.fixture(scope="module")
def metis(catalog):
    """Metis's 16 + 16 cluster (4 nodes of 4 A100, 4 of 4 V100) and its 8-layer GPT."""
    return catalog.mixed["metis-a100-v100-16-16"], catalog.model("metis-gpt-10l")


TRAINING = TrainingSpec(global_batch=128, seq_len=1024)


def _plan(*stages, m=8, zero=ZeroStage.OPTIMIZER, sp=True):
    return MixedPlan(stages=tuple(MixedStage(*s) for s in stages), micro_batches=m, zero=zero,
                     sequence_parallel=sp)


def test_meshes_are_runs_of_one_group_tp_and_dp():
    plan = _plan((1, 2, 2, 1), (1, 2, 2, 1), (0, 4, 1, 3), (0, 4, 1, 3))
    got = [(m.group, m.tp, m.dp, m.layers) for m in meshes(plan)]
    assert got == [(1, 2, 2, (1, 1)), (0, 4, 1, (3, 3))]


def _megatron_layout(text: str) -> list[list[str]]:
    """Megatron-Core's parse of ``--pipeline-model-parallel-layout`` (see the module doc)."""
    text = text.replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), text)
    return [list(stage) for stage in text.split("|")]


def test_layout_puts_each_stage_layers_embedding_first_and_loss_last():
    plan = _plan((1, 1, 4, 1), (1, 1, 4, 2), (0, 1, 4, 5))
    stages = _megatron_layout(layout(plan))
    assert [s.count("t") for s in stages] == [1, 2, 5]
    flat = [c for s in stages for c in s]
    assert flat[0] == "E" and flat[-1] == "L" and flat.count("E") == flat.count("L") == 1


def test_tied_embeddings_need_equal_tp_at_both_ends_in_flagscale(metis):
    system, model = metis  # metis-gpt-10l ties its embeddings (studies/catalog/models/metis.yaml)
    plan = _plan((1, 4, 1, 2), (1, 4, 1, 2), (0, 2, 2, 4))  # v100 tp4 > a100 tp2
    assert "tied embeddings" in why_not("flagscale", model, system, TRAINING, plan)
    # the same plan with tp 2 at both ends runs
    ok = _plan((1, 2, 2, 2), (1, 2, 2, 2), (0, 2, 2, 4))
    assert why_not("flagscale", model, system, TRAINING, ok) is None


def test_megatron_needs_one_tp_and_dp_flagscale_does_not(metis, catalog):
    system, _ = metis
    model = catalog.model("llama2-7b")  # untied: FlagScale's end-tp rule does not apply
    plan = _plan((1, 4, 1, 4), (0, 2, 2, 28))
    assert "tp or dp" in why_not("megatron", model, system, TRAINING, plan)
    assert runs_on(model, system, TRAINING, plan) == ("flagscale",)


def test_zero_2_and_3_run_on_neither(metis):
    system, model = metis
    for zero in (ZeroStage.GRADIENTS, ZeroStage.PARAMETERS):
        plan = _plan((1, 2, 2, 2), (0, 2, 2, 6), zero=zero)
        assert runs_on(model, system, TRAINING, plan) == ()


def test_different_tp_without_sequence_parallel_is_refused_by_flagscale(metis, catalog):
    system, model = metis[0], catalog.model("llama2-7b")
    plan = _plan((1, 4, 1, 4), (0, 2, 2, 28), sp=False)
    assert "sequence parallelism" in why_not("flagscale", model, system, TRAINING, plan)


def test_flagscale_files_pass_flagscale_checks(metis):
    system, model = metis
    # 2 V100 stages of tp 2 x dp 2 (one node each) > 2 A100 stages of tp 2 x dp 2
    plan = _plan((1, 2, 2, 1), (1, 2, 2, 2), (0, 2, 2, 2), (0, 2, 2, 3), m=8)
    files = export_hetero("flagscale", model, system, TRAINING, plan, "x")
    cfg = yaml.safe_load(files["flagscale_train.yaml"])
    sys_, hetero, m = cfg["system"], cfg["system"]["hetero"], cfg["model"]
    flat = hetero["hetero_process_meshes"]
    assert len(flat) % 5 == 0
    mesh = [flat[i:i + 5] for i in range(0, len(flat), 5)]
    assert mesh == [[2, 1, 1, 2, 2], [2, 1, 1, 2, 2]]
    assert sys_["pipeline_model_parallel_size"] == sum(x[4] for x in mesh) == 4
    split = hetero["hetero_pipeline_layer_split"]
    assert split == [1, 2, 2, 3] and sum(split) == m["num_layers"] == model.layers
    dp0 = mesh[0][3]
    # global 128 / 8 micro-batches = 16 sequences; mesh 0 replicas take 16 / 2 = 8 each
    assert m["micro_batch_size"] == 8 and dp0 * m["micro_batch_size"] == 16
    assert all(dp0 * m["micro_batch_size"] % x[3] == 0 for x in mesh)
    assert hetero["hetero_device_types"] == ["v100-16gb", "a100-80gb"]
    assert hetero["hetero_current_device_type"] in hetero["hetero_device_types"]
    assert m["untie_embeddings_and_output_weights"] is False and mesh[0][0] == mesh[-1][0]
    # V100s have no bf16 tensor cores: the whole run trains in fp16
    assert sys_["precision"] == {"fp16": True}
    # hostfile: the V100 nodes (stages 0-1) take the first ranks, 4 GPUs each, 2 nodes per group
    hosts = [line.split() for line in files["hostfile"].splitlines()]
    assert [(h[1], h[2]) for h in hosts] == [("slots=4", "type=v100-16gb")] * 2 + \
        [("slots=4", "type=a100-80gb")] * 2


def test_megatron_script_has_the_layout_and_node_order(metis):
    system, model = metis
    plan = _plan((1, 2, 2, 1), (1, 2, 2, 2), (0, 2, 2, 2), (0, 2, 2, 3), m=8)
    files = export_hetero("megatron", model, system, TRAINING, plan, "x")
    script = files["megatron.sh"]
    got = re.search(r'--pipeline-model-parallel-layout "([^"]+)"', script).group(1)
    assert [s.count("t") for s in _megatron_layout(got)] == [1, 2, 2, 3]
    assert "--tensor-model-parallel-size 2" in script
    assert "--pipeline-model-parallel-size 4" in script
    assert "--micro-batch-size 8" in script  # 16 sequences per micro-batch / dp 2
    # the comment said "8 micro-batches of 16 sequences" above --micro-batch-size 8
    assert ("# batch: 8 micro-batches of 16 sequences, each 8 a data-parallel replica"
            " (--micro-batch-size) x dp 2") in script
    assert "--fp16" in script and "--bf16" not in script
    rows = [line.split() for line in files["nodes.txt"].splitlines()[1:]]
    assert [r[3] for r in rows] == ["v100-16gb"] * 2 + ["a100-80gb"] * 2


def test_export_refuses_a_plan_the_framework_cannot_run(metis):
    system, model = metis
    plan = _plan((1, 4, 1, 2), (0, 2, 2, 6))
    with pytest.raises(ValueError, match="megatron cannot run"):
        export_hetero("megatron", model, system, TRAINING, plan, "x")


def test_one_type_exports_use_fp16_on_v100(catalog):
    model, system = catalog.model("gpt-1.7b"), catalog.system("dgx1-v100-8")
    training = TrainingSpec(global_batch=16, seq_len=1024)
    plan = make_plan(model, system, training, Strategy(dp=8, tp=1, pp=1, micro_batch=1),
                     Convention.MEGATRON)
    assert "--fp16" in export_files(plan, "megatron")["megatron.sh"]
    assert '"fp16"' in export_files(plan, "deepspeed")["ds_config.json"]
    with pytest.raises(ValueError, match="bf16"):
        export_files(plan, "torchtitan")


def test_planner_mixed_exports_each_framework_best(tmp_path, capsys):
    out = tmp_path / "launch"
    assert main(["mixed", str(MIXED / "metis-16-16.yaml"), "--top", "2",
                 "--export", str(out)]) == 0
    text = capsys.readouterr().out
    assert "flagscale:" in text and "megatron:" in text
    assert sorted(p.name for p in out.iterdir()) == ["flagscale", "megatron"]
    assert (out / "flagscale" / "hostfile").read_text()
    assert (out / "megatron" / "megatron.sh").read_text().startswith("#!/usr/bin/env bash")


def test_planner_mixed_export_with_no_runnable_plan_is_one_line(tmp_path, capsys):
    study = tmp_path / "zero3.yaml"
    study.write_text("model: metis-gpt-10l\nsystem: metis-a100-v100-16-16\n"
                     "training: {global_batch: 128}\nspace: {tp: [1, 2], zero: [3]}\n")
    assert main(["mixed", str(study), "--export", str(tmp_path / "x"),
                 "--framework", "flagscale"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "runs no plan" in err[0]


def test_mixed_timeline_of_one_stage_ends_at_the_estimate(metis):
    # One stage: no bubble, so m x (forward + backward) + exposed dp + optimizer is the step
    # (the estimate's closed form) and the timeline must end there exactly.
    from simcore.mixed import estimate_mixed
    from simcore.mixed.timeline import mixed_timeline

    system, model = metis
    plan = _plan((0, 1, 16, 8), m=4)
    tl = mixed_timeline(model, system, TRAINING, plan)
    assert tl.end == pytest.approx(estimate_mixed(model, system, TRAINING, plan).step_time,
                                   rel=1e-9)
    assert tl.rows[0] == "stage 0: a100 (a100-80gb)"


def test_mixed_timeline_rows_name_each_stage_device(metis):
    from simcore.mixed import estimate_mixed
    from simcore.mixed.timeline import mixed_timeline

    system, model = metis
    plan = _plan((1, 2, 2, 1), (1, 2, 2, 2), (0, 2, 2, 2), (0, 2, 2, 3), m=8)
    tl = mixed_timeline(model, system, TRAINING, plan)
    times = [s.micro_batch_time for s in estimate_mixed(model, system, TRAINING, plan).stages]
    stages = [r for r in tl.rows if r.startswith("stage") and not r.endswith("comm")]
    assert stages == ["stage 0: v100 (v100-16gb)", "stage 1: v100 (v100-16gb)",
                      "stage 2: a100 (a100-80gb)", "stage 3: a100 (a100-80gb)"]
    # 1F1B cannot end before its slowest stage has run all 8 micro-batches, and ends no later
    # than the closed form (m - 1) x slowest + sum, which charges every other stage in full
    assert 8 * max(times) <= tl.pipeline_end <= 7 * max(times) + sum(times)


def test_planner_mixed_draws_the_best_plan(tmp_path, capsys):
    out = tmp_path / "tl.html"
    assert main(["mixed", str(MIXED / "metis-16-16.yaml"), "--top", "0",
                 "--timeline", str(out)]) == 0
    assert "timeline of the best plan" in capsys.readouterr().out
    assert "stage 0: a100 (a100-80gb)" in out.read_text()


def test_flagscale_and_megatron_turn_dropout_off_for_a_model_without_it(metis):
    # Megatron-LM trains with 0.1 attention and hidden dropout unless told otherwise
    # (megatron/training/arguments.py, _add_regularization_args); a model estimated without
    # dropout (its masks not kept) must be exported with both at 0.
    system, model = metis
    plan = _plan((1, 2, 2, 1), (1, 2, 2, 2), (0, 2, 2, 2), (0, 2, 2, 3), m=8)
    for dropout, expected in ((None, None), (False, 0.0)):
        shaped = replace(model, dropout=dropout)
        cfg = yaml.safe_load(export_hetero("flagscale", shaped, system, TRAINING, plan,
                                           "x")["flagscale_train.yaml"])["model"]
        assert cfg.get("attention_dropout") == expected
        assert cfg.get("hidden_dropout") == expected
        args = model_args(shaped, 1024, "unfused")
        assert ("--attention-dropout 0.0" in args) == (expected is not None)
        assert ("--hidden-dropout 0.0" in args) == (expected is not None)


def test_gradients_are_exported_in_the_type_estimated(metis):
    # Megatron-LM keeps fp32 main gradients in bf16 unless --grad-reduce-in-bf16, and fp16 ones
    # in fp16 unless --accumulate-allreduce-grads-in-fp32 (megatron/training/arguments.py,
    # d98e8a64); the estimate prices grad_bytes (2 unless the training says 4). FlagScale passes
    # its `system` keys on as those options.
    system, model = metis
    a100_only = _plan((0, 2, 2, 4), (0, 2, 2, 6), m=8)  # bf16: every stage on the A100s
    with_v100 = _plan((1, 2, 2, 1), (1, 2, 2, 2), (0, 2, 2, 2), (0, 2, 2, 3), m=8)  # fp16
    fp32 = replace(TRAINING, bytes_per_param_grads=4)
    for plan, training, flag in ((a100_only, TRAINING, "--grad-reduce-in-bf16"),
                                 (a100_only, fp32, None),
                                 (with_v100, TRAINING, None),
                                 (with_v100, fp32, "--accumulate-allreduce-grads-in-fp32")):
        script = export_hetero("megatron", model, system, training, plan, "x")["megatron.sh"]
        cfg = yaml.safe_load(export_hetero("flagscale", model, system, training, plan,
                                           "x")["flagscale_train.yaml"])["system"]
        options = {"--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32"}
        assert {o for o in options if f"  {o}\n" in script} == ({flag} if flag else set())
        keys = {o[2:].replace("-", "_") for o in options}
        assert {k for k in keys if cfg.get(k)} == (
            {flag[2:].replace("-", "_")} if flag else set())


def test_each_device_type_keeps_the_attention_it_was_priced_with(metis, catalog):
    # Flash attention everywhere: on a Hopper group it is priced as Transformer Engine's cuDNN
    # kernel (h100-sxm's fused_attention_efficiency), on the A100s as flash attention. One
    # --attention-backend runs on every stage: `auto`, with which Transformer Engine picks
    # cuDNN's on Hopper and later and flash attention before ("Disabling FlashAttention to give
    # FusedAttention preference on Hopper+", TransformerEngine's get_attention_backend), as
    # each was priced; on the A100s alone, `flash`.
    system, model = metis
    h100 = catalog.system("dgx-h100-8").device
    hopper = replace(system, groups=(system.groups[0], replace(system.groups[1], device=h100)))
    flash = replace(TRAINING, flash_attention=True)
    both = _plan((1, 2, 2, 1), (1, 2, 2, 2), (0, 2, 2, 2), (0, 2, 2, 3), m=8)
    a100_only = _plan((0, 2, 2, 4), (0, 2, 2, 6), m=8)
    for plan, backend in ((both, "auto"), (a100_only, "flash")):
        script = export_hetero("megatron", model, hopper, flash, plan, "x")["megatron.sh"]
        assert f"  --attention-backend {backend}\n" in script
        cfg = yaml.safe_load(export_hetero("flagscale", model, hopper, flash, plan,
                                           "x")["flagscale_train.yaml"])["model"]
        assert cfg["attention_backend"] == backend


def test_mixed_exports_run_the_loss_and_gather_priced(metis):
    # As --format megatron writes them: the fused loss priced by default (Megatron-LM's default
    # is unfused: d98e8a64 model_parallel_config.py cross_entropy_loss_fusion False), and with
    # the distributed optimizer's overlapped reduction the updated shards' all-gather beside
    # the next forward (--overlap-param-gather; without it the gather runs after the step).
    # A loss Megatron-LM does not have (PyTorch's on an fp32 copy) is refused.
    system, model = metis
    plan = _plan((1, 2, 2, 1), (1, 2, 2, 2), (0, 2, 2, 2), (0, 2, 2, 3), m=8)
    script = export_hetero("megatron", model, system, TRAINING, plan, "x")["megatron.sh"]
    assert "  --cross-entropy-loss-fusion\n" in script
    # priced at 4 bytes a logit; d98e8a64 runs its jit-fused loss (CrossEntropy.MEGATRON_FUSED)
    assert "this Megatron-LM runs its jit-fused one, 10 bytes a logit" in script
    assert "  --overlap-param-gather\n" in script and "  --overlap-grad-reduce\n" in script
    native = replace(TRAINING, cross_entropy=CrossEntropy.MEGATRON_FUSED)
    script = export_hetero("megatron", model, system, native, plan, "x")["megatron.sh"]
    assert "  --cross-entropy-loss-fusion\n" in script and "jit-fused one" not in script
    cfg = yaml.safe_load(export_hetero("flagscale", model, system, TRAINING, plan,
                                       "x")["flagscale_train.yaml"])["system"]
    assert cfg["cross_entropy_loss_fusion"] is True and cfg["overlap_param_gather"] is True
    unfused = replace(TRAINING, cross_entropy=CrossEntropy.MEGATRON, overlap_grad_reduce=False)
    script = export_hetero("megatron", model, system, unfused, plan, "x")["megatron.sh"]
    assert "--cross-entropy-loss-fusion" not in script and "--overlap-param-gather" not in script
    pytorch = replace(TRAINING, cross_entropy=CrossEntropy.PYTORCH)
    with pytest.raises(ValueError, match="cross_entropy pytorch: Megatron-LM's loss"):
        export_hetero("megatron", model, system, pytorch, plan, "x")


def test_a_mixed_study_prices_the_loss_both_its_frameworks_run(metis):
    # Megatron-LM d98e8a64 runs --cross-entropy-loss-fusion as its jit-fused `native` loss by
    # default (model_parallel_config.py cross_entropy_fusion_impl = 'native'; arguments.py
    # refuses 'te', Transformer Engine's in-place 4 bytes a logit), and FlagScale passes
    # cross_entropy_loss_fusion on alone: 10 bytes a logit, 6 more than `fused`.
    study = load_mixed_study(MIXED / "metis-16-16.yaml")
    training = study.space.training
    assert training.cross_entropy is CrossEntropy.MEGATRON_FUSED
    system, model = metis
    plan = _plan((1, 2, 2, 1), (1, 2, 2, 2), (0, 2, 2, 2), (0, 2, 2, 3), m=8)
    last = [estimate_mixed(model, system, t, plan).stages[-1].memory.total
            for t in (replace(training, cross_entropy=CrossEntropy.FUSED), training)]
    # 128 / 8 micro-batches = 16 sequences, 8 a replica (dp 2) x 1,024 tokens x 51,200 / tp 2
    assert last[1] - last[0] == pytest.approx(6 * 8 * 1024 * 51200 / 2)
    script = export_hetero("megatron", model, system, training, plan, "x")["megatron.sh"]
    assert "the jit-fused vocab-parallel loss, as estimated" in script
