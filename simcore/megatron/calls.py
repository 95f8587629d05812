"""Which collectives each part of a Megatron-style step runs, as (axis, collective, bytes):
what the estimate times (:meth:`simcore.megatron.plan.Comm.total`) and what the step's Chakra
graph writes as nodes (:mod:`simcore.megatron.step_graph`), from one place.

Sizes are as ASTRA-sim takes them (the per-rank input of an all-gather, the whole tensor
otherwise) and may be fractional; both users truncate them to whole bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simcore.megatron.placement import AxisLike, DpPart
from simcore.megatron.precision import FP8_BYTES
from simcore.network import Collective
from simcore.specs import Axis, CpComm, CrossEntropy, ZeroStage

if TYPE_CHECKING:
    from simcore.megatron.plan import StepPlan

__all__ = ["Call", "cp_kv_calls", "dp_group_calls", "embedding_calls", "fsdp_layer_calls",
           "gathered_weight_bytes", "grad_reduction_calls", "head_calls", "tp_pair_calls"]

Call = tuple[AxisLike, Collective, float]


def _activation(p: StepPlan) -> float:
    """One micro-batch's (b, s, h) activation on a device, in bytes."""
    return p.tokens * p.model.hidden * p.training.bytes_per_activation


def tp_pair_calls(p: StepPlan) -> list[Call]:
    """Half a layer's tp communication: an all-reduce of the (b, s, h) activation, or an
    all-gather and a reduce-scatter with sequence parallelism (two per layer each way)."""
    t = p.s.tp
    if t == 1:
        return []
    full = _activation(p)
    if p.s.sequence_parallel:
        return [(Axis.TP, Collective.ALL_GATHER, full / t),
                (Axis.TP, Collective.REDUCE_SCATTER, full)]
    return [(Axis.TP, Collective.ALL_REDUCE, full)]


def embedding_calls(p: StepPlan) -> list[Call]:
    """The vocab-parallel embedding's output all-reduced (reduce-scattered with SP); none for a
    table every tp rank keeps whole (:attr:`simcore.specs.TrainingSpec.vocab_parallel_embedding`),
    whose output each rank computes itself (with SP, the first norm takes its share locally)."""
    if p.s.tp == 1 or not p.training.vocab_parallel_embedding:
        return []
    kind = Collective.REDUCE_SCATTER if p.s.sequence_parallel else Collective.ALL_REDUCE
    return [(Axis.TP, kind, _activation(p))]


def head_calls(p: StepPlan, backward: bool) -> list[Call]:
    """Sequence parallelism's gather before the LM head (and its reduce-scatter backward); with
    a replicated loss (:attr:`CrossEntropy.REPLICATED`) the 16-bit logits all-gathered after
    it (its backward is a local slice)."""
    if p.s.tp == 1:
        return []
    calls: list[Call] = []
    if p.s.sequence_parallel:
        full = _activation(p)
        calls.append((Axis.TP, Collective.REDUCE_SCATTER, full) if backward
                     else (Axis.TP, Collective.ALL_GATHER, full / p.s.tp))
    if not backward and p.training.cross_entropy is CrossEntropy.REPLICATED:
        logits = p.tokens * p.model.vocab * p.training.bytes_per_activation
        calls.append((Axis.TP, Collective.ALL_GATHER, logits / p.s.tp))
    return calls


def cp_kv_calls(p: StepPlan) -> tuple[list[Call], list[Call]]:
    """Context parallelism per layer: the forward's collectives (again in backward) and what
    backward adds. K and V all-gathered and their gradients reduce-scattered (the ring, ``p2p``,
    sends the same bytes on in cp - 1 steps); with ``cp_comm: a2a`` Q, K, V and the output
    all-to-all'd forward, and backward the output, its gradient, dQ, dK and dV."""
    s, a = p.s, p.training.bytes_per_activation
    k = p.tokens * p.model.hidden * p.shape.kv_fraction * a / s.tp
    if p.training.cp_comm is CpComm.A2A:
        q = p.tokens * p.model.hidden * p.shape.q_fraction * a / s.tp
        return ([(Axis.SP, Collective.ALL_TO_ALL, size) for size in (q, k, k, q)],
                [(Axis.SP, Collective.ALL_TO_ALL, q)])
    return ([(Axis.SP, Collective.ALL_GATHER, 2 * k)],
            [(Axis.SP, Collective.REDUCE_SCATTER, 2 * k * s.sp)])


def dp_group_calls(p: StepPlan, collective: Collective, size: float, *,
                   shard: bool = False) -> list[Call]:
    """A collective over the data-parallel group (dp, and sp which shares the weights); over
    dp x sp the two axes in turn, as a hierarchical collective over both would run. ``shard``:
    over HSDP's shard group instead (sp x the dp part :attr:`DpPart.SHARD`)."""
    s = p.s
    dp_axis: Axis | DpPart = Axis.DP
    dp = s.dp
    if shard and p.hsdp:
        dp_axis, dp = DpPart.SHARD, p.shard_ranks // s.sp
    if s.sp == 1:
        return [(dp_axis, collective, size)]
    if dp == 1:
        return [(Axis.SP, collective, size)]
    if collective is Collective.ALL_GATHER:
        return [(Axis.SP, collective, size), (dp_axis, collective, size * s.sp)]
    if collective is Collective.REDUCE_SCATTER:
        return [(Axis.SP, collective, size), (dp_axis, collective, size / s.sp)]
    return [(Axis.SP, Collective.REDUCE_SCATTER, size),
            (dp_axis, Collective.ALL_REDUCE, size / s.sp),
            (Axis.SP, Collective.ALL_GATHER, size / s.sp)]


def fsdp_layer_calls(p: StepPlan) -> tuple[list[Call], list[Call]]:
    """ZeRO-3 per layer: its weights all-gathered (before forward, and again before backward;
    the linear layers' in FP8 with ``fp8_params``) and its gradients reduce-scattered (after
    backward), over the shard group (HSDP) or the whole data-parallel group."""
    params = p.shape.layer_params / p.s.tp
    tr = p.training
    fp8 = p.shape.matmul_params / p.s.tp if p.fp8_params else 0.0
    weights = gathered_weight_bytes(params, fp8, tr.bytes_per_param_weights)
    return (dp_group_calls(p, Collective.ALL_GATHER, weights / p.shard_ranks, shard=True),
            dp_group_calls(p, Collective.REDUCE_SCATTER, params * tr.reduced_grad_bytes,
                           shard=True))


def gathered_weight_bytes(params: float, fp8_params: float, weight_bytes: int) -> float:
    """Bytes of ``params`` weights all-gathered, ``fp8_params`` of them in FP8."""
    return (params - fp8_params) * weight_bytes + fp8_params * FP8_BYTES


def grad_reduction_calls(p: StepPlan, params: float,
                         fp8_params: float = 0.0) -> tuple[list[Call], list[Call]]:
    """A stage's gradient reduction over the data-parallel group for its ``params``: the
    gradients all-reduced (ZeRO-0) or reduce-scattered, then the updated weights all-gathered
    (ZeRO-1/2; ``fp8_params`` of them, the linear layers' under ``--fp8-param-gather``, in
    FP8); nothing for one replica or ZeRO-3 (its layers reduce their own). HSDP: each
    rank's reduce-scattered gradient shard all-reduced across the replicas once per step, as
    FSDP2 does after the shard group's reduce-scatter (``foreach_reduce``'s ``all_reduce`` over
    the replicate mesh axis, ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``);
    torchtitan skips it on all but the last micro-batch (``set_requires_all_reduce``).
    ZeRO-1 with ``grad_all_reduce`` (Scaling's): the gradients all-reduced whole, then the
    weights all-gathered. Each gradient element sends ``reduced_grad_bytes``.
    ZeRO-1 with a shard group (Megatron-LM's distributed optimizer instances): the gradients
    reduce-scattered within the shard group, each rank's shard all-reduced across the
    replicas, the weights all-gathered within the shard group (``param_and_grad_buffer.py``,
    d98e8a64: "RS" then "AR" on the communication stream)."""
    s, tr = p.s, p.training
    if p.hsdp and s.zero is ZeroStage.PARAMETERS:
        shard = params * tr.reduced_grad_bytes / p.shard_ranks
        return [(DpPart.REPLICATE, Collective.ALL_REDUCE, shard)], []
    if p.dp_group == 1 or s.zero is ZeroStage.PARAMETERS:
        return [], []
    grads = params * tr.reduced_grad_bytes
    if s.zero is ZeroStage.NONE:
        return dp_group_calls(p, Collective.ALL_REDUCE, grads), []
    weights = gathered_weight_bytes(params, fp8_params, tr.bytes_per_param_weights)
    if tr.grad_all_reduce and s.zero is ZeroStage.OPTIMIZER and not p.hsdp:
        return (dp_group_calls(p, Collective.ALL_REDUCE, grads),
                dp_group_calls(p, Collective.ALL_GATHER, weights / p.dp_group))
    if p.hsdp:
        return (dp_group_calls(p, Collective.REDUCE_SCATTER, grads, shard=True)
                + [(DpPart.REPLICATE, Collective.ALL_REDUCE, grads / p.shard_ranks)],
                dp_group_calls(p, Collective.ALL_GATHER, weights / p.shard_ranks, shard=True))
    return (dp_group_calls(p, Collective.REDUCE_SCATTER, grads),
            dp_group_calls(p, Collective.ALL_GATHER, weights / p.dp_group))
