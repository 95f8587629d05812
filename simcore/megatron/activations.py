"""Activation memory of one transformer layer for one micro-batch, after Korthikanti et al. 2022
(arXiv:2205.05198) section 4.

The paper's per-layer breakdown (16-bit activations, 1-byte dropout masks), for a GPT layer:
attention ``11 s b h + 5 a s^2 b`` (QKV input 2sbh, Q and K 4sbh, softmax output 2as^2b, its
dropout mask as^2b, dropout output 2as^2b, V 2sbh, projection input 2sbh, dropout mask sbh),
MLP ``19 s b h`` (input 2sbh, fc1 output 8sbh, GELU output 8sbh, dropout mask sbh), two
LayerNorm inputs ``4 s b h``: in all ``s b h (34 + 5 a s / h)`` (Table 2).
Generalised here to any FFN width, grouped-query K/V, SwiGLU (gate and up outputs, then their
product) and to models without dropout (Llama): the terms are the same tensors, resized.

Which tensors tensor parallelism splits (Table 2): without sequence parallelism the LayerNorm
inputs, the QKV and MLP inputs and the two dropout masks after the blocks (10 sbh for GPT) are
replicated, everything else is divided by t; with sequence parallelism everything is divided by t.
Context parallelism (sp) divides the sequence of every tensor; the attention scores keep all
keys: ``a (s/sp) s b``.

Flash attention (Dao et al. 2022, arXiv:2205.14135, section 3.1) never materialises the scores:
the core keeps only the softmax's log-sum-exp per query and head (fp32, ``4 a s b`` bytes) and
regenerates its dropout mask from the random state, so the ``5 a s / h`` term becomes ``2 a / h``
and selective recompute has nothing left to drop.

FP8 (:mod:`simcore.megatron.precision`): each linear layer saves its input for the weight
gradient as Transformer Engine quantised it, 1 byte per element (``linear_input_bytes``): the QKV
and MLP inputs (the norms' outputs), the projection input and the FC2 input (the activation
function's output). The norms' inputs, Q, K, V, the attention core and FC1's outputs stay 16-bit.
"""

from __future__ import annotations

from dataclasses import dataclass

from simcore.megatron.layers import LayerShape
from simcore.specs import Activation, ModelSpec, Recompute, RecomputeModule

__all__ = ["LayerActivations", "layer_activations"]


@dataclass(frozen=True, slots=True)
class LayerActivations:
    """Bytes one layer keeps for the backward pass of one micro-batch, on one device."""

    stored: float
    """Kept from forward to backward under the strategy's recompute."""
    full: float
    """Without any recompute (the working set while a recomputed layer runs backward)."""
    attention_core: float
    """The softmax output, its dropout mask and output: what selective recompute drops."""


def layer_activations(
    model: ModelSpec,
    shape: LayerShape,
    *,
    micro_batch: int,
    seq_len: int,
    tp: int,
    sp: int,
    sequence_parallel: bool,
    recompute: Recompute,
    flash: bool = False,
    linear_input_bytes: float = 2,
    ffn: int | None = None,
    per_op: bool = False,
    modules: frozenset[RecomputeModule] | None = None,
    swiglu_fused: bool = True,
    fp8_attention: bool = False,
    norm_fused: bool = True,
) -> LayerActivations:
    """``ffn``: the FFN's width when it is not the model's (an MoE layer's shared experts; 0:
    none; the routed experts' activations are counted apart, :mod:`simcore.megatron.moe`).
    ``per_op``: selective recompute is torchtitan's per-op checkpointing (:func:`_per_op`).
    ``modules``: selective recompute runs Megatron-LM's ``--recompute-modules`` again
    (:func:`_module_drops`; ``mlp`` only on a dense layer, ``ffn`` None). ``swiglu_fused``:
    :attr:`simcore.specs.TrainingSpec.swiglu_fusion`. ``fp8_attention``: the fused attention
    runs in FP8 and keeps Q, K and V for its backward in 1 byte, not 2
    (:attr:`simcore.specs.TrainingSpec.fp8_attention`). ``norm_fused`` false: each norm keeps
    its normalised tensor for the weight's gradient too (2sbh a norm;
    :attr:`simcore.specs.TrainingSpec.fused_norm`)."""
    h, a = model.hidden, model.heads
    f = model.ffn_hidden if ffn is None else ffn
    sbh = seq_len / sp * micro_batch * h  # elements of one (s/sp, b, h) tensor
    sbf = sbh / h * f
    kv = shape.kv_fraction
    q = shape.q_fraction  # the heads' width over h: 1 unless the model sets its head width
    mask = 1.0 if shape.dropout else 0.0  # 1-byte dropout masks
    scores = a * (seq_len / sp) * seq_len * micro_batch  # elements of the attention scores
    # Replicated over tp unless sequence parallel: LayerNorm inputs (2 x 2sbh), the QKV and MLP
    # inputs (2 x 2sbh), the dropout masks after attention and after the MLP.
    # FP8 saves the linear layers' inputs in fewer bytes (0 saved in 16-bit).
    saved = 2 - linear_input_bytes
    replicated = (4 + 4) * sbh + 2 * mask * sbh - saved * 2 * sbh
    if not norm_fused:  # the two norms' normalised tensors, before the weight's product
        replicated += 4 * sbh
    # Split over tp: Q (2sbh), K and V (2sbh * kv each), the projection input (2sbh) and the MLP
    # (FC1's outputs and the activation's output, FC2's input: 2sbf each).
    # An unfused SwiGLU (swiglu_fused false) keeps the SiLU's output for the multiply too.
    swiglu = 6 if swiglu_fused else 8
    mlp_hidden = (swiglu if model.activation is Activation.SWIGLU else 4) * sbf
    split = 2 * q * sbh + 4 * kv * sbh + 2 * q * sbh + mlp_hidden - saved * (q * sbh + sbf)
    if fp8_attention:
        split -= (q + 2 * kv) * sbh
    if flash:
        core = 4 * a * (seq_len / sp) * micro_batch  # fp32 log-sum-exp per query and head
    else:
        core = 2 * scores + mask * scores + (2 * scores if shape.dropout else 0.0)
    if sequence_parallel and tp > 1:
        full = (replicated + split + core) / tp
    else:
        full = replicated + (split + core) / tp
    core_per_device = core / tp
    if recompute is Recompute.FULL:
        layer_input = 2 * sbh / (tp if sequence_parallel else 1)
        stored = layer_input
    elif recompute is Recompute.SELECTIVE and per_op:
        stored = _per_op(model, sbh, sbf, q, kv, core, tp, sequence_parallel)
    elif recompute is Recompute.SELECTIVE and modules is not None:
        dense_mlp = (mlp_hidden - saved * sbf) if ffn is None else 0.0
        stored = full - _module_drops(model, modules, sbh, q, kv, core, dense_mlp, tp)
    elif recompute is Recompute.SELECTIVE:
        stored = full - core_per_device
    else:
        stored = full
    return LayerActivations(stored=stored, full=full, attention_core=core_per_device)


def _module_drops(model: ModelSpec, modules: frozenset[RecomputeModule], sbh: float, q: float,
                  kv: float, core: float, dense_mlp: float, tp: int) -> float:
    """Bytes a layer does not keep (per device) when selective recompute runs ``modules`` again
    (Megatron-LM's ``recompute_modules``): ``core_attn`` the attention core; ``mla_up_proj`` the
    heads' Q, K and V (split by tp; RoPE applied to them) for the compressed latents, which the
    down projections leave on every tp rank (``mla_latent`` a token, 16-bit); ``mlp`` a dense
    MLP's FC1 outputs and activation output (``dense_mlp``), keeping its input."""
    dropped = 0.0
    if RecomputeModule.CORE_ATTN in modules:
        dropped += core / tp
    if RecomputeModule.MLA_UP_PROJ in modules and model.mla_latent is not None:
        dropped += (2 * q + 4 * kv) * sbh / tp - 2 * model.mla_latent * sbh / model.hidden
    if RecomputeModule.MLP in modules:
        dropped += dense_mlp / tp
    return dropped


def _per_op(model: ModelSpec, sbh: float, sbf: float, q: float, kv: float, core: float,
            tp: int, sequence_parallel: bool) -> float:
    """Bytes torchtitan's per-op selective checkpointing keeps of a layer
    (:attr:`simcore.specs.SelectiveRecompute.OP`): its input, the attention kernel's output and
    log-sum-exp (``core``), the outputs of every other matmul, in 16 bits: Llama's wq, wv, w1
    and w2 (w2's before its reduction: the whole (s, b, h) on every tp rank), a GPT layer's
    fused QKV and FC1; and with sequence parallelism its reduce-scatters' outputs. An MoE
    layer's without shared experts (``sbf`` 0) has no w1 or w2 here: its experts are apart."""
    split_by_sp = sequence_parallel and tp > 1
    layer_input = 2 * sbh / (tp if split_by_sp else 1)
    if model.activation is Activation.SWIGLU:
        split = 2 * q * sbh + 2 * kv * sbh + 2 * sbf
        replicated = 2 * sbh if sbf else 0.0
    else:
        split = 2 * (q + 2 * kv) * sbh + 2 * sbf
        replicated = 0.0
    # with sequence parallelism the reduce-scatters after wo and w2 are kept too
    scattered = (2 + (2 if sbf else 0)) * sbh / tp if split_by_sp else 0.0
    return layer_input + replicated + scattered + (split + 2 * q * sbh + core) / tp
