"""torchtitan's loss against the loss a plan was priced with.

torchtitan computes its loss with ``torch.nn.functional.cross_entropy`` on an fp32 copy of the
logits (pytorch/torchtitan@31a17bfdb7 ``torchtitan/components/loss.py``): 12 bytes a logit at
its peak where Megatron-LM's fused loss holds 4 (:class:`simcore.specs.CrossEntropy`). A plan
priced with the fused loss (a study of another framework, or of ``any``) is estimated again
with torchtitan's before it is exported for torchtitan: refused if it fit and no longer does,
else the job file says what the peak becomes.
"""

from __future__ import annotations

from dataclasses import replace

from planner.exports._reprice import reprice
from planner.plan import Plan
from planner.units import GB
from simcore.specs import CrossEntropy

__all__ = ["torchtitan_loss_check"]


def torchtitan_loss_check(plan: Plan) -> str | None:
    """A comment for the job file when torchtitan's loss raises the plan's peak (None when the
    plan was priced with it, or its peak is on a stage without the loss); raises ValueError
    when a plan that fits no longer fits under it."""
    if plan.training.cross_entropy is CrossEntropy.PYTORCH:
        return None
    training = replace(plan.training, cross_entropy=CrossEntropy.PYTORCH)
    est = reprice(plan, training, "torchtitan's loss (cross_entropy on an fp32 copy of the"
                  " logits, 12 bytes a logit)", "run the study with framework: torchtitan (or"
                  " training cross_entropy: pytorch) to find one that fits")
    assert est is not None  # the training differs
    peak = est.memory.total / GB
    if round(peak, 1) == round(plan.estimate.memory.total / GB, 1):
        return None  # the peak is on a stage without the loss
    return (f"the estimate priced Megatron-LM's fused loss; under torchtitan's the peak is"
            f" {peak:.1f} GB a device (step time unchanged)")
