"""The fast path of :func:`simcore.collectives._schedule.scheduler` for a localBWAware
all-reduce on several dimensions: its chunks' phases go up the dimensions' queues and back down
(reduce-scatter, all-reduce at the top, all-gather), each queue FIFO; timed job by job in
arrival order, without the event list (:func:`_up_down`)."""

# `x if x > y else y`, not max(): several times faster in the per-job loops below
# ruff: noqa: FURB136

from __future__ import annotations

import math
from collections.abc import Sequence
from heapq import heappop, heappush, heapreplace

__all__ = ["_flow_stage", "_up_down"]


def _flow_stage(times: list[int], duration: int, active: int) -> None:
    """In place: arrival times (in chunk order) -> finish times of a FIFO stage of ``active``
    slots and equal ``duration``; the slot chunk c takes is the one chunk c - active freed."""
    for c in range(len(times)):
        if c >= active and times[c - active] > times[c]:
            times[c] = times[c - active] + duration
        else:
            times[c] += duration


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
