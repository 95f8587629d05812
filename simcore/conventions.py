"""The graph conventions behind one small interface: each says how to check a plan, estimate
it and draw its step. :func:`simcore.estimate`, :func:`simcore.check` and
:func:`simcore.step_timeline` look the convention up here instead of branching on it, so a new
one (mixture-of-experts, say) is one :func:`register` call, not an edit of each entry point.

Plans on clusters that mix device types have their own plan type (:class:`simcore.mixed.
MixedPlan`: stages on groups, each with its tp, dp and layers) and their own three functions,
:func:`simcore.mixed.check_mixed`, :func:`simcore.mixed.estimate_mixed` and
:func:`simcore.mixed.timeline.mixed_timeline`, re-exported by :mod:`simcore`; their stages are
priced by the ``megatron`` convention's stage model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from simcore.estimate import Estimate
from simcore.megatron import estimate_megatron
from simcore.megatron.checks import check_plan, valid_plans
from simcore.mlp import check_mlp, estimate_mlp, valid_mlp_plans
from simcore.specs import Convention, ModelSpec, Strategy, SystemSpec, TrainingSpec
from simcore.stage_adapter import check_stage, estimate_stage
from simcore.timeline import Timeline, _megatron_timeline, _mlp_timeline, _stage_timeline

__all__ = ["CONVENTIONS", "ConventionImpl", "implementation", "register"]

Plan = tuple[ModelSpec, SystemSpec, TrainingSpec, Strategy]


@dataclass(frozen=True, slots=True)
class ConventionImpl:
    """What a convention provides. Each takes ``(model, system, training, strategy)``;
    ``timeline`` also the plan's estimate."""

    check: Callable[[ModelSpec, SystemSpec, TrainingSpec, Strategy], None]
    estimate: Callable[[ModelSpec, SystemSpec, TrainingSpec, Strategy], Estimate]
    timeline: Callable[[ModelSpec, SystemSpec, TrainingSpec, Strategy, Estimate], Timeline]
    valid_plans: Callable[[ModelSpec, SystemSpec, TrainingSpec, Mapping[str, np.ndarray]],
                          np.ndarray] | None = None
    """``check`` over arrays of strategies (see :func:`simcore.megatron.checks.valid_plans`);
    None where only the one-by-one check exists."""


CONVENTIONS: dict[Convention, ConventionImpl] = {}


def register(convention: Convention, impl: ConventionImpl) -> None:
    CONVENTIONS[convention] = impl


def implementation(convention: Convention) -> ConventionImpl:
    found = CONVENTIONS.get(convention)
    if found is None:
        raise ValueError(f"convention {convention} has no implementation; registered:"
                         f" {', '.join(str(c) for c in CONVENTIONS)}")
    return found


register(Convention.MEGATRON, ConventionImpl(
    check=check_plan, estimate=estimate_megatron, valid_plans=valid_plans,
    timeline=lambda model, system, training, strategy, est: _megatron_timeline(
        model, system, training, strategy, est.step_time)))
register(Convention.MLP, ConventionImpl(
    check=check_mlp, estimate=estimate_mlp, valid_plans=valid_mlp_plans,
    timeline=lambda model, system, training, strategy, est: _mlp_timeline(
        training, strategy, est)))
register(Convention.STAGE, ConventionImpl(
    check=check_stage, estimate=estimate_stage,
    timeline=lambda model, system, training, strategy, est: _stage_timeline(strategy, est)))
