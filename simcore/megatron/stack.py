"""Which stack a plan trains on: the training's own choices (Transformer Engine, flash
attention, tp overlap, FP8 parameters, checkpointing that stops early, PyTorch FSDP's fp32
shards) and, where it leaves one open, the default the device, the model family or the ZeRO
stage implies. :class:`simcore.megatron.plan.StepPlan` reads them once a plan; exports and
reports ask the same questions here."""

from __future__ import annotations

from simcore.megatron.placement import within_innermost
from simcore.specs import (
    Activation,
    Axis,
    Family,
    ModelSpec,
    Precision,
    Strategy,
    SystemSpec,
    TrainingSpec,
    ZeroStage,
)

__all__ = ["elementwise_fusions", "uses_flash_attention", "uses_fp32_shards", "uses_fp8_attention",
           "uses_fp8_param_gather", "uses_quantized_params", "uses_recompute_early_stop",
           "uses_async_tp_allreduce", "uses_tp_comm_overlap", "uses_transformer_engine"]


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


def uses_async_tp_allreduce(training: TrainingSpec) -> bool:
    """The backward's tp collective runs beside the weight-gradient GEMM
    (:attr:`TrainingSpec.async_tp_allreduce`). Not under ``launch_blocking``: each launch waits
    for its kernel, so the collective, issued first on its own stream, ends before the GEMM
    starts."""
    return training.async_tp_allreduce is not False and not training.launch_blocking


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


def elementwise_fusions(model: ModelSpec) -> tuple[str, ...]:
    """The training's fusion switches that price an op this model has, in the order norms,
    rotary embedding, SwiGLU: ``fused_norm`` (every model), ``rope_fusion`` (the llama family's
    rotary embedding), ``swiglu_fusion`` (a SwiGLU MLP). Reports and exports ask which of them a
    plan runs unfused (:attr:`simcore.specs.TrainingSpec.fused_norm` and the others)."""
    return tuple(name for name, has in (
        ("fused_norm", True), ("rope_fusion", model.family is Family.LLAMA),
        ("swiglu_fusion", model.activation is Activation.SWIGLU)) if has)
