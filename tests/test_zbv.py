"""Zero-bubble V (``zbv``): two chunks per rank laid out in a V (Qi et al. 2023,
arXiv:2401.10241 section 6), run in PyTorch's ``ScheduleZBVZeroBubble`` order (what torchtitan's
``pipeline_parallel_schedule = "ZBVZeroBubble"`` runs).

The closed form of its bubble (:func:`simcore.megatron.pipeline.zbv_bubble`) is checked against
the discrete-event schedule of that order and against hand calculations; the order itself
against a hand expansion of PyTorch's ``_calculate_single_rank_operations``.
"""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

import simcore
from planner.exports import export_files
from planner.plan import make_plan
from planner.runs_csv import read_runs
from search_spaces.frameworks import why_not
from search_spaces.space import StrategySpace
from simcore.megatron.batched import estimate_many
from simcore.megatron.bounds import SCHEDULE_CODES, lower_bounds
from simcore.megatron.pipeline import in_flight, zbv_bubble
from simcore.specs import Convention, Recompute, Schedule, Strategy, TrainingSpec, ZeroStage
from simcore.timeline import schedule_pipeline, stage_order, step_timeline

from tests.test_zero_bubble import CATALOG, MODEL, ONE_F_ONE_B, SYSTEM, TRAINING

ZBV = replace(ONE_F_ONE_B, schedule=Schedule.ZBV, v=2)
F, B, W = 0, 1, 2


def test_the_order_is_pytorchs() -> None:
    # ScheduleZBVZeroBubble._calculate_single_rank_operations (torch/distributed/pipelining/
    # schedules.py) for p = 2, m = 3, expanded by hand: rank 0 warms up with 2(p - 0) - 1 = 3
    # F0, no (F1, F0) pairs, p - 0 = 2 triples (F1, I1, W1); steady (F0 only while fewer than
    # max(2p - 1, m) = 3) I0 W0 F1 I1 W1; cools down with 2 pairs (I0, W0).
    rank0 = [(F, 0, 0), (F, 0, 1), (F, 0, 2), (F, 1, 0), (B, 1, 0), (W, 1, 0), (F, 1, 1),
             (B, 1, 1), (W, 1, 1), (B, 0, 0), (W, 0, 0), (F, 1, 2), (B, 1, 2), (W, 1, 2),
             (B, 0, 1), (W, 0, 1), (B, 0, 2), (W, 0, 2)]
    # rank 1: 1 F0; 1 pair (F1, F0); 1 triple; steady F0 I0 W0 F1 I1 W1; cool-down 1 pair
    # (I0, I1) and 1 pair (I0, W0); then the W1 and W0 left.
    rank1 = [(F, 0, 0), (F, 1, 0), (F, 0, 1), (F, 1, 1), (B, 1, 0), (W, 1, 0), (F, 0, 2),
             (B, 0, 0), (W, 0, 0), (F, 1, 2), (B, 1, 1), (W, 1, 1), (B, 0, 1), (B, 1, 2),
             (B, 0, 2), (W, 0, 1), (W, 1, 2), (W, 0, 2)]
    for rank, expected in ((0, rank0), (1, rank1)):
        order = stage_order(Schedule.ZBV, rank, 2, 3, 2)
        got = list(zip(order.kind.tolist(), order.chunk.tolist(), order.micro_batch.tolist()))
        assert got == [(kind, chunk, micro) for kind, chunk, micro in expected]


@pytest.mark.parametrize(("f", "b", "w", "p", "bubble"), [
    # f = b = w: alpha = max(1, 1, 0, 0, -1, 0) = 1, beta = max(1, 1, 1, 0, 0) = 1: (p - 1) f,
    # only the last rank's wait for the first forward
    (1.0, 1.0, 1.0, 4, 3.0),
    # f = 2, b = w = 1: alpha = max(1, 2, 0, 2, -1, 1) = 2, beta = max(1, 1, 3, 0, 2) = 3
    (2.0, 1.0, 1.0, 4, 2.0 + 2 * 3.0),
    # f = 1, b = 1.2, w = 0.5: alpha = max(1.2, 1, 1.4, 0.3, 0.5, 1.2) = 1.4,
    # beta = max(1.2, 0.5, 0.8, 1.4, 1.0) = 1.4: (p - 1) x 1.4
    (1.0, 1.2, 0.5, 8, 7 * 1.4),
])
def test_bubble_by_hand(f, b, w, p, bubble) -> None:
    assert zbv_bubble(p, f, b, w) == pytest.approx(bubble, rel=1e-12)
    m = 3 * p
    ops = schedule_pipeline(Schedule.ZBV, np.full((p, 2), f), np.full((p, 2), b + w), m,
                            np.full((p, 2), w))
    assert ops.makespan == pytest.approx(2 * m * (f + b + w) + bubble, rel=1e-12)


def test_closed_form_is_the_schedules_end() -> None:
    # random per-chunk times on equal ranks, every depth 2..8, m from 2p - 1 (the closed form's
    # range) to 4p: the discrete-event schedule of PyTorch's order ends at the closed form
    rng = random.Random(14)
    for _ in range(12):
        f, b, w = (rng.uniform(0.1, 2.0) for _ in range(3))
        for p in range(2, 9):
            for m in range(2 * p - 1, 4 * p + 1, 5):
                ops = schedule_pipeline(Schedule.ZBV, np.full((p, 2), f),
                                        np.full((p, 2), b + w), m, np.full((p, 2), w))
                expected = 2 * m * (f + b + w) + zbv_bubble(p, f, b, w)
                assert ops.makespan == pytest.approx(expected, rel=1e-12), (f, b, w, p, m)


def test_bubble_against_the_other_schedules() -> None:
    # per-stage F = 2, B = 2, W = 2 (chunk 1, 1, 1), p = 8, m = 32: 1F1B's bubble is
    # (p - 1)(F + B + W) = 42, ZB-H1's (p - 1)(F + B - W) = 14, zbv's (p - 1) x 1 = 7
    p, m = 8, 32
    one_f_one_b = schedule_pipeline(Schedule.ONE_F_ONE_B, np.full((p, 1), 2.0),
                                    np.full((p, 1), 4.0), m).makespan
    zb_h1 = schedule_pipeline(Schedule.ZB_H1, np.full((p, 1), 2.0), np.full((p, 1), 4.0), m,
                              np.full((p, 1), 2.0)).makespan
    zbv = schedule_pipeline(Schedule.ZBV, np.full((p, 2), 1.0), np.full((p, 2), 2.0), m,
                            np.full((p, 2), 1.0)).makespan
    assert (one_f_one_b - 6 * m, zb_h1 - 6 * m, zbv - 6 * m) == pytest.approx((42, 14, 7))


def test_every_rank_holds_p_micro_batches() -> None:
    # Qi et al. section 6: ZB-V's peak activation memory is p M_B on every worker, 1F1B's
    # first stage's. Counted on the order: chunk forwards run minus W passes run, half a
    # stage's layers each.
    for p, m in ((2, 3), (4, 7), (4, 16), (8, 64)):
        for rank in range(p):
            order = stage_order(Schedule.ZBV, rank, p, m, 2)
            held = np.cumsum((order.kind == F).astype(int) - (order.kind == W).astype(int))
            assert held.max() / 2 == p == in_flight(Schedule.ZBV, rank, p, m, 2)
    e = simcore.estimate(MODEL, SYSTEM, TRAINING, ZBV)
    assert [st.in_flight for st in e.stages] == [ZBV.pp] * ZBV.pp


def test_estimate_ends_and_head() -> None:
    e = simcore.estimate(MODEL, SYSTEM, TRAINING, ZBV)
    base = simcore.estimate(MODEL, SYSTEM, TRAINING, ONE_F_ONE_B)
    zb = simcore.estimate(MODEL, SYSTEM, TRAINING, replace(ONE_F_ONE_B, schedule=Schedule.ZB_H1))
    assert e.time.bubble < zb.time.bubble < base.time.bubble
    # rank 0 holds the embedding and the LM head (the first and last chunks of the V): it is
    # the slowest stage, and the last rank holds no more than the middle ones
    times = [st.micro_batch_time for st in e.stages]
    assert times[0] == max(times) and times[-1] == pytest.approx(times[1], rel=1e-12)
    # the timeline of PyTorch's order: with rank 0 the slowest its slack absorbs part of the
    # others' bubble, which the estimate's sum of shares counts whole (2.1% here, m = 16)
    timeline = step_timeline(MODEL, SYSTEM, TRAINING, ZBV)
    assert e.step_time * 0.97 <= timeline.end <= e.step_time


def test_rules() -> None:
    with pytest.raises(ValueError, match="set v=2"):
        Strategy(dp=32, tp=8, pp=4, schedule=Schedule.ZBV)
    with pytest.raises(ValueError, match="zbv needs pp >= 2"):
        simcore.check(MODEL, SYSTEM, TRAINING, replace(ZBV, dp=128, pp=1))
    # 512 / (32 x 8) = 2 micro-batches < 2 x 4 - 1
    with pytest.raises(ValueError, match="at least 2\\*pp-1=7 micro-batches"):
        simcore.check(MODEL, SYSTEM, TRAINING, replace(ZBV, micro_batch=8))
    with pytest.raises(ValueError, match="equal chunks only"):
        simcore.check(MODEL, SYSTEM, TRAINING, replace(ZBV, first_stage_layers=18,
                                                       last_stage_layers=18))


def test_frameworks() -> None:
    assert why_not("torchtitan", MODEL, TRAINING, ZBV) is None
    assert "Megatron-LM has no zero-bubble" in why_not("megatron", MODEL, TRAINING, ZBV)
    assert "only 1f1b" in why_not("deepspeed", MODEL, TRAINING, ZBV)


def test_torchtitan_export_names_the_schedule() -> None:
    model, system = CATALOG.model("llama3-8b"), CATALOG.system("dgx-h100-64")
    training = TrainingSpec(global_batch=256, seq_len=8192)
    s = Strategy(dp=8, tp=2, pp=4, schedule=Schedule.ZBV, v=2, zero=ZeroStage.PARAMETERS,
                 recompute=Recompute.FULL)
    files = export_files(make_plan(model, system, training, s, Convention.MEGATRON), "torchtitan")
    text = "\n".join(files.values())
    assert 'pipeline_parallel_schedule = "ZBVZeroBubble"' in text
    # 32 layers over 2 x 4 virtual stages
    assert "pipeline_parallel_layers_per_stage = 4" in text
    with pytest.raises(ValueError, match="zero-bubble"):
        export_files(make_plan(model, system, training, s, Convention.MEGATRON), "megatron")


def test_space_batched_and_bounds() -> None:
    space = StrategySpace(model=MODEL, system=SYSTEM, training=TRAINING,
                          convention=Convention.MEGATRON, tp=(8,), pp=(1, 2, 4, 8),
                          micro_batch=(1, 2), zero=(ZeroStage.OPTIMIZER,),
                          recompute=(Recompute.SELECTIVE,),
                          schedule=(Schedule.ONE_F_ONE_B, Schedule.ZBV))
    valid = space.valid
    zbv = [s for s in valid if s.schedule is Schedule.ZBV]
    # m = 512 / (dp x mb) >= 2 pp - 1: pp 2 and 4 at either micro-batch; pp 8 (dp 16): m = 32
    # and 16, both >= 15
    assert sorted((s.pp, s.micro_batch) for s in zbv) == [(2, 1), (2, 2), (4, 1), (4, 2),
                                                          (8, 1), (8, 2)]
    assert all(s.v == 2 for s in zbv)
    assert set(valid) == {s for s in space.candidates() if space.reason_invalid(s) is None}
    batch = estimate_many(MODEL, SYSTEM, TRAINING, valid)
    for i, s in enumerate(valid):
        e = simcore.estimate(MODEL, SYSTEM, TRAINING, s)
        assert batch.step_time[i] == e.step_time and batch.peak_memory[i] == e.memory.total
    assert "zbv" in SCHEDULE_CODES
    flat = space.valid_indices()
    bounds = lower_bounds(MODEL, SYSTEM, TRAINING, space.columns_at(flat))
    for i, s in enumerate(space.strategies_at(flat)):
        e = simcore.estimate(MODEL, SYSTEM, TRAINING, s)
        assert bounds.step_time_s[i] <= e.step_time and bounds.memory_bytes[i] <= e.memory.total


def test_runs_csv_takes_v_2_for_zbv(tmp_path) -> None:
    path = tmp_path / "runs.csv"
    path.write_text("model,system,global_batch,seq_len,dp,tp,pp,micro_batch,schedule,step_time_s\n"
                    "llama3-70b,dgx-h100-1024,512,8192,32,8,4,1,zbv,10\n")
    (row,), skipped = read_runs(path, CATALOG)
    assert not skipped and row.strategy.schedule is Schedule.ZBV and row.strategy.v == 2


def test_the_backwards_exchanges_are_in_its_b_not_its_f() -> None:
    # Llama 3 70B on 256 H100s, dp 8 x pp 8 x cp 4, FSDP, zbv: the backward's exposed FSDP and
    # context-parallel exchanges and the LM head's backward were counted in F (its share of
    # the stage's time less the backward's compute, recompute and tp), and a recompute, which
    # hides more of the FSDP traffic, shrank F and the bubble: full recompute was estimated 3%
    # faster than none (9.281 against 9.563 s) where the step's own timeline has none 3%
    # faster. Split as stage_phases splits them, the order is the timeline's.
    model, system = CATALOG.model("llama3-70b"), CATALOG.system("dgx-h100-256")
    training = TrainingSpec(global_batch=256, seq_len=4096)
    times, timed = [], []
    for recompute in (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL):
        plan = Strategy(dp=8, pp=8, sp=4, zero=ZeroStage.PARAMETERS, micro_batch=2,
                        schedule=Schedule.ZBV, v=2, recompute=recompute)
        times.append(simcore.estimate(model, system, training, plan).step_time)
        timed.append(step_timeline(model, system, training, plan).end)
        assert estimate_many(model, system, training, [plan]).step_time[0] == times[-1]
    assert times == sorted(times) and timed == sorted(timed)
