"""The accelerator (:class:`DeviceSpec`) and the system of them with its network
(:class:`SystemSpec`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from simcore.network import Network
from simcore.specs.choices import _fraction, _positive


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceSpec:
    """One accelerator."""

    name: str
    peak_flops_per_s: float
    """Peak dense bf16 FLOP/s (2 FLOP per multiply-accumulate)."""
    hbm_bytes: float
    """HBM capacity in bytes, as the driver reports it (an "80GB" part has 80 GiB: 85.9e9)."""
    hbm_bandwidth_bytes_per_s: float
    matmul_efficiency: float = 1.0
    """Achievable fraction of peak on large matmuls (calibrated per device, see the catalog)."""
    memory_efficiency: float = 1.0
    """Achievable fraction of HBM bandwidth on element-wise kernels."""
    memory_overhead_bytes: float = 0.0
    """Allowance for the CUDA context, communication library and allocator on this device."""
    workspace_bytes: float = 0.0
    """Of ``memory_overhead_bytes``, what PyTorch's caching allocator counts: the GEMM
    libraries' workspaces (cuBLAS's, 32 MiB a stream under ``CUBLAS_WORKSPACE_CONFIG=:4096:8``,
    and Transformer Engine's), which a measured allocated peak (``max_memory_allocated``)
    includes and the rest of the allowance (the CUDA context, NCCL's buffers, the allocator's
    slack) does not. The estimate's totals are the same either way; only a comparison with an
    allocated peak reads it (:mod:`planner.validation`)."""
    kernel_launch_s: float = 0.0
    """Floor of every kernel: its launch and the framework's dispatch on the host. A kernel whose
    work takes less leaves the device waiting for the next one. 0 disables the floor."""
    host_kernel_s: float = 0.0
    """Host time to issue one kernel of the estimate's inventory (:mod:`simcore.megatron.kernels`)
    in an eager training step: the framework's Python, PyTorch's dispatch and the launch, for the
    kernel and the small operations around it that the inventory does not count. The host runs
    ahead of the GPU, so it shows only where a layer's kernels take less time on the GPU than
    the host takes to issue them (small layers, high tp, short micro-batches): the layer then
    runs at the host's pace (:func:`simcore.megatron.layer_step.host_wait`). A property of the
    host driving the part and its software; 0 disables it, as do CUDA graphs
    (:attr:`TrainingSpec.cuda_graphs`)."""
    sm_count: int = 0
    """Streaming multiprocessors (compute units) for wave quantisation: a GEMM whose output
    tiles leave the last wave partly empty pays for the whole wave. 0 disables it."""
    gemm_wave_s: float = 0.0
    """Fixed time of each wave of a 16-bit GEMM's output tiles, beside its multiply-adds: the
    tiles' prologue (the first operand loads) and epilogue (writing the output). It makes a GEMM
    with a short reduction dimension slower per FLOP. Needs ``sm_count``; 0 disables it."""
    collective_launch_s: float = 0.0
    """Host-side cost of issuing one collective or send/receive from the training framework
    (torch.distributed and the communication library's launch), on top of the network's own
    per-call latency; also what a tp collective adds to the host's pace
    (:func:`simcore.megatron.layer_step.host_wait`). 0 disables it."""
    attention_efficiency: float | None = None
    """Achievable fraction of peak of the fused (flash) attention kernels; None uses
    matmul_efficiency."""
    flash_attention: bool = False
    """Plans on this device use flash attention unless the training says otherwise."""
    fused_attention_efficiency: float | None = None
    """Achievable fraction of peak of Transformer Engine's fused attention (cuDNN) inside
    training; None uses attention_efficiency."""
    fused_matmul_efficiency: float | None = None
    """Achievable fraction of peak (16-bit and FP8) of the GEMMs of a Transformer Engine stack
    inside training; None uses matmul_efficiency."""
    transformer_engine: bool = False
    """Plans with ZeRO 0-1 on this device train with Transformer Engine unless the training says
    otherwise (:attr:`TrainingSpec.transformer_engine`)."""
    host_bandwidth_bytes_per_s: float | None = None
    """The device's link to its host's memory, each way (PCIe, or a Grace superchip's
    NVLink-C2C): what activation offloading copies over (:attr:`Strategy.offload_layers`). None:
    not known; such a device offloads nothing."""
    overlap_slowdown: float = 0.0
    """Fraction by which compute slows while a collective runs beside it (the two share the SMs
    and HBM: Lee et al. 2025, arXiv:2507.03114, measured 18.9% on average on A100, H100, MI250
    and MI210, up to 40%). A collective of ``c`` s hidden behind ``k`` s of compute then costs
    ``max(0, c - k) + overlap_slowdown * min(c, k)``. 0 overlaps for free, as ASTRA-sim does."""
    bf16: bool = True
    """The part has bf16 tensor cores; False (Pascal, Volta, Turing) trains in fp16 with loss
    scaling. Both are 2 bytes, so the estimate is the same; exports pick the flag."""
    fp8_peak_flops_per_s: float | None = None
    """Peak dense FP8 FLOP/s (2 FLOP per multiply-accumulate); None: the part has no FP8 tensor
    cores (A100, V100 and older), so a plan in fp8 cannot run on it."""
    mxfp8_matmul_efficiency: float | None = None
    """Achievable fraction of the FP8 peak of the linear layers' MXFP8 (block-scaled) GEMMs in a
    Transformer Engine stack; None: the part cannot run MXFP8 (its tensor cores do not scale
    blocks)."""
    fp4_peak_flops_per_s: float | None = None
    """Peak dense FP4 FLOP/s; None: the part has no FP4 tensor cores (before Blackwell)."""
    nvfp4_matmul_efficiency: float | None = None
    """Achievable fraction of the FP4 peak of the linear layers' NVFP4 GEMMs in a Transformer
    Engine stack; None: the part cannot run NVFP4."""
    fp8_attention_speedup: tuple[tuple[int, float], ...] = ()
    """Transformer Engine's fused attention in FP8 against its 16-bit kernel on this part, its
    forward and backward together: (sequence length, speed-up) points in increasing length, as
    cuDNN's own benchmark measures them (``studies/catalog/devices/gpus.yaml``); between points
    the speed-up is read on a log scale of the length, beyond them the nearest point's. Empty:
    the entry names none, and :attr:`TrainingSpec.fp8_attention` is refused on the part."""

    def __post_init__(self) -> None:
        for name in ("peak_flops_per_s", "hbm_bytes", "hbm_bandwidth_bytes_per_s"):
            _positive(name, getattr(self, name))
        if not (self.kernel_launch_s >= 0 and math.isfinite(self.kernel_launch_s)):
            raise ValueError(
                "`kernel_launch_s >= 0` must hold, but got"
                f" kernel_launch_s={self.kernel_launch_s!r}"
            )
        if not (self.host_kernel_s >= 0 and math.isfinite(self.host_kernel_s)):
            raise ValueError("`host_kernel_s >= 0` must hold, but got"
                             f" host_kernel_s={self.host_kernel_s!r}")
        if not (self.gemm_wave_s >= 0 and math.isfinite(self.gemm_wave_s)):
            raise ValueError("`gemm_wave_s >= 0` must hold, but got"
                             f" gemm_wave_s={self.gemm_wave_s!r}")
        if not (self.collective_launch_s >= 0 and math.isfinite(self.collective_launch_s)):
            raise ValueError("`collective_launch_s >= 0` must hold, but got"
                             f" collective_launch_s={self.collective_launch_s!r}")
        if isinstance(self.sm_count, bool) or not isinstance(self.sm_count, int) \
                or self.sm_count < 0:
            raise ValueError(f"`sm_count >= 0` must hold (a whole number), but got"
                             f" sm_count={self.sm_count!r}")
        for name in ("attention_efficiency", "fused_attention_efficiency",
                     "fused_matmul_efficiency", "mxfp8_matmul_efficiency",
                     "nvfp4_matmul_efficiency"):
            if getattr(self, name) is not None:
                _fraction(name, getattr(self, name))
        if not (self.workspace_bytes >= 0 and math.isfinite(self.workspace_bytes)):
            raise ValueError("`workspace_bytes >= 0` must hold, but got"
                             f" workspace_bytes={self.workspace_bytes!r}")
        if not (self.memory_overhead_bytes >= 0 and math.isfinite(self.memory_overhead_bytes)):
            raise ValueError(
                "`memory_overhead_bytes >= 0` must hold, but got"
                f" memory_overhead_bytes={self.memory_overhead_bytes!r}"
            )
        _fraction("matmul_efficiency", self.matmul_efficiency)
        _fraction("memory_efficiency", self.memory_efficiency)
        if not 0 <= self.overlap_slowdown < 1:
            raise ValueError("`0 <= overlap_slowdown < 1` must hold, but got"
                             f" overlap_slowdown={self.overlap_slowdown!r}")
        if self.fp8_peak_flops_per_s is not None:
            _positive("fp8_peak_flops_per_s", self.fp8_peak_flops_per_s)
        elif self.mxfp8_matmul_efficiency is not None:
            raise ValueError("mxfp8_matmul_efficiency needs fp8_peak_flops_per_s (MXFP8 runs at"
                             " the FP8 peak); set both or neither")
        if self.fp4_peak_flops_per_s is not None:
            _positive("fp4_peak_flops_per_s", self.fp4_peak_flops_per_s)
        elif self.nvfp4_matmul_efficiency is not None:
            raise ValueError("nvfp4_matmul_efficiency needs fp4_peak_flops_per_s (NVFP4 runs at"
                             " the FP4 peak); set both or neither")
        if self.host_bandwidth_bytes_per_s is not None:
            _positive("host_bandwidth_bytes_per_s", self.host_bandwidth_bytes_per_s)
        lengths = [length for length, _ in self.fp8_attention_speedup]
        if lengths != sorted(set(lengths)) or any(
                not (length >= 1 and ratio > 0 and math.isfinite(ratio))
                for length, ratio in self.fp8_attention_speedup):
            raise ValueError("fp8_attention_speedup must be (length >= 1, speed-up > 0) points in"
                             f" increasing length, but got {self.fp8_attention_speedup!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class SystemSpec:
    """A system: its devices and the network that joins them."""

    name: str
    device: DeviceSpec
    network: Network

    @property
    def devices(self) -> int:
        return self.network.npus
