"""Placement of the parallel axes onto the network dimensions, and the time of their collectives.

The axes are laid out in the strategy's placement order, innermost first (default tp, sp, dp, pp,
as Megatron-LM orders its ranks: tp fastest). Each axis takes the largest factor of its degree that
the innermost remaining network capacity offers, then moves outwards: on an 8 x 128 DGX cluster,
tp = 8 fills the NVSwitch dimension, and dp = 64, pp = 2 share the InfiniBand dimension.

An axis's collectives then run on the sub-network made of its pieces: the same topologies, links
and algorithms, with the piece's size. A partial Mesh2D/Torus2D piece is timed as a Ring of that
size on the same links (a sub-mesh has no single shape). Collective times come from
:func:`simcore.collectives.collective_time`, so they follow ASTRA-sim's analytical backend (the
congestion-unaware one, or the congestion-aware one when the network's ``congestion`` says so),
plus each spanned dimension's ``call_latency_s`` per call (0 in ASTRA-sim's own systems).

A group with one rank per node (a piece on an outer dimension only: tp = 8 filling a DGX node,
dp across the nodes) runs its collectives at that dimension's send bandwidth where it gives one
(``p2p_bandwidth_bytes_per_s``, :meth:`NetworkDim.for_sends`). A link's ``bandwidth_gbps`` between
nodes is fit on all-reduces over whole nodes (every GPU of two nodes), where NCCL's rings send
each byte over the network up to twice and the hierarchical schedule once, so it is below what a
GPU's NIC carries. With one rank per node both send the same bytes, each through the rank's own
NIC, as a pipeline send does. Without a send bandwidth (ASTRA-sim's own systems) nothing changes.
On a dimension whose rate is bound per communicator rather than per link (``per_communicator``:
NCCL over Omni-Path), a group holding ``L`` of a node's ``G`` ranks runs at ``G / L`` times the
link bandwidth, the node's other groups crossing at the same time (:func:`_communicators`).

HSDP (a strategy's ``shard_group``) splits the dp axis in two, the shard part innermost (as
torchtitan's mesh orders ``dp_replicate, dp_shard, cp, tp``, outermost first:
``torchtitan/distributed/parallel_dims.py`` b5bcd76c): :class:`DpPart` ``dp_shard`` takes the
first ``shard_group / sp`` of dp's places, ``dp_replicate`` the rest, by the same rule.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import replace
from enum import StrEnum

from simcore.collectives import collective_time, p2p_time
from simcore.network import Collective, Network, NetworkDim, PerNetwork, Topology
from simcore.specs import Axis, Strategy

__all__ = ["AxisLike", "AxisNetworks", "DpPart", "ExpertPart", "axis_networks",
           "pairwise_all_to_all", "switch_all_reduce_s",
           "switch_reduced", "within_innermost"]


class ExpertPart(StrEnum):
    """The expert grid of an MoE plan: a stage's tp x sp x dp ranks regrouped as etp x ep x
    edp, innermost first (Megatron-LM's ``RankGenerator(tp=etp, ep=ep, dp=edp, pp=pp)`` with
    the order ``tp-cp-ep-dp-pp``, ``megatron/core/parallel_state.py``); pp stays outermost."""

    ETP = "etp"
    EP = "ep"
    EDP = "edp"


class DpPart(StrEnum):
    """The two parts of the dp axis under HSDP (a strategy's ``shard_group``)."""

    SHARD = "dp_shard"
    """The dp ranks of one shard group (its inner part; with sp, the group is sp x dp_shard)."""
    REPLICATE = "dp_replicate"
    """The shard groups' replicas: the outer part of dp."""


AxisLike = Axis | DpPart | ExpertPart
"""A group the collectives run over: a parallel axis, or a part of one (HSDP, experts)."""


def _pieces(
    shape: tuple[int, ...], degrees: list[tuple[AxisLike, int]]
) -> dict[AxisLike, list[tuple[int, int]]]:
    free = list(shape)
    pieces: dict[AxisLike, list[tuple[int, int]]] = {}
    for axis, degree in degrees:
        left = degree
        mine: list[tuple[int, int]] = []
        for i, capacity in enumerate(free):
            if left == 1:
                break
            piece = math.gcd(capacity, left)
            if piece > 1:
                mine.append((i, piece))
                free[i] //= piece
                left //= piece
        if left != 1:
            raise ValueError(
                f"cannot place {axis}={degree} onto the network dimensions"
                f" {' x '.join(map(str, shape))} after the axes before it in the placement;"
                " choose degrees that divide the dimensions' sizes, or another placement"
            )
        pieces[axis] = mine
    return pieces


def within_innermost(network: Network, strategy: Strategy, axis: Axis) -> bool:
    """Whether the plan's ``axis`` groups lie within the network's innermost dimension: on a DGX
    cluster one node's NVSwitch, on an NVL72 rack its NVLink domain. Raises ValueError where
    the degrees do not divide the dimensions."""
    order = tuple((a, int(getattr(strategy, a.value))) for a in strategy.placement)
    return axis in _innermost_axes(network.shape, order)


@functools.lru_cache(maxsize=4096)
def _innermost_axes(shape: tuple[int, ...], degrees: tuple[tuple[Axis, int], ...]
                    ) -> frozenset[AxisLike]:
    """The axes (``degrees`` in the placement's order, innermost first) placed on the innermost
    dimension alone."""
    return frozenset(axis for axis, mine in _pieces(shape, list(degrees)).items()
                     if all(i == 0 for i, _ in mine))


def _sub_dim(dim: NetworkDim, size: int) -> NetworkDim:
    if dim.links is not None:  # no switch: the group's own links
        dim = replace(dim, bandwidth_bytes_per_s=dim.group_bandwidth(size), links=None,
                      group_links=())
    if size == dim.npus:
        return dim
    if dim.topology in (Topology.MESH_2D, Topology.TORUS_2D):
        return replace(dim, topology=Topology.RING, npus=size, width=None)
    return replace(dim, npus=size)


def _communicators(network: Network, mine: list[tuple[int, int]],
                   dims: tuple[NetworkDim, ...]) -> tuple[NetworkDim, ...]:
    """The group's pieces ``dims`` (on the network's dimensions ``mine``), each on a
    ``per_communicator`` dimension at its link bandwidth times ``G / L``: the node's ``G`` ranks
    (every dimension inside) over the group's ``L`` among them, as many communicators as cross
    it at once (:attr:`NetworkDim.per_communicator`)."""
    scaled = []
    for (i, _), dim in zip(mine, dims, strict=True):
        if i > 0 and dim.per_communicator:
            node = math.prod(d.npus for d in network.dims[:i])
            local = math.prod(size for j, size in mine if j < i)
            dim = replace(dim, bandwidth_bytes_per_s=dim.bandwidth_bytes_per_s * node / local)
        scaled.append(dim)
    return tuple(scaled)


class AxisNetworks:
    """The sub-network of each parallel axis, with memoised collective and p2p times."""

    def __init__(
        self, network: Network, degrees: Mapping[Axis, int], placement: tuple[Axis, ...],
        dp_shard: int | None = None, experts: tuple[int, int] | None = None,
    ) -> None:
        order: list[tuple[AxisLike, int]] = [(axis, degrees[axis]) for axis in placement]
        pieces: dict[AxisLike, list[tuple[int, int]]] = dict(_pieces(network.shape, order))
        if dp_shard is not None:  # HSDP: dp split into its shard part (inner) and replicas
            at = placement.index(Axis.DP)
            split = order[:at] + [(DpPart.SHARD, dp_shard),
                                  (DpPart.REPLICATE, degrees[Axis.DP] // dp_shard)] + order[at + 1:]
            parts = _pieces(network.shape, split)
            pieces.update({part: parts[part] for part in DpPart})
        if experts is not None:  # MoE: the stage's ranks as etp x ep x edp, pp outermost
            etp, ep = experts
            dense = degrees[Axis.TP] * degrees[Axis.SP] * degrees[Axis.DP]
            grid = [(ExpertPart.ETP, etp), (ExpertPart.EP, ep),
                    (ExpertPart.EDP, dense // (etp * ep)), (Axis.PP, degrees[Axis.PP])]
            parts = _pieces(network.shape, grid)
            pieces.update({part: parts[part] for part in ExpertPart})
        self.networks: dict[AxisLike, Network | None] = {}
        for axis, mine in pieces.items():
            if not mine:
                self.networks[axis] = None
                continue
            dims = _communicators(network, mine,
                                  tuple(_sub_dim(network.dims[i], size) for i, size in mine))
            if len(mine) == 1 and mine[0][0] > 0:  # one rank a node: its own NIC's rate
                dims = (dims[0].for_sends(),)
            self.networks[axis] = Network(dims=dims, scheduling=network.scheduling,
                                          congestion=network.congestion)
        self._call = {axis: sum(d.call_latency_s for d in net.dims) if net is not None else 0.0
                      for axis, net in self.networks.items()}
        """Per call on the axis: the call latency of every dimension it spans."""
        self._times: dict[tuple[AxisLike, Collective, int], float] = {}
        self._reduced: dict[AxisLike, Network] = {}
        self._p2p: dict[tuple[Axis, int], float] = {}
        self._dedup: dict[tuple[int, int], float] = {}

    def collective(self, axis: AxisLike, collective: Collective, size_bytes: float) -> float:
        """Seconds for one collective over the axis's group (size as ASTRA-sim takes it: the
        per-rank input for all-gather and all-to-all, the whole tensor otherwise); 0 for a
        degree of 1. An all-to-all is timed as pairwise sends (:func:`pairwise_all_to_all`)."""
        network = self.networks[axis]
        size = int(size_bytes)
        if network is None or size <= 0:
            return 0.0
        key = (axis, collective, size)
        cached = self._times.get(key)
        if cached is None:
            if collective is Collective.ALL_TO_ALL:
                cached = pairwise_all_to_all(network, size) + self._call[axis]
            else:
                cached = (collective_time(network, collective, size,
                                          congestion=network.congestion).time_s
                          + self._call[axis])
                if collective is Collective.ALL_REDUCE:
                    cached = min(cached, self._switch_all_reduce(axis, network, size))
            self._times[key] = cached
        return cached

    def _switch_all_reduce(self, axis: AxisLike, network: Network, size: int) -> float:
        """An all-reduce's time where a switch reduces it (:func:`switch_all_reduce_s`, and
        across dimensions :func:`switch_reduced`); infinity where none does."""
        if len(network.dims) == 1:
            return switch_all_reduce_s(network, size)
        reduced = self._reduced.get(axis)
        if reduced is None:
            reduced = self._reduced[axis] = switch_reduced(network) or network
        if reduced is network:
            return math.inf
        return (collective_time(reduced, Collective.ALL_REDUCE, size,
                                congestion=network.congestion).time_s + self._call[axis])

    def dispatch(self, size_bytes: float, top_k: int) -> float:
        """Seconds for an all-to-all over the ep group that sends each token once per block
        holding its experts (:func:`pairwise_all_to_all` with ``dedup_k``); 0 for ep 1."""
        network = self.networks.get(ExpertPart.EP)
        size = int(size_bytes)
        if network is None or size <= 0:
            return 0.0
        key = (size, top_k)
        cached = self._dedup.get(key)
        if cached is None:
            cached = self._dedup[key] = (pairwise_all_to_all(network, size, top_k)
                                         + self._call[ExpertPart.EP])
        return cached

    def p2p(self, axis: Axis, size_bytes: float) -> float:
        """Seconds of one of a stage's sends along the axis, as the stage that paces a pipeline
        pays them. Megatron-LM's sends block, so a stage's time holds its own two sends per
        micro-batch, forward to the next stage and backward to the one before. On one dimension
        both cross it. Over several (a pipeline of four stages a node on two nodes), the stage at
        a node's edge sends one over the slowest boundary, across the outermost dimension, and
        the other inside the node, across the innermost: each send costs their mean, at each
        dimension's send bandwidth (:meth:`NetworkDim.for_sends`). That is when the outermost
        dimension gives a send bandwidth (``p2p_bandwidth_bytes_per_s``, a cluster's link
        between nodes); without one, a send is timed as ASTRA-sim's congestion-unaware backend
        routes it, on the lowest dimension the two ranks differ in, which for neighbouring
        ranks of the axis is its innermost: ASTRA-sim's own systems keep its timing."""
        network = self.networks[axis]
        size = int(size_bytes)
        if network is None or size <= 0:
            return 0.0
        cached = self._p2p.get((axis, size))
        if cached is None:
            cached = self._p2p[(axis, size)] = _send_mean(network, size)
        return cached


def switch_all_reduce_s(network: Network, size: int) -> float:
    """Seconds of an all-reduce the switch reduces (:class:`~simcore.network.SwitchAllReduce`,
    NCCL's NVLS) over a group within one dimension that offers it and is large enough for the
    library to pick it; infinity otherwise (a group across dimensions: :func:`switch_reduced`)."""
    if len(network.dims) != 1:
        return math.inf
    (dim,) = network.dims
    if dim.nvls is None or dim.npus < dim.nvls.min_npus:
        return math.inf
    return dim.nvls.time_s(size)


def switch_reduced(network: Network) -> Network | None:
    """The network an all-reduce across several dimensions runs on where a dimension's switch
    reduces (NCCL's NVLS tree: the switch reduces and multicasts inside the node, the network
    between nodes carries the rest), or None where no dimension's does. The hierarchical
    schedule's phases on such a dimension, a reduce-scatter and an all-gather of ``(n - 1) / n``
    of the data each, take as long as the switch's own all-reduce of it at a link bandwidth of
    ``2 (n - 1) / n`` times :attr:`SwitchAllReduce.bandwidth_bytes_per_s`. Its fixed time
    (:attr:`SwitchAllReduce.latency_s`, fit on one node) is not charged: the call's latencies
    are, as for any collective across dimensions."""
    dims = []
    for dim in network.dims:
        if dim.nvls is not None and dim.npus >= dim.nvls.min_npus:
            dim = replace(dim, nvls=None, bandwidth_bytes_per_s=(
                2 * (dim.npus - 1) / dim.npus * dim.nvls.bandwidth_bytes_per_s))
        dims.append(dim)
    if tuple(dims) == network.dims:
        return None
    return replace(network, dims=tuple(dims))


def _send_mean(network: Network, size: int) -> float:
    """Mean seconds of a send across the outermost and across the innermost dimension (one
    send across the only dimension of a one-dimension network), each at its send bandwidth
    plus its call latency; a send to the next rank when the outermost dimension gives no send
    bandwidth (:meth:`AxisNetworks.p2p`)."""
    if network.dims[-1].p2p_bandwidth_bytes_per_s is None:
        return (p2p_time(network, 0, 1, size, congestion=network.congestion)
                + network.dims[0].call_latency_s)
    sends = Network(dims=tuple(d.for_sends() for d in network.dims),
                    scheduling=network.scheduling, congestion=network.congestion)
    outer = network.npus // network.dims[-1].npus  # rank 0 and this differ in the last only
    times = [p2p_time(sends, 0, dst, size, congestion=network.congestion)
             + network.dims[0 if dst == 1 else -1].call_latency_s
             for dst in {1, outer}]
    return sum(times) / len(times)


def pairwise_all_to_all(network: Network, size: int, dedup_k: int | None = None) -> float:
    """Seconds for an all-to-all of ``size`` bytes per rank as NCCL runs it: pairwise sends,
    each rank sending ``size / n`` to every other rank once. A message travels over the outermost
    dimension in which the two ranks differ; the dimensions' links work at once, so the time is
    the slowest dimension's bytes over its link bandwidth, plus its latency: for a node of g GPUs
    in N nodes, ``size (N - 1) / N`` over the network between nodes and ``size (g - 1) / (g N)``
    inside the node. (ASTRA-sim's ring all-to-all forwards each piece hop by hop, about n/2
    times the bytes; its direct one gives every pair a link of its own: neither is a switch.)

    ``dedup_k``: ``size`` holds each token's ``k`` expert copies, and the dispatch sends a token
    once to each block of another dimension that holds any of its experts, which forwards it
    over the dimensions inside (DeepEP / HybridEP: one RDMA copy per remote node, then NVLink).
    With the experts spread evenly, a token reaches each of the ``n - 1`` other blocks of a
    dimension with probability ``1 - (1 - b / N)^k`` (blocks of ``b`` of the ``N`` ranks), so
    that dimension carries ``size / k (n - 1)(1 - (1 - b / N)^k)``: for 2 nodes at top-8, a
    quarter of the ``size (n - 1) / n`` above. The innermost dimension forwards every copy not
    for the rank it lands on: ``size (n - 1) / n``."""
    per_peer = size / network.npus
    inner, slowest = 1, 0.0
    for i, dim in enumerate(network.dims):
        if dedup_k is None:
            sent = per_peer * (dim.npus - 1) * inner
        elif i == 0:
            sent = size * (dim.npus - 1) / dim.npus
        else:
            hit = 1 - (1 - inner / network.npus) ** dedup_k
            sent = size / dedup_k * (dim.npus - 1) * hit
        slowest = max(slowest, sent / dim.bandwidth_bytes_per_s + dim.latency_s)
        inner *= dim.npus
    return slowest


_per_network: PerNetwork[dict[tuple, AxisNetworks]] = PerNetwork(lambda _: {})
"""Each network's axis sub-networks, by degrees and placement."""


def axis_networks(
    network: Network, degrees: Mapping[Axis, int], placement: tuple[Axis, ...],
    dp_shard: int | None = None, experts: tuple[int, int] | None = None,
) -> AxisNetworks:
    """The axis sub-networks of a placement, built once per Network object and placement (and
    HSDP's ``dp_shard``: the dp ranks of a shard group, None without HSDP)."""
    per_network = _per_network(network)
    key = (tuple(degrees[a] for a in Axis), placement, dp_shard, experts)
    found = per_network.get(key)
    if found is None:
        found = AxisNetworks(network, degrees, placement, dp_shard, experts)
        per_network[key] = found
    return found
