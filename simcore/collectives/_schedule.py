"""How ASTRA-sim's system layer turns one collective into chunks and phases, and schedules them.

- Chunking (``Sys::determine_chunk_size``): ``chunk = trunc(S / splits)``; except for all-gather,
  a chunk smaller than the system's NPU count is raised to it and ``S`` becomes
  ``splits * chunk``. There are ``ceil(S / chunk)`` chunks, all simulated at full size.
- Phases (``Sys::generate_collective``): one per active dimension (size > 1), ascending, all-
  gather descending; the data size chains through each phase's output. A ``localBWAware``
  all-reduce on several dimensions is reduce-scatter up to the last active dimension, an
  all-reduce there, and all-gather back down; ``baseline`` is an all-reduce on each in turn.
- Scheduling: one queue per dimension, at most ``active_chunks_per_dim`` chunks running in each,
  served FIFO (all chunks of one collective share one priority, so LIFO/FIFO does not matter
  within a collective). A localBWAware all-reduce's reduce-scatter and all-gather on the same
  dimension share that dimension's queue. The chunks are identical, so every queue pattern
  simcore builds is timed without an event list (:func:`scheduler`); the event list
  (:func:`_event_schedule`) is the reference, and the fallback for a tie the fast path cannot
  order.
"""

# `x if x > y else y`, not max(): several times faster in the per-job loops below
# ruff: noqa: FURB136

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from heapq import heappop, heappush

from simcore.network import Collective, MultiDimOptimization

from ._base import BaseCollective, Link
from ._schedule_levels import _flow_stage, _up_down


@dataclass(frozen=True, slots=True)
class PhasePlan:
    """One phase of every chunk: an algorithm running ``op`` on a network dimension."""

    dim: int | None
    """Network dimension (its queue); 0 for the one-ring algorithms over all NPUs, None for a
    sub-group's ring, which spans dimensions."""
    op: Collective
    algorithm: BaseCollective
    link: Link | None
    npus: int


def chunking(op: Collective, size_bytes: int, splits: int, system_npus: int) -> tuple[int, int]:
    """``(chunk_bytes, chunks)`` as ASTRA-sim splits a collective of ``size_bytes`` per NPU."""
    chunk = size_bytes // splits
    if op is not Collective.ALL_GATHER and chunk < system_npus:
        chunk = system_npus
        size_bytes = splits * chunk
    if chunk == 0:
        raise ValueError(
            f"a {size_bytes}-byte all-gather split {splits} ways gives empty chunks; use at least"
            f" {splits} bytes"
        )
    return chunk, -(-size_bytes // chunk)


def phase_ops(op: Collective, active_dims: list[int], optimization: MultiDimOptimization
              ) -> list[tuple[int, Collective]]:
    """``(dim, op)`` of each phase, in order, over the active dimensions."""
    if op is not Collective.ALL_REDUCE or optimization is MultiDimOptimization.BASELINE:
        order = active_dims[::-1] if op is Collective.ALL_GATHER else active_dims
        return [(d, op) for d in order]
    *lower, last = active_dims
    return (
        [(d, Collective.REDUCE_SCATTER) for d in lower]
        + [(last, Collective.ALL_REDUCE)]
        + [(d, Collective.ALL_GATHER) for d in reversed(lower)]
    )


Scheduler = Callable[[int, Sequence[int], int], int]
"""``(chunks, durations, active) -> finish ns`` of the last chunk, for one queue pattern."""


def schedule_chunks(chunks: int, durations: Sequence[int], queues: Sequence[int],
                    active: int) -> int:
    """Finish time of the last of ``chunks`` identical chunks, each running the phases
    ``durations`` in order, phase ``p`` holding one of ``active`` slots of queue ``queues[p]``.
    """
    return scheduler(queues)(chunks, durations, active)


def scheduler(queues: Sequence[int]) -> Scheduler:
    """The schedule for phases on ``queues`` (it depends on the pattern only, so a compiled
    plan keeps it).

    One phase: ``ceil(chunks / active) * T``. Every phase on its own queue: the flow shop
    ``F_p(c) = max(F_{p-1}(c), F_p(c - active)) + T_p``. Up the queues and back down them (a
    localBWAware all-reduce): each queue served in merged arrival order (:func:`_up_down`),
    or, where that cannot tell the order of a tie, the event list (:func:`_event_schedule`),
    which also takes any other pattern.
    """
    queues = list(queues)
    if len(queues) == 1:
        return _one_phase
    if len(set(queues)) == len(queues):
        return _flow_shop

    def events(chunks: int, durations: Sequence[int], active: int) -> int:
        return _event_schedule(chunks, durations, queues, active)

    if not _is_up_then_down(queues):
        return events

    def up_then_down(chunks: int, durations: Sequence[int], active: int) -> int:
        fast = _up_down(chunks, durations, active)
        return fast if fast is not None else events(chunks, durations, active)

    return up_then_down


def _one_phase(chunks: int, durations: Sequence[int], active: int) -> int:
    return waves(chunks, active) * durations[0]


def _flow_shop(chunks: int, durations: Sequence[int], active: int) -> int:
    finish = [0] * chunks
    for t in durations:
        _flow_stage(finish, t, active)
    return finish[-1]


def _is_up_then_down(queues: Sequence[int]) -> bool:
    """Queues ``q_0 .. q_(L-1)`` (distinct), then back down ``q_(L-2) .. q_0``."""
    n = len(queues)
    turn = n // 2
    return (n % 2 == 1 and n >= 3 and list(queues[:turn]) == list(queues[:turn:-1])
            and len(set(queues[: turn + 1])) == turn + 1)


def _up_then_down_schedule(chunks: int, durations: Sequence[int], queues: Sequence[int],
                           active: int) -> int | None:
    """The localBWAware all-reduce, exact without an event list (one step per chunk and
    phase); None where the event list must decide (see :func:`_up_down`) or the queues are not
    up and back down."""
    if not _is_up_then_down(queues):
        return None
    return _up_down(chunks, durations, active)


def _event_schedule(chunks: int, durations: Sequence[int], queues: list[int],
                    active: int) -> int:
    """Event list over the chunks' phase ends; each queue a FIFO line with ``active`` slots.

    A phase end frees its slot, sends the chunk on to the next phase's queue, refills the old
    queue, then serves the new one, all in the same tick (``Sys::proceed_to_next_vnet_baseline``).
    Events of one tick are handled in the order they were created. A job is
    ``chunk * phases + phase``.
    """
    n_phases = len(durations)
    last = n_phases - 1
    n_queues = max(queues) + 1
    lines: list[list[int]] = [[] for _ in range(n_queues)]
    heads = [0] * n_queues
    free = [active] * n_queues
    events: list[tuple[int, int, int]] = []
    push, pop = heappush, heappop
    seq = 0
    started = min(active, chunks)
    for c in range(started):
        push(events, (durations[0], c, c * n_phases))
    seq = started
    q0 = queues[0]
    free[q0] -= started
    lines[q0] = [c * n_phases for c in range(started, chunks)]
    t = 0
    while events:
        t, _, job = pop(events)
        phase = job % n_phases
        q = queues[phase]
        line = lines[q]
        if heads[q] < len(line):  # the freed slot goes to the next waiting job at once
            nxt = line[heads[q]]
            heads[q] += 1
            push(events, (t + durations[nxt % n_phases], seq, nxt))
            seq += 1
        else:
            free[q] += 1
        if phase == last:
            continue
        nq = queues[phase + 1]
        if free[nq] and heads[nq] == len(lines[nq]):
            free[nq] -= 1
            push(events, (t + durations[phase + 1], seq, job + 1))
            seq += 1
        else:
            lines[nq].append(job + 1)
    return t


def waves(chunks: int, active: int) -> int:
    return math.ceil(chunks / active)


