"""Many strategies of one (model, system, training) at once, each figure equal to
:func:`simcore.estimate` on that strategy.

A strategy's estimate splits into what depends on the schedule and v and what does not. The
strategies that differ only in (schedule, v) form a group; per group, the scalar functions of
:mod:`simcore.megatron.step` run once (the plan, the layer, the ends, the gradient reduction, the
optimizer, the memory parts) on three stage types: the first stage, one middle stage and the
last (the middle stages are identical but for the activations they hold in flight, which fall
from the second stage on, so the second is the middle's peak). The plans of all groups share the
layer's kernels and activations by the strategy fields they read (``StepPlan(shared=...)``),
and each placement's collective times are memoised per message size as for one estimate
(:func:`simcore.megatron.placement.axis_networks`). Then numpy assembles every strategy: the
pp sends of its v, its stages' times, the pipeline (``m t_max + (sum - t_max) / v``, summed
stage by stage in the same order), the slowest and the peak stage, the step, MFU and tokens/s,
with the same floating-point operations in the same order as the scalar path: the figures are
bit-identical (tests/test_batched_estimate.py).

Covered: the megatron convention (dense GPT and Llama models), every schedule (ZB-H1 too: its
weight-gradient times per stage type), ZeRO stage and HSDP shard group (a field of the group),
recompute, precision, placement, even and uneven stages, any network (congestion-aware too:
the collectives are the scalar ones). Falls back to :func:`simcore.estimate` one by one: the
``stage`` and ``mlp`` conventions, mixture-of-experts models, and a batch holding a pipeline
layout whose middle stages differ. Mixed systems have their own
entry point (:func:`simcore.estimate_mixed`) and are not taken here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from operator import attrgetter
from typing import Any

import numpy as np

import simcore
from simcore.conventions import implementation
from simcore.megatron.batched_result import (
    BatchResult,
    MemoryColumns,
    TimeColumns,
    from_estimates,
)
from simcore.megatron.checks import valid_plans
from simcore.megatron.layer_step import dense_layer
from simcore.megatron.layers import layer_shape
from simcore.megatron.pipeline import in_flight, zbv_bubble
from simcore.megatron.plan import StepPlan
from simcore.megatron.recompute import recomputed_fraction
from simcore.megatron.stage_memory import (
    fixed_memory,
    stage_activations,
    step_copy_beyond,
)
from simcore.megatron.step import (
    _dp_time,
    _ends,
    _model_flops,
    _optimizer_time,
    _recompute_flops,
    _stage,
    estimate_megatron,
    pp_send,
)
from simcore.specs import (
    ZERO_BUBBLE,
    Convention,
    ModelSpec,
    Schedule,
    Strategy,
    SystemSpec,
    TrainingSpec,
)

__all__ = ["BatchResult", "estimate_many"]

_PER_GROUP = tuple(f.name for f in fields(Strategy) if f.name not in ("schedule", "v"))
_fields_key = attrgetter(*_PER_GROUP)


def _group_key(s: Strategy) -> tuple[Any, ...]:
    """What a group's strategies share: every field but the schedule and v, and whether the
    schedule is zero-bubble (its B pass exposes the backward's tp communication, so its layer
    differs), whether it is zbv (its first stage holds the LM head too) and, under
    ``recompute_layers`` (counted per model chunk), v."""
    return (*_fields_key(s), s.schedule in ZERO_BUBBLE, s.schedule is Schedule.ZBV,
            s.v if s.recompute_layers is not None else 0)

FIRST, MIDDLE, LAST = 0, 1, 2
"""The stage types (columns of the per-type arrays): stage 0, stage 1 (the middle stages'
peak, when pp >= 3) and stage pp - 1 (when pp >= 2; with pp = 1 the first stage is the last)."""

_STAGE_FIELDS = ("compute", "tp", "sp", "fsdp", "wgrad", "bwd", "offload", "bwd_pass")
_MEMORY_FIXED = ("weights", "gradients", "optimizer", "gathered_weights", "comm_buffers",
                 "overhead", "tracked")
"""The memory parts that do not depend on the schedule (activations do, through in-flight)."""


def estimate_many(model: ModelSpec, system: SystemSpec, training: TrainingSpec,
                  strategies: Sequence[Strategy],
                  convention: Convention | None = None) -> BatchResult:
    """:func:`simcore.estimate` of every strategy, as arrays in the strategies' order.

    Raises the ValueError ``simcore.estimate`` would raise for the first strategy whose shapes
    do not divide. The ``stage`` and ``mlp`` conventions are estimated one by one."""
    convention = convention or simcore.convention_of(model)
    if (convention is not Convention.MEGATRON
            or implementation(convention).estimate is not estimate_megatron
            or not strategies or model.moe is not None  # MoE: one by one
            or any(_middles_differ(s, model.layers) for s in strategies)):
        return from_estimates([simcore.estimate(model, system, training, s, convention)
                               for s in strategies])
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, s in enumerate(strategies):
        groups.setdefault(_group_key(s), []).append(i)
    g = _Groups(model, system, training, strategies, len(groups))
    for index, members in enumerate(groups.values()):
        g.add(index, members)
    g.finish()
    _check_all(model, system, training, strategies, g)
    return g.assemble()


def _middles_differ(s: Strategy, layers: int) -> bool:
    """A pipeline layout whose middle stages hold different layer counts: the groups time one
    middle stage for all of them, so such a batch is estimated one by one."""
    if s.layout is None:
        return False
    middle = s.stage_layers(layers)[1:-1]
    return len(set(middle)) > 1


class _Groups:
    """The per-group results (arrays over the groups) and the per-strategy ones the groups fill
    (flights and activations, arrays over the strategies)."""

    def __init__(self, model: ModelSpec, system: SystemSpec, training: TrainingSpec,
                 strategies: Sequence[Strategy], n_groups: int) -> None:
        self.model, self.system, self.training = model, system, training
        self.strategies = strategies
        self.shared: dict[tuple[Any, ...], Any] = {}
        self.model_flops = _model_flops(model, layer_shape(model), training)
        k = n_groups
        # Per strategy, in group order (``order``: their positions in ``strategies``).
        self.order: list[int] = []
        self.groups: list[int] = []
        self.vs: list[int] = []
        self.interleaveds: list[bool] = []
        self.zbs: list[bool] = []
        self.zbvs: list[bool] = []
        self.stage_activations: tuple[list[np.ndarray], ...] = ([], [], [])
        self.pp = np.empty(k, np.int64)
        self.m = np.empty(k, np.int64)
        self.send = np.zeros(k)
        self.dp = np.empty(k)
        self.optimizer = np.empty(k)
        self.hardware_flops = np.empty(k)
        self.peak_flops = np.empty(k)
        self.present = np.zeros((k, 3), bool)
        self.stage = {name: np.zeros((k, 3)) for name in _STAGE_FIELDS}
        self.memory = {name: np.zeros((k, 3)) for name in _MEMORY_FIXED}
        self.step_copy = np.zeros((k, 3))  # the optimizer step's gradient copy, whole
        self.representative: list[Strategy] = []
        self.te = np.zeros(k, bool)

    def add(self, index: int, members: list[int]) -> None:
        """Group ``index``: the strategies at ``members``, equal but for schedule and v."""
        strategies = self.strategies
        rep = strategies[members[0]]
        simcore.check(self.model, self.system, self.training, rep)  # as estimate() would
        self.representative.append(rep)
        p = StepPlan(self.model, self.system, self.training, rep, self.shared)
        layer, ends = dense_layer(p), _ends(p)
        pp, m = rep.pp, p.m
        self.pp[index], self.m[index] = pp, m
        self.te[index] = p.te
        if pp > 1:
            self.send[index] = pp_send(p)
        types = [(FIRST, 0)]
        if pp >= 3:
            types.append((MIDDLE, 1))
        if pp >= 2:
            types.append((LAST, pp - 1))
        stages = [(column, _stage(p, layer, ends, i)) for column, i in types]
        self.dp[index] = max(_dp_time(p, st)[1] for _, st in stages)
        self.optimizer[index] = max(_optimizer_time(p, st) for _, st in stages)
        self.hardware_flops[index] = self.model_flops + recomputed_fraction(p) * (
            _recompute_flops(self.model, p.shape, self.training, rep.recompute))
        self.peak_flops[index] = self.system.device.peak_flops_per_s * rep.devices
        schedules = [(strategies[j].schedule, strategies[j].v) for j in members]
        self.order += members
        self.groups += [index] * len(members)
        self.vs += [v for _, v in schedules]
        self.interleaveds += [s is Schedule.INTERLEAVED for s, _ in schedules]
        self.zbs += [s is Schedule.ZB_H1 for s, _ in schedules]
        self.zbvs += [s is Schedule.ZBV for s, _ in schedules]
        missing = [MIDDLE, LAST][:3 - len(stages)]
        for column in missing:
            self.stage_activations[column].append(np.zeros(len(members)))
        for column, st in stages:
            self.present[index, column] = True
            for name in _STAGE_FIELDS:
                self.stage[name][index, column] = getattr(st, name)
            fixed = fixed_memory(p, st, pp)
            for name in _MEMORY_FIXED:
                self.memory[name][index, column] = getattr(fixed, name)
            self.step_copy[index, column] = fixed.step_copy  # the whole copy, weighed later
            flights = np.array([in_flight(s, st.index, pp, m, v) for s, v in schedules])
            self.stage_activations[column].append(stage_activations(p, st, flights, pp))

    def finish(self) -> None:
        """The per-strategy lists (in group order) as arrays in the strategies' order."""
        back = np.empty(len(self.order), np.int64)
        back[self.order] = np.arange(len(self.order))
        self.group = np.array(self.groups, np.int64)[back]
        self.v = np.array(self.vs, np.int64)[back]
        self.interleaved = np.array(self.interleaveds, bool)[back]
        self.zb = np.array(self.zbs, bool)[back]
        self.zbv = np.array(self.zbvs, bool)[back]
        self.activations = np.stack([np.concatenate(a) for a in self.stage_activations],
                                    axis=1)[back]

    def assemble(self) -> BatchResult:
        """Every strategy's figures from its group's and its own (schedule, v)."""
        g, v = self.group, self.v
        pp, m = self.pp[g], self.m[g]
        sends = self._sends(g, v)
        stage = self.stage
        present = self.present[g]
        # _Stage.time: compute + tp + sp + pp + fsdp + offload, per stage type (the first three
        # per group).
        times = (stage["compute"] + stage["tp"] + stage["sp"])[g]
        times += sends
        times += stage["fsdp"][g]
        times += stage["offload"][g]
        times[~present] = -np.inf
        slowest = np.argmax(times, axis=1)  # the first of the slowest, as max() picks
        rows = np.arange(len(g))
        t_max = times[rows, slowest]
        total = _stage_sum(times, pp)
        fill = total - t_max
        if self.zb.any():  # ZB-H1: fill -= wgrad_fill (sum W - W_slowest), as pipeline_time
            zb = self.zb
            wgrad = stage["wgrad"][g]
            fills = 1 + np.minimum(1, (m - 1) / np.maximum(pp - 1, 1))
            fill[zb] -= (fills * (_stage_sum(wgrad, pp) - wgrad[rows, slowest]))[zb]
        pipe = m * t_max + fill / v
        if self.zbv.any():  # each other stage's share of zbv_bubble, as zbv_time
            zbv = self.zbv
            share = self._zbv_shares(times[zbv], g[zbv], pp[zbv])
            pipe[zbv] = (m * t_max)[zbv] + _stage_sum(share, pp[zbv], but=slowest[zbv])
        del times

        def critical(name: str) -> np.ndarray:
            return m * stage[name][g, slowest]

        time = TimeColumns(
            compute=critical("compute"), tp=critical("tp"), sp=critical("sp"), dp=self.dp[g],
            pp=m * sends[rows, slowest], fsdp=critical("fsdp"), ep=np.zeros(len(g)),
            bubble=pipe - m * t_max,
            optimizer=self.optimizer[g], comm=np.zeros(len(g)), offload=critical("offload"),
        )
        step = _sum(getattr(time, name) for name in ("compute", "tp", "sp", "dp", "pp", "fsdp",
                                                     "ep", "bubble", "optimizer", "comm",
                                                     "offload"))
        memory, peak_memory, peak_stage, fits = self._memory(g, pp, present)
        hbm = self.system.device.hbm_bytes
        capacity = self.peak_flops[g] * step
        hardware_flops = self.hardware_flops[g]
        return BatchResult(
            step_time=step, time=time, memory=memory, peak_memory=peak_memory,
            peak_stage=peak_stage, model_flops=np.full(len(g), self.model_flops),
            hardware_flops=hardware_flops, mfu=self.model_flops / capacity,
            hfu=hardware_flops / capacity,
            tokens_per_s=self.training.global_batch * self.training.seq_len / step,
            hbm_bytes=np.full(len(g), hbm), fits=fits,
        )

    def _zbv_shares(self, times: np.ndarray, g: np.ndarray, pp: np.ndarray) -> np.ndarray:
        """Each stage type's :func:`zbv_bubble` over p - 1 (:func:`zbv_time`), from its time,
        backward (B + W) and weight-gradient W per micro-batch, halved into chunks."""
        bwd, w = self.stage["bwd_pass"][g], self.stage["wgrad"][g]
        depth = pp[:, None]
        bubble = zbv_bubble(depth, (times - bwd) / 2, (bwd - w) / 2, w / 2)
        return np.where(np.isfinite(times), bubble / (depth - 1), 0.0)

    def _sends(self, g: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Each strategy's pipeline transfers per micro-batch on each stage type
        (:func:`simcore.megatron.step._sends`): 2 v sends, each hidden behind an op's compute
        where the stack overlaps them (:func:`simcore.megatron.step.pp_exposed`)."""
        send = self.send[g][:, None]
        twice = (2 * v)[:, None]
        if not self.te.any():
            return np.repeat(twice * send, 3, axis=1)
        op = self.stage["compute"][g] / twice
        slowdown = self.system.device.overlap_slowdown
        hidden = np.maximum(0.0, send - op) + slowdown * np.minimum(send, op)
        overlapped = (self.interleaved & self.te[g])[:, None]
        return twice * np.where(overlapped, hidden, send)

    def _memory(self, g: np.ndarray, pp: np.ndarray,
                present: np.ndarray) -> tuple[MemoryColumns, np.ndarray, np.ndarray, np.ndarray]:
        """The peak stage's parts and total, its index, and whether every stage fits."""
        fixed = self.memory
        order = [f.name for f in fields(MemoryColumns)]  # MemoryParts.total's order
        at = order.index("activations")
        totals = _sum(fixed[name] for name in order[:at])[g]
        totals += self.activations
        for name in order[at + 1:-1]:  # the step's copy last, as MemoryParts.total adds it
            totals += fixed[name][g]
        step_copy = step_copy_beyond(self.step_copy[g],
                                     self.activations + fixed["comm_buffers"][g])
        totals += step_copy
        hbm = self.system.device.hbm_bytes
        fits = np.all(~present | (totals <= hbm), axis=1)
        ratio = totals / hbm
        ratio[~present] = -np.inf
        peak = np.argmax(ratio, axis=1)
        del ratio
        peak_stage = np.where(peak == FIRST, 0, np.where(peak == MIDDLE, 1, pp - 1))
        rows = np.arange(len(g))
        memory = MemoryColumns(**{
            name: self.activations[rows, peak] if name == "activations"
            else step_copy[rows, peak] if name == "step_copy" else fixed[name][g, peak]
            for name in order})
        return memory, totals[rows, peak], peak_stage.astype(np.int64), fits


def _sum(arrays: Any) -> np.ndarray:
    """Left to right, as Python's ``sum`` adds (0 + a + b + ...)."""
    out: np.ndarray | None = None
    for a in arrays:
        out = a.copy() if out is None else out + a
    assert out is not None
    return out


def _stage_sum(times: np.ndarray, pp: np.ndarray, but: np.ndarray | None = None) -> np.ndarray:
    """``sum(stage_times)`` of each strategy's pp stages, first to last, as
    :func:`simcore.megatron.pipeline.pipeline_time` adds them; ``but``: each strategy's stage
    type left out once (its first stage of that type, as
    :func:`simcore.megatron.pipeline.zbv_time` skips the slowest), which adds 0.0 instead, so the
    sums agree with the scalar ones to the last bit."""
    total = np.empty(len(pp))
    for depth in np.unique(pp):
        rows = pp == depth
        skip = np.full(int(rows.sum()), -1) if but is None else but[rows]
        acc = np.where(skip == FIRST, 0.0, times[rows, FIRST])
        for j in range(depth - 2):
            acc += np.where((skip == MIDDLE) & (j == 0), 0.0, times[rows, MIDDLE])
        if depth >= 2:
            acc += np.where(skip == LAST, 0.0, times[rows, LAST])
        total[rows] = acc
    return total


def _check_all(model: ModelSpec, system: SystemSpec, training: TrainingSpec,
               strategies: Sequence[Strategy], g: _Groups) -> None:
    """Raise what :func:`simcore.estimate` raises for the first strategy it would reject: the
    representatives were checked one by one (the rules of the fields a group shares); every
    strategy goes through :func:`valid_plans` (those of the schedule and v)."""
    reps = g.representative
    columns = {name: np.array([getattr(r, name) for r in reps])[g.group]
               for name in ("dp", "tp", "pp", "sp", "micro_batch", "sequence_parallel")}
    for name in ("first_stage_layers", "last_stage_layers"):
        columns[name] = np.array([getattr(r, name) or 0 for r in reps])[g.group]
    columns["v"], columns["interleaved"] = g.v, g.interleaved
    columns["zero_bubble"], columns["zbv"] = g.zb | g.zbv, g.zbv
    ok = valid_plans(model, system, training, columns)
    if not ok.all():
        bad = strategies[int(np.argmin(ok))]
        simcore.check(model, system, training, bad)
        raise ValueError(f"strategy {bad} is not a valid plan")  # the check above says why
