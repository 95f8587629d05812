"""What one kernel costs on a device: the floors a real step's kernels add up (Calculon's
processor model, and what a profile of Megatron-LM shows): the host must launch it, a GEMM runs in
waves of output tiles over the streaming multiprocessors, and a small or skinny GEMM is bound by
the bytes it moves rather than its FLOPs (:mod:`simcore.megatron.kernels` sums a layer's).

Kernel time (seconds)::

    gemm        max(launch, 2 m n k b / (peak * matmul_efficiency * waves(m, n, b))
                            + ceil(tiles / SMs) * gemm_wave,
                    bytes / (hbm * memory_efficiency))
    elementwise max(launch, bytes / (hbm * memory_efficiency))
    attention   max(launch, flops / (peak * attention_efficiency))       (flash, one kernel)

``waves`` is the fraction of the SMs a GEMM's output tiles keep busy over its waves (NVIDIA,
"Matrix Multiplication Background User's Guide", wave quantisation): ``t / (ceil(t / SMs) SMs)``
for ``t`` tiles of :data:`TILE` x :data:`TILE`. ``gemm_wave`` is the fixed time of each wave (the
tiles' prologue and epilogue; the device's ``gemm_wave_s``), which makes a GEMM with a short
reduction dimension slower per FLOP: fit on XLA's measured H100 bf16 GEMM table
(tests/data/gemm/README.md), 16-bit GEMMs only. With every floor at 0 (a device entry without the
constants, as ASTRA-sim's files are) the layer costs its FLOPs and bytes at the achievable rates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simcore.megatron.precision import (
    FORMATS,
    QuantFormat,
    fp8_attention_problem,
    fp8_problem,
    quantized_rate,
)
from simcore.specs import DeviceSpec, Precision

__all__ = ["BLOCKING_HOST_S", "TILE", "KernelCosts"]

TILE = 128
"""Output tile edge of a GEMM thread block (cuBLAS / CUTLASS's common 128 x 128 tile)."""

BLOCKING_HOST_S = 200e-6
"""Host time of one kernel that the GPU waits for under launch blocking
(``CUDA_LAUNCH_BLOCKING=1``: each launch returns when its kernel has finished, so the framework's
Python, PyTorch's dispatch and the launch of the next kernel no longer overlap the GPU's work).
Fit on tests/data/validation/jean-zay-fit.csv (Megatron-DeepSpeed on Jean Zay's A100 nodes, the
only runs known to set it), the grid 100-300 us in steps of 50 with the network's
``per_communicator``: 200 us gives the fit file's least mean error; checked on
jean-zay-check.csv and a100-check.csv's Lucie rows (tests/data/validation/README.md). It also
stands for the kernels the inventory does not count (an eager layer's unfused RoPE)."""


@dataclass(frozen=True, slots=True)
class KernelCosts:
    """What one kernel costs on a device."""

    flop_rate: float
    byte_rate: float
    attention_rate: float
    launch: float
    sm_count: int
    fp8_rate: float | None = None
    """Achievable FLOP/s of the linear layers' quantised GEMMs (FP8, MXFP8 or NVFP4); None runs
    them in 16-bit."""
    fmt: QuantFormat = FORMATS[Precision.FP8]
    """What the quantised GEMMs' format moves and keeps (:mod:`simcore.megatron.precision`)."""
    gemm_wave: float = 0.0
    """Fixed time of each wave of a 16-bit GEMM's output tiles (the device's gemm_wave_s)."""
    host: float = 0.0
    """Host time added to every kernel: :data:`BLOCKING_HOST_S` under launch blocking, else 0
    (the host runs ahead and its time hides under the kernels before)."""
    attention_fp8: tuple[tuple[int, float], ...] = ()
    """The fused attention runs in FP8: the device's speed-up points by sequence length
    (:attr:`simcore.specs.DeviceSpec.fp8_attention_speedup`); empty: in 16-bit."""

    @classmethod
    def of(cls, device: DeviceSpec, precision: Precision = Precision.BF16,
           transformer_engine: bool = False, launch_blocking: bool = False,
           fp8_attention: bool = False) -> KernelCosts:
        """The device's costs; ``transformer_engine``: the GEMMs at the device's
        ``fused_matmul_efficiency`` and attention in TE's fused kernel at its
        ``fused_attention_efficiency``, each where it has one; ``launch_blocking``: each kernel
        waits for the host (:data:`BLOCKING_HOST_S`); ``fp8_attention``: TE's fused attention in
        FP8, as :func:`simcore.megatron.stack.uses_fp8_attention` decides it."""
        matmul = device.matmul_efficiency
        if transformer_engine and device.fused_matmul_efficiency is not None:
            matmul = device.fused_matmul_efficiency
        flop_rate = device.peak_flops_per_s * matmul
        attention = device.attention_efficiency
        if transformer_engine and device.fused_attention_efficiency is not None:
            attention = device.fused_attention_efficiency
        fp8_rate = None
        if precision.quantized:
            problem = fp8_problem(device, precision)
            if problem is not None:
                raise ValueError(problem)
            fp8_rate = quantized_rate(device, precision, matmul)
        attention_fp8: tuple[tuple[int, float], ...] = ()
        if fp8_attention:
            problem = fp8_attention_problem(device)
            if problem is not None:
                raise ValueError(problem)
            attention_fp8 = device.fp8_attention_speedup
        return cls(
            flop_rate=flop_rate,
            byte_rate=device.hbm_bandwidth_bytes_per_s * device.memory_efficiency,
            attention_rate=(flop_rate if attention is None
                            else device.peak_flops_per_s * attention),
            launch=device.kernel_launch_s,
            sm_count=device.sm_count,
            fp8_rate=fp8_rate,
            fmt=FORMATS.get(precision, FORMATS[Precision.FP8]),
            gemm_wave=device.gemm_wave_s,
            host=BLOCKING_HOST_S if launch_blocking else 0.0,
            attention_fp8=attention_fp8,
        )

    def waves(self, m: float, n: float, batch: float = 1) -> float:
        """Fraction of the SMs busy over the GEMM's waves (1 without an SM count)."""
        return self._waves(m, n, batch)[0]

    def _waves(self, m: float, n: float, batch: float) -> tuple[float, int]:
        """The busy fraction over the GEMM's waves and their number (1.0 and 0 without an SM
        count)."""
        if not self.sm_count:
            return 1.0, 0
        tiles = math.ceil(m / TILE) * math.ceil(n / TILE) * batch
        count = math.ceil(tiles / self.sm_count)
        return tiles / (count * self.sm_count), count

    def gemm(self, m: float, n: float, k: float, batch: float = 1, *,
             element_bytes: int = 2) -> float:
        """An (m x k) @ (k x n) GEMM, ``batch`` times in one kernel."""
        flops = 2 * m * n * k * batch
        moved = element_bytes * batch * (m * k + k * n + m * n)
        busy, count = self._waves(m, n, batch)
        compute = flops / (self.flop_rate * busy) + count * self.gemm_wave
        return self.host + max(self.launch, compute, moved / self.byte_rate)

    def linear(self, m: float, n: float, k: float, batch: float = 1) -> float:
        """A linear layer's GEMM (``batch`` of them in one kernel: a grouped GEMM of experts):
        :meth:`gemm` in 16-bit, or quantised (FP8: 1-byte inputs, a 16-bit output) at the
        quantised rate."""
        if self.fp8_rate is None:
            return self.gemm(m, n, k, batch)
        flops = 2 * m * n * k * batch
        moved = batch * (self.fmt.operand_bytes * (m * k + k * n) + 2 * m * n)
        work = max(flops / (self.fp8_rate * self.waves(m, n, batch)), moved / self.byte_rate)
        return self.host + max(self.launch, work)

    def elementwise(self, bytes_moved: float) -> float:
        return self.host + max(self.launch, bytes_moved / self.byte_rate)

    def attention(self, flops: float) -> float:
        return self.host + max(self.launch, flops / self.attention_rate)
