"""The megatron convention against measured runs (tests/data/published_runs.csv, README there).

Targets (issue 4): iteration time median error <= 10% and every run within 20%; per-GPU memory
of the BLOOM rows median error <= 10%; the out-of-memory rows predicted not to fit.
Since issue 14 the A100's constants are fit on measured runs in tests/data/validation (README
there), none of these, so every figure here is a check: Table 4's layer times too, which were
the fit set before.

Fit on llm-foundry's PyTorch FSDP runs alone (memory_efficiency 0.367) the element-wise heavy
GPT layers here came out slow: GPT 22B with full recompute +25.7%, Table 4 layer times up to
+31%. Fit on those runs and the zero-bubble paper's Megatron-LM runs together (memory_efficiency
0.737, matmul 0.707): iteration times within 10% (mean 7.9% -> 4.8%, GPT 22B +3.1%), every
Table 4 layer time within 9%.
"""

from __future__ import annotations

import re
import statistics

import pytest

from simcore import estimate
from simcore.megatron import layer_time
from tests.megatron_rows import runs

GB = 1e9
RUNS = runs()
ITERATION = [r for r in RUNS if r.metric == "iteration_time"]
LAYER = [r for r in RUNS if r.metric.startswith("layer_fwd_plus_bwd")]
MEMORY = [r for r in RUNS if r.metric == "peak_memory_nvidia_smi_max_node"]
OOM = [r for r in RUNS if r.metric == "fits_in_80GB"]


def _errors(pairs: list[tuple[float, float]]) -> list[float]:
    return [abs(est / measured - 1) for est, measured in pairs]


def test_the_data_holds_the_rows_the_readme_lists() -> None:
    # Korthikanti Table 3/5 (8) + section 6.3 (1); Table 4 (5); BLOOM memory (28) + OOM (3).
    assert (len(ITERATION), len(LAYER), len(MEMORY), len(OOM)) == (9, 5, 28, 3)


def test_iteration_time_korthikanti_tables_3_and_5() -> None:
    pairs = [(estimate(r.model, r.system, r.training, r.strategy).step_time, float(r.value))
             for r in ITERATION]
    errors = _errors(pairs)
    assert statistics.median(errors) <= 0.10, errors
    assert max(errors) <= 0.12, errors  # GPT 1T with full recompute: +9.1%


TABLE_4_TOLERANCE = 0.10  # forward +8.2% at worst (docstring)


@pytest.mark.parametrize("run", LAYER, ids=lambda r: r.label)
def test_layer_forward_and_backward_korthikanti_table_4(run) -> None:
    # The notes hold the paper's split, e.g. "Forward 7.7 ms, backward 11.9 ms, combined 19.6 ms".
    measured = re.search(r"Forward ([\d.]+) ms, backward ([\d.]+) ms", run.notes)
    assert measured is not None
    forward, backward = layer_time(run.model, run.system, run.training, run.strategy)
    assert forward * 1e3 == pytest.approx(float(measured[1]), rel=TABLE_4_TOLERANCE)
    assert backward * 1e3 == pytest.approx(float(measured[2]), rel=TABLE_4_TOLERANCE)


MEMORY_TOLERANCE = 0.05
"""Issue 14: median memory error <= 5% on runs not fit on."""


def _stage0_errors(rows) -> list[float]:
    pairs = []
    for r in rows:
        est = estimate(r.model, r.system, r.training, r.strategy)
        # nvidia-smi of the first node, which holds the embedding: stage 0.
        pairs.append((est.stages[0].memory.total / GB, float(r.value)))
    return _errors(pairs)


def test_bloom_memory_check_rows_median_within_5_percent() -> None:
    # The memory allowance (9 GB) was fit on the 02-17 and 02-21 tables; the 13 rows of 02-25
    # ("Tweaking TP", "some more configs with lower PP") are the check.
    check = [r for r in MEMORY if r.row >= 72]
    assert len(check) == 13
    errors = _stage0_errors(check)
    assert statistics.median(errors) <= MEMORY_TOLERANCE, sorted(errors)


def test_bloom_memory_all_rows_median_within_10_percent() -> None:
    assert statistics.median(_stage0_errors(MEMORY)) <= 0.10


@pytest.mark.parametrize("run", OOM, ids=lambda r: r.label)
def test_bloom_out_of_memory_rows_do_not_fit(run) -> None:
    est = estimate(run.model, run.system, run.training, run.strategy)
    assert not est.fits
    assert "HBM" in est.reason


def test_zero_1_halves_bloom_memory_as_measured() -> None:
    # Rows 69 / 70: the same 181B config with ZeRO-1 and ZeRO-0 measured 37 GB and 72 GB.
    by_row = {r.row: r for r in MEMORY}
    one, zero = (estimate(by_row[i].model, by_row[i].system, by_row[i].training,
                          by_row[i].strategy).stages[0].memory.total / GB for i in (69, 70))
    assert one < zero
    assert abs((zero - one) / (72 - 37) - 1) <= 0.25
