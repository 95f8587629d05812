"""Lower bounds on a dense plan's step time and peak memory, for many plans at once and at a
fraction of the estimate's cost: what ``planner run --prune`` skips plans with
(:mod:`planner.prune`).

Each bound keeps only terms of :func:`simcore.megatron.step.estimate_megatron` that are sums of
non-negative parts, so it can never exceed the estimate:

- step time: the pipeline of stages that do nothing but their layers' kernels. The estimate's
  stage time is ``compute + tp + sp + pp + fsdp`` with ``compute`` at least ``layers x (forward
  + backward + recompute)`` of :func:`simcore.megatron.kernels.layer_kernels` (a recompute
  that stops early without the forward's tail; the embedding
  and LM head add to it); the pipeline ``m t_max + (sum - t_max) / v``
  (:func:`simcore.megatron.pipeline.pipeline_time`) equals ``(m - 1/v) t_max + sum / v``,
  which grows with every stage's time; ZB-H1's takes ``2 (sum W - W_slowest)`` off the fill,
  so only ``m t_max`` is kept there, as for zbv (whose bubble is a maximum of non-negative
  terms, :func:`simcore.megatron.pipeline.zbv_bubble`). The gradient reduction and the
  optimizer add to it.
- peak memory: the first stage's weights, gradients and optimizer state (its layers and the
  embedding, under the plan's ZeRO stage and shard group,
  :func:`simcore.megatron.states.model_state_bytes`), the activations its layers keep for the
  micro-batches in flight (:func:`simcore.megatron.pipeline.in_flight`) and the device's
  allowance; the peak stage holds at least as much. The comm buffers, the gathered ZeRO-3
  weights, FP8 weight copies, the working set of a recomputed layer and the LM head's logits
  add to it.

Both are scaled by ``1 - 1e-9`` against the estimate's sums running in another order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simcore.megatron.activations import layer_activations
from simcore.megatron.kernels import KernelCosts, layer_kernels, modules_forward
from simcore.megatron.layers import layer_shape
from simcore.megatron.precision import saved_input_bytes
from simcore.megatron.stack import (
    uses_flash_attention,
    uses_fp8_attention,
    uses_fp32_shards,
    uses_recompute_early_stop,
    uses_transformer_engine,
)
from simcore.megatron.states import FP32_GRAD_BYTES
from simcore.specs import (
    ModelSpec,
    Precision,
    Recompute,
    SelectiveRecompute,
    SystemSpec,
    TrainingSpec,
    ZeroStage,
)

__all__ = ["PARTIAL_RECOMPUTE", "PRECISION_CODES", "RECOMPUTE_CODES", "SCHEDULE_CODES", "Bounds",
           "lower_bounds"]

SAFETY = 1 - 1e-9
RECOMPUTE_CODES = {Recompute.NONE: 0, Recompute.SELECTIVE: 1, Recompute.FULL: 2}
SCHEDULE_CODES = {"gpipe": 0, "1f1b": 1, "interleaved": 2, "zb-h1": 3, "zbv": 4}
"""Integer codes of the columns ``recompute`` and ``schedule`` (by :class:`Schedule` value)."""
PRECISION_CODES = {p: i for i, p in enumerate(Precision)}
"""Codes of the ``precision`` column (bf16 0, then fp8, mxfp8, nvfp4)."""
PARTIAL_RECOMPUTE = 3
"""The ``recompute`` code of a full recompute of some layers (``recompute_layers``): bounded
by no recompute's time and full recompute's kept activations, both below its own."""
_GPIPE, _ONE_F_ONE_B, _INTERLEAVED, _ZB_H1, _ZBV = range(5)


@dataclass(frozen=True, slots=True)
class Bounds:
    """Per plan: no estimate's step time is below ``step_time_s``, nor its peak memory below
    ``memory_bytes``."""

    step_time_s: np.ndarray
    memory_bytes: np.ndarray


def lower_bounds(model: ModelSpec, system: SystemSpec, training: TrainingSpec,
                 columns: dict[str, np.ndarray]) -> Bounds:
    """The bounds (module docstring) of the dense ``megatron``-convention plans whose knobs are
    ``columns``: int arrays ``dp``, ``tp``, ``pp``, ``sp``, ``micro_batch``, ``v``,
    ``zero``, ``shard_ranks`` (ZeRO's group: the shard group, else dp x sp),
    ``first_stage_layers`` (0: even stages; else the first and last stages' layers),
    ``recompute`` and ``schedule`` (:data:`RECOMPUTE_CODES` or :data:`PARTIAL_RECOMPUTE`,
    :data:`SCHEDULE_CODES`), and bool
    array ``sequence_parallel``, and either ``precision`` (:data:`PRECISION_CODES`) or the bool
    ``fp8`` (bf16 or fp8 plans only); optionally ``offload_layers`` (0: none)."""
    if model.moe is not None:
        raise ValueError(f"{model.name}: the bounds cover dense models only")
    c = {k: np.asarray(v) for k, v in columns.items()}
    m = training.global_batch // (c["dp"] * c["micro_batch"])
    per_layer, stored = _layer_figures(model, system, training, c, m)
    layers = model.layers
    ends = c["first_stage_layers"]
    uneven = ends > 0
    middle = np.where(uneven, (layers - 2 * ends) // np.maximum(c["pp"] - 2, 1),
                      layers // c["pp"])
    first = np.where(uneven, ends, middle)
    most = np.maximum(middle, first)
    v, schedule = c["v"], c["schedule"]
    t_max = most * per_layer
    step = np.where((schedule == _ZB_H1) | (schedule == _ZBV), m * t_max,
                    (m - 1 / v) * t_max + layers * per_layer / v)
    fp32 = np.array([uses_fp32_shards(system, training, ZeroStage(z)) for z in range(4)])
    # activation offloading (pp 1): L - N layers, and at least one more layer's or the LM
    # head's activations at the peak (stage_activations)
    offload = c.get("offload_layers", np.zeros_like(first))
    kept = first - offload + (offload > 0)
    memory = (_states(model, training, c, first, fp32[c["zero"]])
              + kept * stored * _in_flight(c, m))
    memory += system.device.memory_overhead_bytes
    return Bounds(step * SAFETY, memory * SAFETY)


def _layer_figures(model: ModelSpec, system: SystemSpec, training: TrainingSpec,
                   c: dict[str, np.ndarray], m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per plan: one layer's kernel seconds for one micro-batch (forward, backward and
    recompute) and its kept activation bytes, computed once per distinct set of knobs they
    read."""
    code = _precision_codes(c)
    fp8 = code > 0
    te = np.array([uses_transformer_engine(system, training, ZeroStage(z))
                   for z in range(4)])[c["zero"]]
    early = np.array([uses_recompute_early_stop(system, training, ZeroStage(z))
                      for z in range(4)])[c["zero"]]
    keys = np.stack([c["micro_batch"], c["tp"], c["sp"], c["sequence_parallel"].astype(int),
                     code, c["recompute"], np.where(fp8, m, 0), te.astype(int),
                     early.astype(int)], axis=1)
    distinct, inverse = _distinct_rows(keys)
    shape = layer_shape(model)
    flash = uses_flash_attention(model, system, training)
    recomputes = {code: r for r, code in RECOMPUTE_CODES.items()}
    recomputes[PARTIAL_RECOMPUTE] = Recompute.FULL  # its kept activations; its time: none's
    per_op = training.selective_recompute is SelectiveRecompute.OP
    modules = (None if training.recompute_modules is None
               else frozenset(training.recompute_modules))
    per_layer = np.empty(len(distinct))
    stored = np.empty(len(distinct))
    for i, (mb, tp, sp, seqpar, fmt, rc, micro, with_te, stops_early) in enumerate(
            distinct.tolist()):
        precision = list(Precision)[fmt]
        fp8_attention = uses_fp8_attention(training, precision, bool(with_te), flash)
        costs = KernelCosts.of(system.device, precision, bool(with_te),
                              training.launch_blocking, fp8_attention)
        k = layer_kernels(model, shape, costs,
                          micro_batch=mb, queries=training.seq_len / sp,
                          seq_len=training.seq_len, tp=tp, sequence_parallel=bool(seqpar),
                          flash=flash, act_bytes=training.bytes_per_activation,
                          micro_batches=max(micro, 1), swiglu_fused=training.swiglu_fusion,
                          cp_comm=training.cp_exchange, norm_fused=training.fused_norm,
                          rope_fused=training.rope_fusion)
        recompute = recomputes[rc]
        # full recompute stopping early skips the forward's tail (recompute_early_stop)
        selective = (k.op_recompute if per_op else k.core_forward if modules is None
                     else modules_forward(k, modules))
        again = (0.0 if rc == PARTIAL_RECOMPUTE else
                 k.forward - (k.forward_tail if stops_early else 0.0)
                 if recompute is Recompute.FULL else
                 selective if recompute is Recompute.SELECTIVE else 0.0)
        per_layer[i] = k.forward + k.backward + again
        stored[i] = layer_activations(
            model, shape, micro_batch=mb, seq_len=training.seq_len, tp=tp, sp=sp,
            sequence_parallel=bool(seqpar), recompute=recompute, flash=flash,
            linear_input_bytes=saved_input_bytes(precision),
            per_op=per_op and recompute is Recompute.SELECTIVE,
            modules=modules if recompute is Recompute.SELECTIVE else None,
            swiglu_fused=training.swiglu_fusion, fp8_attention=fp8_attention,
            norm_fused=training.fused_norm).stored
    return per_layer[inverse], stored[inverse]


def _precision_codes(c: dict[str, np.ndarray]) -> np.ndarray:
    """The ``precision`` column's codes, or the ``fp8`` column's as codes."""
    if "precision" in c:
        return c["precision"].astype(np.int64)
    return np.where(c["fp8"].astype(bool), PRECISION_CODES[Precision.FP8], 0)


def _distinct_rows(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, axis=0, return_inverse=True)`` through one int64 code per row (each
    column's distinct values numbered, then mixed-radix): sorting rows as void is 20x slower."""
    code = np.zeros(len(keys), np.int64)
    for column in keys.T:
        values, number = np.unique(column, return_inverse=True)
        code = code * len(values) + number.ravel()
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    return keys[first], inverse.ravel()


def _states(model: ModelSpec, training: TrainingSpec, c: dict[str, np.ndarray],
            first: np.ndarray, fp32_shards: np.ndarray) -> np.ndarray:
    """The first stage's weights, gradients and optimizer state (its layers and embedding); in
    fp8 without the linear layers' 16-bit weights, which ``--fp8-param-gather`` drops; with
    ``fp32_shards`` (PyTorch FSDP) with fp32 gradient shards and, under ZeRO-3, no 16-bit shard
    (:func:`simcore.megatron.states.model_state_bytes`)."""
    shape = layer_shape(model)
    params = (first * shape.layer_params + shape.embedding_params) / c["tp"]
    group, zero = c["shard_ranks"], c["zero"]
    linear = np.where(_precision_codes(c) > 0, first * shape.matmul_params / c["tp"], 0)
    weights = (params - linear) * training.bytes_per_param_weights / np.where(zero >= 3, group, 1)
    weights = np.where(fp32_shards & (zero >= 3), 0.0, weights)
    grad_bytes = np.where(fp32_shards, FP32_GRAD_BYTES, training.bytes_per_param_grads)
    grads = params * grad_bytes / np.where(zero >= 2, group, 1)
    optimizer = params * training.optimizer_bytes / np.where(zero >= 1, group, 1)
    return weights + grads + optimizer


def _in_flight(c: dict[str, np.ndarray], m: np.ndarray) -> np.ndarray:
    """:func:`simcore.megatron.pipeline.in_flight` of the first stage."""
    pp, v, schedule = c["pp"], c["v"], c["schedule"]
    interleaved = np.minimum(2 * (pp - 1) + (v - 1) * pp + 1, m * v) / v
    return np.select([schedule == _GPIPE, schedule == _INTERLEAVED],
                     [m.astype(float), interleaved], np.minimum(pp, m).astype(float))
