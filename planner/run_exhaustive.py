"""The exhaustive path of ``planner run`` (and ``sampler: random``, a fixed draw of plans):
every plan estimated in chunks at once (:meth:`planner.record.Evaluator.frame`, numpy over the
strategies), its row written to the study's results table (:mod:`planner.results_parquet`),
then its trial recorded.

Which plans become Optuna trials: every one when the study holds at most
:data:`~planner.results_parquet.TRIALS_KEPT` plans (as before the table existed); beyond, the
table holds every plan and, once all are estimated, the study gets the fronts and the best plans
(:func:`~planner.results_parquet.kept_numbers`). The choice is stored with the study
(``results``), so a resume makes the same one.

Exactly once. A chunk's rows are written before its trials are recorded, and a resume reads
which plans the table holds (its ``plan`` column) and which the study holds: it estimates only
the plans missing from either, writes the rows the table lacks and records the trials the study
lacks. Ctrl-C stops after the chunk's batch of trials being recorded; a SIGKILL loses at most a
part being written (hidden until it is whole).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import optuna
import pandas as pd
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from planner import results_parquet as rp
from planner.plan import strategy_from_attrs
from planner.prune import can_prune, prune
from planner.record import frozen_trial
from planner.run_common import StopRequest, _bar
from planner.run_jobs import estimate_frames, estimate_frames_at
from planner.storage import PlannerRDBStorage, batched
from planner.study_config import StudyConfig
from search_spaces import LayoutEncoding, strategy_label
from simcore.specs import Strategy

__all__ = ["BATCH", "CHUNK", "exhaustive", "stored_plans"]

BATCH = 512
"""Trials per write to the study (one journal append, or one database transaction)."""
CHUNK = 100_000
"""Plans estimated at once and written as one part of the table: ~50 MB of arrays."""
PARALLEL_MIN = 4_000
"""Fewer plans than this are estimated in this process even with ``--jobs N``: starting the
workers and shipping the strategies costs more than the estimate (~0.03 ms per plan)."""


def stored_plans(study: optuna.Study, storage: BaseStorage) -> set[str]:
    """The plans of the study's COMPLETE trials (on a database: one query for just them)."""
    if isinstance(storage, PlannerRDBStorage):
        return set(storage.user_attr_values(study._study_id, "plan", TrialState.COMPLETE))
    return {t.user_attrs.get("plan")
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}


def _mode(study: optuna.Study, storage: BaseStorage, table: rp.ResultsTable | None,
          plans: int, prune: bool) -> str:
    """Which plans become trials: the study's stored choice, else made now and stored (before
    any row or trial), with whether its plans are pruned by bounds (a big study of a space
    listed as arrays only: :mod:`planner.prune`). A study without a table, or begun before
    tables existed: all."""
    stored = study.user_attrs.get(rp.RESULTS)
    if stored:
        return str(stored["trials_kept"])
    if table is None or storage.get_n_trials(study._study_id) > 0:
        return rp.ALL
    mode = rp.FRONT_BEST if plans > rp.TRIALS_KEPT else rp.ALL
    results = {"parquet": str(table.path.absolute()), "plans": plans, "trials_kept": mode}
    if prune and mode == rp.FRONT_BEST:
        results["prune"] = True
    study.set_user_attr(rp.RESULTS, results)
    return mode


def _kept_indices(study: optuna.Study, config: StudyConfig) -> np.ndarray | None:
    """The valid indices left after pruning by bounds (the same on every resume: the seeds and
    bounds are fixed by the space), or None when the study is not pruned."""
    results = study.user_attrs.get(rp.RESULTS) or {}
    indices = config.space.valid_indices()
    if not results.get("prune") or indices is None:
        return None
    pruning = prune(config.evaluator(), config.space, indices)
    if results.get("pruned") != pruning.pruned:
        study.set_user_attr(rp.RESULTS, {**results, "pruned": pruning.pruned,
                                         "seeds": pruning.seeds})
    return pruning.kept


def exhaustive(study: optuna.Study, storage: BaseStorage, config: StudyConfig, label: str | None,
               jobs: int, progress: bool, stop: StopRequest,
               plans: Sequence[Strategy] | None = None, prune: bool = False) -> int:
    """Estimate every valid strategy of the space (or ``plans``) not stored yet, or with
    ``prune`` (a new big study) every one its bounds do not rule out; returns the trials
    recorded."""
    where = rp.results_path(label, study.study_name) if label else None
    table = rp.ResultsTable(where) if where else None
    in_study = stored_plans(study, storage)
    in_table = table.plans() if table else None
    total = config.space.valid_count if plans is None else len(plans)
    mode = _mode(study, storage, table, total, prune and plans is None
                 and can_prune(config.space))
    kept = _kept_indices(study, config) if plans is None else None
    indices = _fresh_indices(config, plans, kept, jobs, in_study, in_table)
    if indices is not None:  # the chunks' strategies are built where they are estimated
        todo: Sequence[Strategy] = _Lazy(config, indices)
    else:
        strategies = (plans if plans is not None else config.space.valid if kept is None
                      else config.space.strategies_at(kept))
        todo = _todo(strategies, in_study, in_table, mode)
    run = _Recorder(study, storage, config, table, in_study, in_table, mode, stop, len(todo))
    with _bar(len(todo), progress, "estimating") as bar:
        frames = _frames(config, todo, jobs)
        try:
            for chunk, frame in zip(_chunks(todo, _chunk_size(len(todo), jobs)), frames):
                run.chunk(chunk, frame, bar)
        except Exception:
            if stop.requested:  # a worker hit by the terminal's Ctrl-C too
                raise KeyboardInterrupt from None
            raise
        finally:
            frames.close()  # the workers' pool, if any, ends with it
    if mode == rp.FRONT_BEST and table is not None:
        stop.check()  # the kept trials come once every plan is estimated: --resume writes them
        run.keep()
    return run.added


class _Lazy(Sequence[Strategy]):
    """The valid strategies of a space as flat indices (:meth:`StrategySpace.valid_indices`):
    a slice is another ``_Lazy``, an item is built when asked for (the kept trials of a small
    study), so a parallel run never lists a million strategies in its parent."""

    def __init__(self, config: StudyConfig, indices: np.ndarray) -> None:
        self.config, self.indices = config, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, key):  # type: ignore[no-untyped-def]
        if isinstance(key, slice):
            return _Lazy(self.config, self.indices[key])
        return self.config.space.strategies_at(self.indices[key:key + 1])[0]


def _fresh_indices(config: StudyConfig, plans: Sequence[Strategy] | None,
                   kept: np.ndarray | None, jobs: int, in_study: set[str],
                   in_table: set[str] | None) -> np.ndarray | None:
    """The indices to estimate when a study starts afresh on a space listed as arrays: those
    left after pruning, or with ``jobs > 1`` every valid one; None otherwise (a resume
    compares plans by label, so it lists them)."""
    if plans is not None or in_study or in_table:
        return None
    if kept is not None:
        return kept
    if jobs <= 1:
        return None
    indices = config.space.valid_indices()
    if indices is None or len(indices) < PARALLEL_MIN:
        return None
    return indices


def _todo(strategies: Sequence[Strategy], in_study: set[str], in_table: set[str] | None,
          mode: str) -> Sequence[Strategy]:
    """The plans missing from the table, or (every plan a trial) from the study."""
    if not in_study and not in_table:
        return strategies  # a fresh study: no label to compute
    need_trial = mode == rp.ALL

    def missing(plan: str) -> bool:
        return ((in_table is not None and plan not in in_table)
                or (need_trial and plan not in in_study))

    return [s for s in strategies if missing(strategy_label(s))]


def _chunk_size(n: int, jobs: int) -> int:
    if jobs <= 1 or n < PARALLEL_MIN:
        return CHUNK
    return max(1, min(CHUNK, -(-n // (2 * jobs))))


def _chunks(items: Sequence[Strategy], size: int) -> Iterator[Sequence[Strategy]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _frames(config: StudyConfig, todo: Sequence[Strategy], jobs: int
            ) -> Iterator[pd.DataFrame]:
    evaluator = config.evaluator()
    chunks = list(_chunks(todo, _chunk_size(len(todo), jobs)))
    if isinstance(todo, _Lazy) and jobs > 1 and len(todo) >= PARALLEL_MIN:
        return estimate_frames_at(evaluator, config.space,
                                  [c.indices for c in chunks], jobs)  # type: ignore[attr-defined]
    if isinstance(todo, _Lazy):
        return (evaluator.frame(config.space.strategies_at(c.indices))  # type: ignore[attr-defined]
                for c in chunks)
    if jobs > 1 and len(todo) >= PARALLEL_MIN:
        return estimate_frames(evaluator, chunks, jobs)
    return (evaluator.frame(chunk) for chunk in chunks)


class _Recorder:
    """Writes each chunk's new rows, then records its new trials; then (a big study) the
    kept trials."""

    def __init__(self, study: optuna.Study, storage: BaseStorage, config: StudyConfig,
                 table: rp.ResultsTable | None, in_study: set[str], in_table: set[str] | None,
                 mode: str, stop: StopRequest, todo: int) -> None:
        self.study, self.storage, self.config = study, storage, config
        self.table, self.in_study, self.in_table = table, in_study, in_table
        self.mode, self.stop = mode, stop
        self.left = todo
        """Plans still to estimate: a Ctrl-C after the last one has nothing left to stop."""
        self.evaluator = config.evaluator()
        self.encoding = LayoutEncoding(config.space)
        self.added = 0

    def chunk(self, chunk: Sequence[Strategy], frame: pd.DataFrame, bar: object) -> None:
        plan = frame["plan"]
        if self.table is not None:
            new = plan.isin(self.in_table) if self.in_table else np.zeros(len(frame), bool)
            self.table.append(frame[~np.asarray(new)])
        if self.mode != rp.ALL:
            self._done(len(frame), bar)
            return
        rows = np.flatnonzero(~plan.isin(self.in_study).to_numpy())
        for i in range(0, len(frame), BATCH):
            mine = rows[(rows >= i) & (rows < i + BATCH)]
            self._record(frame.iloc[mine], [chunk[j] for j in mine.tolist()])
            self._done(min(BATCH, len(frame) - i), bar)

    def _done(self, plans: int, bar: object) -> None:
        """Count plans stored; stop here after a Ctrl-C unless they were the last."""
        bar.update(plans)  # type: ignore[attr-defined]
        self.left -= plans
        if self.left > 0:
            self.stop.check()

    def _record(self, rows: pd.DataFrame, strategies: Sequence[Strategy]) -> None:
        if rows.empty:
            return
        distributions = self.encoding.distributions
        trials = [frozen_trial(r, self.encoding.params(s), distributions)
                  for s, r in zip(strategies, self.evaluator.records(rows))]
        if isinstance(self.storage, PlannerRDBStorage):
            self.storage.add_trials_at_once(self.study._study_id, trials)
        else:
            with batched(self.storage):
                self.study.add_trials(trials)
        self.added += len(trials)

    def keep(self) -> None:
        """Record the kept plans the study does not hold yet, in the table's order."""
        assert self.table is not None
        figures = self.table.read(["number", "plan", "step_time_s", "peak_memory_gb",
                                   "feasible"])
        kept = rp.kept_numbers(figures, rp.BEST_KEPT)
        plans = figures.set_index("number").loc[kept, "plan"]
        missing = kept[~plans.isin(self.in_study).to_numpy()]
        rows = self.table.read(numbers=missing)
        for i in range(0, len(rows), BATCH):
            part = rows.iloc[i:i + BATCH]
            self._record(part, [strategy_from_attrs(a) for a in part.to_dict("records")])
