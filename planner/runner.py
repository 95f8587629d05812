"""Running a study: create or resume it in the storage, then fill it with trials.

- ``exhaustive``: every valid strategy is estimated directly (in joblib worker processes with
  ``jobs > 1``) and recorded into the study in batches with ``Study.add_trials``, because the
  simulator is far cheaper than an Optuna trial (``../shared/optuna-notes.md`` section 4).
  A resumed study estimates only the strategies it does not hold yet, so every valid strategy is
  in it exactly once, whatever ``jobs`` was.
- ``tpe``, ``nsga2``, ``gp``, ``random``: Optuna's samplers through ``Study.optimize``, the HBM
  limit passed as ``trial.set_constraint``; with ``jobs > 1`` joblib worker processes share the
  storage, each with its own seed.

Ctrl-C stops after the trials that finished; they are in the storage and ``--resume`` carries
on. A resumed study first fails the trials a dead process left RUNNING and re-queues their
parameters.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import joblib
import optuna
from optuna.trial import TrialState
from tqdm.auto import tqdm

from planner.errors import PlannerUsageError
from planner.plan import specs_dict
from planner.record import Evaluator, Record, frozen_trial
from planner.storage import batched, study_names
from planner.study_config import StudyConfig
from search_spaces import LayoutEncoding, strategy_label
from simcore.specs import Strategy

__all__ = ["RunReport", "make_sampler", "run_study", "open_study"]

BATCH = 512
"""Strategies per add_trials batch (and per worker task) on the exhaustive path."""


@dataclass(frozen=True)
class RunReport:
    study: optuna.Study
    added: int
    """Trials this run finished."""
    requeued: int
    """RUNNING trials of a dead process, failed and re-queued."""


def make_sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    """The Optuna sampler of a study (``exhaustive`` samples nothing; its sampler is unused)."""
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name == "gp":
        try:
            import scipy  # noqa: F401 - GPSampler's own dependencies
            import torch  # noqa: F401
        except ImportError:
            raise PlannerUsageError("sampler gp needs PyTorch: pip install"
                                    " 'parallel-planner[gp]' (or choose tpe)") from None
        return optuna.samplers.GPSampler(seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)


def open_study(config: StudyConfig, storage: optuna.storages.BaseStorage, label: str, *,
               resume: bool) -> tuple[optuna.Study, int]:
    """Create the study, or load it to resume; returns it and how many trials were re-queued."""
    exists = config.name in study_names(storage)
    if exists and not resume:
        raise PlannerUsageError(
            f"{config.path}: name: a study {config.name!r} already exists in {label}; add"
            " --resume to continue it, or set another name (or --storage)")
    directions = ["minimize"] * len(config.objectives)
    sampler = make_sampler(config.sampler, config.seed)
    if exists:
        study = optuna.load_study(study_name=config.name, storage=storage, sampler=sampler)
        stored = study.user_attrs.get("fingerprint")
        if stored != config.fingerprint():
            raise PlannerUsageError(
                f"{config.path}: the stored study {config.name!r} was made from a different"
                " model, system, limit or space; set another name to start a new study")
        return study, _requeue_running(study, config.sampler != "exhaustive")
    study = optuna.create_study(study_name=config.name, storage=storage, sampler=sampler,
                                directions=directions)
    with warnings.catch_warnings():  # experimental since 3.2, still so marked in 5.0
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(config.metric_names)
    study.set_user_attr("config", config.summary())
    study.set_user_attr("fingerprint", config.fingerprint())
    study.set_user_attr("specs", specs_dict(config.model, config.system, config.training,
                                            config.convention))
    return study, 0


def _requeue_running(study: optuna.Study, requeue: bool) -> int:
    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for t in stale:
        study.tell(t.number, state=TrialState.FAIL)
        if requeue:
            study.enqueue_trial(t.params, skip_if_exists=False)
    return len(stale)


def run_study(config: StudyConfig, storage: optuna.storages.BaseStorage, label: str, *,
              resume: bool = False, jobs: int = 1, progress: bool = True) -> RunReport:
    """Create (or resume) the study and run it to its end; see the module docstring."""
    study, requeued = open_study(config, storage, label, resume=resume)
    if config.sampler == "exhaustive":
        added = _exhaustive(study, storage, config, jobs, progress)
    else:
        added = _optimize(study, storage, config, label, jobs, progress)
    return RunReport(study, added, requeued)


# -- exhaustive ------------------------------------------------------------------------------
def _chunks(items: Sequence[Strategy], size: int) -> Iterator[Sequence[Strategy]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _evaluate_all(evaluator: Evaluator, strategies: Sequence[Strategy]) -> list[Record]:
    return [evaluator(s) for s in strategies]


def _exhaustive(study: optuna.Study, storage: optuna.storages.BaseStorage, config: StudyConfig,
                jobs: int, progress: bool) -> int:
    encoding = LayoutEncoding(config.space)
    done = {t.user_attrs.get("plan")
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}
    todo = [s for s in config.space.valid if strategy_label(s) not in done]
    evaluator = config.evaluator()
    distributions = encoding.distributions
    size = BATCH if jobs <= 1 else max(1, min(BATCH, -(-len(todo) // (4 * jobs))))
    chunks = list(_chunks(todo, size))
    results: Iterable[list[Record]]
    if jobs > 1 and len(chunks) > 1:
        results = joblib.Parallel(n_jobs=jobs, return_as="generator")(
            joblib.delayed(_evaluate_all)(evaluator, chunk) for chunk in chunks)
    else:
        results = (_evaluate_all(evaluator, chunk) for chunk in chunks)
    added = 0
    with _bar(len(todo), progress, "estimating") as bar:
        for chunk, records in zip(chunks, results):
            trials = [frozen_trial(r, encoding.params(s), distributions)
                      for s, r in zip(chunk, records)]
            with batched(storage):
                study.add_trials(trials)
            added += len(records)
            bar.update(len(records))
    return added


# -- samplers ----------------------------------------------------------------------------------
def _objective(config: StudyConfig, storage: optuna.storages.BaseStorage | None = None
               ) -> Callable[[optuna.Trial], Any]:
    encoding = LayoutEncoding(config.space)
    evaluator = config.evaluator()
    seen: dict[Strategy, Record] = {}

    def objective(trial: optuna.Trial) -> float | list[float]:
        strategy = encoding.suggest(trial)
        record = seen.get(strategy)
        if record is None:
            record = seen[strategy] = evaluator(strategy)
        with batched(storage):  # some 40 attributes: one journal write instead of 40
            for key, value in record.user_attrs.items():
                trial.set_user_attr(key, value)
            for key, value in record.constraints.items():
                trial.set_constraint(key, value)
        return record.values if len(record.values) > 1 else record.values[0]

    return objective


def _remaining(study: optuna.Study, config: StudyConfig) -> int:
    finished = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    return max(0, config.n_trials - finished)


def _optimize(study: optuna.Study, storage: optuna.storages.BaseStorage, config: StudyConfig,
              label: str, jobs: int, progress: bool) -> int:
    n = _remaining(study, config)
    if n == 0:
        return 0
    if jobs <= 1:
        with _bar(n, progress, config.sampler) as bar:
            study.optimize(_objective(config, storage), n_trials=n,
                           callbacks=[lambda _s, _t: bar.update(1)])
        return n
    size = max(1, min(25, n // (jobs * 4)))
    tasks = [min(size, n - i) for i in range(0, n, size)]
    runs = joblib.Parallel(n_jobs=jobs, return_as="generator_unordered")(
        joblib.delayed(_worker)(config.path, config.hbm_override, label, config.seed + 1 + i, k)
        for i, k in enumerate(tasks))
    done = 0
    with _bar(n, progress, f"{config.sampler} x{jobs}") as bar:
        for k in runs:
            done += k
            bar.update(k)
    return done


_WORKER_STUDIES: dict[tuple, tuple[StudyConfig, optuna.Study, Callable]] = {}


def _worker(path: Path, hbm_override: float | None, label: str, seed: int, n: int) -> int:
    """One task in a worker process: ``n`` trials with a sampler of its own seed. The study is
    read from its file once per process (cheaper than shipping the space with every task)."""
    from planner.storage import open_storage
    from planner.study_config import load_study_config

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    key = (str(path), hbm_override, label)
    if key not in _WORKER_STUDIES:
        config = load_study_config(path, hbm_gb=hbm_override)
        storage = open_storage(label, create=False)
        study = optuna.load_study(study_name=config.name, storage=storage)
        _WORKER_STUDIES[key] = (config, study, _objective(config, storage))
    config, study, objective = _WORKER_STUDIES[key]
    study.sampler = make_sampler(config.sampler, seed)
    study.optimize(objective, n_trials=n)
    return n


def _bar(total: int, progress: bool, what: str) -> tqdm:
    return tqdm(total=total, unit="trial", desc=what, disable=not progress or None,
                file=sys.stderr, dynamic_ncols=True, leave=False)
