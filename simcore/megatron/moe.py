"""The routed experts of a mixture-of-experts layer: their parameters, kernels, activations and
all-to-all, as Megatron-LM runs them with expert parallelism (``--expert-model-parallel-size``)
and its all-to-all token dispatcher (``--moe-token-dispatcher-type alltoall``,
``megatron/core/transformer/moe/token_dispatcher.py`` ``MoEAlltoAllTokenDispatcher``).

An MoE layer is the transformer layer's attention (and norms), the shared experts as one dense
FFN split over tp like a dense layer's (:func:`simcore.megatron.kernels.layer_kernels` with the
shared width), and the routed experts priced here. Per micro-batch, on one rank, with ``T``
tokens entering the layer (the micro-batch's tokens split by cp, and by tp: Megatron-LM needs
sequence parallelism for MoE with tp > 1), ``k`` experts per token, ``E`` experts split over
``ep`` ranks and each expert's FFN over ``etp`` ranks, and the capacity factor ``c`` (the
busiest rank's tokens over the mean; the step runs at it):

- router: the (T x h) @ (h x E) GEMM and its small kernels (:data:`ROUTER_KERNELS`);
- permute the T k token copies by expert, all-to-all them over the ep group (dispatch), with
  etp > 1 all-gather them over the etp group; the experts' FC1 and FC2 (``--moe-grouped-gemm``:
  under Transformer Engine one GEMM launch per local expert, :func:`expert_kernels`) on
  ``etp T k c / (E/ep)`` rows per expert with 1/etp of the width, in FP8 each input quantised
  per expert (:data:`QUANTIZE_KERNELS`); the activation function; reduce-scatter over etp,
  all-to-all back (combine), unpermute and weight by the router's probabilities. Per rank that
  is ``2 T k c (3 h f_e)`` GEMM FLOPs forward with SwiGLU, whatever ep and etp;
- backward: the same all-to-alls (and etp collectives) in reverse, each GEMM's input and weight
  gradients, the element-wise kernels' gradients.

All-to-all size: each rank sends (and receives) its ``T k c`` rows of h 16-bit values, minus
the share that stays on it (``(ep-1)/ep``, as the collective layer times an all-to-all of that
per-rank buffer). The all-to-alls are on the critical path unless the plan overlaps them
(``ep_overlap``: Megatron-LM's ``--overlap-moe-expert-parallel-comm``).

Activations kept for backward, per rank (16-bit): the router's input ``2 T h`` and fp32
probabilities ``4 T E``, the permuted input ``2 T k c h`` (FC1's input), FC1's output
``2 etp T k c (2 f_e/etp)`` with SwiGLU (``f_e/etp`` otherwise), the activation's output ``2 T k
c f_e`` (FC2's input), and FC2's output ``2 T k c h`` (the combine weights the rows by the
probabilities). In FP8 FC1's and FC2's inputs are kept quantised, 1 byte an element. Full
recompute keeps only the layer input; selective keeps everything here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from simcore.megatron.calls import Call
from simcore.megatron.kernels import BACKWARD_KERNELS, KernelCosts
from simcore.megatron.placement import ExpertPart
from simcore.megatron.precision import quantize_time
from simcore.network import Collective
from simcore.specs import Activation, ModelSpec, MoESpec, Recompute, Strategy, ZeroStage

if TYPE_CHECKING:
    from simcore.megatron.plan import Comm, StepPlan

__all__ = ["DISPATCH_KERNELS", "QUANTIZE_KERNELS", "ROUTER_KERNELS", "ExpertKernels", "MoEShape",
           "dispatch_bytes", "expert_activations", "expert_calls",
           "expert_comm", "expert_grad_calls", "expert_kernels", "moe_shape", "routed_rows"]


@dataclass(frozen=True, slots=True)
class MoEShape:
    """What an MoE layer's FFN holds (whole, before any split)."""

    router_params: int
    """The router's (h x E) weights."""
    expert_params: int
    """One routed expert's FFN weights."""
    shared_params: int
    """The shared experts' FFN weights, all of them."""
    experts: int

    @property
    def routed_params(self) -> int:
        return self.experts * self.expert_params


def moe_shape(model: ModelSpec) -> MoEShape:
    moe = _moe(model)
    h = model.hidden
    matrices = 3 if model.activation is Activation.SWIGLU else 2
    return MoEShape(router_params=h * moe.experts,
                    expert_params=matrices * h * moe.expert_ffn,
                    shared_params=matrices * h * moe.shared_width, experts=moe.experts)


def _moe(model: ModelSpec) -> MoESpec:
    if model.moe is None:
        raise ValueError(f"model {model.name} has no MoE layers")
    return model.moe


def routed_rows(model: ModelSpec, tokens: float) -> float:
    """Token copies the busiest rank's experts process for ``tokens`` tokens entering the
    layer on each rank of the ep group: ``T k c``."""
    moe = _moe(model)
    return tokens * moe.top_k * moe.capacity_factor


ROUTER_KERNELS = (6, 8)
"""Small kernels of the router besides its GEMM, forward and backward, with Megatron-LM's router
fusion (``--moe-router-fusion``, Transformer Engine's fused top-k, aux-loss score and aux loss):
at NVIDIA/Megatron-LM@d7288711 ``moe/router.py`` and ``moe/moe_utils.py`` forward the top-k, the
aux-loss scores, the tokens-per-expert histogram, the aux loss and its two logging updates;
backward their gradients, the loss scaler's two, and the adds that merge the logits' and the
input's gradients and accumulate the weight gradient. Megatron-Bridge's benchmarks force the
load balance with random logits, 2 kernels more forward (0.3% of a Qwen3-30B-A3B step)."""

DISPATCH_KERNELS = {False: (19, 7), True: (15, 10)}
"""Small kernels of the token dispatch and combine, forward and backward, by whether the
dispatch is deduplicated: Megatron-LM's all-to-all dispatcher (``moe/token_dispatcher.py`` at
d7288711: its preprocess 6, the fused permute 4, the sort by expert 2, the FP8 padding 3, the sort
back 3, the unpermute 1; backward 7) or its flex dispatcher on HybridEP (the probabilities' cast,
the dispatch's metadata, scan, padding and permute kernels, the combine's unpermute and syncs:
about 15, backward 10; HybridEP's build flags move these by 2-4). Two of them, the permute and the
unpermute, move every routed row; the others are index and count kernels, at the launch floor."""

QUANTIZE_KERNELS = 4
"""Kernels to quantise one expert's GEMM input to FP8 under Transformer Engine's tensor-wise
current-scaling recipe (Megatron-Bridge's FP8 presets, "FP8-CS"): zero the amax, compute it,
compute the scale, cast (and transpose). TE 2.14 (NVIDIA/TransformerEngine@71bbefbf,
``pytorch/csrc/extensions/cast.cpp`` ``split_quantize``, ``csrc/quantizer.cpp``) loops them over
the local experts, one tensor at a time."""


@dataclass(frozen=True, slots=True)
class ExpertKernels:
    """Seconds of the routed experts' kernels for one micro-batch on one rank, and their count."""

    forward: float
    backward: float
    wgrad: float
    """The weight-gradient GEMMs (router and experts) of the backward."""
    kernels_forward: int
    kernels_backward: int
    issued_forward: int = 0
    """What the host issues forward: the kernels, but the local experts' GEMMs one call each
    over all of them (TE's grouped linear loops over the experts in C++) and no FP8 casts (run
    from the same calls)."""
    issued_backward: int = 0


def _quantize(costs: KernelCosts, elements: float) -> float:
    """One tensor's FP8 quantisation (:data:`QUANTIZE_KERNELS`): the amax reads it in 16 bits,
    the cast writes it in FP8, two kernels at the launch floor. In MXFP8 (no per-tensor scale:
    ``costs.fmt.scale_update`` false) the cast alone, which finds each block's scale as it reads; in
    NVFP4 the cast after its amax pass."""
    if not costs.fmt.scale_update:
        return quantize_time(costs, elements)  # MXFP8; NVFP4 with its amax pass
    return (2 * costs.launch + costs.elementwise(2 * elements)
            + costs.elementwise(costs.fmt.cast_bytes * elements))


def expert_kernels(model: ModelSpec, costs: KernelCosts, *, tokens: float, ep: int, etp: int,
                   act_bytes: int, dedup: bool = False,
                   transformer_engine: bool = True) -> ExpertKernels:
    """The router and routed experts of one MoE layer for ``tokens`` tokens on this rank.

    The kernel inventory is that of Megatron-LM with Transformer Engine (module docstring): the
    router's GEMM and :data:`ROUTER_KERNELS`; the dispatcher's :data:`DISPATCH_KERNELS`; each
    local expert's FC1 and FC2 as GEMMs of their own (TE's grouped linear layer runs one cuBLAS
    GEMM per expert, on side streams: ``common/gemm/cublaslt_gemm.cu``
    ``multi_stream_cublas_gemm``; its grouped CUTLASS kernel is 16-bit only and opt-in), and in
    FP8 the quantisation of each expert's GEMM inputs forward (FC1's, FC2's) and output
    gradients backward (:data:`QUANTIZE_KERNELS` each); the activation function over all local
    rows. FP8 expert weights are cast once a step and are not counted. Without
    ``transformer_engine`` (another stack's grouped GEMM: DeepGEMM, PyTorch's ``grouped_mm``)
    FC1 and FC2 are one grouped kernel each over the local experts, and each FP8 input is cast
    by one kernel over all of them."""
    moe = _moe(model)
    h, a, e = model.hidden, act_bytes, moe.experts
    local = max(1, e // ep)
    rows = routed_rows(model, tokens)  # T k c: this rank's token copies
    per_expert = etp * rows / local  # rows of each local expert's GEMMs after the etp gather
    swiglu = model.activation is Activation.SWIGLU
    width = moe.expert_ffn / etp
    fc1_width = (2 if swiglu else 1) * width
    fc1 = (per_expert, fc1_width, h)
    fc2 = (per_expert, h, width)
    launches = local if transformer_engine else 1  # GEMM launches per FC
    batch = 1 if transformer_engine else local  # experts per launch
    expert_fwd = expert_dgrad = expert_wgrad = 0.0
    for m, n, k in (fc1, fc2):
        expert_fwd += launches * costs.linear(m, n, k, batch)
        expert_dgrad += launches * costs.linear(m, k, n, batch)
        expert_wgrad += launches * costs.linear(k, n, m, batch)
    m, n, k = tokens, e, h
    router = (costs.gemm(m, n, k), costs.gemm(m, k, n), costs.gemm(k, n, m))
    small_fwd, small_bwd = DISPATCH_KERNELS[dedup]
    move = costs.elementwise(2 * a * rows * h)  # the permute or the unpermute of every row
    activation = costs.elementwise((3 if swiglu else 2) * a * etp * rows * width)
    scores = costs.elementwise(2 * 4 * tokens * e)  # the router's fp32 scores, read and written
    router_fwd, router_bwd = ROUTER_KERNELS
    forward = (router[0] + scores + (router_fwd - 1) * costs.launch + 2 * move
               + (small_fwd - 2) * costs.launch + expert_fwd + activation)
    backward = (router[1] + router[2] + scores + (router_bwd - 1) * costs.launch + 2 * move
                + (small_bwd - 2) * costs.launch + expert_dgrad + expert_wgrad
                + BACKWARD_KERNELS * activation)
    n_fwd = 1 + router_fwd + small_fwd + 2 * launches + 1
    n_bwd = 2 + router_bwd + small_bwd + 4 * launches + BACKWARD_KERNELS
    issued_fwd, issued_bwd = n_fwd - 2 * (launches - 1), n_bwd - 4 * (launches - 1)
    if costs.fp8_rate is not None:
        fwd_inputs = (per_expert * h, per_expert * width)  # FC1's and FC2's inputs
        bwd_inputs = (per_expert * h, per_expert * fc1_width)  # their output gradients
        if transformer_engine:
            forward += local * sum(_quantize(costs, x) for x in fwd_inputs)
            backward += local * sum(_quantize(costs, x) for x in bwd_inputs)
            per_tensor = (QUANTIZE_KERNELS if costs.fmt.scale_update
                          else 1 + costs.fmt.amax_pass)
            n_fwd += 2 * per_tensor * local
            n_bwd += 2 * per_tensor * local
        else:
            cast = costs.fmt.cast_bytes
            forward += sum(costs.elementwise(cast * local * x) for x in fwd_inputs)
            backward += sum(costs.elementwise(cast * local * x) for x in bwd_inputs)
            n_fwd += 2
            n_bwd += 2
    return ExpertKernels(forward=forward, backward=backward, wgrad=router[2] + expert_wgrad,
                         kernels_forward=n_fwd, kernels_backward=n_bwd,
                         issued_forward=issued_fwd, issued_backward=issued_bwd)


def expert_activations(model: ModelSpec, *, tokens: float, etp: int, act_bytes: int,
                       recompute: Recompute, linear_input_bytes: float | None = None) -> float:
    """Bytes the router and routed experts keep for backward, on one rank (module docstring);
    0 under full recompute (the layer input, counted with the attention, is all it keeps).
    ``linear_input_bytes``: what FC1's and FC2's saved inputs take an element (FP8: 1, as
    Transformer Engine's grouped linear layer saves its inputs quantised, as its dense linear
    layers do, :mod:`simcore.megatron.activations`); the activation width by default."""
    if recompute is Recompute.FULL:
        return 0.0
    moe = _moe(model)
    h, a, f = model.hidden, act_bytes, moe.expert_ffn
    x = a if linear_input_bytes is None else linear_input_bytes
    rows = routed_rows(model, tokens)
    fc1_out = (2 if model.activation is Activation.SWIGLU else 1) * f
    return (a * tokens * h + 4 * tokens * moe.experts + x * rows * h + a * rows * fc1_out
            + x * rows * f + a * rows * h)


def dispatch_bytes(model: ModelSpec, tokens: float, act_bytes: int) -> float:
    """Each rank's all-to-all buffer for one dispatch (or combine): its ``T k c`` rows."""
    return routed_rows(model, tokens) * model.hidden * act_bytes


def expert_calls(model: ModelSpec, s: Strategy, tokens: float, act_bytes: int) -> list[Call]:
    """The collectives of one MoE layer's forward (backward runs the same): the dispatch
    all-to-all over ep, with etp > 1 the all-gather over etp, then its reduce-scatter, and the
    combine all-to-all."""
    size = dispatch_bytes(model, tokens, act_bytes)
    calls: list[Call] = []
    if s.ep > 1:
        calls.append((ExpertPart.EP, Collective.ALL_TO_ALL, size))
    if s.expert_tp > 1:
        calls += [(ExpertPart.ETP, Collective.ALL_GATHER, size),
                  (ExpertPart.ETP, Collective.REDUCE_SCATTER, size * s.expert_tp)]
    if s.ep > 1:
        calls.append((ExpertPart.EP, Collective.ALL_TO_ALL, size))
    return calls


def expert_comm(comm: Comm, model: ModelSpec, s: Strategy, tokens: float,
                act_bytes: int) -> float:
    """Seconds of one MoE layer's forward collectives (:func:`expert_calls`); with
    ``ep_dedup`` its two all-to-alls send each token once per remote block that holds any of its
    experts (:func:`simcore.megatron.placement.pairwise_all_to_all`)."""
    calls = expert_calls(model, s, tokens, act_bytes)
    if not s.ep_dedup:
        return comm.total(calls)
    rest = [c for c in calls if c[0] is not ExpertPart.EP]
    return comm.total(rest) + 2 * comm.dispatch(dispatch_bytes(model, tokens, act_bytes),
                                                _moe(model).top_k)


def expert_grad_calls(p: StepPlan, params: float) -> tuple[list[Call], list[Call]]:
    """A stage's routed-expert gradient reduction: over the expert data-parallel group (edp
    ranks hold the same experts; Megatron-LM's DDP reduces an expert buffer over
    ``intra_expt_dp_group``, ``megatron/core/distributed/distributed_data_parallel.py``), all-
    reduced (ZeRO-0) or reduce-scattered and the updated weights all-gathered (its distributed
    optimizer shards expert states over that group too)."""
    s, tr = p.s, p.training
    if s.edp == 1:
        return [], []
    grads = params * tr.reduced_grad_bytes
    if s.zero is ZeroStage.NONE:
        return [(ExpertPart.EDP, Collective.ALL_REDUCE, grads)], []
    return ([(ExpertPart.EDP, Collective.REDUCE_SCATTER, grads)],
            [(ExpertPart.EDP, Collective.ALL_GATHER,
              params * tr.bytes_per_param_weights / s.edp)])
