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
from heapq import heappop, heappush, heapreplace

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


def _flow_stage(times: list[int], duration: int, active: int) -> None:
    """In place: arrival times (in chunk order) -> finish times of a FIFO stage of ``active``
    slots and equal ``duration``; the slot chunk c takes is the one chunk c - active freed."""
    for c in range(len(times)):
        if c >= active and times[c - active] > times[c]:
            times[c] = times[c - active] + duration
        else:
            times[c] += duration


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


def _up_down(chunks: int, durations: Sequence[int], active: int) -> int | None:
    """Phases up the queues of levels ``0 .. L-1`` and back down ``L-2 .. 0`` (level ``L-1``
    turns), each queue FIFO with ``active`` slots. A job arriving at a queue starts at
    ``max(arrival, earliest slot free)``, which only the jobs ahead of it decide; so each queue
    can be served job by job in arrival order, as long as that order is known:

    - level 0's way up is queued at t = 0: it runs in waves, ``(c // active + 1) * T_0``; its
      way down queues behind all of it (one FIFO stage on the slots the last wave leaves);
    - the turning level has its queue to itself: a flow stage;
    - a middle level merges two arrival streams, each in chunk order (same-kind jobs leave a
      FIFO queue in the order they came). The way-down arrival of a chunk depends on the higher
      levels, which depend on this level's way-up departures, so the merge asks the higher
      levels only as far as needed (:func:`_two_levels`, :func:`_three_levels`; deeper,
      :func:`_merged_levels` keeps every pending arrival in one heap);
    - two arrivals at one queue in the same tick: the event list handles one tick's events in
      the order it created them, and it creates a phase's end when the phase starts, so the
      arrival whose previous phase is the longer (started earlier) queues first. Where the two
      previous phases are equally long, the order goes back to older ties: None.

    None also for a phase of 0 ns (its end and the next phase's start share a tick).
    """
    n = len(durations)
    turn = n // 2
    if min(durations) < 1:
        return None
    up_first = []  # per middle level 1 .. turn-1: a way-up arrival goes before a way-down one
    for q in range(1, turn):
        up_source, down_source = durations[q - 1], durations[n - 2 - q]
        if up_source == down_source:
            return None
        up_first.append(up_source > down_source)
    a = active
    d0 = durations[0]
    level0 = [(c // a + 1) * d0 for c in range(chunks)]  # way-up departures from level 0
    busy0 = level0[-a:] if chunks >= a else [0] * (a - chunks) + level0  # sorted: a heap
    if turn == 1:
        turned = level0[:]
        _flow_stage(turned, durations[1], a)
        return _fifo_last(turned, busy0, durations[2])
    if turn == 2:
        return _two_levels(level0, busy0, durations, a, up_first[0])
    if turn == 3:
        return _three_levels(level0, busy0, durations, a, up_first[0], up_first[1])
    return _merged_levels(level0, busy0, durations, a, up_first)


def _fifo_last(arrivals: list[int], busy: list[int], duration: int) -> int:
    """Finish time of the last of jobs arriving at ``arrivals`` (sorted) at a FIFO queue whose
    slots free at the heap ``busy`` (updated)."""
    f = 0
    for t in arrivals:
        m = busy[0]
        f = (t if t > m else m) + duration
        heapreplace(busy, f)
    return f


def _two_levels(up: list[int], busy0: list[int], durations: Sequence[int], a: int,
                up_first: bool) -> int:
    """A 3-level up-and-down (phases RS0 RS1 AR2 AG1 AG0): the last chunk's finish.

    Level 1 merges its way-up arrivals ``up`` with its way-down arrivals, the turn's departures.
    Chunk j's way down is known once level 1 has sent chunk j up; before that it cannot be next.
    Level 1's way-down departures go on to level 0's queue (slots ``busy0``).
    """
    _, du, dt, dd, dl = durations
    chunks = len(up)
    busy = [0] * a
    turned = [0] * a  # turned[c + a]: chunk c's turn departure (its way-down arrival)
    f0 = 0
    i = j = 0  # next chunk up, next chunk down
    while j < chunks:
        if i < chunks and (j == i or up[i] < turned[j + a]
                           or (up_first and up[i] == turned[j + a])):
            t = up[i]
            m = busy[0]
            f = (t if t > m else m) + du
            heapreplace(busy, f)
            p = turned[i]  # the turn's slot is the one chunk i - a frees
            turned.append((p if p > f else f) + dt)
            i += 1
        else:
            t = turned[j + a]
            m = busy[0]
            f = (t if t > m else m) + dd
            heapreplace(busy, f)
            m = busy0[0]
            f0 = (f if f > m else m) + dl
            heapreplace(busy0, f0)
            j += 1
    return f0


def _three_levels(up: list[int], busy0: list[int], durations: Sequence[int], a: int,
                  up1_first: bool, up2_first: bool) -> int:
    """A 4-level up-and-down (RS0 RS1 RS2 AR3 AG2 AG1 AG0): the last chunk's finish.

    Level 1 merges its way-up arrivals ``up`` (all known) with its way-down arrivals, which are
    level 2's way-down departures. When the next of those is not known yet, level 2 is served
    as far as is safe: its way-up arrivals are level 1's way-up departures, and the next unknown
    one is at least ``bound`` = level 1's next way-up arrival + its phase. Level 2 stops when its
    next job can only be that unknown way up or a way down at or after ``bound``; if it has not
    sent the next chunk down to level 1 by then, that way down comes after level 1's next way up
    (``>= bound + T``), which goes first.
    """
    _, du1, du2, dt, dd2, dd1, dl = durations
    chunks = len(up)
    busy1 = [0] * a
    busy2 = [0] * a
    up2: list[int] = []  # level 1's way-up departures = level 2's way-up arrivals
    turned = [0] * a  # turned[c + a]: chunk c's turn departure = its way-down arrival at level 2
    down1: list[int] = []  # level 2's way-down departures = level 1's way-down arrivals
    f0 = 0
    # next way-up / way-down chunk of level 1 and of level 2;
    # len(up2) == i1, len(turned) == i2 + a, len(down1) == j2
    i1 = j1 = i2 = j2 = 0
    while j1 < chunks:
        if j1 == j2:  # level 1's next way down is not known: serve level 2 as far as is safe
            bound = up[i1] + du1 if i1 < chunks else math.inf
            while True:
                if i2 < i1:  # level 2's next way up is known
                    t = up2[i2]
                    if j2 < i2:
                        w = turned[j2 + a]
                        if w < t or (w == t and not up2_first):
                            m = busy2[0]
                            f = (w if w > m else m) + dd2
                            heapreplace(busy2, f)
                            down1.append(f)
                            j2 += 1
                            continue
                    m = busy2[0]
                    f = (t if t > m else m) + du2
                    heapreplace(busy2, f)
                    p = turned[i2]  # the turn's slot is the one chunk i2 - a frees
                    turned.append((p if p > f else f) + dt)
                    i2 += 1
                elif j2 < i2 and turned[j2 + a] < bound:
                    w = turned[j2 + a]
                    m = busy2[0]
                    f = (w if w > m else m) + dd2
                    heapreplace(busy2, f)
                    down1.append(f)
                    j2 += 1
                else:
                    break
        if i1 < chunks and (j1 == j2 or up[i1] < down1[j1]
                            or (up1_first and up[i1] == down1[j1])):
            t = up[i1]
            m = busy1[0]
            f = (t if t > m else m) + du1
            heapreplace(busy1, f)
            up2.append(f)
            i1 += 1
        else:
            w = down1[j1]
            m = busy1[0]
            f = (w if w > m else m) + dd1
            heapreplace(busy1, f)
            m = busy0[0]
            f0 = (f if f > m else m) + dl
            heapreplace(busy0, f0)
            j1 += 1
    return f0


def _merged_levels(up: list[int], busy0: list[int], durations: Sequence[int], a: int,
                   up_first: list[bool]) -> int:
    """Any number of middle levels: every pending arrival in one heap, served in time order
    (then by level, then by the tie rule), each computing its start at once. The last chunk's
    finish."""
    n = len(durations)
    turn = n // 2
    dt = durations[turn]
    # job kind code = 2 * level + (0 if it goes first in a tie else 1)
    bits = [0] + [0 if f else 1 for f in up_first]  # way-up's tie bit per level
    kinds = 2 * turn
    dur = [0] * kinds
    nxt = [0] * kinds
    busy: list[list[int]] = [[] for _ in range(kinds)]
    for q in range(1, turn):
        cu, cd = 2 * q + bits[q], 2 * q + 1 - bits[q]
        busy[cu] = busy[cd] = [0] * a
        dur[cu], dur[cd] = durations[q], durations[n - 1 - q]
        nxt[cu] = 2 * (q + 1) + bits[q + 1] if q + 1 < turn else -1  # -1: to the turn
        nxt[cd] = 2 * q - 1 - bits[q - 1] if q > 1 else -2  # -2: to level 0
    shift = kinds.bit_length()
    mask = (1 << shift) - 1
    back = 2 * turn - 1 - bits[turn - 1]  # the way down at the level below the turn
    heap = [(t << shift) | (2 + bits[1]) for t in up]  # sorted: a heap
    turned: list[int] = []
    dl = durations[-1]
    f0 = 0
    while heap:
        key = heappop(heap)
        code = key & mask
        t = key >> shift
        slots = busy[code]
        m = slots[0]
        f = (t if t > m else m) + dur[code]
        heapreplace(slots, f)
        x = nxt[code]
        if x >= 0:
            heappush(heap, (f << shift) | x)
        elif x == -1:
            j = len(turned)
            if j >= a and turned[j - a] > f:
                f = turned[j - a]
            f += dt
            turned.append(f)
            heappush(heap, (f << shift) | back)
        else:  # on to level 0
            m = busy0[0]
            f0 = (f if f > m else m) + dl
            heapreplace(busy0, f0)
    return f0


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


