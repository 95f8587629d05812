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

from dataclasses import replace

import simcore
from planner.exports._runnable import FRAMEWORK_NAMES
from planner.plan import Plan
from planner.units import GB
from search_spaces.frameworks import with_framework_defaults
from simcore.estimate import Estimate
from simcore.specs import CrossEntropy, TrainingSpec

__all__ = ["fused_loss_args", "priced", "reprice", "run_by", "stack_check"]



def reprice(plan: Plan, training: TrainingSpec, under: str, hint: str) -> Estimate:
    """The plan estimated with ``training`` (its estimate again where that is what it was
    priced with: a view of :func:`run_by` keeps its study's figures); raises ValueError, naming
    what it is ``under`` and the ``hint``, when a plan that fit no longer does."""
    est: Estimate = simcore.estimate(plan.model, plan.system, training, plan.strategy,
                                     plan.convention)
    if plan.estimate.fits and not est.fits:
        raise ValueError(
            f"under {under} this plan needs {est.memory.total / GB:.1f} GB a device, over the"
            f" {plan.system.device.hbm_bytes / GB:g} GB it has; {hint}")
    return est


def run_by(plan: Plan, framework: str) -> Plan:
    """``plan`` with the training ``framework`` runs: what its study left open filled with
    ``framework``'s defaults (its stack, loss, recompute), and where the study named another
    framework, the training as the study wrote it (:attr:`Plan.given_training`) so filled, not
    with the study's framework's. The estimate stays the study's: :func:`stack_check` says
    where ``framework``'s figures differ."""
    return replace(plan, training=with_framework_defaults(
        plan.written_training, framework, plan.system.device.transformer_engine))


def stack_check(plan: Plan, framework: str) -> str | None:
    """A comment for the exported files when ``framework``'s stack changes the figures of
    ``plan``, its :func:`run_by` view (None when it does not); raises ValueError when a plan
    that fits no longer fits under it."""
    name = FRAMEWORK_NAMES[framework]
    est = reprice(plan, plan.training, f"{name}'s stack",
                  f"run the study with framework: {framework} to find one that fits")
    step, peak = est.step_time, est.memory.total / GB
    old = plan.estimate
    if round(step, 3) == round(old.step_time, 3) and round(peak, 1) == round(
            old.memory.total / GB, 1):
        return None
    return (f"{priced(plan)}; as {name} runs the plan (its checkpointing, its shards, its"
            f" kernels): step time {step:.3f} s, peak memory {peak:.1f} GB a device")


def priced(plan: Plan) -> str:
    """What the plan's estimate priced, for the files' comment on another stack's figures."""
    if plan.given_training is not None:
        return "the estimate priced the stack of its study's framework"
    return "the estimate priced the stack its study left open"


def fused_loss_args(plan: Plan) -> list[str]:
    """The loss arguments, with what they hold beyond the price, of a plan priced with an
    in-place fused kernel's 4 bytes a logit (Transformer Engine's, ``--cross-entropy-fusion-impl
    te``, which Megatron-Bridge's performance scripts run). Megatron-LM d98e8a64 refuses that
    implementation (``arguments.py``: "disabled due to stability issues"): it runs its jit-fused
    one, 10 bytes a logit (:attr:`CrossEntropy.MEGATRON_FUSED`), where the plan fits with it,
    else its unfused one, 6 bytes a logit (:attr:`CrossEntropy.MEGATRON`, no flag; the estimate
    times the losses alike). Raises ValueError when the plan fit and fits with neither."""
    last = _last_stage(plan, CrossEntropy.FUSED)
    tried = []
    for loss, flag in ((CrossEntropy.MEGATRON_FUSED, "--cross-entropy-loss-fusion"),
                       (CrossEntropy.MEGATRON, None)):
        est = simcore.estimate(plan.model, plan.system, replace(plan.training, cross_entropy=loss),
                               plan.strategy, plan.convention)
        if est.fits or not plan.estimate.fits:
            more = (est.stages[-1].memory.total - last) / GB
            return [*_loss_note(loss, more, tried, plan), *([flag] if flag else [])]
        tried.append(est.memory.total / GB)
    raise ValueError(
        f"under Megatron-LM's losses this plan needs {tried[0]:.1f} GB a device (its jit-fused"
        f" loss, 10 bytes a logit) or {tried[1]:.1f} GB (its unfused one, 6), over the"
        f" {plan.system.device.hbm_bytes / GB:g} GB it has: d98e8a64 refuses Transformer"
        " Engine's in-place loss (4 bytes a logit), which the plan was priced with; run the"
        " study with cross_entropy: megatron or megatron_fused, which price them")


def _last_stage(plan: Plan, loss: CrossEntropy) -> float:
    return simcore.estimate(plan.model, plan.system, replace(plan.training, cross_entropy=loss),
                            plan.strategy, plan.convention).stages[-1].memory.total


def _loss_note(loss: CrossEntropy, more: float, tried: list[float], plan: Plan) -> list[str]:
    note = ["# the fused vocab-parallel loss, priced at 4 bytes a logit (Transformer Engine's",
            "# in-place kernel, which this Megatron-LM refuses)"]
    if loss is CrossEntropy.MEGATRON_FUSED:
        return [note[0], "# in-place kernel); this Megatron-LM runs its jit-fused one, 10 bytes"
                " a logit:", f"# about {more:.1f} GB more on the last stage (cross_entropy"
                " megatron_fused prices it)"]
    return [*note, f"# its jit-fused one, 10 bytes a logit, needs {tried[0]:.1f} GB a device,"
            f" over the {plan.system.device.hbm_bytes / GB:g} GB it has, so its unfused loss",
            f"# runs (6 bytes a logit): about {more:.1f} GB more on the last stage"
            " (cross_entropy megatron prices it)"]
