"""Plans on a cluster that mixes device types, searched whole.

A plan (:class:`simcore.mixed.MixedPlan`) is chosen in four parts:

1. which device groups carry the pipeline, and in which order (a group may be left idle: the
   space holds every group alone too, so a study shows whether mixing pays);
2. per group, its stages' size and their tp (inside a node) and dp: every stage of a group has
   the same shape and the group's devices are all used;
3. the micro-batches of a step and the knobs every stage shares (recompute, ZeRO);
4. the layer split, which is not searched but solved: stage ``k`` takes ``a_k + n_k t_k``
   seconds per micro-batch for ``n_k`` layers (affine: its ends, sends and layers), and the
   pipeline takes ``(m - 1) max_k + sum_k`` of them (:func:`simcore.megatron.pipeline_time`).
   :func:`balanced_split` finds the split that minimises exactly that, within each stage's HBM
   (a min-max greedy, optimal for the slowest stage, then the larger bounds that could still
   lower the sum, each solved by filling the fastest stages first).

Parts 1-3 are enumerated exhaustively (:func:`skeletons`); with part 4 solved, the search
covers the whole space and its best plan is the best there is under the estimate.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import pandas as pd

from search_spaces.space import divisors
from simcore.mixed import MixedPlan, MixedStage, MixedSystemSpec, stage_system
from simcore.mixed.estimate import StageCosts, estimate_mixed, stage_lines, with_layers
from simcore.mixed.profile import LayerProfiles
from simcore.specs import ModelSpec, Recompute, Schedule, TrainingSpec, ZeroStage

__all__ = [
    "GroupLayout",
    "MixedResult",
    "MixedSpace",
    "balanced_split",
    "group_layouts",
    "plan_row",
    "plans_of",
    "result_table",
    "search_mixed",
    "skeletons",
    "space_size",
]


@dataclass(frozen=True, slots=True)
class GroupLayout:
    """The stages one group carries: how many, and each one's tp and dp."""

    group: int
    stages: int
    tp: int
    dp: int


@dataclass(frozen=True)
class MixedSpace:
    """Allowed values of the knobs for one model, mixed system and training step."""

    model: ModelSpec
    system: MixedSystemSpec
    training: TrainingSpec
    tp: tuple[int, ...] = (1, 2, 4, 8)
    recompute: tuple[Recompute, ...] = (Recompute.NONE, Recompute.FULL)
    zero: tuple[ZeroStage, ...] = (ZeroStage.NONE,)
    schedule: Schedule = Schedule.ONE_F_ONE_B
    profiles: LayerProfiles | None = None
    """Measured layer costs in place of the roofline; stage shapes without one are left out."""


def group_layouts(space: MixedSpace, g: int) -> list[GroupLayout]:
    """Every way group ``g`` can carry stages: stage sizes that tile its nodes, tp inside a
    node that divides the heads, KV heads and FFN width."""
    group, model = space.system.groups[g], space.model
    node = group.network.dims[0].npus
    out = []
    for size in divisors(group.devices):
        stages = group.devices // size
        if stages > model.layers or stage_system(group, size) is None:
            continue
        for tp in space.tp:
            if (size % tp or tp > node or model.heads % tp or model.n_kv_heads % tp
                    or model.ffn_hidden % tp):
                continue
            out.append(GroupLayout(g, stages, tp, size // tp))
    return out


def skeletons(space: MixedSpace) -> Iterator[tuple[GroupLayout, ...]]:
    """Group orders (every non-empty ordered subset of the groups) times their layouts, with no
    more stages than layers."""
    layouts = [group_layouts(space, g) for g in range(len(space.system.groups))]
    for r in range(1, len(layouts) + 1):
        for order in itertools.permutations(range(len(layouts)), r):
            for chosen in itertools.product(*(layouts[g] for g in order)):
                if sum(c.stages for c in chosen) <= space.model.layers:
                    yield chosen


def micro_batch_counts(space: MixedSpace, chosen: tuple[GroupLayout, ...]) -> list[int]:
    """Micro-batch counts whose micro-batches every stage's replicas split evenly."""
    batch = space.training.global_batch
    return [m for m in divisors(batch) if all(batch % (m * c.dp) == 0 for c in chosen)]


def _min_sum(lines: list[tuple[float, float]], caps: list[int], layers: int) -> list[int]:
    """One layer each, the rest to the fastest stages first, within ``caps``."""
    n = [1] * len(lines)
    extra = layers - len(lines)
    for k in sorted(range(len(lines)), key=lambda k: lines[k][1]):
        give = min(caps[k] - 1, extra)
        n[k] += give
        extra -= give
    return n


def _cost(lines: list[tuple[float, float]], n: list[int], m: int) -> tuple[float, float]:
    times = [a + k * t for (a, t), k in zip(lines, n)]
    return (m - 1) * max(times) + sum(times), max(times)


def balanced_split(lines: list[tuple[float, float]], caps: list[int], layers: int,
                   m: int) -> list[int] | None:
    """Layers per stage (each >= 1 and <= its cap) minimising ``(m - 1) max + sum`` of the
    stage times ``a_k + n_k t_k``; None if the stages cannot hold the layers."""
    s = len(lines)
    if s > layers or any(c < 1 for c in caps) or sum(caps) < layers:
        return None
    n = [1] * s
    heap = [(a + 2 * t, k) for k, (a, t) in enumerate(lines) if caps[k] > 1]
    heapq.heapify(heap)
    for _ in range(layers - s):
        _, k = heapq.heappop(heap)
        n[k] += 1
        if n[k] < caps[k]:
            a, t = lines[k]
            heapq.heappush(heap, (a + (n[k] + 1) * t, k))
    if m == 1:
        return _min_sum(lines, caps, layers)
    best, slowest = _cost(lines, n, m)
    fastest = min(t for (_, t), c in zip(lines, caps) if c > 1) if layers > s else 0.0
    floor = sum(a + t for a, t in lines) + (layers - s) * fastest
    # A bound T can only pay if (m - 1) T + the least possible sum beats the best.
    limit = (best - floor) / (m - 1)
    # Every bound from the least slowest stage on: at each, the fastest stages filled first
    # give the least sum (the min-max split need not).
    bounds = sorted({slowest} | {a + j * t for k, (a, t) in enumerate(lines) if t > 0
                                 for j in range(n[k] + 1,
                                                min(caps[k], math.floor((limit - a) / t)) + 1)})
    for bound in bounds:
        if bound < slowest:  # a stage's next layer may end before the slowest stage does
            continue
        capped = [min(c, math.floor((bound - a) / t + 1e-9)) if t > 0 else c
                  for (a, t), c in zip(lines, caps)]
        if sum(capped) < layers:
            continue
        trial = _min_sum(lines, capped, layers)
        cost, _ = _cost(lines, trial, m)
        if cost < best:
            best, n = cost, trial
    return n


@dataclass
class MixedResult:
    """Every plan of the space with its estimate, best first."""

    space: MixedSpace
    table: pd.DataFrame
    plans: dict[str, MixedPlan] = field(default_factory=dict)
    skeletons: int = 0
    trials: int | None = None
    """None when every plan was estimated; else the Optuna trials that sampled the space."""
    interrupted: bool = False
    """Ctrl-C stopped the sampling before its trials were done (``trials`` says how many)."""

    def best(self, groups: str | None = None) -> pd.Series | None:
        """The fastest plan that fits (on exactly ``groups``, e.g. ``"a100"``), or None."""
        if self.table.empty:
            return None
        rows = self.table[self.table["fits"]]
        if groups is not None:
            rows = rows[rows["groups"] == groups]
        return None if rows.empty else rows.iloc[0]


def plans_of(space: MixedSpace, chosen: tuple[GroupLayout, ...]) -> Iterator[MixedPlan]:
    """The plans of one skeleton (before their layer split): micro-batch counts x knobs."""
    stages = tuple(MixedStage(c.group, c.tp, c.dp, 1) for c in chosen for _ in range(c.stages))
    for m in micro_batch_counts(space, chosen):
        for recompute in space.recompute:
            for zero in space.zero:
                yield MixedPlan(stages=stages, micro_batches=m, recompute=recompute, zero=zero,
                                schedule=space.schedule)


def _solve(space: MixedSpace, costs: StageCosts, plan: MixedPlan) -> MixedPlan | None:
    lines = stage_lines(costs, plan)
    caps = []
    for st, (_, _, memory, per_layer) in zip(plan.stages, lines):
        hbm = space.system.groups[st.group].device.hbm_bytes
        caps.append(0 if memory > hbm else
                    space.model.layers if per_layer <= 0 else int((hbm - memory) // per_layer))
    split = balanced_split([(a, t) for a, t, _, _ in lines], caps, space.model.layers,
                           plan.micro_batches)
    if split is None:  # no split fits: price the one that balances time, marked as not fitting
        split = balanced_split([(a, t) for a, t, _, _ in lines], [space.model.layers] * len(caps),
                               space.model.layers, plan.micro_batches)
    return None if split is None else with_layers(plan, split)


def plan_row(space: MixedSpace, costs: StageCosts, skeleton: MixedPlan) -> \
        tuple[MixedPlan, dict[str, object]] | None:
    """The skeleton with its layer split solved, and its row of the result's table; None when
    simcore cannot run it (no split holds the layers, or a shape such as tp and the sequence)."""
    try:
        plan = _solve(space, costs, skeleton)
        if plan is None:
            return None
        est = estimate_mixed(space.model, space.system, space.training, plan, costs)
    except ValueError:
        return None
    names = [g.name for g in space.system.groups]
    return plan, {
        "plan": plan.label(space.system),
        "groups": "+".join(dict.fromkeys(names[st.group] for st in plan.stages)),
        "stages": plan.pp, "micro_batches": plan.micro_batches,
        "recompute": plan.recompute.value, "zero": int(plan.zero),
        "step_time_s": est.step_time, "peak_memory_gb": est.peak_memory / 1e9,
        "peak_stage": est.peak_stage, "mfu": est.mfu, "fits": est.fits,
        "devices": plan.devices,
    }


def result_table(rows: list[dict[str, object]]) -> pd.DataFrame:
    """The plans best first: those that fit, by step time."""
    table = pd.DataFrame(rows)
    if not table.empty:
        table = table.sort_values(["fits", "step_time_s"], ascending=[False, True],
                                  kind="stable").reset_index(drop=True)
    return table


def space_size(space: MixedSpace) -> int:
    """An upper bound on the plans of the space (group orders x layouts x micro-batch counts x
    knobs, before the rule of no more stages than layers), computed without listing them."""
    per_group = [len(group_layouts(space, g)) for g in range(len(space.system.groups))]
    orders = sum(math.prod(per_group[g] for g in order)
                 for r in range(1, len(per_group) + 1)
                 for order in itertools.permutations(range(len(per_group)), r))
    counts = len(divisors(space.training.global_batch))
    return orders * counts * len(space.recompute) * len(space.zero)


def search_mixed(space: MixedSpace) -> MixedResult:
    """Estimate every plan of the space, each with its solved layer split."""
    costs = StageCosts(space.model, space.system, space.training, space.profiles)
    rows, plans, count = [], {}, 0
    for chosen in skeletons(space):
        count += 1
        for skeleton in plans_of(space, chosen):
            solved = plan_row(space, costs, skeleton)
            if solved is not None:
                plan, row = solved
                plans[str(row["plan"])] = plan
                rows.append(row)
    return MixedResult(space, result_table(rows), plans, count)
