"""A mixed-device space too large to list, sampled with Optuna.

The exhaustive search (:func:`search_spaces.mixed.search_mixed`) proves its best plan; when the
space holds more plans than the user wants to estimate, TPE samples it instead and the result
says it is sampled. A trial picks the pipeline's skeleton, the part that makes spaces large:

- ``order``: one categorical over every ordered non-empty subset of the groups;
- ``layout_<group>``: one categorical per group over its stage layouts, sampled on every trial
  even when the order leaves the group idle, so every trial has the same parameters (fixed
  categorical choices suit multivariate TPE, ``../shared/optuna-notes.md`` section 3).

Within a skeleton, every micro-batch count, recompute and ZeRO choice is estimated (tens of plans,
each with its layer split solved) and the trial's value is the best that fits; a skeleton with
none that fits sets the ``memory`` constraint to its least excess over HBM in GB. Skeletons with
more stages than layers are pruned. On Metis's rows this finds the proven best with 400 trials
for seeds 0-2, where sampling every knob per trial missed it by up to 16% with 1,000
(``benchmarks/bench_mixed.py``).
"""

from __future__ import annotations

import itertools
from typing import Any

import optuna

from search_spaces.mixed import (
    GroupLayout,
    MixedResult,
    MixedSpace,
    group_layouts,
    plan_row,
    plans_of,
    result_table,
)
from simcore.mixed import MixedPlan
from simcore.mixed.estimate import StageCosts

__all__ = ["layout_label", "sample_mixed"]


def layout_label(c: GroupLayout) -> str:
    """A group layout as a parameter value, e.g. ``4 stages tp2 dp2``."""
    return f"{c.stages} stages tp{c.tp} dp{c.dp}"


class _Encoding:
    def __init__(self, space: MixedSpace) -> None:
        self.space = space
        groups = space.system.groups
        self.names = [g.name for g in groups]
        self.layouts = [{layout_label(c): c for c in group_layouts(space, g)}
                        for g in range(len(groups))]
        usable = [g for g in range(len(groups)) if self.layouts[g]]
        self.orders = {">".join(self.names[g] for g in order): order
                       for r in range(1, len(usable) + 1)
                       for order in itertools.permutations(usable, r)}

    def skeleton(self, trial: optuna.Trial) -> tuple[GroupLayout, ...]:
        """The trial's group order and layouts; raises TrialPruned for more stages than
        layers."""
        order = self.orders[trial.suggest_categorical("order", list(self.orders))]
        chosen = {g: layouts[trial.suggest_categorical(f"layout_{self.names[g]}", list(layouts))]
                  for g, layouts in enumerate(self.layouts) if layouts}
        picked = tuple(chosen[g] for g in order)
        if sum(c.stages for c in picked) > self.space.model.layers:
            raise optuna.TrialPruned("more stages than layers")
        return picked


Solved = list[tuple[MixedPlan, dict[str, Any]]]


def _excess_gb(space: MixedSpace, solved: Solved) -> float:
    """The least excess over HBM (GB) of the skeleton's plans; -1 when one fits."""
    if any(row["fits"] for _, row in solved):
        return -1.0
    return max(min(float(row["peak_memory_gb"])
                   - space.system.groups[plan.stages[int(row["peak_stage"])].group]
                   .device.hbm_bytes / 1e9 for plan, row in solved), 1e-3)


def sample_mixed(space: MixedSpace, trials: int, seed: int = 0,
                 progress: bool = False) -> MixedResult:
    """Sample ``trials`` group orders and layouts with multivariate TPE; each distinct one has
    all its plans estimated once. Ctrl-C stops the sampling and keeps what was estimated."""
    enc = _Encoding(space)
    costs = StageCosts(space.model, space.system, space.training, space.profiles)
    seen: dict[tuple[GroupLayout, ...], Solved] = {}

    def objective(trial: optuna.Trial) -> float:
        chosen = enc.skeleton(trial)
        if chosen not in seen:
            seen[chosen] = [s for plan in plans_of(space, chosen)
                            if (s := plan_row(space, costs, plan)) is not None]
        solved = seen[chosen]
        if not solved:
            raise optuna.TrialPruned("no plan of this layout runs")
        excess = _excess_gb(space, solved)
        trial.set_constraint("memory", excess)
        fitting = [row for _, row in solved if row["fits"] or excess > 0]
        best = min(fitting, key=lambda row: row["step_time_s"])
        trial.set_user_attr("plan", best["plan"])
        return float(best["step_time_s"])

    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed))
    interrupted = False
    try:
        study.optimize(objective, n_trials=trials, show_progress_bar=progress)
    except KeyboardInterrupt:
        interrupted = True  # keep the plans estimated so far
    solved = [s for plans in seen.values() for s in plans]
    done = sum(t.state.is_finished() for t in study.trials)
    return MixedResult(space, result_table([row for _, row in solved]),
                       {str(row["plan"]): plan for plan, row in solved}, len(seen), trials=done,
                       interrupted=interrupted)
