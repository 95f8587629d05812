"""Conformance suites that every topology and collective-algorithm implementation passes.

A test module subclasses a suite and supplies the implementation through a pytest fixture::

    class TestRing(TopologyConformance):
        @pytest.fixture
        def topology(self):
            return Ring(8)

The suites check invariants that hold for any implementation; each implementation's own tests
add the hand-derived figures.
"""

from __future__ import annotations

import itertools

import pytest

from simcore.collectives import BaseCollective
from simcore.collectives._base import Costs, Link
from simcore.network import Collective, NetworkDim, Topology
from simcore.topologies import BaseTopology

__all__ = ["TopologyConformance", "CollectiveConformance"]

GIB = 2**30


class TopologyConformance:
    """Routes are connected walks from src to dst whose length is the hop count."""

    @pytest.fixture
    def topology(self) -> BaseTopology:
        raise NotImplementedError("subclasses provide a `topology` fixture")

    def test_route_is_a_walk_from_src_to_dst(self, topology: BaseTopology) -> None:
        for src, dst in itertools.permutations(range(topology.npus), 2):
            links = topology.route(src, dst)
            assert links[0][0] == src and links[-1][1] == dst
            assert all(a[1] == b[0] for a, b in zip(links, links[1:]))
            assert topology.hops(src, dst) == len(links) >= 1

    def test_hops_are_symmetric(self, topology: BaseTopology) -> None:
        for src, dst in itertools.permutations(range(topology.npus), 2):
            assert topology.hops(src, dst) == topology.hops(dst, src)

    def test_no_route_to_itself(self, topology: BaseTopology) -> None:
        with pytest.raises(ValueError, match="must differ"):
            topology.hops(0, 0)


class CollectiveConformance:
    """Phase times are non-negative, grow with the data, and the ring of n = 2 agrees with a
    single exchange: with m bytes per message and one hand-off per step, an all-gather of D on
    two NPUs is ``e + (S(D) + e)`` for every algorithm that sends one message per step."""

    topology_kind: Topology = Topology.RING
    sizes: tuple[int, ...] = (4, 8, 16)

    @pytest.fixture
    def algorithm(self) -> BaseCollective:
        raise NotImplementedError("subclasses provide an `algorithm` fixture")

    def _link(self, n: int) -> Link:
        return Link(NetworkDim(topology=self.topology_kind, npus=n,
                               bandwidth_bytes_per_s=50 * GIB, latency_s=500e-9))

    @staticmethod
    def _costs() -> Costs:
        return Costs(endpoint_ns=10, local_mem_bytes_per_s=50e9)

    def _ops(self, algorithm: BaseCollective) -> list[Collective]:
        return [op for op in Collective if op in algorithm.supports]

    def test_time_is_positive(self, algorithm: BaseCollective) -> None:
        for n, op in itertools.product(self.sizes, self._ops(algorithm)):
            algorithm.check(op, n)
            assert algorithm.phase_ns(op, n, 2**20, self._link(n), self._costs()) > 0

    def test_time_grows_with_bytes(self, algorithm: BaseCollective) -> None:
        for n, op in itertools.product(self.sizes, self._ops(algorithm)):
            times = [algorithm.phase_ns(op, n, b, self._link(n), self._costs())
                     for b in (2**12, 2**16, 2**20, 2**24)]
            assert times == sorted(times), (n, op, times)

    def test_output_bytes(self, algorithm: BaseCollective) -> None:
        # ASTRA-sim final_data_size: reduce-scatter divides by n, all-gather multiplies
        assert algorithm.output_bytes(Collective.REDUCE_SCATTER, 8, 2**20) == 2**17
        assert algorithm.output_bytes(Collective.ALL_GATHER, 8, 2**17) == 2**20
        assert algorithm.output_bytes(Collective.ALL_REDUCE, 8, 2**20) == 2**20
