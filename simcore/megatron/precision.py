"""FP8 training as Transformer Engine runs it under Megatron-LM: what changes against bf16.

Which GEMMs run in FP8: the linear layers' (QKV, attention projection, FC1, FC2), each with its
forward, input-gradient and weight-gradient GEMM. Transformer Engine's docs ("Using FP8 with
Transformer Engine", docs.nvidia.com/deeplearning/transformer-engine/user-guide/examples/
fp8_primer.html): FP8 is used for the Linear layers' GEMMs, other operations stay in higher
precision. Megatron-LM d98e8a64 ``megatron/core/transformer/transformer_config.py`` agrees by its
defaults: ``fp8_wgrad = True`` (weight gradients in FP8), ``fp8_dot_product_attention = False``
(attention's score and context GEMMs stay 16-bit), ``fp8_output_proj`` only under MXFP8 (the LM
head stays 16-bit); the embedding and the optimizer never run GEMMs in FP8.

The FP8 GEMMs take the device's 16-bit GEMM efficiency and wave fraction unchanged (the TE
stack's ``fused_matmul_efficiency`` where the device has one, else ``matmul_efficiency``). Measured GEMMs reach a somewhat smaller fraction of the FP8 peak than of the bf16
one (stas00/ml-engineering@744d01e compute/accelerator, maximum achievable matmul FLOP/s: H100
SXM 70.9% of FP8 peak against 80.3% of bf16), so fp8 GEMMs alone lean optimistic. The H100's
Transformer Engine constant (``fused_attention_efficiency``) was fit on FP8 runs of Megatron-Core
(tests/data/validation/h100-megatron-fit.csv), so the FP8 step as a whole is calibrated there.

What FP8 costs on top of its GEMMs (each a memory-bound kernel at the device's achievable HBM
bandwidth, with the launch floor of every kernel):

- a cast of every FP8 GEMM input: the layer input x (forward), the weight w (once per step: TE
  keeps the FP8 weight across the micro-batches of a step, Megatron-LM passing
  ``is_first_microbatch``) and the output gradient dy (backward). Each reads the 16-bit tensor
  and writes it in FP8 twice, row-wise and column-wise (transposed): Hopper's FP8 tensor cores
  take only the "TN" layout (cuBLAS docs, cublasLtMatmul, FP8 data types: A transposed, B not),
  so x, w and dy, each read transposed by one of the three GEMMs, are written in both
  orientations (TE's fused cast-transpose). The cast computes the tensor's amax as it reads it.
- the delayed-scaling update (Megatron-LM's default ``fp8_recipe = "delayed"``): per linear layer
  and direction, one kernel rolls the amax history (``--fp8-amax-history-len`` entries, fp32)
  of its FP8 tensors and computes their scales. Per-tensor current scaling ("tensorwise", what
  Megatron-Bridge's H100 FP8 presets run and the Megatron-LM export writes) computes the amax
  before each cast instead; its dense layers come out within the checks' error with this
  count (tests/data/validation h100-megatron-check, which ran it), where pricing a separate amax
  pass and two scale kernels per cast puts them 4-6% slower. The routed experts' casts, which
  Transformer Engine does not fuse under that recipe, are counted apart
  (:data:`simcore.megatron.moe.QUANTIZE_KERNELS`).

Blackwell's FP8 GEMMs take any layout, and Transformer Engine then writes a per-tensor FP8 cast
once (``Float8TensorStorage.update_usage`` drops the transpose when
``is_non_tn_fp8_gemm_supported()``, TransformerEngine@d0067d0: 3 bytes an element, not 4). It is
not modelled: counted, with the GB200 GEMM rate refit on gb200-fit.csv (0.532 -> 0.557), it made
the checks worse (gb200-check 6.0 -> 8.6% MAPE; tests/data/validation/README.md, "MXFP8").

MXFP8 (``Precision.MXFP8``, TE's ``MXFP8BlockScaling``): each block of 32 elements along one
axis shares a power-of-two (E8M0) scale, so the row-wise blocks of a tensor cannot serve the
GEMM that reads it column-wise: every cast writes both copies, each with its scales (2 + 2 x
(1 + 1/32) bytes an element), whatever the device. The scale is the block's own, computed as
the cast reads it: no amax history and no scale-update kernel. The GEMMs run at the device's
``mxfp8_matmul_efficiency`` of the FP8 peak (block-scaled GEMMs load their scales beside the
operands; fit per device on MXFP8 runs, studies/catalog/devices/gpus.yaml).

Memory: TE keeps an FP8 copy of each linear layer's weight (1 byte per parameter, on top of the
16-bit weights and fp32 master weights); each linear layer saves its input for the weight
gradient in FP8 (1 byte per element instead of 2). With the distributed optimizer or FSDP under
Transformer Engine (ZeRO 1-3), Megatron-LM's ``--fp8-param-gather`` keeps the FP8 copy as the
only compute weight (no 16-bit one) and all-gathers it in FP8
(:func:`simcore.megatron.plan.uses_fp8_param_gather`). MXFP8 keeps both scaled copies of each
weight (:data:`MX_WEIGHT_BYTES`); with ``--fp8-param-gather`` and
``--reuse-grad-buf-for-mxfp8-param-ag`` they are the only compute copy, gathered in 16-bit into
the gradient buffer and quantised there (Megatron-LM ``param_and_grad_buffer.py``). These are in
:mod:`simcore.megatron.activations`, :mod:`simcore.megatron.stage_memory` and
:mod:`simcore.megatron.calls`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from simcore.specs import DeviceSpec, Precision

if TYPE_CHECKING:
    from simcore.megatron.kernels import KernelCosts

__all__ = [
    "AMAX_HISTORY_LEN",
    "CAST_BYTES",
    "MX_BLOCK",
    "MX_CAST_BYTES",
    "MX_WEIGHT_BYTES",
    "FP8_BYTES",
    "Fp8Overheads",
    "fp8_overheads",
    "fp8_problem",
]

FP8_BYTES = 1
"""Bytes of an FP8 element (E4M3 or E5M2; Micikevicius et al. 2022, arXiv:2209.05433)."""

CAST_BYTES = 2 + 2 * FP8_BYTES
"""Bytes moved per element by a cast to FP8: the 16-bit read, then the row-wise and column-wise
FP8 copies written (see the module docstring)."""

MX_BLOCK = 32
"""Elements that share one E8M0 scale in MXFP8 (OCP Microscaling Formats v1.0; TE's
``MXFP8BlockScaling``)."""

MX_WEIGHT_BYTES = 2 * (FP8_BYTES + 1 / MX_BLOCK)
"""Bytes per element of an MXFP8 tensor kept for both GEMM directions: the row-wise and the
column-wise FP8 copies, each with a 1-byte scale per :data:`MX_BLOCK` elements."""

MX_CAST_BYTES = 2 + MX_WEIGHT_BYTES
"""Bytes moved per element by an MXFP8 cast: the 16-bit read and both scaled copies."""

AMAX_HISTORY_LEN = 1024
"""Entries of each FP8 tensor's amax history: ``--fp8-amax-history-len 1024`` as Megatron-LM's
FP8 example uses it (examples/llama/train_llama3_8b_h100_fp8.sh, d98e8a64)."""

TENSORS_PER_LINEAR = 3
"""FP8 tensors of one linear layer with scaling state: input, weight and output gradient."""

SCALE_UPDATE_BYTES = 2 * TENSORS_PER_LINEAR * AMAX_HISTORY_LEN * 4
"""One linear layer's amax histories (fp32), read and written by the scale update."""


@dataclass(frozen=True, slots=True)
class Fp8Overheads:
    """Seconds of one layer's FP8 casts and scale updates for one micro-batch, and their count."""

    forward: float
    backward: float
    kernels_forward: int
    kernels_backward: int


def fp8_overheads(costs: KernelCosts, linears: Sequence[tuple[float, float, float]],
                  micro_batches: int) -> Fp8Overheads:
    """The overheads of the linear GEMMs ``y = x @ w``, given as (m, n, k) with x (m x k) and
    w (k x n); a step of ``micro_batches`` micro-batches casts each weight once."""
    cast = costs.cast_bytes
    # MXFP8's scales are each block's own: no amax history to update
    update = costs.elementwise(SCALE_UPDATE_BYTES) if costs.scale_update else 0.0
    forward = backward = 0.0
    for m, n, k in linears:
        forward += (costs.elementwise(cast * m * k)                  # x
                    + costs.elementwise(cast * k * n) / micro_batches  # w, once a step
                    + update)
        backward += costs.elementwise(cast * m * n) + update
    kernels = (2 if costs.scale_update else 1) * len(linears)
    return Fp8Overheads(forward, backward, kernels, kernels)


def fp8_problem(device: DeviceSpec, precision: Precision = Precision.FP8) -> str | None:
    """Why ``device`` cannot run a plan in ``precision`` (fp8 or mxfp8), or None if it can."""
    if device.fp8_peak_flops_per_s is None:
        return (f"precision {precision.value} needs FP8 tensor cores, but device {device.name}"
                " has none (no fp8_peak_tflops in its catalog entry); use precision bf16, or"
                " an H100-class device")
    if precision is Precision.MXFP8 and device.mxfp8_matmul_efficiency is None:
        return (f"precision mxfp8 needs tensor cores that scale 32-element blocks (Blackwell),"
                f" but device {device.name} has no mxfp8_matmul_efficiency in its catalog entry;"
                " use precision fp8 (per-tensor scaling)")
    return None
