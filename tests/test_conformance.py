"""Every topology and collective algorithm passes simcore.testing's conformance suites."""

from __future__ import annotations

import pytest

from simcore.collectives import collective_time
from simcore.collectives._direct import DirectCollective
from simcore.collectives._double_binary_tree import DoubleBinaryTreeCollective
from simcore.collectives._halving_doubling import HalvingDoublingCollective
from simcore.collectives._ring import RingCollective
from simcore.network import Collective, Network, NetworkDim, Topology
from simcore.testing import CollectiveConformance, TopologyConformance
from simcore.topologies import FullyConnected, Mesh2D, Ring, Switch, Torus2D


class TestRingTopology(TopologyConformance):
    @pytest.fixture(params=[2, 5, 8])
    def topology(self, request):
        return Ring(request.param)


class TestFullyConnectedTopology(TopologyConformance):
    @pytest.fixture
    def topology(self):
        return FullyConnected(6)


class TestSwitchTopology(TopologyConformance):
    @pytest.fixture
    def topology(self):
        return Switch(6)


class TestMeshTopology(TopologyConformance):
    @pytest.fixture(params=[(16, 4), (12, 3)])
    def topology(self, request):
        return Mesh2D(*request.param)


class TestTorusTopology(TopologyConformance):
    @pytest.fixture(params=[(16, 4), (12, 4)])
    def topology(self, request):
        return Torus2D(*request.param)


class TestRingCollective(CollectiveConformance):
    @pytest.fixture
    def algorithm(self):
        return RingCollective()


class TestDirectOnRing(CollectiveConformance):
    @pytest.fixture
    def algorithm(self):
        return DirectCollective()


class TestDirectOnSwitch(CollectiveConformance):
    topology_kind = Topology.SWITCH

    @pytest.fixture
    def algorithm(self):
        return DirectCollective()


class TestHalvingDoubling(CollectiveConformance):
    @pytest.fixture
    def algorithm(self):
        return HalvingDoublingCollective()


class TestDoubleBinaryTree(CollectiveConformance):
    @pytest.fixture
    def algorithm(self):
        return DoubleBinaryTreeCollective()


def test_a_single_npu_sends_nothing() -> None:
    one = NetworkDim(topology=Topology.RING, npus=1, bandwidth_bytes_per_s=1e9, latency_s=1e-6)
    assert collective_time(Network(dims=(one,)), Collective.ALL_REDUCE, 2**20).time_s == 0


def test_ring_equals_its_hand_formula_for_two_npus() -> None:
    # all-gather on 2 NPUs: e + (n-1)(S(D) + e) with S(D) = trunc(500 + 2^20 / 53.6870912)
    # = trunc(500 + 19,531.25) = 20,031 -> 10 + 20,041 = 20,051 ns
    link = CollectiveConformance()._link(2)
    costs = CollectiveConformance._costs()
    assert RingCollective().phase_ns(Collective.ALL_GATHER, 2, 2**20, link, costs) == 20_051
