"""Which plans a training framework can run as written: a study's ``framework:``.

:func:`why_not` gives one short reason naming the knob and what the framework offers, or None.
Each rule cites the framework source it was read from. Only refusals are rules: where the
framework runs the same plan under another name (torchtitan's FSDP that never reshards for
ZeRO-1 and ZeRO-2: the same collectives, gradients sharded too), the exporter maps it and says
so in a comment.

- ``megatron``: NVIDIA/Megatron-LM d98e8a64 (2026-08-22).
- ``deepspeed``: deepspeedai/DeepSpeed edaa7221 (2026-08-22), as cited in
  :mod:`planner.exports._deepspeed`; Megatron-DeepSpeed 4efb479d runs the model.
- ``torchtitan``: pytorch/torchtitan b5bcd76c (2026-08-22); it runs every ZeRO stage (DDP or
  FSDP), the GPipe, 1F1B and interleaved schedules, context parallelism with tp and pp, and fp8
  (torchao's float8 linears, ``torchtitan/components/quantization/float8.md``), so only uneven
  stages it cannot lay out are refused (its exporter also refuses devices without bf16).

Uneven pipeline stages (``first_stage_layers`` / ``last_stage_layers``): Megatron-LM's
``--decoder-first/last-pipeline-num-layers`` run them all (v must divide each stage's count,
:func:`simcore.megatron.checks.check_plan`), and with v > 1 a first / last stage one layer short
of the others' multiple of v through ``--account-for-embedding/loss-in-pipeline-split``
(:meth:`simcore.specs.Strategy.short_ends`); torchtitan's ``pipeline_parallel_first/
last_stage_less_layers`` shorten the first and last stages with v = 1, and with v > 1 the first
and last virtual stage by one layer (the same short split); DeepSpeed has no way.

HSDP (``shard_group``): torchtitan's ``data_parallel_shard_degree`` x
``data_parallel_replicate_degree`` (FSDP2 ``fully_shard`` on the 2-D ``dp_replicate, dp_shard``
mesh, ``torchtitan/distributed/fsdp.py``); Megatron-FSDP's ``--num-distributed-optimizer-instances``
(``megatron/core/distributed/fsdp/mcore_fsdp_adapter.py``: ``enable_hsdp``); DeepSpeed's MiCS
(``mics_shard_size``, ``deepspeed/runtime/zero/config.py``), ZeRO-3 hence pp 1 there. All three
run it; the rules above (ZeRO-3 with DeepSpeed's pipeline) still apply. A shard group under
ZeRO-1 (a distributed optimizer sharded within groups): Megatron-LM's
``--num-distributed-optimizer-instances`` with ``--use-distributed-optimizer``; torchtitan's
HSDP without resharding (its ZeRO-1 mapping, the same collectives); DeepSpeed has none (MiCS is
ZeRO-3's).

Zero-bubble ZB-H1 (one stage per rank, B and W split): none of the three runs it. Megatron-LM's
schedules are 1F1B and interleaved only (``--delay-wgrad-compute`` defers the weight gradients to
overlap MoE all-to-alls, not a zero-bubble schedule); torchtitan's zero-bubble classes
(``ScheduleInterleavedZeroBubble``, ``ScheduleZBVZeroBubble``) are multi-stage and need at least 2
stages per rank (``torchtitan/distributed/pipeline_parallel.py``, b5bcd76c:
"Multi-stage schedule requires at least 2 stages per rank"); DeepSpeed runs 1F1B only.
Zero-bubble V (``zbv``): torchtitan runs it (``pipeline_parallel_schedule = "ZBVZeroBubble"``,
its stages laid out in a V, ``style="v"`` in the same file); Megatron-LM and DeepSpeed do not.

fp8: Megatron-LM runs it through Transformer Engine (``--fp8-format``,
``megatron/core/transformer/transformer_config.py`` d98e8a64); torchtitan through torchao's
``Float8Linear`` (the ``float8`` converter); DeepSpeed has no FP8 mode of its own (its engine's
mixed precision is fp16 or bf16; FP8 needs Transformer Engine layers in the user's model,
deepspeedai/DeepSpeed#6908), so a DeepSpeed study keeps bf16 only.
"""

from __future__ import annotations

from dataclasses import replace

from simcore.specs import (
    ZERO_BUBBLE,
    CpComm,
    CrossEntropy,
    ModelSpec,
    Precision,
    Recompute,
    Schedule,
    SelectiveRecompute,
    Strategy,
    SystemSpec,
    TrainingSpec,
    ZeroStage,
)

__all__ = ["ANY", "CP_COMM", "FRAMEWORKS", "WITHOUT_TRANSFORMER_ENGINE", "cp_comm",
           "cross_entropy", "framework_training", "recompute_early_stop", "selective_recompute",
           "transformer_engine", "grad_copy", "with_framework_defaults", "why_not"]

ANY = "any"
FRAMEWORKS = (ANY, "megatron", "deepspeed", "torchtitan")


WITHOUT_TRANSFORMER_ENGINE = ("deepspeed", "torchtitan")
"""Frameworks whose plans are estimated without Transformer Engine's fused attention and tp
overlap unless the study says otherwise (torchtitan: PyTorch SDPA and async TP; DeepSpeed:
its own kernels; :attr:`simcore.specs.TrainingSpec.transformer_engine`)."""


def transformer_engine(framework: str, device_default: bool) -> bool | None:
    """The ``transformer_engine`` of a ``framework`` study whose training names none: off for
    the frameworks without it; Megatron's on the device's default for every plan (its ZeRO-3,
    Megatron-FSDP, runs Transformer Engine's layers too); None for ``any``, where the plan's
    ZeRO stage decides (:func:`simcore.megatron.plan.uses_transformer_engine`)."""
    if framework in WITHOUT_TRANSFORMER_ENGINE:
        return False
    if framework == "megatron":
        return device_default
    return None


def recompute_early_stop(framework: str) -> bool | None:
    """The ``recompute_early_stop`` of a ``framework`` study whose training names none:
    torchtitan's full activation checkpointing is PyTorch's non-reentrant ``checkpoint_wrapper``
    (``torchtitan/distributed/activation_checkpoint.py``), which stops each layer's recompute
    at its last saved tensor; Megatron-LM's (``tensor_parallel.checkpoint``) and DeepSpeed's
    (``deepspeed.checkpointing``) re-run the whole layer; None for ``any``, where the plan's
    stack decides (:func:`simcore.megatron.plan.uses_recompute_early_stop`)."""
    if framework == "torchtitan":
        return True
    if framework in ("megatron", "deepspeed"):
        return False
    return None


def selective_recompute(framework: str) -> SelectiveRecompute | None:
    """The ``selective_recompute`` of a ``framework`` study whose training names none:
    torchtitan's selective checkpointing is per-op (``selective_ac_option = "op"``, the mode
    its exporter writes; its other option, an interval of whole layers, is not a selective
    recompute of this kind), Megatron-LM's and DeepSpeed's (Megatron-DeepSpeed's
    ``--recompute-granularity selective``) the attention core; None for ``any``: the attention
    core."""
    if framework == "torchtitan":
        return SelectiveRecompute.OP
    if framework in ("megatron", "deepspeed"):
        return SelectiveRecompute.ATTENTION
    return None


def cross_entropy(framework: str) -> CrossEntropy | None:
    """The ``cross_entropy`` of a ``framework`` study whose training names none: torchtitan's
    loss is PyTorch's cross-entropy on an fp32 copy of the logits
    (``torchtitan/components/loss.py``); Megatron-LM's, and Megatron-DeepSpeed's, its fused
    vocab-parallel one; None (fused) for ``any``."""
    if framework == "torchtitan":
        return CrossEntropy.PYTORCH
    if framework in ("megatron", "deepspeed"):
        return CrossEntropy.FUSED
    return None


def grad_copy(framework: str, training: TrainingSpec) -> bool | None:
    """The ``grad_copy`` of a ``framework`` study whose training names none: a DeepSpeed study
    that accumulates fp32 gradients (``grad_bytes: 4``) runs DeepSpeed's BF16_Optimizer, which
    keeps each 16-bit ``.grad`` beside its fp32 buffer (the export sets
    ``data_types.grad_accum_dtype: fp32``; ``deepspeed/runtime/engine.py``
    ``_do_optimizer_sanity_check``, edaa7221: bf16 with fp32 accumulation under ZeRO 1 without
    offload takes BFLOAT16). Else None (off)."""
    if framework == "deepspeed" and training.bytes_per_param_grads == 4:
        return True
    return None


def with_framework_defaults(training: TrainingSpec, framework: str,
                            device_transformer_engine: bool) -> TrainingSpec:
    """``training`` with what a ``framework`` study runs wherever the training names none: the
    stack (:func:`transformer_engine`), the recompute's early stop, the selective recompute,
    the loss, context parallelism's exchange (:func:`cp_comm`) and the 16-bit gradient copy
    (:func:`grad_copy`)."""
    defaults = {
        "transformer_engine": transformer_engine(framework, device_transformer_engine),
        "recompute_early_stop": recompute_early_stop(framework),
        "selective_recompute": selective_recompute(framework),
        "cross_entropy": cross_entropy(framework),
        "cp_comm": cp_comm(framework),
        "grad_copy": grad_copy(framework, training),
    }
    return replace(training, **{k: v for k, v in defaults.items()
                                if getattr(training, k) is None})


def framework_training(framework: str, model: ModelSpec, system: SystemSpec,
                       training: TrainingSpec, strategy: Strategy) -> TrainingSpec:
    """``training`` as ``framework`` runs ``strategy`` (:func:`with_framework_defaults` on the
    device's stack), for one plan outside a study: ``planner estimate --framework`` and a runs
    CSV's ``framework`` column. A ValueError names the framework and :func:`why_not`'s reason
    when it cannot run the plan as written."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework {framework!r} is not one of {', '.join(FRAMEWORKS)}")
    if framework == ANY:
        return training
    resolved = with_framework_defaults(training, framework, system.device.transformer_engine)
    refused = why_not(framework, model, resolved, strategy, bf16=system.device.bf16)
    if refused is not None:
        raise ValueError(f"{framework} cannot run this plan as written: {refused}")
    return resolved


def _selective(framework: str, training: TrainingSpec, s: Strategy) -> str | None:
    """A selective recompute the framework does not run: per-op outside torchtitan, the
    attention core (said so, as a Megatron-LM or DeepSpeed study does) in torchtitan. A plan
    whose training names neither (an ``any`` study's) runs each framework's own."""
    if s.recompute is not Recompute.SELECTIVE or framework == ANY:
        return None
    op = training.selective_recompute is SelectiveRecompute.OP
    attention = training.selective_recompute is SelectiveRecompute.ATTENTION
    if op and framework != "torchtitan":
        return (f"recompute selective with selective_recompute op: {framework}'s selective"
                " recompute is the attention core (selective_recompute attention); per-op"
                " checkpointing is torchtitan's")
    if attention and framework == "torchtitan":
        return ("recompute selective of the attention core: torchtitan's selective"
                " checkpointing is per-op (set training selective_recompute: op, as a"
                " torchtitan study does), or use recompute full or none")
    if training.recompute_modules is not None and framework != "megatron":
        return (f"recompute selective with recompute_modules: Megatron-LM's"
                f" --recompute-modules; {framework} has no such option")
    return None


def why_not(framework: str, model: ModelSpec, training: TrainingSpec,
            strategy: Strategy, *, bf16: bool = True) -> str | None:
    """Why ``framework`` cannot run ``strategy`` as written, or None if it can (``bf16``: the
    device trains in bf16, not fp16 with loss scaling: :attr:`simcore.specs.DeviceSpec.bf16`)."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"unknown framework {framework!r}; use one of {', '.join(FRAMEWORKS)}")
    if framework != ANY and model.moe is not None:
        refused = _experts(framework, model, strategy)
        if refused is not None:
            return refused
    if framework == "megatron":
        refused = _megatron(strategy)
    elif framework == "deepspeed":
        refused = _deepspeed(strategy, bf16) or _deepspeed_accumulation(training, strategy)
    elif framework == "torchtitan":
        refused = _torchtitan(model, strategy)
    else:
        return None  # any
    refused = (refused or _cp_comm(framework, training, strategy)
               or _fp8_attention(framework, training, strategy) or _any_only(framework, training))
    return refused if refused is not None else _selective(framework, training, strategy)


CP_COMM = {"torchtitan": CpComm.P2P, "deepspeed": CpComm.A2A}
"""The one way each framework but Megatron-LM (which runs all three, ``--cp-comm-type``) runs
context parallelism: torchtitan's is PyTorch's (``torch.distributed.tensor.experimental.
_attention``, ``torchtitan/distributed/context_parallel/api.py`` at b5bcd76c), for SDPA a ring
that merges each chunk's output step by step; DeepSpeed's is Ulysses' all-to-all
(Megatron-DeepSpeed's ``--ds-sequence-parallel-size``)."""


def cp_comm(framework: str) -> CpComm | None:
    """The ``cp_comm`` of a ``framework`` study whose training names none: the one way the
    framework runs (:data:`CP_COMM`) where it is not the default ring; else None."""
    runs = CP_COMM.get(framework)
    return None if runs is CpComm.P2P else runs


def _cp_comm(framework: str, training: TrainingSpec, strategy: Strategy) -> str | None:
    """A way of context parallelism the framework does not run (:data:`CP_COMM`)."""
    runs = CP_COMM.get(framework)
    chosen = training.cp_exchange
    if strategy.sp == 1 or runs is None or chosen is runs:
        return None
    offers = ("ring attention, which merges the chunks' outputs step by step"
              if runs is CpComm.P2P else "DeepSpeed-Ulysses' all-to-all")
    return (f"cp_comm {chosen.value}: {framework}'s context parallelism is {offers}; use cp_comm"
            f" {runs.value}, or framework megatron")


def _fp8_attention(framework: str, training: TrainingSpec, strategy: Strategy) -> str | None:
    """FP8 attention in a quantised plan (``fp8_attention``): Megatron-LM's command line has no
    flag for Megatron-Core's ``fp8_dot_product_attention`` (d98e8a64
    ``megatron/training/arguments.py`` leaves it out of the TransformerConfig arguments: "no CLI
    argument exists for these"; Megatron-Bridge and NeMo set it in their recipes); torchtitan's
    float8 converter swaps the linear layers only; DeepSpeed trains in bf16."""
    if not (training.fp8_attention and strategy.precision.quantized):
        return None
    return (f"fp8_attention (the fused attention in FP8): {framework}'s command line cannot set it"
            " (Megatron-Core's fp8_dot_product_attention, which Megatron-Bridge and NeMo recipes"
            " set); use framework any, or fp8_attention false")


def _any_only(framework: str, training: TrainingSpec) -> str | None:
    """Three trainings none of the three frameworks runs, so only an ``any`` study offers them.
    FSDP's ``no_sync`` accumulation (``fsdp_no_sync``): torchtitan reduce-scatters every
    micro-batch's gradients, skipping only HSDP's all-reduce. Pure 16-bit training
    (``master_weights: false``): Megatron-LM keeps fp32 or fp16 main parameters
    (``--main-params-dtype``, d98e8a64 ``megatron/training/arguments.py``), DeepSpeed's bf16 and
    ZeRO optimizers keep fp32 master weights, torchtitan keeps fp32 parameters under FSDP's
    mixed-precision policy (``mixed_precision_param`` is the compute type). A token embedding
    kept whole on every tp rank (``vocab_parallel_embedding: false``): all three split it over
    tp (Megatron-LM's and Megatron-DeepSpeed's ``VocabParallelEmbedding``, torchtitan's
    ``RowwiseParallel`` on ``tok_embeddings``)."""
    if not training.vocab_parallel_embedding:
        return (f"vocab_parallel_embedding false (the token embedding whole on every tp rank):"
                f" {framework} splits it over tp; use framework any")
    if training.fsdp_no_sync:
        return (f"fsdp_no_sync (gradients accumulated unsharded, one reduce-scatter a step):"
                f" {framework}'s ZeRO-3 reduces each micro-batch's gradients; use framework any")
    if training.master_weights:
        return None
    return (f"master_weights false (pure 16-bit training): {framework} keeps fp32 master weights;"
            " use framework any, or master weights")


def _experts(framework: str, model: ModelSpec, s: Strategy) -> str | None:
    """What each framework's mixture-of-experts layer runs. Megatron-LM: every expert-parallel
    and expert-tensor-parallel split the simcore rules allow (MoE "parallel folding",
    ``megatron/core/transformer/moe/README.md``). torchtitan: expert parallelism borrowed from
    dp_shard x cp x tp, and no expert tensor parallelism (``torchtitan/config/configs.py``
    ``expert_parallel_degree``, b5bcd76c: "dp_shard * cp * tp == efsdp * ep"). DeepSpeed-MoE:
    top-1 or top-2 gating only and expert-parallel groups carved out of data parallelism
    (``deepspeed/moe/layer.py`` ``MoE``: "k ... only supports k=1 or k=2"; ``ep_size`` divides
    the data-parallel world), experts not split over tp."""
    assert model.moe is not None
    if s.ep_dedup and framework != "megatron":
        return (f"ep_dedup: this exporter writes no deduplicated dispatcher for {framework}"
                " (Megatron-LM's --moe-token-dispatcher-type flex with DeepEP does it)")
    if s.ep_overlap and framework != "megatron":
        return (f"ep_overlap: {framework} has no overlap of the expert all-to-alls with another"
                " micro-batch's compute (Megatron-LM's --overlap-moe-expert-parallel-comm)")
    # megatron/core/transformer/transformer_config.py (d98e8a64): the overlap asserts
    # "disable full recomputation when enabling overlap_moe_expert_parallel_comm".
    if s.ep_overlap and s.recompute is Recompute.FULL:
        return ("ep_overlap with recompute full: Megatron-LM's expert-parallel overlap refuses"
                " full recomputation; it offers selective or none")
    if framework == "torchtitan" and s.expert_tp != 1:
        return (f"etp {s.expert_tp}: torchtitan has no expert tensor parallelism (it shards"
                " experts over ep and FSDP); it offers etp 1")
    if framework == "torchtitan":
        # parallel_dims.py (b5bcd76c): "expert_parallel_degree must divide dp_shard * cp * tp";
        # the export shards over dp (FSDP) for ZeRO 1-3, replicates for ZeRO 0
        dp_shard = 1 if s.zero is ZeroStage.NONE else s.dp // s.replicas
        if (dp_shard * s.sp * s.tp) % s.ep:
            return (f"ep {s.ep}: torchtitan borrows expert parallelism from dp_shard x cp x tp"
                    f" = {dp_shard} x {s.sp} x {s.tp}, which it must divide (ZeRO 0 keeps dp"
                    " replicated: use zero 1-3 to shard over dp)")
    if framework == "deepspeed":
        if model.moe.top_k > 2:
            return (f"top-{model.moe.top_k} routing: DeepSpeed-MoE's gate offers top-1 and"
                    " top-2 only")
        if s.dp % s.ep:
            return (f"ep {s.ep} with dp {s.dp}: DeepSpeed-MoE carves expert-parallel groups"
                    " out of data parallelism, so ep must divide dp")
        if s.expert_tp != 1:
            return f"etp {s.expert_tp}: DeepSpeed-MoE's experts are not split over tp; use etp 1"
        return _deepspeed_layers(model)
    return None


def _deepspeed_layers(model: ModelSpec) -> str | None:
    """Megatron-DeepSpeed's MoE layers (4efb479d): ``--expert-interval`` k puts experts on every
    k-th layer from the first group's last (``megatron/model/transformer.py``
    ``get_num_experts_per_layer``: ``layer_num % expert_interval == 0``), each expert a
    ParallelMLP of the model's ffn_hidden_size, and no shared expert beside them."""
    moe = model.moe
    assert moe is not None
    if moe.first_dense:
        return (f"first_dense {moe.first_dense}: Megatron-DeepSpeed puts experts on every"
                " expert-interval-th layer from the start; it has no leading dense layers")
    if moe.shared_experts:
        return (f"{moe.shared_experts} shared expert(s): Megatron-DeepSpeed's MoE layer has"
                " routed experts only")
    if moe.expert_ffn != model.ffn_hidden:
        return (f"expert FFN {moe.expert_ffn} != ffn_hidden {model.ffn_hidden}:"
                " Megatron-DeepSpeed's experts are the model's MLP (ffn_hidden_size)")
    return None


_NO_OFFLOAD = ("offload_layers {n}: {framework} has no option to offload the first layers'"
               " activations to host memory (Megatron-Core's --cpu-offloading-num-layers);"
               " export for megatron")
"""Activation offloading of some layers is Megatron-Core's (``model_parallel_config.py``
``cpu_offloading_num_layers``, d98e8a64); torchtitan (b5bcd76c) offloads nothing of a layer's
activations, DeepSpeed's ``cpu_checkpointing`` only the checkpointed layer inputs of a full
recompute."""


def _megatron(s: Strategy) -> str | None:
    # megatron/core/pipeline_parallel/schedules.py (d98e8a64) get_forward_backward_func: no
    # pipelining, 1F1B (forward_backward_pipelining_without_interleaving) or interleaved 1F1B;
    # there is no GPipe schedule (all forwards, then all backwards).
    if s.pp > 1 and s.schedule is Schedule.GPIPE:
        return ("schedule gpipe: Megatron-LM has no GPipe schedule; it offers 1f1b and"
                " interleaved")
    if s.schedule in ZERO_BUBBLE:
        return (f"schedule {s.schedule.value}: Megatron-LM has no zero-bubble schedule; it"
                " offers 1f1b and interleaved")
    return None


def _torchtitan(model: ModelSpec, s: Strategy) -> str | None:
    if s.offload_layers is not None:
        return _NO_OFFLOAD.format(n=s.offload_layers, framework="torchtitan")
    # The estimate prices Transformer Engine's MXFP8 (simcore.megatron.precision); torchtitan's
    # MX training goes through torchao's own kernels, which nothing here is checked on.
    if s.precision in (Precision.MXFP8, Precision.NVFP4):
        return (f"precision {s.precision.value}: the estimate prices Transformer Engine's"
                f" {s.precision.value.upper()} recipe, which torchtitan does not run (its float8"
                " converter is fp8's); export for megatron, or use precision fp8")
    # torchtitan/distributed/pipeline_parallel.py (b5bcd76c): a multi-stage schedule class (its
    # zero-bubble ones) "requires at least 2 stages per rank"; ZB-H1 has one.
    if s.schedule is Schedule.ZB_H1:
        return ("schedule zb-h1: torchtitan's zero-bubble schedules (InterleavedZeroBubble,"
                " ZBVZeroBubble) need 2+ stages per rank; it offers gpipe, 1f1b, interleaved,"
                " zbv")
    # torchtitan/distributed/activation_checkpoint.py (b5bcd76c): layer-wise selective
    # checkpointing wraps every n-th block of the model (selective_ac_option "n"), never the
    # first n of each pipeline stage.
    if s.recompute_layers is not None:
        return (f"recompute_layers {s.recompute_layers}: torchtitan checkpoints every n-th"
                " layer (selective_ac_option), not the first n of each stage; it offers"
                " recompute full of every layer, selective or none")
    # torchtitan/distributed/pipeline_parallel.py (b5bcd76c) _generate_llm_fqn_per_model_part:
    # pipeline_parallel_first/last_stage_less_layers shorten the first and last *virtual* stage
    # only (rank 0's first chunk, the last rank's last chunk), never every chunk of those ranks
    # as Megatron's split with v > 1 does, and never lengthen them.
    if not s.uneven:
        return None
    if s.layout is not None:
        return ("layout: torchtitan splits by layers_per_stage and less_layers (or module"
                " names, which this exporter does not write); it offers first / last stages"
                " one layer short")
    counts = s.stage_layers(model.layers)
    if s.v > 1 and s.short_ends(model.layers) is None:
        return (f"uneven stages with v {s.v}: torchtitan shortens only the first and last"
                " virtual stage by a layer; it offers uneven stages with 1f1b or gpipe (v 1),"
                " or with v > 1 the first / last stage one layer short of the others")
    if max(counts[0], counts[-1]) > counts[1]:
        return (f"first/last stage with {counts[0]}/{counts[-1]} layers, more than the"
                f" {counts[1]} between: torchtitan offers only shorter first and last stages")
    return None


def _deepspeed(s: Strategy, bf16: bool) -> str | None:
    if s.offload_layers is not None:
        return _NO_OFFLOAD.format(n=s.offload_layers, framework="Megatron-DeepSpeed")
    # MiCS (mics_shard_size, deepspeed/runtime/zero/config.py, edaa7221) shards ZeRO-3 only;
    # DeepSpeed's ZeRO-1 and ZeRO-2 shard over the whole data-parallel group.
    if s.replicas > 1 and s.zero is not ZeroStage.PARAMETERS:
        return (f"shard_group {s.shard_group} with zero {int(s.zero)}: DeepSpeed shards within"
                " groups (MiCS) under ZeRO 3 only; use zero 3, or no shard group")
    # deepspeed/runtime/pipe/engine.py (edaa7221): ZeRO-2 and ZeRO-3 are incompatible with the
    # pipeline engine.
    offers = "ZeRO 1 (in bf16; ZeRO 0 too in fp16)" if bf16 else "ZeRO 0 or 1"
    if s.pp > 1 and s.zero >= ZeroStage.GRADIENTS:
        return (f"zero {int(s.zero)} with pp {s.pp}: DeepSpeed's pipeline engine offers"
                f" {offers} with pp > 1")
    # deepspeed/runtime/pipe/schedule.py, as planner/exports/_deepspeed.py notes (edaa7221):
    # TrainSchedule is 1F1B with one stage per rank; no GPipe or interleaved schedule.
    if s.pp > 1 and s.schedule is not Schedule.ONE_F_ONE_B:
        return (f"schedule {s.schedule.value}: DeepSpeed's pipeline engine offers only 1f1b"
                " (TrainSchedule)")
    # docs/_tutorials/ds-sequence.md (edaa7221): DeepSpeed-Ulysses does not work with
    # Megatron's tensor or pipeline parallelism.
    if s.sp > 1 and (s.tp > 1 or s.pp > 1):
        return (f"sp {s.sp} with tp {s.tp} and pp {s.pp}: DeepSpeed-Ulysses (sp > 1) offers"
                " only tp 1 and pp 1")
    # deepspeedai/DeepSpeed#6908 (maintainer, 2025-01-02): FP8 training is "with the Transformer
    # Engine on H100s", i.e. TE layers in the user's model; the engine's own mixed precision
    # (ds_config, planner/exports/_deepspeed.py) is fp16 or bf16.
    if s.precision.quantized:
        return (f"precision {s.precision.value}: DeepSpeed has no FP8 training mode of its"
                " own; it offers bf16 and fp16 (export for megatron or torchtitan to train in"
                " fp8)")
    # deepspeed/runtime/pipe/module.py (edaa7221) PipelineModule._partition_layers: the
    # partition_method is "uniform" (layer counts), "parameters" or "type:[regex]" (balanced
    # counts of the matching layers); no method takes per-stage layer counts.
    if s.uneven:
        knob = "layout" if s.layout is not None else "first_stage_layers / last_stage_layers"
        return (f"{knob}: DeepSpeed's PipelineModule offers only its partition_method"
                " (uniform, parameters, type:regex), not set counts")
    # Megatron-DeepSpeed 4efb479d megatron/model/gpt_model.py GPTModelPipe: with pp > 1 the
    # PipelineModule checkpoints every activation_checkpoint_interval layers (uniform); only
    # its --no-pipeline-parallel model takes --recompute-method block.
    if s.recompute_layers is not None and s.pp > 1:
        return (f"recompute_layers {s.recompute_layers} with pp {s.pp}: DeepSpeed's pipeline"
                " engine checkpoints every layer alike (activation_checkpoint_interval); it"
                " offers recompute_layers with pp 1")
    # deepspeed/runtime/engine.py _do_optimizer_sanity_check (edaa7221; v0.12.6 alike): bf16
    # without ZeRO under the pipeline engine takes the BFLOAT16 wrapper, whose BF16_Optimizer
    # (bf16_optimizer.py) shards the fp32 master weights and Adam states over the data-parallel
    # ranks and all-gathers the weights after each step: ZeRO-1's memory and traffic, not
    # ZeRO-0's. (fp16 takes FP16_Optimizer, unsharded; pp 1 runs --no-pipeline-parallel, whose
    # DDP_BFLOAT16 wrapper is unsharded too.)
    if bf16 and s.pp > 1 and s.zero is ZeroStage.NONE:
        return (f"zero 0 with pp {s.pp} in bf16: DeepSpeed's pipeline engine trains bf16 with"
                " its BF16_Optimizer, which shards the optimizer over the data-parallel ranks"
                " (ZeRO 1); use zero 1")
    return None


def _deepspeed_accumulation(training: TrainingSpec, s: Strategy) -> str | None:
    # deepspeed/runtime/engine.py _do_optimizer_sanity_check (edaa7221): without ZeRO a model
    # whose gradients accumulate in another dtype raises "unsupported mix of model_dtype and
    # grad_accum_dtype"; under ZeRO 1 a bf16 model with fp32 accumulation takes BFLOAT16.
    if training.bytes_per_param_grads == 4 and s.zero is ZeroStage.NONE:
        return ("grad_bytes 4 with zero 0: DeepSpeed accumulates 16-bit models' gradients in"
                " fp32 only under ZeRO (the BF16_Optimizer at zero 1); use zero 1")
    return None
