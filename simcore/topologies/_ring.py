from __future__ import annotations

from ._base import BaseTopology, Link


class Ring(BaseTopology):
    """A bidirectional ring: a message goes the shorter way round (clockwise on a tie).

    As ASTRA-sim's ``Ring::compute_hops_count``: hops = min(cw, n - cw), cw = (dst - src) mod n.
    """

    def _clockwise(self, src: int, dst: int) -> int:
        return (dst - src) % self.npus

    def _hops(self, src: int, dst: int) -> int:
        cw = self._clockwise(src, dst)
        return min(cw, self.npus - cw)

    def _route(self, src: int, dst: int) -> list[Link]:
        cw = self._clockwise(src, dst)
        step = 1 if cw <= self.npus - cw else -1
        nodes = [(src + step * i) % self.npus for i in range(self._hops(src, dst) + 1)]
        return list(zip(nodes, nodes[1:]))
