"""Exports estimate a plan again as the framework runs it (planner/exports/_reprice.py).

A ZeRO-3 plan of a study that leaves the framework open (``framework: any``) is priced on
PyTorch FSDP's stack (simcore.megatron.plan: fp32 shards, checkpointing that stops early, no
Transformer Engine). Megatron-LM (Megatron-FSDP) and DeepSpeed (ZeRO-3) keep a 16-bit shard
beside the fp32 master and re-run whole layers; Megatron-LM runs Transformer Engine on H100s.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

import simcore
from planner.catalog import load_catalog
from planner.cli import main
from planner.exports import export_files
from planner.plan import Plan, make_plan
from planner.units import GB
from search_spaces.frameworks import with_framework_defaults
from simcore.specs import (
    Convention,
    CrossEntropy,
    Recompute,
    Strategy,
    TrainingSpec,
    ZeroStage,
)

CATALOG = load_catalog(user=False)
MODEL = CATALOG.model("llama3-8b")
H100 = CATALOG.system("dgx-h100-8")
TRAINING = TrainingSpec(global_batch=16, seq_len=8192, bytes_per_param_grads=4)
FSDP = Strategy(dp=8, zero=ZeroStage.PARAMETERS, recompute=Recompute.FULL, micro_batch=2)


def _as_run(framework: str, system=H100) -> simcore.Estimate:
    training = with_framework_defaults(TRAINING, framework, system.device.transformer_engine)
    return simcore.estimate(MODEL, system, training, FSDP)


@pytest.mark.parametrize(("framework", "file"), [("megatron", "megatron.sh"),
                                                 ("deepspeed", "deepspeed-launch.txt")])
def test_an_open_stack_plan_is_estimated_again_for_the_framework(framework, file) -> None:
    plan = make_plan(MODEL, H100, TRAINING, FSDP, Convention.MEGATRON)
    text = export_files(plan, framework)[file]
    run = _as_run(framework)
    # the framework's 16-bit shard: 2 bytes more for each of the 8.03e9 parameters over 8 GPUs
    assert run.memory.weights == pytest.approx(2 * 8.03e9 / 8, rel=0.01)
    assert plan.estimate.memory.weights == 0.0
    found = re.search(r"step time ([0-9.]+) s, peak memory ([0-9.]+) GB a device", text)
    assert found is not None and "the stack its study left open" in text
    assert float(found[1]) == pytest.approx(run.step_time, abs=5e-4)
    assert float(found[2]) == pytest.approx(run.memory.total / GB, abs=0.05)


def test_a_te_plan_is_estimated_again_as_torchtitan_runs_it() -> None:
    # A ZeRO-1 plan of an open study on H100s is priced on the device's default stack,
    # Transformer Engine; torchtitan runs PyTorch's kernels and its own loss. The job file said
    # only what the loss does to the peak ("step time unchanged": 6.824 s where
    # `planner estimate --framework torchtitan` says 8.961 s); it gives torchtitan's figures,
    # those of estimate --framework torchtitan. (dp 2 x tp 2 x pp 2: torchtitan runs ZeRO-1
    # with pp > 1 only, framework_rules.torchtitan_zero)
    training = TrainingSpec(global_batch=64, seq_len=4096)
    strategy = Strategy(dp=2, tp=2, pp=2, zero=ZeroStage.OPTIMIZER)
    plan = make_plan(MODEL, H100, training, strategy, Convention.MEGATRON)
    assert H100.device.transformer_engine  # the device's default stack the plan is priced on
    files = export_files(plan, "torchtitan")
    titan = with_framework_defaults(training, "torchtitan", H100.device.transformer_engine)
    # each form with its own loss: main's chunked one (Python), v0.2.2's whole one (TOML)
    for name, loss in (("torchtitan_config.py", CrossEntropy.CHUNKED),
                       ("torchtitan.toml", CrossEntropy.PYTORCH)):
        run = simcore.estimate(MODEL, H100, replace(titan, cross_entropy=loss), strategy)
        assert run.step_time > 1.2 * plan.estimate.step_time
        found = re.search(r"as torchtitan runs the plan \(its kernels, its checkpointing,"
                          r" torchtitan .*\): step time ([0-9.]+) s, peak memory ([0-9.]+) GB",
                          files[name])
        assert found is not None
        assert float(found[1]) == pytest.approx(run.step_time, abs=5e-4)
        assert float(found[2]) == pytest.approx(run.memory.total / GB, abs=0.05)


def test_a_plan_that_no_longer_fits_is_refused() -> None:
    # A part with room for the plan on PyTorch FSDP's stack but not on Megatron-LM's.
    priced = simcore.estimate(MODEL, H100, TRAINING, FSDP).memory.total
    megatron = _as_run("megatron").memory.total
    assert priced < megatron
    device = replace(H100.device, hbm_bytes=(priced + megatron) / 2)
    system = replace(H100, device=device)
    plan = make_plan(MODEL, system, TRAINING, FSDP, Convention.MEGATRON)
    assert plan.estimate.fits
    with pytest.raises(ValueError, match="under Megatron-LM's stack this plan needs"):
        export_files(plan, "megatron")


def test_a_plan_of_the_framework_is_not_estimated_again() -> None:
    training = with_framework_defaults(TRAINING, "megatron", True)
    plan = make_plan(MODEL, H100, training, FSDP, Convention.MEGATRON)
    assert "study left open" not in export_files(plan, "megatron")["megatron.sh"]


def test_deepspeed_turns_dropout_off_for_a_model_without_it() -> None:
    # Megatron-DeepSpeed keeps Megatron-LM's 0.1 attention and hidden dropout by default; Llama
    # is estimated without dropout (no masks kept).
    plan = make_plan(MODEL, H100, TRAINING, Strategy(dp=8, zero=ZeroStage.OPTIMIZER),
                     Convention.MEGATRON)
    text = export_files(plan, "deepspeed")["deepspeed-launch.txt"]
    assert "--attention-dropout 0.0" in text and "--hidden-dropout 0.0" in text
    gpt = make_plan(CATALOG.model("gpt3-175b"), CATALOG.system("dgx-h100-1024"),
                    TrainingSpec(global_batch=1024, seq_len=2048),
                    Strategy(dp=8, tp=8, pp=16, zero=ZeroStage.OPTIMIZER), Convention.MEGATRON)
    assert "dropout" not in export_files(gpt, "deepspeed")["deepspeed-launch.txt"]


def test_planner_estimate_says_when_it_prices_fp32_shards(capsys) -> None:
    base = ["estimate", "--model", "llama3-8b", "--system", "dgx-h100-8", "--dp", "8", "--fsdp",
            "--recompute", "full", "--micro-batch", "2", "--global-batch", "16",
            "--seq-len", "8192", "--grad-bytes", "4"]
    assert main([*base, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fp32_shards"] is True
    assert main([*base, "--json", "--no-recompute-early-stop"]) == 0
    assert json.loads(capsys.readouterr().out)["fp32_shards"] is False
    assert main(base) == 0
    assert "PyTorch FSDP's fp32 shards" in capsys.readouterr().out


# -- a plan of a study that names its framework, exported for another ---------------------------
def _framework_study_plan(framework: str, training: TrainingSpec = TRAINING,
                          strategy: Strategy = FSDP) -> Plan:
    """The plan as a ``framework:`` study stores it: its training filled with the framework's
    defaults, the training as the study wrote it kept beside it."""
    resolved = with_framework_defaults(training, framework, H100.device.transformer_engine)
    return make_plan(MODEL, H100, resolved, strategy, Convention.MEGATRON,
                     given_training=training)


@pytest.mark.parametrize(("study", "framework", "file"), [
    ("megatron", "deepspeed", "deepspeed-launch.txt"), ("deepspeed", "megatron", "megatron.sh")])
def test_a_framework_study_plan_is_estimated_again_for_another(study, framework, file) -> None:
    # Megatron-LM runs Transformer Engine on H100s, DeepSpeed does not: a megatron study's plan
    # exported for DeepSpeed said nothing (the study's training, all of it named, was taken as
    # DeepSpeed's) and the reverse likewise
    plan = _framework_study_plan(study)
    run = _as_run(framework)
    assert abs(run.step_time - plan.estimate.step_time) > 0.01 * run.step_time
    text = export_files(plan, framework)[file]
    found = re.search(r"step time ([0-9.]+) s, peak memory ([0-9.]+) GB a device", text)
    assert found is not None and "the stack of its study's framework" in text
    assert float(found[1]) == pytest.approx(run.step_time, abs=5e-4)
    assert float(found[2]) == pytest.approx(run.memory.total / GB, abs=0.05)
    assert "stack of its study's framework" not in export_files(plan, study)[
        {"megatron": "megatron.sh", "deepspeed": "deepspeed-launch.txt"}[study]]


def test_a_megatron_study_plan_is_exported_as_torchtitan_runs_it() -> None:
    # the ZeRO-1 plan of test_a_te_plan_is_estimated_again_as_torchtitan_runs_it, from a
    # megatron study: torchtitan's figures (its kernels, not Megatron-LM's Transformer Engine)
    training = TrainingSpec(global_batch=64, seq_len=4096)
    strategy = Strategy(dp=2, tp=2, pp=2, zero=ZeroStage.OPTIMIZER)
    plan = _framework_study_plan("megatron", training, strategy)
    assert plan.training.transformer_engine and not plan.given_training.transformer_engine
    run = simcore.estimate(MODEL, H100, replace(
        with_framework_defaults(training, "torchtitan", H100.device.transformer_engine),
        cross_entropy=CrossEntropy.PYTORCH), strategy)
    text = export_files(plan, "torchtitan")["torchtitan.toml"]
    found = re.search(r"as torchtitan runs the plan \(its kernels, its checkpointing,"
                      r" torchtitan v0.2.2's loss .*\): step time ([0-9.]+) s, peak memory"
                      r" ([0-9.]+) GB", text)
    assert found is not None
    assert float(found[1]) == pytest.approx(run.step_time, abs=5e-4)
    assert float(found[2]) == pytest.approx(run.memory.total / GB, abs=0.05)


STUDY = """description: Llama 3 8B, Megatron-LM's plans
model: llama3-8b
system: dgx-h100-8
framework: megatron
training: {global_batch: 16, seq_len: 8192, grad_bytes: 4}
objectives: [step_time]
sampler: exhaustive
space: {tp: [1], pp: [1], zero: [3], recompute: [full], micro_batch: [2]}
"""


def test_a_stored_framework_study_keeps_what_it_wrote(tmp_path, monkeypatch, capsys) -> None:
    # through storage, a plan file and `planner estimate --plan FILE --framework X`: FSDP's
    # plan of a megatron study, as DeepSpeed runs it
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(STUDY)
    assert main(["run", "s.yaml", "--quiet"]) == 0
    assert main(["export", "s", "--format", "plan,deepspeed", "--out", "out"]) == 0
    capsys.readouterr()
    (folder,) = (tmp_path / "out").iterdir()
    run = _as_run("deepspeed")
    assert f"step time {run.step_time:.3f} s" in (folder / "deepspeed-launch.txt").read_text()
    assert main(["estimate", "--plan", str(folder / "plan.yaml"), "--framework", "deepspeed",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time"] == pytest.approx(run.step_time)
    assert main(["estimate", "--plan", str(folder / "plan.yaml"), "--framework", "megatron",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time"] == pytest.approx(
        _as_run("megatron").step_time)


def test_a_plan_files_two_trainings_must_agree(tmp_path, monkeypatch, capsys) -> None:
    # Edited in one place only, `estimate --plan` read `training` and `--framework` the other
    # (a batch of 1024 estimated at 512 without a word): the two must agree but for what a
    # framework fills in
    import yaml

    from search_spaces.frameworks import FRAMEWORKS, given_disagrees

    for framework in FRAMEWORKS:
        for training in (TRAINING, replace(TRAINING, cross_entropy=CrossEntropy.MEGATRON)):
            assert given_disagrees(training, with_framework_defaults(
                training, framework, True)) is None
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(STUDY)
    assert main(["run", "s.yaml", "--quiet"]) == 0
    assert main(["export", "s", "--format", "plan", "--out", "plan.yaml"]) == 0
    data = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    data["training"]["global_batch"] = 32
    (tmp_path / "edited.yaml").write_text(yaml.safe_dump(data))
    capsys.readouterr()
    assert main(["estimate", "--plan", "edited.yaml", "--framework", "deepspeed"]) == 2
    err = capsys.readouterr().err
    assert ("edited.yaml: given_training.global_batch: is 16 where training.global_batch is"
            " 32") in err and err.count("\n") == 1
