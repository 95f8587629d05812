"""``--format torchtitan`` of a mixture-of-experts plan: torchtitan's MoE models and its
expert-parallel degree.

- Model configurations with the catalog's shapes (pytorch/torchtitan tag v0.2.2, 73a0e697,
  ``torchtitan/models/qwen3/__init__.py`` "30B-A3B": 48 layers, dim 2048, 32 heads,
  moe_inter_dim 768, 128 experts, top-8; ``torchtitan/models/deepseek_v3/__init__.py`` "671B":
  61 layers, dim 7168, 128 heads, 3 dense layers, moe_inter_dim 2048, 256 experts, 1 shared,
  top-8; the same flavors in ``model_registry`` and ``config_registry.py``'s
  ``qwen3_30b_a3b`` and ``deepseek_v3_671b`` at main, b5bcd76c).
- ``[parallelism] expert_parallel_degree`` (both forms) and, v0.2.2 only,
  ``expert_tensor_parallel_degree`` ("either etp = tp or etp = 1"; the planner's torchtitan
  plans keep etp 1, as main has no such option: "EP borrows ranks from FSDP and TP",
  ``torchtitan/config/configs.py``). Main checks that ep divides dp_shard * cp * tp
  (``torchtitan/distributed/parallel_dims.py``), which :func:`search_spaces.frameworks.why_not`
  checks before this export runs.
"""

from __future__ import annotations

from planner.plan import Plan

__all__ = ["expert_comment", "expert_fields", "moe_flavor"]

_FLAVORS = {(48, 2048, 32, 128, 8, 768, 0, 0): ("qwen3", "30B-A3B", "qwen3_30b_a3b"),
            (61, 7168, 128, 256, 8, 2048, 1, 3): ("deepseek_v3", "671B", "deepseek_v3_671b")}
"""torchtitan's MoE configurations by (layers, dim, heads, experts, top-k, expert FFN, shared
experts, dense layers first): (model package, flavor, config_registry function)."""


def moe_flavor(plan: Plan) -> tuple[str, str, str] | None:
    """torchtitan's model package, flavor and configuration function with exactly the plan's
    MoE model shape, if there is one."""
    m = plan.model
    if m.moe is None:
        return None
    e = m.moe
    return _FLAVORS.get((m.layers, m.hidden, m.heads, e.experts, e.top_k, e.expert_ffn,
                         e.shared_experts, e.first_dense))


def expert_fields(plan: Plan, *, toml: bool) -> dict[str, int]:
    """The expert-parallel fields of ``[parallelism]`` (TOML, v0.2.2) or ``ParallelismConfig``
    (main); empty for a dense model."""
    if plan.model.moe is None:
        return {}
    fields = {"expert_parallel_degree": plan.strategy.ep}
    if toml:
        fields["expert_tensor_parallel_degree"] = 1
    return fields


def expert_comment(plan: Plan) -> list[str]:
    s = plan.strategy
    if plan.model.moe is None:
        return []
    return [f"experts split over ep={s.ep} ranks borrowed from dp_shard * cp * tp, no expert",
            "tensor parallelism (etp 1)"]
