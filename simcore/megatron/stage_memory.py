"""A pipeline stage's memory on its device: the model states (:mod:`simcore.megatron.states`),
Transformer Engine's FP8 weight copies, ZeRO-3's gathered layer, the communication buffers, the
device's allowance, and the activations of the micro-batches the schedule keeps in flight
(:mod:`simcore.megatron.activations`, :func:`simcore.megatron.pipeline.in_flight`).
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

from simcore.estimate import MemoryParts
from simcore.megatron.parts import Stage
from simcore.megatron.pipeline import head_stage, in_flight
from simcore.megatron.plan import StepPlan
from simcore.megatron.precision import FORMATS
from simcore.megatron.recompute import recomputed_share
from simcore.megatron.states import FP32_GRAD_BYTES, model_state_bytes
from simcore.specs import CrossEntropy, Recompute, ZeroStage

__all__ = ["LOGIT_BYTES", "LOSS_CHUNKS", "fixed_memory", "fp8_weight_params",
           "main_grad_copy_bytes", "stage_activations", "stage_memory", "step_copy_beyond"]

LOGIT_BYTES: dict[CrossEntropy, int] = {
    CrossEntropy.FUSED: 4,  # the fp32 logits (Korthikanti et al. 2022, section 4.3)
    CrossEntropy.MEGATRON: 6,  # the 16-bit logits and their fp32 copy (Megatron-LM's)
    CrossEntropy.MEGATRON_FUSED: 10,  # those and the exponent, not in place (its jit-fused one)
    CrossEntropy.PYTORCH: 12,  # its saved log-softmax output and, backward, two gradients
    CrossEntropy.CHUNKED: 12,  # pytorch's, of one slice of the tokens at a time (LOSS_CHUNKS)
    CrossEntropy.MEGATRON_DEEPSPEED: 10,  # the 16-bit logits, an fp32 copy and a shifted one
    CrossEntropy.NANOTRON: 8,  # the fp32 logits and their shifted copy, at its forward
    CrossEntropy.REPLICATED: 8,  # the held 16-bit logits, the log-softmax output, two gradients
}
"""Bytes a logit takes at the peak of each loss (:class:`simcore.specs.CrossEntropy`): logits
of the rank's vocabulary shard, but of the whole vocabulary on every rank for ``replicated``."""

LOSS_CHUNKS = 8
"""Slices of the tokens a ``chunked`` loss takes in turn: torchtitan's
``ChunkedLossWrapper.Config.num_chunks`` (pytorch/torchtitan@b5bcd76c
``torchtitan/components/loss.py``)."""
CHUNK_COPY_BYTES = 2 + 4
"""A ``chunked`` loss's bytes an element of the final norm's (b, s, h) output: its slices'
detached 16-bit copies and their gradient accumulated in fp32 (``GradAccumulator``)."""

_F = TypeVar("_F", float, np.ndarray)


def stage_activations(p: StepPlan, stage: Stage, flight: _F, pp: int) -> _F:
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
    if s.offload_layers is not None:
        # pp 1, one micro-batch at a time: the offloaded layers' copies are done and freed by
        # the end of the forward, but for the last one, freed as the last layer's forward
        # ends (Transformer Engine's cpu_offload_v1.py, d0067d0: layer_window_map spreads the
        # frees over the forward, the last at layer L - 1); the LM head's logits come after it
        per_layer = kept / stage.layers
        kept = (stage.layers - s.offload_layers) * per_layer
    activations = kept * flight
    if s.recompute is Recompute.FULL or p.per_op:
        # the layer being recomputed: what it adds to what it keeps (per-op keeps its experts')
        working = act.full - act.stored
        if n_moe:
            experts = p.expert_act_full if s.recompute is Recompute.FULL else 0.0
            working = max(working, p.moe_act.full + experts - p.moe_act.stored)
        activations += max(working, 0.0)
    elif s.recompute is Recompute.SELECTIVE and p.modules is not None:
        # the modules being recomputed (Megatron-LM's recompute_modules): what they drop, not
        # the attention core's scores unless core_attn is among them
        working = act.full - act.stored if stage.layers > n_moe else 0.0  # a dense layer's
        if n_moe:
            working = max(working, p.moe_act.full - p.moe_act.stored)
        activations += max(working, 0.0)
    elif s.recompute is Recompute.SELECTIVE:
        activations += act.attention_core
    h, t = model.hidden, s.tp
    sbh = p.tokens * h
    if stage.index == 0 and p.shape.dropout:
        activations += sbh / t * flight  # embedding dropout output (Korthikanti section 4.3)
    if stage.index == head_stage(s.schedule, pp):
        # Final norm output and LM head input, 4sbh/t (section 4.3), and the loss's logits
        loss = p.training.cross_entropy or CrossEntropy.FUSED
        shard = 1 if loss is CrossEntropy.REPLICATED else t
        logits = LOGIT_BYTES[loss] * p.tokens * model.vocab / shard
        if loss is CrossEntropy.CHUNKED:  # one slice's logits, and every rank's whole copies
            logits = logits / LOSS_CHUNKS + CHUNK_COPY_BYTES * sbh
        head = 4 * sbh / t + logits
        if s.offload_layers is not None:  # the last offloaded layer, freed before the head
            head = max(head, per_layer)
        activations += head
    return activations


def fixed_memory(p: StepPlan, stage: Stage, pp: int) -> MemoryParts:
    """The stage's memory but its activations, which depend on the micro-batches in flight
    (memoised on the plan: the stages between the first and the last hold the same states).
    Its ``step_copy`` is the optimizer step's whole copy (:func:`main_grad_copy_bytes`), before
    :func:`step_copy_beyond` weighs it against the activations."""
    key = (stage.params, stage.expert_params, stage.layers, stage.moe_layers, pp)
    fixed = p.memory_memo.get(key)
    if fixed is None:
        fixed = p.memory_memo[key] = _fixed_memory(p, stage, pp)
    return fixed


def stage_memory(p: StepPlan, stage: Stage, pp: int | None = None) -> tuple[MemoryParts, float]:
    s = p.s
    pp = s.pp if pp is None else pp
    fixed = fixed_memory(p, stage, pp)
    flight = in_flight(s.schedule, stage.index, pp, p.m, s.v)
    activations = stage_activations(p, stage, flight, pp)
    step_copy = step_copy_beyond(fixed.step_copy, activations + fixed.comm_buffers)
    return MemoryParts(fixed.weights, fixed.gradients, fixed.optimizer, activations,
                       fixed.gathered_weights, fixed.comm_buffers, fixed.overhead,
                       step_copy=step_copy), flight


def step_copy_beyond(copy: _F, transient: _F) -> _F:
    """What the optimizer step's gradient copy of ``copy`` bytes adds to a stage's peak whose
    backward holds ``transient`` bytes beside the model states (its activations and
    communication buffers): the step runs after the backward has freed them, so the peak is
    the larger of the two (floats, or arrays element by element)."""
    if isinstance(transient, np.ndarray):
        return np.maximum(copy - transient, 0.0)
    return max(copy - transient, 0.0)


def main_grad_copy_bytes(p: StepPlan, stage: Stage) -> float:
    """Bytes of the fp32 copy of the stage's 16-bit gradients its optimizer step makes, 4 a
    parameter of the optimizer's shard (:attr:`simcore.specs.TrainingSpec.main_grad_copy`);
    0 unless the training says so with master weights, 16-bit gradients and ZeRO 0-1."""
    tr, s = p.training, p.s
    if not (tr.main_grad_copy and tr.master_weights and tr.bytes_per_param_grads == 2
            and s.zero <= ZeroStage.OPTIMIZER and not p.fp32_shards):
        return 0.0
    sharded = s.zero is ZeroStage.OPTIMIZER
    params = stage.params / (p.shard_ranks if sharded else 1)
    if stage.expert_params:  # the routed experts' optimizer is sharded over expert dp
        params += stage.expert_params / (s.edp if sharded else 1)
    return FP32_GRAD_BYTES * params


def _fixed_memory(p: StepPlan, stage: Stage, pp: int) -> MemoryParts:
    """:func:`fixed_memory`, computed."""
    s, tr, model = p.s, p.training, p.model
    group = p.shard_ranks  # the shard group under HSDP, else dp * sp
    zero = s.zero
    weights, grads, optimizer = model_state_bytes(stage.params, tr, zero, group,
                                                  fp32_shards=p.fp32_shards,
                                                  unsharded_grads=p.no_sync)
    if stage.expert_params:  # the routed experts' states, sharded over expert dp
        w, g, o = model_state_bytes(stage.expert_params, tr, zero, s.edp,
                                    fp32_shards=p.fp32_shards, unsharded_grads=p.no_sync)
        weights, grads, optimizer = weights + w, grads + g, optimizer + o
    if p.fp8:
        # Transformer Engine's FP8 copy of the linear layers' weights (MXFP8's and NVFP4's: row-
        # and column-wise), sharded as the weights are; with --fp8-param-gather it is their
        # only compute copy (no 16-bit one).
        linear = _linear_params(p, stage)
        shard = group if zero >= ZeroStage.PARAMETERS else 1
        weights += linear * FORMATS[p.s.precision].weight_bytes / shard
        if p.quantized_params:
            weights -= linear * tr.bytes_per_param_weights / shard
    h, t = model.hidden, s.tp
    sbh = p.tokens * h
    gathered = 0.0
    if zero is ZeroStage.PARAMETERS and group > 1:
        layer = p.shape.layer_params / t
        gathered = layer * (2 * tr.bytes_per_param_weights + tr.bytes_per_param_grads)
    if p.pipeline_no_sync and group > 1:  # the stage's weights kept gathered between passes
        gathered = max(gathered, (stage.params + stage.expert_params)
                       * tr.bytes_per_param_weights)
    comm = 0.0
    if t > 1:
        comm += sbh * tr.bytes_per_activation  # one gathered (b, s, h) activation
    if pp > 1:
        comm += 2 * sbh * tr.bytes_per_activation / t  # send and receive buffers
    return MemoryParts(weights=weights, gradients=grads, optimizer=optimizer,
                       activations=0.0, gathered_weights=gathered, comm_buffers=comm,
                       overhead=p.system.device.memory_overhead_bytes,
                       step_copy=main_grad_copy_bytes(p, stage))


def _linear_params(p: StepPlan, stage: Stage) -> float:
    """The stage's linear-layer weights on this device (an MoE layer's: its attention's, shared
    and routed experts')."""
    linear = stage.layers * p.shape.matmul_params / p.s.tp
    if stage.moe_layers:
        dense = p.shape.matmul_params - p.shape.attention_params
        linear += stage.moe_layers * (p.moe_shape.shared_params - dense) / p.s.tp
        linear += stage.expert_params
    return linear


def fp8_weight_params(p: StepPlan, stage: Stage) -> float:
    """Of the stage's ``params`` (not its routed experts'), those the data-parallel all-gather
    moves in FP8: the dense linear layers' under ``--fp8-param-gather``, else none."""
    if not p.fp8_params:
        return 0.0
    return _linear_params(p, stage) - stage.expert_params
