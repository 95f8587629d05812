"""The GB300 NVL72 entries (studies/catalog/devices/gpus.yaml ``gb300``,
studies/catalog/systems/gb300.yaml) and the runs they are fit and checked on
(tests/data/validation/gb300-fit.csv, gb300-check.csv; README there, "GB300 NVL72")."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner.calibration import calibrate
from planner.catalog import load_catalog
from planner.cli import main
from planner.runs_csv import read_runs
from simcore.specs import Precision

DATA = Path(__file__).parent / "data" / "validation"


@pytest.fixture(autouse=True)
def no_user_catalog(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANNER_CATALOG", str(tmp_path / "user-catalog"))


def test_the_device_is_the_racks_figures_per_gpu() -> None:
    """GB300 NVL72, per rack of 72 GPUs (glennklockwood.com garden/processors/B300): 360 PFLOPS
    FP8 dense for training, 20 TB of HBM3e at 576 TB/s; BF16 half the FP8 rate (verda.com's
    per-GPU table: 2.5 PFLOPS). The GB200's BF16 and FP8 peaks, 279 GB to its 186."""
    catalog = load_catalog()
    gpu, gb200 = catalog.device("gb300"), catalog.device("gb200")
    assert gpu.fp8_peak_flops_per_s == pytest.approx(360e15 / 72)
    assert gpu.peak_flops_per_s == pytest.approx(gpu.fp8_peak_flops_per_s / 2)
    assert gpu.hbm_bytes == pytest.approx(20e12 / 72, rel=0.01)
    assert gpu.hbm_bandwidth_bytes_per_s == pytest.approx(576e12 / 72)
    assert (gpu.peak_flops_per_s, gpu.fused_attention_efficiency) == (
        gb200.peak_flops_per_s, gb200.fused_attention_efficiency)


def test_racks_of_64_and_800g_between_them() -> None:
    catalog = load_catalog()
    rack, four = catalog.system("dgx-gb300-64"), catalog.system("dgx-gb300-256")
    assert [d.npus for d in rack.network.dims] == [64]
    assert [d.npus for d in four.network.dims] == [64, 4]
    # one ConnectX-8 800 Gb/s port a GPU: twice the GB200's 400G port's rate
    ib300, ib200 = four.network.dims[1], catalog.system("dgx-gb200-256").network.dims[1]
    assert ib300.bandwidth_bytes_per_s == pytest.approx(2 * ib200.bandwidth_bytes_per_s)


def test_the_gemm_rate_is_the_fit_on_its_fit_file() -> None:
    """`planner calibrate tests/data/validation/gb300-fit.csv --device gb300 --fit
    fused_matmul_efficiency` from the gb200 entry's rate (0.532) lands on the catalog's 0.723
    and passes its cross-validation, its MXFP8 runs priced as FP8 as they were then (with their
    own rate, tests/test_mxfp8.py, it would land on 0.730)."""
    catalog = load_catalog()
    device = catalog.device("gb300")
    runs, skipped = read_runs(DATA / "gb300-fit.csv", catalog)
    assert len(runs) == 8 and skipped == []
    runs = [replace(r, strategy=replace(r.strategy, precision=Precision.FP8)) for r in runs]
    start = replace(device, fused_matmul_efficiency=catalog.device("gb200").fused_matmul_efficiency)
    fit = calibrate(runs, start, "gb300-refit", only=("fused_matmul_efficiency",))
    assert not fit.kept
    assert fit.device.fused_matmul_efficiency == pytest.approx(device.fused_matmul_efficiency,
                                                               abs=0.002)


def test_fit_and_check_error(capsys) -> None:
    """Megatron-Bridge's GB300 runs (README, "GB300 NVL72"): fit on containers 26.04 and
    26.04.01 (4.0% MAPE), checked on 25.11, 26.02 and 26.02.01 (with the gb200 entry's rate the
    26.0x runs were 12-28% slow); MXFP8 the furthest (-8 to -10% at 405B; -10 to -12% when it was
    priced as FP8: tests/test_mxfp8.py)."""
    assert main(["validate", str(DATA / "gb300-fit.csv"), "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)
    assert fit["step_time_runs"] == 8 and fit["step_time_mape"] <= 0.045
    assert main(["validate", str(DATA / "gb300-check.csv"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["step_time_runs"] == 11 and data["skipped"] == []
    assert data["over_memory_runs"] == 0
    assert data["step_time_median_ape"] <= 0.06  # measured 5.1%
    assert data["step_time_mape"] <= 0.065  # measured 5.2%
    errors = {r["name"]: r["step_time_error"] for r in data["rows"]}
    # FP8-CS within -9.4 (25.11's 70B, 16% slower than 26.04's) to +7.5% (25.11's 8B)
    assert all(abs(e) <= 0.10 for n, e in errors.items() if "mxfp8" not in n)
