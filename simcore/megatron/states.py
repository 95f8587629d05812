"""Model-state bytes per device: weights, gradients and optimizer state under ZeRO.

Rajbhandari et al. 2020 (arXiv:1910.02054) section 5: with mixed-precision Adam (2 bytes of
weights, 2 of gradients, K = 12 of fp32 master weights, momentum and variance per parameter),
data-parallel degree N_d keeps ``16 P`` (none), ``4 P + 12 P / N_d`` (ZeRO-1),
``2 P + 14 P / N_d`` (ZeRO-2) or ``16 P / N_d`` (ZeRO-3) bytes per device. Bytes per parameter
come from the TrainingSpec, so Megatron-LM's fp32 main gradients (``6 + 12 / d`` with its
distributed optimizer) are the same formula with 4-byte gradients.

Gradient accumulation: gradients accumulate across micro-batches in their own dtype in the one
gradient buffer counted here (bf16 by default); no second copy is kept, but where the training
says so (``grad_copy``: DeepSpeed's BF16_Optimizer, ``2 + 2 + 4 + 12 / N_d`` bytes with fp32
accumulation under ZeRO-1) each parameter's 16-bit ``.grad`` stays beside it.

PyTorch FSDP (``fp32_shards``, :func:`simcore.megatron.stack.uses_fp32_shards`) keeps its
gradient shard in fp32 and, under ZeRO-3, no 16-bit shard (the fp32 shard is the master copy):
``2 P + (4 + 12) P / N_d`` bytes (ZeRO-2), ``(4 + 12) P / N_d`` (ZeRO-3) with the default
optimizer state.
"""

from __future__ import annotations

from simcore.specs import TrainingSpec, ZeroStage

__all__ = ["FP32_GRAD_BYTES", "model_state_bytes"]


FP32_GRAD_BYTES = 4
"""Bytes of a gradient PyTorch FSDP keeps sharded for the optimizer (the parameter's fp32)."""


def model_state_bytes(params: float, training: TrainingSpec, zero: ZeroStage,
                      group: int, *, fp32_shards: bool = False,
                      unsharded_grads: bool = False) -> tuple[float, float, float]:
    """(weights, gradients, optimizer state) bytes of ``params`` parameters on one device of a
    data-parallel group of ``group`` ranks (``fp32_shards``: PyTorch FSDP's, above; with
    ``training.grad_copy`` the gradients add each parameter's 16-bit ``.grad``, unsharded;
    ``unsharded_grads``: FSDP's ``no_sync`` accumulation, the whole gradient in the reduction's
    type, ``bytes_per_param_grads``, in place of the shard:
    :attr:`simcore.specs.TrainingSpec.fsdp_no_sync`)."""
    weights = 0.0 if fp32_shards and zero >= ZeroStage.PARAMETERS else (
        params * training.bytes_per_param_weights)
    grads = params * (FP32_GRAD_BYTES if fp32_shards and zero >= ZeroStage.GRADIENTS
                      else training.bytes_per_param_grads)
    optimizer = params * training.optimizer_bytes
    if zero >= ZeroStage.OPTIMIZER:
        optimizer /= group
    if zero >= ZeroStage.GRADIENTS:
        grads /= group
    if zero >= ZeroStage.PARAMETERS:
        weights /= group
    if training.grad_copy and zero < ZeroStage.GRADIENTS:  # DeepSpeed's BF16_Optimizer
        grads += params * training.bytes_per_param_weights
    if unsharded_grads:  # in the reduction's type (FSDP2 upcasts what it accumulates); the
        # shard is made in the last micro-batch's backward as each layer's whole gradient is
        # freed, and freed by the step's zero_grad, so at the peak the two are not both held
        grads = params * training.bytes_per_param_grads
    return weights, grads, optimizer
