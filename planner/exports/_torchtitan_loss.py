"""torchtitan's stack and loss against those a plan was priced with.

torchtitan computes its loss with ``torch.nn.functional.cross_entropy`` on an fp32 copy of the
logits (pytorch/torchtitan@31a17bfdb7 ``torchtitan/components/loss.py``): 12 bytes a logit at
its peak where Megatron-LM's fused loss holds 4 (:class:`simcore.specs.CrossEntropy`). Main
(b5bcd76c) takes it a slice of the tokens at a time (``ChunkedLossWrapper`` in every language
model's ``config_registry.py``: ``chunked``), which the Python form runs; v0.2.2, the TOML
form's, takes it on all the logits at once (``pytorch``). It runs PyTorch's kernels, not
Transformer Engine's, and its own checkpointing
(:func:`search_spaces.frameworks.with_framework_defaults`). A plan is estimated again with each
form's loss before it is written: refused (or, for the TOML form alone, left without one) if it
fit and no longer does, else the file says what the step time and the peak become (as the
Megatron-LM and DeepSpeed exports say theirs, :func:`planner.exports._reprice.stack_check`).
"""

from __future__ import annotations

from dataclasses import replace

from planner.exports._reprice import priced, reprice
from planner.plan import Plan
from planner.units import GB
from simcore.specs import CrossEntropy

__all__ = ["TORCHTITAN_LOSSES", "torchtitan_loss_check"]

TORCHTITAN_LOSSES = {
    CrossEntropy.CHUNKED: "torchtitan main's loss (ChunkedLossWrapper: cross_entropy on an fp32"
                          " copy of an eighth of the logits at a time)",
    CrossEntropy.PYTORCH: "torchtitan v0.2.2's loss (cross_entropy on an fp32 copy of all the"
                          " logits, 12 bytes a logit)",
}
"""Each config form's loss: the Python form's (main) and the TOML form's (v0.2.2)."""


def torchtitan_loss_check(plan: Plan, loss: CrossEntropy = CrossEntropy.CHUNKED) -> str | None:
    """A comment for the job file when torchtitan's stack or ``loss`` (one of
    :data:`TORCHTITAN_LOSSES`) changes the figures of ``plan``, its
    :func:`planner.exports._reprice.run_by` view (None when it does not); raises ValueError
    when a plan that fits no longer fits under them."""
    name = TORCHTITAN_LOSSES[loss]
    est = reprice(plan, replace(plan.training, cross_entropy=loss), f"{name} and stack",
                  "run the study with framework: torchtitan (or training cross_entropy:"
                  f" {loss.value}) to find one that fits")
    step, peak = est.step_time, est.memory.total / GB
    old = plan.estimate
    same_step = round(step, 3) == round(old.step_time, 3)
    if same_step and round(peak, 1) == round(old.memory.total / GB, 1):
        return None  # the peak is on a stage without the loss, the stack the same
    if same_step:
        return (f"under {name} the peak is {peak:.1f} GB a device, the estimate's"
                f" {old.memory.total / GB:.1f} GB (step time unchanged)")
    return (f"{priced(plan)}; as torchtitan runs the plan (its kernels, its checkpointing,"
            f" {name}): step time {step:.3f} s, peak memory {peak:.1f} GB a device")
