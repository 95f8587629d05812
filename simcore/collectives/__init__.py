"""Collective and point-to-point timing, exact to ASTRA-sim's analytical backend.

``collective_time(network, collective, size_bytes)`` gives what ASTRA-sim 2.0 (analytical,
congestion-unaware) reports for sys[0] when every NPU issues the collective at t = 0:
the collective is chunked, each chunk runs one phase per network dimension with that
dimension's algorithm, and the chunks are scheduled through per-dimension queues
(:mod:`._schedule`). With ``congestion=Congestion.AWARE`` the link-contention model replaces
the per-message times (ASTRA-sim's congestion-aware backend is its check): one representative
NPU on a Ring, Switch or FullyConnected network (:mod:`._contention`), every NPU of a mesh, a
sub-group or several dimensions otherwise (:mod:`._flows`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from simcore.network import (
    AlgorithmChoice,
    Collective,
    CollectiveAlgorithm,
    Congestion,
    Network,
    PerNetwork,
)

from ._base import NS_PER_S, BaseCollective, Costs, Link
from ._contention import aware_time_ns
from ._direct import DirectCollective
from ._double_binary_tree import DoubleBinaryTreeCollective
from ._flat import FlatLink
from ._flows import MESHES, flow_phase, group_phase, p2p_aware_ns, simulate, whole_system_agents
from ._group import GROUP_HANDOFF_NS, group_ring_ns, p2p_ns
from ._halving_doubling import HalvingDoublingCollective
from ._ring import RingCollective
from ._schedule import PhasePlan, Scheduler, chunking, phase_ops, scheduler, waves

__all__ = [
    "BaseCollective",
    "CollectiveTiming",
    "Congestion",
    "PhaseTiming",
    "collective_time",
    "p2p_time",
    "algorithm_for",
]


@dataclass(frozen=True, slots=True)
class PhaseTiming:
    """One phase of one chunk."""

    dim: int | None
    """Network dimension; None for a sub-group's ring, which spans dimensions."""
    collective: Collective
    algorithm: str
    npus: int
    data_bytes: int
    time_s: float
    """Duration of this phase for one chunk."""


@dataclass(frozen=True, slots=True)
class CollectiveTiming:
    """What one collective costs, and how it was split."""

    collective: Collective
    size_bytes: int
    time_s: float
    chunk_bytes: int
    chunks: int
    congestion: Congestion
    plans: tuple[PhasePlan, ...] = ()
    """The phases of one chunk, in order."""
    phase_bytes: tuple[int, ...] = ()
    """Bytes per NPU entering each phase."""
    phase_ns: tuple[int, ...] = ()
    """Duration of each phase for one chunk, ns."""

    @property
    def time_ns(self) -> int:
        return round(self.time_s * NS_PER_S)

    @property
    def phases(self) -> tuple[PhaseTiming, ...]:
        return tuple(
            PhaseTiming(p.dim, p.op, p.algorithm.name, p.npus, b, d / NS_PER_S)
            for p, b, d in zip(self.plans, self.phase_bytes, self.phase_ns)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "collective": self.collective.value,
            "size_bytes": self.size_bytes,
            "time_ns": self.time_ns,
            "congestion": self.congestion.value,
            "chunk_bytes": self.chunk_bytes,
            "chunks": self.chunks,
            "phases": [
                {
                    "dim": p.dim,
                    "collective": p.collective.value,
                    "algorithm": p.algorithm,
                    "npus": p.npus,
                    "data_bytes": p.data_bytes,
                    "time_ns_per_chunk": round(p.time_s * NS_PER_S),
                }
                for p in self.phases
            ],
        }


_ALGORITHMS: dict[CollectiveAlgorithm, BaseCollective] = {
    CollectiveAlgorithm.RING: RingCollective(),
    CollectiveAlgorithm.ONE_RING: RingCollective(),
    CollectiveAlgorithm.DIRECT: DirectCollective(),
    CollectiveAlgorithm.ONE_DIRECT: DirectCollective(),
    CollectiveAlgorithm.HALVING_DOUBLING: HalvingDoublingCollective(),
    CollectiveAlgorithm.ONE_HALVING_DOUBLING: HalvingDoublingCollective(),
    CollectiveAlgorithm.DOUBLE_BINARY_TREE: DoubleBinaryTreeCollective(),
}


def algorithm_for(choice: AlgorithmChoice) -> BaseCollective:
    """The algorithm object for a configured choice (stateless, so shared)."""
    if choice.window is not None:
        return DirectCollective(choice.window)
    return _ALGORITHMS[choice.algorithm]


_ONE_ALGORITHMS = (
    CollectiveAlgorithm.ONE_RING,
    CollectiveAlgorithm.ONE_DIRECT,
    CollectiveAlgorithm.ONE_HALVING_DOUBLING,
)


def _check_size(size_bytes: int) -> None:
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes <= 0:
        raise ValueError(f"`size_bytes > 0` must hold (whole bytes), but got {size_bytes!r}")


def _check_group(network: Network, group: Sequence[int]) -> None:
    if len(group) < 2:
        raise ValueError(f"a group needs at least 2 ranks, but got {list(group)}")
    if len(set(group)) != len(group):
        raise ValueError(f"a group lists each rank once, but got {list(group)}")
    for r in group:
        network.check_rank(r)


def collective_time(
    network: Network,
    collective: Collective,
    size_bytes: int,
    *,
    group: Sequence[int] | None = None,
    congestion: Congestion = Congestion.UNAWARE,
) -> CollectiveTiming:
    """Time of one collective of ``size_bytes`` per NPU, as ASTRA-sim reports it for sys[0]
    (for a sub-group: for the group's first rank).

    ``group``: the ranks of a sub-group, in ring order; None or every rank means the whole
    system, which uses the per-dimension algorithms and phases.

    ``congestion=Congestion.AWARE``: the time the last NPU (of the group) finishes, as the
    measured runs' ``cycles_max``; where every NPU acts alike that is sys[0]'s time too.
    """
    _check_size(size_bytes)
    if group is not None:
        _check_group(network, group)
        if len(group) == network.npus:
            group = None
    if congestion is Congestion.AWARE:
        return _aware_timing(network, collective, size_bytes, group)
    scheduling = network.scheduling
    compiled = _compiled(network)
    chunk, chunks = chunking(
        collective, size_bytes, scheduling.preferred_dataset_splits, compiled.npus
    )
    if group is not None:
        n_waves = waves(chunks, scheduling.active_chunks_per_dim)
        return _group_timing(network, compiled.links, collective, size_bytes, group, chunk,
                             chunks, n_waves)
    plans, phases, schedule = compiled.plan(collective)
    if not plans:  # a one-NPU system: nothing to send
        return CollectiveTiming(collective, size_bytes, 0.0, chunk, chunks, congestion)
    costs = compiled.costs
    if isinstance(plans[0].algorithm, DoubleBinaryTreeCollective):
        return _dbt_timing(plans[0], collective, size_bytes, chunk, chunks, costs,
                           scheduling.active_chunks_per_dim)
    sizes = []
    durations = []
    data = chunk
    for phase_ns, output_bytes in phases:
        sizes.append(data)
        durations.append(phase_ns(data))
        data = output_bytes(data)
    total_ns = schedule(chunks, durations, scheduling.active_chunks_per_dim)
    return CollectiveTiming(collective, size_bytes, total_ns / NS_PER_S, chunk, chunks,
                            congestion, plans, tuple(sizes), tuple(durations))


_CompiledPlan = tuple[
    tuple[PhasePlan, ...], tuple[tuple[Callable[[int], int], Callable[[int], int]], ...], Scheduler
]
"""A collective's phases; per phase ``(duration_ns(bytes in), bytes out(bytes in))``; the
chunk schedule for the phases' queues."""


class _CompiledNetwork:
    """What a network's collectives need that does not depend on the message: its links,
    its per-NPU costs and, per collective, the phases of a chunk with their duration functions
    (per-offset hop latencies fixed) and the schedule for their queues. Built once per Network
    object (see :func:`_compiled`); every estimate still computes its own times."""

    def __init__(self, network: Network) -> None:
        self.network = weakref.proxy(network)
        self.links = [Link(d) for d in network.dims]
        self.costs = Costs.of(network.scheduling)
        self.npus = network.npus
        self._plans: dict[Collective, _CompiledPlan] = {}

    def plan(self, collective: Collective) -> _CompiledPlan:
        """The phases of one chunk; per phase its duration and output size as functions of its
        input size; and how chunks through the phases are scheduled (by their queues, one per
        dimension)."""
        entry = self._plans.get(collective)
        if entry is None:
            plans = tuple(_plan(self.network, self.links, collective))
            phases = tuple(
                (p.algorithm.phase_fn(p.op, p.npus, p.link, self.costs),
                 p.algorithm.output_fn(p.op, p.npus))
                for p in plans
            )
            schedule = scheduler([p.dim or 0 for p in plans])
            entry = self._plans[collective] = (plans, phases, schedule)
        return entry


_compiled: PerNetwork[_CompiledNetwork] = PerNetwork(_CompiledNetwork)
"""Each network's links and plans, prepared once."""


def _plan(network: Network, links: list[Link], collective: Collective) -> list[PhasePlan]:
    first = network.dims[0].algorithm(collective)
    if first.algorithm in _ONE_ALGORITHMS:
        # ASTRA-sim builds one ring over all NPUs and stops there: a single phase.
        if first.algorithm is CollectiveAlgorithm.ONE_DIRECT:
            raise ValueError(
                "oneDirect is not modelled: its NPUs do not act alike; use direct per dimension"
            )
        algorithm = algorithm_for(first)
        algorithm.check(collective, network.npus)
        flat = FlatLink(network, links)
        return [PhasePlan(0, collective, algorithm, flat, network.npus)]  # type: ignore[arg-type]
    active = [i for i, d in enumerate(network.dims) if d.npus > 1]
    if not active:
        return []
    plans = []
    for dim, op in phase_ops(collective, active, network.scheduling.optimization):
        choice = network.dims[dim].algorithm(collective)
        if choice.algorithm in _ONE_ALGORITHMS:
            raise ValueError(
                f"{choice} on dimension {dim} but not on dimension 0: a one* algorithm must be"
                " listed for every dimension"
            )
        algorithm = algorithm_for(choice)
        n = network.dims[dim].npus
        if isinstance(algorithm, DoubleBinaryTreeCollective) and len(active) > 1:
            raise ValueError("doubleBinaryTree is modelled on one-dimensional networks only")
        algorithm.check(op, n)
        plans.append(PhasePlan(dim, op, algorithm, links[dim], n))
    return plans


def _dbt_timing(plan: PhasePlan, collective: Collective, size_bytes: int, chunk: int,
                chunks: int, costs: Costs, active: int) -> CollectiveTiming:
    assert isinstance(plan.algorithm, DoubleBinaryTreeCollective)
    total_ns = plan.algorithm.all_reduce_ns(plan.npus, chunk, chunks, active, plan.link, costs)
    return CollectiveTiming(collective, size_bytes, total_ns / NS_PER_S, chunk, chunks,
                            Congestion.UNAWARE, (plan,), (chunk,), (total_ns // chunks,))


def _check_group_algorithm(network: Network, collective: Collective) -> None:
    only = network.dims[0].algorithm(collective)
    rings = (CollectiveAlgorithm.RING, CollectiveAlgorithm.ONE_RING)
    if len(network.dims) == 1 and only.algorithm not in rings:
        # ASTRA-sim forces ring only when several implementations are listed; a single
        # non-ring one stays, and its NPUs then do not act alike.
        raise ValueError(
            f"{only} over a sub-group is not modelled (ASTRA-sim keeps a single listed"
            " implementation for groups); list ring for this collective"
        )


def _group_timing(network: Network, links: list[Link], collective: Collective, size_bytes: int,
                  group: Sequence[int], chunk: int, chunks: int, n_waves: int
                  ) -> CollectiveTiming:
    _check_group_algorithm(network, collective)
    costs = Costs.of(network.scheduling, endpoint_ns=GROUP_HANDOFF_NS)
    total_ns = group_ring_ns(network, links, collective, group, chunk, n_waves, costs, group[0])
    plan = PhasePlan(None, collective, _ALGORITHMS[CollectiveAlgorithm.RING], None, len(group))
    return CollectiveTiming(collective, size_bytes, total_ns / NS_PER_S, chunk, chunks,
                            Congestion.UNAWARE, (plan,), (chunk,), (total_ns // n_waves,))


def _aware_timing(network: Network, collective: Collective, size_bytes: int,
                  group: Sequence[int] | None) -> CollectiveTiming:
    """The link-contention model: one representative NPU where every NPU acts alike (a
    whole-system collective on one Ring, Switch or FullyConnected dimension), else NPU by NPU
    (:mod:`._flows`): meshes, several dimensions, sub-groups."""
    if group is None and len(network.dims) == 1 and network.dims[0].topology not in MESHES:
        total_ns, chunk, chunks = aware_time_ns(network, collective, size_bytes)
        return CollectiveTiming(collective, size_bytes, total_ns / NS_PER_S, chunk, chunks,
                                Congestion.AWARE)
    scheduling = network.scheduling
    compiled = _compiled(network)
    chunk, chunks = chunking(
        collective, size_bytes, scheduling.preferred_dataset_splits, compiled.npus
    )
    active = scheduling.active_chunks_per_dim
    if group is not None:
        _check_group_algorithm(network, collective)
        costs = Costs.of(scheduling, endpoint_ns=GROUP_HANDOFF_NS)
        phase = group_phase(network, compiled.links, group, collective, chunk, costs)
        total_ns = simulate([phase], len(group), chunks, active, GROUP_HANDOFF_NS)
        return CollectiveTiming(collective, size_bytes, total_ns / NS_PER_S, chunk, chunks,
                                Congestion.AWARE)
    plans, phases, _ = compiled.plan(collective)
    if plans and isinstance(plans[0].link, FlatLink):
        raise ValueError(
            f"{network.dims[0].algorithm(collective)} is modelled with contention on one Ring,"
            " Switch or FullyConnected dimension only; list ring (or direct) per dimension"
        )
    agents = whole_system_agents(network)
    flow = []
    data = chunk
    for plan, (_, output_bytes) in zip(plans, phases):
        flow.append(flow_phase(network, compiled.links, agents, plan, data, compiled.costs))
        data = output_bytes(data)
    total_ns = simulate(flow, len(agents.addresses), chunks, active, compiled.costs.endpoint_ns)
    return CollectiveTiming(collective, size_bytes, total_ns / NS_PER_S, chunk, chunks,
                            Congestion.AWARE)


def p2p_time(network: Network, src: int, dst: int, size_bytes: int, *,
             congestion: Congestion = Congestion.UNAWARE) -> float:
    """Seconds for one point-to-point message (a SEND node): no hand-off, no reduction, timed on
    the lowest network dimension in which the two ranks differ; with ``Congestion.AWARE``,
    store-and-forward over every link of its route (dimension by dimension, lowest first)."""
    _check_size(size_bytes)
    links = _compiled(network).links
    if congestion is Congestion.AWARE:
        network.check_rank(src)
        network.check_rank(dst)
        if src == dst:
            raise ValueError(f"src and dst must differ, but both are {src}")
        return p2p_aware_ns(network, links, src, dst, size_bytes) / NS_PER_S
    return p2p_ns(network, links, src, dst, size_bytes) / NS_PER_S

