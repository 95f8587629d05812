"""What every framework export asks of a plan before its own rules (:func:`why_not`): that it
was estimated as a training framework runs it (the ``megatron`` convention: Megatron-LM's
layers, which DeepSpeed and torchtitan run alike), and that it fits the device's HBM, which a
study may have set aside (``hbm_gb: unlimited``, or a limit above the device's, to rank plans
by time alone). A plan that fails either is not written for a framework: it could not run as
written."""

from __future__ import annotations

from planner.plan import Plan
from planner.units import GB
from simcore.specs import Convention

__all__ = ["FRAMEWORK_NAMES", "not_runnable"]

FRAMEWORK_NAMES = {"megatron": "Megatron-LM", "deepspeed": "DeepSpeed",
                   "torchtitan": "torchtitan"}
"""The export formats that launch a training framework (:data:`search_spaces.frameworks.
FRAMEWORKS` but ``any``), each with the framework's name as its users write it."""

_CONVENTIONS = {
    Convention.STAGE: ("STAGE's graph as ASTRA-sim replays it", "export astra-sim, chakra or"
                       " plan, or run the study with convention: megatron"),
    Convention.MLP: ("the MLP model of DistIR's notebook, which no training framework runs",
                     "export plan"),
}
"""Each convention a framework does not run: what it prices, and what to do instead."""


def not_runnable(plan: Plan, fmt: str) -> str | None:
    """Why ``plan`` cannot be written for ``fmt``'s framework before its own rules, or None
    (also for the formats that launch no framework)."""
    name = FRAMEWORK_NAMES.get(fmt)
    if name is None:
        return None
    if plan.convention is not Convention.MEGATRON:
        what, instead = _CONVENTIONS[plan.convention]
        return (f"the plan was estimated in the {plan.convention.value} convention ({what}),"
                f" not as {name} runs it; {instead}")
    est = plan.estimate
    if not est.fits:
        return (f"it needs {est.memory.total / GB:.1f} GB a device, over the"
                f" {plan.system.device.hbm_bytes / GB:g} GB a {plan.system.device.name} has (the"
                " study's hbm_gb let it through); export plan or chakra, or run the study"
                " without hbm_gb to find a plan that fits")
    return None
