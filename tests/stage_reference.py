"""The stage replay's rules written plainly on node objects, one method per rule: the oracle
that simcore.stage's flat-list replay is tested against (tests/test_stage_fast.py). Rules: see
simcore/stage/_replay.py's docstring."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from simcore.stage._graph import Node, NodeKind, RankGraph
from simcore.stage._replay import RankTimes, _union


class _Rank:
    def __init__(self, graph: RankGraph) -> None:
        self.graph = graph
        n = len(graph.nodes)
        self.index = {node.id: i for i, node in enumerate(graph.nodes)}
        self.pending = [0] * n
        self.children: list[list[int]] = [[] for _ in range(n)]
        for i, node in enumerate(graph.nodes):
            self.pending[i] = len(node.deps)
            for d in node.deps:
                self.children[self.index[d]].append(i)
        # ready nodes by resource, each a heap of node indices (= id order)
        self.ready_comp: list[int] = []
        self.ready_comm: list[int] = []
        self.ready_recv: list[int] = []
        for i in range(n):
            if self.pending[i] == 0:
                self.make_ready(i)
        self.comp_busy = False
        self.comm_busy = False
        self.start = [0] * n
        self.end = [-1] * n
        self.comp_total = 0

    def make_ready(self, i: int) -> None:
        kind = self.graph.nodes[i].kind
        queue = (self.ready_comp if kind is NodeKind.COMP else
                 self.ready_recv if kind is NodeKind.RECV else self.ready_comm)
        heapq.heappush(queue, i)


def replay_reference(
    graphs: Sequence[RankGraph],
    comp_ns: Callable[[Node], int],
    coll_ns: Callable[[RankGraph, Node], int],
    p2p_ns: Callable[[int, int, int], int],
) -> list[RankTimes]:
    """:func:`replay` written plainly (node objects, one method per rule): the reference the
    faster :func:`replay` is tested against."""
    ranks = [_Rank(g) for g in graphs]
    events: list[tuple[int, int, int, int]] = []  # (tick, seq, rank, node index)
    seq = 0
    arrived: dict[int, int] = {}  # link -> arrival tick of a send whose receive is not posted
    waiting: dict[int, tuple[int, int]] = {}  # link -> (rank, node index) of a posted receive

    def push(tick: int, r: int, i: int) -> None:
        nonlocal seq
        heapq.heappush(events, (tick, seq, r, i))
        seq += 1

    def issue_ready(r: int, now: int) -> None:
        # ASTRA-sim walks the ready nodes in id order and issues each one whose resource is
        # free; with one compute slot, one communication slot and free receives that is: the
        # lowest-id compute node, the lowest-id collective or send, and every receive.
        rank = ranks[r]
        nodes = rank.graph.nodes
        if not rank.comp_busy and rank.ready_comp:
            i = heapq.heappop(rank.ready_comp)
            rank.comp_busy = True
            dur = comp_ns(nodes[i])
            rank.comp_total += dur
            rank.start[i] = now
            push(now + dur, r, i)
        if not rank.comm_busy and rank.ready_comm:
            i = heapq.heappop(rank.ready_comm)
            node = nodes[i]
            rank.comm_busy = True
            rank.start[i] = now
            if node.kind is NodeKind.COLL:
                push(now + coll_ns(rank.graph, node), r, i)
            else:
                peer = rank.graph.peers[node.link]
                t = now + p2p_ns(rank.graph.rank, peer, node.size)
                push(t, r, i)
                if node.link in waiting:
                    rr, ii = waiting.pop(node.link)
                    push(t, rr, ii)
                else:
                    arrived[node.link] = t
        while rank.ready_recv:
            i = heapq.heappop(rank.ready_recv)
            link = nodes[i].link
            rank.start[i] = now
            if link in arrived:
                push(max(now, arrived.pop(link)), r, i)
            else:
                waiting[link] = (r, i)

    for r in range(len(ranks)):
        issue_ready(r, 0)
    while events:
        now, _, r, i = heapq.heappop(events)
        rank = ranks[r]
        node = rank.graph.nodes[i]
        rank.end[i] = now
        if node.kind is NodeKind.COMP:
            rank.comp_busy = False
        elif node.kind is not NodeKind.RECV:
            rank.comm_busy = False
        for c in rank.children[i]:
            rank.pending[c] -= 1
            if rank.pending[c] == 0:
                rank.make_ready(c)
        issue_ready(r, now)

    results = []
    for rank in ranks:
        if min(rank.end) < 0:
            stuck = next(n.name for n, e in zip(rank.graph.nodes, rank.end) if e < 0)
            raise RuntimeError(f"rank {rank.graph.rank} never finishes node {stuck}")
        nodes = rank.graph.nodes
        comp = [(rank.start[i], rank.end[i]) for i, n in enumerate(nodes)
                if n.kind is NodeKind.COMP]
        comm = [(rank.start[i], rank.end[i]) for i, n in enumerate(nodes)
                if n.kind is not NodeKind.COMP]
        wall = max(rank.end)
        results.append(RankTimes(
            wall_time=wall,
            gpu_time=_union(comp),
            comm_time=_union(comm),
            exposed_comm=wall - rank.comp_total,
            peak_memory_usage=_peak_memory(nodes, rank.start, rank.end),
        ))
    return results




def _peak_memory(nodes: Sequence[Node], start: list[int], end: list[int]) -> int:
    """Peak of the summed sizes of live tensors (``LocalMemUsageTracker::buildMemoryTimeline``)."""
    written: dict[str, tuple[int, int]] = {}  # tensor -> (write tick, size)
    last_read: dict[str, int] = {}
    for i in sorted(range(len(nodes)), key=lambda i: end[i]):  # the tracker records at the end
        node = nodes[i]
        for name, size in node.inputs:
            if size == 0:
                continue
            if name not in written:
                written[name] = (0, size)
            last_read[name] = end[i]
        for name, size in node.outputs:
            if size == 0:
                continue
            if name in written:
                raise AssertionError(f"tensor {name} written twice")
            written[name] = (start[i], size)
    delta: dict[int, int] = {}
    for name, (tick, size) in written.items():
        delta[tick] = delta.get(tick, 0) + size
    for name, tick in last_read.items():
        delta[tick] = delta.get(tick, 0) - written[name][1]
    peak = live = 0
    for tick in sorted(delta):
        live += delta[tick]
        peak = max(peak, live)
    return peak
