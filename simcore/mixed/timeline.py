"""The timeline of one step of a plan on a mixed cluster: each stage's row names its device.

The same discrete-event schedule as the one-type timeline (:func:`simcore.timeline.
schedule_pipeline`), fed with each stage's own times from :func:`simcore.mixed.estimate_mixed`:
a forward and a backward per micro-batch whose sum is the stage's estimated micro-batch time
(the backward is the estimate's backward window, the sends to the neighbours split evenly
between the two and drawn on the stage's communication row), then the slowest exposed gradient
reduction and the optimizer. tp communication and recompute are drawn inside the compute bars.
"""

from __future__ import annotations

import numpy as np

from simcore.megatron.step import _dp_time, _optimizer_time
from simcore.mixed.estimate import StageCosts, _stages, check_mixed, estimate_mixed
from simcore.mixed.specs import MixedPlan, MixedSystemSpec
from simcore.specs import ModelSpec, TrainingSpec
from simcore.timeline import (
    _OP_PARTS,
    Timeline,
    _pipeline_spans,
    _Spans,
    _tail_spans,
    schedule_pipeline,
)

__all__ = ["mixed_timeline"]


def mixed_timeline(model: ModelSpec, system: MixedSystemSpec, training: TrainingSpec,
                   plan: MixedPlan, costs: StageCosts | None = None, *,
                   step_time: float | None = None) -> Timeline:
    """One step of ``plan``; rows ``stage i: GROUP (DEVICE)`` and their communication rows.
    ``step_time``, if given, must be the plan's estimate (it saves estimating again)."""
    check_mixed(model, system, training, plan)
    costs = costs or StageCosts(model, system, training)
    stages = _stages(costs, plan)
    pp, m = plan.pp, plan.micro_batches
    parts = np.zeros((pp, 2, 1, len(_OP_PARTS)))
    compute, p2p = _OP_PARTS.index("compute"), _OP_PARTS.index("p2p")
    for i, (_, st) in enumerate(stages):
        send = st.pp / 2
        parts[i, 1, 0, compute] = st.bwd
        parts[i, 0, 0, compute] = st.time - st.pp - st.bwd
        parts[i, :, 0, p2p] = send
    totals = parts.sum(axis=3)
    ops = schedule_pipeline(plan.schedule, totals[:, 0], totals[:, 1], m)
    spans = _Spans()
    _pipeline_spans(spans, ops, parts)
    flush = ops.makespan
    dp = [_dp_time(placed.plan, st) for placed, st in stages]
    link, exposed = max(dp, key=lambda d: d[1])
    optimizer = max(_optimizer_time(placed.plan, st) for placed, st in stages)
    end = _tail_spans(spans, 2 * pp, flush, exposed, link - exposed, optimizer)
    labels = []
    for i, st in enumerate(plan.stages):
        group = system.groups[st.group]
        head = f"stage {i}: {group.name} ({group.device.name})"
        labels += [head, f"stage {i} comm"]
    rows, cols = spans.arrays(labels + ["dp grad reduce", "optimizer"])
    step = step_time if step_time is not None else \
        estimate_mixed(model, system, training, plan, costs).step_time
    times = [st.time for _, st in stages]
    note = (f"{plan.schedule} schedule on a mixed cluster, p={pp}, m={m}: each stage's row names"
            " its device; forward and backward per micro-batch (tp and recompute inside the"
            " bars), the sends to the neighbouring stages on the comm rows; then the slowest"
            " exposed dp reduction and the optimizer.")
    return Timeline("megatron", str(plan.schedule), pp, 1, m, rows, **cols, pipeline_end=flush,
                    end=end, bubble=flush - m * max(times), estimate_step_time=step, note=note,
                    sweeps=ops.sweeps)
