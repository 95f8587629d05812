"""The frozen, validated inputs of an estimate: model, device, system, training and strategy.

Units are SI throughout: bytes, seconds, bytes/s, FLOP/s (one multiply-accumulate = 2 FLOP).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum

from simcore.network import Network

__all__ = [
    "DEFAULT_PLACEMENT",
    "ZERO_BUBBLE",
    "Activation",
    "Axis",
    "Convention",
    "CpComm",
    "CrossEntropy",
    "DeviceSpec",
    "Family",
    "ModelSpec",
    "Precision",
    "Recompute",
    "RecomputeModule",
    "Schedule",
    "SelectiveRecompute",
    "TRAINING_CHOICES",
    "Strategy",
    "SystemSpec",
    "TrainingSpec",
    "ZeroStage",
]


class _Named(StrEnum):
    """A StrEnum whose unknown values raise a one-line error listing the allowed ones."""

    @classmethod
    def _missing_(cls, value: object) -> None:
        allowed = ", ".join(m.value for m in cls)
        raise ValueError(f"unknown {cls._label()} {value!r}; allowed: {allowed}")

    @classmethod
    def _label(cls) -> str:
        return cls.__name__.lower()


class Axis(_Named):
    """A parallel axis of the device mesh ("axis", never "dim", which is a tensor dimension)."""

    DP = "dp"
    TP = "tp"
    PP = "pp"
    SP = "sp"


DEFAULT_PLACEMENT = (Axis.TP, Axis.SP, Axis.DP, Axis.PP)
"""Innermost first: tensor parallel on the fastest links, pipeline parallel on the slowest."""
_PLACEMENTS = frozenset(itertools.permutations(Axis))
"""Every valid placement: each axis once."""


def _is_placement(placement: object) -> bool:
    try:
        return placement in _PLACEMENTS
    except TypeError:  # unhashable (a list): the slow comparison
        return sorted(placement) == sorted(Axis)  # type: ignore[call-overload]


class Family(_Named):
    GPT = "gpt"
    """Learned positions, GELU MLP, multi-head attention, LayerNorm."""
    LLAMA = "llama"
    """RoPE, SwiGLU MLP, grouped-query attention (kv_heads), RMSNorm, untied embeddings."""
    STAGE = "stage"
    """The transformer exactly as STAGE's ``recomp`` branch builds it for ASTRA-sim."""
    MLP = "mlp"
    """A stack of matmul + ReLU layers (the DistIR study)."""


class Activation(_Named):
    GELU = "gelu"
    SWIGLU = "swiglu"
    RELU = "relu"
    NONE = "none"


_FAMILY_ACTIVATION = {Family.LLAMA: Activation.SWIGLU, Family.MLP: Activation.RELU,
                      Family.STAGE: Activation.NONE}
"""A family's MLP activation where a model does not name one (GPT's GELU otherwise)."""


class Recompute(_Named):
    """Activation recomputation (Korthikanti et al. 2022)."""

    NONE = "none"
    """Keep every activation a backward pass reads."""
    SELECTIVE = "selective"
    """Drop and recompute only the attention core (QK^T, softmax, dropout, x V)."""
    FULL = "full"
    """Keep only each layer's input; recompute the whole forward of the layer in backward."""


class SelectiveRecompute(_Named):
    """What ``recompute: selective`` recomputes: the training stack's selective checkpointing."""

    ATTENTION = "attention"
    """Megatron-LM's (``--recompute-granularity selective``, Korthikanti et al. 2022): the
    attention core."""
    OP = "op"
    """torchtitan's per-op selective activation checkpointing (``selective_ac_option = "op"``,
    pytorch/torchtitan@31a17bfdb7 ``torchtitan/models/llama3/infra/parallelize.py``
    ``_op_sac_save_list`` and its policy; ``SelectiveAC`` at b5bcd76c): each layer keeps the
    outputs of its attention kernel, its reduce-scatters and every other matmul in forward
    order (the first, third, ...), and its input; the backward runs the rest of the layer's
    forward again: the norms, RoPE, the activation function, the residual adds and the other
    matmuls (Llama's K, output and up projections)."""

    @classmethod
    def _label(cls) -> str:
        return "selective_recompute"


class RecomputeModule(_Named):
    """A submodule Megatron-LM's selective recompute runs again (``--recompute-modules``,
    ``megatron/core/transformer/transformer_config.py`` ``recompute_modules`` at d98e8a64; its
    default ``core_attn``). The modules modelled here; Megatron-LM has more."""

    CORE_ATTN = "core_attn"
    """The attention core (Korthikanti et al.'s selective recompute)."""
    MLA_UP_PROJ = "mla_up_proj"
    """Multi-head latent attention's up projections and RoPE, with output-discarding
    checkpointing: the layer keeps the compressed latents, not the heads' Q, K and V."""
    MLP = "mlp"
    """The dense MLP submodule (not an MoE layer's experts): it keeps its input only and runs
    its forward again."""

    @classmethod
    def _label(cls) -> str:
        return "recompute_modules"


class CpComm(_Named):
    """How context parallelism's ranks share K and V (Megatron-LM's ``--cp-comm-type``,
    Transformer Engine's ``cp_comm_type``), which sets the attention core's kernels
    (:mod:`simcore.megatron.cp_kernels`) and whether the exchange hides behind them."""

    P2P = "p2p"
    """A ring (TE's ``AttnFuncWithCPAndKVP2P``, Megatron-LM's default): cp steps, each sending
    the K and V chunk on while the attention of the chunk in hand runs, and after each step
    merging its partial output into the running one by the softmax statistics (the output,
    and backward the gradients of Q, K and V, accumulated step by step). PyTorch's ring
    attention (torchtitan's ``context_parallel_degree``) merges step by step too."""
    ALL_GATHER = "all_gather"
    """K and V all-gathered before the attention and their gradients reduce-scattered after it,
    exposed (TE's ``AttnFuncWithCPAndKVAllGather``: "KV all-gather between CP ranks is
    exposed"; the Llama 3 paper's context parallelism, arXiv:2407.21783 section 3.3.2): two
    attention kernels a layer, one per local chunk of the load-balanced split, and no merge."""

    A2A = "a2a"
    """Q, K and V all-to-all'd so that each rank holds the whole sequence for cp-th of its
    heads, one attention kernel over it, and the output all-to-all'd back, exposed
    (DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv:2309.14509; TE's
    ``AttnFuncWithCPAndQKVOA2A``, Megatron-LM's ``--cp-comm-type a2a``): the heads and the K/V
    heads of a tp rank must divide by cp. What a ``framework: deepspeed`` study runs."""

    @classmethod
    def _label(cls) -> str:
        return "cp_comm"

    @classmethod
    def _missing_(cls, value: object) -> CpComm | None:
        if value == "allgather":  # Megatron-LM's spelling (--cp-comm-type allgather)
            return cls.ALL_GATHER
        return super()._missing_(value)


class CrossEntropy(_Named):
    """How the loss holds the logits at its peak (per logit, on the last stage)."""

    FUSED = "fused"
    """Megatron-LM's vocab-parallel cross-entropy: the fp32 logits, 4 bytes (Korthikanti et al.
    2022, section 4.3)."""
    PYTORCH = "pytorch"
    """``torch.nn.functional.cross_entropy`` on an fp32 copy of the bf16 logits, as torchtitan
    computes its loss (pytorch/torchtitan@31a17bfdb7 ``torchtitan/components/loss.py``
    ``cross_entropy_loss``): the log-softmax output it saves (4 bytes), and in its backward the
    gradients of that output and of its input (4 + 4): 12 bytes."""
    REPLICATED = "replicated"
    """``pytorch``'s loss on the whole vocabulary on every tp rank: the LM head's
    column-parallel output all-gathered to every rank before the loss (DTensor's
    ``ColwiseParallel`` with a ``Replicate`` output and no ``loss_parallel``, as KempnerForge
    runs it: KempnerInstitute/KempnerForge@5666d0d ``kempnerforge/distributed/
    tensor_parallel.py``, "split vocab, gather to Replicate for loss"), and the loss taken on
    the 16-bit logits as they come, with no fp32 copy (``kempnerforge/training/loss.py``
    ``cross_entropy_loss``: ``F.cross_entropy(logits.view(...), ...)``): the logits, which the
    training loop keeps through the backward (``scripts/train.py``: ``logits = model(...)``,
    ``loss = loss_fn(logits, labels)``, ``scaled_loss.backward()``; torchtitan's loop deletes
    them first, pytorch/torchtitan@31a17bfdb7 ``torchtitan/train.py``: "need to free pred before
    bwd to avoid peaking memory"), its log-softmax output and, in its backward, the gradients
    of that output and of its input, 2 bytes each, 8 bytes a logit of the whole vocabulary on
    every rank; each rank runs the loss's passes over all of them, and the backward through
    the gather is a local slice."""
    NANOTRON = "nanotron"
    """nanotron's vocab-parallel loss (huggingface/nanotron@9055c664 ``src/nanotron/models/
    llama.py``: the LM head's output cast to fp32 by the model, ``cast_to_fp32``, then
    ``parallel/tensor_parallel/functional.py`` ``_ShardedCrossEntropy``: ``sharded_logits -
    logits_max``, out of place): at its forward the fp32 copy the model returns and the shifted
    one, 4 + 4 bytes a logit of the rank's vocabulary shard; the exponent and the softmax then
    run in place on the shifted copy, which the backward keeps."""

    @classmethod
    def _label(cls) -> str:
        return "cross_entropy"


class Schedule(_Named):
    """Pipeline schedule."""

    GPIPE = "gpipe"
    """All forwards, then all backwards: m micro-batches in flight."""
    ONE_F_ONE_B = "1f1b"
    """PipeDream-Flush: at most p micro-batches in flight."""
    INTERLEAVED = "interleaved"
    """Interleaved 1F1B with v model chunks per device: bubble / v."""
    ZB_H1 = "zb-h1"
    """Zero-bubble ZB-H1 (Qi et al. 2023, arXiv:2401.10241 section 3.1): backward split into the
    input-gradient pass B and the weight-gradient pass W, W deferred to fill the drain; bubble
    ``(p-1)(T_F + T_B - T_W)`` against 1F1B's ``(p-1)(T_F + T_B + T_W)``, the same peak
    activation memory as 1F1B (p micro-batches in flight)."""
    ZBV = "zbv"
    """Zero-bubble V (Qi et al. 2023 section 6): two model chunks per rank laid out in a V
    (rank r holds chunks r and 2p-1-r, so rank 0 holds the embedding and the LM head), B and W
    split, run in PyTorch's ``ScheduleZBVZeroBubble`` order (what torchtitan's ``ZBVZeroBubble``
    runs); v = 2, 1F1B's peak activation memory on every rank (:mod:`simcore.megatron.pipeline`)."""


ZERO_BUBBLE = frozenset({Schedule.ZB_H1, Schedule.ZBV})
"""The schedules that split each backward into B (input gradients) and W (weight gradients)."""


class ZeroStage(IntEnum):
    """What data-parallel ranks shard (Rajbhandari et al. 2020)."""

    NONE = 0
    """Every rank holds everything."""
    OPTIMIZER = 1
    """Optimizer states (and fp32 master weights) sharded: ZeRO-1, Megatron's distributed optimizer."""
    GRADIENTS = 2
    """Optimizer states and gradients sharded: ZeRO-2."""
    PARAMETERS = 3
    """Everything sharded, weights gathered before use: ZeRO-3 / FSDP."""


class Precision(_Named):
    """The number format of the transformer layers' GEMMs."""

    BF16 = "bf16"
    """Every GEMM in 16-bit (bf16, or fp16 on parts without bf16 tensor cores)."""
    FP8 = "fp8"
    """The linear layers' GEMMs (QKV, projection, FC1, FC2: forward, input and weight gradients)
    in FP8 as Transformer Engine runs them; attention, LM head, embedding and optimizer stay
    16-bit (:mod:`simcore.megatron.precision`). Megatron convention only."""
    MXFP8 = "mxfp8"
    """The same GEMMs in MXFP8: FP8 with one power-of-two scale per 32 elements, which only
    Blackwell's tensor cores apply in hardware (TE's ``MXFP8BlockScaling``, Megatron-LM's
    ``--fp8-recipe mxfp8``); needs a device with ``mxfp8_matmul_efficiency``."""

    NVFP4 = "nvfp4"
    """The same GEMMs in NVFP4: 4-bit E2M1 values with an FP8 (E4M3) scale per 16 elements and
    an fp32 one per tensor, Transformer Engine's ``NVFP4BlockScaling`` (Megatron-LM's
    ``--fp4-format e2m1 --fp4-recipe nvfp4``); needs a device with ``nvfp4_matmul_efficiency``
    (Blackwell)."""

    @property
    def quantized(self) -> bool:
        """The linear layers' GEMMs run in a quantised format (FP8, MXFP8 or NVFP4)."""
        return self is not Precision.BF16


class Convention(_Named):
    """Which graph convention the step model follows."""

    MEGATRON = "megatron"
    STAGE = "stage"
    MLP = "mlp"


def _positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not (value > 0 and math.isfinite(value)):
        raise ValueError(f"`{name} > 0` must hold, but got {name}={value!r}")


def _fraction(name: str, value: float) -> None:
    if not 0 < value <= 1:
        raise ValueError(f"`0 < {name} <= 1` must hold, but got {name}={value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class MoESpec:
    """A mixture-of-experts FFN: in each MoE layer a router sends every token to ``top_k`` of
    ``experts`` routed experts (each an FFN of width ``expert_ffn``), beside ``shared_experts``
    that every token goes through (Fedus et al. 2021; DeepSeek-V3, arXiv:2412.19437 section 2.1.2;
    Megatron-LM ``--num-experts``, ``--moe-router-topk``, ``--moe-ffn-hidden-size``,
    ``--moe-shared-expert-intermediate-size``, ``--moe-layer-freq``)."""

    experts: int
    top_k: int
    expert_ffn: int
    shared_experts: int = 0
    shared_ffn: int | None = None
    """Width of each shared expert's FFN; None: ``expert_ffn``."""
    first_dense: int = 0
    """The first layers keep a dense FFN of the model's ``ffn_hidden`` (DeepSeek-V3: 3)."""
    every: int = 1
    """After them every ``every``-th layer is MoE, the last of each group (1: all of them;
    2: dense, MoE, dense, MoE, as Llama 4 Maverick)."""
    capacity_factor: float = 1.0
    """Tokens the busiest expert rank receives over the mean: load imbalance, or the capacity a
    token-dropping router pads to (Megatron-LM ``--moe-expert-capacity-factor``). The step runs
    at the busiest rank: its expert GEMMs and all-to-all volume scale by it. 1: balanced."""

    def __post_init__(self) -> None:
        for name in ("experts", "top_k", "expert_ffn", "every"):
            _positive(name, getattr(self, name))
        if self.shared_ffn is not None:
            _positive("shared_ffn", self.shared_ffn)
        for name in ("shared_experts", "first_dense"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"`{name} >= 0` must hold, but got {name}={value!r}")
        if self.top_k > self.experts:
            raise ValueError(f"`top_k <= experts` must hold, but got top_k={self.top_k},"
                             f" experts={self.experts}")
        if not (1 <= self.capacity_factor <= 16):
            raise ValueError("`1 <= capacity_factor <= 16` must hold, but got"
                             f" capacity_factor={self.capacity_factor!r}")

    @property
    def shared_width(self) -> int:
        """All shared experts' FFN width together (they run as one FFN)."""
        return self.shared_experts * (self.expert_ffn if self.shared_ffn is None
                                      else self.shared_ffn)

    def is_moe(self, layer: int) -> bool:
        """Whether transformer layer ``layer`` (0-based) has the MoE FFN."""
        return layer >= self.first_dense and (layer - self.first_dense) % self.every == \
            self.every - 1

    def moe_layers(self, start: int, stop: int) -> int:
        """MoE layers among layers ``start`` .. ``stop - 1``: with j = i - first_dense, those
        with (j + 1) a multiple of ``every``, i.e. the multiples of ``every`` in (a, b]."""
        a, b = max(start, self.first_dense) - self.first_dense, stop - self.first_dense
        return max(0, b // self.every - a // self.every) if b > a else 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A transformer's (or the DistIR MLP's) shape."""

    name: str
    family: Family
    layers: int
    hidden: int
    ffn_hidden: int
    """MLP inner width (4 * hidden for GPT; 28672 for Llama-70B's SwiGLU)."""
    heads: int
    vocab: int
    seq_len: int
    """Sequence length the model is trained at (training may override)."""
    kv_heads: int | None = None
    """Key/value heads for grouped-query attention; None means heads (multi-head attention)."""
    activation: Activation | None = None
    """The MLP's activation; None takes the family's: SwiGLU for Llama (three matrices), ReLU
    for the DistIR MLP, none for STAGE's transformer, GELU for GPT."""
    tied_embeddings: bool = False
    """True if the LM head reuses the input embedding matrix (GPT); False for Llama."""
    moe: MoESpec | None = None
    """The MoE layers' FFN; None: a dense model."""
    attention_head_dim: int | None = None
    """Width of a head's queries and keys in the attention core, when it is not hidden / heads
    (DeepSeek-V3's MLA: the mean of its 192-wide queries and keys and 128-wide values, 160, so
    the core's FLOPs are right)."""
    attention_params: int | None = None
    """Parameters of one layer's attention projections, when they are not the Q, K, V and
    output matrices of the heads (DeepSeek-V3's multi-head latent attention: 187.1 M, its
    low-rank down and up projections); its projections' FLOPs follow from it."""
    mla_latent: int | None = None
    """Multi-head latent attention: the widths of the compressed tensors a token keeps where
    its up projections recompute (``mla_up_proj``): q_lora_rank + kv_lora_rank +
    qk_rope_head_dim (DeepSeek-V3: 1536 + 512 + 64)."""
    mla_up_params: int | None = None
    """Multi-head latent attention: the weights of one layer's up projections (part of
    ``attention_params``), what ``mla_up_proj`` runs again (DeepSeek-V3: 1536 x 128 x 192 +
    512 x 128 x 256)."""
    dropout: bool | None = None
    """Whether the model trains with dropout (its masks stored, its kernels run). None takes
    the family's default: GPT does (Megatron-LM's 0.1 hidden and attention dropout), Llama does
    not. MPT is a GPT that does not (llm-foundry's ``resid_pdrop``, ``emb_pdrop`` and
    ``attn_pdrop`` default to 0, and PyTorch's dropout at p = 0 returns its input)."""

    def __post_init__(self) -> None:
        if self.activation is None:
            object.__setattr__(self, "activation", _FAMILY_ACTIVATION.get(self.family,
                                                                          Activation.GELU))
        for name in ("layers", "hidden", "ffn_hidden", "heads", "vocab", "seq_len"):
            _positive(name, getattr(self, name))
        for name in ("attention_head_dim", "attention_params", "mla_latent", "mla_up_params"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if (self.mla_latent is None) != (self.mla_up_params is None):
            raise ValueError("mla_latent and mla_up_params describe multi-head latent attention"
                             " together; give both or neither")
        if self.kv_heads is not None:
            _positive("kv_heads", self.kv_heads)
            if self.heads % self.kv_heads:
                raise ValueError(
                    f"`heads % kv_heads == 0` must hold, but got heads={self.heads},"
                    f" kv_heads={self.kv_heads}"
                )
        if self.family is not Family.MLP and self.hidden % self.heads:
            raise ValueError(
                f"`hidden % heads == 0` must hold, but got hidden={self.hidden}, heads={self.heads}"
            )

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def head_dim(self) -> int:
        if self.attention_head_dim is not None:
            return self.attention_head_dim
        return self.hidden // self.heads

    @property
    def trains_with_dropout(self) -> bool:
        """:attr:`dropout`, or the family's default (Llama: no; GPT and the others: yes)."""
        return self.dropout if self.dropout is not None else self.family is not Family.LLAMA

    @property
    def moe_layer_count(self) -> int:
        """How many layers have the MoE FFN (0 for a dense model)."""
        return 0 if self.moe is None else self.moe.moe_layers(0, self.layers)


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


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSpec:
    """What one training step processes."""

    global_batch: int
    """Sequences per optimizer step, over all data-parallel replicas."""
    seq_len: int
    bytes_per_param_weights: int = 2
    """bf16 weights."""
    bytes_per_param_grads: int = 2
    """bf16 gradients (Megatron with fp32 main grads: 4)."""
    grad_copy: bool | None = None
    """Each parameter's 16-bit gradient (its ``.grad``, 2 bytes) stays allocated beside the
    gradient accumulation buffer of ``bytes_per_param_grads``, unsharded: DeepSpeed's
    BF16_Optimizer (bf16 with fp32 gradient accumulation under ZeRO 0-1) adds each ``.grad``
    into its own full-size fp32 buffer and zeroes it without freeing it (deepspeedai/DeepSpeed
    edaa7221 ``deepspeed/runtime/bf16_optimizer.py``: ``fp32_groups_gradients_flat`` is
    ``zeros_like`` the whole flat bf16 group, ``clear_lp_grads`` calls ``zero_``). Megatron-LM
    accumulates straight into its fp32 ``main_grad`` and PyTorch FSDP frees the unsharded
    gradient after its reduce-scatter: neither keeps it. None: off, except in a ``framework:
    deepspeed`` study that accumulates in fp32 (:func:`search_spaces.frameworks.grad_copy`).
    Counted for ZeRO 0-1 plans only (DeepSpeed runs ZeRO-2/3 with its ZeRO optimizer)."""
    bytes_per_param_optimizer: int = 12
    """Mixed-precision Adam: fp32 master weights, momentum and variance (4 + 4 + 4)."""
    master_weights: bool = True
    """The optimizer steps an fp32 master copy of the 16-bit weights (mixed precision,
    Micikevicius et al. 2018). False: the model is cast to its 16-bit type and trained in it
    ("pure" bf16), and Adam's momentum and variance take the weights' type, as
    ``torch.optim.AdamW`` makes them (``zeros_like`` the parameter): 2 + 2 bytes a parameter,
    not ``bytes_per_param_optimizer``, and PyTorch FSDP shards the 16-bit parameter, not an
    fp32 one (:func:`simcore.megatron.stack.uses_fp32_shards`). KempnerForge trains so
    (KempnerInstitute/KempnerForge@5666d0d ``scripts/train.py``: ``model.to(dtype=
    tc.param_dtype)`` before ``fully_shard``)."""
    fsdp_no_sync: bool = False
    """ZeRO-3 (FSDP) accumulates the micro-batches' gradients unsharded and reduce-scatters them
    once, in the last micro-batch's backward: FSDP1's ``no_sync()``, FSDP2's
    ``set_requires_gradient_sync(False)`` on all micro-batches but the last, as KempnerForge
    runs its gradient accumulation (KempnerInstitute/KempnerForge@5666d0d
    ``kempnerforge/training/grad.py`` ``maybe_no_sync``). Each device then keeps its layers'
    whole gradient (over tp, not over dp) through the step, in the reduction's type
    (``bytes_per_param_grads``: FSDP2 upcasts the accumulated gradient to its ``reduce_dtype``,
    ``torch/distributed/fsdp/_fully_shard/_fsdp_param.py`` ``to_accumulated_grad_if_needed``), and
    reduce-scatters a layer's gradient once a step, not once a micro-batch. The shard is not
    held beside it at the peak: the last micro-batch's backward frees each layer's whole
    gradient as it makes its shard (``_fsdp_collectives.py`` ``foreach_reduce``:
    ``unsharded_grads.clear()`` after the copy-in), and the step's ``zero_grad`` frees the
    shards before the next step's micro-batches. False: each
    micro-batch's backward reduce-scatters its gradients, as torchtitan and llm-foundry run
    FSDP. Plans with one micro-batch a step, or another ZeRO stage, are the same either way."""
    swiglu_fusion: bool = True
    """A SwiGLU MLP runs its gate's SiLU and the product in one fused kernel that saves only its
    input (the gate and up projections' output) for the backward, as Megatron-LM's
    ``--bias-swiglu-fusion`` (its default) does: 6 bytes an FFN element a token with FC2's
    input. False: PyTorch's separate ``silu`` and multiply (torchtitan's and Hugging Face's
    Llama, nanotron's ``GLUActivation``, Megatron-DeepSpeed's ``swiglu``), whose autograd keeps
    the SiLU's output too (8 bytes) and which run two element-wise kernels, not one. Models
    without SwiGLU are the same either way."""
    vocab_parallel_embedding: bool = True
    """The token embedding is split over tp, each rank holding V / tp rows, and its output
    all-reduced (reduce-scattered with sequence parallelism), as Megatron-LM's
    ``VocabParallelEmbedding``, Megatron-DeepSpeed's and torchtitan's (``RowwiseParallel``) do.
    False: each tp rank keeps the whole table (its weights, gradients and optimizer state,
    sharded only over dp) and looks its tokens up locally, with no collective, as KempnerForge
    does (KempnerInstitute/KempnerForge@5666d0d ``kempnerforge/distributed/tensor_parallel.py``:
    "Token embedding: Replicated"). Plans with tp 1 are the same either way."""
    bytes_per_activation: int = 2
    fp8_attention: bool = False
    """Transformer Engine's fused attention runs in FP8 too (``fp8_dot_product_attention`` of
    Megatron-Core's TransformerConfig, which Megatron-Bridge and NeMo recipes set and MLPerf's
    2025 NVIDIA submissions run), in plans whose linear layers are quantised (``precision``
    fp8, mxfp8 or nvfp4) and that run TE's fused attention: the kernel at the device's
    :attr:`DeviceSpec.fp8_attention_speedup` over its 16-bit time, Q, K and V kept for the
    backward in 1 byte. Plans in bf16 are the same either way. Megatron-LM's command line has
    no flag for it (its arguments leave the field out)."""
    launch_blocking: bool = False
    """The run sets ``CUDA_LAUNCH_BLOCKING=1`` (a debugging switch some clusters' scripts leave
    on): each kernel launch waits for the kernel, so the host's time per kernel adds to the
    step (:data:`simcore.megatron.kernels.BLOCKING_HOST_S`) instead of hiding under the GPU's
    work. False: the host runs ahead of the GPU."""
    cuda_graphs: bool = False
    """The layers run as captured CUDA graphs (Megatron-LM's ``--cuda-graph-impl`` /
    ``--enable-cuda-graph``, NeMo's and MLPerf's ``CUDA_GRAPH``): the host launches a layer's
    kernels as one graph, so its time per kernel (:attr:`DeviceSpec.host_kernel_s`) no longer
    bounds a layer. False: eager execution, each kernel issued by the host."""
    overlap_grad_reduce: bool = True
    """Data-parallel gradient reduction runs in buckets during the last backward (Megatron-LM's
    ``--overlap-grad-reduce``); False waits for it after the pipeline flush."""
    tp_comm_overlap: bool = True
    """With Transformer Engine and sequence parallelism, the tp all-gathers and reduce-scatters
    run beside the linear layers' GEMMs in TE's userbuffers (``--tp-comm-overlap``, which NeMo's
    and Megatron-Bridge's recipes set; :func:`simcore.megatron.stack.uses_tp_comm_overlap`).
    False: Megatron-LM's own default, the forward's collectives exposed and the backward's
    hidden only behind the weight-gradient GEMMs, as on the classic stack."""
    flash_attention: bool | None = None
    """Fused (flash) attention: the attention core is one kernel that never stores the s x s
    scores (Dao et al. 2022). None takes the default: on for the llama family and on devices
    whose entry says so (H100-era parts), off otherwise (see :func:`uses_flash_attention`)."""
    transformer_engine: bool | None = None
    """Megatron-Core with Transformer Engine, as NeMo and Megatron-Bridge train (2024 on): the
    attention core in TE's fused (cuDNN) kernel at the device's fused_attention_efficiency, and
    with sequence parallelism the tp all-gathers and reduce-scatters overlapped with the linear
    layers' GEMMs (``--tp-comm-overlap``, TE's userbuffers). None takes the device's default
    (H100-era parts: on) for plans with ZeRO 0-1 and the classic stack for ZeRO-2/3 plans
    (:func:`simcore.megatron.stack.uses_transformer_engine`); False: the classic stack the
    devices were fit on (llm-foundry's PyTorch FSDP with FlashAttention-2, Megatron-LM
    2020-23, Megatron-DeepSpeed)."""
    cp_comm: CpComm | None = None
    """How context parallelism exchanges K and V (:class:`CpComm`); None is ``p2p``,
    Megatron-LM's default (a ``framework: deepspeed`` study sets ``a2a``,
    :func:`search_spaces.frameworks.cp_comm`). Plans with cp 1 are the same either way."""
    cross_entropy: CrossEntropy | None = None
    """How the loss holds the logits (:class:`CrossEntropy`): None is Megatron-LM's fused
    cross-entropy; torchtitan studies set ``pytorch`` (``search_spaces.frameworks``)."""
    selective_recompute: SelectiveRecompute | None = None
    """What a plan's selective recompute drops (:class:`SelectiveRecompute`): None is
    Megatron-LM's attention core; torchtitan studies set ``op``, its per-op checkpointing
    (``search_spaces.frameworks``)."""
    recompute_modules: tuple[RecomputeModule, ...] | None = None
    """What a plan's selective recompute runs again, as Megatron-LM's ``--recompute-modules``
    names it (:class:`RecomputeModule`); None: ``selective_recompute``'s choice (Megatron-LM's
    default is ``core_attn``). Plans with recompute none or full ignore it."""
    recompute_early_stop: bool | None = None
    """Under full recompute, each layer's recompute stops at the last tensor its backward
    saved, as PyTorch's non-reentrant activation checkpointing does by default ("Non-reentrant
    checkpoint stops recomputation as soon as all needed intermediate activations have been
    recomputed", ``torch.utils.checkpoint``, ``set_checkpoint_early_stop``): the layer's last
    linear layer (FC2), its tp collective and the residual add are not run again. torchtitan
    (``checkpoint_wrapper``, not re-entrant) and llm-foundry (which forces
    ``activation_checkpointing_reentrant`` false) run it; Megatron-LM's and DeepSpeed's own
    checkpointing re-run the whole layer ("Reentrant checkpoint always recomputes function in
    its entirety"). None takes the stack's default: on for plans on the PyTorch FSDP stack
    (ZeRO-2/3 without Transformer Engine, as
    :func:`simcore.megatron.stack.uses_transformer_engine` reads them), off otherwise
    (:func:`simcore.megatron.stack.uses_recompute_early_stop`). An MoE layer's recompute is
    priced whole either way."""

    @property
    def cp_exchange(self) -> CpComm:
        """:attr:`cp_comm` with its default resolved (``p2p``)."""
        return self.cp_comm or CpComm.P2P

    def __post_init__(self) -> None:
        _positive("global_batch", self.global_batch)
        _positive("seq_len", self.seq_len)
        modules = self.recompute_modules
        if modules is not None:
            if (not isinstance(modules, tuple) or not modules
                    or not all(isinstance(m, RecomputeModule) for m in modules)):
                raise ValueError(f"recompute_modules must name one or more of"
                                 f" {', '.join(m.value for m in RecomputeModule)}, got {modules!r}")
            if self.selective_recompute is SelectiveRecompute.OP:
                raise ValueError("recompute_modules are Megatron-LM's selective recompute, but"
                                 " selective_recompute is op (torchtitan's); give one of them")
        for name in (
            "bytes_per_param_weights",
            "bytes_per_param_grads",
            "bytes_per_param_optimizer",
            "bytes_per_activation",
        ):
            _positive(name, getattr(self, name))
        if not self.master_weights and self.bytes_per_param_optimizer != 12:
            raise ValueError("master_weights false sets the optimizer state (Adam's two moments in"
                             " the weights' type); give bytes_per_param_optimizer or"
                             " master_weights, not both")

    @property
    def optimizer_bytes(self) -> int:
        """Bytes of optimizer state a parameter: ``bytes_per_param_optimizer`` with master
        weights, else Adam's two moments in the weights' type."""
        if self.master_weights:
            return self.bytes_per_param_optimizer
        return 2 * self.bytes_per_param_weights


TRAINING_CHOICES: dict[str, type[_Named]] = {"selective_recompute": SelectiveRecompute,
                                             "cross_entropy": CrossEntropy,
                                             "cp_comm": CpComm}
"""The :class:`TrainingSpec` fields that name one of a few choices (None: the default)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Strategy:
    """How one training step is split over the devices."""

    dp: int = 1
    """Data-parallel degree. 1 means no data parallelism."""
    tp: int = 1
    """Tensor-parallel degree. 1 means disabled."""
    pp: int = 1
    """Pipeline-parallel degree (stages). 1 means disabled."""
    sp: int = 1
    """Sequence (context) parallel degree: the sequence is split over sp ranks. 1 means disabled."""
    sequence_parallel: bool = True
    """Megatron sequence parallelism inside the tp group (norms and dropout split by sequence)."""
    zero: ZeroStage = ZeroStage.NONE
    """What the data-parallel ranks shard; ZeroStage.PARAMETERS is FSDP."""
    recompute: Recompute = Recompute.NONE
    micro_batch: int = 1
    """Sequences per micro-batch per data-parallel replica."""
    schedule: Schedule = Schedule.ONE_F_ONE_B
    v: int = 1
    """Model chunks per device: the interleaved schedule's v, 2 for zbv; 1 otherwise."""
    placement: tuple[Axis, ...] = field(default=DEFAULT_PLACEMENT)
    """Axes onto the network dimensions, innermost first."""
    precision: Precision = Precision.BF16
    """The linear layers' GEMM format; FP8 needs a device with an FP8 peak."""
    first_stage_layers: int | None = None
    """Transformer layers on the first pipeline stage; None: an equal share. Megatron-LM's
    ``--decoder-first-pipeline-num-layers``: the stages without a set count split the rest
    evenly (``megatron/core/transformer/transformer_config.py``, d98e8a64, "Uneven PP")."""
    last_stage_layers: int | None = None
    """Transformer layers on the last pipeline stage; None: an equal share
    (``--decoder-last-pipeline-num-layers``)."""
    layout: tuple[int, ...] | None = None
    """Transformer layers of every virtual stage, in Megatron-LM's order (virtual stage i on
    rank i % pp as its chunk i // pp; pp * v of them, the embedding in the first, the LM head
    and loss in the last): ``--pipeline-model-parallel-layout``, :mod:`simcore.layout`. None:
    the split the other fields give."""
    ep: int = 1
    """Expert parallelism (MoE models): each MoE layer's routed experts split over ep ranks,
    carved out of the tp x sp x dp ranks of a pipeline stage as Megatron-LM's "parallel folding"
    does (``megatron/core/parallel_state.py``: the expert grid is etp x ep x edp x pp, innermost
    first). 1: every rank holds every expert."""
    etp: int | None = None
    """Expert tensor parallelism: each expert's FFN split over etp ranks
    (``--expert-tensor-parallel-size``); None: the same as tp, Megatron-LM's default."""
    ep_overlap: bool = False
    """The expert all-to-alls of one micro-batch run beside another micro-batch's compute (a
    forward beside a backward): Megatron-LM's ``--overlap-moe-expert-parallel-comm`` with
    ``--delay-wgrad-compute`` (``megatron/core/transformer/moe/README.md``, "Expert Parallel
    (EP) Communication Overlap"), what DeepSeek-V3's DualPipe does (arXiv:2412.19437 section
    3.2.1). Needs ep > 1."""
    ep_dedup: bool = False
    """The expert dispatch sends each token once to each remote node that holds any of its
    experts and forwards it there over the node's links, and the combine returns it alike:
    Megatron-LM's flex dispatcher with DeepEP or HybridEP (``--moe-token-dispatcher-type flex
    --moe-flex-dispatcher-backend deepep``; ``megatron/core/transformer/moe/README.md``: "removes
    redundant tokens during cross-node communication"), DeepSeek-V3's dispatch (arXiv:2412.19437
    section 3.2.2). False: NCCL's all-to-all, a copy per expert. Needs ep > 1."""
    shard_group: int | None = None
    """Ranks each ZeRO shard group spans (shard within, replicate across); None shards over the
    whole data-parallel group (dp * sp). A multiple of sp that divides dp * sp. With zero=3 it
    is HSDP: torchtitan shards over ``dp_shard * cp`` and replicates over ``dp_replicate``
    (``torchtitan/distributed/parallel_dims.py``, b5bcd76c). With zero=1 it is Megatron-LM's
    partial distributed optimizer (``--num-distributed-optimizer-instances`` dp * sp /
    shard_group): the optimizer state sharded within each group, the gradients
    reduce-scattered within it and all-reduced across the groups, the weights all-gathered
    within it (``megatron/core/distributed/param_and_grad_buffer.py``, d98e8a64); InternLM's
    ``zero1`` size shards the same way. Needs zero=1 or 3."""
    recompute_layers: int | None = None
    """Partial full recompute: of each model chunk's transformer layers (each pipeline stage's;
    each virtual stage's with v > 1), the first ``recompute_layers`` are recomputed and the
    rest keep all their activations, as Megatron-LM's ``--recompute-granularity full
    --recompute-method block --recompute-num-layers N`` runs (``megatron/core/recompute.py``,
    d98e8a64: layer i of a block is checkpointed when i < N, so a chunk of fewer layers
    recomputes them all). None: every layer. Needs recompute=full."""
    offload_layers: int | None = None
    """Activation offloading: the first ``offload_layers`` transformer layers copy the
    activations they keep for backward to host memory as the forward goes on and back before
    their backward, as Megatron-Core's ``--cpu-offloading --cpu-offloading-num-layers N`` runs
    (Transformer Engine's ``get_cpu_offload_context``: each layer's copy runs beside the next
    layer's compute, each reload beside the backward of the layer after it). Megatron-Core
    refuses it with pipeline parallelism or any activation recompute, and for all the layers
    (``megatron/core/transformer/transformer_config.py``, d98e8a64), so it needs pp=1,
    recompute=none and fewer than the model's layers. None: no offloading."""

    def __post_init__(self) -> None:
        # The common case in one expression (a million-plan space builds a million of these);
        # anything else goes through the checks that name what is wrong.
        if not (type(self.dp) is int and type(self.tp) is int and type(self.pp) is int
                and type(self.sp) is int and type(self.micro_batch) is int
                and type(self.v) is int and type(self.ep) is int and self.dp >= 1
                and self.tp >= 1 and self.pp >= 1 and self.sp >= 1 and self.micro_batch >= 1
                and self.v >= 1 and self.ep >= 1):
            self._check_degrees()
        if self.schedule is Schedule.ZBV:
            if self.v != 2:
                raise ValueError(f"schedule=zbv runs exactly 2 model chunks per rank; set v=2"
                                 f" (got v={self.v})")
        elif self.v != 1 and self.schedule is not Schedule.INTERLEAVED:
            raise ValueError(f"v > 1 needs schedule=interleaved, but got schedule={self.schedule}")
        if self.first_stage_layers is not None or self.last_stage_layers is not None:
            for name in ("first_stage_layers", "last_stage_layers"):
                value = getattr(self, name)
                if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                          or value < 1):
                    raise ValueError(f"`{name} >= 1` must hold, but got {name}={value!r}")
        if self.layout is not None:
            self._check_layout()
        if self.shard_group is not None:
            self._check_shard_group()
        if self.recompute_layers is not None:
            self._check_recompute_layers()
        if self.offload_layers is not None:
            self._check_offload_layers()
        if self.etp is not None or self.ep > 1:
            self._check_experts()
        if not _is_placement(self.placement):
            raise ValueError(
                "placement must name each of dp, tp, pp, sp once, but got"
                f" {', '.join(self.placement)}"
            )

    def _check_experts(self) -> None:
        etp = self.etp
        if etp is not None and (isinstance(etp, bool) or not isinstance(etp, int) or etp < 1):
            raise ValueError(f"`etp >= 1` must hold, but got etp={etp!r}")
        ranks = self.tp * self.sp * self.dp
        if ranks % (self.expert_tp * self.ep):
            raise ValueError(
                f"ep * etp = {self.ep} * {self.expert_tp} must divide tp * sp * dp = {ranks}"
                " (expert parallelism is carved out of a stage's tp, sp and dp ranks)")

    def _check_degrees(self) -> None:
        for name in ("dp", "tp", "pp", "sp", "micro_batch", "v", "ep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name} >= 1` must hold, but got {name}={value!r}")

    def _check_layout(self) -> None:
        layout = self.layout
        assert layout is not None
        if not isinstance(layout, tuple) or not all(
                type(n) is int and n >= 0 for n in layout):
            raise ValueError(f"layout must be a tuple of layer counts >= 0, but got {layout!r}")
        if len(layout) != self.pp * self.v:
            raise ValueError(
                f"layout has {len(layout)} virtual stages, but pp * v = {self.pp} * {self.v}"
                f" = {self.pp * self.v}; give pp * v stages (Megatron derives v from the layout)")
        if self.first_stage_layers is not None or self.last_stage_layers is not None:
            raise ValueError("layout cannot be combined with first_stage_layers /"
                             " last_stage_layers (Megatron refuses both); give one of them")

    def _check_offload_layers(self) -> None:
        n = self.offload_layers
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"`offload_layers >= 1` must hold, but got offload_layers={n!r}"
                             " (for no offloading leave it unset)")
        if self.pp != 1:
            raise ValueError(f"offload_layers={n} needs pp=1 (Megatron-Core offloads"
                             f" activations only without pipeline parallelism), but got"
                             f" pp={self.pp}")
        if self.recompute is not Recompute.NONE:
            raise ValueError(f"offload_layers={n} needs recompute=none (Megatron-Core does not"
                             f" offload with activation recompute), but got"
                             f" recompute={self.recompute}")

    def _check_recompute_layers(self) -> None:
        n = self.recompute_layers
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"`recompute_layers >= 1` must hold, but got recompute_layers={n!r}"
                             " (for no recompute set recompute=none)")
        if self.recompute is not Recompute.FULL:
            raise ValueError(f"recompute_layers={n} needs recompute=full (it says how many of"
                             f" each stage's layers are fully recomputed), but got"
                             f" recompute={self.recompute}")

    def _check_shard_group(self) -> None:
        g, group = self.shard_group, self.dp * self.sp
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise ValueError(f"`shard_group >= 1` must hold, but got shard_group={g!r}")
        if self.zero not in (ZeroStage.OPTIMIZER, ZeroStage.PARAMETERS):
            raise ValueError(f"shard_group={g} needs zero=1 (a distributed optimizer sharded"
                             f" within groups) or zero=3 (HSDP), but got zero={int(self.zero)}")
        if group % g or g % self.sp:
            raise ValueError(
                f"shard_group={g} must be a multiple of sp={self.sp} dividing dp*sp={group}"
                " (each shard group holds whole sp groups and the replicas tile dp)")

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp * self.sp

    @property
    def expert_tp(self) -> int:
        """Expert tensor parallelism: etp, or tp where it is not set."""
        return self.tp if self.etp is None else self.etp

    @property
    def edp(self) -> int:
        """Expert data parallelism: the ranks holding the same experts, tp * sp * dp / (etp * ep)
        (their expert gradients are reduced, and their expert optimizer state sharded, over it)."""
        return self.tp * self.sp * self.dp // (self.expert_tp * self.ep)

    @property
    def shard_ranks(self) -> int:
        """Ranks that shard ZeRO's states: the shard group (HSDP, or a partial distributed
        optimizer), else dp * sp."""
        return self.dp * self.sp if self.shard_group is None else self.shard_group

    @property
    def replicas(self) -> int:
        """Replica groups of the ZeRO shards: dp * sp / shard ranks (1 without a shard
        group)."""
        return self.dp * self.sp // self.shard_ranks

    @property
    def uneven(self) -> bool:
        """The first or last stage holds a set number of layers, or a layout sets them all."""
        return (self.first_stage_layers is not None or self.last_stage_layers is not None
                or self.layout is not None)

    def stage_layers(self, layers: int) -> tuple[int, ...]:
        """Transformer layers on each pipeline stage, first to last: Megatron-LM's rule (the
        first and last stages hold their set counts, the stages between split the rest
        evenly; ``transformer_config.py`` d98e8a64). A ValueError when the rest does not
        divide; :func:`simcore.check` says why in one line."""
        first, last, pp = self.first_stage_layers, self.last_stage_layers, self.pp
        if self.layout is not None:
            return tuple(sum(self.layout[c * pp + r] for c in range(self.v)) for r in range(pp))
        if not self.uneven:
            return (layers // pp,) * pp
        if pp == 1:
            raise ValueError("first_stage_layers / last_stage_layers need pp >= 2")
        rest = layers - (first or 0) - (last or 0)
        middle_stages = pp - (first is not None) - (last is not None)
        if rest < 0 or bool(rest) != bool(middle_stages) or (middle_stages
                                                              and rest % middle_stages):
            raise ValueError(
                f"first_stage_layers={first} and last_stage_layers={last} leave {rest} layers"
                f" for {middle_stages} middle stages of pp={pp}; they must split evenly"
            )
        middle = rest // middle_stages if middle_stages else 0
        return ((middle if first is None else first,) + (middle,) * (pp - 2)
                + (middle if last is None else last,))

    def short_ends(self, layers: int) -> tuple[bool, bool] | None:
        """Whether the first / last stage is one layer short as Megatron-LM's
        ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``
        make it with v > 1: the embedding (the loss) counts as a layer, every stage holds
        ``N = (layers + ends) / pp`` slots, v divides N, and only the first virtual stage of the
        first stage (the last of the last) holds one layer fewer
        (``megatron/core/transformer/transformer_block.py`` ``get_num_layers_to_build``,
        d98e8a64). None where the stages are not split so with v > 1 (:meth:`stage_layers`'s
        counts are then each a multiple of v, or the plan is refused)."""
        if self.v == 1 or not self.uneven or self.layout is not None:
            return None
        counts = self.stage_layers(layers)
        if all(n % self.v == 0 for n in counts):
            return None  # --decoder-first/last-pipeline-num-layers
        n = counts[0] + (counts[0] % self.v != 0)  # the slots of every stage
        if (n % self.v or any(c != n for c in counts[1:-1])
                or counts[0] not in (n, n - 1) or counts[-1] not in (n, n - 1)):
            return None
        return counts[0] == n - 1, counts[-1] == n - 1

    def chunk_layers(self, layers: int, stage: int) -> tuple[int, ...]:
        """Transformer layers of each of stage ``stage``'s v model chunks: its count split
        evenly, but for the short first or last virtual stage of :meth:`short_ends`, or as the
        layout gives them."""
        if self.layout is not None:
            return tuple(self.layout[c * self.pp + stage] for c in range(self.v))
        count = self.stage_layers(layers)[stage]
        ends = self.short_ends(layers)
        if ends is None:
            return (count // self.v,) * self.v
        per_chunk = (count + (count % self.v != 0)) // self.v
        chunks = [per_chunk] * self.v
        if stage == 0 and ends[0]:
            chunks[0] -= 1
        if stage == self.pp - 1 and ends[1]:
            chunks[-1] -= 1
        return tuple(chunks)

