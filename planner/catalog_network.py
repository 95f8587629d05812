"""The network part of a catalog system entry: its dimensions and collective scheduling, read
and checked (units converted as :mod:`planner.catalog` says)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from planner.fields import boolean, choice, fail, fields, integer, number
from planner.units import GB, astra_link_gbps_to_bytes_per_s
from simcore.network import (
    AlgorithmChoice,
    Collective,
    CollectiveScheduling,
    MultiDimOptimization,
    NetworkDim,
    SchedulingPolicy,
    SwitchAllReduce,
    Topology,
)
from simcore.specs import DeviceSpec
from simcore.topologies import (
    MAX_ACTIVE_CHUNKS,
    MAX_DATASET_SPLITS,
    algorithm_problem,
    network_size_problem,
)

__all__ = ["check_network", "collective_scheduling", "network_dim", "spec_or_fail"]


_TOPOLOGY_NAMES = {t.value.lower(): t for t in Topology} | {"torus": Topology.TORUS_2D}


def spec_or_fail(path: Path, where: str, build: Any) -> Any:
    try:
        return build()
    except ValueError as e:
        raise fail(path, where, str(e)) from None


_DIM_FIELDS = {"topology", "npus", "latency_us"}
_DIM_OPTIONAL = {"bandwidth_gbps", "bandwidth_astra_gbps", "algorithm", "algorithms", "width",
                 "source", "call_latency_us", "p2p_bandwidth_gbps", "per_communicator", "nvls",
                 "links", "group_links"}


def _algorithms(path: Path, where: str, e: dict) -> dict[Collective, AlgorithmChoice]:
    def parse(key: str, text: Any) -> AlgorithmChoice:
        if not isinstance(text, str):
            raise fail(path, key, f"must be an algorithm name, but got {text!r}")
        try:
            return AlgorithmChoice.parse(text)
        except ValueError as err:
            raise fail(path, key, str(err)) from None

    common = parse(f"{where}.algorithm", e.get("algorithm", "ring"))
    chosen = {c: common for c in Collective}
    per = e.get("algorithms", {})
    if not isinstance(per, Mapping):
        raise fail(path, f"{where}.algorithms", "must map collectives to algorithms")
    for key, text in per.items():
        collective = choice(path, f"{where}.algorithms", key, Collective)
        chosen[collective] = parse(f"{where}.algorithms.{key}", text)
    return chosen


_NVLS_FIELDS = {"bandwidth_gbps", "latency_us", "min_npus"}


def _nvls(path: Path, where: str, entry: Any) -> SwitchAllReduce | None:
    """A dimension's ``nvls`` (an all-reduce the switch reduces), or None where not given."""
    if entry is None:
        return None
    e = fields(path, where, entry, _NVLS_FIELDS, set())
    return spec_or_fail(path, where, lambda: SwitchAllReduce(
        bandwidth_bytes_per_s=number(path, f"{where}.bandwidth_gbps", e["bandwidth_gbps"],
                                     minimum=0, strict=True) * GB,
        latency_s=number(path, f"{where}.latency_us", e["latency_us"], minimum=0,
                         strict=False) * 1e-6,
        min_npus=integer(path, f"{where}.min_npus", e["min_npus"], minimum=2),
    ))


def _group_links(path: Path, where: str, entry: Any) -> tuple[tuple[int, int], ...]:
    """A dimension's ``group_links`` (group size -> a device's links within the group)."""
    if not isinstance(entry, Mapping):
        raise fail(path, where, "must map a group size to a device's links within the group,"
                   " e.g. {2: 1, 4: 4}")
    return tuple(sorted((integer(path, where, _size(k), minimum=2),
                         integer(path, f"{where}.{k}", v, minimum=1)) for k, v in entry.items()))


def _size(key: Any) -> Any:
    """A group size as written: a YAML key is a number, a JSON key (a stored study's system)
    the number's digits."""
    return int(key) if isinstance(key, str) and key.isascii() and key.isdigit() else key


def network_dim(path: Path, where: str, entry: Any) -> NetworkDim:
    e = fields(path, where, entry, _DIM_FIELDS, _DIM_OPTIONAL)
    topology_name = e["topology"]
    topology = _TOPOLOGY_NAMES.get(str(topology_name).lower())
    if topology is None:
        known = ", ".join(t.value for t in Topology)
        raise fail(path, f"{where}.topology", f"unknown topology {topology_name!r}; use one of"
                   f" {known}")
    if ("bandwidth_gbps" in e) == ("bandwidth_astra_gbps" in e):
        raise fail(path, f"{where}.bandwidth_gbps", "give exactly one of bandwidth_gbps (decimal"
                   " GB/s) or bandwidth_astra_gbps (ASTRA-sim's 2^30 bytes/s)")
    if "bandwidth_gbps" in e:
        bw = number(path, f"{where}.bandwidth_gbps", e["bandwidth_gbps"], minimum=0,
                    strict=True) * GB
    else:
        bw = astra_link_gbps_to_bytes_per_s(
            number(path, f"{where}.bandwidth_astra_gbps", e["bandwidth_astra_gbps"], minimum=0,
                   strict=True))
    width = e.get("width")
    if width is not None:
        width = integer(path, f"{where}.width", width, minimum=1)
    p2p = e.get("p2p_bandwidth_gbps")
    if p2p is not None:
        p2p = number(path, f"{where}.p2p_bandwidth_gbps", p2p, minimum=0, strict=True) * GB
    return spec_or_fail(path, where, lambda: NetworkDim(
        topology=topology,
        npus=integer(path, f"{where}.npus", e["npus"], minimum=1),
        bandwidth_bytes_per_s=bw,
        latency_s=number(path, f"{where}.latency_us", e["latency_us"], minimum=0,
                         strict=False) * 1e-6,
        algorithms=_algorithms(path, where, e),
        width=width,
        call_latency_s=number(path, f"{where}.call_latency_us", e.get("call_latency_us", 0),
                              minimum=0, strict=False) * 1e-6,
        p2p_bandwidth_bytes_per_s=p2p,
        per_communicator=boolean(path, f"{where}.per_communicator",
                                 e.get("per_communicator", False)),
        nvls=_nvls(path, f"{where}.nvls", e.get("nvls")),
        links=(None if e.get("links") is None else
               integer(path, f"{where}.links", e["links"], minimum=1)),
        group_links=_group_links(path, f"{where}.group_links", e.get("group_links", {})),
    ))


_SCHED_OPTIONAL = {"preferred_dataset_splits", "active_chunks_per_dim", "endpoint_delay_ns",
                   "local_reduction_bandwidth_gbps", "policy", "optimization"}


def collective_scheduling(path: Path, where: str, entry: Any,
                          device: DeviceSpec) -> CollectiveScheduling:
    e = fields(path, where, entry if entry is not None else {}, set(), _SCHED_OPTIONAL)
    local_bw = e.get("local_reduction_bandwidth_gbps")
    return spec_or_fail(path, where, lambda: CollectiveScheduling(
        preferred_dataset_splits=integer(path, f"{where}.preferred_dataset_splits",
                                         e.get("preferred_dataset_splits", 4), minimum=1,
                                         maximum=MAX_DATASET_SPLITS),
        active_chunks_per_dim=integer(path, f"{where}.active_chunks_per_dim",
                                      e.get("active_chunks_per_dim", 1), minimum=1,
                                      maximum=MAX_ACTIVE_CHUNKS),
        endpoint_delay_s=number(path, f"{where}.endpoint_delay_ns",
                                e.get("endpoint_delay_ns", 10), minimum=0, strict=True) * 1e-9,
        local_reduction_bandwidth_bytes_per_s=(
            number(path, f"{where}.local_reduction_bandwidth_gbps", local_bw, minimum=0,
                   strict=True) * GB if local_bw is not None
            else device.hbm_bandwidth_bytes_per_s),
        policy=choice(path, f"{where}.policy", e.get("policy", "LIFO"), SchedulingPolicy),
        optimization=choice(path, f"{where}.optimization", e.get("optimization", "localBWAware"),
                            MultiDimOptimization),
    ))


def check_network(path: Path, where: str, dims: Sequence[NetworkDim]) -> None:
    """Refuse a network too large to simulate, or whose algorithms cannot be modelled, when it
    is read (before a study is made from it)."""
    too_large = network_size_problem([d.npus for d in dims])
    if too_large:
        raise fail(path, where, too_large)
    bad = algorithm_problem(dims)
    if bad:
        dim, why = bad
        raise fail(path, f"{where}[{dim}].algorithm", why)
