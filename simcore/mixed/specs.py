"""A cluster of device groups and a plan whose pipeline stages sit on them."""

from __future__ import annotations

from dataclasses import dataclass

from simcore.network import NetworkDim
from simcore.specs import Recompute, Schedule, SystemSpec, ZeroStage

__all__ = ["MixedSystemSpec", "MixedStage", "MixedPlan"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MixedSystemSpec:
    """Node groups of one device type each, joined by the network between nodes.

    Each group is a homogeneous :class:`SystemSpec`: its device and its network, innermost first
    (the node's links, then the links between the group's nodes). ``link`` joins nodes of
    different groups (a stage boundary that crosses from one group to the next)."""

    name: str
    groups: tuple[SystemSpec, ...]
    link: NetworkDim

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError("a mixed system needs at least one group")
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ValueError(f"group names must differ, but got {', '.join(names)}")

    @property
    def devices(self) -> int:
        return sum(g.devices for g in self.groups)

    def group(self, name: str) -> SystemSpec:
        for g in self.groups:
            if g.name == name:
                return g
        raise ValueError(f"no group {name!r}; groups: {', '.join(g.name for g in self.groups)}")


@dataclass(frozen=True, slots=True)
class MixedStage:
    """One pipeline stage: the group it runs on, its tp and dp degrees and its layers.

    ``span``: further groups the stage's ranks run on when its own group's are used up, in order
    (a stage whose data-parallel replicas sit on different device types, as Metis allows and
    DeepSpeed runs): each part whole nodes, priced at its slowest part
    (:mod:`simcore.mixed.estimate`)."""

    group: int
    """Index into :attr:`MixedSystemSpec.groups`."""
    tp: int
    dp: int
    layers: int
    span: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("tp", "dp", "layers"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"`{name} >= 1` must hold, but got {name}={value}")
        if self.group < 0:
            raise ValueError(f"`group >= 0` must hold, but got group={self.group}")
        if self.span:  # a search's stages have none: nothing more to check for them
            if min(self.span) < 0:
                raise ValueError(f"`group >= 0` must hold, but got span={self.span}")
            if len(set(self.groups)) != len(self.groups):
                raise ValueError(f"a stage spans each group once, but got groups {self.groups}")

    @property
    def devices(self) -> int:
        return self.tp * self.dp

    @property
    def groups(self) -> tuple[int, ...]:
        """The groups the stage runs on: its own, then its span."""
        return (self.group, *self.span)


@dataclass(frozen=True, slots=True, kw_only=True)
class MixedPlan:
    """Stages in pipeline order, the micro-batches of one step, and the knobs all stages share.

    Each stage's data-parallel replicas split every micro-batch of ``global_batch /
    micro_batches`` sequences between them, so the per-replica micro-batch differs between
    stages of different dp."""

    stages: tuple[MixedStage, ...]
    micro_batches: int
    recompute: Recompute = Recompute.NONE
    zero: ZeroStage = ZeroStage.NONE
    schedule: Schedule = Schedule.ONE_F_ONE_B
    sequence_parallel: bool = True

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a plan needs at least one stage")
        if self.micro_batches < 1:
            raise ValueError(f"`micro_batches >= 1` must hold, but got {self.micro_batches}")
        if self.schedule in (Schedule.INTERLEAVED, Schedule.ZBV, Schedule.ZB_H1):
            raise ValueError(f"schedule={self.schedule.value} is not modelled on mixed systems;"
                             " use 1f1b or gpipe")

    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def groups_used(self) -> tuple[int, ...]:
        """The groups the stages run on (their spans included), each once, in pipeline order."""
        return tuple(dict.fromkeys(g for st in self.stages for g in st.groups))

    @property
    def devices(self) -> int:
        return sum(st.devices for st in self.stages)

    def label(self, system: MixedSystemSpec) -> str:
        """``a100:tp4dp1x2[5,5] > v100:tp2dp2x1[6]`` - runs of stages per group, their layers."""
        runs: list[tuple[tuple[int, ...], int, int, list[int]]] = []
        for st in self.stages:
            if runs and runs[-1][:3] == (st.groups, st.tp, st.dp):
                runs[-1][3].append(st.layers)
            else:
                runs.append((st.groups, st.tp, st.dp, [st.layers]))
        parts = [f"{'+'.join(system.groups[g].name for g in gs)}:tp{tp}dp{dp}x{len(ls)}"
                 f"[{','.join(map(str, ls))}]" for gs, tp, dp, ls in runs]
        zero = f" zero{int(self.zero)}" if self.zero else ""
        return " > ".join(parts) + f" m{self.micro_batches} {self.recompute.value}{zero}"
