"""Megatron-LM's options for a plan's model and precision (``--format megatron`` and the mixed
exports); option names as :mod:`planner.exports._megatron` says where they were checked."""

from __future__ import annotations

from simcore.megatron.stack import uses_transformer_engine
from simcore.specs import (
    Activation,
    Family,
    ModelSpec,
    Precision,
    SystemSpec,
    TrainingSpec,
    ZeroStage,
)

__all__ = ["attention_backend", "cudnn_attention", "model_args", "precision_args"]


def precision_args(precision: Precision, *, param_gather: bool = False,
                   fsdp: bool = False) -> list[str]:
    """Megatron-LM's FP8 options (none in bf16), with a comment line; ``param_gather``: the
    linear layers' weights kept only in their 8-bit form (``--fp8-param-gather``); ``fsdp``:
    under Megatron-FSDP, which has no gradient buffer for MXFP8's gather to reuse (arguments.py
    sets ``reuse_grad_buf_for_mxfp8_param_ag`` False there)."""
    if precision is Precision.BF16:
        return []
    if precision is Precision.NVFP4:
        # Megatron-Bridge's bf16_with_nvfp4_mixed (v0.4.0 training/mixed_precision.py): fp4
        # e2m1, fp4_recipe nvfp4, no param gather in FP4
        return ["# nvfp4: Transformer Engine runs the linear layers' GEMMs in NVFP4 (a scale per",
                "# 16 elements and one per tensor), as estimated; attention, LM head and",
                "# optimizer stay bf16, and the weights are kept and gathered in bf16",
                "--fp4-format e2m1",
                "--fp4-recipe nvfp4"]
    if precision is Precision.MXFP8:
        # Megatron-Bridge's bf16_with_mxfp8_mixed (v0.4.0 training/mixed_precision.py): e4m3,
        # mxfp8, fp8_param_gather and reuse_grad_buf_for_mxfp8_param_ag
        args = ["# mxfp8: Transformer Engine runs the linear layers' GEMMs in MXFP8 (a scale per",
                "# 32 elements), as estimated; attention, LM head and optimizer stay bf16",
                "--fp8-format e4m3",
                "--fp8-recipe mxfp8"]
        if param_gather:
            args += ["# the weights kept only in MXFP8, gathered in bf16 and quantised, as",
                     "# estimated",
                     "--fp8-param-gather"]
            if not fsdp:
                args += ["# the gather writes into the gradient buffer",
                         "--reuse-grad-buf-for-mxfp8-param-ag"]
        return args
    args = ["# fp8: Transformer Engine runs the linear layers' GEMMs in FP8 with per-tensor",
            "# current scaling, as estimated; attention, LM head and optimizer stay bf16",
            "--fp8-format hybrid",
            "--fp8-recipe tensorwise"]
    if param_gather:
        args += ["# the linear layers' weights kept in FP8 only and all-gathered in FP8, as",
                 "# estimated (needs the distributed optimizer or Megatron-FSDP)",
                 "--fp8-param-gather"]
    return args


def cudnn_attention(system: SystemSpec, training: TrainingSpec, zero: ZeroStage) -> bool:
    """Whether the plan's attention was priced as Transformer Engine's fused (cuDNN) kernel:
    under Transformer Engine on a part with a ``fused_attention_efficiency``
    (:meth:`simcore.megatron.kernel_costs.KernelCosts.of`)."""
    return (uses_transformer_engine(system, training, zero)
            and system.device.fused_attention_efficiency is not None)


def attention_backend(flash: bool, cudnn: bool) -> str:
    """Megatron-LM's ``--attention-backend`` for the attention the plan was priced with:
    ``fused``, Transformer Engine's cuDNN kernel, where the device prices it (``cudnn``: its
    ``fused_attention_efficiency`` under Transformer Engine); ``flash`` elsewhere that flash
    attention was priced; ``unfused`` without it. ``flash`` would force TE's FlashAttention
    where cuDNN's was priced (d98e8a64 ``language_module.py``: ``NVTE_FLASH_ATTN=1``,
    ``NVTE_FUSED_ATTN=0``); the default, ``auto``, picks cuDNN's on Hopper and later
    (TransformerEngine's ``get_attention_backend``: "Disabling FlashAttention to give
    FusedAttention preference on Hopper+")."""
    if not flash:
        return "unfused"
    return "fused" if cudnn else "flash"


_BACKEND_COMMENTS = {
    "fused": "# Transformer Engine's fused (cuDNN) attention, as estimated",
    "flash": "# flash attention, as estimated (the s x s scores are never stored)",
    "auto": ("# Transformer Engine picks its attention: cuDNN's on Hopper and later, flash"
             " attention before, as each part was estimated"),
    "unfused": "# unfused attention, as estimated (scale-mask-softmax, scores stored)",
}


def model_args(m: ModelSpec, seq: int, attention: str, bf16: bool = True) -> list[str]:
    """Megatron-LM's options for the model's shape and attention kernel, with comment lines."""
    args = [f"# model {m.name} (vocab {m.vocab} comes from the tokenizer)",
            f"--num-layers {m.layers}",
            f"--hidden-size {m.hidden}",
            f"--ffn-hidden-size {m.ffn_hidden}",
            f"--num-attention-heads {m.heads}"]
    if m.kv_heads is not None and m.kv_heads != m.heads:
        args += ["--group-query-attention", f"--num-query-groups {m.kv_heads}"]
    args += [f"--seq-length {seq}", f"--max-position-embeddings {seq}"]
    if m.activation is Activation.SWIGLU:
        args.append("--swiglu")
    if m.family is Family.LLAMA:
        args += ["--normalization RMSNorm", "--position-embedding-type rope",
                 "--disable-bias-linear"]
    if not m.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not m.trains_with_dropout:  # Megatron-LM's defaults are 0.1 each
        args += ["# no dropout, as estimated (no masks kept)",
                 "--attention-dropout 0.0", "--hidden-dropout 0.0"]
    if bf16:
        args.append("--bf16")
    else:
        args += ["# fp16 with loss scaling: the device has no bf16 tensor cores", "--fp16"]
    args += [_BACKEND_COMMENTS[attention], f"--attention-backend {attention}"]
    return args
