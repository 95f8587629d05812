"""``framework:`` in a study and the framework exporters' refusals (search_spaces/frameworks.py).

Each rule is checked on a plan that breaks it and one that does not. The rules' sources:
Megatron-LM d98e8a64 ``megatron/core/pipeline_parallel/schedules.py`` (no GPipe); DeepSpeed
edaa7221 ``deepspeed/runtime/pipe/engine.py`` (ZeRO 2-3 refused with pp > 1),
``deepspeed/runtime/pipe/schedule.py`` (TrainSchedule is 1F1B) and
``docs/_tutorials/ds-sequence.md`` (Ulysses without tp or pp).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from planner.catalog import load_catalog
from planner.cli import main
from planner.errors import PlannerUsageError
from planner.study_config import load_study_config
from search_spaces.frameworks import FRAMEWORKS, why_not
from simcore.specs import CpComm, Recompute, Schedule, Strategy, TrainingSpec, ZeroStage

MODEL = load_catalog().model("llama70b")  # 80 layers, 64 heads
TRAINING = TrainingSpec(global_batch=512, seq_len=1024)

STUDY = """\
name: {name}
model: llama70b
system: lab-system1
training: {{global_batch: 512, seq_len: 1024}}
hbm_gb: unlimited
{extra}space:
  pp: {pp}
  zero: {zero}
"""


def _study(tmp: Path, name: str, extra: str = "", zero: str = "[0, 1, 2, 3]",
           pp: str = "[1, 2]") -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(STUDY.format(name=name, extra=extra, zero=zero, pp=pp))
    return path


def _why(framework: str, **knobs: object) -> str | None:
    return why_not(framework, MODEL, TRAINING, Strategy(**knobs))  # type: ignore[arg-type]


# -- the rules --------------------------------------------------------------------------------
def test_megatron_has_no_gpipe() -> None:
    reason = _why("megatron", dp=32, pp=2, schedule=Schedule.GPIPE)
    assert reason is not None and "schedule gpipe" in reason and "1f1b" in reason
    assert _why("megatron", dp=32, pp=2, schedule=Schedule.ONE_F_ONE_B) is None
    assert _why("megatron", dp=16, pp=2, sp=2, zero=ZeroStage.PARAMETERS) is None
    assert _why("torchtitan", dp=32, pp=2, schedule=Schedule.GPIPE) is None


def test_deepspeed_pipeline_takes_zero_0_or_1() -> None:
    for zero in (ZeroStage.GRADIENTS, ZeroStage.PARAMETERS):
        reason = _why("deepspeed", dp=32, pp=2, zero=zero)
        assert reason is not None and f"zero {int(zero)} with pp 2" in reason
        assert "offers ZeRO 1 (in bf16; ZeRO 0 too in fp16)" in reason
        fp16 = why_not("deepspeed", MODEL, TRAINING, Strategy(dp=32, pp=2, zero=zero), bf16=False)
        assert fp16 is not None and "offers ZeRO 0 or 1" in fp16
    assert _why("deepspeed", dp=32, pp=2, zero=ZeroStage.OPTIMIZER) is None
    assert _why("deepspeed", dp=64, pp=1, zero=ZeroStage.PARAMETERS) is None


def test_deepspeed_pipeline_in_bf16_shards_the_optimizer() -> None:
    # deepspeed/runtime/engine.py _do_optimizer_sanity_check (edaa7221, v0.12.6 alike): bf16
    # without ZeRO under the pipeline engine is the BF16_Optimizer, which shards the fp32
    # master weights and Adam states over dp: what runs is ZeRO 1, not the plan's ZeRO 0
    reason = _why("deepspeed", dp=32, pp=2, zero=ZeroStage.NONE)
    assert reason is not None and "zero 0 with pp 2 in bf16" in reason
    assert "BF16_Optimizer" in reason and "use zero 1" in reason
    # fp16 (FP16_Optimizer) and pp 1 (--no-pipeline-parallel: DDP_BFLOAT16) keep ZeRO 0
    assert why_not("deepspeed", MODEL, TRAINING, Strategy(dp=32, pp=2), bf16=False) is None
    assert _why("deepspeed", dp=64, pp=1, zero=ZeroStage.NONE) is None


def test_deepspeed_pipeline_runs_only_1f1b() -> None:
    for schedule, v in ((Schedule.GPIPE, 1), (Schedule.INTERLEAVED, 2)):
        reason = _why("deepspeed", dp=32, pp=2, schedule=schedule, v=v, zero=ZeroStage.OPTIMIZER)
        assert reason is not None and f"schedule {schedule.value}" in reason
        assert "only 1f1b" in reason
    assert _why("deepspeed", dp=32, pp=2, schedule=Schedule.ONE_F_ONE_B,
                zero=ZeroStage.OPTIMIZER) is None


def test_deepspeed_ulysses_without_tp_or_pp() -> None:
    for knobs in ({"tp": 2, "pp": 1}, {"tp": 1, "pp": 2}):
        reason = _why("deepspeed", dp=16, sp=2, **knobs)
        assert reason is not None and "sp 2" in reason and "tp 1 and pp 1" in reason
    # Ulysses exchanges Q, K, V by all-to-all (cp_comm a2a, what a deepspeed study sets): a
    # plan priced with the ring is not what DeepSpeed runs
    ulysses = replace(TRAINING, cp_comm=CpComm.A2A)
    assert why_not("deepspeed", MODEL, ulysses, Strategy(dp=32, sp=2)) is None
    assert _why("deepspeed", dp=32, sp=2) == (
        "cp_comm p2p: deepspeed's context parallelism is DeepSpeed-Ulysses' all-to-all; use"
        " cp_comm a2a, or framework megatron")
    assert _why("deepspeed", dp=16, tp=2, pp=2, zero=ZeroStage.OPTIMIZER) is None  # no Ulysses


def test_deepspeed_recomputes_the_attention_core_only_unfused_without_ulysses() -> None:
    # Megatron-DeepSpeed 4efb479d megatron/model/transformer.py ParallelAttention:
    # checkpoint_core_attention is set only beside CoreAttention, not for flash attention's
    # core nor under DeepSpeed-Ulysses' DistributedAttention
    a2a = replace(TRAINING, cp_comm=CpComm.A2A)
    selective = Strategy(dp=64, recompute=Recompute.SELECTIVE)
    reason = why_not("deepspeed", MODEL, TRAINING, selective, flash=True)
    assert reason is not None and "with flash attention" in reason
    assert why_not("deepspeed", MODEL, TRAINING, selective, flash=False) is None
    ulysses = Strategy(dp=32, sp=2, recompute=Recompute.SELECTIVE)
    reason = why_not("deepspeed", MODEL, a2a, ulysses, flash=False)
    assert reason is not None and "sp 2 (DeepSpeed-Ulysses)" in reason
    assert why_not("deepspeed", MODEL, TRAINING, replace(selective, recompute=Recompute.FULL),
                   flash=True) is None
    assert why_not("megatron", MODEL, TRAINING, selective, flash=True) is None


def test_torchtitan_runs_zero_2_at_pp_1_and_zero_1_with_pp() -> None:
    # torchtitan's one stand-in for ZeRO-1/2 (FSDP without resharding) reduce-scatters into
    # shards every micro-batch at pp 1 (its trainer never turns the gradient sync off): ZeRO-2;
    # with pp > 1 PyTorch's pipeline stages sync on the last micro-batch only: ZeRO-1
    reason = _why("torchtitan", dp=32, zero=ZeroStage.OPTIMIZER)
    assert reason is not None and "use zero 2 or 3" in reason
    assert _why("torchtitan", dp=32, zero=ZeroStage.GRADIENTS) is None
    reason = _why("torchtitan", dp=16, pp=2, zero=ZeroStage.GRADIENTS)
    assert reason is not None and "use zero 1 or 3" in reason
    assert _why("torchtitan", dp=16, pp=2, zero=ZeroStage.OPTIMIZER) is None
    assert _why("torchtitan", dp=1, tp=8, zero=ZeroStage.OPTIMIZER) is None  # nothing sharded
    assert _why("megatron", dp=32, zero=ZeroStage.OPTIMIZER) is None


def test_any_runs_everything_and_unknown_is_an_error() -> None:
    assert _why("any", dp=16, pp=2, sp=2, zero=ZeroStage.PARAMETERS,
                schedule=Schedule.GPIPE) is None
    with pytest.raises(ValueError, match="unknown framework 'jax'"):
        _why("jax")


# -- the study field --------------------------------------------------------------------------
def test_deepspeed_study_space_drops_what_deepspeed_refuses(tmp_path) -> None:
    # 64 devices, tp = sp = 1: layouts (dp 64, pp 1) and (dp 32, pp 2), times ZeRO 0-3 = 8 plans,
    # all valid for simcore (80 layers split in 2; 512 sequences tile dp 64 and dp 32).
    # DeepSpeed's pipeline engine drops (pp 2, ZeRO 2) and (pp 2, ZeRO 3), and in bf16 (pp 2,
    # ZeRO 0), which its BF16_Optimizer runs as ZeRO 1: 8 - 3 = 5 plans.
    any_ = load_study_config(_study(tmp_path, "any"))
    ds = load_study_config(_study(tmp_path, "ds", "framework: deepspeed\n"))
    assert any_.system.device.bf16
    assert len(any_.space.valid) == 2 * 4
    dropped = set(any_.space.valid) - set(ds.space.valid)
    assert {(s.pp, s.zero) for s in dropped} == {(2, ZeroStage.NONE), (2, ZeroStage.GRADIENTS),
                                                 (2, ZeroStage.PARAMETERS)}
    assert len(ds.space.valid) == 5 and set(ds.space.valid) <= set(any_.space.valid)
    refused = next(iter(dropped))
    assert "DeepSpeed's pipeline engine" in str(ds.space.reason_invalid(refused))
    assert ds.summary()["framework"] == "deepspeed"
    assert "framework" not in any_.summary()  # existing studies keep their fingerprint
    assert ds.fingerprint() != any_.fingerprint()


def test_bad_framework_is_one_line(tmp_path) -> None:
    path = _study(tmp_path, "bad", "framework: megatronn\n")
    with pytest.raises(PlannerUsageError) as e:
        load_study_config(path)
    message = str(e.value)
    assert message.startswith(f"{path}: framework: ") and "'megatronn'" in message
    assert ", ".join(FRAMEWORKS) in message and len(message.splitlines()) == 1


# -- the CLI ----------------------------------------------------------------------------------
def test_export_of_a_refused_plan_is_one_line_exit_2(tmp_path, capsys) -> None:
    # One plan: dp 32, pp 2, ZeRO 3. Megatron-LM runs it (Megatron-FSDP), DeepSpeed does not.
    storage = ("--storage", str(tmp_path / "s.db"))
    path = _study(tmp_path, "zero3pp2", zero="[3]", pp="[2]")
    assert main(["run", str(path), "--quiet", *storage]) == 0
    capsys.readouterr()
    out = tmp_path / "out"
    assert main(["export", "zero3pp2", "--format", "deepspeed", "--out", str(out),
                 *storage]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "zero 3 with pp 2" in err and "offers ZeRO 1" in err
    assert not out.exists()
    assert main(["export", "zero3pp2", "--format", "megatron", "--out", str(out),
                 *storage]) == 0
    assert "--use-megatron-fsdp" in next(out.glob("*/megatron.sh")).read_text()


def test_study_with_framework_runs_and_exports(tmp_path, capsys) -> None:
    # The stored study rebuilds its space (with its framework) from what it stores.
    storage = ("--storage", str(tmp_path / "s.db"))
    path = _study(tmp_path, "dsrun", "framework: deepspeed\n")
    assert main(["run", str(path), "--quiet", "--hbm-gb", "80", *storage]) == 0
    assert main(["export", "dsrun-hbm80gb", "--top", "5", "--format", "deepspeed", "--out",
                 str(tmp_path / "out"), *storage]) == 0
    # every plan it holds: in 80 GB only dp 64 with ZeRO-3 (50.4 GB) fits this 70B model
    assert len(list((tmp_path / "out").glob("*/ds_config.json"))) == 1
    # Ranked by time alone (hbm_gb: unlimited), its best plan needs more than the device's
    # 80 GB: not written for DeepSpeed, which could not run it.
    assert main(["run", str(path), "--quiet", *storage]) == 0
    capsys.readouterr()
    assert main(["export", "dsrun", "--format", "deepspeed", "--out", str(tmp_path / "o2"),
                 *storage]) == 2
    err = capsys.readouterr().err
    assert "GB a device, over the 80 GB" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o2").exists()


def test_deepspeed_prices_and_runs_megatron_deepspeeds_loss(tmp_path) -> None:
    # Megatron-DeepSpeed 4efb479d: gpt_model.py takes the loss on output.float() while holding
    # the 16-bit output, and cross_entropy.py shifts that copy by its max out of place: 2 + 4 +
    # 4 bytes a logit at its forward, where the fused loss holds 4. By hand, Llama 2 70B's
    # 32,000-token vocabulary, one micro-batch of 1,024 tokens at tp 1 on the one stage:
    # 6 x 1,024 x 32,000 bytes more.
    from simcore import estimate
    from simcore.specs import CrossEntropy

    ds = load_study_config(_study(tmp_path, "ds", "framework: deepspeed\n"))
    assert ds.training.cross_entropy is CrossEntropy.MEGATRON_DEEPSPEED
    plan = Strategy(dp=64, zero=ZeroStage.OPTIMIZER)
    system = load_catalog().system("lab-system1")
    fused = estimate(MODEL, system, replace(ds.training, cross_entropy=CrossEntropy.FUSED),
                     plan)
    assert (estimate(MODEL, system, ds.training, plan).memory.activations
            - fused.memory.activations) == pytest.approx(6 * 1024 * MODEL.vocab, rel=1e-12)
    assert MODEL.vocab == 32_000
    # Megatron-LM has no such loss; a plan priced with another one is exported for DeepSpeed
    # with Megatron-DeepSpeed's figures (its launcher runs its own loss)
    reason = why_not("megatron", MODEL, ds.training, plan)
    assert reason is not None and "cross_entropy megatron_deepspeed" in reason
    from planner.exports import export_files
    from planner.plan import make_plan
    from simcore import Convention

    priced = make_plan(MODEL, system, replace(ds.training, cross_entropy=CrossEntropy.FUSED),
                       plan, Convention.MEGATRON)
    launch = export_files(priced, "deepspeed")["deepspeed-launch.txt"]
    runs = estimate(MODEL, system, ds.training, plan).memory.total / 1e9
    assert f"peak memory {runs:.1f} GB a device" in launch
