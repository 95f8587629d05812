"""What ``planner validate --by`` splits measured runs by: each run's value of a knob."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from planner.runs_csv import MeasuredRun
from simcore.megatron.checks import micro_batches
from simcore.mixed import MixedSystemSpec
from simcore.mixed.span import stage_parts
from simcore.specs import Strategy

__all__ = ["BREAKDOWNS", "nodes_spanned"]

BREAKDOWNS: dict[str, Callable[[MeasuredRun], str]] = {
    "release": lambda run: run.release or "-",
    "model": lambda run: run.model_ref,
    "system": lambda run: run.system_ref,
    "device": lambda run: run.device.name if run.device is not None else _groups_used(run),
    "precision": lambda run: _knob(run, lambda s: s.precision.value, lambda run: "bf16"),
    "file": lambda run: run.file,
    # the plan's knobs, to find where a set of runs is estimated fast or slow as a body
    "gpus": lambda run: str(run.plan.devices),
    "nodes": lambda run: str(nodes_spanned(run)),
    "dp": lambda run: _knob(run, lambda s: str(s.dp), lambda run: _per_stage(run, "dp")),
    "tp": lambda run: _knob(run, lambda s: str(s.tp), lambda run: _per_stage(run, "tp")),
    "pp": lambda run: str(run.plan.pp),
    "cp": lambda run: _knob(run, lambda s: str(s.sp), lambda run: "1"),
    "micro_batch": lambda run: _knob(run, lambda s: str(s.micro_batch), _replica_batches),
    "micro_batches": lambda run: _knob(run, lambda s: str(micro_batches(run.training, s)),
                                       lambda run: str(run.plan.micro_batches)),
    "zero": lambda run: str(int(run.plan.zero)),
    "recompute": lambda run: run.plan.recompute.value,
    "schedule": lambda run: run.plan.schedule.value,
    "cp_comm": lambda run: run.training.cp_exchange.value,
    "framework": lambda run: run.framework or "-",
}
"""What ``planner validate --by`` splits the runs by: each run's value of it (``cp``: context
parallelism, the strategy's ``sp``; ``micro_batches``: a step's per pipeline, global batch /
(dp x micro-batch); ``nodes``: :func:`nodes_spanned`). A run on a mixed cluster gives its
devices and its stages' degrees and per-replica micro-batches joined by ``+`` where they differ
(``v100+t4``, ``4+2``)."""


def _knob(run: MeasuredRun, of_strategy: Callable[[Strategy], str],
          of_mixed: Callable[[MeasuredRun], str]) -> str:
    return of_mixed(run) if run.strategy is None else of_strategy(run.strategy)


def _joined(values: Iterable[object]) -> str:
    return "+".join(dict.fromkeys(str(v) for v in values))


def _groups_used(run: MeasuredRun) -> str:
    system, plan = run.system, run.mixed
    assert isinstance(system, MixedSystemSpec) and plan is not None
    return _joined(system.groups[g].device.name for g in plan.groups_used)


def _per_stage(run: MeasuredRun, degree: str) -> str:
    assert run.mixed is not None
    return _joined(getattr(st, degree) for st in run.mixed.stages)


def _replica_batches(run: MeasuredRun) -> str:
    """Sequences a replica takes at a time, stage by stage (:class:`MixedPlan`)."""
    plan = run.mixed
    assert plan is not None
    share = run.training.global_batch // plan.micro_batches
    return _joined(max(share // st.dp, 1) for st in plan.stages)


def nodes_spanned(run: MeasuredRun) -> int:
    """The nodes the run's plan spans: its devices over the system's first network dimension
    (a node's NVLink domain; an NVL72 rack's 72), rounded up; on a mixed cluster, each group's
    devices the plan uses over that group's node."""
    system = run.system
    if isinstance(system, MixedSystemSpec):
        assert run.mixed is not None
        used = [0] * len(system.groups)
        for parts in stage_parts(system, run.mixed):
            for part in parts:
                used[part.group] += part.devices
        return sum(math.ceil(n / g.network.dims[0].npus) for n, g in zip(used, system.groups))
    return math.ceil(run.plan.devices / system.network.dims[0].npus)
