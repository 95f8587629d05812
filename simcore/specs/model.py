"""The transformer being trained: its shape (:class:`ModelSpec`) and its experts
(:class:`MoESpec`)."""

from __future__ import annotations

from dataclasses import dataclass

from simcore.specs.choices import _FAMILY_ACTIVATION, Activation, Family, _positive


@dataclass(frozen=True, slots=True, kw_only=True)
class MoESpec:
    """A mixture-of-experts FFN: in each MoE layer a router sends every token to ``top_k`` of
    ``experts`` routed experts (each an FFN of width ``expert_ffn``), beside ``shared_experts``
    that every token goes through (Fedus et al. 2021; DeepSeek-V3, arXiv:2412.19437 section 2.1.2;
    Megatron-LM ``--num-experts``, ``--moe-router-topk``, ``--moe-ffn-hidden-size``,
    ``--moe-shared-expert-intermediate-size``, ``--moe-layer-freq``)."""

    experts: int
    top_k: int
    expert_ffn: int
    shared_experts: int = 0
    shared_ffn: int | None = None
    """Width of each shared expert's FFN; None: ``expert_ffn``."""
    first_dense: int = 0
    """The first layers keep a dense FFN of the model's ``ffn_hidden`` (DeepSeek-V3: 3)."""
    every: int = 1
    """After them every ``every``-th layer is MoE, the last of each group (1: all of them;
    2: dense, MoE, dense, MoE, as Llama 4 Maverick)."""
    capacity_factor: float = 1.0
    """Tokens the busiest expert rank receives over the mean: load imbalance, or the capacity a
    token-dropping router pads to (Megatron-LM ``--moe-expert-capacity-factor``). The step runs
    at the busiest rank: its expert GEMMs and all-to-all volume scale by it. 1: balanced."""

    def __post_init__(self) -> None:
        for name in ("experts", "top_k", "expert_ffn", "every"):
            _positive(name, getattr(self, name))
        if self.shared_ffn is not None:
            _positive("shared_ffn", self.shared_ffn)
        for name in ("shared_experts", "first_dense"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"`{name} >= 0` must hold, but got {name}={value!r}")
        if self.top_k > self.experts:
            raise ValueError(f"`top_k <= experts` must hold, but got top_k={self.top_k},"
                             f" experts={self.experts}")
        if not (1 <= self.capacity_factor <= 16):
            raise ValueError("`1 <= capacity_factor <= 16` must hold, but got"
                             f" capacity_factor={self.capacity_factor!r}")

    @property
    def shared_width(self) -> int:
        """All shared experts' FFN width together (they run as one FFN)."""
        return self.shared_experts * (self.expert_ffn if self.shared_ffn is None
                                      else self.shared_ffn)

    def is_moe(self, layer: int) -> bool:
        """Whether transformer layer ``layer`` (0-based) has the MoE FFN."""
        return layer >= self.first_dense and (layer - self.first_dense) % self.every == \
            self.every - 1

    def moe_layers(self, start: int, stop: int) -> int:
        """MoE layers among layers ``start`` .. ``stop - 1``: with j = i - first_dense, those
        with (j + 1) a multiple of ``every``, i.e. the multiples of ``every`` in (a, b]."""
        a, b = max(start, self.first_dense) - self.first_dense, stop - self.first_dense
        return max(0, b // self.every - a // self.every) if b > a else 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A transformer's (or the DistIR MLP's) shape."""

    name: str
    family: Family
    layers: int
    hidden: int
    ffn_hidden: int
    """MLP inner width (4 * hidden for GPT; 28672 for Llama-70B's SwiGLU)."""
    heads: int
    vocab: int
    seq_len: int
    """Sequence length the model is trained at (training may override)."""
    kv_heads: int | None = None
    """Key/value heads for grouped-query attention; None means heads (multi-head attention)."""
    activation: Activation | None = None
    """The MLP's activation; None takes the family's: SwiGLU for Llama (three matrices), ReLU
    for the DistIR MLP, none for STAGE's transformer, GELU for GPT."""
    tied_embeddings: bool = False
    """True if the LM head reuses the input embedding matrix (GPT); False for Llama."""
    moe: MoESpec | None = None
    """The MoE layers' FFN; None: a dense model."""
    attention_head_dim: int | None = None
    """Width of a head's queries and keys in the attention core, when it is not hidden / heads
    (DeepSeek-V3's MLA: the mean of its 192-wide queries and keys and 128-wide values, 160, so
    the core's FLOPs are right)."""
    attention_params: int | None = None
    """Parameters of one layer's attention projections, when they are not the Q, K, V and
    output matrices of the heads (DeepSeek-V3's multi-head latent attention: 187.1 M, its
    low-rank down and up projections); its projections' FLOPs follow from it."""
    mla_latent: int | None = None
    """Multi-head latent attention: the widths of the compressed tensors a token keeps where
    its up projections recompute (``mla_up_proj``): q_lora_rank + kv_lora_rank +
    qk_rope_head_dim (DeepSeek-V3: 1536 + 512 + 64)."""
    mla_up_params: int | None = None
    """Multi-head latent attention: the weights of one layer's up projections (part of
    ``attention_params``), what ``mla_up_proj`` runs again (DeepSeek-V3: 1536 x 128 x 192 +
    512 x 128 x 256)."""
    dropout: bool | None = None
    """Whether the model trains with dropout (its masks stored, its kernels run). None takes
    the family's default: GPT does (Megatron-LM's 0.1 hidden and attention dropout), Llama does
    not. MPT is a GPT that does not (llm-foundry's ``resid_pdrop``, ``emb_pdrop`` and
    ``attn_pdrop`` default to 0, and PyTorch's dropout at p = 0 returns its input)."""

    def __post_init__(self) -> None:
        if self.activation is None:
            object.__setattr__(self, "activation", _FAMILY_ACTIVATION.get(self.family,
                                                                          Activation.GELU))
        for name in ("layers", "hidden", "ffn_hidden", "heads", "vocab", "seq_len"):
            _positive(name, getattr(self, name))
        for name in ("attention_head_dim", "attention_params", "mla_latent", "mla_up_params"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if (self.mla_latent is None) != (self.mla_up_params is None):
            raise ValueError("mla_latent and mla_up_params describe multi-head latent attention"
                             " together; give both or neither")
        if self.kv_heads is not None:
            _positive("kv_heads", self.kv_heads)
            if self.heads % self.kv_heads:
                raise ValueError(
                    f"`heads % kv_heads == 0` must hold, but got heads={self.heads},"
                    f" kv_heads={self.kv_heads}"
                )
        if self.family is not Family.MLP and self.hidden % self.heads:
            raise ValueError(
                f"`hidden % heads == 0` must hold, but got hidden={self.hidden}, heads={self.heads}"
            )
        if self.moe is not None and self.moe.moe_layers(0, self.layers) == 0:
            # priced as dense, with ep accepted and doing nothing
            raise ValueError(
                f"moe: none of the {self.layers} layers is a mixture of experts (first_dense"
                f" {self.moe.first_dense}, every {self.moe.every}); lower them, or drop moe"
            )

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def head_dim(self) -> int:
        if self.attention_head_dim is not None:
            return self.attention_head_dim
        return self.hidden // self.heads

    @property
    def trains_with_dropout(self) -> bool:
        """:attr:`dropout`, or the family's default (Llama: no; GPT and the others: yes)."""
        return self.dropout if self.dropout is not None else self.family is not Family.LLAMA

    @property
    def moe_layer_count(self) -> int:
        """How many layers have the MoE FFN (0 for a dense model)."""
        return 0 if self.moe is None else self.moe.moe_layers(0, self.layers)
