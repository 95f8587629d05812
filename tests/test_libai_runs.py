"""LiBai's Megatron-LM runs (tests/data/validation/libai-v100-check.csv; README there, "LiBai's
Megatron-LM runs"): GPT-2 345M (24 layers, hidden 1024, sequence 1024) on one node of V100
32GB at dp / tp 1-8 / pp 1-4, with and without full recompute, from the Megatron-LM column of
Oneflow-Inc/libai@8a7f119c docs/source/tutorials/get_started/Benchmark.md. Nothing is fit on
them; the small-GPT regime of issue 14's held-out runs, on V100."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.catalog import load_catalog
from planner.cli import main
from planner.runs_csv import read_runs
from simcore import estimate

DATA = Path(__file__).parent / "data" / "validation"
FILE = DATA / "libai-v100-check.csv"
# the table's Megatron-LM samples/s, by the row's dp x tp x pp, recompute, micro-batch and batch
SAMPLES_PER_S = {"1x1x1 mb6 gb6": 15.5, "4x1x1 mb4 gb16": 53.3, "8x1x1 mb4 gb32": 107.9,
                 "1x4x1 mb6 gb6": 38.0, "1x8x1 mb8 gb8": 55.7, "1x1x1 ac mb32 gb256": 13.3,
                 "1x1x4 ac mb32 gb256": 33.2, "2x2x1 ac mb32 gb512": 36.9,
                 "4x2x1 ac mb32 gb1024": 73.2, "2x1x4 ac mb32 gb512": 65.3}
MAPE = 0.07  # measured 6.1% (9.7% while a tp 2 group had the node's whole NVLink rate, 11.7%
# while a tp collective also cost the host a kernel's time)
TP_NO_RECOMPUTE = 0.25  # tp 4 and tp 8 without recompute: +14.1% and +22.2% (+23.7, +33.0%)
TP_2 = 0.03  # tp 2 with full recompute: +0.4% and -0.5% on the pair's one NVLink (-17.6% and
# -18.2% at the node's whole rate: libai-systems.yaml's header)


def _validate(capsys) -> dict:
    assert main(["validate", str(FILE), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_each_step_is_the_batch_over_the_tables_samples_per_second() -> None:
    runs, skipped = read_runs(FILE, load_catalog())
    assert skipped == [] and len(runs) == len(SAMPLES_PER_S) == 10
    for run in runs:
        key = run.name.split(" x", 1)[1].split(" ", 1)[1]
        assert run.step_time_s == pytest.approx(
            run.training.global_batch / SAMPLES_PER_S[key], abs=1e-5)
        s = run.strategy
        assert f"{s.dp}x{s.tp}x{s.pp}" in key and f"mb{s.micro_batch} " in key + " "


def test_the_one_gpu_run_needs_the_32gb_part() -> None:
    """The node's GPUs are V100 32GB (the libai-systems.yaml header): GPT-2 345M at micro-batch
    6 without recompute holds more than a 16GB V100 has; on the 32GB part it fits."""
    catalog = load_catalog()
    runs, _ = read_runs(FILE, catalog)
    one = next(r for r in runs if r.name.endswith("x1 1x1x1 mb6 gb6"))
    small = catalog.system("dgx1-v100-1")  # the same chip, 16GB
    assert not estimate(one.model, small, one.training, one.strategy).fits
    assert estimate(one.model, one.system, one.training, one.strategy).fits


def test_the_runs_stay_as_near_as_measured(capsys) -> None:
    data = _validate(capsys)
    assert data["skipped"] == [] and data["step_time_runs"] == 10
    assert data["step_time_mape"] <= MAPE
    tp = [r for r in data["rows"] if " 1x4x1 " in r["name"] or " 1x8x1 " in r["name"]]
    assert len(tp) == 2
    assert all(0 < r["step_time_error"] <= TP_NO_RECOMPUTE for r in tp)
    pairs = [r for r in data["rows"] if "x2x1 ac" in r["name"]]
    assert len(pairs) == 2
    assert all(abs(r["step_time_error"]) <= TP_2 for r in pairs)
