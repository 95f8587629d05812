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

- router: the (T x h) @ (h x E) GEMM and the score/top-k kernels;
- permute the T k token copies by expert, all-to-all them over the ep group (dispatch), with
  etp > 1 all-gather them over the etp group; the experts' FC1 and FC2 as grouped GEMMs (one
  kernel each for the E / ep local experts, ``--moe-grouped-gemm``) on ``etp T k c / (E/ep)``
  rows per expert with 1/etp of the width; the activation function; reduce-scatter over etp,
  all-to-all back (combine), unpermute and weight by the router's probabilities. Per rank that
  is ``2 T k c (3 h f_e)`` GEMM FLOPs forward with SwiGLU, whatever ep and etp;
- backward: the same all-to-alls (and etp collectives) in reverse, each GEMM's input and weight
  gradients, the element-wise kernels' gradients.

All-to-all size: each rank sends (and receives) its ``T k c`` rows of h 16-bit values, minus
the share that stays on it (``(ep-1)/ep``, as the collective layer times an all-to-all of that
per-rank buffer). The all-to-alls are on the critical path (Megatron-LM overlaps them only with
``--overlap-moe-expert-parallel-comm``, not modelled).

Activations kept for backward, per rank (16-bit): the router's input ``2 T h`` and fp32
probabilities ``4 T E``, the permuted input ``2 T k c h`` (FC1's input), FC1's output
``2 etp T k c (2 f_e/etp)`` with SwiGLU (``f_e/etp`` otherwise), the activation's output ``2 T k
c f_e`` (FC2's input), and FC2's output ``2 T k c h`` (the combine weights the rows by the
probabilities). Full recompute keeps only the layer input; selective keeps everything here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from simcore.megatron.calls import Call
from simcore.megatron.kernels import BACKWARD_KERNELS, KernelCosts
from simcore.megatron.placement import ExpertPart
from simcore.network import Collective
from simcore.specs import Activation, ModelSpec, MoESpec, Recompute, Strategy, ZeroStage

if TYPE_CHECKING:
    from simcore.megatron.plan import Comm, StepPlan

__all__ = ["ExpertKernels", "MoEShape", "dispatch_bytes", "expert_activations", "expert_calls",
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


@dataclass(frozen=True, slots=True)
class ExpertKernels:
    """Seconds of the routed experts' kernels for one micro-batch on one rank, and their count."""

    forward: float
    backward: float
    wgrad: float
    """The weight-gradient GEMMs (router and experts) of the backward."""
    kernels_forward: int
    kernels_backward: int


def expert_kernels(model: ModelSpec, costs: KernelCosts, *, tokens: float, ep: int, etp: int,
                   act_bytes: int) -> ExpertKernels:
    """The router and routed experts of one MoE layer for ``tokens`` tokens on this rank."""
    moe = _moe(model)
    h, a, e = model.hidden, act_bytes, moe.experts
    local = e / ep
    rows = routed_rows(model, tokens)  # T k c: this rank's token copies
    per_expert = etp * rows / local  # rows of each local expert's GEMMs after the etp gather
    swiglu = model.activation is Activation.SWIGLU
    width = moe.expert_ffn / etp
    fc1 = (per_expert, (2 if swiglu else 1) * width, h)
    fc2 = (per_expert, h, width)
    router = (tokens, e, h)
    gemms = []
    for m, n, k in (fc1, fc2):
        gemms.append((costs.linear(m, n, k, local), costs.linear(m, k, n, local),
                      costs.linear(k, n, m, local)))
    m, n, k = router
    gemms.append((costs.gemm(m, n, k), costs.gemm(m, k, n), costs.gemm(k, n, m)))
    # Router scores (fp32) and top-k; permute and unpermute (read and write each copy's row,
    # once each way); the activation function over the local experts' rows.
    elementwise = [2 * 4 * tokens * e, 2 * a * rows * h, 2 * a * rows * h,
                   (3 if swiglu else 2) * a * etp * rows * width]
    ew_fwd = [costs.elementwise(x) for x in elementwise]
    forward = sum(g[0] for g in gemms) + sum(ew_fwd)
    wgrad = sum(g[2] for g in gemms)
    backward = (sum(g[1] for g in gemms) + wgrad
                + sum(BACKWARD_KERNELS * costs.elementwise(x) for x in elementwise))
    return ExpertKernels(forward=forward, backward=backward, wgrad=wgrad,
                         kernels_forward=len(gemms) + len(elementwise),
                         kernels_backward=2 * len(gemms) + BACKWARD_KERNELS * len(elementwise))


def expert_activations(model: ModelSpec, *, tokens: float, etp: int, act_bytes: int,
                       recompute: Recompute) -> float:
    """Bytes the router and routed experts keep for backward, on one rank (module docstring);
    0 under full recompute (the layer input, counted with the attention, is all it keeps)."""
    if recompute is Recompute.FULL:
        return 0.0
    moe = _moe(model)
    h, a, f = model.hidden, act_bytes, moe.expert_ffn
    rows = routed_rows(model, tokens)
    fc1_out = (2 if model.activation is Activation.SWIGLU else 1) * f
    return (a * tokens * h + 4 * tokens * moe.experts + a * rows * h + a * rows * fc1_out
            + a * rows * f + a * rows * h)


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
    grads = params * tr.bytes_per_param_grads
    if s.zero is ZeroStage.NONE:
        return [(ExpertPart.EDP, Collective.ALL_REDUCE, grads)], []
    return ([(ExpertPart.EDP, Collective.REDUCE_SCATTER, grads)],
            [(ExpertPart.EDP, Collective.ALL_GATHER,
              params * tr.bytes_per_param_weights / s.edp)])
