from __future__ import annotations

from collections.abc import Sequence

from simcore.network import Network

from ._base import Link


class FlatLink:
    """The one ring over all NPUs of ``oneRing`` / ``oneHalvingDoubling``.

    A message to flat offset ``o`` from an NPU whose partner stays in the same block of the
    lower dimensions is timed on the dimension ``d`` whose stride ``s`` has ``s <= o < s * n_d``,
    at local offset ``o / s`` (ASTRA-sim's lowest-differing-dimension rule). Neighbour hops
    (offset 1) are always on dimension 0, the wrap-around included.
    """

    uniform = False

    def __init__(self, network: Network, links: Sequence[Link]) -> None:
        self.network = network
        self.links = links
        self.npus = network.npus

    def _local(self, offset: int) -> tuple[Link, int]:
        stride = 1
        for link in self.links:
            if offset < stride * link.npus:
                return link, offset // stride
            stride *= link.npus
        raise ValueError(f"offset {offset} is outside the {self.npus}-NPU ring")

    def message_terms(self, offset: int) -> tuple[float, float]:
        link, local = self._local(offset)
        return link.message_terms(local)

    def send_ns(self, offset: int, message_bytes: int) -> int:
        link, local = self._local(offset)
        return link.send_ns(local, message_bytes)
