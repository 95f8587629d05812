"""Replay rank traces the way ASTRA-sim's workload layer does, and track local memory.

Scheduling (``workload/Workload.cc``, ``HardwareResource.cc``; NOTES.md section 3.5): per NPU
at most one compute node and one communication node (collective or send) are in flight;
receives need no resource. Whenever a node finishes, the dependency-free nodes are tried in
ascending id order and issued if their resource is free. Compute takes the roofline time
(section 4); a collective takes :func:`simcore.collectives.collective_time` over its
communicator group; a send takes the point-to-point time and completes the matching receive
on the peer at the same tick (a receive posted later completes when posted).

Statistics (``Statistics.cc``): wall = last end tick; GPU time = union of compute intervals;
comm time = union of collective, send and receive intervals (receives count from when they are
posted); exposed = wall - sum of compute runtimes.

Memory (``LocalMemUsageTracker.cc``, NOTES.md section 5.4): a tensor is live from the start of
the node that writes it to the end of the last node that reads it; read but never written means
written at t = 0; written but never read means live to the end. Units are elements.

:func:`replay` (and :func:`replay_flat`, for traces already laid out as lists, see
:mod:`._fast`) applies these rules on flat lists; tests/stage_reference.py states them plainly on
node objects, and tests/test_stage_fast.py checks the two agree. A long repeated trace
(:class:`Repeated`) is replayed by :mod:`._periodic`, which skips the blocks whose schedule
provably repeats, with the peak memory from :mod:`._memory`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from simcore.stage._graph import Node, NodeKind, RankGraph
from simcore.stage._memory import MemoryPlan, peak_memory, peak_memory_direct
from simcore.stage._periodic import Geometry, filled_ticks, replay_periodic

__all__ = ["FlatRank", "RankTimes", "Repeated", "flatten", "replay", "replay_flat",
           "roofline_ns"]


def roofline_ns(num_ops: int, tensor_size: int, peak_ops_per_s: float,
                local_mem_bytes_per_s: float) -> int:
    """``Workload::issue_comp``: trunc(num_ops / min(bw * OI, peak) * 1e9), in doubles."""
    intensity = float(num_ops) / float(tensor_size)
    perf = min(local_mem_bytes_per_s * intensity, peak_ops_per_s)
    return int(float(num_ops) / perf * 1e9)


@dataclass(frozen=True, slots=True)
class RankTimes:
    """What ASTRA-sim reports for one rank (ns; memory in tracker units = elements)."""

    wall_time: int
    gpu_time: int
    comm_time: int
    exposed_comm: int
    peak_memory_usage: int


def _union(intervals: list[tuple[int, int]]) -> int:
    total = 0
    end = -1
    start = 0
    for s, e in sorted(intervals):
        if s > end:
            if end >= 0:
                total += end - start
            start, end = s, e
        else:
            end = max(end, e)
    if end >= 0:
        total += end - start
    return total


_COMP, _COLL, _SEND, _RECV = (int(k) for k in (NodeKind.COMP, NodeKind.COLL, NodeKind.SEND,
                                               NodeKind.RECV))


@dataclass(frozen=True, slots=True)
class Repeated:
    """What the replay of a long repeated trace (:mod:`._fast`) needs besides its lists: where
    the repeated blocks are, each node's dependants and dependency count, the tensors' layout,
    and the sizes of the input and output entries (in that layout's slots)."""

    geometry: Geometry
    children: list[list[int]]
    pending: list[int]
    memory: MemoryPlan | None
    in_sizes: list[int]
    out_sizes: list[int]


@dataclass(slots=True)
class FlatRank:
    """One rank's trace as parallel per-node lists (index order = id order)."""

    rank: int
    kind: list[int]
    dur: list[int]
    """Compute time, collective time or send time (receives: 0)."""
    link: list[int]
    deps: Sequence[list[int]]
    """Indices (not ids) of each node's dependencies."""
    inputs: Sequence[tuple[tuple[object, int], ...]]
    outputs: Sequence[tuple[tuple[object, int], ...]]
    names: Callable[[int], str]
    """Node index -> name (only for the error of a node that never finishes)."""
    repeat: Repeated | None = None
    """Set for a long single-stage trace laid out from repeated blocks."""


def flatten(
    graph: RankGraph,
    comp_ns: Callable[[Node], int],
    coll_ns: Callable[[RankGraph, Node], int],
    p2p_ns: Callable[[int, int, int], int],
) -> FlatRank:
    nodes = graph.nodes
    index = {node.id: i for i, node in enumerate(nodes)}
    kind = [int(node.kind) for node in nodes]
    dur = [0] * len(nodes)
    for i, node in enumerate(nodes):
        k = kind[i]
        if k == _COMP:
            dur[i] = comp_ns(node)
        elif k == _COLL:
            dur[i] = coll_ns(graph, node)
        elif k == _SEND:
            dur[i] = p2p_ns(graph.rank, graph.peers[node.link], node.size)
    return FlatRank(
        rank=graph.rank, kind=kind, dur=dur, link=[node.link for node in nodes],
        deps=[[index[d] for d in node.deps] for node in nodes],
        inputs=[node.inputs for node in nodes], outputs=[node.outputs for node in nodes],
        names=lambda i: nodes[i].name,
    )


def replay(
    graphs: Sequence[RankGraph],
    comp_ns: Callable[[Node], int],
    coll_ns: Callable[[RankGraph, Node], int],
    p2p_ns: Callable[[int, int, int], int],
) -> list[RankTimes]:
    """Run all representative ranks together (pipeline stages talk through sends/receives).

    The same rules and tie-breaks as the plain reference in tests/stage_reference.py (events ordered by tick, then by
    the order they were scheduled in; ready nodes by id), on flat per-node lists: durations are
    looked up once per node before the run instead of at issue (they are pure functions of the
    node), which is all that differs."""
    return replay_flat([flatten(g, comp_ns, coll_ns, p2p_ns) for g in graphs])


def replay_flat(flats: Sequence[FlatRank]) -> list[RankTimes]:
    """:func:`replay` on already flattened ranks."""
    if len(flats) == 1 and _SEND not in flats[0].kind and _RECV not in flats[0].kind:
        f = flats[0]
        return [_replay_single(f) if f.repeat is None else _replay_repeated(f, f.repeat)]
    heappush, heappop = heapq.heappush, heapq.heappop
    nr = len(flats)
    kinds = [f.kind for f in flats]
    durs = [f.dur for f in flats]
    links = [f.link for f in flats]
    childs: list[list[list[int]]] = []
    pendings: list[list[int]] = []
    starts: list[list[int]] = []
    ends: list[list[int]] = []
    ready_comp: list[list[int]] = []
    ready_comm: list[list[int]] = []
    ready_recv: list[list[int]] = []
    for f in flats:
        n = len(f.kind)
        kind = f.kind
        children: list[list[int]] = [[] for _ in range(n)]
        pending = [len(d) for d in f.deps]
        for i, deps in enumerate(f.deps):
            for d in deps:
                children[d].append(i)
        childs.append(children)
        pendings.append(pending)
        starts.append([0] * n)
        ends.append([-1] * n)
        rc: list[int] = []
        rm: list[int] = []
        rv: list[int] = []
        for i in range(n):  # ascending, so already heaps
            if pending[i] == 0:
                k = kind[i]
                (rc if k == _COMP else rv if k == _RECV else rm).append(i)
        ready_comp.append(rc)
        ready_comm.append(rm)
        ready_recv.append(rv)
    comp_busy = [False] * nr
    comm_busy = [False] * nr
    comp_total = [0] * nr
    events: list[tuple[int, int, int, int]] = []  # (tick, seq, rank, node index)
    seq = 0
    arrived: dict[int, int] = {}  # link -> arrival tick of a send whose receive is not posted
    waiting: dict[int, tuple[int, int]] = {}  # link -> (rank, node index) of a posted receive

    def issue_ready(r: int, now: int) -> None:
        nonlocal seq
        start = starts[r]
        rc = ready_comp[r]
        if rc and not comp_busy[r]:
            i = heappop(rc)
            comp_busy[r] = True
            d = durs[r][i]
            comp_total[r] += d
            start[i] = now
            heappush(events, (now + d, seq, r, i))
            seq += 1
        rm = ready_comm[r]
        if rm and not comm_busy[r]:
            i = heappop(rm)
            comm_busy[r] = True
            start[i] = now
            t = now + durs[r][i]
            heappush(events, (t, seq, r, i))
            seq += 1
            if kinds[r][i] == _SEND:
                link = links[r][i]
                if link in waiting:
                    rr, ii = waiting.pop(link)
                    heappush(events, (t, seq, rr, ii))
                    seq += 1
                else:
                    arrived[link] = t
        rv = ready_recv[r]
        while rv:
            i = heappop(rv)
            link = links[r][i]
            start[i] = now
            if link in arrived:
                heappush(events, (max(now, arrived.pop(link)), seq, r, i))
                seq += 1
            else:
                waiting[link] = (r, i)

    for r in range(nr):
        issue_ready(r, 0)
    while events:
        now, _, r, i = heappop(events)
        ends[r][i] = now
        k = kinds[r][i]
        if k == _COMP:
            comp_busy[r] = False
        elif k != _RECV:
            comm_busy[r] = False
        pending = pendings[r]
        kind = kinds[r]
        for c in childs[r][i]:
            pending[c] -= 1
            if pending[c] == 0:
                kc = kind[c]
                heappush(ready_comp[r] if kc == _COMP else ready_recv[r] if kc == _RECV
                         else ready_comm[r], c)
        issue_ready(r, now)

    results = []
    for r, f in enumerate(flats):
        start, end, kind = starts[r], ends[r], kinds[r]
        comp = [(s, e) for s, e, k in zip(start, end, kind) if k == _COMP]
        comm = [(s, e) for s, e, k in zip(start, end, kind) if k != _COMP]  # may overlap: recvs
        results.append(_rank_times(f, start, end, _union(comp), _union(comm), comp_total[r]))
    return results


def _rank_times(f: FlatRank, start: list[int], end: list[int], gpu_time: int, comm_time: int,
                comp_total: int) -> RankTimes:
    """One rank's statistics once every node has run (an error naming a node that never did)."""
    if min(end) < 0:
        stuck = f.names(next(i for i, e in enumerate(end) if e < 0))
        raise RuntimeError(f"rank {f.rank} never finishes node {stuck}")
    wall = max(end)
    return RankTimes(
        wall_time=wall,
        gpu_time=gpu_time,
        comm_time=comm_time,
        exposed_comm=wall - comp_total,
        peak_memory_usage=peak_memory_direct(f.inputs, f.outputs, start, end),
    )


def _replay_single(f: FlatRank) -> RankTimes:
    """:func:`replay_flat` for one rank without pipeline transfers (compute and collectives
    only): the same steps with the rank and link bookkeeping left out."""
    heappush, heappop = heapq.heappush, heapq.heappop
    kind, dur = f.kind, f.dur
    n = len(kind)
    children: list[list[int]] = [[] for _ in range(n)]
    pending = [len(d) for d in f.deps]
    for i, deps in enumerate(f.deps):
        for d in deps:
            children[d].append(i)
    rc = [i for i in range(n) if pending[i] == 0 and kind[i] == _COMP]  # ascending: heaps
    rm = [i for i in range(n) if pending[i] == 0 and kind[i] != _COMP]
    start = [0] * n
    end = [-1] * n
    events: list[tuple[int, int, int]] = []  # (tick, seq, node index)
    seq = 0
    comp_total = 0
    comp_busy = comm_busy = False
    now = 0
    while True:
        if rc and not comp_busy:
            i = heappop(rc)
            comp_busy = True
            d = dur[i]
            comp_total += d
            start[i] = now
            heappush(events, (now + d, seq, i))
            seq += 1
        if rm and not comm_busy:
            i = heappop(rm)
            comm_busy = True
            start[i] = now
            heappush(events, (now + dur[i], seq, i))
            seq += 1
        if not events:
            break
        now, _, i = heappop(events)
        end[i] = now
        if kind[i] == _COMP:
            comp_busy = False
        else:
            comm_busy = False
        for c in children[i]:
            p = pending[c] - 1
            pending[c] = p
            if p == 0:
                heappush(rc if kind[c] == _COMP else rm, c)
    # One compute and one collective at a time: each kind's intervals do not overlap, so their
    # unions are the sums of their durations (as in _replay_repeated).
    return _rank_times(f, start, end, comp_total, sum(dur) - comp_total, comp_total)


def _replay_repeated(f: FlatRank, rep: Repeated) -> RankTimes:
    """:func:`_replay_single` for a long repeated trace, with the same results.

    One compute node and one communication node run at a time, so the compute intervals do
    not overlap and their union is the sum of the compute durations (``comp_total``), and
    likewise the collectives' union is the sum of theirs (all the other durations: a single
    rank's trace here has no sends or receives)."""
    run = replay_periodic(f.kind, f.dur, rep.children, rep.pending, rep.geometry)
    start, end = filled_ticks(run)
    if len(end) and int(end.min()) < 0:
        stuck = f.names(int(np.argmax(end < 0)))
        raise RuntimeError(f"rank {f.rank} never finishes node {stuck}")
    wall = int(end.max()) if len(end) else -1
    peak = None if rep.memory is None else peak_memory(
        rep.memory, start, end, np.array(rep.in_sizes, dtype=np.int64),
        np.array(rep.out_sizes, dtype=np.int64))
    if peak is None:  # what the arrays cannot decide (see _memory): the walk over the nodes
        peak = peak_memory_direct(f.inputs, f.outputs, start.tolist(), end.tolist())
    return RankTimes(
        wall_time=wall,
        gpu_time=run.comp_total,
        comm_time=sum(f.dur) - run.comp_total,
        exposed_comm=wall - run.comp_total,
        peak_memory_usage=peak,
    )
