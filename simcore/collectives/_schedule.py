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
from dataclasses import dataclass

from simcore.network import Collective, MultiDimOptimization

from ._base import BaseCollective, Costs, Link


@dataclass(frozen=True, slots=True)
class PhasePlan:
    """One phase of one chunk: an algorithm running ``op`` on a network dimension."""

    dim: int
    """Network dimension (its queue); 0 for the one-ring algorithms over all NPUs."""
    op: Collective
    algorithm: BaseCollective
    link: Link
    npus: int
    data_bytes: int


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


def schedule_chunks(chunks: int, durations: list[int], queues: list[int], active: int) -> int:
    """Finish time of the last of ``chunks`` identical chunks, each running the phases
    ``durations`` in order, phase ``p`` holding one of ``active`` slots of queue ``queues[p]``.

    One phase: ``ceil(chunks / active) * T``. Every phase on its own queue: the flow shop
    ``F_p(c) = max(F_{p-1}(c), F_p(c - active)) + T_p``. Queues shared between phases (a
    localBWAware all-reduce comes back down through the dimensions it went up): a list schedule
    of the FIFO queues, O(chunks x phases) events.
    """
    if len(durations) == 1:
        return -(-chunks // active) * durations[0]
    if len(set(queues)) == len(queues):
        finish = [0] * chunks
        for t in durations:
            for c in range(chunks):
                prev = finish[c - active] if c >= active else 0
                finish[c] = max(finish[c], prev) + t
        return finish[-1]
    return _shared_queue_schedule(chunks, durations, queues, active)


def _shared_queue_schedule(chunks: int, durations: list[int], queues: list[int],
                           active: int) -> int:
    waiting: dict[int, list[tuple[int, int]]] = {q: [] for q in queues}
    heads = dict.fromkeys(queues, 0)
    running = dict.fromkeys(queues, 0)
    events: list[tuple[int, int, int, int]] = []
    seq = 0
    last = len(durations) - 1

    def serve(q: int, now: int) -> None:
        nonlocal seq
        line = waiting[q]
        while running[q] < active and heads[q] < len(line):
            c, p = line[heads[q]]
            heads[q] += 1
            running[q] += 1
            heapq.heappush(events, (now + durations[p], seq, c, p))
            seq += 1

    q0 = queues[0]
    for c in range(chunks):
        waiting[q0].append((c, 0))
        serve(q0, 0)
    finish = 0
    while events:
        t, _, c, p = heapq.heappop(events)
        q = queues[p]
        running[q] -= 1
        if p < last:
            nq = queues[p + 1]
            waiting[nq].append((c, p + 1))
            serve(q, t)
            serve(nq, t)
        else:
            finish = t
            serve(q, t)
    return finish


def waves(chunks: int, active: int) -> int:
    return math.ceil(chunks / active)


def phase_durations(plans: list[PhasePlan], costs: Costs) -> list[int]:
    return [p.algorithm.phase_ns(p.op, p.npus, p.data_bytes, p.link, costs) for p in plans]
