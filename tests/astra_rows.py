"""Turn rows of the measured ASTRA-sim microbenchmarks (tests/data) into simcore inputs."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from planner.units import astra_link_gbps_to_bytes_per_s, decimal_gbps_to_bytes_per_s, ns_to_s
from simcore.network import (
    AlgorithmChoice,
    Collective,
    CollectiveScheduling,
    MultiDimOptimization,
    Network,
    NetworkDim,
    SchedulingPolicy,
    Topology,
)

MICROBENCH = Path(__file__).parent / "data" / "astra_microbench.csv"


@dataclass(frozen=True)
class MeasuredRun:
    case: str
    backend: str
    network: Network
    collective: Collective
    size_bytes: int
    measured_ns: int


def _split(value: str, dims: int) -> list[str]:
    parts = value.split("x")
    return parts if len(parts) == dims else [value] * dims


def network_of(row: dict[str, str]) -> Network:
    npus = [int(n) for n in row["npus_per_dim"].split("x")]
    k = len(npus)
    topologies = ["Ring", "Switch"] if row["topology"] == "RingxSwitch" else [row["topology"]] * k
    dims = tuple(
        NetworkDim(
            topology=Topology(topology),
            npus=n,
            bandwidth_bytes_per_s=astra_link_gbps_to_bytes_per_s(float(bw)),
            latency_s=ns_to_s(float(lat)),
            algorithms={c: AlgorithmChoice.parse(impl) for c in Collective},
        )
        for topology, n, bw, lat, impl in zip(
            topologies, npus, _split(row["bandwidth_GBps"], k), _split(row["latency_ns"], k),
            _split(row["implementation"], k),
        )
    )
    scheduling = CollectiveScheduling(
        policy=SchedulingPolicy(row["scheduling_policy"]),
        endpoint_delay_s=ns_to_s(float(row["endpoint_delay"])),
        active_chunks_per_dim=int(row["active_chunks_per_dim"]),
        preferred_dataset_splits=int(row["preferred_dataset_splits"]),
        optimization=MultiDimOptimization(row["collective_optimization"]),
        local_reduction_bandwidth_bytes_per_s=decimal_gbps_to_bytes_per_s(
            float(row["local_mem_bw_GBps"])
        ),
    )
    return Network(dims=dims, scheduling=scheduling)


def measured_runs(backend: str) -> list[MeasuredRun]:
    """Every row of ``backend`` that ran to completion (status ok)."""
    with MICROBENCH.open() as f:
        rows = [r for r in csv.DictReader(f) if r["backend"] == backend and r["status"] == "ok"]
    return [
        MeasuredRun(
            case=r["case"],
            backend=backend,
            network=network_of(r),
            collective=Collective(r["collective"].replace("_", "-")),
            size_bytes=int(r["bytes"]),
            measured_ns=int(r["cycles_max"]),
        )
        for r in rows
    ]
