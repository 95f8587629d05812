"""simcore's collective timing against measured ASTRA-sim runs and hand derivations.

Measured figures: tests/data/astra_microbench.csv (ASTRA-sim 518bd51, analytical backend, the
team's runs of 2026-11-22; see tests/data/README.md). Hand derivations: shared reference
NOTES.md sections 3.2 and 3.3, redone in the comments below.
"""

from __future__ import annotations

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

from .astra_rows import measured_runs

GIB = 2**30
UNAWARE = measured_runs("Congestion_Unaware")
AWARE = measured_runs("Congestion_Aware")
AWARE_TOLERANCE = 0.10  # issue 3: congestion-aware rows within 10%


def tutorial(local_mem_gbps: float = 50, npus: int = 8, algorithm: str = "ring") -> Network:
    """ASTRA-sim tutorial: 8-NPU Ring, 50 GB/s (GiB/s), 500 ns; splits 4, 1 active chunk,
    endpoint delay 10 ns, local-mem-bw 50 GB/s (decimal)."""
    dim = NetworkDim(
        topology=Topology.RING, npus=npus, bandwidth_bytes_per_s=50 * GIB, latency_s=500e-9,
        algorithms={c: AlgorithmChoice.parse(algorithm) for c in Collective},
    )
    scheduling = CollectiveScheduling(
        preferred_dataset_splits=4, active_chunks_per_dim=1, endpoint_delay_s=10e-9,
        local_reduction_bandwidth_bytes_per_s=local_mem_gbps * 1e9,
    )
    return Network(dims=(dim,), scheduling=scheduling)


def test_tutorial_all_reduce_by_hand() -> None:
    # NOTES.md 3.2: chunk 262,144 B, 4 chunks; message m = 32,768 B;
    # send = trunc(500 + 32768 / 53.6870912) = 1,110; reduction = 3 * trunc(32768 / 50) = 1,965;
    # chunk = 10 + 14 * (1,110 + 10) + 7 * 1,965 = 29,445; 4 chunks back to back = 117,780 ns.
    assert collective_time(tutorial(), Collective.ALL_REDUCE, 2**20).time_ns == 117_780
    # local-mem-bw 1600: reduction = 3 * trunc(32768 / 1600) = 60;
    # chunk = 10 + 14 * 1,120 + 7 * 60 = 16,110; x 4 = 64,440 ns
    assert collective_time(tutorial(1600), Collective.ALL_REDUCE, 2**20).time_ns == 64_440


@pytest.mark.parametrize("run", UNAWARE, ids=[r.case for r in UNAWARE])
def test_every_congestion_unaware_row_to_the_ns(run) -> None:
    assert len(UNAWARE) == 64  # every ok row of the team's copy is checked
    timing = collective_time(run.network, run.collective, run.size_bytes)
    assert timing.time_ns == run.measured_ns


@pytest.mark.parametrize("run", AWARE, ids=[r.case for r in AWARE])
def test_every_congestion_aware_row_within_tolerance(run) -> None:
    timing = collective_time(run.network, run.collective, run.size_bytes,
                             congestion=Congestion.AWARE)
    assert timing.time_ns == pytest.approx(run.measured_ns, rel=AWARE_TOLERANCE)


def test_two_dimensional_phases_by_hand() -> None:
    # NOTES.md 3.3, Ring(4) x Switch(4), 1 MiB, tutorial system: 4 chunks of 262,144 B.
    ring = NetworkDim(topology=Topology.RING, npus=4, bandwidth_bytes_per_s=50 * GIB,
                      latency_s=500e-9)
    switch = NetworkDim(topology=Topology.SWITCH, npus=4, bandwidth_bytes_per_s=50 * GIB,
                        latency_s=500e-9)
    net = Network(dims=(ring, switch), scheduling=tutorial().scheduling)
    timing = collective_time(net, Collective.ALL_REDUCE, 2**20)
    rs0, ar1, ag0 = timing.phases
    # RS on dim 0: m = 65,536; send = trunc(500 + 1,220.7) = 1,720; red = 3 * 1,310 = 3,930;
    # 10 + 3 * (1,720 + 10 + 3,930) = 16,990
    assert (rs0.dim, rs0.collective, round(rs0.time_s * 1e9)) == (0, "reduce-scatter", 16_990)
    # AG on dim 0 with 65,536 B per node: 10 + 3 * (1,720 + 10) = 5,200
    assert (ag0.dim, ag0.collective, round(ag0.time_s * 1e9)) == (0, "all-gather", 5_200)
    # AR on dim 1 (Switch, 2 hops) with 65,536 B: m = 16,384, send = trunc(1000 + 305.2) = 1,305;
    # red = 3 * trunc(16384 / 50) = 981; 10 + 6 * (1,305 + 10) + 3 * 981 = 10,843
    assert (ar1.dim, round(ar1.time_s * 1e9)) == (1, 10_843)
    # dim 0 is busy 16,990 + 5,200 = 22,190 per chunk and hides dim 1: 4 x 22,190 = 88,760
    assert timing.time_ns == 88_760


def test_sub_group_ring_by_hand() -> None:
    # Group {0, 2, 4, 6} on the tutorial ring: one logical ring of n = 4; 4 chunks of 262,144 B,
    # 1 active chunk -> 4 waves. m = 65,536 B; every hop 0->2, 2->4, ... is 2 ring hops:
    # S = trunc(2 * 500 + 65536 / 53.6870912) = 2,220. Hand-off 10 ns (ASTRA-sim's Fast MemBus).
    # Per wave: 10 * (1 + 6 sends) + 3 reductions * 3,930 = 11,860; the longest path makes
    # 4 * 6 = 24 hops of 2,220 = 53,280. Total 4 * 11,860 + 53,280 = 100,720 ns.
    timing = collective_time(tutorial(), Collective.ALL_REDUCE, 2**20, group=[0, 2, 4, 6])
    assert timing.time_ns == 100_720


def test_sub_group_ring_with_mixed_hops_by_hand() -> None:
    # Ring(4) x Switch(2), 100 GiB/s and 1,000 ns on both; group [0, 4, 1] in that ring order.
    # Hops into each member (lowest differing dimension): 1->0 dim 0, 1 hop; 0->4 dim 1, Switch 2
    # hops; 4->1: (0,1)->(1,0) differs first in dim 0, 1 hop.
    # all-gather of 3,000 B, splits 1, min-chunk rule: 3,000 >= 8 NPUs, so 1 chunk of 3,000 B.
    # S1 = trunc(1000 + 3000 / 107.374) = 1,027; S2 = trunc(2000 + 27.9) = 2,027.
    # n = 3, 2 sends, no reductions: per wave 10 * 3 = 30; 2 moves walking back from rank 0
    # (position 0): hop into 0 (1,027), then hop into position 2 = rank 1 (1,027): 2,054.
    # Total 30 + 2,054 = 2,084 ns.
    ring = NetworkDim(topology=Topology.RING, npus=4, bandwidth_bytes_per_s=100 * GIB,
                      latency_s=1e-6)
    switch = NetworkDim(topology=Topology.SWITCH, npus=2, bandwidth_bytes_per_s=100 * GIB,
                        latency_s=1e-6)
    net = Network(dims=(ring, switch), scheduling=CollectiveScheduling(preferred_dataset_splits=1))
    assert collective_time(net, Collective.ALL_GATHER, 3000, group=[0, 4, 1]).time_ns == 2_084


def test_point_to_point_by_hand() -> None:
    # tutorial ring: 0 -> 3 is 3 hops; trunc(3 * 500 + 1 MiB / 53.6870912) = trunc(1500 +
    # 19,531.25) = 21,031 ns; no hand-off and no reduction for SEND nodes (NOTES.md 3.5)
    assert round(p2p_time(tutorial(), 0, 3, 2**20) * 1e9) == 21_031


def test_message_across_a_mesh_by_hand() -> None:
    # 4 x 4 Mesh2D, 25 GiB/s, 100 ns per hop; 0 -> 15 is 3 hops along X and 3 along Y:
    # trunc(6 * 100 + 65536 / 26.8435456) = trunc(600 + 2,441.4) = 3,041 ns
    mesh = NetworkDim(topology=Topology.MESH_2D, npus=16, width=4,
                      bandwidth_bytes_per_s=25 * GIB, latency_s=100e-9)
    net = Network(dims=(mesh,))
    assert round(p2p_time(net, 0, 15, 65536) * 1e9) == 3_041


def test_one_ring_is_the_ring_formula_over_all_npus() -> None:
    # oneRing on Ring(4) x Ring(2): one ring of 8 NPUs whose every neighbour hop is on dim 0,
    # so it equals the 8-NPU tutorial ring (117,780 ns) when dim 0 has the tutorial links.
    dims = tuple(
        NetworkDim(topology=Topology.RING, npus=n, bandwidth_bytes_per_s=50 * GIB,
                   latency_s=500e-9,
                   algorithms={c: AlgorithmChoice.parse("oneRing") for c in Collective})
        for n in (4, 2)
    )
    net = Network(dims=dims, scheduling=tutorial().scheduling)
    assert collective_time(net, Collective.ALL_REDUCE, 2**20).time_ns == 117_780


def test_bad_sizes_and_groups_are_refused() -> None:
    net = tutorial()
    with pytest.raises(ValueError, match="size_bytes > 0"):
        collective_time(net, Collective.ALL_REDUCE, 0)
    with pytest.raises(ValueError, match="0 <= rank < 8"):
        collective_time(net, Collective.ALL_REDUCE, 2**20, group=[0, 8])
    with pytest.raises(ValueError, match="each rank once"):
        collective_time(net, Collective.ALL_REDUCE, 2**20, group=[0, 0])
    with pytest.raises(ValueError, match="halvingDoubling cannot run all-to-all"):
        collective_time(tutorial(algorithm="halvingDoubling"), Collective.ALL_TO_ALL, 2**20)
    with pytest.raises(ValueError, match="power-of-two"):
        collective_time(tutorial(npus=6, algorithm="halvingDoubling"), Collective.ALL_REDUCE,
                        2**20)
