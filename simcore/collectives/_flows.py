"""Link contention NPU by NPU: the congestion-aware model where one NPU cannot stand for all.

:mod:`._contention` replays one representative NPU, which is exact when every NPU carries the
same traffic (a whole-system collective on one Ring, Switch or FullyConnected dimension). This
module times the rest with the same link rules (ASTRA-sim's congestion-aware backend,
astra-network-analytical ``congestion_aware/network/Link.cpp``: a FIFO per directed link, busy
``trunc(m / B)``, next node reached ``trunc(L + m / B)`` after the start, store-and-forward):

- **Mesh2D / Torus2D dimensions**: the NPUs of a mesh do not act alike (a corner has 2 links, an
  edge 3, the centre 4; the logical ring's row wrap crosses the mesh), so each is an *agent*
  with its own state, its messages routed XY over the dimension's real links
  (:class:`simcore.topologies.Mesh2D`).
- **Several dimensions**: a chunk runs one phase per dimension, as ASTRA-sim's hierarchical
  collectives do, each phase's messages on that dimension's own links (peers of a phase differ
  in that dimension only). Ring, Switch and FullyConnected dimensions stay representative:
  every agent's messages there are *mirrored* (what it receives is, by symmetry, what it sent,
  on its own copy of the dimension's links), so only the meshes' coordinates make agents.
- **Sub-groups**: one logical ring over the group's ranks in the order given (ASTRA-sim's
  CommunicatorGroup), every rank an agent, each message routed dimension by dimension, lowest
  first, as the congestion-aware ``MultiDimTopology::route`` does (astra-network-analytical
  branch ``will/congestion-multidim``, ``MultiDimTopology.cc`` lines 71-94).

Per NPU, per chunk, per phase, the system layer's rules (ASTRA-sim ``Ring.cc``,
``AllToAll.cc``, ``CommonNetworkApi.cc``): a phase starts when its dimension's queue has one of
``active`` slots free; its first send leaves one hand-off after the start; a receive is posted
when the NPU sends the message of the same step, so it completes at ``max(arrival, post)``;
each receive costs a hand-off, plus the reduction on reducing steps, before the next send.
The figure is the last NPU's finish (the measured runs' ``cycles_max``).
"""

# `x if x > y else y`, not max(): faster in the per-hop loop
# ruff: noqa: FURB136

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from simcore.network import Collective, Network, Topology

from ._base import Costs, Link
from ._contention import Hop, RepDim, direct_path, hd_program, ring_program, step_paths
from ._schedule import PhasePlan

MESHES = (Topology.MESH_2D, Topology.TORUS_2D)

Address = tuple[int, ...]
Route = Callable[[int, int], tuple[int | None, list[Hop]]]
"""``(agent, send) -> (receiving agent, or None when mirrored; the hops)``."""


@dataclass(frozen=True, slots=True)
class FlowPhase:
    """One phase of every chunk as the agents run it."""

    queue: int
    """The dimension whose queue (and ``active`` slots) the phase takes."""
    n: int
    """NPUs taking part along the phase's dimension (or in the group)."""
    sends: int
    """Steps: sends one after another, each after the previous step's receive. Direct: 0."""
    after: tuple[int, ...]
    """Hand-off (and reduction) after a receive: per step; for direct, per burst."""
    route: Route
    """Where send ``j`` (a step, or ``burst * n + offset`` for direct) goes, over which links."""
    second_burst: bool = False
    """Direct all-reduce: a second burst, released once the first has fully arrived."""


def _hops(links: Sequence[Link], topologies: Sequence, src: Address, dst: Address, m: int,
          instance_dims: Sequence[int]) -> list[Hop]:
    """The links a message of m bytes crosses from ``src`` to ``dst``: dimension by dimension,
    lowest first, each along its topology's route (XY on a mesh). A link is named by its
    dimension, the coordinates of ``instance_dims`` other than its own (which copy of the
    dimension) and its two ends."""
    hops: list[Hop] = []
    here = list(src)
    for d, (a, b) in enumerate(zip(src, dst)):
        if a == b:
            continue
        link = links[d]
        busy, deliver = int(m / link.bytes_per_ns), link.message_ns(1, m)
        where = tuple(here[i] for i in instance_dims if i != d)
        hops += [((d, where, u, v), busy, deliver) for u, v in topologies[d].route(a, b)]
        here[d] = b
    return hops


class _Agents:
    """The NPUs simulated one by one: their addresses, and the agent of an address."""

    def __init__(self, addresses: list[Address], explicit_dims: Sequence[int]) -> None:
        self.addresses = addresses
        self.index = {a: i for i, a in enumerate(addresses)}
        self.explicit_dims = tuple(explicit_dims)


def whole_system_agents(network: Network) -> _Agents:
    """One agent per coordinate of the mesh dimensions (the others stay at 0: symmetric)."""
    explicit = [i for i, d in enumerate(network.dims) if d.topology in MESHES and d.npus > 1]
    addresses: list[Address] = [tuple(0 for _ in network.dims)]
    for i in explicit:
        addresses = [a[:i] + (x,) + a[i + 1:] for x in range(network.dims[i].npus)
                     for a in addresses]
    addresses.sort(key=lambda a: a[::-1])  # agent 0 is NPU 0, then in rank order
    return _Agents(addresses, explicit)


def _mirrored_route(plan: PhasePlan, rep: RepDim, hops_of: Callable[[int], list[Hop]]) -> Route:
    cache: dict[tuple[int, int], list[Hop]] = {}

    def route(agent: int, j: int) -> tuple[int | None, list[Hop]]:
        found = cache.get((agent, j))
        if found is None:
            found = cache[(agent, j)] = [((agent, plan.dim, key), busy, deliver)
                                         for key, busy, deliver in hops_of(j)]
        return None, found
    return route


def _explicit_route(network: Network, links: Sequence[Link], agents: _Agents, dim: int, n: int,
                    size_of: Callable[[int], int], offset_of: Callable[[int], int]) -> Route:
    topologies = [link.topology for link in links]
    cache: dict[tuple[int, int, int], tuple[int | None, list[Hop]]] = {}

    def route(agent: int, j: int) -> tuple[int | None, list[Hop]]:
        offset, m = offset_of(j), size_of(j)
        found = cache.get((agent, offset, m))
        if found is None:
            src = agents.addresses[agent]
            dst = src[:dim] + ((src[dim] + offset) % n,) + src[dim + 1:]
            hops = _hops(links, topologies, src, dst, m, agents.explicit_dims)
            found = cache[(agent, offset, m)] = (agents.index[dst], hops)
        return found
    return route


def flow_phase(network: Network, links: Sequence[Link], agents: _Agents, plan: PhasePlan,
               data: int, costs: Costs) -> FlowPhase:
    """A whole-system phase (``plan``, ``data`` bytes in per NPU) for the agents."""
    assert plan.dim is not None
    nd, n, op = network.dims[plan.dim], plan.npus, plan.op
    explicit = nd.topology in MESHES
    rep = RepDim(links[plan.dim], costs)
    ed = costs.endpoint_ns
    algorithm = plan.algorithm
    if algorithm.name == "direct":
        window = getattr(algorithm, "window", None)
        if window is not None:
            raise ValueError(f"direct{window} is not modelled with contention; use direct")
        m = data if op is Collective.ALL_GATHER else data // n
        reduces = op in (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER)
        after = (ed + costs.reduce_ns(m) if reduces else ed, ed)

        def offset(j: int) -> int:
            return j % n  # send j is burst j // n to offset j % n
        route = (_explicit_route(network, links, agents, plan.dim, n, lambda _: m, offset)
                 if explicit else
                 _mirrored_route(plan, rep, lambda j: direct_path(rep, j % n, m)))
        return FlowPhase(plan.dim, n, 0, after, route, op is Collective.ALL_REDUCE)
    hd = algorithm.name == "halvingDoubling"
    if hd and explicit:
        raise ValueError(f"halvingDoubling on a {nd.topology} dimension is not modelled with"
                         " contention; use ring or direct there")
    if not hd and algorithm.name != "ring":
        raise ValueError(f"{algorithm.name} is not modelled with contention on this network;"
                         " use ring, direct or halvingDoubling")
    program = hd_program(op, data, n) if hd else ring_program(op, data, n)
    after = tuple(ed + costs.reduce_ns(r) if r else ed for _, _, r in program)
    if explicit:
        route = _explicit_route(network, links, agents, plan.dim, n,
                                lambda j: program[j][0], lambda j: program[j][1])
    else:
        route = _mirrored_route(plan, rep, step_paths(rep, program, hd).__getitem__)
    return FlowPhase(plan.dim, n, len(program), after, route)


def group_phase(network: Network, links: Sequence[Link], group: Sequence[int], op: Collective,
                chunk: int, costs: Costs) -> FlowPhase:
    """The ring over a sub-group (ranks in ring order), agent i being ``group[i]``."""
    n = len(group)
    addresses = [network.address(r) for r in group]
    program = ring_program(op, chunk, n)
    topologies = [link.topology for link in links]
    every_dim = range(len(network.dims))
    hops = [_hops(links, topologies, addresses[i], addresses[(i + 1) % n], program[0][0],
                  every_dim) for i in range(n)]

    def route(agent: int, _: int) -> tuple[int | None, list[Hop]]:
        return (agent + 1) % n, hops[agent]
    after = tuple(costs.endpoint_ns + costs.reduce_ns(r) if r else costs.endpoint_ns
                  for _, _, r in program)
    return FlowPhase(0, n, len(program), after, route)


class _Run:
    """The event list: hops on links, receives, hand-offs, and each agent's queues."""

    _HOP, _RECEIVE, _TOKEN, _START, _END = range(5)

    def __init__(self, phases: Sequence[FlowPhase], agents: int, chunks: int, active: int,
                 endpoint_ns: int) -> None:
        self.phases = phases
        self.chunks = chunks
        self.active = active
        self.ed = endpoint_ns
        self.events: list[tuple] = []
        self.seq = 0
        self.free: dict[object, int] = {}  # link -> when it is free
        self.posted: dict[tuple[int, int, int], int] = {}  # (agent, job, send) -> post time
        self.arrived: dict[tuple[int, int, int], int] = {}  # arrivals before their post
        self.tokens: dict[tuple[int, int], list[int]] = {}  # direct: received, tokens, sent
        queues = {p.queue for p in phases}
        self.slots = [dict.fromkeys(queues, active) for _ in range(agents)]
        self.waiting: list[dict[int, deque[int]]] = [
            {q: deque() for q in queues} for _ in range(agents)]
        self.finish = [0] * agents

    def push(self, t: int, kind: int, *data: object) -> None:
        heapq.heappush(self.events, (t, self.seq, kind, data))
        self.seq += 1

    def run(self) -> int:
        n_phases = len(self.phases)
        q0 = self.phases[0].queue
        for agent in range(len(self.finish)):
            for c in range(self.chunks):
                if c < self.active:
                    self.slots[agent][q0] -= 1
                    self.push(0, self._START, agent, c * n_phases)
                else:
                    self.waiting[agent][q0].append(c * n_phases)
        handlers = (self._hop, self._receive, self._token, self._start, self._end)
        while self.events:
            t, _, kind, data = heapq.heappop(self.events)
            handlers[kind](t, *data)
        return max(self.finish)

    # -- messages ---------------------------------------------------------------------------

    def _send(self, t: int, agent: int, job: int, j: int) -> None:
        """Send ``j`` of ``job`` leaves ``agent`` at t; the matching receive is posted."""
        dst, hops = self.phases[job % len(self.phases)].route(agent, j)
        if dst is None:  # mirrored: what arrives is, by symmetry, this agent's own receive
            self.push(t, self._HOP, hops, 0, agent, job, j, False)
            return
        key = (agent, job, j)
        if key in self.arrived:
            del self.arrived[key]
            self.push(t, self._RECEIVE, agent, job, j)
        else:
            self.posted[key] = t
        self.push(t, self._HOP, hops, 0, dst, job, j, True)

    def _hop(self, t: int, hops: list[Hop], i: int, dst: int, job: int, j: int,
             matched: bool) -> None:
        if i == len(hops):
            if matched:
                self._arrive(t, dst, job, j)
            else:
                self._receive(t, dst, job, j)
            return
        key, busy, deliver = hops[i]
        free = self.free.get(key, t)
        start = t if t > free else free
        self.free[key] = start + busy
        self.push(start + deliver, self._HOP, hops, i + 1, dst, job, j, matched)

    def _arrive(self, t: int, agent: int, job: int, j: int) -> None:
        """A message reaches its agent: received at once if the receive is posted (at or
        before t), at its post if that is later, else kept until it is posted."""
        key = (agent, job, j)
        post = self.posted.pop(key, None)
        if post is None:
            self.arrived[key] = t
        elif post > t:
            self.push(post, self._RECEIVE, agent, job, j)
        else:
            self._receive(t, agent, job, j)

    def _receive(self, t: int, agent: int, job: int, j: int) -> None:
        phase = self.phases[job % len(self.phases)]
        if phase.sends:
            t += phase.after[j]
            if j + 1 < phase.sends:
                self._send(t, agent, job, j + 1)
            else:
                self.push(t, self._END, agent, job)
            return
        state = self.tokens[(agent, job)]
        state[0] += 1
        self.push(t + phase.after[j // phase.n], self._TOKEN, agent, job)

    def _token(self, t: int, agent: int, job: int) -> None:
        """A receive's hand-off is done (ASTRA-sim ``AllToAll::run``, General event)."""
        phase = self.phases[job % len(self.phases)]
        n = phase.n
        state = self.tokens[(agent, job)]
        state[1] += 1
        if phase.second_burst and state[0] >= n - 1:
            while state[1] and state[2] < n - 1:
                state[1] -= 1
                state[2] += 1
                self._send(t, agent, job, n + state[2])
        if (state[2] == n - 1 or not phase.second_burst) and state[1] == n - 1:
            del self.tokens[(agent, job)]
            self._end(t, agent, job)

    # -- phases and queues ------------------------------------------------------------------

    def _start(self, t: int, agent: int, job: int) -> None:
        phase = self.phases[job % len(self.phases)]
        t += self.ed
        if phase.sends:
            self._send(t, agent, job, 0)
            return
        self.tokens[(agent, job)] = [0, 0, 0]
        for d in range(1, phase.n):
            self._send(t, agent, job, d)

    def _end(self, t: int, agent: int, job: int) -> None:
        """A phase ends: its slot goes to the next job waiting there, the chunk moves on
        (``Sys::proceed_to_next_vnet_baseline``, as :func:`._schedule._event_schedule`)."""
        n_phases = len(self.phases)
        p = job % n_phases
        slots, waiting = self.slots[agent], self.waiting[agent]
        q = self.phases[p].queue
        if waiting[q]:
            self._start_at(t, agent, waiting[q].popleft())
        else:
            slots[q] += 1
        if p == n_phases - 1:
            self.finish[agent] = max(self.finish[agent], t)
            return
        nq = self.phases[p + 1].queue
        if slots[nq] and not waiting[nq]:
            slots[nq] -= 1
            self._start_at(t, agent, job + 1)
        else:
            waiting[nq].append(job + 1)

    def _start_at(self, t: int, agent: int, job: int) -> None:
        self.push(t, self._START, agent, job)


def simulate(phases: Sequence[FlowPhase], agents: int, chunks: int, active: int,
             endpoint_ns: int) -> int:
    """The last agent's finish, ns, of ``chunks`` chunks through ``phases``."""
    if not phases or agents == 0:
        return 0
    return _Run(phases, agents, chunks, active, endpoint_ns).run()


def p2p_aware_ns(network: Network, links: Sequence[Link], src: int, dst: int, m: int) -> int:
    """One message alone, store-and-forward over its route (every dimension where the ranks
    differ, lowest first): the sum of ``trunc(L + m / B)`` over its links."""
    topologies = [link.topology for link in links]
    hops = _hops(links, topologies, network.address(src), network.address(dst), m, ())
    return sum(deliver for _, _, deliver in hops)
