"""Zero-bubble ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv:2401.10241,
section 3.1): the backward split into B (input gradients) and W (weight gradients, the layer's
wgrad GEMMs); the bubble is ``(p-1)(T_F + T_B - T_W)`` against 1F1B's
``(p-1)(T_F + T_B + T_W)``, and the peak activation memory is 1F1B's.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import simcore
from planner.catalog import load_catalog
from search_spaces.frameworks import why_not
from search_spaces.space import StrategySpace
from simcore.megatron.batched import estimate_many
from simcore.megatron.pipeline import in_flight, pipeline_time
from simcore.megatron.plan import StepPlan
from simcore.specs import Convention, Recompute, Schedule, Strategy, TrainingSpec, ZeroStage
from simcore.timeline import schedule_pipeline, stage_order, step_timeline

CATALOG = load_catalog()
MODEL = CATALOG.model("llama3-70b")
SYSTEM = CATALOG.system("dgx-h100-1024")
TRAINING = TrainingSpec(global_batch=512, seq_len=8192)
ONE_F_ONE_B = Strategy(dp=32, tp=8, pp=4, recompute=Recompute.SELECTIVE,
                       zero=ZeroStage.OPTIMIZER)
ZB = replace(ONE_F_ONE_B, schedule=Schedule.ZB_H1)


def test_pipeline_time_is_the_papers_closed_form() -> None:
    t_f, t_b, t_w, p, m = 1.0, 1.2, 0.9, 8, 32
    t = t_f + t_b + t_w
    zb, _ = pipeline_time([t] * p, m, 1, [t_w] * p)
    assert zb == pytest.approx(m * t + (p - 1) * (t_f + t_b - t_w), rel=1e-12)
    one_f_one_b, _ = pipeline_time([t] * p, m, 1)
    assert one_f_one_b == pytest.approx(m * t + (p - 1) * (t_f + t_b + t_w), rel=1e-12)
    # the bubble shrinks by 2 (p - 1) T_W
    assert one_f_one_b - zb == pytest.approx(2 * (p - 1) * t_w, rel=1e-12)


@pytest.mark.parametrize(("t_f", "t_b", "t_w", "p"),
                         [(1.0, 1.0, 1.0, 8), (1.0, 1.2, 0.7, 4), (1.0, 1.1, 0.5, 16)])
def test_fewer_micro_batches_than_stages(t_f, t_b, t_w, p) -> None:
    # Qi et al. appendix H: with m <= p "a ZB iteration takes (m + p - 1)(T_F + T_B) + T_W"
    # (fewer W passes are left to fill the drain); the schedule's timeline ends there too. The
    # m >= p closed form would have it (p - m) T_W shorter, 41% too fast at m 1, p 8.
    t = t_f + t_b + t_w
    for m in range(1, p + 1):
        appendix_h = (m + p - 1) * (t_f + t_b) + t_w
        zb, _ = pipeline_time([t] * p, m, 1, [t_w] * p)
        assert zb == pytest.approx(appendix_h, rel=1e-12), m
        ops = schedule_pipeline(Schedule.ZB_H1, np.full((p, 1), t_f), np.full((p, 1), t_b + t_w),
                                m, np.full((p, 1), t_w))
        assert ops.makespan == pytest.approx(appendix_h, rel=1e-12), m


def test_in_flight_memory_is_1f1b() -> None:
    for stage in range(4):
        assert in_flight(Schedule.ZB_H1, stage, 4, 16, 1) == in_flight(
            Schedule.ONE_F_ONE_B, stage, 4, 16, 1)
    zb = simcore.estimate(MODEL, SYSTEM, TRAINING, ZB)
    base = simcore.estimate(MODEL, SYSTEM, TRAINING, ONE_F_ONE_B)
    assert zb.memory == base.memory and zb.stages[0].in_flight == base.stages[0].in_flight


def test_estimate_bubble_uses_the_layers_wgrad_gemms() -> None:
    # without tp (nothing for the wgrad GEMMs to hide) both schedules' stages are alike
    system = CATALOG.system("dgx-h100-256")
    one_f_one_b = replace(ONE_F_ONE_B, dp=64, tp=1)
    zb = simcore.estimate(MODEL, system, TRAINING, replace(one_f_one_b, schedule=Schedule.ZB_H1))
    base = simcore.estimate(MODEL, system, TRAINING, one_f_one_b)
    p = StepPlan(MODEL, system, TRAINING, replace(one_f_one_b, schedule=Schedule.ZB_H1))
    layers = MODEL.layers // ZB.pp
    # three of the four stages add their drain less 2 T_W each; the slowest (last: LM head)
    # paces the steady state, so the W saved is that of the three others (20 layers each)
    assert zb.stages[-1].micro_batch_time == max(st.micro_batch_time for st in zb.stages)
    saved = 2 * 3 * layers * p.kernels.wgrad
    assert base.time.bubble - zb.time.bubble == pytest.approx(saved, rel=1e-9)
    assert zb.step_time < base.step_time


def test_b_pass_waits_for_the_backward_tp_collectives() -> None:
    # 1F1B hides the backward's tp collectives behind the wgrad GEMMs (exposed: what they
    # outlast them by, plus the overlap slowdown); ZB-H1 defers those GEMMs to W, so each
    # layer's B pass exposes the whole collective time: 2 all-reduce pairs per layer.
    from simcore.megatron.calls import tp_pair_calls
    from simcore.megatron.layer_step import dense_layer

    classic = replace(TRAINING, transformer_engine=False)
    p_zb, p_base = StepPlan(MODEL, SYSTEM, classic, ZB), StepPlan(MODEL, SYSTEM, classic,
                                                                 ONE_F_ONE_B)
    tp = 2 * p_zb.comm.total(tp_pair_calls(p_zb))
    wgrad = p_base.kernels.wgrad
    slowdown = SYSTEM.device.overlap_slowdown
    assert dense_layer(p_zb).tp_bwd == pytest.approx(tp, rel=1e-12)
    assert dense_layer(p_base).tp_bwd == pytest.approx(
        max(0.0, tp - wgrad) + slowdown * min(tp, wgrad), rel=1e-12)
    # with Transformer Engine's tp overlap the B pass still has its input-gradient GEMMs to
    # hide them behind, 1F1B both those and the weight gradients
    te = replace(TRAINING, transformer_engine=True)
    p_zb, p_base = StepPlan(MODEL, SYSTEM, te, ZB), StepPlan(MODEL, SYSTEM, te, ONE_F_ONE_B)
    dgrad = p_zb.kernels.gemm_dgrad
    assert dense_layer(p_zb).tp_bwd == pytest.approx(
        max(0.0, tp - dgrad) + slowdown * min(tp, dgrad), rel=1e-12)
    both = dgrad + wgrad
    assert dense_layer(p_base).tp_bwd == pytest.approx(
        max(0.0, tp - both) + slowdown * min(tp, both), rel=1e-12)


def test_zb_h1_needs_a_pipeline() -> None:
    with pytest.raises(ValueError, match="zb-h1 needs pp >= 2"):
        simcore.check(MODEL, SYSTEM, TRAINING, replace(ZB, dp=128, pp=1))


def test_frameworks_refuse_zb_h1() -> None:
    assert "Megatron-LM has no zero-bubble" in why_not("megatron", MODEL, TRAINING, ZB)
    assert "2+ stages per rank" in why_not("torchtitan", MODEL, TRAINING, ZB)
    assert "only 1f1b" in why_not("deepspeed", MODEL, TRAINING, ZB)
    assert why_not("any", MODEL, TRAINING, ZB) is None


def test_space_and_batched_estimate() -> None:
    space = StrategySpace(model=MODEL, system=SYSTEM, training=TRAINING,
                          convention=Convention.MEGATRON, tp=(8,), pp=(1, 2, 4),
                          zero=(ZeroStage.OPTIMIZER,), recompute=(Recompute.SELECTIVE,),
                          schedule=(Schedule.ONE_F_ONE_B, Schedule.ZB_H1))
    valid = space.valid
    assert {(s.pp, s.schedule) for s in valid} == {
        (1, Schedule.ONE_F_ONE_B), (2, Schedule.ONE_F_ONE_B), (4, Schedule.ONE_F_ONE_B),
        (2, Schedule.ZB_H1), (4, Schedule.ZB_H1)}
    assert set(valid) == {s for s in space.candidates() if space.reason_invalid(s) is None}
    assert not StrategySpace(model=MODEL, system=SYSTEM, training=TRAINING,
                             convention=Convention.MEGATRON, tp=(8,), pp=(4,),
                             schedule=(Schedule.ZB_H1,), framework="megatron").valid
    batch = estimate_many(MODEL, SYSTEM, TRAINING, valid)
    for i, s in enumerate(valid):
        e = simcore.estimate(MODEL, SYSTEM, TRAINING, s)
        assert batch.step_time[i] == e.step_time and batch.time.bubble[i] == e.time.bubble
    # fewer micro-batches than stages (512 / (64 x 8) = 1 < pp 2; 512 / (32 x 8) = 2 < pp 4),
    # where fewer W passes fill the drain
    few = [replace(ZB, dp=64, pp=2, micro_batch=8), replace(ZB, dp=32, micro_batch=8)]
    batch = estimate_many(MODEL, SYSTEM, TRAINING, few)
    for i, s in enumerate(few):
        e = simcore.estimate(MODEL, SYSTEM, TRAINING, s)
        assert batch.step_time[i] == e.step_time and batch.time.bubble[i] == e.time.bubble


# -- the timeline: ZB-H1's order, run by the discrete-event schedule --------------------------
def _in_flight_peak(order) -> int:
    """Micro-batches a stage holds at most: forwards run minus W passes run (a micro-batch's
    activations are needed until its weight gradients are done)."""
    held = np.cumsum(np.where(order.kind == 0, 1, 0) - np.where(order.kind == 2, 1, 0))
    return int(held.max())


@pytest.mark.parametrize(("t_f", "t_b", "t_w", "p", "m"),
                         [(1.0, 1.2, 0.9, 4, 8), (1.0, 2.0, 1.0, 8, 32), (1.0, 1.0, 0.5, 4, 16)])
def test_timeline_ends_at_the_papers_closed_form(t_f, t_b, t_w, p, m) -> None:
    # Qi et al. section 3.1: m (T_F + T_B + T_W) + (p - 1)(T_F + T_B - T_W) with m >= p
    ops = schedule_pipeline(Schedule.ZB_H1, np.full((p, 1), t_f), np.full((p, 1), t_b + t_w),
                            m, np.full((p, 1), t_w))
    assert ops.makespan == pytest.approx(m * (t_f + t_b + t_w) + (p - 1) * (t_f + t_b - t_w),
                                         rel=1e-12)
    one_f_one_b = schedule_pipeline(Schedule.ONE_F_ONE_B, np.full((p, 1), t_f),
                                    np.full((p, 1), t_b + t_w), m)
    assert one_f_one_b.makespan - ops.makespan == pytest.approx(2 * (p - 1) * t_w, rel=1e-12)


def test_every_stage_holds_at_most_1f1bs_peak_of_p_micro_batches() -> None:
    p, m = 8, 32
    for i in range(p):
        order = stage_order(Schedule.ZB_H1, i, p, m)
        assert sorted(order.micro_batch[order.kind == 2]) == list(range(m))  # every W once
        assert _in_flight_peak(order) <= p
        # each W after its own B
        b_at = {int(k): j for j, k in enumerate(order.micro_batch) if order.kind[j] == 1}
        assert all(j > b_at[int(k)] for j, k in enumerate(order.micro_batch)
                   if order.kind[j] == 2)
    assert _in_flight_peak(stage_order(Schedule.ZB_H1, 0, p, m)) == p  # stage 0, as 1F1B


def test_step_timeline_draws_the_w_passes_and_tracks_the_estimate() -> None:
    zb = step_timeline(MODEL, SYSTEM, TRAINING, ZB)
    base = step_timeline(MODEL, SYSTEM, TRAINING, ONE_F_ONE_B)
    m = TRAINING.global_batch // (ZB.dp * ZB.micro_batch)
    w = np.array(zb.phase_names) == "weight grad"
    assert w.sum() == m * ZB.pp
    p = StepPlan(MODEL, SYSTEM, TRAINING, ZB)
    layers = MODEL.layers // ZB.pp
    assert zb.duration[w & (zb.stage == 0)] == pytest.approx(layers * p.kernels.wgrad, rel=1e-9)
    assert zb.end < base.end
    # the stages differ (embedding, LM head), so the schedule may end a little before the
    # estimate's closed form, never after it
    estimate = simcore.estimate(MODEL, SYSTEM, TRAINING, ZB).step_time
    assert estimate * 0.99 <= zb.end <= estimate * (1 + 1e-12)
