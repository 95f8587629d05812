"""One training step as Megatron-LM runs it: time and memory per pipeline stage.

Each transformer layer is computed once per plan; stages differ only in how many layers they
hold, the embedding (first stage), the LM head and loss (last stage) and how many micro-batches
are in flight.

Time of a layer: the sum of its kernels (:mod:`simcore.megatron.kernels`), each with its floor:
the host's launch, wave quantisation of the GEMMs over the SMs, and the roofline of FLOPs at
the achievable FLOP/s against bytes at the achievable HBM bandwidth.

Communication:
- tp: per layer and micro-batch, 2 all-reduces forward and 2 backward of the layer's (b, s, h)
  activation (Narayanan section 3.3); with sequence parallelism an all-gather plus a
  reduce-scatter in their place (Korthikanti section 4.2.2). On the critical path.
- sp (context parallelism): K and V all-gathered over the sp group in forward, gathered again and
  their gradients reduce-scattered in backward, hidden behind the attention core when it is longer.
- pp: the (b, s, h/t) activation to the next stage forward and its gradient back, per
  micro-batch per chunk boundary (scatter/gather optimisation).
- dp: gradients all-reduced over dp * sp (reduce-scattered, then parameters all-gathered, with a
  distributed optimizer / ZeRO-1/2), in buckets during the last micro-batch's backward; the last
  bucket is always exposed.
- fsdp (ZeRO-3): each layer's weights all-gathered before its forward and backward, its gradients
  reduce-scattered after backward, prefetched behind the layer's compute; under HSDP over the
  shard group, and the gradient shards all-reduced across the replicas in the dp slot.

Hiding is not free: while a collective runs beside compute the two share the SMs and HBM, and
the compute slows by the device's ``overlap_slowdown`` (:func:`_hidden`). The exposed part of
each hidden collective (tp behind the wgrad GEMMs, sp behind the attention core, fsdp behind the
layer, dp behind the last backward) includes that slowdown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from simcore.estimate import Estimate, MemoryParts, StageEstimate, TimeParts
from simcore.megatron.calls import (
    cp_kv_calls,
    embedding_calls,
    fsdp_layer_calls,
    grad_reduction_calls,
    head_calls,
    tp_pair_calls,
)
from simcore.megatron.checks import check_plan
from simcore.megatron.layers import LayerShape
from simcore.megatron.pipeline import in_flight, pipeline_time
from simcore.megatron.plan import StepPlan, uses_flash_attention
from simcore.megatron.precision import FP8_BYTES
from simcore.megatron.states import model_state_bytes
from simcore.specs import (
    Axis,
    ModelSpec,
    Recompute,
    Schedule,
    Strategy,
    SystemSpec,
    TrainingSpec,
    ZeroStage,
)

__all__ = ["DDP_BUCKET_PARAMS", "estimate_megatron", "layer_time", "uses_flash_attention"]

DDP_BUCKET_PARAMS = 40_000_000
"""Megatron-LM's default gradient bucket (``ddp_bucket_size``: max(40M, 1M * dp) parameters)."""

_F = TypeVar("_F", float, np.ndarray)

OPTIMIZER_STATE_PASSES = 2
"""Adam reads and writes its fp32 states once per step."""


@dataclass(frozen=True, slots=True)
class _Layer:
    """One transformer layer for one micro-batch on one device (seconds)."""

    fwd_compute: float
    bwd_compute: float
    recompute: float
    tp_fwd: float
    tp_bwd: float
    sp_fwd: float
    sp_bwd: float
    fsdp_fwd: float
    fsdp_bwd: float

    @property
    def compute(self) -> float:
        return self.fwd_compute + self.bwd_compute + self.recompute

    @property
    def total(self) -> float:
        return (self.compute + self.tp_fwd + self.tp_bwd + self.sp_fwd + self.sp_bwd
                + self.fsdp_fwd + self.fsdp_bwd)


def _hidden(p: StepPlan, comm: float, compute: float) -> float:
    """Exposed time of ``comm`` run beside ``compute``: what it outlasts it by, plus the compute's
    slowdown while both run."""
    return max(0.0, comm - compute) + p.system.device.overlap_slowdown * min(comm, compute)


def _tp_layer_comm(p: StepPlan) -> float:
    """Two all-reduces (or all-gather + reduce-scatter pairs) of a (b, s, h) activation."""
    return 2 * p.comm.total(tp_pair_calls(p))


def _layer(p: StepPlan) -> _Layer:
    s = p.s
    kernels = p.kernels
    fwd, bwd = kernels.forward, kernels.backward
    tp = _tp_layer_comm(p)
    # Backward hides its tp communication behind the weight-gradient GEMMs (Megatron-LM's
    # asynchronous tensor-parallel all-reduce / all-gather; Korthikanti section 5).
    tp_bwd = _hidden(p, tp, kernels.wgrad)

    sp_fwd = sp_bwd = 0.0
    if s.sp > 1:
        gathers, scatters = cp_kv_calls(p)
        gather, scatter = p.comm.total(gathers), p.comm.total(scatters)
        core = p.kernels.core_forward
        sp_fwd = _hidden(p, gather, core)
        sp_bwd = _hidden(p, gather + scatter, 2 * core)

    if s.recompute is Recompute.FULL:
        recompute = fwd
        tp_recompute = tp
    elif s.recompute is Recompute.SELECTIVE:
        recompute = kernels.core_forward
        tp_recompute = 0.0
    else:
        recompute = tp_recompute = 0.0

    fsdp_fwd = fsdp_bwd = 0.0
    if s.zero is ZeroStage.PARAMETERS and p.shard_ranks > 1:
        gathers, scatters = fsdp_layer_calls(p)
        gather, scatter = p.comm.total(gathers), p.comm.total(scatters)
        fsdp_fwd = _hidden(p, gather, fwd)
        fsdp_bwd = _hidden(p, gather + scatter, bwd + recompute)
    return _Layer(fwd, bwd, recompute, tp, tp_bwd + tp_recompute, sp_fwd, sp_bwd, fsdp_fwd,
                  fsdp_bwd)


@dataclass(frozen=True, slots=True)
class _Ends:
    """The kernels outside the transformer layers, for one micro-batch (seconds)."""

    embedding_fwd: float
    embedding_bwd: float
    head_fwd: float
    """LM head GEMM and the loss on fp32 logits."""
    head_bwd: float
    head_wgrad: float = 0.0
    """The LM head's weight-gradient GEMM (part of head_bwd): a zero-bubble schedule's W."""


def _ends(p: StepPlan) -> _Ends:
    c, model, t = p.costs, p.model, p.s.tp
    h = model.hidden
    full = p.tokens * h * p.training.bytes_per_activation
    # Gather the token rows (+ GPT's learned positions and dropout); backward accumulates the
    # rows' gradients into the table.
    n = 2 if p.shape.dropout else 1
    embedding_fwd = n * c.elementwise(2 * full)
    embedding_bwd = n * c.elementwise(3 * full)
    logits = 4 * p.tokens * model.vocab / t  # fp32 logits for the loss
    head = (c.gemm(p.tokens, model.vocab / t, h), c.gemm(p.tokens, h, model.vocab / t),
            c.gemm(h, model.vocab / t, p.tokens))
    head_fwd = head[0] + 2 * c.elementwise(logits / 2)
    head_bwd = head[1] + head[2] + c.elementwise(2 * logits)
    return _Ends(embedding_fwd, embedding_bwd, head_fwd, head_bwd, head[2])


@dataclass(frozen=True, slots=True)
class _Stage:
    index: int
    layers: int
    params: float
    """Parameters this stage's device holds (already split by tp)."""
    compute: float
    tp: float
    sp: float
    pp: float
    fsdp: float
    bwd: float
    """Backward of one micro-batch: the window the gradient reduction hides behind."""
    wgrad: float = 0.0
    """Its weight-gradient GEMMs (part of compute): the W pass of a zero-bubble schedule."""

    @property
    def time(self) -> float:
        return self.compute + self.tp + self.sp + self.pp + self.fsdp


def _stage(p: StepPlan, layer: _Layer, ends: _Ends, i: int, *, layers: int | None = None,
           pp: int | None = None, pp_time: float | None = None) -> _Stage:
    """Stage ``i`` of ``pp`` (default the plan's) holding ``layers`` transformer layers (default
    the plan's count for stage ``i``, :meth:`Strategy.stage_layers`, or an equal share of another
    ``pp``); ``pp_time`` replaces the sends along the plan's pp axis (a pipeline whose stages sit
    on different device groups, :mod:`simcore.mixed`)."""
    s, model, shape = p.s, p.model, p.shape
    h, t = model.hidden, s.tp
    pp = s.pp if pp is None else pp
    if layers is None:
        layers = p.stage_layers[i] if pp == s.pp else model.layers // pp
    n = layers
    first, last = i == 0, i == pp - 1
    params = n * shape.layer_params / t
    compute = n * layer.compute
    tp = n * (layer.tp_fwd + layer.tp_bwd)
    if first:
        params += shape.embedding_params / t
        compute += ends.embedding_fwd + ends.embedding_bwd
        tp += p.comm.total(embedding_calls(p))
    if last:
        tied_here = model.tied_embeddings and pp == 1
        params += (2 * h if tied_here else shape.head_params) / t
        compute += ends.head_fwd + ends.head_bwd
        tp += p.comm.total(head_calls(p, False)) + p.comm.total(head_calls(p, True))
    sends = 0.0
    if pp_time is not None:
        sends = pp_time
    elif s.pp > 1:
        sends = 2 * s.v * pp_send(p)
    bwd = n * (layer.bwd_compute + layer.recompute + layer.tp_bwd)
    if first:
        bwd += ends.embedding_bwd
    wgrad = n * p.kernels.wgrad + (ends.head_wgrad if last else 0.0)
    return _Stage(i, n, params, compute, tp, n * (layer.sp_fwd + layer.sp_bwd), sends,
                  n * (layer.fsdp_fwd + layer.fsdp_bwd), bwd, wgrad)


def pp_send(p: StepPlan) -> float:
    """Seconds of one send along the pp axis: one micro-batch's (b, s, h) activation forward (or
    its gradient back) over one chunk boundary; scatter/gather: each tp rank sends its 1/t."""
    activation = p.tokens * p.model.hidden * p.training.bytes_per_activation
    return p.comm.p2p(Axis.PP, activation / p.s.tp)


def grad_buckets(p: StepPlan, params: float) -> int:
    """Buckets a stage's gradients are reduced in, with ``overlap_grad_reduce``
    (:data:`DDP_BUCKET_PARAMS`)."""
    return max(1, math.ceil(params / max(DDP_BUCKET_PARAMS, 1_000_000 * p.dp_group)))


def _dp_time(p: StepPlan, stage: _Stage) -> tuple[float, float]:
    """(link, exposed) seconds of the stage's gradient reduction."""
    link = p.grad_links.get(stage.params)
    if link is None:  # the stages between the first and last hold the same parameters
        reduce, gather = grad_reduction_calls(p, stage.params)
        link = p.grad_links[stage.params] = p.comm.total(reduce) + p.comm.total(gather)
    if not link:
        return 0.0, 0.0
    if not p.training.overlap_grad_reduce:
        return link, link
    buckets = grad_buckets(p, stage.params)
    exposed = max(link / buckets, link - stage.bwd)  # the last bucket waits for the backward
    return link, exposed + p.system.device.overlap_slowdown * (link - exposed)


def _optimizer_time(p: StepPlan, stage: _Stage) -> float:
    tr = p.training
    local = stage.params / (p.shard_ranks if p.s.zero >= ZeroStage.OPTIMIZER else 1)
    per_param = (OPTIMIZER_STATE_PASSES * tr.bytes_per_param_optimizer + tr.bytes_per_param_grads
                 + tr.bytes_per_param_weights)
    return local * per_param / p.costs.byte_rate


def stage_activations(p: StepPlan, stage: _Stage, flight: _F, pp: int) -> _F:
    """Activation bytes of a stage of ``pp`` holding ``flight`` micro-batches (a float, or an
    array of them: the same operations element by element, :mod:`simcore.megatron.batched`)."""
    s, model, act = p.s, p.model, p.act
    activations = stage.layers * act.stored * flight
    if s.recompute is Recompute.FULL:
        activations += act.full - act.stored  # the layer being recomputed
    elif s.recompute is Recompute.SELECTIVE:
        activations += act.attention_core
    h, t = model.hidden, s.tp
    sbh = p.tokens * h
    if stage.index == 0 and p.shape.dropout:
        activations += sbh / t * flight  # embedding dropout output (Korthikanti section 4.3)
    if stage.index == pp - 1:
        # Final norm output, LM head input and fp32 logits: 4sbh/t (1 + V/h) (section 4.3).
        activations += 4 * sbh / t * (1 + model.vocab / h)
    return activations


def _memory(p: StepPlan, stage: _Stage, pp: int | None = None) -> tuple[MemoryParts, float]:
    s, tr, model = p.s, p.training, p.model
    pp = s.pp if pp is None else pp
    group = p.shard_ranks  # the shard group under HSDP, else dp * sp
    zero = s.zero
    weights, grads, optimizer = model_state_bytes(stage.params, tr, zero, group)
    if p.fp8:
        # Transformer Engine's FP8 copy of the linear layers' weights, sharded as the weights are.
        fp8_copy = stage.layers * p.shape.matmul_params / s.tp * FP8_BYTES
        weights += fp8_copy / (group if zero >= ZeroStage.PARAMETERS else 1)
    flight = in_flight(s.schedule, stage.index, pp, p.m, s.v)
    activations = stage_activations(p, stage, flight, pp)
    h, t = model.hidden, s.tp
    sbh = p.tokens * h
    gathered = 0.0
    if zero is ZeroStage.PARAMETERS and group > 1:
        layer = p.shape.layer_params / t
        gathered = layer * (2 * tr.bytes_per_param_weights + tr.bytes_per_param_grads)
    comm = 0.0
    if t > 1:
        comm += sbh * tr.bytes_per_activation  # one gathered (b, s, h) activation
    if pp > 1:
        comm += 2 * sbh * tr.bytes_per_activation / t  # send and receive buffers
    parts = MemoryParts(weights=weights, gradients=grads, optimizer=optimizer,
                        activations=activations, gathered_weights=gathered, comm_buffers=comm,
                        overhead=p.system.device.memory_overhead_bytes)
    return parts, flight


def _model_flops(model: ModelSpec, shape: LayerShape, training: TrainingSpec) -> float:
    """Forward + backward FLOP of one step without recompute: 3 x forward (Korthikanti Eq. 7)."""
    seq = training.seq_len
    per_sequence = (model.layers * (2 * seq * shape.matmul_params + 4 * seq * seq * model.hidden)
                    + 2 * seq * model.hidden * model.vocab)
    return 3 * per_sequence * training.global_batch


def _recompute_flops(model: ModelSpec, shape: LayerShape, training: TrainingSpec,
                     recompute: Recompute) -> float:
    seq = training.seq_len
    if recompute is Recompute.FULL:
        per_layer = 2 * seq * shape.matmul_params + 4 * seq * seq * model.hidden
    elif recompute is Recompute.SELECTIVE:
        per_layer = 4 * seq * seq * model.hidden
    else:
        return 0.0
    return model.layers * per_layer * training.global_batch


def layer_time(model: ModelSpec, system: SystemSpec, training: TrainingSpec,
               strategy: Strategy) -> tuple[float, float]:
    """(forward, backward) seconds of one transformer layer for one micro-batch, with its
    exposed tp and sp communication; backward includes the recompute. What Korthikanti et al.
    2022 Table 4 measures."""
    check_plan(model, system, training, strategy)
    layer = _layer(StepPlan(model, system, training, strategy))
    forward = layer.fwd_compute + layer.tp_fwd + layer.sp_fwd + layer.fsdp_fwd
    backward = layer.bwd_compute + layer.recompute + layer.tp_bwd + layer.sp_bwd + layer.fsdp_bwd
    return forward, backward


def estimate_megatron(model: ModelSpec, system: SystemSpec, training: TrainingSpec,
                      strategy: Strategy) -> Estimate:
    """Estimate one training step of ``model`` on ``system`` split by ``strategy``."""
    check_plan(model, system, training, strategy)
    p = StepPlan(model, system, training, strategy)
    layer = _layer(p)
    ends = _ends(p)
    stages = [(p, _stage(p, layer, ends, i)) for i in range(strategy.pp)]
    return assemble(model, training, stages, pp=strategy.pp, m=p.m, v=strategy.v,
                    recompute=strategy.recompute, schedule=strategy.schedule,
                    peak_flops_per_s=system.device.peak_flops_per_s * strategy.devices)


def assemble(model: ModelSpec, training: TrainingSpec, stages: list[tuple[StepPlan, _Stage]], *,
             pp: int, m: int, v: int, recompute: Recompute,
             peak_flops_per_s: float, schedule: Schedule = Schedule.ONE_F_ONE_B) -> Estimate:
    """The step from its stages, each with the plan it runs under (its device and links): the
    pipeline, the slowest stage's parts, the exposed gradient reduction and optimizer, and the
    stage whose memory comes closest to its device's HBM. ``peak_flops_per_s`` is the devices'
    sum, for MFU."""
    wgrads = [st.wgrad for _, st in stages] if schedule is Schedule.ZB_H1 else None
    pipe, slowest = pipeline_time([st.time for _, st in stages], m, v, wgrads)
    critical = stages[slowest][1]
    dp_exposed = max(_dp_time(sp, st)[1] for sp, st in stages)
    optimizer = max(_optimizer_time(sp, st) for sp, st in stages)
    time = TimeParts(
        compute=m * critical.compute, tp=m * critical.tp, sp=m * critical.sp,
        dp=dp_exposed, pp=m * critical.pp, fsdp=m * critical.fsdp,
        bubble=pipe - m * critical.time, optimizer=optimizer,
    )
    memories = [_memory(sp, st, pp) for sp, st in stages]
    hbms = [sp.system.device.hbm_bytes for sp, _ in stages]
    totals = [parts.total for parts, _ in memories]
    stage_estimates = tuple(
        StageEstimate(st.index, st.layers, st.time, flight, parts, sp.system.device.name)
        for (sp, st), (parts, flight) in zip(stages, memories)
    )
    peak_stage = max(range(len(stages)), key=lambda i: totals[i] / hbms[i])
    peak, hbm = memories[peak_stage][0], hbms[peak_stage]
    step = time.total
    shape = stages[0][0].shape
    model_flops = _model_flops(model, shape, training)
    hardware_flops = model_flops + _recompute_flops(model, shape, training, recompute)
    capacity = peak_flops_per_s * step
    fits = all(total <= h for total, h in zip(totals, hbms))
    reason = "" if fits else _reason(peak, peak_stage, hbm)
    return Estimate(
        convention="megatron", step_time=step, time=time, memory=peak, peak_stage=peak_stage,
        stages=stage_estimates, model_flops=model_flops, hardware_flops=hardware_flops,
        mfu=model_flops / capacity, hfu=hardware_flops / capacity,
        tokens_per_s=training.global_batch * training.seq_len / step, hbm_bytes=hbm,
        fits=fits, reason=reason,
    )


def _reason(peak: MemoryParts, stage: int, hbm: float) -> str:
    parts = {"weights": peak.weights, "gradients": peak.gradients, "optimizer": peak.optimizer,
             "activations": peak.activations, "gathered weights": peak.gathered_weights}
    largest = max(parts, key=parts.__getitem__)
    gb = 1e9
    return (f"stage {stage} needs {peak.total / gb:.1f} GB > {hbm / gb:.1f} GB of HBM"
            f" (largest part: {largest}, {parts[largest] / gb:.1f} GB)")
