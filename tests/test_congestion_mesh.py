"""The congestion-aware model beyond one Ring / Switch / FullyConnected dimension: Mesh2D and
Torus2D (XY routing), several dimensions, sub-groups.

Sources:
- the ASTRA-sim lab (shared seeds, 000_e13c9ab14088c0d8.txt, Part 1, "Connectivity of 2D Mesh"
  and "xy routing of 2D Mesh"): the mesh's links and its routes;
- astra-network-analytical 599a047 (the commit the measured runs used),
  ``congestion_aware/network/Link.cpp`` and ``basic-topology/Ring.cpp``: a link is a FIFO, busy
  ``trunc(m / B)``, the next node reached ``trunc(L + m / B)`` after the start (store-and-
  forward); a ring goes anticlockwise only when that is strictly shorter;
- tests/data/astra_microbench.csv: the measured Congestion_Aware rows (ASTRA-sim 518bd51);
- hand calculations in the comments. Unless a test says otherwise: links of 1 B/ns (1e9 B/s)
  and 100 ns, so a message of m bytes holds a link ``s = m`` ns and reaches the next node
  ``c = 100 + m`` ns after it starts; hand-off ``e = 10`` ns.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from simcore.collectives import Congestion, collective_time, p2p_time
from simcore.network import (
    AlgorithmChoice,
    Collective,
    CollectiveScheduling,
    Network,
    NetworkDim,
    Topology,
)
from simcore.topologies import Mesh2D, Torus2D

from .astra_rows import measured_runs
from .test_collectives_astra import GIB, tutorial

AWARE = Congestion.AWARE
MEASURED = measured_runs("Congestion_Aware")


def dim(topology: Topology, npus: int, width: int | None = None, algorithm: str = "ring",
        bytes_per_s: float = 1e9, latency_s: float = 100e-9) -> NetworkDim:
    return NetworkDim(topology=topology, npus=npus, width=width, bandwidth_bytes_per_s=bytes_per_s,
                      latency_s=latency_s,
                      algorithms={c: AlgorithmChoice.parse(algorithm) for c in Collective})


def network(*dims: NetworkDim, splits: int = 1, active: int = 1) -> Network:
    return Network(dims=dims, scheduling=CollectiveScheduling(
        preferred_dataset_splits=splits, active_chunks_per_dim=active, endpoint_delay_s=10e-9))


def ns(net: Network, op: Collective, size: int, congestion: Congestion = AWARE,
       group: list[int] | None = None) -> int:
    return collective_time(net, op, size, congestion=congestion, group=group).time_ns


def test_mesh_links_and_routes_are_the_labs() -> None:
    # Lab Part 1: on the 4 x 4 mesh the corners 0, 3, 12, 15 have 2 neighbours, the other edge
    # NPUs 3 and the centre ones 4; XY routing takes 1 -> 2 -> 3 -> 7 and 14 -> 13 -> 9 -> 5.
    mesh = Mesh2D(16, width=4)
    neighbours = {a: {mesh.route(a, b)[0][1] for b in range(16) if b != a} for a in range(16)}
    corners, centre = {0, 3, 12, 15}, {5, 6, 9, 10}
    assert {a: len(v) for a, v in neighbours.items()} == {
        a: 2 if a in corners else 4 if a in centre else 3 for a in range(16)}
    assert mesh.path(1, 7) == [1, 2, 3, 7]
    assert mesh.path(14, 5) == [14, 13, 9, 5]


def test_torus_ties_go_the_way_a_ring_breaks_them() -> None:
    # A 4 x 4 torus is ASTRA-sim's Ring(4) x Ring(4); Ring::route (Ring.cpp) goes anticlockwise
    # only when strictly shorter, so a tie (2 of 4 either way) goes forward, wrap-around included.
    torus = Torus2D(16, width=4)
    assert torus.path(0, 2) == [0, 1, 2]
    assert torus.path(2, 0) == [2, 3, 0]
    assert torus.path(0, 8) == [0, 4, 8]
    assert torus.path(3, 0) == [3, 0]  # 1 hop back over the wrap-around, not 3 forward


def test_all_to_all_on_a_2x2_mesh_collides_by_hand() -> None:
    # NPUs 0 = (0,0), 1 = (1,0), 2 = (0,1), 3 = (1,1); direct, 4,000 B, 1 chunk: m = 1,000 B to
    # each of the offsets 1, 2, 3, sent in that order at t = e = 10; s = 1,000, c = 1,100.
    # XY routes: 0 to 1 [0->1], to 2 [0->2], to 3 [0->1, 1->3]; 1 to 2 [1->0, 0->2], to 3
    # [1->3], to 0 [1->0]; 2 to 3 [2->3], to 0 [2->0], to 1 [2->3, 3->1]; 3 to 0 [3->2, 2->0],
    # to 1 [3->1], to 2 [3->2]. Each NPU's offsets 1 and 3 share its first link, so the offset-3
    # message starts s = 1,000 late: one hop, it arrives at 10 + 1,000 + c = 2,110 (1 to 0,
    # 3 to 2); two hops (0 to 3, 2 to 1), at 10 + 1,000 + 2c = 3,210, its second link (1->3,
    # 3->1) being free by then. Every other message arrives by 10 + 2c = 2,210. NPUs 3 and 1
    # receive last, at 3,210; one hand-off later: 3,220 ns.
    # Unaware: 2e + trunc(2 hops * 100 + 1,000) = 1,220 (the worst NPU's hops, no queueing).
    mesh = network(dim(Topology.MESH_2D, 4, 2, "direct"))
    assert ns(mesh, Collective.ALL_TO_ALL, 4000) == 3_220
    assert ns(mesh, Collective.ALL_TO_ALL, 4000, Congestion.UNAWARE) == 1_220


def test_ring_all_gather_on_a_3x2_torus_by_hand() -> None:
    # 3 x 2 torus, ring 0 -> 1 -> ... -> 5 -> 0: hops into each NPU h = [2, 1, 1, 2, 1, 1]
    # (2 -> 3 is 2 -> 0 over the X wrap-around, then 0 -> 3; 5 -> 0 is 5 -> 3 -> 0). No two
    # ring flows share a link. all-gather of 1,000 B, 1 chunk: K = 5 sends of m = 1,000 B,
    # c = 1,100. A send follows the receive of the previous step after e, and the receive is
    # at max(arrival, own send), so NPU i finishes at (K + 1) e + c * (the K hops met walking
    # back from i): at most 8 - 1 = 7 of the ring's 8, so 60 + 7 * 1,100 = 7,760 ns.
    # The same mesh without wrap-around: h = [3, 1, 1, 3, 1, 1], 10 - 1 = 9: 60 + 9,900.
    assert ns(network(dim(Topology.TORUS_2D, 6, 3)), Collective.ALL_GATHER, 1000) == 7_760
    assert ns(network(dim(Topology.MESH_2D, 6, 3)), Collective.ALL_GATHER, 1000) == 9_960


@pytest.mark.parametrize("run", [r for r in MEASURED if r.network.dims[0].topology is Topology.RING
                                 and "halvingDoubling" not in r.case], ids=lambda r: r.case)
@pytest.mark.parametrize("width", ["one row", "one column"])
def test_a_torus_of_one_row_is_astra_sims_ring(run, width: str) -> None:
    # An n x 1 (or 1 x n) torus is a ring with the same tie rule, simulated NPU by NPU over
    # real routes: it must give ASTRA-sim's measured congestion-aware Ring figures.
    ring = run.network.dims[0]
    torus = replace(ring, topology=Topology.TORUS_2D,
                    width=ring.npus if width == "one row" else 1)
    net = replace(run.network, dims=(torus,))
    assert ns(net, run.collective, run.size_bytes) == run.measured_ns


@pytest.mark.parametrize("run", MEASURED, ids=lambda r: r.case)
def test_a_dimension_of_one_npu_changes_nothing(run) -> None:
    # A trailing dimension of size 1 sends the collective through the multi-dimensional model
    # (mirrored NPUs, per-dimension queues); it must still give the measured figure.
    extra = replace(run.network.dims[0], npus=1)
    net = replace(run.network, dims=(*run.network.dims, extra))
    assert ns(net, run.collective, run.size_bytes) == run.measured_ns


def test_multi_dimensional_all_gather_by_hand() -> None:
    # Mesh2D 2 x 2 (dim 0) x Switch(2) (dim 1), all-gather of 500 B, 1 chunk; all-gather runs
    # the dimensions downwards. Each dimension's flows stay on its own links.
    # Dim 1, Switch, ring of 2: one send of 500 B through NPU -> switch -> NPU, store-and-
    # forward 2 * trunc(100 + 500) = 1,200: e + 1,200 + e = 1,220 (every NPU alike).
    # Dim 0, the 2 x 2 mesh, ring 0 -> 1 -> 2 -> 3 with 1,000 B per send (c = 1,100): hops into
    # each NPU h = [2, 1, 2, 1] (1 -> 2 is 1 -> 0 -> 2, 3 -> 0 is 3 -> 2 -> 0), no shared link;
    # K = 3 sends: (K + 1) e + c * (at most 6 - 1 = 5 hops) = 40 + 5,500 = 5,540.
    # Total 1,220 + 5,540 = 6,760 ns. Unaware: dim 1 e + trunc(200 + 500) + e = 720; dim 0 with
    # the worst NPU's 2 hops every step: e + 3 (trunc(200 + 1,000) + e) = 3,640; 4,360 ns.
    net = network(dim(Topology.MESH_2D, 4, 2), dim(Topology.SWITCH, 2))
    assert ns(net, Collective.ALL_GATHER, 500) == 6_760
    assert ns(net, Collective.ALL_GATHER, 500, Congestion.UNAWARE) == 4_360


def test_measured_two_dimensional_case_with_contention_by_hand() -> None:
    # NOTES.md 3.3 (measured unaware: 88,760 ns), Ring(4) x Switch(4), 1 MiB, tutorial system.
    # Aware, dim 0's ring phases use neighbour links one chunk at a time: unchanged, RS 16,990
    # and AG 5,200 per chunk. Dim 1's all-reduce on the Switch, m = 16,384 B: each send is
    # store-and-forward, 2 * trunc(500 + 305.2) = 1,610 instead of 1,305:
    # 10 + 6 * (1,610 + 10) + 3 * 981 = 12,673 per chunk, still hidden behind dim 0's
    # 22,190 per chunk, so the total stays 4 * 22,190 = 88,760 ns.
    ring = dim(Topology.RING, 4, bytes_per_s=50 * GIB, latency_s=500e-9)
    switch = dim(Topology.SWITCH, 4, bytes_per_s=50 * GIB, latency_s=500e-9)
    net = Network(dims=(ring, switch), scheduling=tutorial().scheduling)
    assert ns(net, Collective.ALL_REDUCE, 2**20) == 88_760
    # Swapped, the Switch is dim 0 and carries the 262,144-B chunks' reduce-scatter and
    # all-gather, which store-and-forward makes the bottleneck: slower than unaware.
    swapped = Network(dims=(switch, ring), scheduling=tutorial().scheduling)
    assert ns(swapped, Collective.ALL_REDUCE, 2**20) > ns(swapped, Collective.ALL_REDUCE, 2**20,
                                                          Congestion.UNAWARE)


@pytest.mark.parametrize("op", list(Collective))
def test_neighbour_rings_one_chunk_at_a_time_share_no_link(op: Collective) -> None:
    # Ring x Ring x Ring with ring everywhere and one active chunk per dimension: every message
    # goes to a neighbour and no two are ever on one link, so the aware model must agree with
    # the unaware one (checked against the measured rows) across phases and queues.
    rings = [dim(Topology.RING, 4, bytes_per_s=100 * GIB, latency_s=500e-9)] * 3
    net = network(*rings, splits=10, active=1)
    for size in (2**20, 3 * 2**20 + 17):
        assert ns(net, op, size) == ns(net, op, size, Congestion.UNAWARE)


def test_sub_group_on_a_mesh_by_hand() -> None:
    # Group [0, 3] on the 2 x 2 mesh: 0 -> 3 is [0->1, 1->3], 3 -> 0 is [3->2, 2->0].
    # all-gather of 2,000 B, splits 2: 2 chunks of 1,000 B, both active. Each NPU sends both
    # chunks at t = 10 over the same route: the second waits s = 1,000 on the first link.
    # Arrivals: 10 + 2c = 2,210 and 10 + s + 2c = 3,210; the last hand-off: 3,220 ns.
    # Unaware: one hop timed trunc(2 * 100 + 1,000) = 1,200, both chunks at once: 10 + 1,200 +
    # 10 = 1,220 ns.
    mesh = network(dim(Topology.MESH_2D, 4, 2), splits=2, active=2)
    assert ns(mesh, Collective.ALL_GATHER, 2000, group=[0, 3]) == 3_220
    assert ns(mesh, Collective.ALL_GATHER, 2000, Congestion.UNAWARE, group=[0, 3]) == 1_220


def test_sub_group_on_the_tutorial_ring_by_hand() -> None:
    # Group {0, 2, 4, 6} (unaware 100,720 ns, test_collectives_astra): every hop of its ring is
    # 2 ring links, store-and-forward 2 * trunc(500 + 65,536 / 53.687) = 2 * 1,720 = 3,440,
    # and the four flows use disjoint links. Per chunk: 7 hand-offs of 10, 3 reductions of
    # 3,930, 6 sends of 3,440: 70 + 11,790 + 20,640 = 32,500; 4 chunks in turn: 130,000 ns.
    assert ns(tutorial(), Collective.ALL_REDUCE, 2**20, group=[0, 2, 4, 6]) == 130_000


def test_sub_group_routes_through_every_dimension_by_hand() -> None:
    # Ring(2) x Ring(2), dim 0 1 B/ns and 100 ns, dim 1 0.5 B/ns and 200 ns; group [0, 3]:
    # 0 = (0,0) -> 3 = (1,1) goes along dim 0, then dim 1 (MultiDimTopology::route, lowest
    # dimension first): trunc(100 + 1,000) + trunc(200 + 2,000) = 3,300. all-gather of 1,000 B,
    # 1 chunk, one send each: 10 + 3,300 + 10 = 3,320 ns. Unaware times the hop on dim 0 only
    # (the lowest differing dimension): 10 + 1,100 + 10 = 1,120.
    net = network(dim(Topology.RING, 2), dim(Topology.RING, 2, bytes_per_s=5e8,
                                             latency_s=200e-9))
    assert ns(net, Collective.ALL_GATHER, 1000, group=[0, 3]) == 3_320
    assert ns(net, Collective.ALL_GATHER, 1000, Congestion.UNAWARE, group=[0, 3]) == 1_120


def test_point_to_point_is_store_and_forward_by_hand() -> None:
    # Tutorial ring, 1 MiB from 0 to 3: 3 hops of trunc(500 + 19,531.25) = 20,031 each:
    # 60,093 ns (unaware: trunc(1,500 + 19,531.25) = 21,031).
    assert round(p2p_time(tutorial(), 0, 3, 2**20, congestion=AWARE) * 1e9) == 60_093
    assert round(p2p_time(tutorial(), 0, 3, 2**20) * 1e9) == 21_031


def test_what_is_not_modelled_is_refused() -> None:
    with pytest.raises(ValueError, match="halvingDoubling on a Mesh2D dimension"):
        ns(network(dim(Topology.MESH_2D, 4, 2, "halvingDoubling")), Collective.ALL_REDUCE, 4000)
    one_ring = network(dim(Topology.RING, 4, algorithm="oneRing"),
                       dim(Topology.RING, 2, algorithm="oneRing"))
    with pytest.raises(ValueError, match="list ring"):
        ns(one_ring, Collective.ALL_REDUCE, 4000)
    with pytest.raises(ValueError, match="halvingDoubling over a sub-group"):
        ns(network(dim(Topology.MESH_2D, 4, 2, "halvingDoubling")), Collective.ALL_REDUCE, 4000,
           group=[0, 3])
    with pytest.raises(TypeError, match="congestion must be one of"):
        Network(dims=(dim(Topology.RING, 4),), congestion="aware")  # type: ignore[arg-type]
