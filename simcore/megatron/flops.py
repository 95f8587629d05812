"""FLOPs of a Megatron-style training step: the model's (what MFU counts) and what recompute
adds (what HFU counts). A multiply-accumulate is 2 FLOP; forward + backward is 3 x forward
(Korthikanti et al. 2022, arXiv:2205.05198, Eq. 7); an MoE layer counts its activated experts."""

from __future__ import annotations

from simcore.megatron.layers import LayerShape
from simcore.megatron.moe import moe_shape
from simcore.specs import (
    Activation,
    ModelSpec,
    Recompute,
    RecomputeModule,
    SelectiveRecompute,
    TrainingSpec,
)

__all__ = ["layers_forward_flops", "model_flops", "recompute_flops"]


def layers_forward_flops(model: ModelSpec, shape: LayerShape, seq: int, *,
                          core_only: bool = False) -> int:
    """Forward FLOP of every transformer layer for one sequence: the matmuls
    (``2 s params``; an MoE layer's with its activated experts only: attention, router, shared
    and ``top_k`` routed experts, as Megatron-LM's ``num_floating_point_operations`` counts)
    and the attention core (``4 s^2 q``, q the heads' width), or only the core."""
    core = 4 * seq * seq * (model.heads * model.head_dim)
    n_moe = model.moe_layer_count
    dense = model.layers - n_moe
    if core_only:
        return model.layers * core
    flops = dense * (2 * seq * shape.matmul_params + core)
    if n_moe:
        assert model.moe is not None
        ms = moe_shape(model)
        active = (shape.attention_params + ms.router_params + ms.shared_params
                  + model.moe.top_k * ms.expert_params)
        flops += n_moe * (2 * seq * active + core)
    return flops


def model_flops(model: ModelSpec, shape: LayerShape, training: TrainingSpec) -> float:
    """Forward + backward FLOP of one step without recompute: 3 x forward (Korthikanti Eq. 7);
    an MoE model's on its activated parameters."""
    seq = training.seq_len
    per_sequence = (layers_forward_flops(model, shape, seq)
                    + 2 * seq * model.hidden * model.vocab)
    return 3 * per_sequence * training.global_batch


def recompute_flops(model: ModelSpec, shape: LayerShape, training: TrainingSpec,
                     recompute: Recompute) -> float:
    seq = training.seq_len
    if recompute is Recompute.FULL:
        per_sequence = layers_forward_flops(model, shape, seq)
    elif recompute is Recompute.SELECTIVE and training.recompute_modules is not None:
        per_sequence = _module_flops(model, shape, seq, frozenset(training.recompute_modules))
    elif (recompute is Recompute.SELECTIVE
          and training.selective_recompute is SelectiveRecompute.OP):
        per_sequence = 2 * seq * _every_second_matmul_params(model, shape)
    elif recompute is Recompute.SELECTIVE:
        per_sequence = layers_forward_flops(model, shape, seq, core_only=True)
    else:
        return 0.0
    return per_sequence * training.global_batch


def _module_flops(model: ModelSpec, shape: LayerShape, seq: int,
                  modules: frozenset[RecomputeModule]) -> float:
    """Forward FLOP per sequence of what Megatron-LM's ``recompute_modules`` run again: the
    attention core, MLA's up projections, the dense layers' MLPs."""
    flops = 0.0
    if RecomputeModule.CORE_ATTN in modules:
        flops += layers_forward_flops(model, shape, seq, core_only=True)
    if RecomputeModule.MLA_UP_PROJ in modules and model.mla_up_params is not None:
        flops += model.layers * 2 * seq * model.mla_up_params
    if RecomputeModule.MLP in modules:
        dense = model.layers - model.moe_layer_count
        flops += dense * 2 * seq * (shape.matmul_params - shape.attention_params)
    return flops


def _every_second_matmul_params(model: ModelSpec, shape: LayerShape) -> float:
    """Weights of the matmuls per-op selective checkpointing recomputes, over every layer
    (:func:`simcore.megatron.kernels._every_second_matmul`): Llama's wk, wo and w3, a GPT
    layer's output projection and FC2, half of MLA's projections; an MoE layer's w3 or FC2 of
    its shared experts only (the routed experts are kept)."""
    h = model.hidden
    q, kv = shape.q_fraction * h, shape.kv_fraction * h
    if model.attention_params is not None:
        attention = shape.attention_params / 2
    elif model.activation is Activation.SWIGLU:
        attention = h * kv + q * h
    else:
        attention = q * h
    n_moe = model.moe_layer_count
    shared = model.moe.shared_width if model.moe is not None else 0
    ffn = (model.layers - n_moe) * h * model.ffn_hidden + n_moe * h * shared
    return model.layers * attention + ffn
