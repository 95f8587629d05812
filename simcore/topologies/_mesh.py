from __future__ import annotations

from ._base import BaseTopology, Link


class Mesh2D(BaseTopology):
    """A ``width x height`` mesh, node ``x + width * y``, with XY (dimension-order) routing.

    Links join X and Y neighbours only, both ways: a corner NPU has 2, an edge NPU 3, the others
    4. A message first moves along X to the destination's column, then along Y. On a 4 x 4 mesh
    the route from 1 to 7 is 1 -> 2 -> 3 -> 7, and from 14 to 5 is 14 -> 13 -> 9 -> 5 (the
    ASTRA-sim lab, Part 1, "Connectivity of 2D Mesh" and "xy routing of 2D Mesh").
    """

    wraps = False
    vertex_transitive = False

    def __init__(self, npus: int, width: int) -> None:
        super().__init__(npus)
        if width < 1 or npus % width:
            raise ValueError(f"width must divide npus, but got width={width}, npus={npus}")
        self.width = width
        self.height = npus // width

    def _steps(self, a: int, b: int, size: int) -> list[int]:
        """Coordinates visited from a to b along one axis (a excluded)."""
        forward = (b - a) % size if self.wraps else b - a
        if self.wraps and forward > size - forward:
            step, count = -1, size - forward
        else:
            step, count = (1, forward) if forward >= 0 else (-1, -forward)
        return [(a + step * i) % size for i in range(1, count + 1)]

    def _route(self, src: int, dst: int) -> list[Link]:
        (sx, sy), (dx, dy) = divmod(src, self.width)[::-1], divmod(dst, self.width)[::-1]
        nodes = [src]
        nodes += [x + self.width * sy for x in self._steps(sx, dx, self.width)]
        nodes += [dx + self.width * y for y in self._steps(sy, dy, self.height)]
        return list(zip(nodes, nodes[1:]))

    def _hops(self, src: int, dst: int) -> int:
        return len(self._route(src, dst))

    def offset_hops(self, offset: int) -> int:
        """As :meth:`BaseTopology.offset_hops` (the worst NPU), in closed form rather than NPU
        by NPU, so a large mesh costs no more than a small one.

        Write ``offset = a + width * b``. From ``(x, y)`` the target is ``x + a`` (minus
        ``width`` with a carry c = 1, possible when a > 0) and ``(y + b + c) mod height``; the
        worst row gives the longest Y move. XY routing: the mesh moves ``a`` or ``width - a``
        along X, and along Y ``b + c`` (no wrap past the last row) or ``height - b - c``; the
        torus moves the shorter way on each axis."""
        offset %= self.npus
        if offset == 0:
            return 0
        b, a = divmod(offset, self.width)
        h = self.height
        worst = 0
        for carry in (0, 1) if a else (0,):
            forward = b + carry
            if self.wraps:
                dy = forward % h
                hops = min(a, self.width - a) + min(dy, h - dy)
            else:
                dx = self.width - a if carry else a
                moves = ([forward] if forward < h else []) + ([h - forward] if forward else [])
                hops = dx + max(moves)
            worst = max(worst, hops)
        return worst


class Torus2D(Mesh2D):
    """A ``width x height`` torus: the mesh with wrap-around links, shortest way along X, then Y.

    A tie (half-way round) goes forward, +1: a torus in ASTRA-sim is Ring x Ring, and its
    congestion-aware ``Ring::route`` turns anticlockwise only when that is strictly shorter
    (astra-network-analytical 599a047, ``congestion_aware/basic-topology/Ring.cpp``)."""

    wraps = True
