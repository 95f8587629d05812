"""The kernels of one transformer layer, and what each costs on a device.

A training step is a sequence of kernels, each with a floor (Calculon's processor model, and
what a profile of Megatron-LM shows): the host must launch it, a GEMM runs in waves of output
tiles over the streaming multiprocessors, and a small or skinny GEMM is bound by the bytes it
moves rather than its FLOPs. Summing the layer's kernels one by one lets those floors add up as
they do on hardware: a micro-batch of one sequence at tp 8 runs as many kernels as one of eight
sequences at tp 1, each a fraction as long.

The cost of each kernel (its launch floor, a GEMM's waves of tiles, the bytes a small one
moves): :mod:`simcore.megatron.kernel_costs`.

The inventory (per layer, per micro-batch, on one tp rank) follows Megatron-LM's GPT layer with
its fused kernels (``megatron/legacy/model/transformer.py``, ``fused_bias_gelu``,
``fused_bias_dropout_add``, ``FusedScaleMaskSoftmax``) and Megatron-Core's Llama layer
(RMSNorm, fused QKV, RoPE, flash attention, SwiGLU): per GEMM one forward and two backward
kernels (input and weight gradients), per element-wise kernel one forward and
:data:`BACKWARD_KERNELS` backward ones (the gradient and, where the op has weights or a bias,
its reduction).

In fp8 (:mod:`simcore.megatron.precision`) the four linear layers' GEMMs run at the device's FP8
peak times the same ``matmul_efficiency`` and wave fraction (the efficiency depends on the shape
only), reading 1-byte inputs and writing 16-bit outputs, plus their casts and scale updates.
"""

from __future__ import annotations

from dataclasses import dataclass

from simcore.megatron.cp_kernels import context_parallel_core
from simcore.megatron.kernel_costs import BLOCKING_HOST_S, TILE, KernelCosts
from simcore.megatron.layers import LayerShape
from simcore.megatron.precision import fp8_attention_speedup, fp8_overheads
from simcore.specs import Activation, CpComm, Family, ModelSpec, RecomputeModule

__all__ = [
    "BACKWARD_KERNELS",
    "BLOCKING_HOST_S",
    "CAUSAL_FRACTION",
    "FLASH_BACKWARD_FLOPS",
    "TILE",
    "UNFUSED_CORE_KERNELS",
    "UNFUSED_NORM",
    "UNFUSED_ROPE",
    "KernelCosts",
    "LayerKernels",
    "layer_kernels",
    "modules_forward",
    "modules_kernels",
]

BACKWARD_KERNELS = 2
"""Backward kernels per forward element-wise kernel (its gradient, and a reduction for norm
weights, biases or the residual branch)."""

FLASH_BACKWARD_FLOPS = 2.5
"""FlashAttention's backward does 2.5x the forward's matmul FLOPs: five matmuls against two, as
it recomputes the scores (Dao 2023, arXiv:2307.08691, section 4)."""

UNFUSED_NORM = (1.0, 0.0, 0.0, 2.0, 3.0, 3.0, 2.0)
"""The kernels an unfused RMSNorm runs after its square (read and write the input: the fused
norm's place), in units of the input's bytes (Aleph Alpha's Scaling, ``x * torch.rsqrt(x.pow(2)
.mean(-1, keepdim=True) + eps)``, ``.float().type_as(x)``, times the weight): the mean (read),
the epsilon's add and the reciprocal root (one value a token: launches, next to no bytes), the
product (read, write), the cast to fp32 (read, write twice the bytes), the cast back (read
twice, write) and the weight's product (read, write): 13 units with the square, 8 kernels
(:attr:`simcore.specs.TrainingSpec.fused_norm`)."""

UNFUSED_ROPE = (1.0, 2.0, 2.0, 2.0, 3.0)
"""Rotary embedding as PyTorch's element-wise ops (:attr:`simcore.specs.TrainingSpec
.rope_fusion` false), kernel by kernel in units of Q's and K's bytes, as ``x * cos +
rotate_half(x) * sin`` runs it (NVIDIA/Megatron-LM ``megatron/core/models/common/embeddings/
rope_utils.py`` ``_rotate_half``, Aleph-Alpha/scaling ``src/scaling/core/nn/rotary.py``): the
negation of the second half (read and write half), the concatenation (read, write), the two
products (read, write each; cos and sin are a position's, next to no bytes) and the sum (two
reads, a write). The complex form (``x.float()``, the complex product, ``.type_as(x)``:
pytorch/torchtitan ``torchtitan/models/llama/model.py`` ``apply_rotary_emb``) moves the same
10 units in three kernels. The fused kernel: one read and one write, 2 units."""

CAUSAL_FRACTION = 0.5
"""A causal flash-attention kernel skips the blocks above the diagonal: about half the s^2 work
(the unfused path computes the whole square and masks it)."""

UNFUSED_CORE_KERNELS = (4, 6)
"""Kernels of the unfused attention core without dropout: forward Q K^T, the softmax, P V and
the context's layout; backward two of each matmul, the softmax's gradient and the layout.
Dropout adds one each way. Transformer Engine's fused attention costs the host as many
(:func:`layer_kernels`' ``te_attention``): its ``DotProductAttention`` selects and checks its
backend and packs the cuDNN call's arguments in Python on every call (NVIDIA/
TransformerEngine issues 2033 and 2498, "Reduce CPU overhead in attention"), and Megatron-LM's
functional tests of its small GPT, whose steps the host paces, run as long with it as with
Megatron-LM's own unfused core on the same plan (tests/data/validation/README.md, section "The
host's pace")."""


@dataclass(frozen=True, slots=True)
class LayerKernels:
    """Seconds of one layer's kernels for one micro-batch on one device, and their count."""

    forward: float
    backward: float
    core_forward: float
    """The attention core's forward kernels (what selective recompute runs again)."""
    wgrad: float
    """The weight-gradient GEMMs of the backward (what hides tp communication)."""
    kernels_forward: int
    kernels_backward: int
    gemm_forward: float = 0.0
    """The linear layers' forward GEMMs (what TE's tp overlap hides the forward's tp behind)."""
    gemm_dgrad: float = 0.0
    """Their input-gradient GEMMs."""
    forward_tail: float = 0.0
    """The forward's kernels after the last tensor its backward saves: FC2's GEMM and the
    residual add after it (what a recompute that stops early does not run again)."""
    op_recompute: float = 0.0
    """What torchtitan's per-op selective checkpointing runs again in the backward
    (:attr:`simcore.specs.SelectiveRecompute.OP`): the forward's element-wise kernels and
    casts, and every second matmul: Llama's K, output and up projections (its matmuls run
    wq, wk, wv, wo, w1, w3, w2: ``torchtitan/models/llama3/model/model.py``), a GPT layer's
    output projection and FC2."""
    mlp_forward: float = 0.0
    """The MLP's forward (FC1, the activation, FC2): what ``recompute_modules`` ``mlp`` runs
    again."""
    mla_up_forward: float = 0.0
    """Multi-head latent attention's up projections, forward: what ``mla_up_proj`` runs again
    (one GEMM of their FLOPs over the latents' width)."""
    issued_forward: int = 0
    """What the host issues forward, in inventory kernels: the kernels, with Transformer
    Engine's fused attention counted as :data:`UNFUSED_CORE_KERNELS` (the FP8 casts and scale
    updates are host work too: an FP8 te.Linear launches them and caches and updates the scales
    from Python, NVIDIA/TransformerEngine issue 836, and takes more than twice a BF16 one's host
    time to schedule, issues 761 and 445)."""
    issued_backward: int = 0
    issued_core_forward: int = 0
    """Of ``issued_forward``, the attention core's kernels: what selective recompute issues
    again."""
    issued_mlp_forward: int = 0
    """Of ``issued_forward``, the MLP's (FC1, the activation, FC2): what ``recompute_modules``
    ``mlp`` issues again."""
    issued_op_forward: int = 0
    """Of ``issued_forward``, what per-op selective checkpointing issues again (the kernels of
    ``op_recompute``)."""


def modules_forward(k: LayerKernels, modules: frozenset[RecomputeModule], *,
                    dense: bool = True) -> float:
    """Seconds of the forward kernels Megatron-LM's ``recompute_modules`` run again in a layer of
    these kernels: the attention core, MLA's up projections and, in a ``dense`` layer, the MLP
    (an MoE layer's experts are not its ``mlp`` module)."""
    return ((k.core_forward if RecomputeModule.CORE_ATTN in modules else 0.0)
            + (k.mla_up_forward if RecomputeModule.MLA_UP_PROJ in modules else 0.0)
            + (k.mlp_forward if dense and RecomputeModule.MLP in modules else 0.0))


def modules_kernels(k: LayerKernels, modules: frozenset[RecomputeModule], *,
                    dense: bool = True) -> int:
    """How many kernels the host issues again for :func:`modules_forward`'s modules."""
    return ((k.issued_core_forward if RecomputeModule.CORE_ATTN in modules else 0)
            + (1 if k.mla_up_forward and RecomputeModule.MLA_UP_PROJ in modules else 0)
            + (k.issued_mlp_forward if dense and RecomputeModule.MLP in modules else 0))


def _gemm_pair(costs: KernelCosts, m: float, n: float, k: float,
               batch: float = 1) -> tuple[float, float, float]:
    """(forward, input gradient, weight gradient) of a GEMM ``y = x @ w`` with x (m x k)."""
    return (costs.gemm(m, n, k, batch), costs.gemm(m, k, n, batch), costs.gemm(k, n, m, batch))


def _linear_pair(costs: KernelCosts, m: float, n: float, k: float) -> tuple[float, float, float]:
    """:func:`_gemm_pair` of a linear layer, in the plan's precision."""
    return (costs.linear(m, n, k), costs.linear(m, k, n), costs.linear(k, n, m))


def layer_kernels(model: ModelSpec, shape: LayerShape, costs: KernelCosts, *, micro_batch: int,
                  queries: float, seq_len: int, tp: int, sequence_parallel: bool, flash: bool,
                  act_bytes: int, micro_batches: int = 1, ffn: int | None = None,
                  swiglu_fused: bool = True, cp_comm: CpComm = CpComm.P2P,
                  norm_fused: bool = True, te_attention: bool = False,
                  rope_fused: bool = True) -> LayerKernels:
    """The layer's kernels for one micro-batch of ``micro_batch`` sequences, each with
    ``queries`` tokens on this rank (the sequence split by context parallelism) attending over
    ``seq_len`` keys, on one of ``tp`` ranks; a step runs ``micro_batches`` of them (fp8 casts
    the weights once a step). ``ffn``: the FFN's width when it is not the model's (an MoE
    layer's shared experts; 0: none, the routed experts are priced apart,
    :mod:`simcore.megatron.moe`). ``swiglu_fused`` false: a SwiGLU's SiLU and product run as two
    kernels (:attr:`simcore.specs.TrainingSpec.swiglu_fusion`); ``norm_fused`` false: each norm
    runs as PyTorch's element-wise ops (:data:`UNFUSED_NORM`); ``rope_fused`` false: so does
    the rotary embedding (:data:`UNFUSED_ROPE`). With ``queries`` short of
    ``seq_len`` (cp ranks) a fused core runs context parallelism's kernels, as ``cp_comm``
    exchanges K and V (:mod:`simcore.megatron.cp_kernels`). ``te_attention``: the fused core
    runs in Transformer Engine, whose host issues it as :data:`UNFUSED_CORE_KERNELS` (the
    ``issued_*`` counts; its GPU time is the fused kernel's)."""
    h, t = model.hidden, tp
    f = model.ffn_hidden if ffn is None else ffn
    tokens = micro_batch * queries
    heads = model.heads / t
    d = model.head_dim
    kv = shape.kv_fraction * h
    q = shape.q_fraction * h  # the heads' width: h unless the model sets its head width
    qkv = shape.attention_params / h - q  # Q, K and V's output width (low-rank ones for MLA)
    a = act_bytes
    rope = model.family is Family.LLAMA
    # Tensors outside the tp region (norms, residual adds, dropout) are split by sequence
    # parallelism; without it every tp rank holds the whole (tokens, h) tensor.
    outer = tokens * h * a / (t if sequence_parallel and t > 1 else 1)
    full = tokens * h * a
    mlp_width = (2 if model.activation is Activation.SWIGLU else 1) * f / t

    linears = [
        (tokens, qkv / t, h),                   # QKV
        (tokens, h, q / t),                     # output projection
    ]
    if f:
        linears += [(tokens, mlp_width, h),     # FC1 (gate and up for SwiGLU)
                    (tokens, h, f / t)]         # FC2
    gemms = [_linear_pair(costs, m, n, k) for m, n, k in linears]
    # Norm (read, write), residual add (2 reads, write), and the norm after it; GPT's dropout
    # adds its 1-byte mask.
    norm = 2 * outer
    residual = 3 * outer + (outer / a if shape.dropout else 0.0)
    swiglu = model.activation is Activation.SWIGLU
    # fused SwiGLU: read gate and up, write the product; unfused: the SiLU (read the gate, write
    # its output), then the product (read both, write it) as a second kernel
    activation_fn = tokens * f / t * a * (3 if swiglu and swiglu_fused else 2)
    elementwise = [norm, residual, norm, residual] + ([activation_fn] if f else [])
    unfused_product = 3 * tokens * f / t * a if swiglu and not swiglu_fused and f else 0.0
    if not norm_fused:  # each norm's other kernels (its square is the norm above)
        elementwise += [units * outer for _ in range(2) for units in UNFUSED_NORM]
    if rope:
        rotated = tokens * (q + kv) / t * a  # RoPE on Q and K
        elementwise += [2 * rotated] if rope_fused else [u * rotated for u in UNFUSED_ROPE]
    if unfused_product:
        elementwise.append(unfused_product)

    core_fwd: list[float] = []
    core_bwd: list[float] = []
    batch = micro_batch * heads  # attention problems: sequences x local heads
    if flash:
        # in FP8 (fp8_attention) at the device's measured speed-up for this query length
        flops = (4 * tokens * seq_len * q / t * CAUSAL_FRACTION
                 / fp8_attention_speedup(costs.attention_fp8, queries))
        cp = round(seq_len / queries)
        if cp > 1:
            core_fwd, core_bwd = context_parallel_core(
                costs, cp_comm, cp=cp, flops=flops,
                backward_flops=FLASH_BACKWARD_FLOPS * flops, queries=tokens,
                keys=micro_batch * seq_len, heads=heads, q_width=q / t, kv_width=kv / t,
                act_bytes=a)
        else:
            core_fwd.append(costs.attention(flops))
            core_bwd.append(costs.attention(FLASH_BACKWARD_FLOPS * flops))
    else:
        scores = batch * queries * seq_len * a
        qk = _gemm_pair(costs, queries, seq_len, d, batch)    # Q K^T
        pv = _gemm_pair(costs, queries, d, seq_len, batch)    # P V
        softmax = costs.elementwise(2 * scores)
        dropout = costs.elementwise(2 * scores + scores / a) if shape.dropout else 0.0
        layout = costs.elementwise(2 * full * q / h / t)      # context back to (s, b, h)
        core_fwd = [qk[0], softmax, dropout, pv[0], layout]
        core_bwd = [qk[1], qk[2], costs.elementwise(3 * scores), dropout, pv[1], pv[2], layout]
    ew_fwd = [costs.elementwise(x) for x in elementwise]
    ew_bwd = [BACKWARD_KERNELS * costs.elementwise(x) for x in elementwise]
    forward = sum(g[0] for g in gemms) + sum(ew_fwd) + sum(core_fwd)
    wgrad = sum(g[2] for g in gemms)
    backward = sum(g[1] for g in gemms) + wgrad + sum(ew_bwd) + sum(core_bwd)
    n_core_fwd = sum(1 for x in core_fwd if x)
    n_core_bwd = sum(1 for x in core_bwd if x)
    kernels_forward = len(gemms) + len(elementwise) + n_core_fwd
    kernels_backward = 2 * len(gemms) + BACKWARD_KERNELS * len(elementwise) + n_core_bwd
    op_recompute = sum(ew_fwd) + _every_second_matmul(model, gemms, kv, qkv)
    # the matmuls _every_second_matmul prices: half of MLA's two, wk and wo, or the projection;
    # then w3 or FC2
    issued_op = (len(elementwise) + (2 if swiglu and model.attention_params is None else 1)
                 + (1 if f else 0))
    if costs.fp8_rate is not None:
        fp8 = fp8_overheads(costs, linears, micro_batches)
        forward += fp8.forward
        backward += fp8.backward
        kernels_forward += fp8.kernels_forward
        kernels_backward += fp8.kernels_backward
        op_recompute += fp8.forward
        issued_op += fp8.kernels_forward
    issued_forward, issued_backward = kernels_forward, kernels_backward
    issued_core = n_core_fwd
    if rope and not rope_fused:  # the host issues the five small ops in one kernel's time
        issued_forward -= len(UNFUSED_ROPE) - 1
        issued_backward -= BACKWARD_KERNELS * (len(UNFUSED_ROPE) - 1)
        issued_op -= len(UNFUSED_ROPE) - 1
    if flash and te_attention:
        drop = 1 if shape.dropout else 0
        issued_forward += max(0, UNFUSED_CORE_KERNELS[0] + drop - n_core_fwd)
        issued_backward += max(0, UNFUSED_CORE_KERNELS[1] + drop - n_core_bwd)
        issued_core = max(n_core_fwd, UNFUSED_CORE_KERNELS[0] + drop)
    # FC2 saves its input (the activation's output) and the residual add saves nothing: the
    # layer's last saved tensor is FC2's input. Without an FFN here (an MoE layer, whose routed
    # experts are priced apart) the tail is not counted.
    tail = gemms[-1][0] + ew_fwd[3] if f else 0.0
    # with an unfused SwiGLU, its product is the last element-wise kernel
    mlp_forward = (gemms[2][0] + gemms[3][0] + ew_fwd[4]
                   + (ew_fwd[-1] if unfused_product else 0.0) if f else 0.0)
    mla_up = 0.0
    if model.mla_latent is not None and model.mla_up_params is not None:
        mla_up = costs.linear(tokens, model.mla_up_params / (model.mla_latent * t),
                              model.mla_latent)
    return LayerKernels(
        forward=forward, backward=backward, core_forward=sum(core_fwd), wgrad=wgrad,
        kernels_forward=kernels_forward, kernels_backward=kernels_backward,
        gemm_forward=sum(g[0] for g in gemms), gemm_dgrad=sum(g[1] for g in gemms),
        forward_tail=tail, op_recompute=op_recompute, mlp_forward=mlp_forward,
        mla_up_forward=mla_up, issued_forward=issued_forward, issued_backward=issued_backward,
        issued_core_forward=issued_core,
        issued_mlp_forward=(3 + (1 if unfused_product else 0)) if f else 0,
        issued_op_forward=issued_op,
    )


def _every_second_matmul(model: ModelSpec, gemms: list[tuple[float, float, float]],
                         kv: float, qkv: float) -> float:
    """Forward seconds of the matmuls per-op selective checkpointing recomputes, the second,
    fourth, ... in forward order: with SwiGLU torchtitan's separate wq, wk, wv, wo, w1, w3, w2
    (wk, wo and w3: shares of the fused QKV and gate/up GEMMs priced here), else a fused QKV,
    the output projection, FC1 and FC2 (the projection and FC2). Low-rank (MLA) attention
    projections: half of them. Without an FFN here (an MoE layer without shared experts) the
    attention's only: the routed experts' grouped GEMMs are kept, not recomputed."""
    swiglu = model.activation is Activation.SWIGLU
    if model.attention_params is not None:
        again = (gemms[0][0] + gemms[1][0]) / 2
    elif swiglu:
        again = gemms[0][0] * kv / qkv + gemms[1][0]
    else:
        again = gemms[1][0]
    if len(gemms) > 2:
        again += gemms[2][0] / 2 if swiglu else gemms[3][0]
    return again
