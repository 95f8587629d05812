"""A check shared by the precision tests: a space's batched estimate agrees with the estimate
one plan at a time, and the pruning bounds stay at or below it."""

from __future__ import annotations

import numpy as np
import pytest

import simcore
from search_spaces.space import StrategySpace
from simcore.megatron.batched import estimate_many
from simcore.megatron.bounds import lower_bounds


def assert_batched_and_bounds_hold(space: StrategySpace) -> None:
    """Every valid plan of ``space``: the batched step time and peak memory equal the scalar
    estimate's, and :func:`lower_bounds` is no higher than either (a higher bound would prune a
    plan that may win)."""
    flat = space.valid_indices()
    assert flat is not None
    plans = space.strategies_at(flat)
    model, system, training = space.model, space.system, space.training
    batched = estimate_many(model, system, training, plans)
    for i, s in enumerate(plans):
        one = simcore.estimate(model, system, training, s)
        assert batched.step_time[i] == pytest.approx(one.step_time, rel=1e-12)
        assert batched.peak_memory[i] == pytest.approx(one.memory.total, rel=1e-12)
    bounds = lower_bounds(model, system, training, space.columns_at(flat))
    assert np.all(bounds.step_time_s <= batched.step_time)
    assert np.all(bounds.memory_bytes <= batched.peak_memory)
