"""``planner run --jobs N``: a study's work in worker processes (:class:`planner.run_pool.Pool`).

- Exhaustive: the workers estimate chunks of strategies at once; the parent stores every chunk
  as it comes back, in order (:func:`estimate_frames`).
- Samplers: each task runs a few trials in a worker, with a sampler of its own seed, written to
  the storage by the worker itself (:func:`optimize_jobs`).

A worker that dies (killed, out of memory) ends the run with :class:`WorkerDied` at once, never a
hang: what was stored is kept, and ``--resume`` fails the trials it left RUNNING and finishes.
Workers die with the ``planner run`` that started them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import optuna
import pandas as pd
from optuna.trial import FrozenTrial

from planner.record import Evaluator, Record
from planner.run_common import (
    StopRequest,
    _bar,
    _evaluate_all,
    _objective,
    _stop_when,
    make_sampler,
)
from planner.run_pool import Pool, WorkerDied
from planner.study_config import StudyConfig
from simcore.specs import Strategy

if TYPE_CHECKING:
    from search_spaces.space import StrategySpace

__all__ = ["WorkerDied", "estimate_chunks", "estimate_frames", "estimate_frames_at",
           "optimize_jobs"]

_HEARTBEAT = 10
"""Seconds between heartbeats of a running trial of ``run --jobs N`` on a database."""
FINISH_S = 30.0
"""After a worker died: how long the others may take to finish the trial each is running."""


def _evaluate_in_worker(evaluator: Evaluator, strategies: Sequence[Strategy]) -> list[Record]:
    """A task: a chunk of strategies estimated (Ctrl-C is the parent's business)."""
    return _evaluate_all(evaluator, strategies)


def estimate_chunks(evaluator: Evaluator, chunks: Sequence[Sequence[Strategy]], jobs: int
                    ) -> Iterator[list[Record]]:
    """The records of every chunk, in order, estimated by ``jobs`` workers."""
    with Pool(jobs) as pool:
        yield from pool.map(_evaluate_in_worker, ((evaluator, chunk) for chunk in chunks))


def _frame_in_worker(evaluator: Evaluator, strategies: Sequence[Strategy]) -> pd.DataFrame:
    """A task: a chunk of strategies estimated at once (:meth:`Evaluator.frame`)."""
    return evaluator.frame(strategies)


def estimate_frames(evaluator: Evaluator, chunks: Sequence[Sequence[Strategy]], jobs: int
                    ) -> Iterator[pd.DataFrame]:
    """The rows of every chunk, in order, estimated by ``jobs`` workers."""
    with Pool(jobs) as pool:
        yield from pool.map(_frame_in_worker, ((evaluator, chunk) for chunk in chunks))


def _frame_at_in_worker(evaluator: Evaluator, space: StrategySpace,
                        indices: np.ndarray) -> pd.DataFrame:
    """A task: the strategies at these flat indices of the space, built and estimated here."""
    return evaluator.frame(space.strategies_at(indices))


def estimate_frames_at(evaluator: Evaluator, space: StrategySpace, chunks: Sequence[np.ndarray],
                       jobs: int) -> Iterator[pd.DataFrame]:
    """The rows of every chunk of the space's valid indices, in order, built and estimated by
    ``jobs`` workers (the parent never lists the strategies)."""
    space = replace(space)  # a copy without cached lists, so each task ships only the knobs
    with Pool(jobs) as pool:
        yield from pool.map(_frame_at_in_worker, ((evaluator, space, c) for c in chunks))


def optimize_jobs(config: StudyConfig, label: str, jobs: int, n: int, progress: bool,
                  stop: StopRequest) -> int:
    """``n`` trials in worker processes; Ctrl-C reaches them through a stop file. If a worker
    dies, the others finish their running trial, then :class:`WorkerDied` is raised."""
    size = max(1, min(25, n // (jobs * 4)))
    tasks = [min(size, n - i) for i in range(0, n, size)]
    folder = tempfile.mkdtemp(prefix="planner-stop-")
    stop_file = os.path.join(folder, "stop")
    stop.on_stop(lambda: Path(stop_file).touch())
    done = 0
    try:
        with Pool(jobs) as pool, _bar(n, progress, f"{config.sampler} x{jobs}") as bar:
            runs = pool.map(_worker, ((config.path, config.hbm_override, label,
                                       config.seed + 1 + i, k, stop_file)
                                      for i, k in enumerate(tasks)))
            try:
                for k in runs:
                    done += k
                    bar.update(k)
            except WorkerDied:
                Path(stop_file).touch()
                pool.finish(FINISH_S)
                raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if done < n:  # stopped early; a Ctrl-C during the last trials stopped nothing
        stop.check()
    return done


_WORKER_STUDIES: dict[tuple, tuple[StudyConfig, optuna.Study, Callable]] = {}


def _worker(path: Path, hbm_override: float | None, label: str, seed: int, n: int,
            stop_file: str | None = None) -> int:
    """One task in a worker process: up to ``n`` trials with a sampler of its own seed, fewer
    once ``stop_file`` exists. The study is read from its file once per process (cheaper than
    shipping the space with every task). Returns the trials it finished."""
    from planner.storage import open_storage
    from planner.study_config import load_study_config

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    stopped = (lambda: os.path.exists(stop_file)) if stop_file else (lambda: False)
    if stopped():
        return 0
    key = (str(path), hbm_override, label)
    if key not in _WORKER_STUDIES:
        config = load_study_config(path, hbm_gb=hbm_override)
        storage = open_storage(label, create=False, heartbeat=_HEARTBEAT if "://" in label
                               else None)
        study = optuna.load_study(study_name=config.name, storage=storage)
        _WORKER_STUDIES[key] = (config, study, _objective(config, storage))
    config, study, objective = _WORKER_STUDIES[key]
    study.sampler = make_sampler(config.sampler, seed)
    done = 0

    def count(_s: optuna.Study, _t: FrozenTrial) -> None:
        nonlocal done
        done += 1

    study.optimize(objective, n_trials=n, callbacks=[count, _stop_when(stopped)])
    return done
