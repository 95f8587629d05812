"""Catalog entries of systems that mix device types: node groups joined by the inter-node
network.

::

    metis-a100-v100-16-16:
      groups:
        - name: a100              # optional; default the device's name
          device: a100-80gb       # a catalog device (or an inline device entry)
          nodes: 4
          node: {topology: Switch, npus: 4, bandwidth_gbps: 46, latency_us: 0.58}
          inter_node: {...}       # optional: this group's own links between its nodes
        - {device: v100-16gb, nodes: 4, node: {...}}
      inter_node: {topology: Switch, bandwidth_gbps: 10, latency_us: 8.8}
      source: "where the figures come from"

A group's network is its ``node`` dimension (``npus`` = GPUs per node), then, with more than one
node, its ``inter_node`` dimension (the system's unless the group has its own) over its nodes;
``npus`` of an ``inter_node`` entry is filled in. The system's ``inter_node`` also joins a stage on
one group to the next stage on another.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from planner.catalog_network import (
    check_network,
    collective_scheduling,
    network_dim,
    spec_or_fail,
)
from planner.fields import fail, fields, integer
from simcore.mixed import MixedSystemSpec
from simcore.network import Network, NetworkDim
from simcore.specs import DeviceSpec, SystemSpec

__all__ = ["is_mixed_entry", "mixed_system_from_entry"]

_GROUP_NAME = re.compile(r"[A-Za-z0-9_.-]+", re.ASCII)
"""A group's name, as a plan's label prints it and :mod:`planner.mixed_label` reads it."""

_FIELDS = {"groups", "inter_node"}
_OPTIONAL = {"scheduling", "source", "notes"}
_GROUP_FIELDS = {"device", "nodes", "node"}
_GROUP_OPTIONAL = {"name", "inter_node", "source", "notes"}


def is_mixed_entry(entry: Any) -> bool:
    return isinstance(entry, Mapping) and "groups" in entry


def _inter(path: Path, where: str, entry: Any, nodes: int) -> NetworkDim:
    if not isinstance(entry, Mapping):
        raise fail(path, where, "must be a network dimension (topology, bandwidth_gbps,"
                   " latency_us)")
    return network_dim(path, where, {**entry, "npus": nodes})


def mixed_system_from_entry(path: Path, name: str, entry: Any,
                            devices: Mapping[str, DeviceSpec]) -> MixedSystemSpec:
    from planner.catalog_entries import system_device

    e = fields(path, name, entry, _FIELDS, _OPTIONAL)
    raw_groups = e["groups"]
    if not isinstance(raw_groups, list) or not raw_groups:
        raise fail(path, f"{name}.groups", "must be a list of node groups (device, nodes, node)")
    groups = []
    for i, raw in enumerate(raw_groups):
        where = f"{name}.groups[{i}]"
        g = fields(path, where, raw, _GROUP_FIELDS, _GROUP_OPTIONAL)
        device = system_device(path, where, g["device"], devices)
        nodes = integer(path, f"{where}.nodes", g["nodes"], minimum=1)
        dims = [network_dim(path, f"{where}.node", g["node"])]
        if nodes > 1:
            inter_where = f"{where}.inter_node" if "inter_node" in g else f"{name}.inter_node"
            dims.append(_inter(path, inter_where, g.get("inter_node", e["inter_node"]), nodes))
        check_network(path, f"{where}.node", dims)
        scheduling = collective_scheduling(path, f"{name}.scheduling", e.get("scheduling"), device)
        group_name = str(g.get("name", device.name))
        if not _GROUP_NAME.fullmatch(group_name):
            raise fail(path, f"{where}.name", f"{group_name!r}: a plan names its groups"
                       " (a100:tp4dp1x2[5,5] > ...), so use letters, digits, '-', '_' or '.'")
        network = spec_or_fail(path, where,
                               lambda: Network(dims=tuple(dims), scheduling=scheduling))
        groups.append(SystemSpec(name=group_name, device=device, network=network))
    link = _inter(path, f"{name}.inter_node", e["inter_node"], 2)
    return spec_or_fail(path, name,
                        lambda: MixedSystemSpec(name=name, groups=tuple(groups), link=link))
