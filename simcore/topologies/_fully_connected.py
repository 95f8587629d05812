from __future__ import annotations

from ._base import BaseTopology, Link


class FullyConnected(BaseTopology):
    """A direct link between every pair of NPUs: always 1 hop."""

    def _hops(self, src: int, dst: int) -> int:
        return 1

    def _route(self, src: int, dst: int) -> list[Link]:
        return [(src, dst)]
