"""torchtitan's stack and loss against those a plan was priced with.

torchtitan computes its loss with ``torch.nn.functional.cross_entropy`` on an fp32 copy of the
logits (pytorch/torchtitan@31a17bfdb7 ``torchtitan/components/loss.py``): 12 bytes a logit at
its peak where Megatron-LM's fused loss holds 4 (:class:`simcore.specs.CrossEntropy`). It runs
PyTorch's kernels, not Transformer Engine's, and its own checkpointing
(:func:`search_spaces.frameworks.with_framework_defaults`). A plan priced otherwise (a study of
another framework, or of ``any``, whose stack is the device's default) is estimated again as
torchtitan runs it before it is exported for torchtitan: refused if it fit and no longer does,
else the job file says what the step time and the peak become (as the Megatron-LM and DeepSpeed
exports say theirs, :func:`planner.exports._reprice.stack_check`).
"""

from __future__ import annotations

from dataclasses import replace

from planner.exports._reprice import priced, reprice
from planner.plan import Plan
from planner.units import GB
from simcore.specs import CrossEntropy

__all__ = ["torchtitan_loss_check"]


def torchtitan_loss_check(plan: Plan) -> str | None:
    """A comment for the job file when torchtitan's stack or loss changes the figures of
    ``plan``, its :func:`planner.exports._reprice.run_by` view (None when it does not); raises
    ValueError when a plan that fits no longer fits under them."""
    training = replace(plan.training, cross_entropy=CrossEntropy.PYTORCH)
    est = reprice(plan, training, "torchtitan's loss (cross_entropy on an fp32 copy of the"
                  " logits, 12 bytes a logit) and stack", "run the study with framework:"
                  " torchtitan (or training cross_entropy: pytorch) to find one that fits")
    step, peak = est.step_time, est.memory.total / GB
    same_step = round(step, 3) == round(plan.estimate.step_time, 3)
    if same_step and round(peak, 1) == round(plan.estimate.memory.total / GB, 1):
        return None  # the peak is on a stage without the loss, the stack the same
    if same_step:
        return (f"the estimate priced Megatron-LM's fused loss; under torchtitan's the peak is"
                f" {peak:.1f} GB a device (step time unchanged)")
    return (f"{priced(plan)}; as torchtitan runs the plan (its kernels, its checkpointing,"
            f" its loss): step time {step:.3f} s, peak memory {peak:.1f} GB a device")
