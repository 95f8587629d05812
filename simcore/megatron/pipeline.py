"""Pipeline schedules: activations in flight per stage, and the time of one step.

Narayanan et al. 2021 (arXiv:2104.04473) section 2.2: GPipe keeps all m micro-batches in
flight, 1F1B (PipeDream-Flush) at most p, and both have a bubble of (p-1) micro-batch times;
interleaving v model chunks per device divides the bubble by v. Megatron-LM's interleaved
schedule warms up ``2 (p - i - 1) + (v - 1) p`` chunks on stage i
(``megatron/core/pipeline_parallel/schedules.py``), which gives Korthikanti et al.'s memory factor
``1 + (p-1)/(p v)`` on the first stage (arXiv:2205.05198 section 4.2.3).

Zero bubble ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv:2401.10241,
section 3.1, Figure 3): the backward splits into B (input gradients, on the critical path to the
previous stage) and W (weight gradients, deferred); the drain is filled by the W passes, so the
bubble falls from 1F1B's ``(p-1)(T_F + T_B + T_W)`` to ``(p-1)(T_F + T_B - T_W)`` with the same
peak activation memory as 1F1B (p micro-batches in flight on the first stage). With fewer
micro-batches than stages (m < p) fewer W passes are left to fill the drain: the step is
``(m + p - 1)(T_F + T_B) + T_W`` (Qi et al. appendix H), which the schedule's timeline
(:func:`simcore.timeline.schedule_pipeline`) reproduces.

Zero-bubble V (``zbv``, Qi et al. section 6) as PyTorch runs it (``ScheduleZBVZeroBubble.
_calculate_single_rank_operations`` in ``torch/distributed/pipelining/schedules.py``, the class
torchtitan's ``ZBVZeroBubble`` names): rank r holds chunks r and 2p-1-r; it warms up with
2(p-r)-1 forwards of chunk 0, then r pairs (F1, F0), then p-r triples (F1, B1, W1); steady
(F0, B0, W0, F1, B1, W1); cools down with r pairs (B0, B1), p-r pairs (B0, W0), then the
remaining W passes. Before its first B a rank has run 2p chunk forwards, so every rank holds
p micro-batches of its layers at the peak, 1F1B's first stage. With f, b, w the per-chunk
times of F, B and W on every rank and m >= 2p - 1 (the count PyTorch pads its order to) the
schedule ends ``2 m (f + b + w)`` plus a bubble that does not depend on m:
``alpha + (p - 2) beta`` with ``alpha = max(b, f, 2b - 2w, 2f - b - w, 2f - 3w, f + b - 2w)``
and ``beta = max(b, w, 2f - b, 2b - 2w, 2f - 2w)`` (:func:`zbv_bubble`); with f = b = w it is
``(p - 1) f``: only the last rank's wait for the first forward, half ZB-H1's. The form is the
maximum of the schedule's critical paths, read off and checked against the discrete-event
schedule of that order (:func:`simcore.timeline.schedule_pipeline`; ``tests/test_zbv.py``
checks it there for p = 2..8, m = 2p - 1..4p and random f, b, w). The paper's own ZB-V (which
also skips the optimizer's synchronisation) reaches zero bubble at f = b = w; PyTorch's does
not.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

from simcore.specs import Schedule

__all__ = ["head_stage", "in_flight", "pipeline_time", "wgrad_fill", "zbv_bubble", "zbv_time"]

_F = TypeVar("_F", float, np.ndarray)


def head_stage(schedule: Schedule, pp: int) -> int:
    """The pipeline rank that holds the LM head: the last, or with zbv's V the first (it holds
    the last chunk)."""
    return 0 if schedule is Schedule.ZBV else pp - 1


def in_flight(schedule: Schedule, stage: int, pp: int, m: int, v: int) -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak, in units of the
    stage's whole set of layers (an interleaved chunk counts 1/v)."""
    if schedule is Schedule.GPIPE:
        return float(m)
    if schedule in (Schedule.ONE_F_ONE_B, Schedule.ZB_H1):
        return float(min(pp - stage, m))
    if schedule is Schedule.ZBV:  # 2p chunk forwards of half the stage each, on every rank
        return float(min(pp, m))
    chunks = 2 * (pp - stage - 1) + (v - 1) * pp + 1
    return min(chunks, m * v) / v


def pipeline_time(stage_times: list[float], m: int, v: int,
                  wgrad_times: list[float] | None = None) -> tuple[float, int]:
    """Seconds for m micro-batches through stages with the given per-micro-batch times, and the
    slowest stage.

    The slowest stage runs all m micro-batches back to back; the others add the fill and drain
    once, divided by v when interleaved: ``m * max + (sum - max) / v``. With equal stages this is
    ``(m + (p - 1) / v) * t``, Narayanan's bubble. ``wgrad_times`` (ZB-H1): each other stage's
    share is its ``t - 2 T_W`` when m >= p, so equal stages of ``t = T_F + T_B + T_W`` give
    ``m t + (p - 1)(T_F + T_B - T_W)``, Qi et al.'s ZB-H1 bubble; with m < p only
    ``t - (1 + (m - 1) / (p - 1)) T_W``, which gives ``(m + p - 1)(T_F + T_B) + T_W``.
    """
    slowest = max(range(len(stage_times)), key=stage_times.__getitem__)
    t_max = stage_times[slowest]
    fill = sum(stage_times) - t_max
    if wgrad_times is not None:
        fill -= wgrad_fill(m, len(stage_times)) * (sum(wgrad_times) - wgrad_times[slowest])
    return m * t_max + fill / v, slowest


def wgrad_fill(m: int, pp: int) -> float:
    """ZB-H1: how many W passes' worth of each other stage's share the drain absorbs: 2 with at
    least as many micro-batches as stages, ``1 + (m - 1) / (p - 1)`` with fewer
    (:func:`pipeline_time`)."""
    return 1 + min(1, (m - 1) / (pp - 1)) if pp > 1 else 2


def zbv_bubble(pp: int, f: _F, b: _F, w: _F) -> _F:
    """The zbv schedule's bubble for per-chunk F, B and W times f, b, w on every rank (floats,
    or arrays element by element), m >= 2p - 1 (module docstring)."""
    largest = np.maximum.reduce if isinstance(f, np.ndarray) else max  # floats: no numpy call
    first = largest([b, f, 2 * b - 2 * w, 2 * f - b - w, 2 * f - 3 * w, f + b - 2 * w])
    step = largest([b, w, 2 * f - b, 2 * b - 2 * w, 2 * f - 2 * w])
    return first + (pp - 2) * step


def zbv_time(stage_times: list[float], backward_times: list[float], wgrad_times: list[float],
             m: int) -> tuple[float, int]:
    """Seconds for m micro-batches through zbv ranks of these per-micro-batch times (both
    chunks; ``backward_times`` B + W, ``wgrad_times`` W), and the slowest rank. As in
    :func:`pipeline_time` the slowest rank runs back to back and each other adds its share of
    the fill and drain: its :func:`zbv_bubble` over p - 1, so equal ranks give the bubble
    exactly. Rank 0 holds the embedding and the LM head; when that makes it the slowest, its
    slack absorbs part of the others' bubble, which this counts whole: the schedule of
    PyTorch's order ends 2.1% before it for Llama-3-70B at tp 8, pp 4, 16 micro-batches
    (``tests/test_zbv.py``)."""
    pp = len(stage_times)
    slowest = max(range(pp), key=stage_times.__getitem__)
    fill = 0.0
    for i, (t, bwd, w) in enumerate(zip(stage_times, backward_times, wgrad_times)):
        if i != slowest:
            fill += zbv_bubble(pp, (t - bwd) / 2, (bwd - w) / 2, w / 2) / (pp - 1)
    return m * stage_times[slowest] + fill, slowest
