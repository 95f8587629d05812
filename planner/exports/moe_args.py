"""Megatron-LM's options for a mixture-of-experts model and an expert-parallel plan (option names
from NVIDIA/Megatron-LM@d98e8a64 ``megatron/training/arguments.py`` and
``megatron/core/transformer/moe/README.md``, "MoE Arguments Reference")."""

from __future__ import annotations

from planner.plan import Plan
from simcore.specs import Strategy

__all__ = ["megatron_moe_args"]


def _layer_freq(plan: Plan) -> str:
    """``--moe-layer-freq``: an int when every layer is MoE (1), else the per-layer list."""
    moe = plan.model.moe
    assert moe is not None
    pattern = [int(moe.is_moe(i)) for i in range(plan.model.layers)]
    if all(pattern):
        return "1"
    dense = moe.first_dense
    if all(pattern[dense:]) and not any(pattern[:dense]):
        return f"'([0]*{dense}+[1]*{plan.model.layers - dense})'"
    return "'" + str(pattern).replace(" ", "") + "'"


def _dispatcher(s: Strategy) -> list[str]:
    """The token dispatcher: NCCL's all-to-all, or with ``ep_dedup`` the flex dispatcher on
    DeepEP, which "removes redundant tokens during cross-node communication" (``moe/README.md``
    d98e8a64, FlexDispatcher)."""
    if s.ep_dedup:
        return ["--moe-token-dispatcher-type flex", "--moe-flex-dispatcher-backend deepep"]
    return ["--moe-token-dispatcher-type alltoall"]


def megatron_moe_args(plan: Plan) -> list[str]:
    """The MoE options with comment lines; empty for a dense model."""
    m, s = plan.model, plan.strategy
    moe = m.moe
    if moe is None:
        return []
    kind = "DeepEP flex" if s.ep_dedup else "all-to-all"
    args = [f"# mixture of experts: {moe.experts} experts, top-{moe.top_k}, {kind} dispatcher"
            " (as estimated: dispatch and combine on the critical path)",
            f"--num-experts {moe.experts}",
            f"--moe-router-topk {moe.top_k}",
            f"--moe-ffn-hidden-size {moe.expert_ffn}",
            f"--moe-layer-freq {_layer_freq(plan)}",
            *_dispatcher(s),
            "--moe-grouped-gemm",
            f"--expert-model-parallel-size {s.ep}",
            f"--expert-tensor-parallel-size {s.expert_tp}"]
    if s.ep_overlap:
        args += ["# the all-to-alls beside another micro-batch's compute, as estimated",
                 "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    if moe.shared_experts:
        args.append(f"--moe-shared-expert-intermediate-size {moe.shared_width}")
    if moe.capacity_factor > 1:
        args += [f"# capacity factor {moe.capacity_factor:g}: tokens beyond it are dropped",
                 f"--moe-expert-capacity-factor {moe.capacity_factor:g}",
                 "--moe-pad-expert-input-to-capacity"]
    if m.attention_head_dim is not None and m.attention_params is None:
        args.append(f"--kv-channels {m.attention_head_dim}")
    if m.attention_params is not None:
        args += ["# the model's attention is not multi-head attention of its heads (its entry",
                 "# sets attention_params: DeepSeek-V3's MLA); add its own options, for",
                 "# DeepSeek-V3: --multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512",
                 "#   --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128"]
    return args
