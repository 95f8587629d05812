"""The collective-algorithm plug-in interface and the per-message cost rules of ASTRA-sim.

All times here are integer nanoseconds, ASTRA-sim's event tick, so that every truncation of
the simulator is reproduced exactly; :mod:`simcore.collectives` converts to seconds at the end.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass

from simcore.network import Collective, CollectiveScheduling, NetworkDim, Topology
from simcore.topologies import BaseTopology, build_topology

NS_PER_S = 1e9


def to_ns(seconds: float) -> float:
    """Seconds -> ns, rounded to the picosecond (500e-9 s is exactly 500.0 ns again)."""
    return round(seconds * NS_PER_S, 3)


@dataclass(frozen=True, slots=True)
class Costs:
    """Per-NPU costs of the system layer: the endpoint hand-off and the local reduction.

    ASTRA-sim ``MemBus``: every packet hand-off costs ``endpoint_ns``. ``PacketBundle``: a
    processed (reduced) message costs ``3 * trunc(bytes / local_mem_bw * 1e9)`` ns: two reads
    and one write at local-mem-bw (decimal bytes/s).
    """

    endpoint_ns: int
    local_mem_bytes_per_s: float

    @classmethod
    def of(cls, scheduling: CollectiveScheduling, *, endpoint_ns: int | None = None) -> Costs:
        ed = endpoint_ns if endpoint_ns is not None else int(to_ns(scheduling.endpoint_delay_s))
        return cls(ed, scheduling.local_reduction_bandwidth_bytes_per_s)

    def reduce_ns(self, message_bytes: int) -> int:
        return 3 * int(message_bytes / self.local_mem_bytes_per_s * NS_PER_S)


class Link:
    """Message timing on one network dimension, congestion-unaware.

    ASTRA-sim ``BasicTopology::compute_communication_delay``: ``trunc(hops * latency + bytes /
    bw)`` with bw in bytes/ns. A message to logical offset ``j`` on the dimension's ring goes
    ``hops(i, i + j)`` hops; on Ring, Switch and FullyConnected that is the same from every
    NPU; on Mesh2D and Torus2D it is not, and the worst NPU is used
    (:meth:`BaseTopology.offset_hops`).
    """

    def __init__(self, dim: NetworkDim) -> None:
        self.dim = dim
        self.npus = dim.npus
        self.latency_ns = to_ns(dim.latency_s)
        self.bytes_per_ns = dim.bandwidth_bytes_per_s / NS_PER_S
        self.topology: BaseTopology = build_topology(dim)
        self.uniform = dim.topology in (Topology.SWITCH, Topology.FULLY_CONNECTED)
        """Every offset has the same hop count (Switch, FullyConnected)."""
        self._hop_latency: dict[int, float] = {}

    def hops(self, offset: int) -> int:
        """Hops to the NPU ``offset`` places further on the dimension's ring (the worst NPU's)."""
        return self.topology.offset_hops(offset)

    def hop_latency_ns(self, offset: int) -> float:
        """``hops(offset) * latency``, the latency term of a message to ``offset`` (a property
        of the dimension, kept per offset)."""
        latency = self._hop_latency.get(offset)
        if latency is None:
            latency = self._hop_latency[offset] = self.hops(offset) * self.latency_ns
        return latency

    def message_terms(self, offset: int) -> tuple[float, float]:
        """``(hops(offset) * latency, bytes per ns)``: a message of ``b`` bytes to ``offset``
        takes ``int(latency + b / bytes_per_ns)`` ns (:meth:`send_ns`)."""
        return self.hop_latency_ns(offset), self.bytes_per_ns

    def send_ns(self, offset: int, message_bytes: int) -> int:
        """One message to the NPU ``offset`` places further on this dimension's ring."""
        return int(self.hop_latency_ns(offset) + message_bytes / self.bytes_per_ns)

    def message_ns(self, hops: int, message_bytes: int) -> int:
        return int(hops * self.latency_ns + message_bytes / self.bytes_per_ns)


class BaseCollective(abc.ABC):
    """A collective algorithm on one network dimension (one phase of one chunk).

    Lifecycle: the scheduler splits a collective into chunks and each chunk into phases, one
    per network dimension it crosses (:mod:`simcore.collectives._schedule`). For every phase it
    asks the algorithm of that dimension for :meth:`phase_ns`, the time from the phase's start
    (the stream's first hand-off) to its exit, for one chunk of ``data_bytes`` on a ring of
    ``n`` NPUs, all NPUs of the dimension acting alike; and for :meth:`output_bytes`, the data
    the next phase receives. Implementations are stateless.
    """

    name: str
    supports: frozenset[Collective] = frozenset(Collective)

    def check(self, op: Collective, n: int) -> None:
        """Raise ValueError if this algorithm cannot run ``op`` on ``n`` NPUs."""
        if op not in self.supports:
            raise ValueError(f"{self.name} cannot run {op} (ASTRA-sim exits); use ring or direct")

    @abc.abstractmethod
    def phase_ns(self, op: Collective, n: int, data_bytes: int, link: Link, costs: Costs) -> int:
        """Duration of one phase of one chunk, in ns."""

    def phase_fn(self, op: Collective, n: int, link: Link, costs: Costs) -> Callable[[int], int]:
        """:meth:`phase_ns` as a function of ``data_bytes`` alone: what a compiled network keeps
        per phase. This default wraps :meth:`phase_ns`; an algorithm may return a faster
        equivalent (and define :meth:`phase_ns` through it)."""
        return lambda data_bytes: self.phase_ns(op, n, data_bytes, link, costs)

    def output_bytes(self, op: Collective, n: int, data_bytes: int) -> int:
        """Bytes per NPU after the phase (ASTRA-sim's ``final_data_size``)."""
        if op is Collective.REDUCE_SCATTER:
            return data_bytes // n
        if op is Collective.ALL_GATHER:
            return data_bytes * n
        return data_bytes

    def output_fn(self, op: Collective, n: int) -> Callable[[int], int]:
        """:meth:`output_bytes` as a function of ``data_bytes`` alone (for a compiled network)."""
        if type(self).output_bytes is not BaseCollective.output_bytes:
            return lambda data_bytes: self.output_bytes(op, n, data_bytes)
        if op is Collective.REDUCE_SCATTER:
            return lambda data_bytes: data_bytes // n
        if op is Collective.ALL_GATHER:
            return lambda data_bytes: data_bytes * n
        return lambda data_bytes: data_bytes
