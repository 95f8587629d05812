"""Link contention: flows that share links queue on them (ASTRA-sim's congestion-aware backend).

The rules of that backend, for one network dimension:

- every directed link is a FIFO queue; a message of m bytes keeps it busy for
  ``s(m) = trunc(m / B)`` and reaches the next node ``c(m) = trunc(L + m / B)`` after it
  starts, so latency does not hold the link;
- store-and-forward: a message re-queues at every node on its way, h hops cost ``h c(m)``
  where the unaware backend charges ``trunc(h L + m / B)``; a Switch is two links
  (NPU -> switch -> NPU), both serialising;
- concurrent chunks of a collective share the same links.

Every NPU of a Ring, Switch or FullyConnected dimension carries the same traffic, so one NPU's
outgoing links stand for all of them: the model replays the sends of one representative NPU
through those links (O(chunks x sends x hops) queue operations, not a network simulation).
This module times whole-system collectives on one such dimension, the networks ASTRA-sim's
backend itself runs (every measured congestion-aware row); meshes, several dimensions and
sub-groups go NPU by NPU (:mod:`._flows`), which reuses the programs and paths defined here.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from simcore.network import Collective, CollectiveAlgorithm, Network, Topology

from ._base import Costs, Link
from ._halving_doubling import HalvingDoublingCollective
from ._ring import ring_steps
from ._schedule import chunking

# A hop on the representative NPU's links: (link key, busy ns, delivery ns).
Hop = tuple[object, int, int]


@dataclass(frozen=True, slots=True)
class RepDim:
    """One dimension's link timing, store-and-forward, and the per-NPU costs."""

    link: Link
    costs: Costs

    @property
    def topology(self) -> Topology:
        return self.link.dim.topology

    @property
    def n(self) -> int:
        return self.link.npus

    def busy(self, m: int) -> int:
        """How long a message of m bytes holds one link."""
        return int(m / self.link.bytes_per_ns)

    def deliver(self, m: int) -> int:
        """How long after it starts on a link a message reaches the next node: one hop."""
        return self.link.message_ns(1, m)

    def hops(self, offset: int) -> int:
        return self.link.hops(offset)


def ring_program(op: Collective, chunk: int, n: int) -> list[tuple[int, int, int]]:
    """Sends of one chunk: (message bytes, peer offset, bytes reduced after the receive)."""
    sends, reduce_steps, m = ring_steps(op, n, chunk)
    return [(m, 1, m)] * reduce_steps + [(m, 1, 0)] * (sends - reduce_steps)


def hd_program(op: Collective, chunk: int, n: int) -> list[tuple[int, int, int]]:
    """Halving-doubling sends; the reduction after a receive is sized by the *next* message
    (ASTRA-sim releases the bundle after halving), and only the first log2(n) - 1 receives
    are reduced."""
    HalvingDoublingCollective().check(op, n)
    steps = n.bit_length() - 1
    if op is Collective.ALL_GATHER:
        sends = [(chunk << k, n >> (k + 1)) for k in range(steps)]
    else:
        sends = [(chunk >> (k + 1), 1 << k) for k in range(steps)]
        if op is Collective.ALL_REDUCE:
            base = 2 * (sends[-1][0] // 2)
            sends += [(base << k, n >> (k + 1)) for k in range(steps)]
    reduces = op in (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER)
    return [
        (m, off, sends[j + 1][0] if reduces and j < steps - 1 else 0)
        for j, (m, off) in enumerate(sends)
    ]


def step_paths(dim: RepDim, program: Sequence[tuple[int, int, int]], hd: bool) -> list[list[Hop]]:
    paths = []
    for m, off, _ in program:
        s, c = dim.busy(m), dim.deliver(m)
        if dim.topology is Topology.SWITCH:
            paths.append([("up", s, c), ("down", s, c)])
        elif dim.topology is Topology.FULLY_CONNECTED:
            paths.append([(("fc", off % dim.n if hd else 1), s, c)])
        else:
            h = dim.hops(off)
            if not hd or h == 1:
                paths.append([("cw", s, c)])
            else:
                # halving-doubling on a ring with several chunks in flight: links are loaded
                # unevenly, so one representative link is approximate. The offset-n/2 step
                # loads every link with h messages, the others 0.75 h on the busiest link.
                load = h if 2 * h == dim.n else max(1.0, 0.75 * h)
                paths.append([("cw", int(load * s), h * c)])
    return paths


def _streams(paths: list[list[Hop]], after: list[int], chunks: int, active: int, ed: int) -> int:
    """Replay ``chunks`` streams, ``active`` at a time, through the representative links.

    A hop starts at max(ready, link free); the next send of a stream is requested
    ``after[j]`` (hand-off + reduction) after send j is delivered; a finished stream frees
    its slot and the next chunk starts one hand-off later.
    """
    events: list[tuple[int, int, int, int]] = []  # (time, seq, send index, hop index)
    seq = 0
    for _ in range(min(active, chunks)):
        events.append((ed, seq, 0, 0))
        seq += 1
    started = len(events)
    free: dict[object, int] = {}
    last_send = len(paths) - 1
    end = 0
    while events:
        t, _, j, hop = heapq.heappop(events)
        path = paths[j]
        if hop < len(path):
            key, busy, deliver = path[hop]
            start = max(t, free.get(key, t))
            free[key] = start + busy
            heapq.heappush(events, (start + deliver, seq, j, hop + 1))
        elif j < last_send:
            heapq.heappush(events, (t + after[j], seq, j + 1, 0))
        else:
            done = t + after[j]
            end = max(end, done)
            if started < chunks:
                started += 1
                heapq.heappush(events, (done + ed, seq, 0, 0))
        seq += 1
    return end


def direct_path(dim: RepDim, d: int, m: int) -> list[Hop]:
    """The representative links a direct message of m bytes to offset d queues on: both links
    through a Switch, the pair's own FullyConnected link, and on a Ring the neighbour link
    (clockwise up to n/2, the tie included, as ``Ring::route``) once per hop."""
    s, c = dim.busy(m), dim.deliver(m)
    if dim.topology is Topology.SWITCH:
        return [("up", s, c), ("down", s, c)]
    if dim.topology is Topology.FULLY_CONNECTED:
        return [(("fc", d), s, c)]
    return [("cw" if d <= dim.n // 2 else "acw", s, c)] * dim.hops(d)


def _direct(dim: RepDim, op: Collective, chunk: int, chunks: int, active: int) -> int:
    """ASTRA-sim ``AllToAll`` on the representative NPU: the first burst goes to offsets
    1..n-1 at once; every receive, after its hand-off (and reduction, for reducing steps),
    adds a send token; an all-reduce's second burst waits until all n-1 first-burst messages
    have arrived and then spends one token per send; a chunk ends when n-1 tokens are idle
    after its last send. On a Ring a message re-queues on the same representative link at
    every hop (its neighbour forwards the same traffic)."""
    n, ed = dim.n, dim.costs.endpoint_ns
    m = chunk if op is Collective.ALL_GATHER else chunk // n
    red = dim.costs.reduce_ns(m)
    paths = {d: direct_path(dim, d, m) for d in range(1, n)}
    all_reduce = op is Collective.ALL_REDUCE
    events: list[tuple[int, int, str, int, int, int]] = []
    seq = 0
    free: dict[object, int] = {}
    state: dict[int, list[int]] = {}  # chunk -> [received, tokens, second-burst sends]
    started = 0
    end = 0

    def push(t: int, kind: str, ch: int, d: int, hop: int) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, ch, d, hop))
        seq += 1

    def start_chunk(t: int) -> None:
        nonlocal started
        state[started] = [0, 0, 0]
        for d in range(1, n):
            push(t + ed, "hop", started, d, 0)
        started += 1

    for _ in range(min(active, chunks)):
        start_chunk(0)
    while events:
        t, _, kind, ch, d, hop = heapq.heappop(events)
        st = state[ch]
        if kind == "hop":
            p = paths[d]
            if hop < len(p):
                key, busy, deliver = p[hop]
                start = max(t, free.get(key, t))
                free[key] = start + busy
                push(start + deliver, "hop", ch, d, hop + 1)
                continue
            st[0] += 1
            reduce_now = (all_reduce and st[0] <= n - 1) or op is Collective.REDUCE_SCATTER
            push(t + ed + (red if reduce_now else 0), "token", ch, 0, 0)
            continue
        st[1] += 1
        if all_reduce and st[0] >= n - 1:
            while st[1] > 0 and st[2] < n - 1:
                st[2] += 1
                st[1] -= 1
                push(t, "hop", ch, st[2], 0)
        if (st[2] == n - 1 or not all_reduce) and st[1] == n - 1:
            end = max(end, t)
            del state[ch]
            if started < chunks:
                start_chunk(t)
    return end


def aware_time_ns(network: Network, op: Collective, size_bytes: int) -> tuple[int, int, int]:
    """``(time ns, chunk bytes, chunks)`` of a whole-system collective with link contention."""
    if len(network.dims) != 1:
        raise ValueError(
            "the contention model covers one-dimensional networks (as ASTRA-sim's congestion-"
            f"aware backend does), but this network has {len(network.dims)} dimensions"
        )
    nd = network.dims[0]
    if nd.topology not in (Topology.RING, Topology.SWITCH, Topology.FULLY_CONNECTED):
        raise ValueError(f"the contention model covers Ring, Switch and FullyConnected, not"
                         f" {nd.topology}")
    scheduling = network.scheduling
    if nd.npus == 1:
        return 0, size_bytes, 1
    costs = Costs.of(scheduling)
    dim = RepDim(Link(nd), costs)
    chunk, chunks = chunking(op, size_bytes, scheduling.preferred_dataset_splits, nd.npus)
    active = scheduling.active_chunks_per_dim
    choice = nd.algorithm(op)
    kind = choice.algorithm
    if choice.window is not None:
        raise ValueError(f"{choice} is not modelled with contention; use direct")
    if kind in (CollectiveAlgorithm.DIRECT, CollectiveAlgorithm.ONE_DIRECT):
        return _direct(dim, op, chunk, chunks, active), chunk, chunks
    if kind is CollectiveAlgorithm.DOUBLE_BINARY_TREE:
        raise ValueError("doubleBinaryTree is not modelled with contention")
    hd = kind in (CollectiveAlgorithm.HALVING_DOUBLING, CollectiveAlgorithm.ONE_HALVING_DOUBLING)
    program = hd_program(op, chunk, dim.n) if hd else ring_program(op, chunk, dim.n)
    after = [costs.endpoint_ns + costs.reduce_ns(r) if r else costs.endpoint_ns
             for _, _, r in program]
    if min(active, chunks) == 1:
        per_chunk = costs.endpoint_ns + sum(
            dim.hops(off) * dim.deliver(m) + a for (m, off, _), a in zip(program, after)
        )
        return chunks * per_chunk, chunk, chunks
    paths = step_paths(dim, program, hd)
    return _streams(paths, after, chunks, active, costs.endpoint_ns), chunk, chunks

