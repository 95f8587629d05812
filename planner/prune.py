"""Pruning by bounds (``planner run --prune``, issue 17 item 4): the plans of a big exhaustive
study that provably cannot be among what its Optuna study keeps are never estimated.

A big study (more than :data:`~planner.results_parquet.TRIALS_KEPT` plans) keeps as trials the
Pareto front in (step time, peak memory) of every plan, that of the HBM-feasible plans and the
:data:`~planner.results_parquet.BEST_KEPT` fastest feasible plans
(:func:`~planner.results_parquet.kept_numbers`). Each plan has lower bounds on both figures
(:func:`simcore.megatron.bounds.lower_bounds`, a few microseconds a plan against the estimate's
tens). First some plans are estimated, the seeds: twice ``BEST_KEPT`` with the lowest step-time
bounds that may fit, and along the front the lowest step-time bounds of :data:`BANDS` bands by
memory bound. A plan is then skipped when all three hold, each proved by seeds the study
estimates too:

- it is not among the fastest feasible plans: its memory bound is over the HBM limit, or its
  step-time bound exceeds the time of the ``BEST_KEPT``-th fastest feasible seed (that many
  feasible plans are faster);
- it is off the front of every plan: a seed is faster than its step-time bound with no more
  memory than its memory bound (the seed dominates it);
- it is off the feasible front: it cannot fit, or a feasible seed dominates it so.

A seed a plan was skipped for may itself be skipped for another, faster seed; the chain ends at
a plan that is estimated. So the best plan, both fronts and the best plans are those of the
whole space (tests/test_prune.py compares them with an unpruned run); the results table holds
the estimated plans only, and the study's ``results`` attribute counts the skipped ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner import results_parquet as rp
from planner.record import Evaluator
from planner.units import GB
from search_spaces import StrategySpace
from simcore.megatron.bounds import lower_bounds
from simcore.specs import Convention

__all__ = ["BANDS", "PER_BAND", "Pruning", "can_prune", "prune"]

BANDS, PER_BAND = 200, 10
"""Seeds along the front: the lowest step-time bounds of each of 200 bands by memory bound
(beside twice :data:`~planner.results_parquet.BEST_KEPT` with the lowest step-time bounds that
may fit). On the 92,496-plan GPT-3 study 47% of the plans are skipped; with every plan's figures
known beforehand, 61% would be."""


@dataclass(frozen=True, slots=True)
class Pruning:
    """What to estimate of the valid plans given."""

    kept: np.ndarray
    """Their flat indices (ascending)."""
    pruned: int
    seeds: int


def can_prune(space: StrategySpace) -> bool:
    """Whether the bounds cover the space's plans: the megatron convention's dense models, in a
    space listed as arrays (no framework rule)."""
    return (space.convention is Convention.MEGATRON and space.model.moe is None
            and space.valid_indices() is not None)


def prune(evaluator: Evaluator, space: StrategySpace, indices: np.ndarray) -> Pruning:
    """The plans at ``indices`` (the space's valid flat indices) that may be kept; see the
    module docstring."""
    bounds = lower_bounds(evaluator.model, evaluator.system, evaluator.training,
                          space.columns_at(indices))
    step_lb, memory_lb = bounds.step_time_s, bounds.memory_bytes / GB
    over = (memory_lb > evaluator.hbm_gb if evaluator.hbm_gb is not None
            else np.zeros(len(indices), bool))
    seeds = _seeds(step_lb, memory_lb, over)
    figures = evaluator.frame(space.strategies_at(indices[seeds]))
    step = figures["step_time_s"].to_numpy()
    memory = figures["peak_memory_gb"].to_numpy()
    feasible = figures["feasible"].to_numpy(bool)
    slower = over.copy()
    fastest = np.sort(step[feasible])
    if len(fastest) >= rp.BEST_KEPT:
        slower |= step_lb > fastest[rp.BEST_KEPT - 1]
    front = rp.pareto_mask(step, memory)
    off_front = _dominated(step[front], memory[front], step_lb, memory_lb)
    fits = np.flatnonzero(feasible)
    feasible_front = fits[rp.pareto_mask(step[fits], memory[fits])]
    off_feasible = over | _dominated(step[feasible_front], memory[feasible_front], step_lb,
                                     memory_lb)
    skip = slower & off_front & off_feasible
    skip[seeds] = False
    return Pruning(indices[~skip], int(skip.sum()), len(seeds))


def _seeds(step_lb: np.ndarray, memory_lb: np.ndarray, over: np.ndarray) -> np.ndarray:
    """Positions of the plans estimated first (ascending): twice ``BEST_KEPT`` with the lowest
    step-time bounds that may fit, and along the whole front, the :data:`PER_BAND` with the
    lowest step-time bounds in each of :data:`BANDS` bands of equal count by memory bound."""
    may_fit = np.flatnonzero(~over)
    fast = may_fit[np.argsort(step_lb[may_fit], kind="stable")[:2 * rp.BEST_KEPT]]
    by_memory = np.argsort(memory_lb, kind="stable")
    bands = [band[np.argsort(step_lb[band], kind="stable")[:PER_BAND]]
             for band in np.array_split(by_memory, BANDS)]
    return np.union1d(fast, np.concatenate(bands))


def _dominated(front_step: np.ndarray, front_memory: np.ndarray, step_lb: np.ndarray,
               memory_lb: np.ndarray) -> np.ndarray:
    """Which plans some front point dominates whatever their figures: it is faster than their
    step-time bound and needs no more than their memory bound."""
    if len(front_step) == 0:
        return np.zeros(len(step_lb), bool)
    order = np.argsort(front_step, kind="stable")
    times = front_step[order]
    least = np.minimum.accumulate(front_memory[order])  # least memory among the faster ones
    faster = np.searchsorted(times, step_lb, side="left") - 1  # last point strictly faster
    out = np.zeros(len(step_lb), bool)
    some = faster >= 0
    out[some] = least[faster[some]] <= memory_lb[some]
    return out
