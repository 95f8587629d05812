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

NVFP4 (``Precision.NVFP4``, TE's ``NVFP4BlockScaling``): E2M1 values (half a byte) with an E4M3
scale per 16 elements and an fp32 scale per tensor; the GEMMs at the device's
``nvfp4_matmul_efficiency`` of its FP4 peak. The per-tensor scale needs the tensor's amax before
the cast, a pass of its own (one read); the cast then writes both copies, the column-wise one
(the weight gradient's) through a 16 x 16 random Hadamard transform and, for gradients, with
stochastic rounding, in the same kernel (priced as its memory traffic). Megatron-Bridge's NVFP4
recipe gathers no FP4 parameters: the 16-bit weights stay beside both NVFP4 copies.

FP8 attention (:attr:`simcore.specs.TrainingSpec.fp8_attention`, Megatron-Core's
``fp8_dot_product_attention``): TE's fused attention kernel in FP8 too, at the device's
``fp8_attention_speedup`` over its 16-bit time for the plan's local query length
(:func:`fp8_attention_speedup`; cuDNN's own benchmark, not fit on training runs), Q, K and V kept
for its backward in 1 byte (:mod:`simcore.megatron.activations`).

Memory: TE keeps an FP8 copy of each linear layer's weight (1 byte per parameter, on top of the
16-bit weights and fp32 master weights); each linear layer saves its input for the weight
gradient in FP8 (1 byte per element instead of 2). With the distributed optimizer or FSDP under
Transformer Engine (ZeRO 1-3), Megatron-LM's ``--fp8-param-gather`` keeps the FP8 copy as the
only compute weight (no 16-bit one) and all-gathers it in FP8
(:func:`simcore.megatron.stack.uses_fp8_param_gather`). MXFP8 keeps both scaled copies of each
weight (:data:`MX_WEIGHT_BYTES`); with ``--fp8-param-gather`` and
``--reuse-grad-buf-for-mxfp8-param-ag`` they are the only compute copy, gathered in 16-bit into
the gradient buffer and quantised there (Megatron-LM ``param_and_grad_buffer.py``). These are in
:mod:`simcore.megatron.activations`, :mod:`simcore.megatron.stage_memory` and
:mod:`simcore.megatron.calls`.
"""

from __future__ import annotations

import math
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
    "NV_BLOCK",
    "NV_CAST_BYTES",
    "NV_ELEMENT_BYTES",
    "NV_WEIGHT_BYTES",
    "FP4_BYTES",
    "saved_input_bytes",
    "FORMATS",
    "QuantFormat",
    "quantized_rate",
    "FP8_BYTES",
    "Fp8Overheads",
    "fp8_overheads",
    "fp8_problem",
    "fp8_attention_problem",
    "fp8_attention_speedup",
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

NV_BLOCK = 16
"""Elements that share one E4M3 scale in NVFP4 (TE's ``NVFP4BlockScaling``: "each group of 16
consecutive values is scaled together")."""

FP4_BYTES = 0.5
"""Bytes of an E2M1 element (two a byte)."""

NV_ELEMENT_BYTES = FP4_BYTES + 1 / NV_BLOCK
"""Bytes per element of one NVFP4 copy: the 4-bit value and its share of the 1-byte scale."""

NV_WEIGHT_BYTES = 2 * NV_ELEMENT_BYTES
"""Bytes per element of an NVFP4 tensor kept for both GEMM directions (row- and column-wise)."""

NV_CAST_BYTES = 2 + NV_WEIGHT_BYTES
"""Bytes moved per element by an NVFP4 cast, after its amax pass: the 16-bit read and both
copies (the column-wise one through the 16 x 16 random Hadamard transform, in the same
kernel)."""

AMAX_HISTORY_LEN = 1024
"""Entries of each FP8 tensor's amax history: ``--fp8-amax-history-len 1024`` as Megatron-LM's
FP8 example uses it (examples/llama/train_llama3_8b_h100_fp8.sh, d98e8a64)."""

TENSORS_PER_LINEAR = 3
"""FP8 tensors of one linear layer with scaling state: input, weight and output gradient."""

SCALE_UPDATE_BYTES = 2 * TENSORS_PER_LINEAR * AMAX_HISTORY_LEN * 4
"""One linear layer's amax histories (fp32), read and written by the scale update."""


@dataclass(frozen=True, slots=True)
class QuantFormat:
    """What a quantised format moves and keeps, per element (the module docstring)."""

    operand_bytes: float
    """A GEMM input's element with its share of the scales."""
    cast_bytes: float
    """Moved by one cast: the 16-bit read and the copies written."""
    saved_bytes: float
    """A linear layer's input kept for the weight gradient (its column-wise copy)."""
    weight_bytes: float
    """The weight copy Transformer Engine keeps, a linear parameter."""
    scale_update: bool
    """Each cast's per-tensor scale is updated by a kernel of its own (delayed scaling's)."""
    amax_pass: bool
    """Each cast reads its tensor once more first, for a per-tensor amax (NVFP4's)."""


FORMATS = {
    Precision.FP8: QuantFormat(operand_bytes=FP8_BYTES, cast_bytes=CAST_BYTES,
                               saved_bytes=FP8_BYTES, weight_bytes=FP8_BYTES,
                               scale_update=True, amax_pass=False),
    Precision.MXFP8: QuantFormat(operand_bytes=FP8_BYTES, cast_bytes=MX_CAST_BYTES,
                                 saved_bytes=FP8_BYTES + 1 / MX_BLOCK,
                                 weight_bytes=MX_WEIGHT_BYTES, scale_update=False,
                                 amax_pass=False),
    Precision.NVFP4: QuantFormat(operand_bytes=NV_ELEMENT_BYTES, cast_bytes=NV_CAST_BYTES,
                                 saved_bytes=NV_ELEMENT_BYTES, weight_bytes=NV_WEIGHT_BYTES,
                                 scale_update=False, amax_pass=True),
}
"""The quantised precisions' formats (MXFP8's and NVFP4's block scales are each block's own,
so they update no amax history)."""


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
    fmt = costs.fmt
    update = costs.elementwise(SCALE_UPDATE_BYTES) if fmt.scale_update else 0.0
    forward = backward = 0.0
    for m, n, k in linears:
        forward += (quantize_time(costs, m * k)                  # x
                    + quantize_time(costs, k * n) / micro_batches  # w, once a step
                    + update)
        backward += quantize_time(costs, m * n) + update
    kernels = (1 + fmt.scale_update + fmt.amax_pass) * len(linears)
    return Fp8Overheads(forward, backward, kernels, kernels)


def quantize_time(costs: KernelCosts, elements: float) -> float:
    """One tensor's cast to the GEMMs' format; NVFP4's (:attr:`QuantFormat.amax_pass`) reads it
    once more first, for its per-tensor scale (and the Hadamard-transformed copy's)."""
    cast = costs.elementwise(costs.fmt.cast_bytes * elements)
    return cast + costs.elementwise(2 * elements) if costs.fmt.amax_pass else cast


def saved_input_bytes(precision: Precision) -> float:
    """Bytes an element of a linear layer's input kept for its weight gradient: 16-bit, or the
    column-wise copy the quantised GEMM reads (:attr:`QuantFormat.saved_bytes`)."""
    return 2.0 if precision is Precision.BF16 else FORMATS[precision].saved_bytes


def quantized_rate(device: DeviceSpec, precision: Precision, matmul: float) -> float:
    """Achievable FLOP/s of the linear layers' GEMMs in ``precision`` (fp8, mxfp8 or nvfp4) on a
    device that runs it; ``matmul``: the stack's 16-bit GEMM efficiency, which per-tensor FP8
    keeps."""
    if precision is Precision.NVFP4:
        assert device.fp4_peak_flops_per_s and device.nvfp4_matmul_efficiency
        return device.fp4_peak_flops_per_s * device.nvfp4_matmul_efficiency
    assert device.fp8_peak_flops_per_s is not None
    if precision is Precision.MXFP8:
        assert device.mxfp8_matmul_efficiency is not None
        matmul = device.mxfp8_matmul_efficiency
    return device.fp8_peak_flops_per_s * matmul


def fp8_problem(device: DeviceSpec, precision: Precision = Precision.FP8) -> str | None:
    """Why ``device`` cannot run a plan in ``precision`` (fp8, mxfp8 or nvfp4), or None if it
    can."""
    if precision is Precision.NVFP4:
        if device.fp4_peak_flops_per_s is None or device.nvfp4_matmul_efficiency is None:
            return (f"precision nvfp4 needs FP4 tensor cores (Blackwell), but device"
                    f" {device.name} has no fp4_peak_tflops and nvfp4_matmul_efficiency in its"
                    " catalog entry; use precision fp8, or a Blackwell device")
        return None
    if device.fp8_peak_flops_per_s is None:
        return (f"precision {precision.value} needs FP8 tensor cores, but device {device.name}"
                " has none (no fp8_peak_tflops in its catalog entry); use precision bf16, or"
                " an H100-class device")
    if precision is Precision.MXFP8 and device.mxfp8_matmul_efficiency is None:
        return (f"precision mxfp8 needs tensor cores that scale 32-element blocks (Blackwell),"
                f" but device {device.name} has no mxfp8_matmul_efficiency in its catalog entry;"
                " use precision fp8 (per-tensor scaling)")
    return None


def fp8_attention_problem(device: DeviceSpec) -> str | None:
    """Why ``device`` cannot price FP8 attention (:attr:`TrainingSpec.fp8_attention`), or None."""
    if device.fp8_attention_speedup:
        return None
    return (f"fp8_attention needs the device's FP8 attention throughput, but device {device.name}"
            " has no fp8_attention_speedup in its catalog entry (cuDNN's FP8 against 16-bit"
            " attention by sequence length); add it, or set fp8_attention false")


def fp8_attention_speedup(points: Sequence[tuple[int, float]], length: float) -> float:
    """The FP8 attention's speed-up at a sequence of ``length`` tokens, from a device's
    :attr:`DeviceSpec.fp8_attention_speedup` points: linear in the logarithm of the length
    between points, the nearest point's beyond them (1.0 without points)."""
    if not points:
        return 1.0
    if length <= points[0][0]:
        return points[0][1]
    for (lo, a), (hi, b) in zip(points, points[1:]):
        if length <= hi:
            return a + (b - a) * math.log(length / lo) / math.log(hi / lo)
    return points[-1][1]
