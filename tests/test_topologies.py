"""Hop counts and routes of every topology, checked against hand-drawn examples."""

from __future__ import annotations

import pytest

from simcore.network import Network, NetworkDim, Topology
from simcore.topologies import FullyConnected, Mesh2D, Ring, Switch, Torus2D


def test_mesh2d_xy_routes_from_the_design() -> None:
    # design.md / issue 3: on a 4x4 mesh (node = x + 4y) XY routing goes along X first, then Y:
    # 1 -> 2 -> 3 -> 7 and 14 -> 13 -> 9 -> 5.
    mesh = Mesh2D(16, width=4)
    assert mesh.path(1, 7) == [1, 2, 3, 7]
    assert mesh.path(14, 5) == [14, 13, 9, 5]
    assert mesh.hops(1, 7) == 3
    # corner to corner: 3 steps along X and 3 along Y, no wrap-around
    assert mesh.hops(0, 15) == 6


def test_torus2d_takes_the_wraparound_when_shorter() -> None:
    torus = Torus2D(16, width=4)
    # (0,0) -> (3,0): one step backwards over the wrap link instead of three forwards
    assert torus.path(0, 3) == [0, 3]
    # (0,0) -> (3,3): X first (0 -> 3 by wrap), then Y (3 -> 15 by wrap)
    assert torus.path(0, 15) == [0, 3, 15]


@pytest.mark.parametrize(
    ("n", "src", "dst", "hops"),
    # ASTRA-sim Ring::compute_hops_count: min(cw, n - cw), cw = (dst - src) mod n
    [(8, 0, 1, 1), (8, 0, 7, 1), (8, 0, 4, 4), (8, 2, 7, 3), (16, 3, 12, 7)],
)
def test_ring_hops_are_the_shorter_way_round(n: int, src: int, dst: int, hops: int) -> None:
    ring = Ring(n)
    assert ring.hops(src, dst) == hops
    assert len(ring.route(src, dst)) == hops
    assert ring.path(src, dst)[-1] == dst


def test_switch_and_fully_connected_hops() -> None:
    # ASTRA-sim: Switch is 2 hops (NPU -> switch -> NPU), FullyConnected 1 hop
    assert Switch(8).path(3, 5) == [3, 8, 5]
    assert FullyConnected(8).path(3, 5) == [3, 5]


def test_bad_ranks_are_rejected() -> None:
    with pytest.raises(ValueError, match="0 <= dst < 8"):
        Ring(8).hops(0, 8)
    with pytest.raises(ValueError, match="must differ"):
        Ring(8).hops(2, 2)


def _dim(n: int) -> NetworkDim:
    return NetworkDim(topology=Topology.RING, npus=n, bandwidth_bytes_per_s=1e9, latency_s=1e-7)


def test_rank_address_is_dimension_0_fastest() -> None:
    # 4 x 2 network: rank = a0 + 4 * a1, so rank 5 = (1, 1) and rank 6 = (2, 1)
    net = Network(dims=(_dim(4), _dim(2)))
    assert net.address(5) == (1, 1)
    assert net.address(6) == (2, 1)
    # ASTRA-sim MultiDimTopology::send times a message on the lowest differing dimension:
    # 0 = (0,0) and 4 = (0,1) differ only in dim 1; 1 = (1,0) and 4 = (0,1) differ first in dim 0
    assert net.lowest_differing_dim(0, 4) == 1
    assert net.lowest_differing_dim(1, 4) == 0
    with pytest.raises(ValueError, match="0 <= rank < 8"):
        net.address(8)
