"""simcore.estimate() on a stage-family model gives what ASTRA-sim measured for the same run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.catalog import load_catalog
from simcore import estimate
from simcore.specs import Recompute, Strategy, TrainingSpec
from simcore.stage import StageArgs, build_model, inventory, model_num_ops

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


def test_recompute_adds_hardware_flops_not_model_flops() -> None:
    # Issue 19: MFU counted the recomputed FLOPs, so full recompute raised it. STAGE's recompute
    # (simcore/stage/_templates.py) runs forward einsums again in every block: q, k, v, qk of
    # attention and x1 of the feed-forward. Rank 0 at dp = 8 holds all 4 blocks with b = 64/8,
    # s = 1024, m = n*h = 1024, dff = 4096 (MACs of an einsum: the product of its indices):
    #   q, k, v: b s m (n h) = 8 * 1024 * 1024 * 1024 = 2^33 each; qk: b s w (n h) = 2^33;
    #   x1: b s m dff = 8 * 1024 * 1024 * 4096 = 2^35 -> 4 * 2^33 + 2^35 = 2^36 per block,
    #   2^38 MACs for 4 blocks; FLOPs = 2 * MACs * 8 devices = 2^42.
    model = CATALOG.model("stage-1024x4")
    system = CATALOG.system("R4S2")
    training = TrainingSpec(global_batch=64, seq_len=1024)
    plain = estimate(model, system, training, Strategy(dp=8))
    full = estimate(model, system, training, Strategy(dp=8, recompute=Recompute.FULL))
    assert full.model_flops == plain.model_flops == plain.hardware_flops
    assert full.hardware_flops - full.model_flops == 2.0**42
    assert full.step_time > plain.step_time  # the recomputed ops take time ...
    assert full.mfu < plain.mfu  # ... and do no model work
    capacity = system.device.peak_flops_per_s * 2 * 8 * full.step_time
    assert full.hfu == pytest.approx(full.hardware_flops / capacity, rel=1e-12)
    assert full.hfu > full.mfu


@pytest.mark.parametrize("flags", [
    {"dp": 4, "tp": 2, "num_stacks": 12},
    {"dp": 2, "tp": 2, "sp": 2, "num_stacks": 9, "weight_sharded": True},
    {"dp": 2, "pp": 2, "tp": 2, "num_stacks": 8},
], ids=str)
def test_model_ops_of_a_long_model_equal_the_built_graphs(flags) -> None:
    # model_num_ops takes a long single-stage model from its short one (simcore.stage._fast);
    # the builder's own rank-0 graph without recompute is the reference it must equal
    args = StageArgs(din=512, dout=512, dmodel=256, dff=1024, head=8, seq=64, batch=16,
                     activation_recompute=True, **flags)
    plain = replace(args, activation_recompute=False)
    assert model_num_ops(args) == inventory(build_model(plain).ranks[0]).sum_num_ops
