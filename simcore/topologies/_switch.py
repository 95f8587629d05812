from __future__ import annotations

from ._base import BaseTopology, Link


class Switch(BaseTopology):
    """Every NPU on one switch (node index ``npus``): NPU -> switch -> NPU, 2 hops."""

    @property
    def switch(self) -> int:
        return self.npus

    def _hops(self, src: int, dst: int) -> int:
        return 2

    def _route(self, src: int, dst: int) -> list[Link]:
        return [(src, self.switch), (self.switch, dst)]
