"""A plan estimated again as the framework it is exported for runs it.

A plan is priced on the stack its training names, or, where a study leaves it open
(``framework: any``), on the one its ZeRO stage implies (:mod:`simcore.megatron.plan`): ZeRO-2/3
plans on PyTorch FSDP's (fp32 shards, checkpointing that stops at each layer's last saved
tensor, no Transformer Engine), ZeRO 0-1 on the device's default. Megatron-LM and DeepSpeed keep
a 16-bit shard beside the fp32 master and re-run whole layers; torchtitan's loss holds 12 bytes
a logit (:mod:`planner.exports._torchtitan_loss`). Before a plan is written for a framework it
is estimated again under that framework's stack
(:func:`search_spaces.frameworks.with_framework_defaults`): refused if it fit and no longer
does, else the files say the new figures.
"""

from __future__ import annotations

import simcore
from planner.exports._runnable import FRAMEWORK_NAMES
from planner.plan import Plan
from planner.units import GB
from search_spaces.frameworks import with_framework_defaults
from simcore.estimate import Estimate
from simcore.specs import TrainingSpec

__all__ = ["reprice", "stack_check"]



def reprice(plan: Plan, training: TrainingSpec, under: str, hint: str) -> Estimate | None:
    """The plan estimated with ``training`` (None when that is what it was priced with); raises
    ValueError, naming what it is ``under`` and the ``hint``, when a plan that fit no longer
    does."""
    if training == plan.training:
        return None
    est: Estimate = simcore.estimate(plan.model, plan.system, training, plan.strategy,
                                     plan.convention)
    if plan.estimate.fits and not est.fits:
        raise ValueError(
            f"under {under} this plan needs {est.memory.total / GB:.1f} GB a device, over the"
            f" {plan.system.device.hbm_bytes / GB:g} GB it has; {hint}")
    return est


def stack_check(plan: Plan, framework: str) -> str | None:
    """A comment for the exported files when ``framework``'s stack changes the plan's figures
    (None when it does not); raises ValueError when a plan that fits no longer fits under it."""
    name = FRAMEWORK_NAMES[framework]
    training = with_framework_defaults(plan.training, framework,
                                       plan.system.device.transformer_engine)
    est = reprice(plan, training, f"{name}'s stack",
                  f"run the study with framework: {framework} to find one that fits")
    if est is None:
        return None
    step, peak = est.step_time, est.memory.total / GB
    old = plan.estimate
    if round(step, 3) == round(old.step_time, 3) and round(peak, 1) == round(
            old.memory.total / GB, 1):
        return None
    return (f"the estimate priced the stack its study left open; as {name} runs the plan (its"
            f" checkpointing, its shards, its kernels): step time {step:.3f} s, peak memory"
            f" {peak:.1f} GB a device")
