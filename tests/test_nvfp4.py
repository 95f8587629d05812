"""precision: nvfp4 (simcore/megatron/precision.py): the linear GEMMs at the FP4 peak, NVFP4's
casts (an amax pass, then both 4-bit copies with their scales), its weight copies and saved
inputs, the devices that refuse it, the space's knob, the exports' flags, and Megatron-Bridge's
NVFP4 runs on GB200 and GB300 (tests/data/validation/README.md, "NVFP4"). Hand calculations in
comments."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import simcore
from planner.calibration import calibrate
from planner.catalog import load_catalog
from planner.cli import main
from planner.exports import export_files
from planner.plan import make_plan, strategy_dict, strategy_from_attrs
from planner.runs_csv import read_runs
from planner.study_config import load_study_config
from search_spaces.frameworks import why_not
from search_spaces.space import StrategySpace
from simcore.megatron.batched import estimate_many
from simcore.megatron.kernels import KernelCosts
from simcore.megatron.precision import fp8_overheads
from simcore.specs import Convention, DeviceSpec, Precision, Schedule, Strategy
from simcore.specs import Recompute, TrainingSpec, ZeroStage
from tests.space_checks import assert_batched_and_bounds_hold

CATALOG = load_catalog()
DATA = Path(__file__).parent / "data" / "validation"
GB300, GB200 = CATALOG.device("gb300"), CATALOG.device("gb200")
NV, FP8 = Precision.NVFP4, Precision.FP8
RACK = CATALOG.system("dgx-gb300-64")
LLAMA70 = CATALOG.model("llama3-70b")
TRAINING = TrainingSpec(global_batch=256, seq_len=8192)
RECIPE = Strategy(dp=16, tp=1, pp=4, v=5, schedule=Schedule.INTERLEAVED, zero=ZeroStage.OPTIMIZER,
                  sequence_parallel=False, precision=NV)
"""Llama 3 70B on one GB300 rack as Megatron-Bridge's NVFP4 preset lays it out
(LLAMA3_70B_PRETRAIN_CONFIG_GB300_NVFP4_V2: tp 1 x pp 4 x vp 5, the distributed optimizer)."""


@pytest.fixture(autouse=True)
def no_user_catalog(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANNER_CATALOG", str(tmp_path / "user-catalog"))


# -- (a) time ---------------------------------------------------------------------------------
def test_nvfp4_gemms_run_at_the_fp4_peak() -> None:
    # GB300: 15 PFLOPS FP4 dense (verda.com's per-GPU table) x 0.685 (gpus.yaml) = 10.3 PF/s,
    # against FP8's 5 x 0.723 = 3.6: a compute-bound linear (16384 x 8192 x 8192, 2.2 TFLOP)
    # runs in 0.22 ms, not 0.62 ms (its 128 x 64 output tiles in 52 waves over 160 SMs, the
    # last one 20% empty: busy 8192 / 8320); its inputs take 0.5 bytes and a 1-byte scale per 16.
    nv, fp8 = KernelCosts.of(GB300, NV, True), KernelCosts.of(GB300, FP8, True)
    assert nv.fp8_rate == pytest.approx(15000e12 * 0.685)
    assert nv.fmt.operand_bytes == 0.5 + 1 / 16
    m, n, k = 16384, 8192, 8192
    assert nv.linear(m, n, k) == pytest.approx(
        2 * m * n * k / (15000e12 * 0.685 * 8192 / 8320), rel=1e-9)
    assert fp8.linear(m, n, k) / nv.linear(m, n, k) == pytest.approx(
        15000 * 0.685 / (5000 * 0.723), rel=1e-9)
    # attention's and the LM head's 16-bit GEMMs keep the bf16 rate
    assert nv.gemm(m, n, k) == fp8.gemm(m, n, k)


def test_nvfp4_casts_read_twice() -> None:
    # One linear (4096, 8192, 8192), 8 micro-batches: each cast is an amax pass (2 bytes read)
    # and the cast (2 read + 2 x (0.5 + 1/16) written), two kernels; no scale update.
    costs = KernelCosts.of(GB300, NV, True)
    rate = GB300.hbm_bandwidth_bytes_per_s * GB300.memory_efficiency
    cast = 2 + 2 + 2 * (0.5 + 1 / 16)
    over = fp8_overheads(costs, [(4096, 8192, 8192)], micro_batches=8)
    assert over.forward == pytest.approx(cast * 4096 * 8192 / rate
                                         + cast * 8192 * 8192 / rate / 8)
    assert over.backward == pytest.approx(cast * 4096 * 8192 / rate)
    assert (over.kernels_forward, over.kernels_backward) == (2, 2)


# -- (b) memory -------------------------------------------------------------------------------
def test_nvfp4_keeps_the_16_bit_weights_and_both_copies() -> None:
    # The recipe plan's stage 0: 20 of the 70B's layers at tp 1, 855,638,016 linear parameters
    # each (q, o 8192^2; k, v 8192 x 1024; the MLP 3 x 8192 x 28672): 17,112,760,320. bf16 keeps
    # them in 2 bytes; NVFP4 adds both 4-bit copies with their scales, 2 x (0.5 + 1/16) = 1.125
    # bytes (Megatron-Bridge's NVFP4 recipe gathers no FP4 params: the 16-bit ones stay).
    linear = 20 * (2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672)
    assert linear == 17_112_760_320
    nv = simcore.estimate(LLAMA70, RACK, TRAINING, RECIPE)
    bf16 = simcore.estimate(LLAMA70, RACK, TRAINING, replace(RECIPE, precision=Precision.BF16))
    assert nv.memory.weights - bf16.memory.weights == pytest.approx(1.125 * linear)
    # each saved linear input: 2 bytes an element in bf16, 1 in FP8, 0.5 + 1/16 in NVFP4
    fp8 = simcore.estimate(LLAMA70, RACK, TRAINING, replace(RECIPE, precision=FP8))
    saved_fp8 = bf16.memory.activations - fp8.memory.activations
    assert bf16.memory.activations - nv.memory.activations == pytest.approx(
        (2 - 0.5625) * saved_fp8, rel=1e-9)


# -- (c) who runs it --------------------------------------------------------------------------
def test_devices_without_fp4_refuse_nvfp4() -> None:
    for system in ("dgx-h100-64", "dgx-a100-64"):
        with pytest.raises(ValueError, match="precision nvfp4 needs FP4 tensor cores"):
            simcore.estimate(LLAMA70, CATALOG.system(system), TRAINING, RECIPE)
    with pytest.raises(ValueError, match="nvfp4_matmul_efficiency needs fp4_peak"):
        DeviceSpec(name="x", peak_flops_per_s=1e15, hbm_bytes=8e10,
                   hbm_bandwidth_bytes_per_s=3e12, nvfp4_matmul_efficiency=0.5)


def test_the_space_searches_nvfp4_where_it_runs() -> None:
    kw = {"model": LLAMA70, "training": TRAINING, "convention": Convention.MEGATRON,
          "tp": (1, 2), "pp": (4,), "zero": (ZeroStage.OPTIMIZER,),
          "precision": (FP8, Precision.MXFP8, NV)}
    blackwell = StrategySpace(system=RACK, **kw)  # type: ignore[arg-type]
    hopper = StrategySpace(system=CATALOG.system("dgx-h100-64"), **kw)  # type: ignore[arg-type]
    assert {s.precision for s in blackwell.valid} == {FP8, Precision.MXFP8, NV}
    assert {s.precision for s in hopper.valid} == {FP8}
    assert_batched_and_bounds_hold(blackwell)
    assert strategy_from_attrs(strategy_dict(RECIPE)) == RECIPE


def test_megatron_export_writes_the_nvfp4_recipe_and_others_refuse() -> None:
    # Megatron-Bridge v0.4.0 bf16_with_nvfp4_mixed: fp4 "e2m1", fp4_recipe "nvfp4",
    # fp8_param_gather False
    plan = make_plan(LLAMA70, RACK, TRAINING, RECIPE, Convention.MEGATRON)
    script = export_files(plan, "megatron")["megatron.sh"]
    assert "  --fp4-format e2m1\n" in script and "  --fp4-recipe nvfp4\n" in script
    assert "--fp8-" not in script and "--fp8-param-gather" not in script
    s = Strategy(dp=64, precision=NV)
    assert "torchtitan does not run" in (why_not("torchtitan", LLAMA70, TRAINING, s) or "")
    assert "DeepSpeed has no FP8" in (why_not("deepspeed", LLAMA70, TRAINING, s) or "")


# -- (d) the fit and its check ----------------------------------------------------------------
def test_the_nvfp4_rates_are_the_fits_from_the_fp8_rates() -> None:
    """`planner calibrate tests/data/validation/nvfp4-fit.csv --device D --fit
    nvfp4_matmul_efficiency`, each from the device's per-tensor FP8 fraction (the prior: the
    same fraction of the FP4 peak): GB300 0.723 -> 0.685 (0.682 before the NVLink rates were
    split; 6.5 -> 5.4% MAPE); GB200 stays at
    0.532 (its four runs do not move it)."""
    runs, skipped = read_runs(DATA / "nvfp4-fit.csv", CATALOG)
    assert len(runs) == 8 and skipped == []
    for device, fitted in ((GB300, 0.685), (GB200, 0.532)):
        on = [r for r in runs if r.system.device.name == device.name]  # as --device does
        assert len(on) == 4
        start = replace(device, nvfp4_matmul_efficiency=device.fused_matmul_efficiency)
        fit = calibrate(on, start, f"{device.name}-refit", only=("nvfp4_matmul_efficiency",))
        assert fit.device.nvfp4_matmul_efficiency == pytest.approx(fitted, abs=0.003)
        assert device.nvfp4_matmul_efficiency == fitted


def test_nvfp4_check(capsys) -> None:
    """nvfp4-check.csv (containers 26.02, 26.02.01 and 26.06, not fit on): 7.9% MAPE; the 405B
    on GB300 7-13% fast, GB300's 70B -7%, GB200's 70B 12-14% fast, its 405B -0.4..+7.9% (9.7%
    MAPE, the 405B on GB300 11-16% fast, before the NVLink's ring and NVLS rates were split:
    systems/dgx.yaml; 13.4% with TE's userbuffers tp overlap assumed)."""
    assert main(["validate", str(DATA / "nvfp4-check.csv"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["step_time_runs"] == 9 and data["skipped"] == []
    assert data["over_memory_runs"] == 0
    assert data["step_time_mape"] <= 0.085  # measured 7.9%
    errors = [r["step_time_error"] for r in data["rows"]]
    assert all(-0.15 <= e <= 0.09 for e in errors)


def test_nvfp4_tp_collectives_are_not_overlapped() -> None:
    # Transformer Engine's userbuffers take no NVFP4 all-gather (module/base.py at d0067d0):
    # the 405B at tp 4 on GB300 prices its forward tp collectives exposed in NVFP4, behind the
    # GEMMs (only their slowdown shows) in FP8; and the export leaves --tp-comm-overlap out.
    model, system = CATALOG.model("llama3-405b"), CATALOG.system("dgx-gb300-256")
    training = TrainingSpec(global_batch=1536, seq_len=8192)
    s = Strategy(dp=8, tp=4, pp=8, v=4, schedule=Schedule.INTERLEAVED, zero=ZeroStage.OPTIMIZER,
                 first_stage_layers=15, last_stage_layers=15, precision=NV)  # the recipe's
    nv = simcore.estimate(model, system, training, s)
    fp8 = simcore.estimate(model, system, training, replace(s, precision=FP8))
    assert nv.time.tp > 2 * fp8.time.tp
    script = export_files(make_plan(model, system, training, s, Convention.MEGATRON),
                          "megatron")["megatron.sh"]
    assert "  --sequence-parallel\n" in script and "--tp-comm-overlap" not in script
    fp8_script = export_files(make_plan(model, system, training, replace(s, precision=FP8),
                                        Convention.MEGATRON), "megatron")["megatron.sh"]
    assert "  --tp-comm-overlap\n" in fp8_script


def test_the_gb300_study_picks_nvfp4_and_orders_the_three_recipes() -> None:
    """studies/llama3-405b-gb300-256.yaml: the space's fastest plans are NVFP4, and of
    Megatron-Bridge's three measured recipe plans (26.04.01: FP8-CS tp 4 x pp 8 x vp 4 48.0 s,
    MXFP8 tp 2 x pp 8 x cp 2 x vp 4 51.2 s, NVFP4 tp 4 x pp 8 x vp 4 34.1 s) the NVFP4 one is
    estimated the fastest, by a wider margin than measured (30.9 s against 48.3 and 48.4; the
    MXFP8 one, at cp 2, 47.4 before the context-parallel ring's merges)."""
    config = load_study_config(Path(__file__).parent.parent / "studies"
                               / "llama3-405b-gb300-256.yaml")
    plans = list(config.space.valid)
    result = estimate_many(config.model, config.system, config.training, plans)
    order = np.argsort(result.step_time)
    assert all(plans[i].precision is NV for i in order[:10])
    recipe = {s.precision: s for s in plans if s.pp == 8 and s.v == 4
              and s.recompute is Recompute.NONE
              and (s.tp, s.sp) == ((2, 2) if s.precision is Precision.MXFP8 else (4, 1))}
    assert set(recipe) == {FP8, Precision.MXFP8, NV}
    times = {p: result.step_time[plans.index(s)] for p, s in recipe.items()}
    assert times[NV] < 0.7 * min(times[FP8], times[Precision.MXFP8])  # measured 0.71


def test_the_catalog_lists_each_devices_precisions(capsys) -> None:
    # the FP8 peak makes fp8 (H100), the block-scaled and FP4 constants mxfp8 and nvfp4
    # (Blackwell); A100 has none of them
    assert main(["catalog", "devices"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert "bf16,fp8,mxfp8,nvfp4" in rows["gb300"]
    assert "bf16,fp8" in rows["h100-sxm"] and "bf16" in rows["a100-80gb"]


def test_the_best_table_says_what_mfu_is_against(tmp_path, capsys, monkeypatch) -> None:
    # MFU is model FLOPs over the bf16 peak, so NVFP4 plans show 140-190%: the table says so
    # under it, and only when a quantised plan is in it.
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(_rack_study(tmp_path, "both", "[bf16, nvfp4]"))]) == 0
    out = capsys.readouterr().out
    assert "MFU against the bf16 peak" in out and "nvfp4" in out
    assert main(["run", str(_rack_study(tmp_path, "bf16", "[bf16]"))]) == 0
    assert "MFU against the bf16 peak" not in capsys.readouterr().out


def test_the_html_report_says_it_too(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(_rack_study(tmp_path, "s", "[nvfp4]")), "--quiet"]) == 0
    assert main(["report", "s", "--out", str(tmp_path / "r.html")]) == 0
    assert "MFU against the bf16 peak" in (tmp_path / "r.html").read_text()


def _rack_study(folder: Path, name: str, precisions: str) -> Path:
    """A study file of the 70B's NVFP4 recipe layout on one GB300 rack, in ``precisions``."""
    study = folder / f"{name}.yaml"
    study.write_text("model: llama3-70b\nsystem: dgx-gb300-64\n"
                     "training: {global_batch: 256, seq_len: 8192}\nsampler: exhaustive\n"
                     "space: {tp: [1], pp: [4], v: [5], schedule: [interleaved], zero: [1],"
                     f" precision: {precisions}}}\n")
    return study
