"""Cluster families: one catalog entry for a node type at any number of nodes.

A system entry whose name holds ``{gpus}`` describes a cluster of whole nodes of one kind; its
last network dimension (the one between nodes) says ``npus: "{nodes}"``::

    dgx-h100-{gpus}:
      device: h100-sxm
      network:
        - {topology: Switch, npus: 8, bandwidth_gbps: 545, ...}      # one node
        - {topology: Switch, npus: "{nodes}", bandwidth_gbps: 42.5, ...}

Then ``dgx-h100-6144`` names 768 such nodes wherever a system name is taken (studies, the runs
CSV of ``planner validate``, ``planner estimate --system``): the node and its links are the
family's, only the node count changes. A name given its own entry keeps it (one node's part, 1,
2 or 4 GPUs, is its own network). A GPU count that is not a multiple of the node's, or fewer
than two nodes, is refused with the counts that work.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.fields import fail
from simcore.specs import DeviceSpec, SystemSpec
from simcore.topologies import network_size_problem

__all__ = ["GPUS", "NODES", "ClusterFamily", "family_from_entry", "family_member",
           "is_family_name"]

GPUS = "{gpus}"
"""The placeholder of a family's name: the cluster's GPU count."""
NODES = "{nodes}"
"""The placeholder of the family's last dimension's ``npus``: the node count."""

Build = Callable[[Path, str, Any, Mapping[str, DeviceSpec]], Any]
""":func:`planner.catalog.system_from_entry` (passed in: this module sits below the catalog)."""


def is_family_name(name: str) -> bool:
    return GPUS in name


@dataclass(frozen=True)
class ClusterFamily:
    """A family entry: its name with ``{gpus}``, file, raw entry and GPUs per node."""

    name: str
    path: Path
    entry: dict[str, Any]
    inner: tuple[int, ...]
    """The npus of each dimension inside a node."""
    pattern: re.Pattern[str]

    @property
    def per_node(self) -> int:
        return math.prod(self.inner)

    def named(self, gpus: int) -> str:
        """The member's name at ``gpus`` GPUs (``dgx-h100-64``)."""
        return self.name.replace(GPUS, str(gpus))

    def gpus(self, ref: str) -> int | None:
        """The GPU count ``ref`` names in this family, or None if it is not of this family."""
        found = self.pattern.fullmatch(ref)
        return int(found.group(1)) if found else None

    def counts_problem(self, gpus: int) -> str | None:
        """Why ``gpus`` is not a cluster of this family's whole nodes that can be simulated,
        or None."""
        if gpus % self.per_node == 0 and gpus >= 2 * self.per_node:
            return network_size_problem([*self.inner, gpus // self.per_node])
        example = self.named(2 * self.per_node)
        return (f"{self.name} ({self.path.name}) is made of whole nodes of {self.per_node} GPUs:"
                f" name a multiple of {self.per_node}, {2 * self.per_node} or more (e.g."
                f" {example}); part of a node is a system entry of its own")

    def member(self, ref: str) -> bool:
        """Whether ``ref`` names a cluster of this family (a valid count)."""
        gpus = self.gpus(ref)
        return gpus is not None and self.counts_problem(gpus) is None

    def system(self, ref: str, gpus: int, devices: Mapping[str, DeviceSpec],
               build: Build) -> SystemSpec:
        """The family at ``gpus`` GPUs, named ``ref`` (``gpus`` must pass
        :meth:`counts_problem`)."""
        nodes = gpus // self.per_node
        return build(self.path, ref, _with_nodes(self.entry, nodes, self.name), devices)


def family_from_entry(path: Path, name: str, entry: Any, devices: Mapping[str, DeviceSpec],
                      build: Build) -> ClusterFamily:
    """Read a family entry, checking it now (as two nodes) so a mistake names its file."""
    if name.count(GPUS) != 1:
        raise fail(path, name, f"a family's name holds {GPUS} once (e.g. dgx-h100-{GPUS})")
    network = entry.get("network") if isinstance(entry, dict) else None
    if not isinstance(network, list) or len(network) < 2:
        raise fail(path, f"{name}.network", "a family lists one node's dimensions, then the"
                   f" dimension between nodes with npus: \"{NODES}\"")
    last = network[-1]
    if not isinstance(last, dict) or last.get("npus") != NODES:
        raise fail(path, f"{name}.network[{len(network) - 1}].npus",
                   f"the last dimension (between nodes) of a family says npus: \"{NODES}\"")
    inner = [d.get("npus") if isinstance(d, dict) else None for d in network[:-1]]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in inner):
        raise fail(path, f"{name}.network", "each dimension inside a node needs npus, an"
                   " integer of at least 1")
    build(path, name, _with_nodes(entry, 2, name), devices)
    prefix, _, suffix = name.partition(GPUS)
    pattern = re.compile(re.escape(prefix) + r"([1-9][0-9]*)" + re.escape(suffix))
    return ClusterFamily(name, path, entry, tuple(inner), pattern)


def family_member(families: Mapping[str, ClusterFamily], built: dict[str, SystemSpec], ref: str,
                  devices: Mapping[str, DeviceSpec], build: Build,
                  refuse: Callable[[str], Exception]) -> SystemSpec | None:
    """The system ``ref`` names in one of ``families`` (built once, kept in ``built``), or None
    if it names none; ``refuse(message)`` is raised for a count of part nodes or for the
    family's own name."""
    if ref in families:
        example = families[ref].named(8 * families[ref].per_node)
        raise refuse(f"{ref} is a family of clusters: put the GPU count in place of {GPUS},"
                     f" e.g. {example}")
    if ref in built:
        return built[ref]
    for family in families.values():
        gpus = family.gpus(ref)
        if gpus is None:
            continue
        problem = family.counts_problem(gpus)
        if problem is not None:
            raise refuse(f"system {ref!r}: {problem}")
        built[ref] = family.system(ref, gpus, devices, build)
        return built[ref]
    return None


def _with_nodes(entry: dict[str, Any], nodes: int, family: str) -> dict[str, Any]:
    out = copy.deepcopy(entry)
    out["network"][-1]["npus"] = nodes
    source = out.get("source")
    out["source"] = f"{family} at {nodes} nodes" + (f"; {source}" if source else "")
    return out
