"""Parameters and FLOPs of a GPT or Llama transformer, from its shapes.

Counts are for the whole (unsplit) model; callers divide by tp and pp. FLOPs count a
multiply-accumulate as 2 FLOP.

Sources: GPT parameters and FLOPs as in Narayanan et al. 2021 (arXiv:2104.04473) Eq. 2 and the
appendix (forward per layer ``24 b s h^2 + 4 b s^2 h``, logits ``2 b s h V``); Llama as in
Touvron et al. 2023 (SwiGLU with three matrices, grouped-query K/V, RMSNorm, no biases).
"""

from __future__ import annotations

from dataclasses import dataclass

from simcore.specs import Activation, Family, ModelSpec

__all__ = ["LayerShape", "layer_shape"]


@dataclass(frozen=True, slots=True)
class LayerShape:
    """What one transformer layer and the model's ends hold (whole, before any split)."""

    matmul_params: int
    """Weights of the layer's matrix multiplies: Q, K, V, output projection, MLP."""
    other_params: int
    """Biases and norm weights of one layer."""
    kv_fraction: float
    """Width of K (or V) over the hidden size: kv_heads / heads (with the model's head width)."""
    embedding_params: int
    """Token embedding (plus learned positions for GPT), held by the first stage."""
    head_params: int
    """LM head and final norm, held by the last stage (a copy of the embedding when tied)."""
    dropout: bool
    """The model trains with dropout (masks are stored): :attr:`ModelSpec.trains_with_dropout`."""

    attention_params: int = 0
    """Of the matmul weights, the attention projections' (the rest is the dense FFN)."""
    q_fraction: float = 1.0
    """Width of the queries (and the output projection's input) over the hidden size:
    heads x head width / hidden, 1 unless the model sets its head width."""

    @property
    def layer_params(self) -> int:
        return self.matmul_params + self.other_params


def layer_shape(model: ModelSpec) -> LayerShape:
    h, f = model.hidden, model.ffn_hidden
    q = model.heads * model.head_dim
    kv = model.n_kv_heads * model.head_dim
    projections = (model.attention_params if model.attention_params is not None
                   else 2 * h * q + 2 * h * kv)  # Q, O and the (grouped) K, V
    if model.family is Family.LLAMA:
        attention = projections  # no biases
        mlp = (3 if model.activation is Activation.SWIGLU else 2) * h * f  # SwiGLU: gate, up, down
        other = 2 * h  # two RMSNorm weights
        embedding = model.vocab * h
        head = model.vocab * h + h  # untied LM head + final RMSNorm
    else:
        attention = projections
        mlp = (3 if model.activation is Activation.SWIGLU else 2) * h * f
        other = (q + 2 * kv) + h + f + h + 4 * h  # QKV, proj, fc1, fc2 biases; two LayerNorms
        embedding = model.vocab * h + model.seq_len * h  # learned positions (Narayanan Eq. 2)
        head = model.vocab * h + 2 * h  # tied or not, the last stage holds V x h and a LayerNorm
    return LayerShape(
        matmul_params=attention + mlp,
        other_params=other,
        kv_fraction=kv / h,
        embedding_params=embedding,
        head_params=head,
        dropout=model.trains_with_dropout,
        attention_params=attention,
        q_fraction=q / h,
    )
