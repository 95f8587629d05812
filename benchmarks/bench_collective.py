"""Median time of one collective estimate, uncached (issue: under 50 us).

Run: python benchmarks/bench_collective.py
Systems from 64 to 16,384 NPUs with up to 4 network dimensions, then the catalog systems'
whole-system localBWAware all-reduce. Uncached: no estimate is memoised, every call computes
its chunking, phase times and chunk schedule; only what depends on the network alone (links,
phases, per-offset latencies, the schedule for the phases' queues) is compiled once per
Network object, as in real use.
"""

from __future__ import annotations

import statistics
import time

from simcore.collectives import collective_time
from simcore.network import (
    AlgorithmChoice,
    Collective,
    CollectiveScheduling,
    Network,
    NetworkDim,
    Topology,
)

GIB = 2**30


def _dim(topology: Topology, npus: int, gbps: float, latency_ns: float, algorithm: str,
         a2a: str | None = None) -> NetworkDim:
    algorithms = {c: AlgorithmChoice.parse(algorithm) for c in Collective}
    algorithms[Collective.ALL_TO_ALL] = AlgorithmChoice.parse(a2a or algorithm)
    return NetworkDim(
        topology=topology, npus=npus, bandwidth_bytes_per_s=gbps * GIB,
        latency_s=latency_ns * 1e-9, algorithms=algorithms,
    )


# the design's catalog systems (LIFO, endpoint delay 10, 4 active chunks, 10 splits), scaled
SCHEDULING = CollectiveScheduling(
    preferred_dataset_splits=10, active_chunks_per_dim=4, endpoint_delay_s=10e-9,
    local_reduction_bandwidth_bytes_per_s=3000e9,
)
CASES = {
    "lab-system1 64 NPUs, Ring x Ring x Ring": (
        _dim(Topology.RING, 4, 100, 50, "ring"),
        _dim(Topology.RING, 4, 100, 50, "ring"),
        _dim(Topology.RING, 4, 100, 50, "ring"),
    ),
    "tpu-512, Ring^3 x Switch": (
        _dim(Topology.RING, 4, 100, 50, "ring"),
        _dim(Topology.RING, 4, 100, 50, "ring"),
        _dim(Topology.RING, 4, 100, 50, "ring"),
        _dim(Topology.SWITCH, 8, 50, 2000, "halvingDoubling", a2a="ring"),
    ),
    "dgx-2k, FC x Switch x Ring x Ring": (
        _dim(Topology.FULLY_CONNECTED, 8, 128.5714, 20, "direct"),
        _dim(Topology.SWITCH, 16, 100, 300, "halvingDoubling", a2a="ring"),
        _dim(Topology.RING, 4, 25, 700, "ring"),
        _dim(Topology.RING, 4, 6.25, 1000, "ring"),
    ),
    "16,384 NPUs, FC x Switch x Ring x Ring": (
        _dim(Topology.FULLY_CONNECTED, 8, 128.5714, 20, "direct"),
        _dim(Topology.SWITCH, 64, 100, 300, "halvingDoubling", a2a="ring"),
        _dim(Topology.RING, 8, 25, 700, "ring"),
        _dim(Topology.RING, 4, 6.25, 1000, "ring"),
    ),
}


def median_us(network: Network, collective: Collective, size: int, repeat: int = 2000) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        collective_time(network, collective, size)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


CATALOG_SYSTEMS = ("lab-system1", "tpu-512", "dgx-2k")
"""Ring 4x4x4; Ring 4 x Ring 4 x Ring 4 x Switch 8; FC 8 x Switch 16 x Ring 4 x Ring 4."""


def main() -> None:
    print(f"{'system':42} {'NPUs':>6} {'collective':>15} {'size':>7} {'median us':>10}")
    worst = 0.0
    for name, dims in CASES.items():
        network = Network(dims=dims, scheduling=SCHEDULING)
        for collective in Collective:
            for size in (1 << 20, 1 << 30):
                us = median_us(network, collective, size)
                worst = max(worst, us)
                print(f"{name:42} {network.npus:>6} {collective.value:>15}"
                      f" {size >> 20:>5}Mi {us:>10.1f}")
    print(f"worst median: {worst:.1f} us (goal: under 50 us)")

    from planner.catalog import load_catalog

    catalog = load_catalog()
    print("\ncatalog systems, whole-system all-reduce")
    print(f"{'system':42} {'NPUs':>6} {'dims':>5} {'size':>7} {'median us':>10}")
    worst = 0.0
    for name in CATALOG_SYSTEMS:
        network = catalog.system(name).network
        active = sum(d.npus > 1 for d in network.dims)
        for size in (1 << 20, 1 << 26, 1 << 30):
            us = median_us(network, Collective.ALL_REDUCE, size)
            worst = max(worst, us)
            print(f"{name + ' (' + network.scheduling.optimization.value + ')':42}"
                  f" {network.npus:>6} {active:>5} {size >> 20:>5}Mi {us:>10.1f}")
    print(f"worst median: {worst:.1f} us (goal: under 50 us)")


if __name__ == "__main__":
    main()
