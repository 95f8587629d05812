"""The topology plug-in interface."""

from __future__ import annotations

import abc

Link = tuple[int, int]
"""A directed link between two nodes of one dimension (NPUs are 0..n-1, a switch is n)."""


class BaseTopology(abc.ABC):
    """The shape of one network dimension: how many hops a message takes, and over which links.

    Lifecycle: built once per network dimension from its :class:`simcore.network.NetworkDim`;
    then asked, for pairs of NPU indices local to that dimension, for the hop count (what
    ASTRA-sim's congestion-unaware backend charges latency for) and for the route (the links a
    message occupies, which the contention model shares among concurrent flows). Implementations
    are stateless after construction and must satisfy ``hops(a, b) == len(route(a, b))``.
    """

    vertex_transitive = True
    """``hops(i, (i + j) % npus)`` is the same for every NPU i (Ring, Switch, FullyConnected);
    false for meshes and tori, whose index order does not shift coordinates uniformly."""

    def __init__(self, npus: int) -> None:
        if npus < 1:
            raise ValueError(f"`npus >= 1` must hold, but got npus={npus}")
        self.npus = npus
        self._offset_hops: dict[int, int] = {}

    def offset_hops(self, offset: int) -> int:
        """Hops from an NPU to the one ``offset`` places further in index order (mod npus),
        for the worst NPU: what a collective's logical ring over this dimension pays per step.
        """
        offset %= self.npus
        hops = self._offset_hops.get(offset)
        if hops is None:
            n = self.npus
            if offset == 0:
                hops = 0
            elif self.vertex_transitive:
                hops = self._hops(0, offset)
            else:
                hops = max(self._hops(i, (i + offset) % n) for i in range(n))
            self._offset_hops[offset] = hops
        return hops

    def hops(self, src: int, dst: int) -> int:
        """Links a message from ``src`` to ``dst`` crosses."""
        self._check(src, dst)
        return self._hops(src, dst)

    def route(self, src: int, dst: int) -> list[Link]:
        """The directed links, in order, from ``src`` to ``dst``."""
        self._check(src, dst)
        return self._route(src, dst)

    def path(self, src: int, dst: int) -> list[int]:
        """The nodes visited from ``src`` to ``dst``, both included."""
        links = self.route(src, dst)
        return [links[0][0], *(b for _, b in links)]

    @abc.abstractmethod
    def _hops(self, src: int, dst: int) -> int: ...

    @abc.abstractmethod
    def _route(self, src: int, dst: int) -> list[Link]: ...

    def _check(self, src: int, dst: int) -> None:
        for name, v in (("src", src), ("dst", dst)):
            if not 0 <= v < self.npus:
                raise ValueError(f"`0 <= {name} < {self.npus}` must hold, but got {name}={v}")
        if src == dst:
            raise ValueError(f"src and dst must differ, but both are {src}")
