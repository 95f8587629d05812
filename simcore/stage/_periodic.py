"""The single-rank replay of a long repeated trace, skipping the blocks whose schedule repeats.

A long single-stage trace (:mod:`._fast`) is ``E1 | B0 | B1 .. B(n-2) | B(n-1) | E2 | W0 | W1 ..
W(n-2) | W(n-1)``: the *middle* blocks ``1 .. n-2`` (block nodes ``B``, weight updates ``W``) are
one pattern repeated: node for node the same kind, duration and dependency count, dependencies
at the same offsets, and (checked by ``_fast._geometry``) no end node depends on a node of
blocks ``2 .. n-3``, so the dependants of such a node repeat as well. ASTRA-sim's schedule moves
through the blocks (forward, backward, weight updates), and once it has settled every block is
scheduled like the previous one, one period later.

**The state.** Between two steps of the replay loop (a step: the earliest event ends, its
dependants are released, free resources take the lowest-id ready node) everything that decides
the rest of the run is each node's *code* (``> 0`` dependencies still running, ``0`` ready,
``-1`` running, ``-2`` done; the ready queues are the code-0 nodes), the running nodes with
their end ticks in (tick, sequence) order, and ``now``. Start/end ticks and the compute total
are outputs only.

**The shift.** ``σ`` moves a middle node one block in direction ``d`` (+1 or -1); ``τ`` moves a
whole state: block ``c`` of ``τ(A)`` gets the codes of block ``c - d`` of ``A`` (the block with
no source keeps its own), the ends keep theirs, running nodes move by ``σ`` and their ticks by
the period ``P``.

**Why a jump is exact.** Let checkpoint ``A2`` follow ``A1`` by ``N`` steps with ``A2 ==
τ(A1)`` (every code compared, :func:`_same_shifted`, and the running nodes), let ``T`` be the
nodes those steps touched (issued, finished, or a dependency finished: exactly the nodes whose
code changed), and let every node running at ``A1`` have finished by ``A2``. If ``T`` and
``σ(T)`` lie in blocks ``2 .. n-3``, the ``N`` steps from ``τ(A)`` for ``A = A1`` are the ``N``
steps from ``A`` moved by ``σ``, one by one: the earliest event maps to the earliest event; a finished node's
dependants map to its image's dependants (both in middle blocks) with equal codes; equal
durations; and the lowest-id ready node maps to the lowest-id ready node, because ``σ`` keeps
the id order of middle nodes and ends, and a ready node that ``τ`` adds (in the kept block) or
drops is never the lowest: in ``A`` it is higher than the pick, a node of ``T``, and (being in
block 1 or ``n-2``, or in the other segment) also higher than the pick's image. So ``A3 =
τ(A2)`` (whose period touches ``σ(T)``), and by induction ``τ^m(A2)`` is the state ``m``
periods on as long as ``σ^m(T)`` stays in ``2 .. n-3``. The replay continues from it; the skipped nodes are those issued and finished in
the observed period, moved by ``σ^k`` and ``k * P`` for ``k = 1 .. m``.

Nothing is assumed about the schedule: a jump happens only where the full comparison holds;
otherwise the replay runs on, and is then :func:`simcore.stage._replay._replay_single`'s loop.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Fill", "Geometry", "PeriodicRun", "filled_ticks", "replay_periodic"]

_COMP = 1
_RUNNING, _DONE = -1, -2


@dataclass(frozen=True, slots=True)
class Geometry:
    """Where the repeated middle blocks of a long trace are, and the checkpoints to compare."""

    n: int
    """Blocks of the model (middle blocks are ``1 .. n - 2``)."""
    b1: int
    lb: int
    """Index of block 1's first block node, and block nodes per block."""
    w1: int
    lw: int
    """Index of block 1's first weight-update node, and weight-update nodes per block."""
    block: list[int]
    """Node -> its middle block, or -1 for the ends."""
    step: list[int]
    """Node -> index distance to the same node of the next block (``lb``, ``lw``; 0 at ends)."""
    marker: list[int]
    """Node -> a checkpoint key (its position in the block pattern), or -1."""

    @property
    def b_end(self) -> int:
        return self.b1 + (self.n - 2) * self.lb

    @property
    def w_end(self) -> int:
        return self.w1 + (self.n - 2) * self.lw


@dataclass(frozen=True, slots=True)
class Fill:
    """A skipped stretch: ``m`` more periods of ``period`` ns like the observed one, each moving
    the observed nodes by their ``steps``."""

    issued: list[int]
    starts: list[int]
    finished: list[int]
    ends: list[int]
    issued_steps: list[int]
    finished_steps: list[int]
    m: int
    period: int


@dataclass(slots=True)
class PeriodicRun:
    """The replay's outputs: ticks of the nodes it ran, and the skipped stretches to fill in."""

    start: list[int]
    end: list[int]
    comp_total: int
    fills: list[Fill] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Checkpoint:
    block: int
    now: int
    comp_total: int
    code: list[int]
    events: list[tuple[int, int, int]]
    n_issued: int
    n_finished: int


def replay_periodic(kind: list[int], dur: list[int], children: list[list[int]],
                    pending: list[int], geo: Geometry) -> PeriodicRun:
    """:func:`simcore.stage._replay._replay_single`'s loop (same rules, same tie-breaks) on a
    trace laid out as ``geo`` says, jumping over periods proven to repeat (module docstring)."""
    heappush, heappop = heapq.heappush, heapq.heappop
    n = len(kind)
    code = list(pending)
    rc, rm = _ready(code, kind)
    start = [0] * n
    end = [-1] * n
    marker = geo.marker
    events: list[tuple[int, int, int]] = []  # (tick, seq, node index)
    issued: list[int] = []
    finished: list[int] = []
    seen: dict[int, _Checkpoint] = {}  # checkpoint key -> its latest checkpoint
    run = PeriodicRun(start, end, 0)
    seq = comp_total = now = 0
    comp_busy = comm_busy = False
    while True:
        mark = -1  # the node issued in this step that is a checkpoint, if any
        if rc and not comp_busy:
            i = heappop(rc)
            comp_busy = True
            d = dur[i]
            comp_total += d
            start[i] = now
            code[i] = _RUNNING
            issued.append(i)
            heappush(events, (now + d, seq, i))
            seq += 1
            if marker[i] >= 0:
                mark = i
        if rm and not comm_busy:
            i = heappop(rm)
            comm_busy = True
            start[i] = now
            code[i] = _RUNNING
            issued.append(i)
            heappush(events, (now + dur[i], seq, i))
            seq += 1
            if mark < 0 and marker[i] >= 0:
                mark = i
        if mark >= 0:
            point = _Checkpoint(geo.block[mark], now, comp_total, list(code), sorted(events),
                                len(issued), len(finished))
            last = seen.get(marker[mark])
            seen[marker[mark]] = point
            if last is not None and abs(point.block - last.block) == 1:
                fill = _jump(last, point, run, issued, finished, children, geo)
                if fill is not None:  # continue from τ^m(point)
                    run.fills.append(fill)
                    seen.clear()
                    d = point.block - last.block
                    now += fill.m * fill.period
                    comp_total += fill.m * (point.comp_total - last.comp_total)
                    events = _moved_events(point.events, d, fill.m, fill.period, geo)
                    _apply_shift(code, d, fill.m, geo)
                    rc, rm = _ready(code, kind)
        if not events:
            break
        now, _, i = heappop(events)
        end[i] = now
        code[i] = _DONE
        finished.append(i)
        if kind[i] == _COMP:
            comp_busy = False
        else:
            comm_busy = False
        for c in children[i]:
            p = code[c] - 1
            code[c] = p
            if p == 0:
                heappush(rc if kind[c] == _COMP else rm, c)
    run.comp_total = comp_total
    return run


def _ready(code: list[int], kind: list[int]) -> tuple[list[int], list[int]]:
    """The ready queues of a state: its code-0 nodes by resource, ascending (so heaps)."""
    rc: list[int] = []
    rm: list[int] = []
    i = -1
    try:
        while True:
            i = code.index(0, i + 1)
            (rc if kind[i] == _COMP else rm).append(i)
    except ValueError:
        return rc, rm


def _moved(x: int, d: int, geo: Geometry) -> int:
    """``σ`` in direction ``d``: the same node one block on, or -1 if that is not a middle
    block."""
    b = geo.block[x]
    if b < 1 or not 1 <= b + d <= geo.n - 2:
        return -1
    return x + d * geo.step[x]


def _jump(a: _Checkpoint, b: _Checkpoint, run: PeriodicRun, issued: list[int],
          finished: list[int], children: list[list[int]], geo: Geometry) -> Fill | None:
    """The skip the checkpoints ``a`` -> ``b`` (one block apart) prove, or ``None``."""
    d = b.block - a.block
    if len(a.events) != len(b.events):
        return None
    period = b.now - a.now
    for (ta, _, xa), (tb, _, xb) in zip(a.events, b.events):
        if tb - b.now != ta - a.now or _moved(xa, d, geo) != xb:
            return None
    done = finished[a.n_finished:b.n_finished]
    started = issued[a.n_issued:b.n_issued]
    if not {x for _, _, x in a.events} <= set(done):
        return None  # something running at a is still running at b
    touched = [geo.block[x] for x in started]
    touched += [geo.block[x] for x in done]
    touched += [geo.block[c] for x in done for c in children[x]]
    lo, hi = min(touched), max(touched)
    if lo < 2 or hi > geo.n - 3:  # -1 (an end) is below 2
        return None
    m = geo.n - 3 - hi if d > 0 else lo - 2
    if m < 1 or not _same_shifted(a.code, b.code, d, geo):
        return None
    step = geo.step
    return Fill(started, [run.start[x] for x in started], done, [run.end[x] for x in done],
                [d * step[x] for x in started], [d * step[x] for x in done], m, period)


def _same_shifted(a: list[int], b: list[int], d: int, geo: Geometry) -> bool:
    """``b == τ(a)`` for the codes: ends equal, middle blocks moved by ``d`` with the block
    that has no source equal to itself."""
    b1, be, w1, we = geo.b1, geo.b_end, geo.w1, geo.w_end
    if a[:b1] != b[:b1] or a[be:w1] != b[be:w1] or a[we:] != b[we:]:
        return False
    for s, e, L in ((b1, be, geo.lb), (w1, we, geo.lw)):
        if d > 0:
            if b[s + L:e] != a[s:e - L] or b[s:s + L] != a[s:s + L]:
                return False
        elif b[s:e - L] != a[s + L:e] or b[e - L:e] != a[e - L:e]:
            return False
    return True


def _apply_shift(code: list[int], d: int, m: int, geo: Geometry) -> None:
    """``code := τ^m(code)`` in place (block ``c`` takes block ``c - m d``'s codes, clamped to
    the middle)."""
    for s, e, L in ((geo.b1, geo.b_end, geo.lb), (geo.w1, geo.w_end, geo.lw)):
        seg = code[s:e]
        if d > 0:
            code[s:e] = seg[:L] * m + seg[:len(seg) - m * L]
        else:
            code[s:e] = seg[m * L:] + seg[len(seg) - L:] * m


def _moved_events(events: list[tuple[int, int, int]], d: int, m: int, period: int,
                  geo: Geometry) -> list[tuple[int, int, int]]:
    """The running nodes of ``τ^m`` of a checkpoint (all in ``σ(T)``, so all move); sorted,
    hence a heap, with the sequence order kept."""
    step = geo.step
    return [(t + m * period, s, x + m * d * step[x]) for t, s, x in events]


def filled_ticks(run: PeriodicRun) -> tuple[np.ndarray, np.ndarray]:
    """Every node's start and end tick: the ones the replay ran, plus the skipped periods (the
    observed period's nodes moved ``k`` blocks and ``k * period`` ns, ``k = 1 .. m``)."""
    start = np.fromiter(run.start, dtype=np.int64, count=len(run.start))
    end = np.fromiter(run.end, dtype=np.int64, count=len(run.end))
    for f in run.fills:
        k = np.arange(1, f.m + 1, dtype=np.int64)[:, None]
        for ticks, nodes, values, steps in ((start, f.issued, f.starts, f.issued_steps),
                                            (end, f.finished, f.ends, f.finished_steps)):
            where = np.array(nodes, dtype=np.int64)[None, :] + k * np.array(steps, dtype=np.int64)
            ticks[where.ravel()] = (np.array(values, dtype=np.int64)[None, :]
                                    + k * f.period).ravel()
    return start, end
