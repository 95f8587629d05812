"""training.fp8_attention (simcore/megatron/kernels.py, precision.py, activations.py): Transformer
Engine's fused attention in FP8 at the device's speed-up by sequence length, as cuDNN's own
benchmark measures it (studies/catalog/devices/gpus.yaml); Q, K and V kept in 1 byte; the
devices and frameworks that refuse it; where a user meets it; MLPerf's two 8B runs that train
with it (tests/data/validation/README.md, "MLPerf Training"). Hand calculations in comments."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

import simcore
from planner.catalog import device_from_entry, load_catalog
from planner.catalog_write import device_entry
from planner.cli import main
from planner.exports import export_files
from planner.plan import make_plan, plan_text, read_plan
from planner.study_config import load_study_config
from search_spaces.frameworks import why_not
from search_spaces.space import StrategySpace
from simcore.megatron.plan import StepPlan
from simcore.megatron.precision import fp8_attention_speedup
from simcore.specs import Convention, Precision, Strategy, TrainingSpec, ZeroStage
from tests.space_checks import assert_batched_and_bounds_hold

CATALOG = load_catalog()
LLAMA8 = CATALOG.model("llama3-8b")
GB200_8 = CATALOG.system("dgx-gb200-8")
PLAIN = TrainingSpec(global_batch=16, seq_len=8192)
FP8_ATTENTION = replace(PLAIN, fp8_attention=True)
MLPERF_8B = Strategy(dp=8, micro_batch=2, zero=ZeroStage.OPTIMIZER, sequence_parallel=False,
                     precision=Precision.NVFP4)
"""MLPerf v5.1's Llama 3.1 8B on one GB200 tray pair (NVIDIA's config_GB200_2x4x2xtp1pp1cp1_8b_fp4:
dp 8, micro-batch 2, NVFP4 with FP8 attention)."""


@pytest.fixture(autouse=True)
def no_user_catalog(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANNER_CATALOG", str(tmp_path / "user-catalog"))


def test_the_speedup_is_cudnns_read_on_a_log_scale() -> None:
    # cuDNN's benchmark on GB200 (cudnn-frontend@3929da2 llama3.1_20260424_100750.csv, causal,
    # forward + backward): 2K 0.514 / 0.511 ms, 4K 1.589 / 1.472, 8K 5.524 / 4.855, 16K
    # 21.704 / 17.560, 32K 93.448 / 68.167 ms (bf16 / fp8)
    points = CATALOG.device("gb200").fp8_attention_speedup
    assert points == ((2048, 1.006), (4096, 1.079), (8192, 1.138), (16384, 1.236),
                      (32768, 1.371))
    assert round(5.524 / 4.855, 3) == 1.138 and round(93.448 / 68.167, 3) == 1.371
    assert fp8_attention_speedup(points, 8192) == 1.138
    # 6K: halfway in log2 between 4K and 8K is 5.79K; at 6144, log2(1.5) = 0.585 of the way:
    # 1.079 + 0.585 x 0.059 = 1.1135
    assert fp8_attention_speedup(points, 6144) == pytest.approx(1.1135, abs=1e-4)
    assert fp8_attention_speedup(points, 512) == 1.006  # the nearest point beyond them
    assert fp8_attention_speedup(points, 131072) == 1.371
    assert fp8_attention_speedup((), 8192) == 1.0
    # on H200 cuDNN 9.19's FP8 backward is slower from 8K: 6.791 / 7.533 ms = 0.902
    assert fp8_attention_speedup(CATALOG.device("h200").fp8_attention_speedup, 8192) == 0.902
    assert CATALOG.device("h100-sxm").fp8_attention_speedup == \
        CATALOG.device("h200").fp8_attention_speedup


def test_the_attention_kernel_runs_at_the_speedup() -> None:
    plain = StepPlan(LLAMA8, GB200_8, PLAIN, MLPERF_8B).kernels
    fp8 = StepPlan(LLAMA8, GB200_8, FP8_ATTENTION, MLPERF_8B).kernels
    # tp 1, sp 1: 8,192 local queries, the 8K point; the forward's attention is one kernel well
    # over the launch floor
    assert plain.core_forward / fp8.core_forward == pytest.approx(1.138, rel=1e-9)
    # the backward's attention kernel (2.5x the forward's FLOPs) too; nothing else moves
    attention = plain.core_forward * (1 + 2.5)
    assert (plain.forward + plain.backward) - (fp8.forward + fp8.backward) == pytest.approx(
        attention * (1 - 1 / 1.138), rel=1e-9)
    assert plain.gemm_forward == fp8.gemm_forward and plain.wgrad == fp8.wgrad


def test_q_k_and_v_are_kept_in_one_byte() -> None:
    one = simcore.estimate(LLAMA8, GB200_8, PLAIN, MLPERF_8B)
    fp8 = simcore.estimate(LLAMA8, GB200_8, FP8_ATTENTION, MLPERF_8B)
    # Q (h wide) and K, V (8 of 32 heads: h / 4 each) of 2 x 8,192 tokens, a byte less each, in
    # each of 32 layers, one micro-batch in flight: 1.5 x 16,384 x 4,096 x 32 = 3.22 GB
    saved = 1.5 * 16_384 * 4096 * 32
    assert one.memory.activations - fp8.memory.activations == pytest.approx(saved, rel=1e-9)


def test_plans_it_does_not_touch() -> None:
    """bf16 plans, and plans without Transformer Engine, keep 16-bit attention."""
    for strategy, training in ((replace(MLPERF_8B, precision=Precision.BF16), FP8_ATTENTION),
                               (MLPERF_8B, replace(FP8_ATTENTION, transformer_engine=False))):
        plain = replace(training, fp8_attention=False)
        assert simcore.estimate(LLAMA8, GB200_8, training, strategy).step_time == \
            simcore.estimate(LLAMA8, GB200_8, plain, strategy).step_time


def test_a_device_without_the_figures_refuses_it(tmp_path: Path, capsys) -> None:
    bare = replace(GB200_8, device=replace(GB200_8.device, name="bare",
                                           fp8_attention_speedup=()))
    with pytest.raises(ValueError, match="device bare has no fp8_attention_speedup"):
        simcore.estimate(LLAMA8, bare, FP8_ATTENTION, MLPERF_8B)
    assert simcore.estimate(LLAMA8, bare, PLAIN, MLPERF_8B).step_time > 0
    with pytest.raises(ValueError, match="fp8_attention_speedup must be"):
        replace(GB200_8.device, fp8_attention_speedup=((4096, 1.1), (2048, 1.0)))
    # a study: one line naming the file, the field and the fix
    system = {"bare-8": {"device": device_entry(bare.device),
                         "network": [{"topology": "Switch", "npus": 8, "bandwidth_gbps": 900,
                                      "latency_us": 0.5}]}}
    (tmp_path / "system.yaml").write_text(yaml.safe_dump(system))
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({
        "name": "s", "model": "llama3-8b", "system": "system.yaml",
        "training": {"global_batch": 16, "seq_len": 8192, "fp8_attention": True},
        "space": {"dp": [8], "precision": ["bf16", "nvfp4"]}}))
    assert main(["run", str(study)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert str(study) in err and "training.fp8_attention" in err
    assert "no fp8_attention_speedup" in err and "set fp8_attention false" in err


def test_the_catalog_entry_round_trips() -> None:
    device = CATALOG.device("gb300")
    again = device_from_entry(Path("x.yaml"), "gb300", device_entry(device))
    assert again.fp8_attention_speedup == device.fp8_attention_speedup
    assert again == replace(device, name="gb300")


def test_only_framework_any_runs_it() -> None:
    """Megatron-LM's command line has no flag for fp8_dot_product_attention; the exporter
    refuses the plan rather than write one that trains its attention in 16-bit."""
    for framework in ("megatron", "torchtitan", "deepspeed"):
        reason = why_not(framework, LLAMA8, FP8_ATTENTION, replace(MLPERF_8B,
                                                                   precision=Precision.FP8))
        # DeepSpeed refuses the FP8 plan before its attention
        assert reason is not None and ("fp8_attention" in reason
                                       or framework == "deepspeed"), framework
    assert why_not("any", LLAMA8, FP8_ATTENTION, MLPERF_8B) is None
    bf16 = replace(MLPERF_8B, precision=Precision.BF16)
    assert why_not("megatron", LLAMA8, FP8_ATTENTION, bf16) is None
    plan = make_plan(LLAMA8, GB200_8, FP8_ATTENTION, MLPERF_8B, Convention.MEGATRON)
    with pytest.raises(ValueError, match="fp8_attention"):
        export_files(plan, "megatron")


def test_plan_files_keep_it(tmp_path: Path) -> None:
    plan = make_plan(LLAMA8, GB200_8, FP8_ATTENTION, MLPERF_8B, Convention.MEGATRON)
    path = tmp_path / "plan.yaml"
    path.write_text(plan_text(plan, ".yaml"))
    again = read_plan(path)
    assert again.training.fp8_attention
    assert again.estimate.step_time == plan.estimate.step_time


def test_the_cli_and_a_study(tmp_path: Path, capsys) -> None:
    args = ["estimate", "--model", "llama3-8b", "--system", "dgx-gb200-8", "--dp", "8",
            "--micro-batch", "2", "--global-batch", "16", "--seq-len", "8192", "--zero", "1",
            "--precision", "nvfp4", "--no-sequence-parallel"]
    assert main([*args, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)["step_time"]
    assert main([*args, "--fp8-attention"]) == 0
    out = capsys.readouterr().out
    assert "attention in FP8" in out.splitlines()[0]
    assert main([*args, "--fp8-attention", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time"] < plain
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({
        "name": "s", "model": "llama3-8b", "system": "dgx-gb200-8",
        "training": {"global_batch": 16, "seq_len": 8192, "fp8_attention": True},
        "space": {"dp": [8], "precision": ["bf16", "fp8", "nvfp4"]}}))
    config = load_study_config(study)
    assert config.training.fp8_attention
    space = StrategySpace(model=config.model, system=config.system, training=config.training,
                          convention=Convention.MEGATRON, dp=(8,),
                          precision=(Precision.BF16, Precision.FP8, Precision.NVFP4))
    assert_batched_and_bounds_hold(space)


def test_mlperfs_8b_runs_with_it(capsys) -> None:
    """MLPerf v5.1's Llama 3.1 8B on 8 GB200s and 8 GB300s in NVFP4 with FP8 attention: +10.8%
    and +8.6% with 16-bit attention, +7.8% and +1.8% with the devices' FP8 attention (cuDNN's
    8K speed-ups 1.138 and 1.304)."""
    assert main(["validate", str(Path(__file__).parent / "data" / "validation"
                                 / "mlperf-check.csv"), "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert 0.07 <= rows["mlperf v5.1 nvidia llama31-8b gb200 x8 nvfp4"]["step_time_error"] <= 0.09
    assert 0.01 <= rows["mlperf v5.1 nvidia llama31-8b gb300 x8 nvfp4"]["step_time_error"] <= 0.03


def test_the_b300_study_picks_the_mlperf_plan() -> None:
    """studies/llama31-8b-b300-8.yaml: of 48 plans in bf16, FP8 and NVFP4 (with FP8 attention)
    the fastest is NVFP4 at dp 8 x micro-batch 2, the plan MLPerf v5.1's submitters ran, 0.395 s
    estimated against 0.394 (Nebius) and 0.406 s (Lenovo) measured; their FP8 run of the same
    plan, 0.548 s, is estimated slower too (0.558 s)."""
    config = load_study_config(Path(__file__).parents[1] / "studies" / "llama31-8b-b300-8.yaml")
    assert config.training.fp8_attention and config.system.device.name == "b300"
    space = config.space
    plans = space.valid
    assert len(plans) == 48
    times = {s: simcore.estimate(config.model, config.system, config.training, s).step_time
             for s in plans}
    best = min(times, key=times.__getitem__)
    assert (best.dp, best.tp, best.sp, best.micro_batch, best.precision) == (
        8, 1, 1, 2, Precision.NVFP4)
    assert 0.394 * 0.97 < times[best] < 0.406 * 1.03
    fp8 = next(s for s in plans if s.precision is Precision.FP8 and s.dp == 8
               and s.micro_batch == 2 and s.recompute.value == "none")
    assert times[fp8] > times[best] and 0.548 < times[fp8] < 0.548 * 1.08
