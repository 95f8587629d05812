"""Network-dimension topologies: hop counts (ASTRA-sim's rule) and routes (for contention)."""

from __future__ import annotations

from simcore.network import NetworkDim, Topology

from ._base import BaseTopology, Link
from ._fully_connected import FullyConnected
from ._mesh import Mesh2D, Torus2D
from ._ring import Ring
from ._switch import Switch

__all__ = [
    "BaseTopology",
    "Link",
    "Ring",
    "FullyConnected",
    "Switch",
    "Mesh2D",
    "Torus2D",
    "build_topology",
]


def build_topology(dim: NetworkDim) -> BaseTopology:
    """The topology object for one network dimension."""
    if dim.topology is Topology.RING:
        return Ring(dim.npus)
    if dim.topology is Topology.FULLY_CONNECTED:
        return FullyConnected(dim.npus)
    if dim.topology is Topology.SWITCH:
        return Switch(dim.npus)
    assert dim.width is not None  # NetworkDim validates this
    if dim.topology is Topology.MESH_2D:
        return Mesh2D(dim.npus, dim.width)
    return Torus2D(dim.npus, dim.width)
