"""simcore.estimate() on a stage-family model gives what ASTRA-sim measured for the same run."""

from __future__ import annotations

from planner.catalog import load_catalog
from simcore import estimate
from simcore.specs import Strategy, TrainingSpec

CATALOG = load_catalog()


def test_stage_family_through_the_estimate_api() -> None:
    # tests/data/astra_results.csv row R4S2_dp8_tp1_pp1_sp1_ws0_rc0: max finished 4,726,894 ns,
    # max peak 1,515,978,752 tracker units, GPU time 4,726,894 ns (all communication hidden).
    model = CATALOG.model("stage-1024x4")
    system = CATALOG.system("R4S2")
    est = estimate(model, system, TrainingSpec(global_batch=64, seq_len=1024), Strategy(dp=8))
    assert est.convention == "stage"
    assert round(est.step_time * 1e9) == 4_726_894
    assert round(est.time.compute * 1e9) == 4_726_894
    assert est.memory.total == 1_515_978_752
    assert est.fits  # 1.5 G elements at one byte each, below the catalog NPU's 80 GB
