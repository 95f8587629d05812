"""Metis's inputs (SamsungLabs/Metis; read at livingshade/Metis@900445f): a hostfile, a cluster
file and a folder of per-device-type profiles, as a mixed system and layer profiles.

- **hostfile**: one line per node, ``ADDRESS slots=N`` (``gen_hostfile.py``); nodes of one
  address are of one type. Consecutive nodes of one type form a node group, in file order.
- **cluster file** (``clusterfile.json``): per address, ``instance_type`` (A100, V100, P100, T4),
  ``memory`` (GB per GPU), ``intra_bandwidth`` and ``inter_bandwidth``. Metis's cost model
  multiplies a bandwidth by 1024 * 1024 and divides bytes by it to get milliseconds
  (``model/cost_estimator.py``), so its unit is 2^20 bytes per ms: 1.048576 GB/s. (Metis's
  ``GPUCluster.get_inter_bandwidth`` returns the *intra* figure; the import uses the file's
  ``inter_bandwidth``, as written.)
- **profiles** (``DeviceType.<TYPE>_tp<T>_bs<B>.json``): ``execution_time.layer_compute_total_ms``
  lists every layer of one micro-batch of ``B`` sequences on ``T`` GPUs, forward and backward,
  the embedding first and the LM head last (``data_loader.py`` takes the list as Metis's
  layers); ``model.num_layers`` counts them too.

Metis gives no latencies: per hop and per call they are the DGX A100 node's and InfiniBand's
(``studies/catalog/systems/dgx.yaml``, fit on nccl-tests tables), as in the shipped Metis
systems (``studies/catalog/systems/mixed.yaml``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.catalog import user_catalog_dir
from planner.errors import PlannerUsageError
from planner.inputs import read_text
from simcore.mixed import LayerProfiles, ProfiledLayer

__all__ = ["METIS_DEVICES", "METIS_GBPS", "MetisCluster", "read_hostfile", "read_clusterfile",
           "mixed_entry", "read_profiles", "profiles_entry", "profiles_from_entry",
           "profile_path"]

METIS_GBPS = 1024 * 1024 * 1000 / 1e9
"""Metis's bandwidth unit in decimal GB/s (2^20 bytes per millisecond)."""

NODE_LINK = {"topology": "Switch", "latency_us": 0.58, "call_latency_us": 10.8}
INTER_LINK = {"topology": "Switch", "latency_us": 8.8, "call_latency_us": 0.7}
"""Hop and call latencies of the DGX A100 node and of InfiniBand (systems/dgx.yaml)."""

METIS_DEVICES: dict[tuple[str, int], str] = {
    ("A100", 80): "a100-80gb", ("A100", 40): "a100-40gb", ("V100", 16): "v100-16gb",
    ("V100", 32): "v100-32gb", ("P100", 16): "p100-16gb", ("P100", 15): "p100-16gb",
    ("T4", 16): "t4", ("T4", 15): "t4",
}
"""Metis (instance type, memory GB) -> catalog device. Metis's own cluster file gives P100 and T4
15 GB (the usable part of their 16 GB); the catalog device keeps its datasheet HBM."""

_HOST = re.compile(r"^(\S+)\s+slots=(\d+)\s*$")
_PROFILE = re.compile(r"^DeviceType\.(\w+?)_tp(\d+)_bs(\d+)\.json$")


def _bad(path: Path, where: str, fix: str) -> PlannerUsageError:
    return PlannerUsageError(f"{path}: {where}: {fix}")


def read_hostfile(path: Path) -> list[tuple[str, int]]:
    """(address, GPUs) per node, in file order."""
    lines = read_text(path, "Metis hostfile").splitlines()
    nodes = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        found = _HOST.match(line.strip())
        if found is None or int(found.group(2)) < 1:
            raise _bad(path, f"line {i}", f"must be `ADDRESS slots=N` (N >= 1), not {line!r}")
        nodes.append((found.group(1), int(found.group(2))))
    if not nodes:
        raise _bad(path, "hostfile", "has no nodes; write one `ADDRESS slots=N` line per node")
    return nodes


def _json(path: Path, what: str) -> Any:
    try:
        return json.loads(read_text(path, f"Metis {what}"))
    except json.JSONDecodeError as e:
        raise _bad(path, what, f"is not JSON (line {e.lineno}: {e.msg})") from None
    except ValueError as e:  # e.g. an integer over Python's 4,300 digits
        raise _bad(path, what, f"holds a value Python cannot read ({e})") from None


def read_clusterfile(path: Path) -> dict[str, dict[str, Any]]:
    """Per address: instance_type, memory, intra_bandwidth, inter_bandwidth (checked)."""
    raw = _json(path, "cluster file")
    if not isinstance(raw, dict) or not raw:
        raise _bad(path, "cluster file", "must map each node address to its instance_type,"
                   " memory, intra_bandwidth and inter_bandwidth")
    for address, entry in raw.items():
        for key in ("instance_type", "memory", "intra_bandwidth", "inter_bandwidth"):
            value = entry.get(key) if isinstance(entry, dict) else None
            ok = isinstance(value, str) if key == "instance_type" else \
                isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
            if not ok:
                raise _bad(path, f"{address}.{key}", "missing or not valid (instance_type a"
                           " name such as A100, the others positive numbers)")
    return raw


def _device(path: Path, address: str, entry: dict[str, Any]) -> str:
    key = (entry["instance_type"].upper(), int(entry["memory"]))
    if key not in METIS_DEVICES:
        known = ", ".join(f"{t} {m} GB" for t, m in METIS_DEVICES)
        raise _bad(path, f"{address}.instance_type", f"{key[0]} with {key[1]} GB has no catalog"
                   f" device; known: {known}")
    return METIS_DEVICES[key]


@dataclass(frozen=True)
class MetisCluster:
    """A hostfile and a cluster file, each read once."""

    hostfile: Path
    clusterfile: Path
    nodes: list[tuple[str, int]]
    cluster: dict[str, dict[str, Any]]

    @classmethod
    def read(cls, hostfile: Path, clusterfile: Path) -> MetisCluster:
        return cls(hostfile, clusterfile, read_hostfile(hostfile), read_clusterfile(clusterfile))

    def device_types(self) -> dict[str, str]:
        """Metis type -> catalog device, for the types the hostfile uses."""
        return {self.cluster[a]["instance_type"].upper(): _device(self.clusterfile, a,
                                                                  self.cluster[a])
                for a, _ in self.nodes if a in self.cluster}


def mixed_entry(c: MetisCluster) -> dict[str, Any]:
    """The catalog entry (``groups``, ``inter_node``) of the cluster the two files describe."""
    hostfile, clusterfile, nodes, cluster = c.hostfile, c.clusterfile, c.nodes, c.cluster
    runs: list[list[Any]] = []  # [address, slots, count]
    for i, (address, slots) in enumerate(nodes, start=1):
        if address not in cluster:
            raise _bad(hostfile, f"line {i}", f"address {address} is not in {clusterfile}")
        if runs and runs[-1][0] == address and runs[-1][1] == slots:
            runs[-1][2] += 1
        else:
            runs.append([address, slots, 1])
    groups, names = [], {}
    for address, slots, count in runs:
        device = _device(clusterfile, address, cluster[address])
        kind = cluster[address]["instance_type"].lower()
        names[kind] = names.get(kind, 0) + 1
        name = kind if names[kind] == 1 else f"{kind}-{names[kind]}"
        node = {**NODE_LINK, "npus": slots,
                "bandwidth_gbps": round(cluster[address]["intra_bandwidth"] * METIS_GBPS, 6)}
        group = {"name": name, "device": device, "nodes": count, "node": node}
        inter = round(cluster[address]["inter_bandwidth"] * METIS_GBPS, 6)
        group["inter_node"] = {**INTER_LINK, "bandwidth_gbps": inter}
        groups.append(group)
    if len({g["name"] for g in groups}) != len(groups):
        raise _bad(hostfile, "hostfile", "node groups must have different names")
    slowest = min(g["inter_node"]["bandwidth_gbps"] for g in groups)
    return {"groups": groups, "inter_node": {**INTER_LINK, "bandwidth_gbps": slowest}}


def read_profiles(folder: Path) -> tuple[dict[str, dict[str, dict[str, float]]], int]:
    """Per Metis type, per ``tp<T>_bs<B>``: layer, embedding and head ms; and the transformer
    layers the profiles cover."""
    if not folder.is_dir():
        raise _bad(folder, "profile folder", "is not a folder of DeviceType.<TYPE>_tp<T>_bs<B>"
                   ".json files")
    out: dict[str, dict[str, dict[str, float]]] = {}
    layers = None
    for path in sorted(folder.iterdir()):
        found = _PROFILE.match(path.name)
        if found is None:
            continue
        raw = _json(path, "profile")
        times = raw.get("execution_time", {}).get("layer_compute_total_ms") \
            if isinstance(raw, dict) else None
        if (not isinstance(times, list) or len(times) < 3
                or not all(_ms(t) and t >= 0 for t in times)
                or not all(t > 0 for t in times[1:-1])):
            raise _bad(path, "execution_time.layer_compute_total_ms", "must list each layer's"
                       " milliseconds (> 0; the embedding's and the head's >= 0), the embedding"
                       " first and the head last")
        if layers is not None and len(times) - 2 != layers:
            raise _bad(path, "execution_time.layer_compute_total_ms", f"has {len(times)} layers"
                       f" but the other profiles have {layers + 2}")
        layers = len(times) - 2
        body = times[1:-1]
        out.setdefault(found.group(1).upper(), {})[f"tp{found.group(2)}_bs{found.group(3)}"] = {
            "layer_ms": sum(body) / len(body), "embedding_ms": times[0], "head_ms": times[-1]}
    if layers is None:
        raise _bad(folder, "profile folder", "has no DeviceType.<TYPE>_tp<T>_bs<B>.json file")
    return out, layers


def _ms(t: object) -> bool:
    """A finite number of milliseconds (JSON's NaN and Infinity, and true / false, are not)."""
    return isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)


def profiles_entry(folder: Path, c: MetisCluster) -> dict[str, Any]:
    """The profile file's content: per catalog device, per ``tp<T>_bs<B>``, milliseconds."""
    raw, layers = read_profiles(folder)
    by_type = c.device_types()
    missing = sorted(set(by_type) - set(raw))
    if missing:
        raise _bad(folder, "profile folder", f"has no profile of {', '.join(missing)}; add"
                   f" DeviceType.{missing[0]}_tp<T>_bs<B>.json files")
    return {"layers": layers,
            "devices": {by_type[t]: raw[t] for t in sorted(by_type)}}


def profile_path(name: str) -> Path:
    """Where ``planner import-metis --name NAME`` puts the profiles."""
    return user_catalog_dir() / "profiles" / f"{name}.yaml"


_KEY = re.compile(r"^tp(\d+)_bs(\d+)$")


def profiles_from_entry(path: Path, name: str, entry: Any) -> LayerProfiles:
    """A profile file (as ``planner import-metis`` writes it) as :class:`LayerProfiles`."""
    if not isinstance(entry, dict) or not isinstance(entry.get("layers"), int) \
            or not isinstance(entry.get("devices"), dict):
        raise _bad(path, name, "must have `layers` (transformer layers) and `devices` (per"
                   " device, per tp<T>_bs<B>: layer_ms, embedding_ms, head_ms)")
    entries = {}
    for device, shapes in entry["devices"].items():
        for key, ms in (shapes or {}).items():
            found = _KEY.match(str(key))
            try:
                costs = ProfiledLayer(layer_s=ms["layer_ms"] / 1e3,
                                      embedding_s=ms["embedding_ms"] / 1e3,
                                      head_s=ms["head_ms"] / 1e3)
            except (KeyError, TypeError, ValueError):
                costs = None
            if found is None or costs is None:
                raise _bad(path, f"{name}.devices.{device}.{key}", "must be tp<T>_bs<B> with"
                           " layer_ms, embedding_ms and head_ms (numbers >= 0)")
            entries[(device, int(found.group(1)), int(found.group(2)))] = costs
    return LayerProfiles(name=name, layers=entry["layers"], entries=entries)
