"""A pipeline stage whose ranks run on more than one device group (``MixedStage.span``).

Its ranks are laid out in order: what is left of its own group, then the next group of its span
from that group's first free rank, and so on; each part is whole nodes, and every group it
spans has nodes of one size. Its data-parallel replicas then sit on different device types, as
Metis plans them and DeepSpeed runs them: each micro-batch's step waits for the slowest
replica, so the stage is priced as the whole stage would run on each part's device (on that
part's node links for every node it spans, the cluster's network between them) and the longest
taken (:func:`simcore.mixed.estimate._stages`), its memory checked against the smallest part's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simcore.megatron.placement import _sub_dim
from simcore.mixed.specs import MixedPlan, MixedStage, MixedSystemSpec
from simcore.network import Network
from simcore.specs import SystemSpec

__all__ = ["Part", "part_system", "stage_parts"]


@dataclass(frozen=True, slots=True)
class Part:
    """The ranks of a stage on one group: its first rank inside the group and how many."""

    group: int
    offset: int
    devices: int


def stage_parts(system: MixedSystemSpec, plan: MixedPlan) -> list[tuple[Part, ...]]:
    """Each stage's parts, in pipeline order; ValueError naming the stage where a stage does not
    fit what its groups have left (a spanning stage's parts must be whole nodes)."""
    used = [0] * len(system.groups)
    out = []
    for i, st in enumerate(plan.stages):
        for g in st.groups:
            if g >= len(system.groups):
                raise ValueError(f"stages[{i}].group={g} but {system.name} has"
                                 f" {len(system.groups)} groups")
        if not st.span:
            out.append((Part(st.group, used[st.group], st.devices),))
            used[st.group] += st.devices
            continue
        left, parts = st.devices, []
        for g in st.groups:
            take = min(left, system.groups[g].devices - used[g])
            if take <= 0:
                raise ValueError(f"stages[{i}] spans group {system.groups[g].name}, which has"
                                 " no rank left for it (the stages before it, or the groups"
                                 " before it in its span, hold them all)")
            parts.append(Part(g, used[g], take))
            used[g] += take
            left -= take
        if left:
            raise ValueError(f"stages[{i}] needs {st.devices} devices but its groups have"
                             f" {st.devices - left} left")
        _check_whole_nodes(system, st, parts, i)
        out.append(tuple(parts))
    return out


def _check_whole_nodes(system: MixedSystemSpec, st: MixedStage, parts: list[Part],
                       i: int) -> None:
    sizes = {system.groups[p.group].network.dims[0].npus for p in parts}
    if len(sizes) > 1:
        raise ValueError(f"stages[{i}] spans groups whose nodes differ in size"
                         f" ({', '.join(map(str, sorted(sizes)))} devices)")
    node = sizes.pop()
    for p in parts:
        if p.offset % node or p.devices % node:
            raise ValueError(f"stages[{i}] spans groups, so each part must be whole nodes of"
                             f" {node}; its part on {system.groups[p.group].name} is"
                             f" {p.devices} devices from rank {p.offset}")
    if node % st.tp:
        raise ValueError(f"stages[{i}] spans groups: tp={st.tp} must divide a node of {node}")


def part_system(system: MixedSystemSpec, stage: MixedStage, group: int) -> SystemSpec:
    """The spanning ``stage`` as a system of one device type: ``group``'s device (with the
    smallest memory of the stage's groups) on nodes of ``group``'s node links, as many as the
    stage spans, joined by the cluster's network between nodes."""
    home = system.groups[group]
    node = home.network.dims[0]
    nodes = max(stage.devices // node.npus, 1)
    dims = (node,) if nodes == 1 else (node, _sub_dim(system.link, nodes))
    smallest = min(system.groups[g].device.hbm_bytes for g in stage.groups)
    names = "+".join(system.groups[g].name for g in stage.groups)
    return SystemSpec(name=f"{home.name}[{names}]",
                      device=replace(home.device, hbm_bytes=smallest),
                      network=Network(dims=dims, scheduling=home.network.scheduling))
