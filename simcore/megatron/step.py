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
from dataclasses import dataclass, replace
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
from simcore.megatron.flops import model_flops as _model_flops
from simcore.megatron.flops import recompute_flops as _recompute_flops
from simcore.megatron.recompute import (
    blend,
    modules_again,
    recomputed_fraction,
    recomputed_share,
)
from simcore.megatron.moe import expert_comm, expert_grad_calls
from simcore.megatron.pipeline import head_stage, in_flight, pipeline_time, zbv_time
from simcore.megatron.plan import StepPlan, _shared, uses_flash_attention
from simcore.megatron.precision import FP8_BYTES
from simcore.megatron.states import model_state_bytes
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

__all__ = ["DDP_BUCKET_PARAMS", "PYTORCH_LOGIT_BYTES", "estimate_megatron", "layer_time",
           "uses_flash_attention"]

PYTORCH_LOGIT_BYTES = 12
"""Bytes a logit takes at the peak of PyTorch's cross-entropy on an fp32 copy
(:attr:`simcore.specs.CrossEntropy.PYTORCH`)."""

DDP_BUCKET_PARAMS = 40_000_000
"""Megatron-LM's default gradient bucket (``ddp_bucket_size``: max(40M, 1M * dp) parameters)."""

_F = TypeVar("_F", float, np.ndarray)

OPTIMIZER_STATE_PASSES = 2
"""Adam reads and writes its fp32 states once per step."""


# The working values below are private and never changed after they are built; they are not
# frozen because a frozen dataclass takes ~3 us to build against ~0.7 us (every field goes
# through object.__setattr__), and the estimate builds one _Stage per pipeline stage.
@dataclass(slots=True)
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
    wgrad: float = 0.0
    """The backward's weight-gradient GEMMs (part of bwd_compute)."""
    ep_fwd: float = 0.0
    """An MoE layer's all-to-alls (and expert-tp collectives) forward, on the critical path."""
    ep_bwd: float = 0.0
    """Backward (and, under full recompute, the forward's again)."""

    @property
    def compute(self) -> float:
        return self.fwd_compute + self.bwd_compute + self.recompute

    @property
    def total(self) -> float:
        return (self.compute + self.tp_fwd + self.tp_bwd + self.sp_fwd + self.sp_bwd
                + self.fsdp_fwd + self.fsdp_bwd + self.ep_fwd + self.ep_bwd)


def _hidden(p: StepPlan, comm: float, compute: float) -> float:
    """Exposed time of ``comm`` run beside ``compute``: what it outlasts it by, plus the compute's
    slowdown while both run."""
    return max(0.0, comm - compute) + p.system.device.overlap_slowdown * min(comm, compute)


def _tp_layer_comm(p: StepPlan) -> float:
    """Two all-reduces (or all-gather + reduce-scatter pairs) of a (b, s, h) activation."""
    return 2 * p.comm.total(tp_pair_calls(p))


def _layer(p: StepPlan, plain: bool = False) -> _Layer:
    """A dense transformer layer (``plain``: without the plan's recompute)."""
    kernels = p.kernels
    # FC2's tp collective is the pair's last call (its all-reduce, or its reduce-scatter)
    tail_comm = p.comm.total(tp_pair_calls(p)[-1:]) if p.early_stop else 0.0
    return _layer_of(p, kernels.forward, kernels.backward, kernels.wgrad, kernels.core_forward,
                     _tp_layer_comm(p), kernels.gemm_forward, kernels.gemm_dgrad,
                     tail=kernels.forward_tail, tail_comm=tail_comm,
                     per_op=kernels.op_recompute, plain=plain,
                     modules=modules_again(p, kernels, dense=True))


def _moe_layer(p: StepPlan, plain: bool = False) -> _Layer:
    """An MoE layer (:mod:`simcore.megatron.moe`): the attention and shared experts' kernels
    and tp pairs (one pair for the attention, one more with shared experts: the routed experts'
    tokens stay split over tp and go through the all-to-all instead), the router and routed
    experts, and their all-to-alls on the critical path, run again under full recompute; with
    ``ep_overlap`` beside another micro-batch's compute of the layer, exposed only where they
    outlast it (and the compute's slowdown beside them, :func:`_hidden`). ``plain``: without
    the plan's recompute."""
    k, x = p.moe_kernels, p.experts
    assert p.moe is not None
    pairs = 2 if p.moe.shared_experts else 1
    tp = pairs * p.comm.total(tp_pair_calls(p))
    layer = _layer_of(p, k.forward + x.forward, k.backward + x.backward, k.wgrad + x.wgrad,
                      k.core_forward, tp, k.gemm_forward, k.gemm_dgrad, per_op=k.op_recompute,
                      plain=plain, modules=modules_again(p, k, dense=False))
    ep = expert_comm(p.comm, p.model, p.s, p.expert_tokens, p.training.bytes_per_activation)
    again = ep if p.s.recompute is Recompute.FULL and not plain else 0.0
    if p.s.ep_overlap:  # beside another micro-batch's forward and backward of the layer
        hidden = _hidden(p, 2 * ep + again, layer.compute)
        return replace(layer, ep_fwd=0.0, ep_bwd=hidden)
    return replace(layer, ep_fwd=ep, ep_bwd=ep + again)


def _layer_of(p: StepPlan, fwd: float, bwd: float, wgrad: float, core: float,
              tp: float, gemm_fwd: float = 0.0, gemm_dgrad: float = 0.0, *,
              tail: float = 0.0, tail_comm: float = 0.0, per_op: float = 0.0,
              plain: bool = False, modules: tuple[float, bool] = (0.0, False)) -> _Layer:
    """A layer of these kernels (seconds of its forward, backward, weight-gradient GEMMs and
    attention core; its linear layers' forward and input-gradient GEMMs) and tp communication,
    with the plan's sp, recompute and ZeRO-3. ``tail`` and ``tail_comm``: the forward's kernels
    and tp collective after its last saved tensor, which a full recompute that stops early
    (:attr:`StepPlan.early_stop`) does not run again (an MoE layer passes none: priced whole).
    ``per_op``: what per-op selective checkpointing runs again (:attr:`StepPlan.per_op`), with
    the tp collectives whose outputs it does not keep. ``plain``: the layer without recompute
    (a layer ``recompute_layers`` leaves out). ``modules``: what Megatron-LM's
    ``recompute_modules`` run again (:func:`simcore.megatron.recompute.modules_again`): their
    seconds, and whether the MLP's tp pair runs again with it."""
    s = p.s
    zero_bubble = s.schedule in ZERO_BUBBLE
    if p.te and s.tp > 1 and s.sequence_parallel:
        # Transformer Engine's userbuffers (--tp-comm-overlap) split each tp all-gather and
        # reduce-scatter into chunks run beside the GEMMs that consume or produce them: the
        # forward's behind the forward GEMMs, the backward's behind the input- and
        # weight-gradient GEMMs (only the former in a zero-bubble B pass).
        tp_fwd = _hidden(p, tp, gemm_fwd)
        tp_bwd = _hidden(p, tp, gemm_dgrad + (0.0 if zero_bubble else wgrad))
    else:
        # Backward hides its tp communication behind the weight-gradient GEMMs (Megatron-LM's
        # asynchronous tensor-parallel all-reduce / all-gather; Korthikanti section 5). A
        # zero-bubble schedule defers those GEMMs to its W pass, so its B pass waits for the
        # whole collective.
        tp_fwd = tp
        tp_bwd = tp if zero_bubble else _hidden(p, tp, wgrad)

    sp_fwd = sp_bwd = 0.0
    if s.sp > 1:
        gathers, scatters = cp_kv_calls(p)
        gather, scatter = p.comm.total(gathers), p.comm.total(scatters)
        sp_fwd = _hidden(p, gather, core)
        sp_bwd = _hidden(p, gather + scatter, 2 * core)

    if plain:
        recompute = tp_recompute = 0.0
    elif s.recompute is Recompute.FULL and p.early_stop:
        # PyTorch's non-reentrant checkpointing stops at FC2's input: FC2, its tp collective
        # and the residual add are not re-run
        recompute = fwd - tail
        tp_recompute = tp_fwd - min(tail_comm, tp_fwd / 2)
    elif s.recompute is Recompute.FULL:
        recompute = fwd
        tp_recompute = tp_fwd
    elif p.modules is not None:
        recompute = modules[0]
        tp_recompute = tp_fwd / 2 if modules[1] else 0.0  # the MLP's pair of the layer's two
    elif p.per_op:
        recompute = per_op
        # the reduce-scatters' outputs are kept, the all-gathers before the column-parallel
        # matmuls are not (half of each pair); without sequence parallelism no all-reduce is
        tp_recompute = tp_fwd / 2 if s.sequence_parallel else tp_fwd
    elif s.recompute is Recompute.SELECTIVE:
        recompute = core
        tp_recompute = 0.0
    else:
        recompute = tp_recompute = 0.0

    fsdp_fwd = fsdp_bwd = 0.0
    if s.zero is ZeroStage.PARAMETERS and p.shard_ranks > 1:
        gathers, scatters = fsdp_layer_calls(p)
        gather, scatter = p.comm.total(gathers), p.comm.total(scatters)
        fsdp_fwd = _hidden(p, gather, fwd)
        fsdp_bwd = _hidden(p, gather + scatter, bwd + recompute)
    return _Layer(fwd, bwd, recompute, tp_fwd, tp_bwd + tp_recompute, sp_fwd, sp_bwd,
                  fsdp_fwd, fsdp_bwd, wgrad)


@dataclass(slots=True)
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
    """The ends' kernels, shared by the plans of one (model, system, training) that split a
    micro-batch alike (they read the micro-batch's tokens, tp and the kernel costs only)."""
    s = p.s
    return _shared(p.shared, ("ends", s.micro_batch, s.sp, s.tp, s.precision, p.te),
                   lambda: _ends_of(p))


def _ends_of(p: StepPlan) -> _Ends:
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


@dataclass(slots=True)
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
    ep: float = 0.0
    """Its MoE layers' all-to-alls (and expert-tp collectives), forward and backward."""
    moe_layers: int = 0
    """Of its layers, those with the MoE FFN."""
    expert_params: float = 0.0
    """The routed experts' parameters this device holds (split by ep and etp; not in params:
    their states are sharded, and their gradients reduced, over the expert data-parallel
    group)."""

    @property
    def time(self) -> float:
        return self.compute + self.tp + self.sp + self.pp + self.fsdp + self.ep


def _stage(p: StepPlan, layer: _Layer, ends: _Ends, i: int, *, layers: int | None = None,
           pp: int | None = None, pp_time: float | None = None,
           moe: _Layer | None = None) -> _Stage:
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
    return _Stage(i, *found)


def partial_layers(p: StepPlan, layer: _Layer, moe: _Layer | None,
                   share: float) -> tuple[_Layer, _Layer | None]:
    """``layer`` and ``moe`` (each under full recompute) as the average layer of a stage whose
    ``share`` of layers recompute and the rest do not: ``n`` such layers sum to the recomputed
    ones' times plus the others' (every term of a stage is a sum over its layers)."""
    plain = p.plain_layers
    if plain is None:
        plain = p.plain_layers = (
            _layer(p, plain=True), _moe_layer(p, plain=True) if moe is not None else None)
    return (blend(plain[0], layer, share),
            None if moe is None or plain[1] is None else blend(plain[1], moe, share))


def _sums(p: StepPlan, layer: _Layer, ends: _Ends, layers: int, n_moe: int, first: bool,
          last: bool, pp: int, pp_time: float | None, moe: _Layer | None) -> tuple:
    """:class:`_Stage`'s fields but its index: the stage's layers, ends and sends summed."""
    s, model, shape = p.s, p.model, p.shape
    h, t = model.hidden, s.tp
    n = layers - n_moe  # dense layers
    params = n * shape.layer_params / t
    compute = n * layer.compute
    tp = n * (layer.tp_fwd + layer.tp_bwd)
    if first:
        params += shape.embedding_params / t
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
    if not n_moe:
        return (layers, params, compute, tp, sp, _sends(p, pp_time, compute), fsdp, bwd, wgrad)
    assert moe is not None
    m = n_moe
    ms = p.moe_shape
    params += m * (shape.attention_params + shape.other_params + ms.router_params
                   + ms.shared_params) / t
    experts = m * ms.expert_params * ms.experts / (s.ep * s.expert_tp)
    compute += m * moe.compute
    return (layers, params, compute,
            tp + m * (moe.tp_fwd + moe.tp_bwd), sp + m * (moe.sp_fwd + moe.sp_bwd),
            _sends(p, pp_time, compute),
            fsdp, bwd + m * (moe.bwd_compute + moe.recompute + moe.tp_bwd),
            wgrad + m * moe.wgrad, m * (moe.ep_fwd + moe.ep_bwd), m, experts)


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
        return _hidden(p, send, compute / (2 * p.s.v))
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


def _dp_time(p: StepPlan, stage: _Stage) -> tuple[float, float]:
    """(link, exposed) seconds of the stage's gradient reduction (an MoE stage's expert
    gradients over the expert data-parallel group after the rest)."""
    key = (stage.params, stage.expert_params)
    link = p.grad_links.get(key)
    if link is None:  # the stages between the first and last hold the same parameters
        reduce, gather = grad_reduction_calls(p, stage.params, fp8_weight_params(p, stage))
        link = p.comm.total(reduce) + p.comm.total(gather)
        if stage.expert_params:
            reduce, gather = expert_grad_calls(p, stage.expert_params)
            link += p.comm.total(reduce) + p.comm.total(gather)
        p.grad_links[key] = link
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
    if stage.expert_params:
        local += stage.expert_params / (p.s.edp if p.s.zero >= ZeroStage.OPTIMIZER else 1)
    per_param = OPTIMIZER_STATE_PASSES * tr.bytes_per_param_optimizer + p.step_bytes_per_param
    return local * per_param / p.costs.byte_rate


def stage_activations(p: StepPlan, stage: _Stage, flight: _F, pp: int) -> _F:
    """Activation bytes of a stage of ``pp`` holding ``flight`` micro-batches (a float, or an
    array of them: the same operations element by element, :mod:`simcore.megatron.batched`)."""
    s, model, act = p.s, p.model, p.act
    n_moe = stage.moe_layers
    if not n_moe:
        kept = stage.layers * act.stored
    else:  # an MoE layer keeps its attention's and shared experts', and its experts'
        kept = (stage.layers - n_moe) * act.stored + n_moe * (p.moe_act.stored + p.expert_act)
    if s.recompute_layers is not None:
        # the layers recompute_layers leaves out keep everything (the same share of MoE ones)
        plain = (1.0 - recomputed_share(p, stage.index, stage.layers, pp)) * (
            (stage.layers - n_moe) * (p.act_plain.stored - act.stored)
            + (n_moe * (p.moe_act_plain.stored + p.expert_act_full - p.moe_act.stored
                        - p.expert_act) if n_moe else 0.0))
        kept += plain
    activations = kept * flight
    if s.recompute is Recompute.FULL or p.per_op:
        # the layer being recomputed: what it adds to what it keeps (per-op keeps its experts')
        working = act.full - act.stored
        if n_moe:
            experts = p.expert_act_full if s.recompute is Recompute.FULL else 0.0
            working = max(working, p.moe_act.full + experts - p.moe_act.stored)
        activations += max(working, 0.0)
    elif s.recompute is Recompute.SELECTIVE:
        activations += act.attention_core
    h, t = model.hidden, s.tp
    sbh = p.tokens * h
    if stage.index == 0 and p.shape.dropout:
        activations += sbh / t * flight  # embedding dropout output (Korthikanti section 4.3)
    if stage.index == head_stage(s.schedule, pp):
        # Final norm output, LM head input and fp32 logits: 4sbh/t (1 + V/h) (section 4.3);
        # PyTorch's cross-entropy on an fp32 copy holds 12 bytes a logit, not 4 (CrossEntropy).
        activations += 4 * sbh / t * (1 + model.vocab / h)
        if p.training.cross_entropy is CrossEntropy.PYTORCH:
            activations += (PYTORCH_LOGIT_BYTES - 4) * p.tokens * model.vocab / t
    return activations


def _memory(p: StepPlan, stage: _Stage, pp: int | None = None) -> tuple[MemoryParts, float]:
    s = p.s
    pp = s.pp if pp is None else pp
    key = (stage.params, stage.expert_params, stage.layers, stage.moe_layers, pp)
    fixed = p.memory_memo.get(key)
    if fixed is None:  # the stages between the first and the last hold the same states
        fixed = p.memory_memo[key] = _fixed_memory(p, stage, pp)
    flight = in_flight(s.schedule, stage.index, pp, p.m, s.v)
    activations = stage_activations(p, stage, flight, pp)
    return MemoryParts(fixed.weights, fixed.gradients, fixed.optimizer, activations,
                       fixed.gathered_weights, fixed.comm_buffers, fixed.overhead), flight


def _fixed_memory(p: StepPlan, stage: _Stage, pp: int) -> MemoryParts:
    """The stage's memory but its activations (which depend on the micro-batches in flight)."""
    s, tr, model = p.s, p.training, p.model
    group = p.shard_ranks  # the shard group under HSDP, else dp * sp
    zero = s.zero
    weights, grads, optimizer = model_state_bytes(stage.params, tr, zero, group,
                                                  fp32_shards=p.fp32_shards)
    if stage.expert_params:  # the routed experts' states, sharded over expert dp
        w, g, o = model_state_bytes(stage.expert_params, tr, zero, s.edp,
                                    fp32_shards=p.fp32_shards)
        weights, grads, optimizer = weights + w, grads + g, optimizer + o
    if p.fp8:
        # Transformer Engine's FP8 copy of the linear layers' weights, sharded as the weights
        # are; with --fp8-param-gather it is their only compute copy (no 16-bit one).
        linear = _linear_params(p, stage)
        shard = group if zero >= ZeroStage.PARAMETERS else 1
        weights += linear * FP8_BYTES / shard
        if p.fp8_params:
            weights -= linear * tr.bytes_per_param_weights / shard
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
    return MemoryParts(weights=weights, gradients=grads, optimizer=optimizer,
                       activations=0.0, gathered_weights=gathered, comm_buffers=comm,
                       overhead=p.system.device.memory_overhead_bytes)


def _linear_params(p: StepPlan, stage: _Stage) -> float:
    """The stage's linear-layer weights on this device (an MoE layer's: its attention's, shared
    and routed experts')."""
    linear = stage.layers * p.shape.matmul_params / p.s.tp
    if stage.moe_layers:
        dense = p.shape.matmul_params - p.shape.attention_params
        linear += stage.moe_layers * (p.moe_shape.shared_params - dense) / p.s.tp
        linear += stage.expert_params
    return linear


def fp8_weight_params(p: StepPlan, stage: _Stage) -> float:
    """Of the stage's ``params`` (not its routed experts'), those the data-parallel all-gather
    moves in FP8: the dense linear layers' under ``--fp8-param-gather``, else none."""
    if not p.fp8_params:
        return 0.0
    return _linear_params(p, stage) - stage.expert_params


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
    moe = _moe_layer(p) if p.moe is not None else None
    ends = _ends(p)
    stages = [(p, _stage(p, layer, ends, i, moe=moe)) for i in range(strategy.pp)]
    return assemble(model, training, stages, pp=strategy.pp, m=p.m, v=strategy.v,
                    recompute=strategy.recompute, schedule=strategy.schedule,
                    peak_flops_per_s=system.device.peak_flops_per_s * strategy.devices,
                    recomputed=recomputed_fraction(p))


def assemble(model: ModelSpec, training: TrainingSpec, stages: list[tuple[StepPlan, _Stage]], *,
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
        pipe, slowest = zbv_time(times, [st.bwd for _, st in stages], wgrads, m)
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
        bubble=pipe - m * times[slowest], optimizer=optimizer,
    )
    memories = [_memory(sp, st, pp) for sp, st in stages]
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
