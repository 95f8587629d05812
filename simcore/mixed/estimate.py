"""One training step on a cluster that mixes device types.

Each pipeline stage runs on one device group (or spans several, below), with its own tp and dp,
as Megatron-LM runs a stage: its layers, kernels and collectives are those of
:mod:`simcore.megatron` on the group's device and on the links the stage's devices really span
(the stage is a contiguous block of the group's ranks: tp inside a node when it fits, dp over
the rest). Stages differ in speed, so:

- the step is the pipeline of unequal stages, ``m * slowest + (sum - slowest)``
  (:func:`simcore.megatron.pipeline.pipeline_time`; 1F1B and GPipe alike, no interleaving);
- a stage boundary between groups sends over the system's ``link`` (the network between nodes),
  inside a group over the node's links or the group's network between nodes, whichever the two
  stages' ranks span; when the two stages' dp or tp differ, the activation is re-sharded: each
  rank sends and receives its share, the larger of the two sides sets the time;
- each stage reduces its gradients over its own dp group on its own links, hidden behind its
  last backward as in the one-device-type estimate; the step waits for the slowest;
- memory is checked per stage against that stage's device's HBM.

A stage whose ranks continue from one group into the next (``MixedStage.span``: its replicas
on several device types, as Metis plans them) is priced at its slowest part's pace: the longest
of its micro-batch times as it would run all on each part's device, on that part's node links
for every node it spans and ``link`` between them, with the smallest part's HBM
(:mod:`simcore.mixed.span`); boundaries to and from it send over ``link``.

Left out (stated, not hidden): context parallelism and interleaved schedules on mixed systems,
and uneven per-replica batches inside a stage.

On a system of one group, a plan of equal stages that are whole nodes is the one-device-type
estimate to the last bit (``tests/test_mixed_estimate.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simcore.collectives import p2p_time
from simcore.estimate import Estimate
from simcore.megatron.checks import check_plan
from simcore.megatron.layer_step import dense_layer
from simcore.megatron.parts import Ends, Layer, Stage
from simcore.megatron.pipeline import in_flight
from simcore.megatron.placement import _sub_dim
from simcore.megatron.plan import StepPlan
from simcore.megatron.stage_memory import stage_memory
from simcore.megatron.step import _ends, _stage, assemble
from simcore.mixed.profile import LayerProfiles, profiled_ends, profiled_layer
from simcore.mixed.span import part_system, stage_parts
from simcore.mixed.specs import MixedPlan, MixedStage, MixedSystemSpec
from simcore.network import Network, NetworkDim, PerNetwork, Topology
from simcore.specs import ModelSpec, Strategy, SystemSpec, TrainingSpec

__all__ = ["estimate_mixed", "check_mixed", "stage_system", "stage_lines", "with_layers",
           "StageCosts", "Placed"]


def _node_size(group: SystemSpec) -> int:
    return group.network.dims[0].npus


def _block_dims(group: SystemSpec, devices: int) -> tuple[NetworkDim, ...] | None:
    """The dimensions a contiguous block of ``devices`` ranks spans, or None if no such block
    fits the group's shape (it must fill whole inner dimensions before the next)."""
    dims: list[NetworkDim] = []
    left = devices
    for i, dim in enumerate(group.network.dims):
        if left == 1:
            break
        piece = min(dim.npus, left)
        # a block inside a node divides it; between nodes, a switch joins any of its ports (3
        # nodes hold a block of 2) where a ring or a mesh needs the block to tile it
        tiles = dim.npus % piece == 0 or (i > 0 and dim.topology is Topology.SWITCH)
        if not tiles or left % piece:
            return None
        dims.append(_sub_dim(dim, piece))
        left //= piece
    if left != 1:
        return None
    return tuple(dims) or (_sub_dim(group.network.dims[0], 1),)


_blocks: PerNetwork[dict[tuple, SystemSpec | None]] = PerNetwork(lambda _: {})


def stage_system(group: SystemSpec, devices: int) -> SystemSpec | None:
    """The group's first ``devices`` ranks as a system of their own (the same object each time,
    so collective timings are memoised once), or None if that block does not fit its shape."""
    per = _blocks(group.network)  # groups may share a network object, not their device
    key = (devices, group.name, group.device)
    if key not in per:
        dims = _block_dims(group, devices)
        per[key] = None if dims is None else SystemSpec(
            name=f"{group.name}[{devices}]", device=group.device,
            network=Network(dims=dims, scheduling=group.network.scheduling))
    return per[key]


@dataclass(frozen=True, slots=True)
class Placed:
    """What one stage's own plan gives: its shapes, one layer and the ends, per micro-batch."""

    plan: StepPlan
    layer: Layer
    ends: Ends


class StageCosts:
    """Stage plans for one model, system and training step, each built once: a search prices
    thousands of plans from a few hundred (group, tp, dp, micro-batch, knobs) combinations."""

    def __init__(self, model: ModelSpec, system: MixedSystemSpec, training: TrainingSpec,
                 profiles: LayerProfiles | None = None) -> None:
        self.model, self.system, self.training = model, system, training
        if profiles is not None and profiles.layers != model.layers:
            raise ValueError(f"profile {profiles.name} is of a model of {profiles.layers}"
                             f" transformer layers but {model.name} has {model.layers}")
        self.profiles = profiles
        """Measured layer costs that replace the roofline's (:mod:`simcore.mixed.profile`)."""
        self._placed: dict[tuple, Placed] = {}
        self.sends: dict[tuple, float] = {}
        """Seconds of one send, by (link, bytes, sending device)."""
        self.lines: dict[tuple, tuple[float, float, float, float]] = {}
        """A stage's time and memory as affine functions of its layers, by its plan and place."""

    def strategy(self, plan: MixedPlan, stage: MixedStage) -> Strategy:
        micro = self.training.global_batch // (plan.micro_batches * stage.dp)
        return Strategy(dp=stage.dp, tp=stage.tp, pp=1, micro_batch=max(micro, 1),
                        recompute=plan.recompute, zero=plan.zero, schedule=plan.schedule,
                        sequence_parallel=plan.sequence_parallel)

    @staticmethod
    def key(plan: MixedPlan, stage: MixedStage) -> tuple:
        return (stage.group, stage.tp, stage.dp, plan.micro_batches, plan.recompute, plan.zero,
                plan.schedule, plan.sequence_parallel, stage.span)

    def placed(self, plan: MixedPlan, stage: MixedStage, group: int | None = None) -> Placed:
        """The stage's plan and costs; a stage that spans groups, as it would run all on
        ``group``'s device (:func:`_stages` takes the slowest)."""
        key = (*self.key(plan, stage), group)
        found = self._placed.get(key)
        if found is None:
            if stage.span:
                if group is None:
                    raise ValueError("a stage that spans groups is placed on one of them")
                found = self._place(plan, stage, group, part_system(self.system, stage, group))
            else:
                group = self.system.groups[stage.group]
                sub = stage_system(group, stage.devices)
                if sub is None:
                    raise ValueError(_block_message(group, stage.devices))
                found = self._place(plan, stage, stage.group, sub)
            self._placed[key] = found
        return found

    def _place(self, plan: MixedPlan, stage: MixedStage, group: int,
               sub: SystemSpec) -> Placed:
        strategy = self.strategy(plan, stage)
        check_plan(self.model, sub, self.training, strategy)
        p = StepPlan(self.model, sub, self.training, strategy)
        layer, ends = dense_layer(p), _ends(p)
        if self.profiles is not None:
            device = self.system.groups[group].device.name
            measured = self.profiles.get(device, stage.tp, strategy.micro_batch)
            layer = profiled_layer(layer, measured, plan.recompute)
            ends = profiled_ends(measured)
        return Placed(p, layer, ends)


def _block_message(group: SystemSpec, devices: int) -> str:
    shape = " x ".join(str(d.npus) for d in group.network.dims)
    return (f"a stage of {devices} devices does not fit group {group.name} ({shape}): use a"
            f" divisor of its node size {_node_size(group)} or whole nodes, starting on a node"
            " (or at a multiple of its size inside one)")


def check_mixed(model: ModelSpec, system: MixedSystemSpec, training: TrainingSpec,
                plan: MixedPlan) -> None:
    """Raise ValueError, naming the field, if :func:`estimate_mixed` could not run the plan."""
    layers = sum(st.layers for st in plan.stages)
    if layers != model.layers:
        raise ValueError(f"the stages hold {layers} layers but {model.name} has {model.layers};"
                         " the layer split must add up to the model's layers")
    used = [0] * len(system.groups)
    # a stage that spans groups is laid out by stage_parts; the search's plans have none
    parts = stage_parts(system, plan) if any(st.span for st in plan.stages) else None
    for i, st in enumerate(plan.stages):
        if parts is not None:
            offset = parts[i][0].offset
            for part in parts[i]:
                used[part.group] += part.devices
        else:
            if st.group >= len(system.groups):
                raise ValueError(f"stages[{i}].group={st.group} but {system.name} has"
                                 f" {len(system.groups)} groups")
            offset = used[st.group]
            used[st.group] += st.devices
        if not st.span:
            group = system.groups[st.group]
            node = _node_size(group)
            aligned = offset % (st.devices if st.devices <= node else node) == 0
            if stage_system(group, st.devices) is None or not aligned:
                raise ValueError(f"stages[{i}]: {_block_message(group, st.devices)}")
        replicas = plan.micro_batches * st.dp
        if training.global_batch % replicas:
            raise ValueError(
                f"stages[{i}]: micro_batches={plan.micro_batches} * dp={st.dp} = {replicas} must"
                f" divide global_batch={training.global_batch} (each replica takes a whole"
                " share of every micro-batch)")
    for g, n in zip(system.groups, used):
        if n > g.devices:
            raise ValueError(f"the stages on group {g.name} use {n} devices but it has"
                             f" {g.devices}")


def _offsets(plan: MixedPlan, system: MixedSystemSpec) -> list[int]:
    """Each stage's first rank inside its group (a group's stages are laid out in order)."""
    if any(st.span for st in plan.stages):
        return [parts[0].offset for parts in stage_parts(system, plan)]
    used = [0] * len(system.groups)  # the search's plans: no stage spans groups
    out = []
    for st in plan.stages:
        out.append(used[st.group])
        used[st.group] += st.devices
    return out


def _boundary_time(costs: StageCosts, plan: MixedPlan, k: int, offsets: list[int]) -> float:
    """Seconds to send one micro-batch's activation (or its gradient) from stage k to k + 1."""
    system, training, model = costs.system, costs.training, costs.model
    a, b = plan.stages[k], plan.stages[k + 1]
    sequences = training.global_batch / plan.micro_batches
    full = sequences * training.seq_len * model.hidden * training.bytes_per_activation
    size = int(max(full / (a.dp * a.tp), full / (b.dp * b.tp)))
    if a.group != b.group or a.span or b.span:
        dim = system.link
    else:
        group = system.groups[a.group]
        node = _node_size(group)
        same_node = offsets[k] // node == offsets[k + 1] // node
        dim = group.network.dims[0] if same_node or len(group.network.dims) == 1 \
            else group.network.dims[-1]
    launch = system.groups[a.group].device.collective_launch_s
    key = (id(dim), size, launch)
    found = costs.sends.get(key)
    if found is None:
        found = p2p_time(_link_network(dim), 0, 1, size) + dim.call_latency_s + launch
        costs.sends[key] = found
    return found


_pairs: dict[int, tuple[NetworkDim, Network]] = {}


def _link_network(dim: NetworkDim) -> Network:
    found = _pairs.get(id(dim))
    if found is None or found[0] is not dim:
        found = (dim, Network(dims=(_sub_dim(dim.for_sends(), 2),)))
        _pairs[id(dim)] = found
    return found[1]


def _sends(costs: StageCosts, plan: MixedPlan) -> list[float]:
    """Per stage and micro-batch: its activation forward and its gradient backward, each over
    the boundary it crosses (the end stages send both over their one boundary, as a pipeline of
    one device type charges every stage two sends)."""
    pp = plan.pp
    if pp == 1:
        return [0.0]
    offsets = _offsets(plan, costs.system)
    bounds = [_boundary_time(costs, plan, k, offsets) for k in range(pp - 1)]
    return [(bounds[i] if i < pp - 1 else bounds[i - 1]) + (bounds[i - 1] if i > 0 else bounds[i])
            for i in range(pp)]


def _stages(costs: StageCosts, plan: MixedPlan) -> list[tuple[Placed, Stage]]:
    out = []
    for i, (st, sends) in enumerate(zip(plan.stages, _sends(costs, plan))):
        # a stage spanning groups waits each micro-batch for its slowest part: its time as it
        # would run all on each part's device, the longest (its ends included)
        if not st.span:
            placed = costs.placed(plan, st)
            out.append((placed, _stage(placed.plan, placed.layer, placed.ends, i,
                                       layers=st.layers, pp=plan.pp, pp_time=sends)))
            continue
        options = [costs.placed(plan, st, g) for g in st.groups]
        out.append(max(((p, _stage(p.plan, p.layer, p.ends, i, layers=st.layers, pp=plan.pp,
                                   pp_time=sends)) for p in options),
                       key=lambda pair: pair[1].time))
    return out


def estimate_mixed(model: ModelSpec, system: MixedSystemSpec, training: TrainingSpec,
                   plan: MixedPlan, costs: StageCosts | None = None,
                   profiles: LayerProfiles | None = None) -> Estimate:
    """Estimate one training step of ``model`` on a mixed ``system`` split by ``plan``.

    ``costs`` (for the same model, system and training) reuses stage plans between calls;
    ``profiles`` replace the roofline's layer costs where given (``costs`` carries its own)."""
    check_mixed(model, system, training, plan)
    costs = costs or StageCosts(model, system, training, profiles)
    stages = [(placed.plan, st) for placed, st in _stages(costs, plan)]
    if any(st.span for st in plan.stages):
        peak = sum(system.groups[part.group].device.peak_flops_per_s * part.devices
                   for parts in stage_parts(system, plan) for part in parts)
    else:
        peak = sum(sp.system.device.peak_flops_per_s * s.devices
                   for (sp, _), s in zip(stages, plan.stages))
    return assemble(model, training, stages, pp=plan.pp, m=plan.micro_batches, v=1,
                    recompute=plan.recompute, peak_flops_per_s=peak)


def with_layers(plan: MixedPlan, layers: list[int]) -> MixedPlan:
    """The same plan with another layer split."""
    return replace(plan, stages=tuple(replace(st, layers=n)
                                      for st, n in zip(plan.stages, layers)))


def stage_lines(costs: StageCosts, plan: MixedPlan) -> list[tuple[float, float, float, float]]:
    """Per stage, (time, seconds per layer, memory, bytes per layer) as affine functions of its
    layer count: ``time(n) = time + n * per_layer``; for the layer split."""
    lines = []
    pp = plan.pp
    for i, (st, sends) in enumerate(zip(plan.stages, _sends(costs, plan))):
        key = (costs.key(plan, st), i == 0, i == pp - 1, pp, sends,
               in_flight(plan.schedule, i, pp, plan.micro_batches, 1))
        line = costs.lines.get(key)
        if line is None:
            placed = costs.placed(plan, st)
            zero_, one = (_stage(placed.plan, placed.layer, placed.ends, i, layers=n, pp=pp,
                                 pp_time=sends) for n in (0, 1))
            mem0, mem1 = (stage_memory(placed.plan, s, pp)[0].total for s in (zero_, one))
            line = (zero_.time, one.time - zero_.time, mem0, mem1 - mem0)
            costs.lines[key] = line
        lines.append(line)
    return lines
