"""The estimate against measured runs: per-run error, and how well it ranks plans.

A planner is worth its ranking. Besides each run's error (predicted / measured - 1), the
**plan-choice regret** of a group of runs of one question (one model on one system at one
global batch and sequence length) is the measured step time of the plan the estimate ranks
first, divided by the fastest measured step time of the group, minus one: 0 when the estimate
picks the fastest plan, 0.27 when its pick is 27% slower than the best one measured.
Kendall's tau of the predicted and measured order is reported beside it (1: the same order).

Plans that were tried and ran out of memory (``out_of_memory`` rows) check the other half of a
study's answer, that the plan fits: each is counted where the estimate says it fits (a study
would offer it), and a group's **first choice**, the fastest predicted of the plans the estimate
says fit, those that ran and those that did not, is the plan a study would recommend; where that
plan ran out of memory, the recommendation fails however fast the plan would have been.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TypeVar

import numpy as np

from planner.runs_csv import GroupKey, MeasuredRun, SkippedRun
from planner.units import GB
from planner.validation_by import BREAKDOWNS, nodes_spanned
from simcore import estimate
from simcore.estimate import Estimate, MemoryParts
from simcore.mixed import MixedSystemSpec
from simcore.mixed.estimate import estimate_mixed
from simcore.specs import DeviceSpec, SystemSpec

AnySystem = SystemSpec | MixedSystemSpec

__all__ = ["BREAKDOWNS", "RunResult", "GroupResult", "Validation", "validate", "kendall_tau",
           "less_memory", "nodes_spanned"]


@dataclass(frozen=True, slots=True)
class RunResult:
    run: MeasuredRun
    predicted_step_time_s: float
    predicted_peak_memory_gb: float
    """What the run measured: the device's use, or without the allowance for what PyTorch's
    allocator does not count (``memory_measured allocated``)."""
    fits: bool

    @property
    def step_time_error(self) -> float | None:
        """Signed: predicted / measured - 1 (negative: predicted too fast)."""
        measured = self.run.step_time_s
        return None if measured is None else self.predicted_step_time_s / measured - 1

    @property
    def memory_error(self) -> float | None:
        measured = self.run.peak_memory_gb
        return None if measured is None else self.predicted_peak_memory_gb / measured - 1

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.run.name, "file": self.run.file, "line": self.run.line,
            "predicted_step_time_s": self.predicted_step_time_s,
            "measured_step_time_s": self.run.step_time_s,
            "step_time_error": self.step_time_error,
            "predicted_peak_memory_gb": self.predicted_peak_memory_gb,
            "measured_peak_memory_gb": self.run.peak_memory_gb,
            "memory_error": self.memory_error,
            "fits": self.fits,
            "out_of_memory": self.run.out_of_memory,
        }


@dataclass(frozen=True, slots=True)
class GroupResult:
    key: GroupKey
    runs: tuple[RunResult, ...]
    """The group's runs with a measured step time, in the CSV's order."""
    out_of_memory: tuple[RunResult, ...] = ()
    """The group's plans that ran out of memory (``out_of_memory`` rows), in the CSV's order."""

    @property
    def picked(self) -> RunResult:
        """The run the estimate ranks first (fastest predicted; the first in the CSV on a tie)."""
        return min(self.runs, key=lambda r: r.predicted_step_time_s)

    @property
    def fastest(self) -> RunResult:
        return min(self.runs, key=lambda r: r.run.step_time_s or math.inf)

    @property
    def regret(self) -> float:
        measured = self.picked.run.step_time_s
        best = self.fastest.run.step_time_s
        assert measured is not None and best is not None  # groups hold timed runs only
        return measured / best - 1

    @property
    def first_choice(self) -> RunResult | None:
        """The plan a study would recommend: the fastest predicted of the group's plans the
        estimate says fit, timed or out of memory (a timed one first on a tie); None where it
        says none fits."""
        offered = [r for r in (*self.runs, *self.out_of_memory) if r.fits]
        return min(offered, key=lambda r: r.predicted_step_time_s) if offered else None

    @property
    def first_choice_out_of_memory(self) -> bool:
        """The first choice is a plan that ran out of memory."""
        choice = self.first_choice
        return choice is not None and choice.run.out_of_memory

    @property
    def first_choice_regret(self) -> float | None:
        """The first choice's measured step over the fastest measured, minus one, where it ran;
        None where it ran out of memory or none is estimated to fit."""
        choice = self.first_choice
        if choice is None or choice.run.step_time_s is None:
            return None
        return choice.run.step_time_s / (self.fastest.run.step_time_s or math.inf) - 1

    @property
    def kendall_tau(self) -> float:
        return kendall_tau([r.predicted_step_time_s for r in self.runs],
                           [r.run.step_time_s or 0.0 for r in self.runs])

    def to_dict(self) -> dict[str, object]:
        model, system, batch, seq, release = self.key
        key: dict[str, object] = {"model": model, "system": system, "global_batch": batch,
                                  "seq_len": seq}
        if release:
            key["release"] = release
        return {
            "key": key,
            "runs": len(self.runs), "picked": self.picked.run.name,
            "fastest": self.fastest.run.name, "regret": self.regret,
            "kendall_tau": self.kendall_tau,
            "out_of_memory_runs": len(self.out_of_memory),
            "first_choice": None if self.first_choice is None else self.first_choice.run.name,
            "first_choice_out_of_memory": self.first_choice_out_of_memory,
            "first_choice_regret": self.first_choice_regret,
        }


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-a of two rankings: (concordant - discordant) pairs over all pairs; ties in
    either count as neither. 1.0 for fewer than two items."""
    n = len(a)
    if n < 2:
        return 1.0
    x, y = np.asarray(a, float), np.asarray(b, float)
    # each item against those after it, a row of pairs at a time: exact, and memory in n
    score = sum(int(np.dot(_order(x[i], x[i + 1:]), _order(y[i], y[i + 1:])))
                for i in range(n - 1))
    return score / (n * (n - 1) / 2)


def _order(item: float, rest: np.ndarray) -> np.ndarray:
    """+1, -1 or 0 as ``item`` is above, below or tied with each of ``rest`` (compared, not
    subtracted: two infinities tie, as the pairwise loop had them)."""
    return (item > rest).astype(np.int64) - (item < rest).astype(np.int64)


def _ape(errors: Iterable[float | None]) -> list[float]:
    return [abs(e) for e in errors if e is not None]


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


@dataclass(frozen=True)
class Validation:
    results: tuple[RunResult, ...]
    skipped: tuple[SkippedRun, ...]

    @cached_property
    def groups(self) -> tuple[GroupResult, ...]:
        """The groups of timed runs of one question with two or more plans to choose between,
        in the CSV's order (one plan measured twice, as by two releases of a stack, is no
        choice), each with the question's plans that ran out of memory."""
        by_key: dict[GroupKey, list[RunResult]] = {}
        oom: dict[GroupKey, list[RunResult]] = {}
        for r in self.results:
            if r.run.step_time_s is not None:
                by_key.setdefault(r.run.group, []).append(r)
            elif r.run.out_of_memory:
                oom.setdefault(r.run.group, []).append(r)
        labels = _labels({k: v[0].run.group_label for k, v in by_key.items()})
        return tuple(GroupResult(labels[k], tuple(v), tuple(oom.get(k, ())))
                     for k, v in by_key.items()
                     if len({(r.run.plan, r.run.training) for r in v}) >= 2)

    @property
    def step_time_apes(self) -> list[float]:
        return _ape(r.step_time_error for r in self.results)

    @property
    def memory_apes(self) -> list[float]:
        return _ape(r.memory_error for r in self.results)

    @property
    def regrets(self) -> list[float]:
        return [g.regret for g in self.groups]

    def summary(self) -> dict[str, float | int | None]:
        return {
            "step_time_runs": len(self.step_time_apes),
            "step_time_mape": _mean(self.step_time_apes),
            "step_time_median_ape": _median(self.step_time_apes),
            "memory_runs": len(self.memory_apes),
            "memory_mape": _mean(self.memory_apes),
            "memory_median_ape": _median(self.memory_apes),
            "groups_count": len(self.groups),
            "regret_mean": _mean(self.regrets),
            "regret_median": _median(self.regrets),
            "picked_fastest": sum(1 for g in self.groups if g.picked is g.fastest),
            "over_memory_runs": sum(1 for r in self.results
                                    if not r.fits and not r.run.out_of_memory),
            "kendall_tau_mean": _mean([g.kendall_tau for g in self.groups]),
            "out_of_memory_runs": len(self.out_of_memory),
            "out_of_memory_estimated_fits": sum(1 for r in self.out_of_memory if r.fits),
            "groups_with_out_of_memory": sum(1 for g in self.groups if g.out_of_memory),
            "first_choice_out_of_memory": sum(1 for g in self.groups
                                              if g.first_choice_out_of_memory),
            "first_choice_regret_mean": _mean([regret for g in self.groups if g.out_of_memory
                                               and (regret := g.first_choice_regret) is not None]),
        }

    @property
    def out_of_memory(self) -> list[RunResult]:
        """The plans that ran out of memory, in the CSV's order."""
        return [r for r in self.results if r.run.out_of_memory]

    def breakdown(self, by: str) -> list[dict[str, object]]:
        """The runs split by one of :data:`BREAKDOWNS`, in the order each value first comes:
        per value, its runs' step-time MAPE, median error and mean signed error (whether they
        are estimated fast or slow as a body), and its memory MAPE."""
        key = BREAKDOWNS[by]
        parts: dict[str, list[RunResult]] = {}
        if by in ("model", "system"):  # what the cell names, labelled as the CSV writes it
            named: dict[str, list[RunResult]] = {}
            for r in self.results:
                named.setdefault(r.run.model_id or r.run.model_ref if by == "model"
                                 else r.run.system_id or r.run.system_ref, []).append(r)
            said = _labels({n: key(v[0].run) for n, v in named.items()})
            parts = {said[n]: v for n, v in named.items()}
        else:
            for r in self.results:
                parts.setdefault(key(r.run), []).append(r)
        out = []
        values = list(parts)
        if all(value.isdigit() for value in values):  # a count: in its order
            values.sort(key=int)
        for value in values:
            results = parts[value]
            errors = [e for e in (r.step_time_error for r in results) if e is not None]
            apes = _ape(errors)
            memory = _ape(r.memory_error for r in results)
            out.append({by: value, "step_time_runs": len(errors),
                        "step_time_mape": _mean(apes),
                        "step_time_median_ape": _median(apes),
                        "step_time_mean_error": _mean(errors),
                        "memory_runs": len(memory), "memory_mape": _mean(memory)})
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "rows": [r.to_dict() for r in self.results],
            **self.summary(),
            "groups": [g.to_dict() for g in self.groups],
            "skipped": [{"file": s.file, "line": s.line, "name": s.name, "reason": s.reason,
                         "bad_value": s.bad_value} for s in self.skipped],
        }


def validate(runs: Iterable[MeasuredRun], skipped: Iterable[SkippedRun] = (), *,
             system_for: Callable[[MeasuredRun], AnySystem] | None = None) -> Validation:
    """Estimate every run (on ``system_for(run)`` when given: a calibrated device swapped in)
    and compare; a run the simulator refuses joins the skipped ones with its reason. A run on
    a mixed cluster is estimated by :func:`simcore.mixed.estimate.estimate_mixed`."""
    results: list[RunResult] = []
    left_out = list(skipped)
    for run in runs:
        system = system_for(run) if system_for is not None else run.system
        try:
            est: Estimate = _estimate(run, system)
        except ValueError as e:
            left_out.append(SkippedRun(run.line, run.name, str(e), file=run.file))
            continue
        index = _measured_index(run, est)
        parts = est.memory if index is None else est.stages[index].memory
        memory = parts.total - (_unallocated(parts, _stage_device(run, system, index))
                                if run.memory_allocated else 0.0)
        results.append(RunResult(run, est.step_time, memory / GB, est.fits))
    return Validation(tuple(results), tuple(sorted(left_out, key=lambda s: (s.file, s.line))))


_K = TypeVar("_K")


def _labels(labels: dict[_K, _K]) -> dict[_K, _K]:
    """Each key's label (its model and system as the CSV writes them), but where two keys share
    one (``models.yaml#m`` beside two CSVs in two folders: two models), those keys themselves
    (what the cells name: the files' resolved paths)."""
    counts = Counter(labels.values())
    return {k: label if counts[label] == 1 else k for k, label in labels.items()}


def _estimate(run: MeasuredRun, system: AnySystem) -> Estimate:
    if run.mixed is not None:
        assert isinstance(system, MixedSystemSpec)
        return estimate_mixed(run.model, system, run.training, run.mixed)
    assert isinstance(system, SystemSpec) and run.strategy is not None
    return estimate(run.model, system, run.training, run.strategy)


def _measured_index(run: MeasuredRun, est: Estimate) -> int | None:
    """The estimate's stage the run's peak was measured on (:attr:`MeasuredRun.memory_stage`),
    or None for the estimate's peak stage: the first or the last; the peak, on a mixed cluster,
    the stage that holds the most (the estimate's peak stage is the one nearest its own part's
    memory)."""
    if not est.stages:
        return None
    if run.memory_stage in ("first", "last"):
        return 0 if run.memory_stage == "first" else len(est.stages) - 1
    if run.mixed is not None:
        return max(range(len(est.stages)), key=lambda i: est.stages[i].memory.total)
    return None


def _stage_device(run: MeasuredRun, system: AnySystem, index: int | None) -> DeviceSpec:
    """The device of the stage the run's peak was measured on."""
    if isinstance(system, SystemSpec):
        return system.device
    assert run.mixed is not None and index is not None
    return system.groups[run.mixed.stages[index].group].device


def less_memory(margin_gb: float) -> Callable[[MeasuredRun], AnySystem] | None:
    """Each run's system with ``margin_gb`` less memory on its part, for :func:`validate`'s
    ``system_for``: a plan's fit judged as a study whose ``hbm_gb`` is below the part's judges
    it (``planner validate --margin-gb``); None for no margin. A part with no more memory than
    the margin is a ValueError naming the run."""
    if not margin_gb:
        return None

    def less(run: MeasuredRun, one: SystemSpec) -> SystemSpec:
        device = one.device
        left = device.hbm_bytes - margin_gb * GB
        if left <= 0:
            raise ValueError(f"{run.file}:{run.line} runs on {device.name},"
                             f" {device.hbm_bytes / GB:g} GB; keep less free")
        return replace(one, device=replace(device, hbm_bytes=left))

    def system(run: MeasuredRun) -> AnySystem:
        if isinstance(run.system, MixedSystemSpec):  # the parts of the groups the plan uses
            assert run.mixed is not None
            used = run.mixed.groups_used
            return replace(run.system, groups=tuple(less(run, g) if i in used else g
                                                    for i, g in enumerate(run.system.groups)))
        return less(run, run.system)
    return system


def _unallocated(parts: MemoryParts, device: DeviceSpec) -> float:
    """The part of the stage's allowance a measured allocated peak leaves out: all of it but
    the GEMM libraries' workspaces (:attr:`simcore.specs.DeviceSpec.workspace_bytes`)."""
    return max(0.0, parts.overhead - device.workspace_bytes)
