"""Network-dimension topologies: hop counts (ASTRA-sim's rule) and routes (for contention)."""

from __future__ import annotations

from simcore.network import NetworkDim, Topology

from ._base import BaseTopology, Link
from ._fully_connected import FullyConnected
from ._limits import (
    MAX_ACTIVE_CHUNKS,
    MAX_DATASET_SPLITS,
    MAX_NPUS,
    algorithm_problem,
    network_size_problem,
)
from ._mesh import Mesh2D, Torus2D
from ._ring import Ring
from ._switch import Switch

__all__ = [
    "MAX_ACTIVE_CHUNKS",
    "MAX_DATASET_SPLITS",
    "MAX_NPUS",
    "BaseTopology",
    "FullyConnected",
    "Link",
    "Mesh2D",
    "Ring",
    "Switch",
    "Torus2D",
    "algorithm_problem",
    "build_topology",
    "network_size_problem",
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
