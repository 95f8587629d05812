"""Read ASTRA-sim's own input files (system JSON, analytical network YAML) into simcore specs,
and write a system back into them.

The keys are the ones ASTRA-sim 2.0 reads (``Sys::initialize_sys``, ``CollectiveImplLookup``,
the analytical backend's ``NetworkParser``) and the lab writes. Every problem is raised as a
:class:`PlannerUsageError` naming the file and the field.

The writers (:func:`system_json_text`, :func:`network_yml_text`, :func:`remote_memory_json_text`)
give the lab's layout: the system JSON with 4-space indents in the lab's key order, the network
YAML with one flow list per key. Reading what they write gives back the same network and NPU.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.catalog_write import short_float
from planner.errors import PlannerUsageError
from planner.fields import choice as _choice
from planner.fields import fail as _fail
from planner.fields import integer as _integer
from planner.fields import number as _number
from planner.inputs import load as _load
from planner.units import (
    astra_link_gbps_to_bytes_per_s,
    bytes_per_s_to_astra_link_gbps,
    bytes_per_s_to_decimal_gbps,
    decimal_gbps_to_bytes_per_s,
    ns_to_s,
    s_to_ns,
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
from simcore.specs import SystemSpec
from simcore.topologies import (
    MAX_ACTIVE_CHUNKS,
    MAX_DATASET_SPLITS,
    algorithm_problem,
    network_size_problem,
)

__all__ = ["AstraSystem", "load_astra_system", "read_system_json", "read_network_yml",
           "system_json_text", "network_yml_text", "remote_memory_json_text", "ASTRA_TOPOLOGIES",
           "WRITTEN_SWITCHES"]

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
WRITTEN_SWITCHES = {"roofline-enabled": 1, "trace-enabled": 1, "track-local-mem": 1,
                    "boost-mode": 0}
"""The switches the lab's system files set (shared reference NOTES.md section 6.1): STAGE traces
are timed by the roofline, and peak memory is reported only with track-local-mem."""


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
            path, "active-chunks-per-dimension", data["active-chunks-per-dimension"], minimum=1,
            maximum=MAX_ACTIVE_CHUNKS,
        ),
        preferred_dataset_splits=_integer(
            path, "preferred-dataset-splits", data["preferred-dataset-splits"], minimum=1,
            maximum=MAX_DATASET_SPLITS,
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


def _algorithms(path: Path, data: dict[str, Any], dims: int
                ) -> list[dict[Collective, AlgorithmChoice]]:
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
        if len(parts) != 2 or not all(p.strip().isdigit() and len(p.strip()) <= 9
                                      and int(p) >= 1 for p in parts):
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
    sizes = [_dim_size(path, _choice(path, f"topology[{i}]", data["topology"][i], Topology),
                       data["npus_count"][i], i) for i in range(dims)]
    too_large = network_size_problem([npus for npus, _ in sizes])
    if too_large:
        raise _fail(path, "npus_count", too_large)
    result = []
    for i in range(dims):
        topology = _choice(path, f"topology[{i}]", data["topology"][i], Topology)
        npus, width = sizes[i]
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
    bad = algorithm_problem(result) if algorithms is not None else None
    if bad:
        raise _fail(path, f"topology[{bad[0]}]", f"{bad[1]} (the system file's"
                    " all-reduce-implementation etc.)")
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


# -- writers ----------------------------------------------------------------------------------
def _short(target: float, to_unit: Callable[[float], float],
           from_unit: Callable[[float], float]) -> float | int:
    """``target`` (SI units) in a file's unit, with the fewest digits that read back exactly."""
    return short_float(to_unit(target), from_unit, target)


def _tflops(flops_per_s: float) -> float | int:
    return _short(flops_per_s, lambda x: x / 1e12, lambda x: x * 1e12)


def _astra_dims(system: SystemSpec) -> tuple[NetworkDim, ...]:
    """The network's dimensions, or a usage error naming one ASTRA-sim cannot run."""
    for i, dim in enumerate(system.network.dims):
        if dim.topology.value not in ASTRA_TOPOLOGIES:
            known = ", ".join(ASTRA_TOPOLOGIES)
            raise PlannerUsageError(
                f"system {system.name}: network[{i}].topology: {dim.topology.value} is not an"
                f" ASTRA-sim topology (its analytical backend builds {known}); pick a system"
                " whose dimensions are those")
    return system.network.dims


def system_json_text(system: SystemSpec,
                     switches: Mapping[str, int] = WRITTEN_SWITCHES) -> str:
    """ASTRA-sim's system JSON for ``system``: its collective scheduling, the algorithms per
    dimension, the NPU's ``local-mem-bw`` (decimal GB/s, its HBM bandwidth) and ``peak-perf``
    (decimal TFLOP/s), and ``switches`` (default :data:`WRITTEN_SWITCHES`), in the lab's key
    order."""
    dims = _astra_dims(system)
    s = system.network.scheduling
    data: dict[str, Any] = {
        "scheduling-policy": s.policy.value,
        "endpoint-delay": _short(s.endpoint_delay_s, s_to_ns, ns_to_s),
        "active-chunks-per-dimension": s.active_chunks_per_dim,
        "preferred-dataset-splits": s.preferred_dataset_splits,
    }
    for collective, key in IMPLEMENTATION_KEYS.items():
        data[key] = [str(d.algorithm(collective)) for d in dims]
    data["collective-optimization"] = s.optimization.value
    data["local-mem-bw"] = _short(system.device.hbm_bandwidth_bytes_per_s,
                                  bytes_per_s_to_decimal_gbps, decimal_gbps_to_bytes_per_s)
    data["peak-perf"] = _tflops(system.device.peak_flops_per_s)
    data.update(switches)
    return json.dumps(data, indent=4) + "\n"


def _yaml_number(value: float | int) -> str:
    """A float as YAML 1.1 reads it back as one (``25.0``, ``1.0e-05``), as the lab writes."""
    text = repr(float(value))
    if "e" in text:
        mantissa, exponent = text.split("e")
        if "." not in mantissa:
            mantissa += ".0"
        text = f"{mantissa}e{exponent}"  # repr signs the exponent, as YAML 1.1 needs
    return text


def _flow(values: list[str]) -> str:
    return f"[ {', '.join(values)} ]"


def network_yml_text(system: SystemSpec) -> str:
    """ASTRA-sim's analytical network YAML for ``system``: topology, npus_count, bandwidth in
    ASTRA-sim's "GB/s" (2^30 bytes/s) and latency in ns, one entry per dimension."""
    dims = _astra_dims(system)
    shape = " x ".join(f"{d.topology.value}({d.npus})" for d in dims)
    bandwidth = [_short(d.bandwidth_bytes_per_s, bytes_per_s_to_astra_link_gbps,
                        astra_link_gbps_to_bytes_per_s) for d in dims]
    latency = [_short(d.latency_s, s_to_ns, ns_to_s) for d in dims]
    return "\n".join([
        f"# {system.name}: {shape} (planner export --format astra-sim).",
        f"topology: {_flow([d.topology.value for d in dims])}",
        f"npus_count: {_flow([str(d.npus) for d in dims])}",
        f"bandwidth: {_flow([_yaml_number(b) for b in bandwidth])}"
        '  # ASTRA-sim "GB/s" = 2^30 bytes/s per link',
        f"latency: {_flow([_yaml_number(x) for x in latency])}  # ns per hop",
        "",
    ])


def remote_memory_json_text() -> str:
    """The remote-memory configuration of the lab's runs: no memory expansion."""
    return json.dumps({"memory-type": "NO_MEMORY_EXPANSION"}, indent=4) + "\n"
