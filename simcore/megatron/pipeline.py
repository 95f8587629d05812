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
"""

from __future__ import annotations

from simcore.specs import Schedule

__all__ = ["in_flight", "pipeline_time", "wgrad_fill"]


def in_flight(schedule: Schedule, stage: int, pp: int, m: int, v: int) -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak, in units of the
    stage's whole set of layers (an interleaved chunk counts 1/v)."""
    if schedule is Schedule.GPIPE:
        return float(m)
    if schedule in (Schedule.ONE_F_ONE_B, Schedule.ZB_H1):
        return float(min(pp - stage, m))
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
