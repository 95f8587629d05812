"""The named choices of the specs (axes, families, recompute, schedules, ZeRO stages,
precisions, conventions) and the checks the specs' fields share."""

from __future__ import annotations

import itertools
import math
from enum import IntEnum, StrEnum


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
    """A loss that holds only the fp32 logits, 4 bytes (Korthikanti et al. 2022, section 4.3,
    count so), as an in-place fused kernel does (flash-attn's ``cross_entropy``, llm-foundry's
    loss). The default, but in a ``framework: torchtitan`` study."""
    MEGATRON = "megatron"
    """Megatron-LM's vocab-parallel cross-entropy (NVIDIA/Megatron-LM@d98e8a64dd
    ``megatron/core/tensor_parallel/cross_entropy.py``): ``calculate_logits_max`` takes an fp32
    copy of the 16-bit logits the output layer returned, which its caller still holds
    (``language_module.py`` ``compute_language_model_loss``), and the shift and exponent run in
    place on that copy, which it saves for the backward; the backward turns it into the
    gradient in place and casts that back to 16 bits. So 2 + 4 bytes a logit of the rank's
    vocabulary shard at its forward, 4 + 2 at its backward: 6. Named where a run uses
    Megatron-LM's default (unfused) loss."""
    MEGATRON_FUSED = "megatron_fused"
    """Megatron-LM's fused loss, ``--cross-entropy-loss-fusion`` (NVIDIA/Megatron-LM@d98e8a64dd
    ``megatron/core/fusions/fused_cross_entropy.py``; its ``native`` implementation, the only
    one that commit runs: ``arguments.py`` refuses Transformer Engine's, ``te``): the same steps
    as :attr:`MEGATRON` in ``jit_fuser`` functions, 10 bytes a logit of the rank's shard.
    Measured: Megatron-LM's H100 functional test of its 12-layer GPT at tp 2 (micro-batch 4 x
    1,024 tokens, vocabulary 50,304: 103 M logits a rank) peaks 0.41 GB above the same test with
    the unfused loss, 4 bytes a logit more than its 6; checked on GB200's two such tests (-0.9%
    and +1.8%); A100's holds 8 more (tests/data/validation/README.md, "Allocated peaks"). A
    ``framework: megatron`` study keeps :attr:`FUSED` (Transformer Engine's in-place kernel,
    which Megatron-Bridge's performance scripts set: ``cross_entropy_fusion_impl = "te"``,
    NVIDIA-NeMo/Megatron-Bridge v0.2-v0.6 ``scripts/performance``; Megatron-Core only warns of
    it); its Megatron-LM export says what this one holds
    more."""
    PYTORCH = "pytorch"
    """``torch.nn.functional.cross_entropy`` on an fp32 copy of the bf16 logits, as torchtitan
    computes its loss (pytorch/torchtitan@31a17bfdb7 ``torchtitan/components/loss.py``
    ``cross_entropy_loss``): the log-softmax output it saves (4 bytes), and in its backward the
    gradients of that output and of its input (4 + 4): 12 bytes."""
    CHUNKED = "chunked"
    """``pytorch``'s loss taken on slices of the tokens in turn
    (:data:`simcore.megatron.stage_memory.LOSS_CHUNKS`), as
    torchtitan's ``ChunkedLossWrapper`` runs it (pytorch/torchtitan@b5bcd76c
    ``torchtitan/components/loss.py``; every language model's ``config_registry.py`` at that
    commit uses it, ``num_chunks`` 8; v0.2.2's loss is ``pytorch``'s): each slice's LM head,
    loss and backward run before the next slice's, so 12 bytes a logit of one slice at the
    peak, beside the slices of the final norm's output, detached copies (2 bytes an element),
    and their gradient accumulated whole in fp32 (``GradAccumulator``, 4 bytes), both of the
    whole (b, s, h) on every tp rank ("replicated on the TP axis before chunking")."""
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
    MEGATRON_DEEPSPEED = "megatron_deepspeed"
    """Megatron-DeepSpeed's vocab-parallel cross-entropy (deepspeedai/Megatron-DeepSpeed@4efb479d
    ``megatron/model/gpt_model.py``: ``cross_entropy(output.float(), labels)``;
    ``megatron/core/tensor_parallel/cross_entropy.py``: ``vocab_parallel_logits - logits_max``,
    out of place, then the exponent in place on that copy, which it saves for the backward):
    at its forward the 16-bit logits its caller holds, their fp32 copy and the shifted copy,
    2 + 4 + 4 bytes a logit of the rank's vocabulary shard. A ``framework: deepspeed`` study's
    loss."""
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
    """Optimizer states (and fp32 master weights) sharded: ZeRO-1, Megatron's distributed
    optimizer."""
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
