"""``--format deepspeed``: a DeepSpeed config JSON and a README for what lives outside it.

Key names were checked in deepspeedai/DeepSpeed at commit edaa7221 (2026-08-22):

- ``docs/_pages/config-json.md`` and ``deepspeed/runtime/constants.py``: ``train_batch_size``,
  ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``, ``bf16.enabled``,
  ``gradient_clipping``, ``steps_per_print``, ``activation_checkpointing`` and its keys
  (``deepspeed/runtime/activation_checkpointing/config.py``).
- ``deepspeed/runtime/constants.py``: ``data_types.grad_accum_dtype`` (fp32 for a plan with
  4-byte gradients).
- ``deepspeed/runtime/zero/config.py``: ``zero_optimization`` keys ``stage``, ``overlap_comm``
  (default: on for stage 3 only), ``contiguous_gradients``, ``reduce_scatter``,
  ``allgather_partitions``.
- ``deepspeed/runtime/config.py`` ``_batch_assertion``: ``train_batch_size ==
  train_micro_batch_size_per_gpu * gradient_accumulation_steps * world_size``, where
  ``world_size`` is ``mpu.get_data_parallel_world_size()`` when a model-parallel unit is given
  (Megatron-DeepSpeed gives one: data parallel = world / (tp * pp * sp), the plan's dp).
- ``deepspeed/runtime/pipe/engine.py``: ZeRO-2 and ZeRO-3 are incompatible with DeepSpeed's
  pipeline engine; ``deepspeed/runtime/engine.py``: it turns ``overlap_comm`` off under pipeline
  parallelism for stages 1 and 2.

Plans DeepSpeed cannot run (ZeRO 2-3, GPipe or interleaved with pp > 1; Ulysses with tp or pp)
are refused: :func:`search_spaces.frameworks.why_not`.

Launcher options (``deepspeed-launch.txt``) were checked in deepspeedai/Megatron-DeepSpeed at commit
4efb479d (2025-07-16), ``megatron/arguments.py``: ``--tensor-model-parallel-size``,
``--pipeline-model-parallel-size``, ``--no-pipeline-parallel``, ``--sequence-parallel``,
``--ds-sequence-parallel-size`` (DeepSpeed-Ulysses, "cannot be combined with
--sequence-parallel"), ``--zero-stage``, ``--recompute-granularity``,
``--deepspeed-activation-checkpointing``, and for mixture of experts ``--num-experts``,
``--topk``, ``--expert-interval``, ``--moe-expert-parallel-size``,
``--moe-train-capacity-factor``; and
DeepSpeed's ``--deepspeed --deepspeed_config`` (``deepspeed/__init__.py``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from planner.exports._megatron import header_lines, micro_batches
from planner.exports._reprice import run_by, stack_check
from planner.plan import Plan
from search_spaces.frameworks import why_not
from simcore import estimate
from simcore.megatron.stack import elementwise_fusions, uses_flash_attention
from simcore.specs import Activation, CrossEntropy, Family, Precision, Recompute, ZeroStage

__all__ = ["ds_config", "export_deepspeed"]

SOURCE = "deepspeedai/DeepSpeed edaa7221 (2026-08-22), docs/_pages/config-json.md"
LAUNCHER_SOURCE = "deepspeedai/Megatron-DeepSpeed 4efb479d (2025-07-16), megatron/arguments.py"


def export_deepspeed(plan: Plan) -> dict[str, str]:
    """``ds_config.json`` (the JSON DeepSpeed reads) and ``deepspeed-launch.txt`` (the rest);
    raises ValueError if DeepSpeed cannot run the plan."""
    # Megatron-DeepSpeed's launcher runs its own loss whatever the study named (an `any` study
    # of Hugging Face models under DeepSpeed may price PyTorch's): its figures are the files'
    plan = run_by(plan, "deepspeed")
    plan = replace(plan, training=replace(plan.training,
                                          cross_entropy=CrossEntropy.MEGATRON_DEEPSPEED))
    refused = why_not("deepspeed", plan.model, plan.training, plan.strategy,
                      bf16=plan.system.device.bf16,
                      flash=uses_flash_attention(plan.model, plan.system, plan.training))
    if refused is not None:
        raise ValueError(refused)
    if plan.model.moe is not None and plan.strategy.precision is not Precision.BF16:
        raise ValueError(f"{plan.model.name} in {plan.strategy.precision.value}: DeepSpeed-MoE"
                         " trains in 16-bit; export the bf16 plan")
    config = ds_config(plan)
    return {"ds_config.json": json.dumps(config, indent=2) + "\n",
            "deepspeed-launch.txt": _readme(plan, config, stack_check(plan, "deepspeed"))}


def ds_config(plan: Plan) -> dict[str, Any]:
    """The DeepSpeed config as data; raises ValueError if the batch identity would not hold."""
    s = plan.strategy
    gas = micro_batches(plan)
    config: dict[str, Any] = {
        "train_batch_size": plan.training.global_batch,
        "train_micro_batch_size_per_gpu": s.micro_batch,
        "gradient_accumulation_steps": gas,
        # fp16 (dynamic loss scaling) on parts without bf16 tensor cores
        ("bf16" if plan.system.device.bf16 else "fp16"): {"enabled": True},
        "zero_optimization": _zero(plan),
        "gradient_clipping": 1.0,
        "steps_per_print": 10,
    }
    if plan.training.bytes_per_param_grads == 4:
        # fp32 gradient accumulation (docs/_pages/config-json.md "data_types"): under ZeRO 1 a
        # bf16 model takes the BF16_Optimizer, priced with its 16-bit .grad copy (grad_copy)
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    if s.recompute is not Recompute.NONE:
        config["activation_checkpointing"] = {
            "partition_activations": False,
            "cpu_checkpointing": False,
            "contiguous_memory_optimization": False,
            "number_checkpoints": None,
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        }
    if plan.model.moe is not None and s.pp > 1 and s.tp > 1:
        # deepspeed/runtime/pipe/engine.py asserts on an activation that requires grad (the MoE
        # layers pass the auxiliary loss on) while pipe_partitioned and grad_partitioned hold,
        # which both default true with tp > 1 (runtime/config.py)
        config["pipeline"] = {"pipe_partitioned": False, "grad_partitioned": False}
    _check_batch(config, s.dp)
    return config


def _zero(plan: Plan) -> dict[str, Any]:
    s = plan.strategy
    if s.zero is ZeroStage.NONE:
        return {"stage": 0}
    # DeepSpeed turns overlap_comm off itself for stages 1-2 under its pipeline engine.
    overlap = plan.training.overlap_grad_reduce and (s.pp == 1 or s.zero is ZeroStage.PARAMETERS)
    zero = {"stage": int(s.zero), "overlap_comm": overlap, "contiguous_gradients": True,
            "reduce_scatter": True, "allgather_partitions": True}
    return zero


def _check_batch(config: dict[str, Any], dp: int) -> None:
    """DeepSpeed's ``_batch_assertion``: train_batch == micro * gas * data-parallel size."""
    batch = config["train_batch_size"]
    micro = config["train_micro_batch_size_per_gpu"]
    gas = config["gradient_accumulation_steps"]
    if batch != micro * gas * dp:
        raise ValueError(f"train_batch_size {batch} != micro {micro} * gas {gas} * dp {dp}")


# -- deepspeed-launch.txt -----------------------------------------------------------------------
def _readme(plan: Plan, config: dict[str, Any], repriced: str | None = None) -> str:
    s = plan.strategy
    lines = [*header_lines(plan), *([repriced] if repriced else []), "",
             "ds_config.json: the DeepSpeed config; key names from",
             f"  {SOURCE}.",
             (f"train_batch_size {config['train_batch_size']}"
             f" = train_micro_batch_size_per_gpu {s.micro_batch}"
             f" * gradient_accumulation_steps {config['gradient_accumulation_steps']}"),
             f"  * data-parallel size {s.dp},",
             "where the data-parallel size is the model-parallel unit's data-parallel world size,",
             f"world / (tp * pp * sp) = {s.devices} / ({s.tp} * {s.pp} * {s.sp}) = {s.dp}.", "",
             "What the JSON cannot say (JSON has no comments) goes to the launcher:",
             "Megatron-DeepSpeed pretrain_gpt.py arguments, option names from",
             f"  {LAUNCHER_SOURCE}:", ""]
    if s.tp > 1 and s.sp == 1 and s.sequence_parallel:
        # Megatron-DeepSpeed's arguments.py raises on CUDA with --sequence-parallel without it
        lines += ["  (in the environment: CUDA_DEVICE_MAX_CONNECTIONS=1, which"
                  " --sequence-parallel needs)", ""]
    lines += [f"  {a}" for a in launcher_args(plan)]
    lines += ["", *_notes(plan)]
    return "\n".join(lines) + "\n"


def launcher_args(plan: Plan) -> list[str]:
    """The Megatron-DeepSpeed arguments that go with ``ds_config.json``."""
    s = plan.strategy
    args = ["--deepspeed", "--deepspeed_config ds_config.json", f"--zero-stage {int(s.zero)}",
            f"--tensor-model-parallel-size {s.tp}", f"--pipeline-model-parallel-size {s.pp}"]
    if s.pp == 1:
        args.append("--no-pipeline-parallel")
    if s.sp > 1:
        args.append(f"--ds-sequence-parallel-size {s.sp}")
    elif s.tp > 1 and s.sequence_parallel:
        args.append("--sequence-parallel")  # Megatron-DeepSpeed refuses it with Ulysses
    args += [f"--micro-batch-size {s.micro_batch}",
             f"--global-batch-size {plan.training.global_batch}"]
    if s.recompute is not Recompute.NONE:
        args.append(f"--recompute-granularity {s.recompute.value}")
        if s.recompute is Recompute.FULL and s.recompute_layers is not None:
            args += ["--recompute-method block",  # pp 1 only (frameworks.why_not)
                     f"--recompute-num-layers {s.recompute_layers}"]
        elif s.recompute is Recompute.FULL:
            args += ["--recompute-method uniform", "--recompute-num-layers 1"]
        args.append("--deepspeed-activation-checkpointing")
    args.append("--bf16" if plan.system.device.bf16 else "--fp16")
    args += _model_args(plan)
    moe = plan.model.moe
    if moe is not None:  # frameworks.why_not checked top-k, ep | dp, the layers and etp 1
        args += [f"--num-experts {moe.experts}", f"--topk {moe.top_k}",
                 f"--expert-interval {moe.every}", f"--moe-expert-parallel-size {s.ep}",
                 f"--moe-train-capacity-factor {moe.capacity_factor:g}",
                 # Megatron-DeepSpeed hands DeepSpeed its own optimizer, whose MoE parameter
                 # groups it makes only with this flag (arguments.py, optimizer/__init__.py);
                 # ZeRO-1/2 and the BF16 optimizer assert on an MoE model without them
                 "--create-moe-param-group"]
    return args


def _model_args(plan: Plan) -> list[str]:
    """The model's shape and attention kernel in Megatron-DeepSpeed's option names (4efb479d
    ``megatron/arguments.py``: ``--num-key-value-heads`` for grouped-query attention,
    ``--normalization rmsnorm``, ``--use-rotary-position-embeddings``, which turns the learned
    position embedding off, ``--use-flash-attn-v2``)."""
    m, seq = plan.model, plan.training.seq_len
    args = [f"--num-layers {m.layers}", f"--hidden-size {m.hidden}",
            f"--ffn-hidden-size {m.ffn_hidden}", f"--num-attention-heads {m.heads}"]
    if m.kv_heads is not None and m.kv_heads != m.heads:
        args.append(f"--num-key-value-heads {m.kv_heads}")
    args += [f"--seq-length {seq}", f"--max-position-embeddings {seq}"]
    if m.activation is Activation.SWIGLU:
        args.append("--swiglu")
    if m.family is Family.LLAMA:
        args += ["--normalization rmsnorm", "--use-rotary-position-embeddings",
                 "--disable-bias-linear"]
    if not m.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not m.trains_with_dropout:  # Megatron's defaults are 0.1 each
        args += ["--attention-dropout 0.0", "--hidden-dropout 0.0"]
    if uses_flash_attention(m, plan.system, plan.training):  # else its unfused attention
        args.append("--use-flash-attn-v2")
    return args


def _notes(plan: Plan) -> list[str]:
    s = plan.strategy
    notes = ["Notes:"]
    if s.sp > 1:
        notes += [f"- Sequence (context) parallelism sp={s.sp} is DeepSpeed-Ulysses, set by the",
                  "  launcher (--ds-sequence-parallel-size), not the JSON. (Without Megatron, the",
                  "  HF/ALST path reads \"sequence_parallel_size\" from the JSON instead.)"]
    if s.pp > 1:
        notes += [f"- Pipeline parallelism pp={s.pp}: each step runs gradient_accumulation_steps",
                  "  micro-batches through the pipeline. DeepSpeed's pipeline engine reads an",
                  "  optional \"pipeline\" section (stages, partition,",
                  "  activation_checkpoint_interval); Megatron-DeepSpeed sets the stages from",
                  "  --pipeline-model-parallel-size."]
    if s.zero is ZeroStage.PARAMETERS:
        notes += ["- ZeRO 3 (stage 3) is DeepSpeed's FSDP: parameters, gradients and optimizer",
                  "  state sharded over the data-parallel ranks."]
    if plan.model.moe is not None:
        moe = plan.model.moe
        where = "every layer" if moe.every == 1 else f"one layer in {moe.every}"
        notes += [f"- Mixture of experts as DeepSpeed-MoE runs it: {moe.experts} experts over",
                  f"  groups of ep={s.ep} data-parallel ranks (deepspeed/moe/layer.py) on {where}",
                  f"  (--expert-interval), top-{moe.top_k} gating."]
    if s.recompute is not Recompute.NONE:
        notes += ["- The activation_checkpointing section configures DeepSpeed's checkpointing",
                  "  API; --recompute-granularity chooses what the model recomputes."]
    notes += _eager_note(plan)
    if len(notes) == 1:
        notes.append("- none")
    return notes


def _eager_note(plan: Plan) -> list[str]:
    """Megatron-DeepSpeed runs SwiGLU as ``F.silu(x[0]) * x[1]`` (``megatron/model/
    transformer.py``) and the rotary embedding as ``t * cos + _rotate_half(t) * sin``
    (``megatron/model/rotary_pos_embedding.py``), PyTorch's ops, at 4efb479d; a plan priced
    with them fused says so, and how to price what it runs."""
    t = plan.training
    fused = [f for f in ("swiglu_fusion", "rope_fusion")
             if f in elementwise_fusions(plan.model) and getattr(t, f)]
    if not fused:
        return []
    eager = estimate(plan.model, plan.system, replace(t, **dict.fromkeys(fused, False)),
                     plan.strategy, plan.convention).step_time
    fused_step = estimate(plan.model, plan.system, t, plan.strategy, plan.convention).step_time
    flags = ", ".join(f"{f}: false" for f in fused)
    ops = " and ".join({"swiglu_fusion": "SwiGLU", "rope_fusion": "rotary embedding"}[f]
                       for f in fused)
    return [f"- Megatron-DeepSpeed runs the model's {ops} as PyTorch's",
            "  element-wise ops; this plan was priced with them fused: a study whose training",
            f"  says {flags} prices what it runs ({eager:.3f} s a step against"
            f" {fused_step:.3f} s)."]
