"""Read ASTRA-sim's own input files (system JSON, analytical network YAML) into simcore specs.

The keys are the ones ASTRA-sim 2.0 reads (``Sys::initialize_sys``, ``CollectiveImplLookup``,
the analytical backend's ``NetworkParser``) and the lab writes. Every problem is raised as a
:class:`PlannerUsageError` naming the file and the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


from planner.fields import choice as _choice
from planner.fields import fail as _fail
from planner.fields import integer as _integer
from planner.fields import load as _load
from planner.fields import number as _number
from planner.units import (
    astra_link_gbps_to_bytes_per_s,
    decimal_gbps_to_bytes_per_s,
    ns_to_s,
)
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

__all__ = ["AstraSystem", "load_astra_system", "read_system_json", "read_network_yml"]

IMPLEMENTATION_KEYS = {
    Collective.ALL_REDUCE: "all-reduce-implementation",
    Collective.ALL_GATHER: "all-gather-implementation",
    Collective.REDUCE_SCATTER: "reduce-scatter-implementation",
    Collective.ALL_TO_ALL: "all-to-all-implementation",
}
REQUIRED_SYSTEM_KEYS = (
    "scheduling-policy",
    "endpoint-delay",
    "active-chunks-per-dimension",
    "preferred-dataset-splits",
    "collective-optimization",
    "local-mem-bw",
    *IMPLEMENTATION_KEYS.values(),
)
NETWORK_KEYS = ("topology", "npus_count", "bandwidth", "latency")
ASTRA_TOPOLOGIES = ("Ring", "FullyConnected", "Switch")


@dataclass(frozen=True, slots=True)
class AstraSystem:
    """What the two files say: the network, plus the compute knobs of the system JSON."""

    network: Network
    peak_flops_per_s: float | None
    """``peak-perf`` (decimal TFLOP/s in the file), None if absent."""
    local_mem_bandwidth_bytes_per_s: float
    """``local-mem-bw`` (decimal GB/s in the file)."""
    roofline_enabled: bool


def read_system_json(path: Path) -> tuple[dict[str, Any], CollectiveScheduling]:
    """The system JSON's raw mapping (checked) and the collective scheduling it describes."""
    data = _load(path, "system JSON")
    if not isinstance(data, dict):
        raise _fail(path, "(top level)", "must be a JSON object of ASTRA-sim system keys")
    missing = [k for k in REQUIRED_SYSTEM_KEYS if k not in data]
    if missing:
        raise _fail(path, missing[0], "missing; ASTRA-sim's system file needs it (e.g. the"
                    " values in examples/system/native_collectives/Ring_4chunks.json)")
    ed_ns = _number(path, "endpoint-delay", data["endpoint-delay"], minimum=0, strict=True)
    scheduling = CollectiveScheduling(
        policy=_choice(path, "scheduling-policy", data["scheduling-policy"], SchedulingPolicy),
        optimization=_choice(
            path, "collective-optimization", data["collective-optimization"],
            MultiDimOptimization,
        ),
        endpoint_delay_s=ns_to_s(ed_ns),
        active_chunks_per_dim=_integer(
            path, "active-chunks-per-dimension", data["active-chunks-per-dimension"], minimum=1
        ),
        preferred_dataset_splits=_integer(
            path, "preferred-dataset-splits", data["preferred-dataset-splits"], minimum=1
        ),
        local_reduction_bandwidth_bytes_per_s=decimal_gbps_to_bytes_per_s(
            _number(path, "local-mem-bw", data["local-mem-bw"], minimum=0, strict=True)
        ),
    )
    for key in ("peak-perf",):
        if key in data:
            _number(path, key, data[key], minimum=0, strict=True)
    for key in ("boost-mode", "roofline-enabled", "trace-enabled", "track-local-mem"):
        if key in data:
            _integer(path, key, data[key], minimum=0)
    return data, scheduling


def _algorithms(path: Path, data: dict[str, Any], dims: int) -> list[dict[Collective, AlgorithmChoice]]:
    per_dim: list[dict[Collective, AlgorithmChoice]] = [{} for _ in range(dims)]
    for collective, key in IMPLEMENTATION_KEYS.items():
        names = data[key]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise _fail(path, key, f"must be a list of algorithm names, but got {names!r}")
        if len(names) != dims:
            raise _fail(
                path, key,
                f"lists {len(names)} algorithm(s) but the network has {dims} dimension(s);"
                " give one per dimension",
            )
        for i, name in enumerate(names):
            try:
                per_dim[i][collective] = AlgorithmChoice.parse(name)
            except ValueError as e:
                raise _fail(path, f"{key}[{i}]", str(e)) from None
    return per_dim


def _dim_size(path: Path, topology: Topology, value: Any, i: int) -> tuple[int, int | None]:
    field = f"npus_count[{i}]"
    if topology in (Topology.MESH_2D, Topology.TORUS_2D):
        text = str(value)
        parts = text.lower().split("x")
        if len(parts) != 2 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
            raise _fail(path, field, f"a {topology} dimension is sized WIDTHxHEIGHT, e.g. 4x4,"
                        f" but got {value!r}")
        width, height = (int(p) for p in parts)
        return width * height, width
    return _integer(path, field, value, minimum=1), None


def read_network_yml(path: Path) -> list[NetworkDim]:
    """The network dimensions of an ASTRA-sim analytical network YAML, innermost first.

    Beyond ASTRA-sim's Ring / FullyConnected / Switch, ``Mesh2D`` and ``Torus2D`` are accepted
    with an ``npus_count`` entry written ``WIDTHxHEIGHT``. Every collective gets ``ring``.
    """
    return _network_dims(path, _load(path, "network YAML"), None)


def _network_dims(
    path: Path, data: Any, algorithms: list[dict[Collective, AlgorithmChoice]] | None
) -> list[NetworkDim]:
    if not isinstance(data, dict):
        raise _fail(path, "(top level)", "must be a mapping with keys " + ", ".join(NETWORK_KEYS))
    for key in NETWORK_KEYS:
        if key not in data:
            raise _fail(path, key, "missing; an ASTRA-sim network file has topology, npus_count,"
                        " bandwidth and latency, one entry per dimension")
        if not isinstance(data[key], list) or not data[key]:
            raise _fail(path, key, f"must be a non-empty list, one entry per dimension, but got"
                        f" {data[key]!r}")
    dims = len(data["topology"])
    for key in NETWORK_KEYS[1:]:
        if len(data[key]) != dims:
            raise _fail(path, key, f"has {len(data[key])} entries but topology has {dims};"
                        " give one per dimension")
    if algorithms is not None and len(algorithms) != dims:
        raise _fail(path, "topology", f"has {dims} dimension(s) but the system file lists"
                    f" {len(algorithms)} algorithm(s) per collective; make them agree")
    result = []
    for i in range(dims):
        topology = _choice(path, f"topology[{i}]", data["topology"][i], Topology)
        npus, width = _dim_size(path, topology, data["npus_count"][i], i)
        bandwidth = _number(path, f"bandwidth[{i}]", data["bandwidth"][i], minimum=0, strict=True)
        latency = _number(path, f"latency[{i}]", data["latency"][i], minimum=0, strict=False)
        kwargs: dict[str, Any] = {}
        if algorithms is not None:
            kwargs["algorithms"] = algorithms[i]
        result.append(
            NetworkDim(
                topology=topology,
                npus=npus,
                width=width,
                bandwidth_bytes_per_s=astra_link_gbps_to_bytes_per_s(bandwidth),
                latency_s=ns_to_s(latency),
                **kwargs,
            )
        )
    return result


def load_astra_system(system_json: Path, network_yml: Path) -> AstraSystem:
    """Both files, checked against each other, as one :class:`AstraSystem`."""
    data, scheduling = read_system_json(system_json)
    network_data = _load(network_yml, "network YAML")
    _network_dims(network_yml, network_data, None)  # report the network file's own errors first
    algorithms = _algorithms(system_json, data, len(network_data["topology"]))
    network_dims = _network_dims(network_yml, network_data, algorithms)
    peak = data.get("peak-perf")
    return AstraSystem(
        network=Network(dims=tuple(network_dims), scheduling=scheduling),
        peak_flops_per_s=float(peak) * 1e12 if peak is not None else None,
        local_mem_bandwidth_bytes_per_s=scheduling.local_reduction_bandwidth_bytes_per_s,
        roofline_enabled=bool(data.get("roofline-enabled", 0)),
    )
