"""``--format megatron``: a bash script that launches Megatron-LM's ``pretrain_gpt.py`` on a plan.

Option names were checked in NVIDIA/Megatron-LM at commit d98e8a64 (2026-08-22):

- ``megatron/training/arguments.py``: ``--seq-length``, ``--max-position-embeddings``,
  ``--group-query-attention``, ``--swiglu``, ``--untie-embeddings-and-output-weights``,
  ``--attention-dropout``, ``--hidden-dropout`` (0.1 by default),
  ``--position-embedding-type``, ``--attention-backend`` (flash, unfused, ...),
  ``--num-layers-per-virtual-pipeline-stage`` (and
  ``--num-virtual-stages-per-pipeline-rank``; ``virtual_pipeline_model_parallel_size`` is on its
  list of fields with no command-line option), ``--use-distributed-optimizer``,
  ``--overlap-grad-reduce``, ``--data-parallel-sharding-strategy``; its checks that tensor or
  context parallelism needs ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (before Blackwell) and that
  Megatron-FSDP needs it unset and ``--ckpt-format fsdp_dtensor``.
- Options generated from dataclass fields by ``megatron/training/argument_utils.py``
  (``field_name`` -> ``--field-name``): ``megatron/core/model_parallel_config.py``
  (``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
  ``--context-parallel-size``, ``--sequence-parallel``, ``--bf16``),
  ``megatron/core/transformer/transformer_config.py`` (``--num-layers``, ``--hidden-size``,
  ``--ffn-hidden-size``, ``--num-attention-heads``, ``--num-query-groups``, ``--normalization``,
  ``--disable-bias-linear``, ``--recompute-granularity``, ``--recompute-method``,
  ``--recompute-num-layers``), ``megatron/training/config/training_config.py``
  (``--micro-batch-size``, ``--global-batch-size``) and
  ``megatron/training/config/common_config.py`` (``--use-megatron-fsdp``, ``--use-torch-fsdp2``).
- ``docs/user-guide/features/megatron_fsdp.md``: Megatron-FSDP is ``--use-megatron-fsdp`` with
  ``--data-parallel-sharding-strategy optim_grads`` (ZeRO-2) or ``optim_grads_params`` (ZeRO-3)
  and sets the distributed optimizer itself.

- Uneven pipeline stages: ``--decoder-first-pipeline-num-layers`` /
  ``--decoder-last-pipeline-num-layers`` (``arguments.py``; ``transformer_config.py`` "Uneven
  PP" checks that the middle stages split the rest evenly and, with virtual stages, that v
  divides every stage's count; ``--num-virtual-stages-per-pipeline-rank`` gives v then).

- fp8 (``megatron/core/transformer/transformer_config.py``: ``fp8`` is ``--fp8-format``,
  ``fp8_recipe`` one of tensorwise, delayed, mxfp8, blockwise): ``--fp8-format hybrid
  --fp8-recipe tensorwise``, per-tensor current scaling, as Megatron-Bridge's H100 FP8 presets
  ("FP8-CS": ``src/megatron/bridge/training/mixed_precision.py``
  ``bf16_with_fp8_current_scaling_mixed``) ran the measured FP8 runs the estimate is checked on
  (``tests/data/validation``: h100-megatron-check, moe-check). The MoE layer's FP8 costs are
  that recipe's (:data:`simcore.megatron.moe.QUANTIZE_KERNELS`); Megatron-LM's default,
  delayed scaling, fuses the experts' casts. Transformer Engine runs the linear layers in FP8;
  ``--transformer-impl transformer_engine`` is the default. mxfp8: ``--fp8-format e4m3
  --fp8-recipe mxfp8`` with ``--fp8-param-gather --reuse-grad-buf-for-mxfp8-param-ag`` under
  the distributed optimizer, Megatron-Bridge's ``bf16_with_mxfp8_mixed``; nvfp4: ``--fp4-format
  e2m1 --fp4-recipe nvfp4``, its ``bf16_with_nvfp4_mixed``.

Plans Megatron-LM cannot run (GPipe) are refused: :func:`search_spaces.frameworks.why_not`.
"""

from __future__ import annotations

from planner.exports._megatron_model import (
    attention_backend,
    cudnn_attention,
    model_args,
    precision_args,
)
from planner.exports._reprice import fused_loss_args, run_by, stack_check
from planner.exports.moe_args import megatron_moe_args
from planner.plan import Plan
from planner.units import GB
from search_spaces.frameworks import why_not
from simcore.layout import format_layout
from simcore.megatron import uses_flash_attention
from simcore.megatron.stack import (
    uses_quantized_params,
    uses_tp_comm_overlap,
    uses_transformer_engine,
)
from simcore.specs import (
    Activation,
    CpComm,
    CrossEntropy,
    Family,
    Precision,
    Recompute,
    RecomputeModule,
    Schedule,
    ZeroStage,
)

__all__ = [
    "export_megatron",
    "header_lines",
    "micro_batches",
    "model_args",
    "precision_args",
    "recompute_args",
]

SOURCE = "NVIDIA/Megatron-LM d98e8a64 (2026-08-22), megatron/training/arguments.py"
_FSDP = {ZeroStage.GRADIENTS: ("optim_grads", "gradients and optimizer state"),
         ZeroStage.PARAMETERS: ("optim_grads_params", "parameters, gradients and optimizer state")}
"""ZeRO stage -> Megatron-FSDP's --data-parallel-sharding-strategy (megatron_fsdp.md)."""


# -- shared with the other framework exporters ------------------------------------------------
def micro_batches(plan: Plan) -> int:
    """Micro-batches per step on each data-parallel replica: global / (micro_batch * dp)."""
    s, batch = plan.strategy, plan.training.global_batch
    if batch % (s.micro_batch * s.dp):
        raise ValueError(f"global_batch={batch} is not a multiple of micro_batch * dp ="
                         f" {s.micro_batch} * {s.dp}")
    return batch // (s.micro_batch * s.dp)


def header_lines(plan: Plan) -> list[str]:
    """What the plan is and what it was estimated to cost (no comment markers)."""
    est, s = plan.estimate, plan.strategy
    lines = [f"Parallel Planner plan: {plan.label}",
             (f"model {plan.model.name} on {plan.system.name} ({plan.system.devices} devices),"
             f" global batch {plan.training.global_batch} x seq {plan.training.seq_len}")]
    if plan.study is not None:
        lines.append(f"from study {plan.study}, trial {plan.trial}")
    reason = " ".join(est.reason.split())  # one line, whatever the reason holds
    fits = "fits" if est.fits else f"does NOT fit: {reason}"
    lines.append(f"estimate: step time {est.step_time:.3f} s,"
                 f" peak memory {est.peak_memory / GB:.1f} GB ({fits})")
    lines.append(f"world size = dp * tp * pp * sp = {s.dp} * {s.tp} * {s.pp} * {s.sp}"
                 f" = {s.devices}")
    return lines


# -- the script -------------------------------------------------------------------------------
def export_megatron(plan: Plan) -> dict[str, str]:
    """``megatron.sh``: torchrun + ``pretrain_gpt.py`` with the plan's arguments; raises
    ValueError if Megatron-LM cannot run the plan."""
    plan = run_by(plan, "megatron")
    refused = why_not("megatron", plan.model, plan.training, plan.strategy)
    if refused is not None:
        raise ValueError(refused)
    return {"megatron.sh": _script(plan, stack_check(plan, "megatron"))}


def _script(plan: Plan, repriced: str | None = None) -> str:
    lines = ["#!/usr/bin/env bash", *(f"# {h}" for h in header_lines(plan)),
             *([f"# {repriced}"] if repriced else []),
             f"# Option names: {SOURCE}.",
             "# Add data, tokenizer and optimizer arguments after the script's name, e.g.",
             "#   ./megatron.sh --data-path ... --tokenizer-type ... --train-iters ... --lr ...",
             "set -euo pipefail", ""]
    lines += _launcher(plan)
    lines += ["", "ARGS=("]
    flash = uses_flash_attention(plan.model, plan.system, plan.training)
    s = plan.strategy
    sections = [_parallel_args(plan), _batch_args(plan),
                recompute_args(s.recompute, s.recompute_layers,
                               plan.training.recompute_modules), _data_parallel_args(plan),
                model_args(plan.model, plan.training.seq_len, attention_backend(
                    flash, cudnn_attention(plan.system, plan.training, s.zero)),
                    plan.system.device.bf16),
                megatron_moe_args(plan)]
    sections.append(_stack_args(plan))
    if s.offload_layers is not None:
        # model_parallel_config.py (d98e8a64): cpu_offloading_num_layers > 0 sets cpu_offloading
        sections.append([f"# the first {s.offload_layers} layers offload their activations to"
                         " host memory", f"--cpu-offloading-num-layers {s.offload_layers}"])
    if plan.training.cuda_graphs:
        # megatron/core/transformer/moe/README.md (d98e8a64): "--cuda-graph-impl=local: Captures
        # per-layer cuda graphs using the MCore-internal cuda graph manager"
        sections.append(["# each layer captured as a CUDA graph", "--cuda-graph-impl local"])
    if not plan.training.swiglu_fusion and plan.model.activation is Activation.SWIGLU:
        # SiLU and the product as two kernels (arguments.py: --no-bias-swiglu-fusion)
        sections.append(["--no-bias-swiglu-fusion"])
    if not plan.training.rope_fusion and plan.model.family is Family.LLAMA:
        # the rotary embedding as PyTorch's ops (arguments.py: --no-rope-fusion)
        sections.append(["--no-rope-fusion"])
    if plan.strategy.precision is not Precision.BF16:
        sections.append(precision_args(
            plan.strategy.precision,
            param_gather=uses_quantized_params(plan.system, plan.training, plan.strategy),
            fsdp=plan.strategy.zero is ZeroStage.PARAMETERS))
    for section in filter(None, sections):
        lines += [f"  {a}" for a in section] + [""]
    lines[-1] = ")"
    lines += ["", 'torchrun "${TORCHRUN_ARGS[@]}" pretrain_gpt.py "${ARGS[@]}" "$@"']
    return "\n".join(lines) + "\n"


def _stack_args(plan: Plan) -> list[str]:
    """The layers' implementation and the loss the plan was priced with (d98e8a64:
    ``transformer_impl`` defaults to ``transformer_engine`` in ``transformer_config.py``,
    ``cross_entropy_loss_fusion`` to False in ``model_parallel_config.py``)."""
    args = []
    flash = uses_flash_attention(plan.model, plan.system, plan.training)
    if uses_transformer_engine(plan.system, plan.training, plan.strategy.zero):
        pass  # Megatron-LM's default
    elif flash:  # the local layers' attention is DotProductAttention, unfused (backends.py)
        args.append("# Transformer Engine's layers (the default): Megatron-Core's own have no"
                    " flash attention, which the plan was priced with (its GEMMs at the classic"
                    " stack's rate)")
    else:
        args += ["# Megatron-Core's own layers, as estimated (no Transformer Engine)",
                 "--transformer-impl local"]
    if plan.training.cross_entropy is CrossEntropy.MEGATRON_FUSED:
        args += ["# the jit-fused vocab-parallel loss, as estimated (10 bytes a logit)",
                 "--cross-entropy-loss-fusion"]
    elif plan.training.cross_entropy in (None, CrossEntropy.FUSED):
        args += fused_loss_args(plan)
    else:  # CrossEntropy.MEGATRON (search_spaces.frameworks refuses the others)
        args.append("# Megatron-LM's unfused loss, its default, as estimated")
    return args


def _launcher(plan: Plan) -> list[str]:
    s = plan.strategy
    per_node = 8 if s.devices % 8 == 0 else s.devices
    lines = [f"WORLD_SIZE={s.devices}  # dp*tp*pp*sp",
             f"GPUS_PER_NODE=${{GPUS_PER_NODE:-{per_node}}}",
             "NNODES=$(( WORLD_SIZE / GPUS_PER_NODE ))"]
    if s.zero in _FSDP:
        lines += ["# Megatron-FSDP needs CUDA_DEVICE_MAX_CONNECTIONS unset (or > 1).",
                  "unset CUDA_DEVICE_MAX_CONNECTIONS"]
    elif s.tp > 1 or s.sp > 1:
        lines += ["# Tensor or context parallelism needs this before Blackwell.",
                  "export CUDA_DEVICE_MAX_CONNECTIONS=1"]
    lines += ["TORCHRUN_ARGS=(",
              ('  --nproc_per_node "$GPUS_PER_NODE" --nnodes "$NNODES"'
              ' --node_rank "${NODE_RANK:-0}"'),
              '  --master_addr "${MASTER_ADDR:-localhost}" --master_port "${MASTER_PORT:-6000}"',
              ")"]
    return lines


def _parallel_args(plan: Plan) -> list[str]:
    s, layers = plan.strategy, plan.model.layers
    args = [("# parallelism (data parallel = world / (tp * pp * cp), here "
            f"{s.devices} / ({s.tp} * {s.pp} * {s.sp}) = {s.dp})"),
            f"--tensor-model-parallel-size {s.tp}",
            f"--pipeline-model-parallel-size {s.pp}",
            f"--context-parallel-size {s.sp}"]
    if s.sp > 1 and plan.training.cp_exchange is not CpComm.P2P:
        # arguments.py --cp-comm-type (d98e8a64): p2p (the default), a2a, allgather, a2a+p2p
        args.append("--cp-comm-type "
                    + ("allgather" if plan.training.cp_comm is CpComm.ALL_GATHER else "a2a"))
    if s.tp > 1 and s.sequence_parallel:
        args.append("--sequence-parallel")
        if uses_tp_comm_overlap(plan.system, plan.training, s):
            # model_parallel_config.py tp_comm_overlap (d98e8a64; arguments.py: needs
            # --sequence-parallel): the estimate hides tp behind the GEMMs as TE does (not in
            # NVFP4, whose all-gathers TE's userbuffers do not take)
            args += [("# tp all-gathers / reduce-scatters overlapped with the GEMMs"
                      " (TE userbuffers)"), "--tp-comm-overlap"]
    if s.pp > 1 and s.schedule is Schedule.ONE_F_ONE_B:
        args.append("# 1F1B is Megatron's default schedule when pp > 1")
    if s.uneven:
        args += _uneven_args(plan)
    if s.schedule is Schedule.INTERLEAVED and s.layout is not None:
        args.append(f"# interleaved 1F1B, v={s.v} model chunks per rank: the layout's"
                    f" {len(s.layout)} stages / pp {s.pp}")
    elif s.schedule is Schedule.INTERLEAVED and s.uneven:
        # arguments.py (d98e8a64): with uneven stages, v must be given as the virtual stages
        # per rank, not as layers per virtual stage.
        args += [f"# interleaved 1F1B, v={s.v} model chunks per rank (each stage's layers / v)",
                 f"--num-virtual-stages-per-pipeline-rank {s.v}"]
    elif s.schedule is Schedule.INTERLEAVED:
        per_chunk = layers // (s.pp * s.v)
        args += [(f"# interleaved 1F1B, v={s.v} model chunks per rank: layers / (pp * v) ="
                 f" {layers} / ({s.pp} * {s.v})"),
                 ("# (same as --num-virtual-stages-per-pipeline-rank "
                 f"{s.v}; give only one of them)"),
                 f"--num-layers-per-virtual-pipeline-stage {per_chunk}"]
    return args


def _uneven_args(plan: Plan) -> list[str]:
    """Megatron-LM's uneven pipeline split (``transformer_config.py`` d98e8a64, "Uneven PP": the
    stages without a set count split the rest evenly; ``argument_utils.py`` maps the options to
    ``num_layers_in_first/last_pipeline_stage``). The embedding and the LM head stay on the first
    and last stage on top of their layers, as the estimate counts them. With v > 1 a first /
    last stage one layer short of the others' multiple of v is Megatron's
    ``--account-for-embedding/loss-in-pipeline-split`` (:meth:`Strategy.short_ends`)."""
    s = plan.strategy
    counts = s.stage_layers(plan.model.layers)
    args = [f"# uneven stages: {' + '.join(_runs(counts))} = {plan.model.layers} layers"]
    if s.layout is not None:
        # pipeline_parallel_layer_layout.py (d98e8a64): virtual stage i on rank i % pp
        return args + ["# every virtual stage's layers (E embedding, t layer, L loss)",
                       f"--pipeline-model-parallel-layout '{format_layout(s.layout)}'"]
    ends = s.short_ends(plan.model.layers)
    if ends is not None:
        # transformer_block.py get_num_layers_to_build (d98e8a64): the embedding / loss counts
        # as a layer, (layers + ends) / pp per stage, one fewer in the first / last virtual stage
        slots = counts[0] + ends[0]
        args.append(f"# with v={s.v}: {slots} slots per stage, the embedding and / or loss"
                    " taking one in the first / last virtual stage")
        if ends[0]:
            args.append("--account-for-embedding-in-pipeline-split")
        if ends[1]:
            args.append("--account-for-loss-in-pipeline-split")
        return args
    if s.first_stage_layers is not None:
        args.append(f"--decoder-first-pipeline-num-layers {s.first_stage_layers}")
    if s.last_stage_layers is not None:
        args.append(f"--decoder-last-pipeline-num-layers {s.last_stage_layers}")
    return args


def _runs(counts: tuple[int, ...]) -> list[str]:
    """``7, 8, 8, 7`` as ``["7", "2 x 8", "7"]``."""
    out: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        out.append(str(counts[i]) if j - i == 1 else f"{j - i} x {counts[i]}")
        i = j
    return out


def _batch_args(plan: Plan) -> list[str]:
    s = plan.strategy
    return [(f"# batch: {micro_batches(plan)} micro-batches per step per replica"
            f" = {plan.training.global_batch} / ({s.micro_batch} * {s.dp})"),
            f"--micro-batch-size {s.micro_batch}",
            f"--global-batch-size {plan.training.global_batch}"]


def recompute_args(r: Recompute, layers: int | None = None,
                   modules: tuple[RecomputeModule, ...] | None = None) -> list[str]:
    """Megatron-LM's options for one activation-recompute choice, with a comment line;
    ``layers``: recompute only the first ``layers`` of each stage (model chunk) under full;
    ``modules``: what selective recompute runs again (``--recompute-modules``)."""
    if r is Recompute.SELECTIVE and modules is not None:
        names = " ".join(m.value for m in modules)
        return [f"# selective recompute of {names}", "--recompute-granularity selective",
                f"--recompute-modules {names}"]
    if r is Recompute.SELECTIVE:
        return ["# selective recompute: the attention core (Megatron's default recompute module)",
                "--recompute-granularity selective"]
    if r is Recompute.FULL and layers is not None:
        return [f"# full recompute of the first {layers} layers of each pipeline stage (model"
                " chunk); the others keep their activations",
                "--recompute-granularity full",
                "--recompute-method block",
                f"--recompute-num-layers {layers}"]
    if r is Recompute.FULL:
        return ["# full recompute: keep each layer's input, recompute the layer in backward",
                "--recompute-granularity full",
                "--recompute-method uniform",
                "--recompute-num-layers 1"]
    return ["# no activation recompute"]


def _data_parallel_args(plan: Plan) -> list[str]:
    zero = plan.strategy.zero
    if zero is ZeroStage.NONE:
        args = ["# ZeRO 0: plain data parallel, every rank holds the optimizer state"]
    elif zero in _FSDP:
        args = [f"# ZeRO {int(zero)}: Megatron-FSDP shards {_FSDP[zero][1]} and turns on the",
                "# distributed optimizer itself (--use-torch-fsdp2 is the PyTorch FSDP2",
                "# alternative; it needs pp=1)",
                "--use-megatron-fsdp",
                f"--data-parallel-sharding-strategy {_FSDP[zero][0]}",
                "--ckpt-format fsdp_dtensor"]
        args += _hsdp_args(plan)
    else:
        args = ["# ZeRO 1: Megatron's distributed optimizer shards the optimizer state",
                "# (fp32 master weights, Adam moments) over data-parallel ranks: ZeRO-1-like",
                "--use-distributed-optimizer"]
        args += _optimizer_instances_args(plan)
    if zero in _FSDP:
        args += _fsdp_gradient_args(plan.training.bytes_per_param_grads)
    else:
        args += gradient_args(plan.training.bytes_per_param_grads, plan.system.device.bf16)
    if plan.training.overlap_grad_reduce:
        args.append("--overlap-grad-reduce")
        if zero is ZeroStage.OPTIMIZER:
            # the estimate hides the updated shards' all-gather beside the next step's forward
            # as it hides the reduce-scatter beside the backward; without this flag the
            # distributed optimizer gathers them after the step, exposed
            # (megatron/training/arguments.py d98e8a64: it needs --overlap-grad-reduce)
            args.append("--overlap-param-gather")
    return args


def _fsdp_gradient_args(grad_bytes: int) -> list[str]:
    """Megatron-FSDP's gradients in the type estimated: its main gradients take the model's
    compute type (bf16) unless told otherwise (d98e8a64 ``--megatron-fsdp-main-grads-dtype``,
    default ``auto``; ``megatron_fsdp/mixed_precision.py`` ``MixedPrecisionPolicy``: None
    "will match the dtype of the model compute parameters"), and ``--grad-reduce-in-bf16``
    and Megatron-LM's fp32 default are not read by it."""
    if grad_bytes == 4:
        return ["# fp32 main gradients (4 bytes a parameter), as estimated: Megatron-FSDP's",
                "# follow the bf16 weights unless told",
                "--megatron-fsdp-main-grads-dtype fp32"]
    return ["# gradients accumulated and reduced in bf16 (2 bytes a parameter), as estimated:",
            "# Megatron-FSDP's default (main gradients in the weights' type)"]


def gradient_args(grad_bytes: int, bf16: bool) -> list[str]:
    """The gradients' type as estimated (``grad_bytes``), training in bf16 or fp16. Megatron-LM
    keeps fp32 main gradients in bf16 training unless told to reduce in bf16, and 16-bit ones in
    fp16 training unless told to accumulate in fp32 (d98e8a64 ``megatron/training/arguments.py``:
    ``if args.bf16`` turns ``accumulate_allreduce_grads_in_fp32`` on unless
    ``--grad-reduce-in-bf16``)."""
    fp32 = grad_bytes == 4
    if bf16:
        if fp32:
            return ["# fp32 main gradients (4 bytes a parameter): Megatron-LM's bf16 default"]
        return ["# gradients accumulated and reduced in bf16 (2 bytes a parameter), as estimated;",
                "# Megatron-LM's default is fp32 main gradients (a study's grad_bytes: 4)",
                "--grad-reduce-in-bf16"]
    if fp32:
        return ["# fp32 main gradients (4 bytes a parameter), as estimated",
                "--accumulate-allreduce-grads-in-fp32"]
    return ["# fp16 gradients (2 bytes a parameter): Megatron-LM's fp16 default"]


def _optimizer_instances_args(plan: Plan) -> list[str]:
    """A distributed optimizer sharded within groups (``shard_group`` with ZeRO 1):
    ``--num-distributed-optimizer-instances R`` keeps R copies of it, each sharded over the
    intra-instance dp * cp group of dp * cp / R ranks; the gradients are reduce-scattered
    within an instance and all-reduced across the instances
    (``megatron/core/distributed/param_and_grad_buffer.py``, d98e8a64)."""
    s = plan.strategy
    if s.replicas == 1:
        return []
    return [(f"# optimizer state sharded within {s.shard_ranks} ranks (dp*cp / instances),"
             f" {s.replicas} copies"),
            f"--num-distributed-optimizer-instances {s.replicas}"]


def _hsdp_args(plan: Plan) -> list[str]:
    """Megatron-FSDP's hybrid sharding (d98e8a64): ``--num-distributed-optimizer-instances R``
    turns HSDP on (``mcore_fsdp_adapter.py``: ``enable_hsdp = num_distributed_optimizer_instances
    > 1``), sharding over the intra-instance dp * cp group of dp * cp / R ranks
    (``parallel_state.py``) and replicating across R (``--outer-dp-sharding-strategy no_shard``,
    the default)."""
    s = plan.strategy
    if s.replicas == 1:
        return []
    return [(f"# HSDP: shard within {s.shard_ranks} ranks (dp*cp / instances), replicate x"
             f" {s.replicas}"),
            f"--num-distributed-optimizer-instances {s.replicas}",
            "--outer-dp-sharding-strategy no_shard"]
