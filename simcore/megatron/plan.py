"""What every part of a Megatron-style step estimate shares: the plan's shapes, kernel costs,
activations, and the axes' collectives with the device's launch cost."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any, TypeVar

from simcore.megatron.activations import LayerActivations, layer_activations
from simcore.megatron.calls import Call
from simcore.megatron.checks import micro_batches
from simcore.megatron.kernels import KernelCosts, LayerKernels, layer_kernels
from simcore.megatron.layers import LayerShape, layer_shape
from simcore.megatron.placement import AxisLike, AxisNetworks, axis_networks
from simcore.megatron.precision import saved_input_bytes
from simcore.megatron.stack import (
    uses_async_tp_allreduce,
    uses_flash_attention,
    uses_fp8_attention,
    uses_fp8_param_gather,
    uses_fp32_shards,
    uses_quantized_params,
    uses_recompute_early_stop,
    uses_tp_comm_overlap,
    uses_transformer_engine,
)
from simcore.megatron.states import model_state_bytes
from simcore.network import Collective
from simcore.specs import (
    Axis,
    ModelSpec,
    Recompute,
    SelectiveRecompute,
    Strategy,
    SystemSpec,
    TrainingSpec,
    ZeroStage,
)

__all__ = ["Comm", "StepPlan"]

_T = TypeVar("_T")


def _shared(shared: dict[tuple[Any, ...], Any] | None, key: tuple[Any, ...],
            make: Callable[[], _T]) -> _T:
    """``make()``, or the value another plan of the same (model, system, training) already made
    under ``key`` in ``shared``."""
    if shared is None:
        return make()
    found = shared.get(key)
    if found is None:
        found = shared[key] = make()
    return found


_KEPT_CONTEXTS = 16
"""(model, system, training) triples whose shared sub-results one process keeps."""
_CONTEXTS: dict[tuple[int, int, int], tuple[Any, ...]] = {}


def _context_shared(model: ModelSpec, system: SystemSpec, training: TrainingSpec
                    ) -> dict[tuple[Any, ...], Any]:
    """The ``shared`` dict of every plan of this (model, system, training): a study's estimates
    reuse the layer's kernels and activations as its collectives are reused (a warm estimate).
    The specs are frozen, so they are keyed by identity (no hashing of nested specs per call)
    and held while kept, so that no other object takes their ids; the oldest of
    :data:`_KEPT_CONTEXTS` goes first."""
    key = (id(model), id(system), id(training))
    found = _CONTEXTS.get(key)
    if found is None:
        if len(_CONTEXTS) >= _KEPT_CONTEXTS:
            del _CONTEXTS[next(iter(_CONTEXTS))]
        found = _CONTEXTS[key] = (model, system, training, {})
    return found[3]


class Comm:
    """The axes' collectives and sends, each with the device's host-side launch cost."""

    def __init__(self, nets: AxisNetworks, launch: float) -> None:
        self.nets, self.launch = nets, launch

    def collective(self, axis: AxisLike, collective: Collective, size_bytes: float) -> float:
        t = self.nets.collective(axis, collective, size_bytes)
        return t + self.launch if t else 0.0

    def total(self, calls: list[Call]) -> float:
        """Seconds for these collectives one after the other."""
        seconds = 0.0
        for axis, collective, size in calls:
            seconds += self.collective(axis, collective, size)
        return seconds

    def p2p(self, axis: Axis, size_bytes: float) -> float:
        t = self.nets.p2p(axis, size_bytes)
        return t + self.launch if t else 0.0

    def dispatch(self, size_bytes: float, top_k: int) -> float:
        """A deduplicated expert all-to-all (:meth:`AxisNetworks.dispatch`)."""
        t = self.nets.dispatch(size_bytes, top_k)
        return t + self.launch if t else 0.0


class StepPlan:
    """The quantities every part of the estimate shares.

    ``shared``: sub-results (the layer's kernels and activations) shared by the plans of one
    (model, system, training), each under the key of the strategy fields it reads
    (:mod:`simcore.megatron.batched` passes one dict to many plans); None: the process's dict
    for these specs (:func:`_context_shared`)."""

    def __init__(self, model: ModelSpec, system: SystemSpec, training: TrainingSpec,
                 strategy: Strategy, shared: dict[tuple[Any, ...], Any] | None = None) -> None:
        if shared is None:
            shared = _context_shared(model, system, training)
        self.shared = shared
        """Sub-results shared with the other plans of this (model, system, training)."""
        self.model, self.system, self.training, self.s = model, system, training, strategy
        self.shape: LayerShape = _shared(shared, ("shape",), lambda: layer_shape(model))
        self.seq = training.seq_len
        self.m = micro_batches(training, strategy)
        self.stage_layers = strategy.stage_layers(model.layers)
        """Transformer layers on each pipeline stage (even, or Megatron's uneven split)."""
        self.stage_memo: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        """The stage sums by (layers, MoE layers, ends, pp, sends): the alike middle stages
        are summed once (memoised)."""
        self.plain_layers: tuple[Any, Any] | None = None
        """The dense and MoE layers without recompute, for ``recompute_layers``
        (:func:`simcore.megatron.step.partial_layers` builds them once)."""
        self.memory_memo: dict[tuple[Any, ...], Any] = {}
        """A stage's memory but its activations, by what it holds (memoised)."""
        self.tokens = strategy.micro_batch * self.seq / strategy.sp
        """Tokens of one micro-batch on one device (the sequence split by sp)."""
        device = system.device
        self.te = uses_transformer_engine(system, training, strategy.zero)
        """Megatron-Core with Transformer Engine (fused attention, tp overlap)."""
        self.tp_overlap = uses_tp_comm_overlap(system, training, strategy)
        """TE's userbuffers run the tp all-gathers and reduce-scatters beside the GEMMs."""
        self.tp_async = uses_async_tp_allreduce(training)
        """The backward's tp collective runs beside the weight-gradient GEMM."""
        self.flash = uses_flash_attention(model, system, training)
        self.fp8_attention = uses_fp8_attention(training, strategy.precision, self.te, self.flash)
        """TE's fused attention runs in FP8 (:attr:`TrainingSpec.fp8_attention`)."""
        self.costs = KernelCosts.of(device, strategy.precision, self.te,
                                    training.launch_blocking, self.fp8_attention)
        self.early_stop = (strategy.recompute is Recompute.FULL
                           and uses_recompute_early_stop(system, training, strategy.zero))
        """Full recompute stops at the layer's last saved tensor (PyTorch's checkpointing)."""
        self.fp32_shards = uses_fp32_shards(system, training, strategy.zero)
        """Gradient shards in fp32, and under ZeRO-3 no 16-bit shard (PyTorch FSDP):
        :func:`uses_fp32_shards`."""
        self.pipeline_no_sync = bool(training.pipeline_no_sync and strategy.pp > 1
                                     and strategy.zero is ZeroStage.PARAMETERS and self.m > 1)
        """FSDP2 under PyTorch's pipeline stages: ``no_sync`` accumulation, and the stage's
        weights kept gathered (:attr:`TrainingSpec.pipeline_no_sync`)."""
        self.no_sync = self.pipeline_no_sync or (
            training.fsdp_no_sync and strategy.zero is ZeroStage.PARAMETERS and self.m > 1)
        """FSDP's ``no_sync`` accumulation: the whole gradient kept through the step, in the
        reduction's type, and each layer's reduce-scatter once a step
        (:attr:`TrainingSpec.fsdp_no_sync`, :attr:`TrainingSpec.pipeline_no_sync`)."""
        self.per_op = (strategy.recompute is Recompute.SELECTIVE
                       and training.selective_recompute is SelectiveRecompute.OP)
        """Selective recompute is torchtitan's per-op checkpointing, not the attention core."""
        self.modules = (frozenset(training.recompute_modules)
                        if strategy.recompute is Recompute.SELECTIVE
                        and training.recompute_modules is not None else None)
        """Selective recompute runs Megatron-LM's ``recompute_modules`` again."""
        self.fp8 = strategy.precision.quantized
        """The linear layers run in a quantised format, FP8, MXFP8 or NVFP4
        (:mod:`simcore.megatron.precision`)."""
        self.quantized_params = uses_quantized_params(system, training, strategy)
        """The linear layers' quantised copies are their only compute weights (no 16-bit one):
        ``--fp8-param-gather`` (in MXFP8 with ``--reuse-grad-buf-for-mxfp8-param-ag``, which
        gathers them in 16-bit into the gradient buffer and quantises them there)."""
        self.fp8_params = uses_fp8_param_gather(system, training, strategy)
        """The linear layers' weights are kept in FP8 only and all-gathered in FP8."""
        self.dp_group = strategy.dp * strategy.sp
        """Ranks that hold the same weights and share the gradient reduction."""
        self.hsdp = strategy.replicas > 1
        """ZeRO-3 sharded over a shard group smaller than dp_group, replicated across."""
        self.shard_ranks = strategy.shard_ranks if self.hsdp else self.dp_group
        """Ranks ZeRO shards the model states over (the shard group under HSDP)."""
        degrees = {Axis.DP: strategy.dp, Axis.TP: strategy.tp, Axis.PP: strategy.pp,
                   Axis.SP: strategy.sp}
        dp_shard = self.shard_ranks // strategy.sp if self.hsdp else None
        self.moe = model.moe
        """The MoE layers' FFN (None: a dense model)."""
        experts = (strategy.expert_tp, strategy.ep) if self.moe is not None else None
        self.comm = Comm(axis_networks(system.network, degrees, strategy.placement, dp_shard,
                                       experts), device.collective_launch_s)
        self.grad_links: dict[tuple[float, float], tuple[float, float]] = _shared(
            shared, ("grad links", self.comm.nets, strategy.zero, self.fp8_params), dict)
        """Seconds of a stage's gradient reduction and weight gather, by the parameters it
        holds (memoised, and shared by the plans of these axis networks, ZeRO stage and weight
        format)."""
        self.stage_moe_layers = _stage_moe_layers(model, self.stage_layers)
        """MoE layers on each pipeline stage (all 0 for a dense model)."""
        s = strategy
        self.act = self._activations(s.recompute)
        self.kernels: LayerKernels = _shared(
            shared, ("kernels", s.micro_batch, s.sp, s.tp, s.sequence_parallel, s.precision,
                     self.te, self.m if self.fp8 else 0,  # fp8 casts the weights once per step
                     training.swiglu_fusion, self.fp8_attention, training.cp_exchange,
                     training.fused_norm, training.rope_fusion),
            lambda: layer_kernels(
                model, self.shape, self.costs, micro_batch=s.micro_batch,
                queries=self.seq / s.sp, seq_len=self.seq, tp=s.tp,
                sequence_parallel=s.sequence_parallel, flash=self.flash,
                act_bytes=training.bytes_per_activation, micro_batches=self.m,
                swiglu_fused=training.swiglu_fusion, cp_comm=training.cp_exchange,
                norm_fused=training.fused_norm, te_attention=self.te,
                rope_fused=training.rope_fusion,
            ))
        if self.moe is not None:
            self._moe_parts(shared)

    @cached_property
    def step_bytes_per_param(self) -> float:
        """Gradient and 16-bit weight bytes a parameter the optimizer step reads and writes
        besides its state (PyTorch FSDP: an fp32 gradient, and under ZeRO-3 no 16-bit copy)."""
        weights, grads, _ = model_state_bytes(1.0, self.training, self.s.zero, 1,
                                              fp32_shards=self.fp32_shards)
        return weights + grads

    @cached_property
    def chunk_layers(self) -> tuple[tuple[int, ...], ...]:
        """Per stage, the transformer layers of each of its v model chunks
        (:meth:`Strategy.chunk_layers`: even, or Megatron's short first / last virtual stage)."""
        return tuple(self.s.chunk_layers(self.model.layers, i) for i in range(self.s.pp))

    def recomputed_layers(self, i: int, layers: float, pp: int) -> float:
        """Of stage ``i``'s ``layers`` transformer layers (a stage of ``pp``), how many are fully
        recomputed: all of them under ``recompute: full``, none otherwise; with
        :attr:`Strategy.recompute_layers` ``N``, ``min(N, k)`` of each of its chunks of ``k``
        layers (:attr:`chunk_layers`; v equal chunks of a stage of another ``pp``)."""
        s = self.s
        if s.recompute is not Recompute.FULL:
            return 0.0
        n = s.recompute_layers
        if n is None:
            return layers
        if pp == s.pp and layers == self.stage_layers[i]:
            chunks: tuple[float, ...] = self.chunk_layers[i]
        else:
            chunks = (layers / s.v,) * s.v
        return float(sum(min(n, k) for k in chunks))

    @cached_property
    def act_plain(self) -> LayerActivations:
        """A layer's activations without recompute: what the layers ``recompute_layers`` leaves
        out keep."""
        return self._activations(Recompute.NONE)

    @cached_property
    def moe_act_plain(self) -> LayerActivations:
        """An MoE layer's attention and shared experts' activations without recompute."""
        assert self.model.moe is not None
        return self._activations(Recompute.NONE, self.model.moe.shared_width)

    def _activations(self, recompute: Recompute, ffn: int | None = None) -> LayerActivations:
        """A layer's activations under ``recompute`` (``ffn``: an MoE layer's attention and
        shared experts of that width), shared by the plans of these specs that split a
        micro-batch alike."""
        s = self.s
        kind = "act" if ffn is None else "moe act"
        return _shared(
            self.shared, (kind, s.micro_batch, s.tp, s.sp, s.sequence_parallel, recompute,
                          s.precision, self.training.swiglu_fusion, self.fp8_attention,
                          self.training.fused_norm),
            lambda: layer_activations(
                self.model, self.shape, micro_batch=s.micro_batch, seq_len=self.seq, tp=s.tp,
                sp=s.sp, sequence_parallel=s.sequence_parallel, recompute=recompute,
                flash=self.flash, linear_input_bytes=saved_input_bytes(s.precision), ffn=ffn,
                per_op=self.per_op, modules=self.modules,
                swiglu_fused=self.training.swiglu_fusion, fp8_attention=self.fp8_attention,
                norm_fused=self.training.fused_norm,
            ))

    def _moe_parts(self, shared: dict[tuple[Any, ...], Any] | None) -> None:
        """An MoE layer's kernels and activations: the attention and shared experts as a layer
        with the shared width, the router and routed experts apart (:mod:`simcore.megatron.moe`)."""
        from simcore.megatron.moe import expert_activations, expert_kernels, moe_shape

        model, s, training = self.model, self.s, self.training
        assert model.moe is not None
        self.moe_shape = _shared(shared, ("moe shape",), lambda: moe_shape(model))
        width = model.moe.shared_width
        self.expert_tokens = self.tokens / s.tp
        """Tokens entering an MoE layer on this rank: the micro-batch's, split by cp and (with
        sequence parallelism, which MoE with tp > 1 needs) by tp."""
        a = training.bytes_per_activation
        self.moe_kernels: LayerKernels = _shared(
            shared, ("moe kernels", s.micro_batch, s.sp, s.tp, s.sequence_parallel, s.precision,
                     self.te, self.m if self.fp8 else 0, training.swiglu_fusion,
                     self.fp8_attention, training.cp_exchange, training.fused_norm,
                     training.rope_fusion),
            lambda: layer_kernels(
                model, self.shape, self.costs, micro_batch=s.micro_batch,
                queries=self.seq / s.sp, seq_len=self.seq, tp=s.tp,
                sequence_parallel=s.sequence_parallel, flash=self.flash, act_bytes=a,
                micro_batches=self.m, ffn=width, swiglu_fused=training.swiglu_fusion,
                cp_comm=training.cp_exchange, norm_fused=training.fused_norm,
                te_attention=self.te, rope_fused=training.rope_fusion,
            ))
        self.experts = _shared(
            shared, ("experts", s.micro_batch, s.sp, s.tp, s.ep, s.expert_tp, s.precision,
                     self.te, s.ep_dedup),
            lambda: expert_kernels(model, self.costs, tokens=self.expert_tokens, ep=s.ep,
                                   etp=s.expert_tp, act_bytes=a, dedup=s.ep_dedup,
                                   transformer_engine=self.te))
        self.moe_act = self._activations(s.recompute, width)
        saved = saved_input_bytes(s.precision) if self.fp8 else a
        self.expert_act = expert_activations(model, tokens=self.expert_tokens, etp=s.expert_tp,
                                             act_bytes=a, recompute=s.recompute,
                                             linear_input_bytes=saved)
        """The router's and routed experts' kept activations (0 under full recompute)."""
        self.expert_act_full = expert_activations(model, tokens=self.expert_tokens,
                                                  etp=s.expert_tp, act_bytes=a,
                                                  recompute=Recompute.NONE,
                                                  linear_input_bytes=saved)


def _stage_moe_layers(model: ModelSpec, stage_layers: tuple[int, ...]) -> tuple[int, ...]:
    if model.moe is None:
        return tuple(0 for _ in stage_layers)
    counts, start = [], 0
    for n in stage_layers:
        counts.append(model.moe.moe_layers(start, start + n))
        start += n
    return tuple(counts)
