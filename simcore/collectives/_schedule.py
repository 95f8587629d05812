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
  dimension share that dimension's queue.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from simcore.network import Collective, MultiDimOptimization

from ._base import BaseCollective, Link


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


def schedule_chunks(chunks: int, durations: Sequence[int], queues: list[int], active: int) -> int:
    """Finish time of the last of ``chunks`` identical chunks, each running the phases
    ``durations`` in order, phase ``p`` holding one of ``active`` slots of queue ``queues[p]``.

    One phase: ``ceil(chunks / active) * T``. Every phase on its own queue: the flow shop
    ``F_p(c) = max(F_{p-1}(c), F_p(c - active)) + T_p``. Queues shared between phases (a
    localBWAware all-reduce comes back down through the dimensions it went up): a list schedule
    of the FIFO queues, O(chunks x phases) events.
    """
    if len(durations) == 1:
        return waves(chunks, active) * durations[0]
    if len(set(queues)) == len(queues):
        finish = [0] * chunks
        for t in durations:
            _flow_stage(finish, t, active)
        return finish[-1]
    if len(durations) == 3:  # two dimensions: every reduce-scatter precedes every all-gather
        fast = _up_then_down_schedule(chunks, durations, queues, active)
        if fast is not None:
            return fast
    return _event_schedule(chunks, durations, queues, active)


def _flow_stage(times: list[int], duration: int, active: int) -> None:
    """In place: arrival times (in chunk order) -> finish times of a FIFO stage of ``active``
    slots and equal ``duration``; the slot chunk c takes is the one chunk c - active freed."""
    for c in range(len(times)):
        if c >= active and times[c - active] > times[c]:
            times[c] = times[c - active] + duration
        else:
            times[c] += duration


def _up_then_down_schedule(chunks: int, durations: list[int], queues: list[int],
                           active: int) -> int | None:
    """The localBWAware all-reduce (up the queues, then back down the same ones) in
    O(chunks x phases), when every chunk's way up has reached a queue before any chunk comes
    back down to it: then each queue serves all its up-phases first, and a stage recurrence
    per phase is exact. Returns None when that does not hold (the event list then decides).
    """
    n = len(queues)
    turn = n // 2
    symmetric = queues[:turn] == queues[: turn : -1]
    if n % 2 == 0 or not symmetric or len(set(queues[: turn + 1])) != turn + 1:
        return None
    times = [0] * chunks
    arrivals_up: list[int] = []
    slots: list[list[int]] = []
    for p in range(turn):  # up: reduce-scatter phases, each queue serving only these so far
        arrivals_up.append(times[-1])
        busy: list[int] = []
        _fifo_stage(times, busy, durations[p], active)
        slots.append(busy)
    _flow_stage(times, durations[turn], active)  # the turning phase has its queue to itself
    for p in range(turn + 1, n):  # down: all-gather phases on the queues of the way up
        q = n - 1 - p
        if times[0] <= arrivals_up[q]:
            return None
        _fifo_stage(times, slots[q], durations[p], active)
    return times[-1]


def _fifo_stage(times: list[int], busy: list[int], duration: int, active: int) -> None:
    """In place: arrival times (in FIFO order) -> finish times on a queue of ``active`` slots
    whose jobs still running end at the times in the heap ``busy`` (updated)."""
    for c, start in enumerate(times):
        if len(busy) == active:
            start = max(start, heapq.heappop(busy))
        times[c] = start + duration
        heapq.heappush(busy, times[c])


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
    push, pop = heapq.heappush, heapq.heappop
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


