"""Which plans a training framework can run as written: a study's ``framework:``.

:func:`why_not` gives one short reason naming the knob and what the framework offers, or None
(each framework's own rules are :mod:`search_spaces.framework_rules`'s, the rules every framework
shares are here). Each rule cites the framework source it was read from. Only refusals are
rules: where the framework runs the same plan under another name (torchtitan's FSDP that never
reshards for ZeRO-1 and ZeRO-2: the same collectives, gradients sharded too), the exporter maps
it and says so in a comment.

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

from dataclasses import fields, replace

from search_spaces import framework_rules as rules
from simcore.megatron.stack import uses_flash_attention
from simcore.specs import (
    CpComm,
    CrossEntropy,
    ModelSpec,
    Recompute,
    SelectiveRecompute,
    Strategy,
    SystemSpec,
    TrainingSpec,
)

__all__ = ["ANY", "CP_COMM", "FRAMEWORKS", "WITHOUT_TRANSFORMER_ENGINE", "cp_comm",
           "cross_entropy", "framework_training", "recompute_early_stop", "selective_recompute",
           "transformer_engine", "grad_copy", "main_grad_copy", "fp32_grad_partition",
           "with_framework_defaults", "why_not", "FRAMEWORK_FILLED", "TORCHTITAN_GRAD_BYTES",
           "given_disagrees", "megatron_loss", "pipeline_no_sync"]

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
    ZeRO stage decides (:func:`simcore.megatron.stack.uses_transformer_engine`)."""
    if framework in WITHOUT_TRANSFORMER_ENGINE:
        return False
    if framework == "megatron":
        return device_default
    return None


def recompute_early_stop(framework: str) -> bool | None:
    """The ``recompute_early_stop`` of a ``framework`` study whose training names none: off
    for the three. torchtitan's full activation checkpointing is PyTorch's non-reentrant
    ``checkpoint_wrapper`` with ``early_stop=False`` (b5bcd76c
    ``torchtitan/distributed/activation_checkpoint.py``, written so; v0.2.2's
    ``[activation_checkpoint] early_stop`` defaults to false), so each layer's recompute runs
    its whole forward, as Megatron-LM's (``tensor_parallel.checkpoint``) and DeepSpeed's
    (``deepspeed.checkpointing``) do; None for ``any``, where the plan's stack decides
    (:func:`simcore.megatron.stack.uses_recompute_early_stop`: PyTorch's default, early stop
    on, as llm-foundry runs it)."""
    if framework in ("torchtitan", "megatron", "deepspeed"):
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
    loss is PyTorch's cross-entropy on an fp32 copy of the logits, taken a slice of the tokens
    at a time by its ``ChunkedLossWrapper`` (``chunked``; main, b5bcd76c: every language
    model's config; v0.2.2 takes it whole, which its TOML export checks:
    :func:`planner.exports._torchtitan_loss.torchtitan_loss_check`); Megatron-LM's, the
    fused vocab-parallel one its recipes run (``fused``: Transformer Engine's in-place kernel,
    which Megatron-Bridge's performance scripts run, ``scripts/performance/utils/overrides.py``
    v0.3-v0.6, and whose runs fit; Megatron-LM d98e8a64 runs its
    own jit-fused one instead, ``megatron_fused``, which its export says); Megatron-DeepSpeed's,
    its own unfused one (``megatron_deepspeed``: it has no fused loss); None (fused) for
    ``any``."""
    if framework == "torchtitan":
        return CrossEntropy.CHUNKED
    if framework == "megatron":
        return CrossEntropy.FUSED
    if framework == "deepspeed":
        return CrossEntropy.MEGATRON_DEEPSPEED
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


def main_grad_copy(framework: str, training: TrainingSpec) -> bool | None:
    """The ``main_grad_copy`` of a ``framework`` study whose training names none: Megatron-LM's
    optimizers copy 16-bit gradients (``grad_bytes 2``) to fp32 for the master weights at the
    step (:attr:`simcore.specs.TrainingSpec.main_grad_copy`). Else None (off): DeepSpeed's
    and PyTorch's optimizers are priced by ``grad_copy`` and FSDP's fp32 shards."""
    if (framework == "megatron" and training.bytes_per_param_grads == 2
            and training.master_weights):
        return True
    return None


def fp32_grad_partition(framework: str, training: TrainingSpec) -> bool | None:
    """The ``fp32_grad_partition`` of a ``framework`` study whose training names none:
    DeepSpeed's mixed-precision optimizers keep an fp32 copy of their shard's 16-bit gradients
    (``grad_bytes 2``) beside the master weights
    (:attr:`simcore.specs.TrainingSpec.fp32_grad_partition`). Else None (off)."""
    if (framework == "deepspeed" and training.bytes_per_param_grads == 2
            and training.master_weights):
        return True
    return None


def async_tp_allreduce(framework: str) -> bool | None:
    """The ``async_tp_allreduce`` of a ``framework`` study whose training names none:
    Megatron-DeepSpeed turns Megatron-LM's asynchronous tp all-reduce off whenever DeepSpeed
    runs it (deepspeedai/Megatron-DeepSpeed@4efb479d ``megatron/arguments.py``), so the
    backward's tp collective waits for the layer's GEMMs
    (:attr:`simcore.specs.TrainingSpec.async_tp_allreduce`). Else None (on)."""
    return False if framework == "deepspeed" else None


def pipeline_no_sync(framework: str) -> bool | None:
    """The ``pipeline_no_sync`` of a ``framework`` study whose training names none: torchtitan
    pipelines through PyTorch's pipeline stages, which run FSDP2 without the gradient sync and
    without resharding on every micro-batch's backward but the last
    (:attr:`simcore.specs.TrainingSpec.pipeline_no_sync`). Else None (Megatron-FSDP and
    DeepSpeed, whose pipelines refuse ZeRO-3, sync as at pp 1)."""
    return True if framework == "torchtitan" else None


FRAMEWORK_FILLED = ("transformer_engine", "recompute_early_stop", "selective_recompute",
                    "cross_entropy", "cp_comm", "grad_copy", "main_grad_copy",
                    "fp32_grad_partition", "async_tp_allreduce", "pipeline_no_sync")
"""The training fields :func:`with_framework_defaults` fills where they are None; it also
turns Scaling's ``grad_all_reduce`` and ``grad_reduce_bytes`` off for a named framework, and
sets torchtitan's gradients to fp32 (:data:`TORCHTITAN_GRAD_BYTES`)."""


def given_disagrees(given: TrainingSpec, training: TrainingSpec) -> str | None:
    """The first field where ``training`` is not ``given`` filled by some framework's
    defaults (:func:`with_framework_defaults`), or None: what a plan file's two trainings
    must keep alike."""
    for f in fields(TrainingSpec):
        mine, theirs = getattr(given, f.name), getattr(training, f.name)
        if f.name in FRAMEWORK_FILLED and mine is None:
            continue  # the framework's to fill
        if f.name in ("grad_all_reduce", "grad_reduce_bytes"):
            continue
        if f.name == "bytes_per_param_grads" and theirs == TORCHTITAN_GRAD_BYTES:
            continue  # torchtitan's, whatever was written
        if mine != theirs:
            return f.name
    return None


def with_framework_defaults(training: TrainingSpec, framework: str,
                            device_transformer_engine: bool) -> TrainingSpec:
    """``training`` with what a ``framework`` study runs wherever the training names none: the
    stack (:func:`transformer_engine`), the recompute's early stop, the selective recompute,
    the loss, context parallelism's exchange (:func:`cp_comm`), the 16-bit gradient copy
    (:func:`grad_copy`), the step's fp32 one (:func:`main_grad_copy`), DeepSpeed's fp32
    gradient partition (:func:`fp32_grad_partition`) and its synchronous tp all-reduce
    (:func:`async_tp_allreduce`), FSDP under its pipelines (:func:`pipeline_no_sync`); and
    the framework's own gradient reduction, never Scaling's (``grad_all_reduce`` off,
    ``grad_reduce_bytes`` the buffer's), torchtitan's in fp32 (:data:`TORCHTITAN_GRAD_BYTES`)."""
    defaults = {
        "transformer_engine": transformer_engine(framework, device_transformer_engine),
        "recompute_early_stop": recompute_early_stop(framework),
        "selective_recompute": selective_recompute(framework),
        "cross_entropy": cross_entropy(framework),
        "cp_comm": cp_comm(framework),
        "grad_copy": grad_copy(framework, training),
        "main_grad_copy": main_grad_copy(framework, training),
        "fp32_grad_partition": fp32_grad_partition(framework, training),
        "async_tp_allreduce": async_tp_allreduce(framework),
        "pipeline_no_sync": pipeline_no_sync(framework),
    }
    named = {k: v for k, v in defaults.items() if getattr(training, k) is None}
    if framework != ANY:  # each reduces its gradients its own way, none as Scaling does
        named.update(grad_all_reduce=False, grad_reduce_bytes=None)
    if framework == "torchtitan":
        named["bytes_per_param_grads"] = TORCHTITAN_GRAD_BYTES
    return replace(training, **named)


TORCHTITAN_GRAD_BYTES = 4
"""torchtitan's FSDP reduces the gradients in float32 only: ``mixed_precision_reduce`` is
``Literal["float32"]`` (``torchtitan/config/job_config.py`` at 73a0e697,
``torchtitan/config/configs.py`` at b5bcd76c), so a torchtitan plan's gradients are 4 bytes,
whatever a study's ``grad_bytes`` left at its default says (one naming 2 is refused where it
is read)."""


def framework_training(framework: str, model: ModelSpec, system: SystemSpec,
                       training: TrainingSpec, strategy: Strategy) -> TrainingSpec:
    """``training`` as ``framework`` runs ``strategy`` (:func:`with_framework_defaults` on the
    device's stack), for one plan outside a study: ``planner estimate --framework`` and a runs
    CSV's ``framework`` column. A ValueError names the framework and :func:`why_not`'s reason
    when it cannot run the plan as written (an unknown name is :func:`why_not`'s ValueError)."""
    if framework == ANY:
        return training
    resolved = with_framework_defaults(training, framework, system.device.transformer_engine)
    refused = why_not(framework, model, resolved, strategy, bf16=system.device.bf16,
                      flash=uses_flash_attention(model, system, resolved))
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
            strategy: Strategy, *, bf16: bool = True, flash: bool = False) -> str | None:
    """Why ``framework`` cannot run ``strategy`` as written, or None if it can (``bf16``: the
    device trains in bf16, not fp16 with loss scaling: :attr:`simcore.specs.DeviceSpec.bf16`;
    ``flash``: the plan's attention is flash attention,
    :func:`simcore.megatron.uses_flash_attention`)."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"unknown framework {framework!r}; use one of {', '.join(FRAMEWORKS)}")
    if framework != ANY and model.moe is not None:
        refused = rules.experts(framework, model, strategy)
        if refused is not None:
            return refused
    if framework == "megatron":
        refused = rules.megatron(strategy)
    elif framework == "deepspeed":
        refused = (rules.deepspeed(strategy, bf16)
                   or rules.deepspeed_accumulation(training, strategy))
    elif framework == "torchtitan":
        refused = rules.torchtitan(model, strategy)
    else:
        return None  # any
    refused = (refused or _cp_comm(framework, training, strategy)
               or _cp_chunks(framework, training, strategy)
               or _fp8_attention(framework, training, strategy) or _cuda_graphs(framework, training)
               or _any_only(framework, training) or _loss(framework, training))
    refused = refused or _selective(framework, training, strategy)
    if refused is None and framework == "deepspeed":  # after per-op's, the more telling
        refused = rules.deepspeed_selective(strategy, flash)
    if refused is None and framework == "torchtitan":  # after the rules that name a knob
        refused = rules.torchtitan_zero(strategy)
    return refused


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


def _cp_chunks(framework: str, training: TrainingSpec, strategy: Strategy) -> str | None:
    """Megatron-LM cuts each sequence into 2 x cp chunks (two a rank, for causal balance) and
    refuses a sequence length that is not a multiple of it (d98e8a64
    ``megatron/training/arguments.py``: "seq-length should be a multiple of 2 *
    context-parallel-size"; ``megatron/core/utils.py`` ``get_batch_on_this_cp_rank``)."""
    chunks = 2 * strategy.sp
    if framework != "megatron" or strategy.sp == 1 or training.seq_len % chunks == 0:
        return None
    return (f"sequence length {training.seq_len} with cp {strategy.sp}: Megatron-LM needs a"
            f" multiple of 2 x cp = {chunks}")


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


def _cuda_graphs(framework: str, training: TrainingSpec) -> str | None:
    """Layers captured as CUDA graphs (``cuda_graphs``): Megatron-LM's ``--cuda-graph-impl``
    (its export writes ``local``). torchtitan's export writes ``disable_cuda_graphs=True``
    (its trainer captures forward and backward by default since f84224af, which pipelines and
    the MoE all-to-all dispatcher refuse), so it runs eager, as does this project's DeepSpeed
    export."""
    if not training.cuda_graphs or framework == "megatron":
        return None
    return (f"cuda_graphs (each layer captured as a CUDA graph): {framework} as exported here"
            " issues every kernel from the host; use framework megatron, or cuda_graphs false")


def _loss(framework: str, training: TrainingSpec) -> str | None:
    """Megatron-LM's loss is its vocab-parallel cross-entropy, fused
    (``--cross-entropy-loss-fusion``, :attr:`simcore.specs.CrossEntropy.MEGATRON_FUSED`) or not
    (d98e8a64 ``megatron/core/model_parallel_config.py`` ``cross_entropy_loss_fusion``): not
    PyTorch's on an fp32 copy of the logits, nor one on logits gathered whole to every tp rank,
    Megatron-DeepSpeed's is its own, unfused
    (:attr:`simcore.specs.CrossEntropy.MEGATRON_DEEPSPEED`)."""
    return megatron_loss(training.cross_entropy) if framework == "megatron" else None


def megatron_loss(loss: CrossEntropy | None) -> str | None:
    """Why Megatron-LM does not run ``loss`` (:func:`_loss`), or None if it does."""
    if loss in (None, CrossEntropy.FUSED, CrossEntropy.MEGATRON_FUSED, CrossEntropy.MEGATRON):
        return None
    return (f"cross_entropy {loss.value}: Megatron-LM's loss is its vocab-parallel one, fused"
            " or not (cross_entropy: fused, megatron_fused or megatron)")


def _any_only(framework: str, training: TrainingSpec) -> str | None:
    """Three trainings none of the three frameworks runs, so only an ``any`` study offers them.
    FSDP's ``no_sync`` accumulation (``fsdp_no_sync``): torchtitan reduce-scatters every
    micro-batch's gradients at pp 1, skipping only HSDP's all-reduce (its pipelines accumulate:
    ``pipeline_no_sync``). Pure 16-bit training
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
                f" {framework}'s ZeRO-3 reduces each micro-batch's gradients (torchtitan's at"
                " pp 1; its pipelines accumulate, as pipeline_no_sync prices); use framework"
                " any")
    if training.master_weights:
        return None
    return (f"master_weights false (pure 16-bit training): {framework} keeps fp32 master weights;"
            " use framework any, or master weights")
