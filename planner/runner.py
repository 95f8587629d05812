"""Running a study: create or resume it in the storage, then fill it with trials.

- ``exhaustive``: every valid strategy is estimated directly, a chunk at once (in worker
  processes with ``jobs > 1``), written to the study's results table (Parquet) and recorded into
  the study in batches with ``Study.add_trials``, because the simulator is far cheaper than an
  Optuna trial (``../shared/optuna-notes.md`` section 4); a study of more than
  ``TRIALS_KEPT`` plans keeps only its fronts and best plans as trials
  (``planner.run_exhaustive``). A resumed study estimates only the strategies it does not hold
  yet, so every valid strategy is in it exactly once, whatever ``jobs`` was.
- ``tpe``, ``nsga2``, ``gp``, ``random``: Optuna's samplers through ``Study.optimize``, the HBM
  limit passed as ``trial.set_constraint``; with ``jobs > 1`` worker processes share the
  storage, each with its own seed. A serial run with a seed gives the same trials every time.

Stopping. Ctrl-C (SIGINT) lets the running trials finish (the exhaustive path: the batch being
estimated is stored), then raises ``KeyboardInterrupt``; a second Ctrl-C stops at once, and
Optuna marks the trial it interrupts FAIL. A process killed outright (SIGKILL) keeps every
finished trial (the journal is repaired, ``planner.storage``); ``--resume`` first fails the
trials it left RUNNING and re-queues their parameters, then carries on.

Liveness. ``run_study`` holds the study's writer lock for its whole life on a local storage
(``planner.run_lock``): a second run of a live study is refused at once, naming the live
process, so no plan is estimated twice and a resume fails only the RUNNING trials of a process
that is really gone. ``--jobs N`` workers (``planner.run_jobs``, ``planner.run_pool``) die with
their parent; a worker that dies ends the run with ``WorkerDied`` at once, never a hang.

Workers sharing a study on a database (``planner worker``): ``planner.run_queue``. The public
names of ``planner.run_common``, ``planner.run_jobs`` and ``planner.run_queue`` are importable
from here too.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from planner.errors import PlannerUsageError
from planner.plan import specs_from_dict
from planner.results_parquet import (
    RESULTS,
    ResultsTable,
    check_own_table,
    check_table_name,
    results_path,
    table_path,
)
from planner.run_common import (
    ITEM,
    StopRequest,
    _bar,
    _check_fingerprint,
    _describe,
    _objective,
    _stop_when,
    make_sampler,
)
from planner.run_exhaustive import BATCH, exhaustive
from planner.run_jobs import WorkerDied, optimize_jobs
from planner.run_lock import StudyBusy, study_writer
from planner.run_queue import (
    READY_WAIT_S,
    WorkerReport,
    _drain,
    _info,
    _load_queue,
    _reclaim,
    chunk_size,
    join_study,
    queue_state,
    run_worker,
)
from planner.storage import WORK_QUEUE, study_names
from planner.study_config import StudyConfig
from search_spaces import StrategySpace, strategy_label
from search_spaces.frameworks import ANY
from simcore.specs import Axis, Recompute, Schedule, Strategy, ZeroStage

__all__ = [
    "BATCH",
    "ITEM",
    "READY_WAIT_S",
    "RunReport",
    "StopRequest",
    "StudyBusy",
    "WorkerDied",
    "WorkerReport",
    "_bar",
    "_describe",
    "_objective",
    "_stop_when",
    "chunk_size",
    "config_from_study",
    "coverage",
    "join_study",
    "make_sampler",
    "open_study",
    "queue_state",
    "run_study",
    "run_worker",
]

@dataclass(frozen=True)
class RunReport:
    study: optuna.Study
    added: int
    """Trials this run finished."""
    requeued: int
    """RUNNING trials of a dead process, failed and re-queued."""
    late_stop: bool = False
    """Ctrl-C came when no work was left to stop: the run finished all the same."""


# -- opening a study ---------------------------------------------------------------------------
def open_study(config: StudyConfig, storage: optuna.storages.BaseStorage, label: str, *,
               resume: bool) -> tuple[optuna.Study, int]:
    """Create the study, or load it to resume; returns it and how many trials were re-queued."""
    exists = config.name in study_names(storage)
    sampler = make_sampler(config.sampler, config.seed)
    if exists and _orphan(storage, config.name):
        # created by a run killed before it described the study: nothing is stored in it
        study = optuna.load_study(study_name=config.name, storage=storage, sampler=sampler)
        _describe(study, config)
        return study, 0
    if exists:
        study = optuna.load_study(study_name=config.name, storage=storage, sampler=sampler)
        # a study of other settings first: --resume would not continue it either
        _check_fingerprint(study, config)
        if not resume:
            raise PlannerUsageError(
                f"{config.path}: name: a study {config.name!r} already exists in {label}; add"
                " --resume to continue it, or set another name (or --storage)")
        # Exhaustive and random studies store only finished trials: a stale one is just failed
        # (the plan is estimated again as one not stored yet).
        requeue = config.sampler not in ("exhaustive", "random")
        return study, _requeue_running(study, storage, requeue)
    if results_path(label, config.name) is not None:  # before it is made, not after
        check_table_name(label, config.name)
        check_own_table(storage, config.name)
    study = optuna.create_study(study_name=config.name, storage=storage, sampler=sampler,
                                directions=["minimize"] * len(config.objectives))
    _describe(study, config)
    return study, 0


ORPHAN_WAIT_S = 2.0
"""How long a study without its fingerprint may still be in the hands of the run creating it
(create, then three attributes: milliseconds) before it counts as that run's orphan."""


def _orphan(storage: BaseStorage, name: str) -> bool:
    """A study a killed run created but never described, with no trial: safe to take over.
    A live run describes its new study within milliseconds, so wait for that first."""
    study_id = storage.get_study_id_from_name(name)
    deadline = time.monotonic() + ORPHAN_WAIT_S
    while "fingerprint" not in storage.get_study_user_attrs(study_id):
        if time.monotonic() > deadline:
            return not storage.get_all_trials(study_id, deepcopy=False)
        time.sleep(0.1)
    return False


def _requeue_running(study: optuna.Study, storage: BaseStorage, requeue: bool) -> int:
    """Fail the trials a dead process left RUNNING (and re-queue their parameters). Asked of
    the storage itself: on a database, one query for the RUNNING ones, not every trial."""
    stale = storage.get_all_trials(study._study_id, deepcopy=False,
                                   states=(TrialState.RUNNING,))
    for t in stale:
        study.tell(t.number, state=TrialState.FAIL)
        if requeue:
            study.enqueue_trial(t.params, skip_if_exists=False)
    return len(stale)


def run_study(config: StudyConfig, storage: optuna.storages.BaseStorage, label: str, *,
              resume: bool = False, jobs: int = 1, progress: bool = True,
              prune: bool = False) -> RunReport:
    """Create (or resume) the study and run it to its end; see the module docstring.

    A study shared by workers (it has a work queue) is resumed as one worker that first takes
    back every item a stopped worker held: nothing else may be running on it. On a local
    storage, :class:`StudyBusy` if a live process is writing the study."""
    with study_writer(storage, config.name, label):
        return _run_held(config, storage, label, resume, jobs, progress, prune)


def _run_held(config: StudyConfig, storage: BaseStorage, label: str, resume: bool, jobs: int,
              progress: bool, prune: bool) -> RunReport:
    study, requeued = open_study(config, storage, label, resume=resume)
    with StopRequest() as stop:
        if WORK_QUEUE in study.user_attrs:
            queue = _load_queue(study, storage)
            requeued += _reclaim(queue, _info(study, config)["items"])
            added = _drain(study, queue, storage, config, stop, progress)
        elif config.sampler == "exhaustive":
            added = exhaustive(study, storage, config, label, jobs, progress, stop,
                               prune=prune)
        elif config.sampler == "random":
            added = exhaustive(study, storage, config, label, jobs, progress, stop,
                               plans=random_draw(config))
        else:
            added = _optimize(study, storage, config, label, jobs, progress, stop)
    return RunReport(study, added, requeued, late_stop=stop.requested)


# -- random ------------------------------------------------------------------------------------
def random_draw(config: StudyConfig) -> list[Strategy]:
    """``sampler: random``: ``n_trials`` distinct valid strategies drawn with the study's seed
    (all of them if the space holds fewer), so a study never repeats a plan and a resume draws
    the same ones. Optuna's RandomSampler draws with replacement (20 trials of the lab's 56
    strategies held 18 distinct); this is the same uniform draw without it."""
    valid = config.space.valid
    return random.Random(config.seed).sample(valid, min(config.n_trials, len(valid)))


# -- samplers ----------------------------------------------------------------------------------

def _remaining(study: optuna.Study, storage: BaseStorage, config: StudyConfig) -> int:
    finished = storage.get_n_trials(study._study_id, TrialState.COMPLETE)
    return max(0, config.n_trials - finished)


def _optimize(study: optuna.Study, storage: optuna.storages.BaseStorage, config: StudyConfig,
              label: str, jobs: int, progress: bool, stop: StopRequest) -> int:
    n = _remaining(study, storage, config)
    if n == 0:
        return 0
    if jobs <= 1:
        done = 0

        def count(_s: optuna.Study, _t: FrozenTrial) -> None:
            nonlocal done
            done += 1
            bar.update(1)

        with _bar(n, progress, config.sampler) as bar:
            study.optimize(_objective(config, storage, stop), n_trials=n,
                           callbacks=[count, _stop_when(lambda: stop.requested)])
        if done < n:  # stopped early; a Ctrl-C during the last trial stopped nothing
            stop.check()
        return done
    return optimize_jobs(config, label, jobs, n, progress, stop)


def coverage(study: optuna.Study, config: StudyConfig) -> tuple[int, int, int]:
    """(distinct plans stored, valid plans missing, plans stored more than once) of an
    exhaustive study: (n, 0, 0) when it covers its space exactly once. A study that keeps only
    some plans as trials is counted in its results table."""
    results = study.user_attrs.get(RESULTS)
    if results and results["trials_kept"] != "all":
        path = table_path(study)
        plans = [] if path is None else ResultsTable(path).read(["plan"])["plan"].tolist()
    else:
        plans = [t.user_attrs.get("plan")
                 for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    stored = set(plans)
    valid = {strategy_label(s) for s in config.space.valid}
    return len(stored), len(valid - stored), len(plans) - len(stored)


# -- a study's configuration from what it stores ---------------------------------------------
def config_from_study(study: optuna.Study) -> StudyConfig:
    """The configuration of a stored study (``planner worker NAME``: no YAML at hand), rebuilt
    from the specs and summary it stores, checked against its fingerprint."""
    where = Path(f"study {study.study_name!r}")
    attrs = study.user_attrs
    summary, specs = attrs.get("config"), attrs.get("specs")
    if not isinstance(summary, dict) or not isinstance(specs, dict):
        raise PlannerUsageError(f"{where}: stores no specs; give the study YAML instead")
    model, system, training, convention = specs_from_dict(where, specs)
    space = _space_from_summary(summary["space"], model, system, training, convention,
                                framework=summary.get("framework", ANY))
    config = StudyConfig(
        name=study.study_name, path=where, model=model, system=system, training=training,
        convention=convention, hbm_gb=summary.get("hbm_gb"),
        objectives=tuple(summary["objectives"]), sampler=summary["sampler"],
        n_trials=int(summary["n_trials"]), seed=int(summary["seed"]), space=space)
    if config.fingerprint() != attrs.get("fingerprint"):
        raise PlannerUsageError(f"{where}: cannot be rebuilt from what it stores (another"
                                " planner version?); give the study YAML instead")
    return config


def _space_from_summary(sp: dict[str, Any], *specs: Any, framework: str = ANY) -> StrategySpace:
    model, system, training, convention = specs
    return StrategySpace(
        model=model, system=system, training=training, convention=convention,
        dp=None if sp["dp"] == "auto" else tuple(sp["dp"]), tp=tuple(sp["tp"]),
        pp=tuple(sp["pp"]), sp=tuple(sp["sp"]), zero=tuple(ZeroStage(z) for z in sp["zero"]),
        recompute=tuple(Recompute(r) for r in sp["recompute"]),
        micro_batch=tuple(sp["micro_batch"]),
        schedule=tuple(Schedule(s) for s in sp["schedule"]), v=tuple(sp["v"]),
        placement=tuple(tuple(Axis(a) for a in p.split(",")) for p in sp["placement"]),
        sequence_parallel=tuple(sp["sequence_parallel"]), framework=framework)
