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
from simcore.megatron.placement import AxisLike, AxisNetworks, axis_networks, within_innermost
from simcore.megatron.precision import saved_input_bytes
from simcore.megatron.states import model_state_bytes
from simcore.network import Collective
from simcore.specs import (
    Axis,
    Family,
    ModelSpec,
    Precision,
    Recompute,
    SelectiveRecompute,
    Strategy,
    SystemSpec,
    TrainingSpec,
    ZeroStage,
)

__all__ = ["Comm", "StepPlan", "uses_flash_attention", "uses_fp32_shards", "uses_fp8_param_gather",
           "uses_fp8_attention", "uses_quantized_params", "uses_tp_comm_overlap",
           "uses_recompute_early_stop", "uses_transformer_engine"]

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
        self.no_sync = (training.fsdp_no_sync and strategy.zero is ZeroStage.PARAMETERS
                        and self.m > 1)
        """FSDP's ``no_sync`` accumulation: the whole gradient kept through the step, in the
        reduction's type, and each layer's reduce-scatter once a step
        (:attr:`TrainingSpec.fsdp_no_sync`)."""
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
                     training.swiglu_fusion, self.fp8_attention, training.cp_exchange),
            lambda: layer_kernels(
                model, self.shape, self.costs, micro_batch=s.micro_batch,
                queries=self.seq / s.sp, seq_len=self.seq, tp=s.tp,
                sequence_parallel=s.sequence_parallel, flash=self.flash,
                act_bytes=training.bytes_per_activation, micro_batches=self.m,
                swiglu_fused=training.swiglu_fusion, cp_comm=training.cp_exchange,
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
                          s.precision, self.training.swiglu_fusion, self.fp8_attention),
            lambda: layer_activations(
                self.model, self.shape, micro_batch=s.micro_batch, seq_len=self.seq, tp=s.tp,
                sp=s.sp, sequence_parallel=s.sequence_parallel, recompute=recompute,
                flash=self.flash, linear_input_bytes=saved_input_bytes(s.precision), ffn=ffn,
                per_op=self.per_op, modules=self.modules,
                swiglu_fused=self.training.swiglu_fusion, fp8_attention=self.fp8_attention,
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
                     self.fp8_attention, training.cp_exchange),
            lambda: layer_kernels(
                model, self.shape, self.costs, micro_batch=s.micro_batch,
                queries=self.seq / s.sp, seq_len=self.seq, tp=s.tp,
                sequence_parallel=s.sequence_parallel, flash=self.flash, act_bytes=a,
                micro_batches=self.m, ffn=width, swiglu_fused=training.swiglu_fusion,
                cp_comm=training.cp_exchange,
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


def uses_transformer_engine(system: SystemSpec, training: TrainingSpec, zero: ZeroStage) -> bool:
    """Whether a plan with this ZeRO stage trains with Transformer Engine
    (:attr:`TrainingSpec.transformer_engine`): the training's choice, else the device's default
    for plans Megatron-Core runs (ZeRO 0 or 1: its distributed optimizer). Plans that shard
    gradients or weights (ZeRO 2 or 3) are, by default, what the PyTorch FSDP and DeepSpeed
    stacks run, without Transformer Engine: every such H100 run of the validation set (76 of
    llm-foundry, torchtitan, NeMo AutoModel) is; Megatron-FSDP plans say so in the training
    (a ``framework: megatron`` study does)."""
    if training.transformer_engine is not None:
        return training.transformer_engine
    return system.device.transformer_engine and zero <= ZeroStage.OPTIMIZER


def uses_recompute_early_stop(system: SystemSpec, training: TrainingSpec,
                              zero: ZeroStage) -> bool:
    """Whether full recompute stops each layer's recompute at its last saved tensor
    (:attr:`TrainingSpec.recompute_early_stop`): the training's choice, else on for the plans
    the PyTorch FSDP stack runs by default (ZeRO-2/3 without Transformer Engine: llm-foundry's,
    torchtitan's and NeMo AutoModel's runs of the validation set, all on PyTorch's
    non-reentrant checkpointing), off for Megatron-LM's and DeepSpeed's re-entrant
    checkpointing."""
    if training.recompute_early_stop is not None:
        return training.recompute_early_stop
    return _pytorch_fsdp_default(system, training, zero)


def _pytorch_fsdp_default(system: SystemSpec, training: TrainingSpec, zero: ZeroStage) -> bool:
    """Whether the plan is, by default, what the PyTorch FSDP stack runs: it shards gradients
    (ZeRO-2/3) and does not train with Transformer Engine."""
    return zero >= ZeroStage.GRADIENTS and not uses_transformer_engine(system, training, zero)


def uses_fp32_shards(system: SystemSpec, training: TrainingSpec, zero: ZeroStage) -> bool:
    """Whether a plan that shards gradients keeps its shards in fp32 only, as PyTorch FSDP does:
    with a bf16 mixed-precision policy its sharded parameter is the fp32 one the optimizer
    steps, cast to bf16 as it is all-gathered ("the sharded parameter is kept in full
    precision", ``torch.distributed.fsdp.MixedPrecision``; FSDP2's ``MixedPrecisionPolicy``
    the same), and the reduce-scattered gradient is cast back to the parameter's fp32 for the
    step. The fp32 shard is the optimizer's master copy (in ``bytes_per_param_optimizer``), the
    sharded gradient takes 4 bytes whatever the reduction's type, and under ZeRO-3 no 16-bit
    shard is kept: 16 bytes a parameter over the group, where DeepSpeed's ZeRO-3 and
    Megatron's keep a 16-bit shard beside the master (18 with fp32 gradients). ZeRO-2
    (``SHARD_GRAD_OP``) keeps the 16-bit parameters whole through the step, as the others do.

    The plans of the PyTorch stack, as the training's stack fields say: ZeRO-2/3 without
    Transformer Engine (:func:`uses_transformer_engine`) whose training does not say its
    checkpointing re-runs whole layers (``recompute_early_stop: false``, which megatron and
    deepspeed studies set: :func:`search_spaces.frameworks.with_framework_defaults`) --
    torchtitan's and llm-foundry's, and an ``any`` study's ZeRO-2/3 plans. Not without master
    weights (``master_weights: false``): FSDP then shards the 16-bit parameter itself."""
    return (training.master_weights and training.recompute_early_stop is not False
            and _pytorch_fsdp_default(system, training, zero))


def uses_tp_comm_overlap(system: SystemSpec, training: TrainingSpec, strategy: Strategy) -> bool:
    """Whether the plan's tp all-gathers and reduce-scatters run beside the linear layers' GEMMs
    in Transformer Engine's userbuffers (``--tp-comm-overlap``): Transformer Engine plans with
    tp > 1 and sequence parallelism, but in NVFP4, whose quantised all-gather userbuffers do not
    take (TransformerEngine@d0067d0 ``module/base.py`` ``fill_userbuffers_buffer_for_all_gather``:
    per-tensor FP8 and MXFP8 only, else "Unsupported quantizer for Userbuffers"); Megatron-Bridge
    turns it off for NVFP4 (``tp_comm_overlap = False if precision == "nvfp4"``, v0.4.2
    ``scripts/performance/configs/llama/llama3_llm_pretrain.py``). A training that says
    ``tp_comm_overlap: false`` (Megatron-LM's default) runs none. Nor does a tp group that
    leaves the network's innermost dimension (tp 16 over two DGX nodes): userbuffers reach
    the tp ranks' memory over NVLink only ("Tensor-parallel GPUs must be on a single node, and
    connected over NVLink/NVSwitch", TransformerEngine@d0067d0
    ``examples/pytorch/comm_gemm_overlap/README.md``; an NVL72 rack's NVLink domain counts as
    one, ``userbuffers-host.cpp`` ``has_mnnvl_fabric``), so its collectives go through NCCL."""
    return (training.tp_comm_overlap and strategy.tp > 1 and strategy.sequence_parallel
            and strategy.precision is not Precision.NVFP4
            and uses_transformer_engine(system, training, strategy.zero)
            and within_innermost(system.network, strategy, Axis.TP))


def uses_quantized_params(system: SystemSpec, training: TrainingSpec,
                          strategy: Strategy) -> bool:
    """Whether an FP8 or MXFP8 plan keeps its linear layers' weights only in their 8-bit form
    (``--fp8-param-gather``): Transformer Engine plans with ZeRO 1-3, as Megatron-LM's FP8
    example, NeMo 2's and Megatron-Bridge's FP8 and MXFP8 recipes set it. Megatron-Bridge's
    NVFP4 recipe (``bf16_with_nvfp4_mixed``: ``fp8_param_gather False``) keeps the 16-bit
    weights and the NVFP4 copies beside them."""
    return (strategy.precision in (Precision.FP8, Precision.MXFP8)
            and strategy.zero >= ZeroStage.OPTIMIZER
            and uses_transformer_engine(system, training, strategy.zero))


def uses_fp8_param_gather(system: SystemSpec, training: TrainingSpec, strategy: Strategy) -> bool:
    """Whether an FP8 plan keeps its linear layers' weights in FP8 only and all-gathers them in
    FP8: Megatron-LM's ``--fp8-param-gather`` ("Keep the compute param in fp8 ... and perform
    the param all-gather in fp8", ``megatron/training/arguments.py`` d98e8a64), which needs its
    distributed optimizer or FSDP and which its FP8 example
    (``examples/llama/train_llama3_8b_h100_fp8.sh``), NeMo 2's FP8 recipes
    (``bf16_with_fp8_mixed``) and Megatron-Bridge's set: Transformer Engine's FP8 plans with
    ZeRO 1-3 (:mod:`simcore.megatron.precision`)."""
    return (strategy.precision is Precision.FP8
            and uses_quantized_params(system, training, strategy))


def uses_fp8_attention(training: TrainingSpec, precision: Precision, transformer_engine: bool,
                       flash: bool) -> bool:
    """TE's fused attention runs in FP8 (:attr:`TrainingSpec.fp8_attention`): where the training
    asks for it, the linear layers are quantised and the plan runs TE's fused attention."""
    return training.fp8_attention and precision.quantized and transformer_engine and flash


def uses_flash_attention(model: ModelSpec, system: SystemSpec, training: TrainingSpec) -> bool:
    """The training's choice; by default on for the llama family (trained with it since Llama 1)
    and on devices whose entry says so (H100-era parts), off for GPT on older parts, whose
    reference runs (Megatron-LM 2021-22, BLOOM) used the unfused softmax."""
    if training.flash_attention is not None:
        return training.flash_attention
    return model.family is Family.LLAMA or system.device.flash_attention
