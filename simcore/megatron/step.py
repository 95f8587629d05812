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
  bucket is always exposed. ZeRO-2 keeps only its shard of the gradients, so every micro-batch's
  backward reduce-scatters its own (DeepSpeed: "ZeRO stage >= 2 communicates during non
  gradient accumulation boundaries as well", ``engine.py`` ``allreduce_gradients``).
- fsdp (ZeRO-3): each layer's weights all-gathered before its forward and backward, its gradients
  reduce-scattered after backward, prefetched behind the layer's compute; under HSDP over the
  shard group, and the gradient shards all-reduced across the replicas in the dp slot.

Hiding is not free: while a collective runs beside compute the two share the SMs and HBM, and
the compute slows by the device's ``overlap_slowdown``
(:func:`simcore.megatron.layer_step.hidden_cost`). The exposed part of each hidden collective
(tp behind the wgrad GEMMs, sp behind the attention core, fsdp behind the layer, dp behind the
last backward) includes that slowdown.

The layer's time is :mod:`simcore.megatron.layer_step`'s, a stage's memory
:mod:`simcore.megatron.stage_memory`'s; their working values are
:mod:`simcore.megatron.parts`'.
"""

from __future__ import annotations

import math

from simcore.estimate import Estimate, MemoryParts, StageEstimate, TimeParts
from simcore.megatron.calls import embedding_calls, grad_reduction_calls, head_calls
from simcore.megatron.checks import check_plan
from simcore.megatron.flops import model_flops as _model_flops
from simcore.megatron.flops import recompute_flops as _recompute_flops
from simcore.megatron.layer_step import dense_layer, hidden_cost, moe_layer
from simcore.megatron.moe import expert_grad_calls
from simcore.megatron.parts import Ends, Layer, Stage
from simcore.megatron.pipeline import head_stage, pipeline_time, zbv_time
from simcore.megatron.plan import StepPlan, _shared
from simcore.megatron.recompute import blend, recomputed_fraction, recomputed_share
from simcore.megatron.stage_memory import fp8_weight_params, stage_memory
from simcore.specs import (
    ZERO_BUBBLE,
    Axis,
    CrossEntropy,
    ModelSpec,
    Recompute,
    Schedule,
    Strategy,
    SystemSpec,
    TrainingSpec,
    ZeroStage,
)

__all__ = ["DDP_BUCKET_PARAMS", "estimate_megatron", "layer_time"]

DDP_BUCKET_PARAMS = 40_000_000
"""Megatron-LM's default gradient bucket (``ddp_bucket_size``: max(40M, 1M * dp) parameters)."""

OPTIMIZER_STATE_PASSES = 2
"""Adam reads and writes its fp32 states once per step."""


def _ends(p: StepPlan) -> Ends:
    """The ends' kernels, shared by the plans of one (model, system, training) that split a
    micro-batch alike (they read the micro-batch's tokens, tp and the kernel costs only)."""
    s = p.s
    return _shared(p.shared, ("ends", s.micro_batch, s.sp, s.tp, s.precision, p.te),
                   lambda: _ends_of(p))


def _ends_of(p: StepPlan) -> Ends:
    c, model, t = p.costs, p.model, p.s.tp
    h = model.hidden
    full = p.tokens * h * p.training.bytes_per_activation
    # Gather the token rows (+ GPT's learned positions and dropout); backward accumulates the
    # rows' gradients into the table.
    n = 2 if p.shape.dropout else 1
    embedding_fwd = n * c.elementwise(2 * full)
    embedding_bwd = n * c.elementwise(3 * full)
    logits = 4 * p.tokens * model.vocab / t  # fp32 logits for the loss
    if p.training.cross_entropy is CrossEntropy.REPLICATED:
        logits = 2 * p.tokens * model.vocab  # every rank's loss, on the whole 16-bit logits
    head = (c.gemm(p.tokens, model.vocab / t, h), c.gemm(p.tokens, h, model.vocab / t),
            c.gemm(h, model.vocab / t, p.tokens))
    head_fwd = head[0] + 2 * c.elementwise(logits / 2)
    head_bwd = head[1] + head[2] + c.elementwise(2 * logits)
    return Ends(embedding_fwd, embedding_bwd, head_fwd, head_bwd, head[2])


def _stage(p: StepPlan, layer: Layer, ends: Ends, i: int, *, layers: int | None = None,
           pp: int | None = None, pp_time: float | None = None,
           moe: Layer | None = None) -> Stage:
    """Stage ``i`` of ``pp`` (default the plan's) holding ``layers`` transformer layers (default
    the plan's count for stage ``i``, :meth:`Strategy.stage_layers`, or an equal share of another
    ``pp``); ``pp_time`` replaces the sends along the plan's pp axis (a pipeline whose stages sit
    on different device groups, :mod:`simcore.mixed`). ``moe``: the plan's MoE layer, for the
    stage's MoE layers (:attr:`StepPlan.stage_moe_layers`; the rest are ``layer``)."""
    s, model = p.s, p.model
    pp = s.pp if pp is None else pp
    if layers is None:
        layers = p.stage_layers[i] if pp == s.pp else model.layers // pp
    n_moe = p.stage_moe_layers[i] if moe is not None and pp == s.pp else 0
    first, last = i == 0, i == head_stage(s.schedule, pp)
    share = recomputed_share(p, i, layers, pp)
    # the middle stages are alike: each distinct one is summed once
    key = (layers, n_moe, first, last, pp, pp_time, share)
    found = p.stage_memo.get(key)
    if found is None:
        if share < 1.0:
            layer, moe = partial_layers(p, layer, moe, share)
        found = p.stage_memo[key] = _sums(p, layer, ends, layers, n_moe, first, last, pp,
                                          pp_time, moe)
    return Stage(i, *found)


def partial_layers(p: StepPlan, layer: Layer, moe: Layer | None,
                   share: float) -> tuple[Layer, Layer | None]:
    """``layer`` and ``moe`` (each under full recompute) as the average layer of a stage whose
    ``share`` of layers recompute and the rest do not: ``n`` such layers sum to the recomputed
    ones' times plus the others' (every term of a stage is a sum over its layers)."""
    plain = p.plain_layers
    if plain is None:
        plain = p.plain_layers = (
            dense_layer(p, plain=True), moe_layer(p, plain=True) if moe is not None else None)
    return (blend(plain[0], layer, share),
            None if moe is None or plain[1] is None else blend(plain[1], moe, share))


def _sums(p: StepPlan, layer: Layer, ends: Ends, layers: int, n_moe: int, first: bool,
          last: bool, pp: int, pp_time: float | None, moe: Layer | None) -> tuple:
    """:class:`Stage`'s fields but its index: the stage's layers, ends and sends summed."""
    s, model, shape = p.s, p.model, p.shape
    h, t = model.hidden, s.tp
    n = layers - n_moe  # dense layers
    params = n * shape.layer_params / t
    compute = n * layer.compute
    tp = n * (layer.tp_fwd + layer.tp_bwd)
    if first:  # the whole table on every tp rank where it is not split over them
        params += shape.embedding_params / (t if p.training.vocab_parallel_embedding else 1)
        compute += ends.embedding_fwd + ends.embedding_bwd
        tp += p.comm.total(embedding_calls(p))
    if last:
        tied_here = model.tied_embeddings and first  # one rank holds both ends
        params += (2 * h if tied_here else shape.head_params) / t
        compute += ends.head_fwd + ends.head_bwd
        tp += p.comm.total(head_calls(p, False)) + p.comm.total(head_calls(p, True))
    bwd = n * (layer.bwd_compute + layer.recompute + layer.tp_bwd)
    if first:
        bwd += ends.embedding_bwd
    wgrad = n * p.kernels.wgrad + (ends.head_wgrad if last else 0.0)
    sp, fsdp = n * (layer.sp_fwd + layer.sp_bwd), n * (layer.fsdp_fwd + layer.fsdp_bwd)
    offload = n * (layer.offload_fwd + layer.offload_bwd)
    # the backward's whole share of the stage's time, as stage_phases splits it (the zero-bubble
    # V schedule's B and W; its F is the rest)
    back = bwd + n * (layer.sp_bwd + layer.fsdp_bwd + layer.offload_bwd)
    if last:
        back += ends.head_bwd + p.comm.total(head_calls(p, True))
    if not n_moe:
        sends = _sends(p, pp_time, compute)
        return (layers, params, compute, tp, sp, sends, fsdp, bwd, wgrad, 0.0, 0, 0.0, offload,
                back + sends / 2)
    assert moe is not None
    m = n_moe
    ms = p.moe_shape
    params += m * (shape.attention_params + shape.other_params + ms.router_params
                   + ms.shared_params) / t
    experts = m * ms.expert_params * ms.experts / (s.ep * s.expert_tp)
    compute += m * moe.compute
    sends = _sends(p, pp_time, compute)
    moe_back = m * (moe.bwd_compute + moe.recompute + moe.tp_bwd)
    return (layers, params, compute,
            tp + m * (moe.tp_fwd + moe.tp_bwd), sp + m * (moe.sp_fwd + moe.sp_bwd),
            sends, fsdp, bwd + moe_back,
            wgrad + m * moe.wgrad, m * (moe.ep_fwd + moe.ep_bwd), m, experts,
            offload + m * (moe.offload_fwd + moe.offload_bwd),
            back + moe_back + m * (moe.sp_bwd + moe.ep_bwd + moe.offload_bwd) + sends / 2)


def _sends(p: StepPlan, pp_time: float | None, compute: float) -> float:
    """A stage's pipeline transfers for one micro-batch: one per forward and backward of each
    of its v chunks (:func:`pp_exposed`), or ``pp_time`` (a pipeline over device groups)."""
    if pp_time is not None:
        return pp_time
    if p.s.pp > 1:
        return 2 * p.s.v * pp_exposed(p, compute)
    return 0.0


def pp_exposed(p: StepPlan, compute: float) -> float:
    """Seconds of one of a stage's pipeline transfers on its critical path, for a stage of
    ``compute`` seconds of kernels per micro-batch. Megatron-LM's blocking send/receive pairs
    wait for the whole transfer (:func:`pp_send`). With Transformer Engine's stack in the
    interleaved schedule the transfers overlap the next op's compute: Megatron-Core's
    ``overlap_p2p_comm``, which Megatron-Bridge sets whenever there are virtual stages
    (``src/megatron/bridge/training/comm_overlap.py`` at 067f987d); then only what outlasts an
    op's compute (the stage's over its 2 v ops) shows, and the compute's slowdown beside it."""
    send = pp_send(p)
    if p.te and p.s.schedule is Schedule.INTERLEAVED:
        return hidden_cost(p, send, compute / (2 * p.s.v))
    return send


def pp_send(p: StepPlan) -> float:
    """Seconds of one send along the pp axis: one micro-batch's (b, s, h) activation forward (or
    its gradient back) over one chunk boundary; scatter/gather: each tp rank sends its 1/t."""
    activation = p.tokens * p.model.hidden * p.training.bytes_per_activation
    return p.comm.p2p(Axis.PP, activation / p.s.tp)


def grad_buckets(p: StepPlan, params: float) -> int:
    """Buckets a stage's gradients are reduced in, with ``overlap_grad_reduce``
    (:data:`DDP_BUCKET_PARAMS`)."""
    return max(1, math.ceil(params / max(DDP_BUCKET_PARAMS, 1_000_000 * p.dp_group)))


def _grad_links(p: StepPlan, stage: Stage) -> tuple[float, float]:
    """(reduction, gather) seconds of the stage's gradient reduction: the gradients' reduce
    (an MoE stage's expert gradients over the expert data-parallel group after the rest), and
    the updated weights' all-gather; memoised by the parameters the stage holds."""
    key = (stage.params, stage.expert_params)
    links = p.grad_links.get(key)
    if links is None:  # the stages between the first and last hold the same parameters
        reduce, gather = grad_reduction_calls(p, stage.params, fp8_weight_params(p, stage))
        reduced, gathered = p.comm.total(reduce), p.comm.total(gather)
        if stage.expert_params:
            reduce, gather = expert_grad_calls(p, stage.expert_params)
            reduced += p.comm.total(reduce)
            gathered += p.comm.total(gather)
        links = p.grad_links[key] = (reduced, gathered)
    return links


def _beside_backward(p: StepPlan, stage: Stage, link: float) -> float:
    """Exposed seconds of ``link`` reduced in buckets beside a micro-batch's backward: the last
    bucket waits for the backward, and the compute slows beside the rest; all of it without
    ``overlap_grad_reduce``."""
    if not p.training.overlap_grad_reduce:
        return link
    exposed = max(link / grad_buckets(p, stage.params), link - stage.bwd)
    return exposed + p.system.device.overlap_slowdown * (link - exposed)


def _dp_time(p: StepPlan, stage: Stage) -> tuple[float, float]:
    """(link, exposed) seconds of the stage's gradient reduction in a step: reduced (and the
    weights gathered) beside the last micro-batch's backward; under ZeRO-2 each earlier
    micro-batch's backward also reduce-scatters its own gradients."""
    reduced, gathered = _grad_links(p, stage)
    link = reduced + gathered
    if not link:
        return 0.0, 0.0
    exposed = _beside_backward(p, stage, link)
    if p.s.zero is ZeroStage.GRADIENTS and p.m > 1:
        link += (p.m - 1) * reduced
        exposed += (p.m - 1) * _beside_backward(p, stage, reduced)
    return link, exposed


def _optimizer_time(p: StepPlan, stage: Stage) -> float:
    tr = p.training
    local = stage.params / (p.shard_ranks if p.s.zero >= ZeroStage.OPTIMIZER else 1)
    if stage.expert_params:
        local += stage.expert_params / (p.s.edp if p.s.zero >= ZeroStage.OPTIMIZER else 1)
    per_param = OPTIMIZER_STATE_PASSES * tr.optimizer_bytes + p.step_bytes_per_param
    return local * per_param / p.costs.byte_rate


def layer_time(model: ModelSpec, system: SystemSpec, training: TrainingSpec,
               strategy: Strategy) -> tuple[float, float]:
    """(forward, backward) seconds of one transformer layer for one micro-batch, with its
    exposed tp and sp communication; backward includes the recompute. What Korthikanti et al.
    2022 Table 4 measures."""
    check_plan(model, system, training, strategy)
    layer = dense_layer(StepPlan(model, system, training, strategy))
    forward = layer.fwd_compute + layer.tp_fwd + layer.sp_fwd + layer.fsdp_fwd
    backward = layer.bwd_compute + layer.recompute + layer.tp_bwd + layer.sp_bwd + layer.fsdp_bwd
    return forward, backward


def estimate_megatron(model: ModelSpec, system: SystemSpec, training: TrainingSpec,
                      strategy: Strategy) -> Estimate:
    """Estimate one training step of ``model`` on ``system`` split by ``strategy``."""
    check_plan(model, system, training, strategy)
    p = StepPlan(model, system, training, strategy)
    layer = dense_layer(p)
    moe = moe_layer(p) if p.moe is not None else None
    ends = _ends(p)
    stages = [(p, _stage(p, layer, ends, i, moe=moe)) for i in range(strategy.pp)]
    return assemble(model, training, stages, pp=strategy.pp, m=p.m, v=strategy.v,
                    recompute=strategy.recompute, schedule=strategy.schedule,
                    peak_flops_per_s=system.device.peak_flops_per_s * strategy.devices,
                    recomputed=recomputed_fraction(p))


def assemble(model: ModelSpec, training: TrainingSpec, stages: list[tuple[StepPlan, Stage]], *,
             pp: int, m: int, v: int, recompute: Recompute,
             peak_flops_per_s: float, schedule: Schedule = Schedule.ONE_F_ONE_B,
             recomputed: float = 1.0) -> Estimate:
    """The step from its stages, each with the plan it runs under (its device and links): the
    pipeline, the slowest stage's parts, the exposed gradient reduction and optimizer, and the
    stage whose memory comes closest to its device's HBM. ``peak_flops_per_s`` is the devices'
    sum, for MFU; ``recomputed`` the share of the layers that recompute
    (:func:`recomputed_fraction`)."""
    wgrads = [st.wgrad for _, st in stages] if schedule in ZERO_BUBBLE else None
    times = [st.time for _, st in stages]
    if schedule is Schedule.ZBV:
        assert wgrads is not None
        pipe, slowest = zbv_time(times, [st.bwd_pass for _, st in stages], wgrads, m)
    else:
        pipe, slowest = pipeline_time(times, m, v, wgrads)
    critical = stages[slowest][1]
    # the stages between the first and the last are alike: each distinct one is timed once
    alike = {(id(sp), st.params, st.expert_params, st.bwd): (sp, st) for sp, st in stages}
    dp_exposed = max(_dp_time(sp, st)[1] for sp, st in alike.values())
    optimizer = max(_optimizer_time(sp, st) for sp, st in alike.values())
    time = TimeParts(
        compute=m * critical.compute, tp=m * critical.tp, sp=m * critical.sp,
        dp=dp_exposed, pp=m * critical.pp, fsdp=m * critical.fsdp, ep=m * critical.ep,
        bubble=pipe - m * times[slowest], optimizer=optimizer, offload=m * critical.offload,
    )
    memories = [stage_memory(sp, st, pp) for sp, st in stages]
    hbms = [sp.system.device.hbm_bytes for sp, _ in stages]
    totals = [parts.total for parts, _ in memories]
    stage_estimates = tuple(
        StageEstimate(st.index, st.layers, t, flight, parts, sp.system.device.name)
        for (sp, st), t, (parts, flight) in zip(stages, times, memories)
    )
    peak_stage = max(range(len(stages)), key=lambda i: totals[i] / hbms[i])
    peak, hbm = memories[peak_stage][0], hbms[peak_stage]
    step = time.total
    shape = stages[0][0].shape
    model_flops = _model_flops(model, shape, training)
    hardware_flops = model_flops + recomputed * _recompute_flops(model, shape, training,
                                                                 recompute)
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
