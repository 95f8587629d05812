"""``--format plan``: the plan file, as YAML and as JSON."""

from __future__ import annotations

from planner.plan import Plan, plan_text

__all__ = ["export_plan"]


def export_plan(plan: Plan) -> dict[str, str]:
    return {"plan.yaml": plan_text(plan, ".yaml"), "plan.json": plan_text(plan, ".json")}
