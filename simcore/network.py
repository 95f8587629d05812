"""Network specs: dimensions, collective algorithms and ASTRA-sim's collective scheduling knobs.

A network is an ordered tuple of :class:`NetworkDim`, innermost (dimension 0) first. A rank's
address is the rank decomposed with dimension 0 fastest: on ``4 x 2`` rank 5 is ``(1, 1)``.
All values are SI: bytes, seconds, bytes/s. Conversions from ASTRA-sim's units (network "GB/s"
meaning 2**30 B/s, local-mem-bw meaning 10**9 B/s, ns) live in :mod:`planner.units`.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Generic, TypeVar

__all__ = [
    "PerNetwork",
    "Collective",
    "SwitchAllReduce",
    "CollectiveAlgorithm",
    "AlgorithmChoice",
    "Topology",
    "NetworkDim",
    "SchedulingPolicy",
    "MultiDimOptimization",
    "CollectiveScheduling",
    "Congestion",
    "Network",
]


class Collective(StrEnum):
    """A collective operation, named as ASTRA-sim's workload names it."""

    ALL_REDUCE = "all-reduce"
    ALL_GATHER = "all-gather"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_TO_ALL = "all-to-all"


class CollectiveAlgorithm(StrEnum):
    """The algorithm that runs a collective on one network dimension (ASTRA-sim's names)."""

    RING = "ring"
    """Logical ring over the dimension's NPUs; neighbour to neighbour."""
    ONE_RING = "oneRing"
    """One ring over every NPU of the system, ignoring the dimensions."""
    DIRECT = "direct"
    """Every NPU exchanges with every other NPU of the dimension directly."""
    ONE_DIRECT = "oneDirect"
    """Direct over every NPU of the system, ignoring the dimensions."""
    HALVING_DOUBLING = "halvingDoubling"
    """Recursive halving (reduce) and doubling (gather) with peers at distance 1, 2, 4, ..."""
    ONE_HALVING_DOUBLING = "oneHalvingDoubling"
    """Halving-doubling over every NPU of the system, ignoring the dimensions."""
    DOUBLE_BINARY_TREE = "doubleBinaryTree"
    """Two binary trees (all-reduce only)."""


@dataclass(frozen=True, slots=True)
class AlgorithmChoice:
    """An algorithm and, for the direct family, its window (ASTRA-sim's ``direct4`` is window 4).

    ``window=None`` means ASTRA-sim's default: every peer at once.
    """

    algorithm: CollectiveAlgorithm
    window: int | None = None

    def __post_init__(self) -> None:
        if self.window is not None:
            if self.algorithm not in (CollectiveAlgorithm.DIRECT, CollectiveAlgorithm.ONE_DIRECT):
                raise ValueError(
                    f"a window applies only to direct and oneDirect, but got {self.algorithm}"
                    f" with window {self.window}"
                )
            if self.window < 1:
                raise ValueError(f"`window >= 1` must hold, but got window={self.window}")

    def __str__(self) -> str:
        return f"{self.algorithm}{self.window if self.window is not None else ''}"

    @classmethod
    def parse(cls, text: str) -> AlgorithmChoice:
        """Parse ASTRA-sim's spelling: ``ring``, ``direct``, ``direct8``, ``halvingDoubling``, ..."""
        for algorithm in (CollectiveAlgorithm.ONE_DIRECT, CollectiveAlgorithm.DIRECT):
            if text.startswith(algorithm.value) and text != algorithm.value:
                suffix = text[len(algorithm.value) :]
                if suffix.isdigit():
                    return cls(algorithm, int(suffix))
        try:
            return cls(CollectiveAlgorithm(text))
        except ValueError:
            known = ", ".join(a.value for a in CollectiveAlgorithm)
            raise ValueError(
                f"unknown collective algorithm {text!r}; known: {known} (direct and oneDirect"
                " take an optional window, e.g. direct4)"
            ) from None


class Topology(StrEnum):
    """The shape of one network dimension."""

    RING = "Ring"
    """Bidirectional ring; a message takes the shorter way round."""
    FULLY_CONNECTED = "FullyConnected"
    """A link between every pair of NPUs: 1 hop."""
    SWITCH = "Switch"
    """Every NPU on one switch: 2 hops (NPU -> switch -> NPU)."""
    MESH_2D = "Mesh2D"
    """A width x height mesh without wrap-around, XY (dimension-order) routing."""
    TORUS_2D = "Torus2D"
    """A width x height torus: a mesh with wrap-around links, shortest way along X then Y."""


class SchedulingPolicy(StrEnum):
    """Order in which ready chunks are served (ASTRA-sim ``scheduling-policy``)."""

    LIFO = "LIFO"
    FIFO = "FIFO"


class MultiDimOptimization(StrEnum):
    """How an all-reduce over several dimensions is phased (``collective-optimization``)."""

    LOCAL_BW_AWARE = "localBWAware"
    """Reduce-scatter up the dimensions, all-reduce on the last, all-gather back down."""
    BASELINE = "baseline"
    """A full all-reduce on every dimension in turn."""


def _default_algorithms() -> dict[Collective, AlgorithmChoice]:
    return {c: AlgorithmChoice(CollectiveAlgorithm.RING) for c in Collective}


@dataclass(frozen=True, slots=True)
class SwitchAllReduce:
    """An all-reduce the switch reduces itself (NVLink SHARP: NCCL's NVLS algorithm), which a
    communication library picks over its ring for a group of ``min_npus`` or more ranks on the
    dimension: each rank sends its data once and receives the sum once, so the time is
    ``latency_s + size / bandwidth_bytes_per_s`` whatever the group's size, where a ring's grows
    with ``2 (n - 1) / n``. The ring still serves where it is faster (small messages)."""

    bandwidth_bytes_per_s: float
    """What one rank's all-reduce reaches, bytes/s of the tensor (nccl-tests' algbw)."""
    latency_s: float
    """The fixed time of one call, seconds (launch, the switch's set-up and the ramp)."""
    min_npus: int
    """The smallest group the library runs it for."""

    def __post_init__(self) -> None:
        if not (self.bandwidth_bytes_per_s > 0 and math.isfinite(self.bandwidth_bytes_per_s)):
            raise ValueError("`nvls.bandwidth > 0` must hold, but got"
                             f" {self.bandwidth_bytes_per_s} B/s")
        if not (self.latency_s >= 0 and math.isfinite(self.latency_s)):
            raise ValueError(f"`nvls.latency >= 0` must hold, but got {self.latency_s} s")
        if self.min_npus < 2:
            raise ValueError(f"`nvls.min_npus >= 2` must hold, but got {self.min_npus}")

    def time_s(self, size_bytes: float) -> float:
        return self.latency_s + size_bytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkDim:
    """One dimension of the network: its topology, size, links and algorithms."""

    topology: Topology
    npus: int
    """NPUs along this dimension (for Mesh2D/Torus2D: width * height)."""
    bandwidth_bytes_per_s: float
    """Bandwidth of one link, bytes/s."""
    latency_s: float
    """Latency of one link (one hop), seconds."""
    algorithms: dict[Collective, AlgorithmChoice] = field(default_factory=_default_algorithms)
    """The algorithm each collective uses on this dimension."""
    width: int | None = None
    """Mesh2D/Torus2D only: NPUs along X; height is npus // width. None for other topologies."""
    call_latency_s: float = 0.0
    """Fixed cost of one collective or send/receive call on this dimension in a training step
    (a communication library's launch and protocol start, NCCL's base latency), on top of the
    per-hop latency. ASTRA-sim has no such term: 0 keeps its timing; the collective timing
    itself (:func:`simcore.collectives.collective_time`) never adds it."""
    p2p_bandwidth_bytes_per_s: float | None = None
    """What one send reaches over this dimension, bytes/s, where it differs from
    ``bandwidth_bytes_per_s``: a pipeline stage's activation to the next stage. A link between
    nodes fit on all-reduce tables with the hierarchical schedule (which sends each byte over
    the network once, where NCCL's ring sends it up to about twice) is slower than a send, which
    runs at the NIC's own rate, and so does a collective over one rank per node on this
    dimension (:mod:`simcore.megatron.placement`). None: the link bandwidth (ASTRA-sim has one
    bandwidth; its own systems never set this)."""
    per_communicator: bool = False
    """The communication library reaches ``bandwidth_bytes_per_s`` per GPU for one communicator
    spanning whole nodes, and several communicators crossing this dimension at once add up:
    what NCCL's InfiniBand verbs over Intel Omni-Path measure (a rate bound per connection, not
    per port). A group with ``L`` of a node's ``G`` ranks (the ranks inside this dimension)
    shares the node with ``G / L - 1`` others running the same collective, so each of its GPUs
    reaches ``G / L`` times the link bandwidth, and a send (``L = 1``) ``G`` times
    (:mod:`simcore.megatron.placement`). False: the links bound every group alike (ASTRA-sim,
    InfiniBand with a NIC per GPU)."""
    nvls: SwitchAllReduce | None = None
    """An all-reduce the switch reduces itself: a group on this dimension alone takes its time
    where faster, and a group across dimensions runs this dimension's phases at its rate
    (:class:`SwitchAllReduce`; :mod:`simcore.megatron.placement`). None: every collective runs
    at the link bandwidth (ASTRA-sim's own systems never set it)."""
    links: int | None = None
    """Where no switch joins this dimension's devices (NVLink GPU to GPU: a DGX-1's hybrid
    cube-mesh, a 4-GPU HGX board), the links each device has on it; a group of the plan then
    reaches only its own links (:attr:`group_links`). None: a switch, every group at the link
    bandwidth (ASTRA-sim's own systems never set it)."""
    group_links: tuple[tuple[int, int], ...] = ()
    """``(k, l)``: in a group of ``k`` of the dimension's devices, as the plan places them
    (consecutive ones), a device has ``l`` of its :attr:`links` to the group's other members,
    the fewest over the groups (``nvidia-smi topo -m``'s ``NV#`` summed; a strided group, dp
    over tp, is read as a consecutive one of its size). Such a group reaches
    ``l / links`` of ``bandwidth_bytes_per_s``, which is what a collective over all of the
    devices reaches (:meth:`group_bandwidth`); a size not listed reaches all of it. A part of
    a node (``npus`` fewer than the node's) keeps the node's sizes."""

    def __post_init__(self) -> None:
        if not (self.call_latency_s >= 0 and math.isfinite(self.call_latency_s)):
            raise ValueError(
                f"`call_latency >= 0` must hold, but got call_latency={self.call_latency_s} s")
        p2p = self.p2p_bandwidth_bytes_per_s
        if p2p is not None and not (p2p > 0 and math.isfinite(p2p)):
            raise ValueError(f"`p2p_bandwidth > 0` must hold, but got p2p_bandwidth={p2p} B/s")
        if self.npus < 1:
            raise ValueError(f"`npus >= 1` must hold, but got npus={self.npus}")
        if not (self.bandwidth_bytes_per_s > 0 and math.isfinite(self.bandwidth_bytes_per_s)):
            raise ValueError(
                f"`bandwidth > 0` must hold, but got bandwidth={self.bandwidth_bytes_per_s} B/s"
            )
        if not (self.latency_s >= 0 and math.isfinite(self.latency_s)):
            raise ValueError(f"`latency >= 0` must hold, but got latency={self.latency_s} s")
        if self.topology in (Topology.MESH_2D, Topology.TORUS_2D):
            if self.width is None or self.width < 1 or self.npus % self.width:
                raise ValueError(
                    f"a {self.topology} dimension needs a width that divides npus, but got"
                    f" width={self.width}, npus={self.npus}"
                )
        elif self.width is not None:
            raise ValueError(f"width applies only to Mesh2D and Torus2D, not {self.topology}")
        self._check_links()
        missing = [c.value for c in Collective if c not in self.algorithms]
        if missing:
            raise ValueError(f"no algorithm given for {', '.join(missing)}")

    def algorithm(self, collective: Collective) -> AlgorithmChoice:
        return self.algorithms[collective]

    def _check_links(self) -> None:
        if self.links is None:
            if self.group_links:
                raise ValueError("`group_links` needs `links`, the links a device has")
            return
        if self.links < 1:
            raise ValueError(f"`links >= 1` must hold, but got links={self.links}")
        for k, mine in self.group_links:
            if k < 2:
                raise ValueError(f"`group_links` sizes must be 2 or more, but got {k}")
            if not 1 <= mine <= self.links:
                raise ValueError(f"`group_links` of {k} devices must be from 1 to links="
                                 f"{self.links}, but got {mine}")

    def group_bandwidth(self, npus: int) -> float:
        """The link bandwidth a group of ``npus`` of this dimension's devices reaches: all of it
        through a switch, its share of the device's links without one (:attr:`group_links`)."""
        mine = dict(self.group_links).get(npus) if self.links is not None else None
        if mine is None:
            return self.bandwidth_bytes_per_s
        return self.bandwidth_bytes_per_s * mine / self.links

    def for_sends(self) -> NetworkDim:
        """This dimension as a send sees it: its link at ``p2p_bandwidth_bytes_per_s``."""
        if self.p2p_bandwidth_bytes_per_s is None:
            return self
        return replace(self, bandwidth_bytes_per_s=self.p2p_bandwidth_bytes_per_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveScheduling:
    """ASTRA-sim's system-layer knobs that decide how a collective is chunked and scheduled."""

    preferred_dataset_splits: int = 1
    """Chunks a collective is split into (before the minimum-chunk rule)."""
    active_chunks_per_dim: int = 1
    """Chunks that may run at once on one dimension."""
    endpoint_delay_s: float = 10e-9
    """Delay of each hand-off between the NPU and its network endpoint."""
    local_reduction_bandwidth_bytes_per_s: float = 1.6e12
    """Local memory bandwidth for the reduction of received data (3 accesses per byte)."""
    policy: SchedulingPolicy = SchedulingPolicy.LIFO
    optimization: MultiDimOptimization = MultiDimOptimization.LOCAL_BW_AWARE

    def __post_init__(self) -> None:
        if self.preferred_dataset_splits < 1:
            raise ValueError(
                "`preferred_dataset_splits >= 1` must hold, but got"
                f" {self.preferred_dataset_splits}"
            )
        if self.active_chunks_per_dim < 1:
            raise ValueError(
                f"`active_chunks_per_dim >= 1` must hold, but got {self.active_chunks_per_dim}"
            )
        if not (self.endpoint_delay_s > 0 and math.isfinite(self.endpoint_delay_s)):
            raise ValueError(
                f"`endpoint_delay > 0` must hold (ASTRA-sim aborts on 0), but got"
                f" {self.endpoint_delay_s} s"
            )
        bw = self.local_reduction_bandwidth_bytes_per_s
        if not (bw > 0 and math.isfinite(bw)):
            raise ValueError(f"`local_reduction_bandwidth > 0` must hold, but got {bw} B/s")


class Congestion(StrEnum):
    """Which network model times the messages (ASTRA-sim's two analytical backends)."""

    UNAWARE = "unaware"
    """ASTRA-sim's congestion-unaware backend: every message has its links to itself."""
    AWARE = "aware"
    """Flows that share a link queue on it; store-and-forward through switches and hops
    (ASTRA-sim's congestion-aware backend, :mod:`simcore.collectives._contention`)."""


@dataclass(frozen=True, slots=True, kw_only=True, weakref_slot=True)
class Network:
    """The network of a system: dimensions innermost first, and the collective scheduling."""

    dims: tuple[NetworkDim, ...]
    scheduling: CollectiveScheduling = field(default_factory=CollectiveScheduling)
    congestion: Congestion = Congestion.UNAWARE
    """How an estimate times this network's collectives and point-to-point messages (the
    study's ``congestion``, ``planner estimate --congestion``); ``collective_time`` and
    ``p2p_time`` take it as an argument."""

    def __post_init__(self) -> None:
        if not self.dims:
            raise ValueError("a network needs at least one dimension")
        if not isinstance(self.congestion, Congestion):
            raise TypeError(f"congestion must be one of {', '.join(Congestion)}, but got"
                             f" {self.congestion!r}")

    @property
    def npus(self) -> int:
        return math.prod(d.npus for d in self.dims)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(d.npus for d in self.dims)

    def address(self, rank: int) -> tuple[int, ...]:
        """The rank's coordinate per dimension, dimension 0 fastest.

        On a ``4 x 2`` network rank 5 = 1 + 4 * 1 is ``(1, 1)``.
        """
        self.check_rank(rank)
        coords = []
        for d in self.dims:
            rank, c = divmod(rank, d.npus)
            coords.append(c)
        return tuple(coords)

    def lowest_differing_dim(self, src: int, dst: int) -> int:
        """The lowest dimension in which two distinct ranks' addresses differ."""
        if src == dst:
            raise ValueError(f"src and dst must differ, but both are {src}")
        a, b = self.address(src), self.address(dst)
        return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)

    def check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.npus:
            raise ValueError(
                f"`0 <= rank < {self.npus}` must hold, but got rank={rank} (the network has"
                f" {self.npus} NPUs: {' x '.join(map(str, self.shape))})"
            )


_T = TypeVar("_T")


class PerNetwork(Generic[_T]):
    """A value derived from a :class:`Network` (``factory(network)``), made once and kept for as
    long as that network object lives. Kept by identity, since a Network holds dicts and does
    not hash; the entry goes when the network does, before its id can be reused."""

    def __init__(self, factory: Callable[[Network], _T]) -> None:
        self._factory = factory
        self._entries: dict[int, tuple[weakref.ref[Network], _T]] = {}

    def __call__(self, network: Network) -> _T:
        key = id(network)
        entry = self._entries.get(key)
        if entry is not None and entry[0]() is network:
            return entry[1]
        value = self._factory(network)
        self._entries[key] = (weakref.ref(network, lambda _: self._entries.pop(key, None)), value)
        return value
