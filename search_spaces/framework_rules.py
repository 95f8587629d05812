"""What each framework cannot run as written: the refusals behind
:func:`search_spaces.frameworks.why_not`, one function a framework (and one for mixture-of-experts
layers), each rule citing the framework source it was read from (the commits are
:mod:`search_spaces.frameworks`'s)."""

from __future__ import annotations

from simcore.specs import (
    ZERO_BUBBLE,
    ModelSpec,
    Precision,
    Recompute,
    Schedule,
    Strategy,
    TrainingSpec,
    ZeroStage,
)

__all__ = ["NO_OFFLOAD", "deepspeed", "deepspeed_accumulation", "deepspeed_layers",
           "deepspeed_selective", "experts", "megatron", "torchtitan", "torchtitan_zero"]


def experts(framework: str, model: ModelSpec, s: Strategy) -> str | None:
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
    # the same file: "If enabling EP A2A overlap, virtual_pipeline_model_parallel_size must be
    # specified when pipeline_model_parallel_size > 1"
    if s.ep_overlap and s.pp > 1 and s.v == 1:
        return (f"ep_overlap with pp {s.pp} and one model chunk a stage: Megatron-LM's"
                " expert-parallel overlap needs an interleaved pipeline (virtual stages) when"
                " pp > 1; use schedule interleaved, or ep_overlap false")
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
        return deepspeed_layers(model)
    return None


def deepspeed_layers(model: ModelSpec) -> str | None:
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


NO_OFFLOAD = ("offload_layers {n}: {framework} has no option to offload the first layers'"
               " activations to host memory (Megatron-Core's --cpu-offloading-num-layers);"
               " export for megatron")
"""Activation offloading of some layers is Megatron-Core's (``model_parallel_config.py``
``cpu_offloading_num_layers``, d98e8a64); torchtitan (b5bcd76c) offloads nothing of a layer's
activations, DeepSpeed's ``cpu_checkpointing`` only the checkpointed layer inputs of a full
recompute."""


def megatron(s: Strategy) -> str | None:
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


def torchtitan(model: ModelSpec, s: Strategy) -> str | None:
    if s.offload_layers is not None:
        return NO_OFFLOAD.format(n=s.offload_layers, framework="torchtitan")
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


def deepspeed(s: Strategy, bf16: bool) -> str | None:
    if s.offload_layers is not None:
        return NO_OFFLOAD.format(n=s.offload_layers, framework="Megatron-DeepSpeed")
    # DeepSpeed shards within groups only as MiCS, under ZeRO-3 (mics_shard_size,
    # deepspeed/runtime/zero/config.py, edaa7221), and MiCS needs the model built under
    # deepspeed.zero.MiCS_Init (mics.py asserts "To use MiCS sharding, please use
    # deepspeed.zero.MiCS_Init"), where Megatron-DeepSpeed's pretrain_gpt.py (4efb479d) builds
    # it under deepspeed.zero.Init: its launcher shards over the whole data-parallel group.
    if s.replicas > 1:
        return (f"shard_group {s.shard_group}: DeepSpeed shards within groups only as MiCS,"
                " which needs the model built under deepspeed.zero.MiCS_Init, not"
                " Megatron-DeepSpeed's deepspeed.zero.Init; use no shard group")
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


def deepspeed_selective(s: Strategy, flash: bool) -> str | None:
    # Megatron-DeepSpeed 4efb479d megatron/model/transformer.py ParallelAttention: under
    # --recompute-granularity selective it checkpoints the attention core only on its unfused
    # path without Ulysses (checkpoint_core_attention is set beside CoreAttention); the flash
    # attention core and DeepSpeed-Ulysses' DistributedAttention run without it, so the
    # selective recompute priced would not run.
    if s.recompute is not Recompute.SELECTIVE or not (flash or s.sp > 1):
        return None
    why = "flash attention" if flash else f"sp {s.sp} (DeepSpeed-Ulysses)"
    return (f"recompute selective with {why}: Megatron-DeepSpeed recomputes the attention core"
            " only on its unfused path without Ulysses; use recompute full or none")


def torchtitan_zero(s: Strategy) -> str | None:
    # torchtitan has no ZeRO-1 or ZeRO-2: their stand-in (planner.exports._torchtitan_fields)
    # is FSDP that keeps the parameters gathered from forward to backward, one config for both,
    # whose cost its pipeline decides. At pp 1 its train loop (trainer.py, 73a0e697 and
    # b5bcd76c) never turns the gradient sync off, so each micro-batch's backward
    # reduce-scatters its gradients into fp32 shards: ZeRO-2 as priced. With pp > 1 PyTorch's
    # pipeline stages sync on the last micro-batch only (torch/distributed/pipelining/stage.py
    # backward_maybe_with_nosync), accumulating whole gradients until then: ZeRO-1 as priced.
    if s.dp * s.sp == 1:
        return None
    if s.zero is ZeroStage.OPTIMIZER and s.pp == 1:
        return ("zero 1 at pp 1: torchtitan has no ZeRO-1, and its FSDP without resharding"
                " reduce-scatters the gradients into shards every micro-batch, as zero 2 is"
                " priced; use zero 2 or 3")
    if s.zero is ZeroStage.GRADIENTS and s.pp > 1:
        return (f"zero 2 with pp {s.pp}: torchtitan has no ZeRO-2, and with pp > 1 its FSDP"
                " without resharding keeps whole gradients until the last micro-batch's"
                " reduce-scatter, as zero 1 is priced; use zero 1 or 3")
    return None


def deepspeed_accumulation(training: TrainingSpec, s: Strategy) -> str | None:
    # deepspeed/runtime/engine.py _do_optimizer_sanity_check (edaa7221): without ZeRO a model
    # whose gradients accumulate in another dtype raises "unsupported mix of model_dtype and
    # grad_accum_dtype"; under ZeRO 1 a bf16 model with fp32 accumulation takes BFLOAT16.
    if training.bytes_per_param_grads == 4 and s.zero is ZeroStage.NONE:
        return ("grad_bytes 4 with zero 0: DeepSpeed accumulates 16-bit models' gradients in"
                " fp32 only under ZeRO (the BF16_Optimizer at zero 1); use zero 1")
    return None
