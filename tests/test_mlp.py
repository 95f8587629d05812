"""The mlp convention (the DistIR grid search): hand calculations and trends."""

from __future__ import annotations

import itertools

import pytest

from planner.catalog import load_catalog
from simcore import estimate
from simcore.specs import Strategy, TrainingSpec

CATALOG = load_catalog()
MLP = CATALOG.model("distir-mlp")  # 64 layers of width 8192 (DistIR section 5)
SYSTEM = CATALOG.system("distir-16")  # 16 devices, fully connected, 200 GB/s
TRAINING = TrainingSpec(global_batch=8192, seq_len=1)


def test_compute_of_pure_data_parallelism_by_hand() -> None:
    # dp = 16, one micro-batch of 512 rows per device: each of 64 layers runs a 512 x 8192 x 8192
    # matmul (2 FLOP per MAC) and a ReLU over 512 x 8192 fp32 values, backward twice forward.
    device = SYSTEM.device
    flop_rate = device.peak_flops_per_s * device.matmul_efficiency
    byte_rate = device.hbm_bandwidth_bytes_per_s * device.memory_efficiency
    layer = 2 * 512 * 8192 * 8192 / flop_rate + 2 * 512 * 8192 * 4 / byte_rate
    est = estimate(MLP, SYSTEM, TRAINING, Strategy(dp=16, micro_batch=512))
    assert est.time.compute == pytest.approx(3 * 64 * layer)
    assert est.time.tp == est.time.pp == est.time.bubble == 0
    assert est.time.dp > 0  # 64 x 8192^2 x 4 B = 17.2 GB of gradients all-reduced


def test_the_grid_search_table() -> None:
    # Every (dp, hp, pp, micro-batches) with dp * hp * pp = 16 (DistIR's grid): throughput is
    # positive, and pipelining with more micro-batches shrinks the bubble share.
    rows = []
    for dp, hp in itertools.product([1, 2, 4, 8, 16], repeat=2):
        if 16 % (dp * hp):
            continue
        pp = 16 // (dp * hp)
        for k in (1, 2, 4, 8, 16):
            micro = 8192 // (dp * k)
            est = estimate(MLP, SYSTEM, TRAINING, Strategy(dp=dp, tp=hp, pp=pp, micro_batch=micro))
            rows.append((dp, hp, pp, k, est.tokens_per_s, est.time.bubble / est.step_time))
    assert len(rows) == 15 * 5
    assert all(r[4] > 0 for r in rows)
    pp16 = [r for r in rows if r[2] == 16]
    assert [r[5] for r in pp16] == sorted((r[5] for r in pp16), reverse=True)


def test_sp_is_rejected_for_the_mlp() -> None:
    with pytest.raises(ValueError, match="sp must be 1"):
        estimate(MLP, SYSTEM, TRAINING, Strategy(dp=8, sp=2))
