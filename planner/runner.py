"""Running a study: create or resume it in the storage, then fill it with trials.

- ``exhaustive``: every valid strategy is estimated directly (in joblib worker processes with
  ``jobs > 1``) and recorded into the study in batches with ``Study.add_trials``, because the
  simulator is far cheaper than an Optuna trial (``../shared/optuna-notes.md`` section 4).
  A resumed study estimates only the strategies it does not hold yet, so every valid strategy is
  in it exactly once, whatever ``jobs`` was.
- ``tpe``, ``nsga2``, ``gp``, ``random``: Optuna's samplers through ``Study.optimize``, the HBM
  limit passed as ``trial.set_constraint``; with ``jobs > 1`` joblib worker processes share the
  storage, each with its own seed. A serial run with a seed gives the same trials every time.

Stopping. Ctrl-C (SIGINT) lets the running trials finish (the exhaustive path: the batch being
estimated is stored), then raises ``KeyboardInterrupt``; a second Ctrl-C stops at once, and
Optuna marks the trial it interrupts FAIL. A process killed outright (SIGKILL) keeps every
finished trial (the journal is repaired, ``planner.storage``); ``--resume`` first fails the
trials it left RUNNING and re-queues their parameters, then carries on.

Workers (:func:`run_worker`, ``planner worker``): processes on any machines sharing one study on
a database. The study's work is a **work queue**, an Optuna study of its own (``"<name> (work
queue)"``) made once, by the process that created the study, before the study is marked ready:
one WAITING trial per item - a chunk of the exhaustive space's strategies (item ``k`` is
``space.valid[k*size:(k+1)*size]``; every worker checks it enumerates the same plans by their
hash), or one sampler trial each (``n_trials`` items). Why each plan (or trial) is recorded
exactly once, with any number of workers, on PostgreSQL:

1. An item is claimed by turning its WAITING trial RUNNING with ``set_trial_state_values``,
   which locks the row (``SELECT ... FOR UPDATE``) and refuses unless the state is still
   WAITING: of concurrent claimants exactly one wins. Only the claimant completes an item.
2. A claimant records a heartbeat before claiming and while it works. If it dies, the item goes
   stale; ``fail_stale_trials`` turns it FAIL (again a row-locked transition that exactly one
   process wins) and that one process adds the item back as a new WAITING trial. So at any
   time an unfinished item has at most one live (WAITING or RUNNING) trial.
3. A chunk of strategies is written together with its item's completion in one transaction
   (``PlannerRDBStorage.add_trials_at_once``) that locks the item's row and writes nothing
   unless the item is still RUNNING: a chunk is written once, with its completion, or not at
   all (by a claimant that died, or that was paused past the grace period and lost the item).
4. A sampler item's trial runs through ``Study.optimize`` (Optuna's own transactions), tagged
   with the item. A re-queued item first looks for a COMPLETE trial with its tag (its dead
   claimant may have finished it) and runs one only if there is none. The residual risk here
   is the one of any lease: a claimant paused past the grace period while its trial runs.

Workers wait until no item is pending, so the item of a worker that died is done by another.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import joblib
import optuna
import sqlalchemy.exc
from optuna.storages import BaseStorage, RDBStorage
from optuna.trial import FrozenTrial, TrialState
from tqdm.auto import tqdm

from planner.errors import PlannerUsageError
from planner.plan import specs_dict, specs_from_dict
from planner.record import Evaluator, Record, frozen_trial
from planner.storage import (
    QUEUE_SUFFIX,
    WORK_QUEUE,
    PlannerRDBStorage,
    batched,
    retry_stale,
    shown,
    storage_option,
    study_names,
)
from planner.study_config import StudyConfig
from search_spaces import LayoutEncoding, StrategySpace, strategy_label
from search_spaces.frameworks import ANY
from simcore.specs import Axis, Recompute, Schedule, Strategy, ZeroStage

__all__ = ["RunReport", "StopRequest", "WorkerReport", "config_from_study", "coverage",
           "join_study", "make_sampler", "open_study", "queue_state", "run_study", "run_worker"]

BATCH = 512
"""Strategies per add_trials batch (and per worker task) on the exhaustive path."""
ITEM = "planner:item"
"""System attribute: a work item's index (on queue trials, and on a sampler item's trial)."""
READY_WAIT_S = 60.0
"""How long a joining worker waits for the study's creator to finish setting it up."""
_HEARTBEAT = 10
"""Seconds between heartbeats of a running trial of ``run --jobs N`` on a database."""


@dataclass(frozen=True)
class RunReport:
    study: optuna.Study
    added: int
    """Trials this run finished."""
    requeued: int
    """RUNNING trials of a dead process, failed and re-queued."""


@dataclass(frozen=True)
class WorkerReport:
    study: optuna.Study
    created: bool
    """This worker created the study (and its work queue)."""
    added: int
    """Trials this worker recorded."""


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
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


# -- Ctrl-C ------------------------------------------------------------------------------------
class StopRequest:
    """Ctrl-C while a study runs. The first sets :attr:`requested`: the runner lets the running
    trials finish, then raises ``KeyboardInterrupt`` (and runs the hooks, e.g. to tell worker
    processes). The second sets :attr:`now`: the running trial stops at its next safe point
    (the objective's start, the next strategy of a batch) and Optuna marks it FAIL. The third
    raises ``KeyboardInterrupt`` wherever the process is. Installed only in the main thread.
    """

    def __init__(self) -> None:
        self.requested = False
        self.now = False
        self._count = 0
        self._hooks: list[Callable[[], None]] = []
        self._previous: Any = None
        self._installed = False

    def on_stop(self, hook: Callable[[], None]) -> None:
        self._hooks.append(hook)

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._count += 1
        if self._count == 1:
            self.requested = True
            print("\nstopping after the running trials (Ctrl-C again: now)", file=sys.stderr)
            for hook in self._hooks:
                hook()
        elif self._count == 2:
            self.now = True
            print("stopping now; the running trial is marked failed", file=sys.stderr)
        else:
            raise KeyboardInterrupt

    def check(self) -> None:
        """Raise ``KeyboardInterrupt`` if a stop was requested (the running work is done)."""
        if self.requested:
            raise KeyboardInterrupt

    def check_now(self) -> None:
        """Raise ``KeyboardInterrupt`` at a safe point after a second Ctrl-C."""
        if self.now:
            raise KeyboardInterrupt


@contextlib.contextmanager
def _children_ignore_sigint() -> Iterator[None]:
    """Processes forked inside inherit an ignored SIGINT, so Ctrl-C at the terminal (sent to
    the whole process group) reaches only this process, which relays it. A joblib call forks its
    workers before it returns; a Ctrl-C during that instant is ignored. (Each task also ignores
    SIGINT, for workers joblib starts later.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


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
    if exists and not resume:
        raise PlannerUsageError(
            f"{config.path}: name: a study {config.name!r} already exists in {label}; add"
            " --resume to continue it, or set another name (or --storage)")
    if exists:
        study = optuna.load_study(study_name=config.name, storage=storage, sampler=sampler)
        _check_fingerprint(study, config)
        return study, _requeue_running(study, storage, config.sampler != "exhaustive")
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


def _check_fingerprint(study: optuna.Study, config: StudyConfig) -> None:
    if study.user_attrs.get("fingerprint") != config.fingerprint():
        raise PlannerUsageError(
            f"{config.path}: the stored study {config.name!r} was made from a different"
            " model, system, limit or space; set another name to start a new study")


def _describe(study: optuna.Study, config: StudyConfig) -> None:
    """What the study was made from, on the study; the fingerprint last (joiners wait for it)."""
    with warnings.catch_warnings():  # experimental since 3.2, still so marked in 5.0
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(config.metric_names)
    study.set_user_attr("config", config.summary())
    study.set_user_attr("specs", specs_dict(config.model, config.system, config.training,
                                            config.convention))
    study.set_user_attr("fingerprint", config.fingerprint())


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
              resume: bool = False, jobs: int = 1, progress: bool = True) -> RunReport:
    """Create (or resume) the study and run it to its end; see the module docstring.

    A study shared by workers (it has a work queue) is resumed as one worker that first takes
    back every item a stopped worker held: nothing else may be running on it."""
    study, requeued = open_study(config, storage, label, resume=resume)
    with StopRequest() as stop:
        if WORK_QUEUE in study.user_attrs:
            queue = _load_queue(study, storage)
            requeued += _reclaim(queue, _info(study, config)["items"])
            added = _drain(study, queue, storage, config, stop, progress)
        elif config.sampler == "exhaustive":
            added = _exhaustive(study, storage, config, jobs, progress, stop)
        else:
            added = _optimize(study, storage, config, label, jobs, progress, stop)
    return RunReport(study, added, requeued)


# -- exhaustive ------------------------------------------------------------------------------
def _chunks(items: Sequence[Strategy], size: int) -> Iterator[Sequence[Strategy]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _evaluate_all(evaluator: Evaluator, strategies: Sequence[Strategy],
                  stop: StopRequest | None = None) -> list[Record]:
    records = []
    for s in strategies:
        if stop is not None:
            stop.check_now()
        records.append(evaluator(s))
    return records


def _evaluate_in_worker(evaluator: Evaluator, strategies: Sequence[Strategy]) -> list[Record]:
    """A joblib task: Ctrl-C is the main process's business (it stops after a stored batch)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return _evaluate_all(evaluator, strategies)


def _stored_plans(study: optuna.Study, storage: BaseStorage) -> set[str]:
    """The plans of the study's COMPLETE trials (on a database: one query for just them)."""
    if isinstance(storage, PlannerRDBStorage):
        return set(storage.user_attr_values(study._study_id, "plan", TrialState.COMPLETE))
    return {t.user_attrs.get("plan")
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}


def _exhaustive(study: optuna.Study, storage: optuna.storages.BaseStorage, config: StudyConfig,
                jobs: int, progress: bool, stop: StopRequest) -> int:
    encoding = LayoutEncoding(config.space)
    done = _stored_plans(study, storage)
    todo = [s for s in config.space.valid if strategy_label(s) not in done]
    evaluator = config.evaluator()
    distributions = encoding.distributions
    size = BATCH if jobs <= 1 else max(1, min(BATCH, -(-len(todo) // (4 * jobs))))
    chunks = list(_chunks(todo, size))
    results: Iterable[list[Record]]
    if jobs > 1 and len(chunks) > 1:
        with _children_ignore_sigint():
            results = joblib.Parallel(n_jobs=jobs, return_as="generator")(
                joblib.delayed(_evaluate_in_worker)(evaluator, chunk) for chunk in chunks)
    else:
        results = (_evaluate_all(evaluator, chunk, stop) for chunk in chunks)
    added = 0
    with _bar(len(todo), progress, "estimating") as bar:
        try:
            for chunk, records in zip(chunks, results):
                trials = [frozen_trial(r, encoding.params(s), distributions)
                          for s, r in zip(chunk, records)]
                if isinstance(storage, PlannerRDBStorage):
                    storage.add_trials_at_once(study._study_id, trials)
                else:
                    with batched(storage):
                        study.add_trials(trials)
                added += len(records)
                bar.update(len(records))
                stop.check()
        except Exception:
            if stop.requested:  # a worker hit by the terminal's Ctrl-C too
                raise KeyboardInterrupt from None
            raise
        finally:
            close = getattr(results, "close", None)
            if close is not None:  # joblib: cancel what is left, quietly
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    close()
    return added


# -- samplers ----------------------------------------------------------------------------------
def _objective(config: StudyConfig, storage: optuna.storages.BaseStorage | None = None,
               stop: StopRequest | None = None) -> Callable[[optuna.Trial], Any]:
    encoding = LayoutEncoding(config.space)
    evaluator = config.evaluator()
    seen: dict[Strategy, Record] = {}

    def objective(trial: optuna.Trial) -> float | list[float]:
        if stop is not None:
            stop.check_now()  # inside Optuna's trial: it marks the trial FAIL
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


def _remaining(study: optuna.Study, storage: BaseStorage, config: StudyConfig) -> int:
    finished = storage.get_n_trials(study._study_id, TrialState.COMPLETE)
    return max(0, config.n_trials - finished)


def _stop_when(stop: Callable[[], bool]) -> Callable[[optuna.Study, FrozenTrial], None]:
    def callback(study: optuna.Study, _trial: FrozenTrial) -> None:
        if stop():
            study.stop()
    return callback


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
        stop.check()
        return done
    return _optimize_jobs(config, label, jobs, n, progress, stop)


def _optimize_jobs(config: StudyConfig, label: str, jobs: int, n: int, progress: bool,
                   stop: StopRequest) -> int:
    """``n`` trials in joblib worker processes; Ctrl-C reaches them through a stop file."""
    size = max(1, min(25, n // (jobs * 4)))
    tasks = [min(size, n - i) for i in range(0, n, size)]
    folder = tempfile.mkdtemp(prefix="planner-stop-")
    stop_file = os.path.join(folder, "stop")
    stop.on_stop(lambda: Path(stop_file).touch())
    try:
        with _children_ignore_sigint():
            runs = joblib.Parallel(n_jobs=jobs, return_as="generator_unordered")(
                joblib.delayed(_worker)(config.path, config.hbm_override, label,
                                        config.seed + 1 + i, k, stop_file)
                for i, k in enumerate(tasks))
        done = 0
        with _bar(n, progress, f"{config.sampler} x{jobs}") as bar:
            for k in runs:
                done += k
                bar.update(k)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
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

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process relays Ctrl-C (stop_file)
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


def _bar(total: int | None, progress: bool, what: str) -> tqdm:
    return tqdm(total=total, unit="trial", desc=what, disable=not progress or None,
                file=sys.stderr, dynamic_ncols=True, leave=False)


# -- workers sharing a study on a database -----------------------------------------------------
def run_worker(config: StudyConfig, storage: PlannerRDBStorage, label: str, *,
               progress: bool = True) -> WorkerReport:
    """Join the study (creating it and its work queue if it does not exist yet) and work on its
    queue until no item is pending; see the module docstring. Ctrl-C: the item in hand is
    finished, then ``KeyboardInterrupt``."""
    study, created = join_study(config, storage, label)
    queue = _load_queue(study, storage)
    with StopRequest() as stop:
        added = _drain(study, queue, storage, config, stop, progress)
    return WorkerReport(study, created, added)


def join_study(config: StudyConfig, storage: BaseStorage, label: str
               ) -> tuple[optuna.Study, bool]:
    """Create the study with its work queue, or, if another process did (``create_study`` is
    atomic: the loser gets ``DuplicatedStudyError``), load it once it is ready."""
    sampler = make_sampler(config.sampler, random.SystemRandom().randrange(2 ** 31))
    try:
        study = optuna.create_study(study_name=config.name, storage=storage, sampler=sampler,
                                    directions=["minimize"] * len(config.objectives))
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=config.name, storage=storage, sampler=sampler)
        _wait_ready(study, config, label)
        return study, False
    study.set_user_attr(WORK_QUEUE, "building")
    _describe(study, config)
    _build_queue(study, storage, config)
    return study, True


def _wait_ready(study: optuna.Study, config: StudyConfig, label: str) -> None:
    deadline = time.monotonic() + READY_WAIT_S
    while True:
        attrs = study.user_attrs
        if "fingerprint" in attrs:
            _check_fingerprint(study, config)
            queue = attrs.get(WORK_QUEUE)
            if queue is None:
                raise PlannerUsageError(
                    f"{config.path}: the study {config.name!r} in {shown(label)} was made by"
                    f" `planner run` and has no work queue for workers; finish it with `planner"
                    f" run {config.path}{storage_option(label)} --resume`, or give the workers'"
                    " study another name")
            if isinstance(queue, dict):
                _check_plans(queue, config)
                return
        if time.monotonic() > deadline:
            raise PlannerUsageError(
                f"the study {config.name!r} in {shown(label)} is still being set up after"
                f" {READY_WAIT_S:g} s: its creator stopped midway; delete it and"
                f" '{config.name}{QUEUE_SUFFIX}' (optuna delete-study --study-name NAME"
                f"{storage_option(label)}) and start the workers again")
        time.sleep(0.2)


def _digest(config: StudyConfig) -> str:
    text = "\n".join(strategy_label(s) for s in config.space.valid)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _check_plans(info: dict[str, Any], config: StudyConfig) -> None:
    if info.get("kind") == "plans" and info.get("digest") != _digest(config):
        raise PlannerUsageError(
            f"{config.path}: this machine enumerates the study's strategies differently from"
            " the one that created it; install the same parallel-planner version on every worker")


def chunk_size(plans: int) -> int:
    """Strategies per work item of an exhaustive study: some 64 items, 4 to 256 plans each."""
    return max(4, min(256, math.ceil(plans / 64)))


def _build_queue(study: optuna.Study, storage: BaseStorage, config: StudyConfig) -> None:
    """The work queue: one WAITING trial per item, then the study is marked ready."""
    name = study.study_name + QUEUE_SUFFIX
    try:
        queue = optuna.create_study(study_name=name, storage=storage)
    except optuna.exceptions.DuplicatedStudyError:  # left by a deleted study of the same name
        optuna.delete_study(study_name=name, storage=storage)
        queue = optuna.create_study(study_name=name, storage=storage)
    queue.set_user_attr("config", {"model": config.model.name, "system": config.system.name,
                                   "sampler": f"work queue of {study.study_name}"})
    if config.sampler == "exhaustive":
        plans = len(config.space.valid)
        size = chunk_size(plans)
        info = {"kind": "plans", "items": math.ceil(plans / size), "chunk": size,
                "plans": plans, "digest": _digest(config)}
    else:
        info = {"kind": "trials", "items": config.n_trials}
    items = [optuna.trial.create_trial(state=TrialState.WAITING, system_attrs={ITEM: k})
             for k in range(info["items"])]
    if isinstance(storage, PlannerRDBStorage):
        storage.add_trials_at_once(queue._study_id, items)
    else:
        queue.add_trials(items)
    study.set_user_attr(WORK_QUEUE, {"study": name, **info})


def _load_queue(study: optuna.Study, storage: BaseStorage) -> optuna.Study:
    info = study.user_attrs[WORK_QUEUE]
    return optuna.load_study(study_name=info["study"], storage=storage)


def _info(study: optuna.Study, config: StudyConfig) -> dict[str, Any]:
    info = study.user_attrs[WORK_QUEUE]
    _check_plans(info, config)
    return info


def _drain(study: optuna.Study, queue: optuna.Study, storage: BaseStorage,
           config: StudyConfig, stop: StopRequest, progress: bool, poll: float = 0.5) -> int:
    """Claim and do items until none is WAITING or RUNNING; returns the trials recorded."""
    info = _info(study, config)
    work = _Work(study, queue, storage, config, info, stop)
    claimer = _Claimer(queue, storage)
    added = 0
    failures = 0
    with _bar(None, progress, "worker") as bar:
        while not stop.requested:
            try:
                token = claimer.claim()
                if token is None:
                    if not _pending(queue):
                        break
                    _fail_stale(queue)  # a dead worker's item comes back
                    time.sleep(poll)
                    continue
                n = work.do(token)
            except TRANSIENT as e:  # a deadlock or a dropped connection between workers
                failures += 1
                if failures > MAX_TRANSIENT:
                    raise
                print(f"worker: database error ({type(e).__name__}), retrying: the item in hand"
                      " goes back to the queue", file=sys.stderr)
                time.sleep(poll * failures)
                continue
            failures = 0
            added += n
            bar.update(n)
    stop.check()
    return added


TRANSIENT: tuple[type[Exception], ...] = (optuna.exceptions.StorageInternalError,
                                          sqlalchemy.exc.OperationalError)
"""Database errors a worker retries: a deadlock between workers' transactions, a connection
dropped. The item in hand is handed back (or goes stale), so exactly-once still holds."""
MAX_TRANSIENT = 5


def _fail_stale(study: optuna.Study) -> None:
    with warnings.catch_warnings():  # experimental since 2.9, still so marked in 5.0
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def _pending(queue: optuna.Study) -> bool:
    return bool(queue.get_trials(deepcopy=False,
                                 states=(TrialState.WAITING, TrialState.RUNNING)))


class _Claimer:
    """Claims WAITING items of a queue: turns one RUNNING (module docstring, point 1) and hands
    it over. The list of WAITING items is read once and tried in a random order (workers
    starting together try different items first), and read again only when it is used up."""

    def __init__(self, queue: optuna.Study, storage: BaseStorage) -> None:
        self.queue, self.storage = queue, storage
        self._candidates: list[FrozenTrial] = []

    def claim(self) -> FrozenTrial | None:
        """A claimed item, or None if no item is WAITING."""
        for refresh in (False, True):
            if refresh or not self._candidates:
                self._candidates = self.queue.get_trials(deepcopy=False,
                                                         states=(TrialState.WAITING,))
                random.shuffle(self._candidates)
            while self._candidates:
                token = self._candidates.pop()
                if self._take(token):
                    return token
        return None

    def _take(self, token: FrozenTrial) -> bool:
        """The heartbeat first, so a claimant that dies right after claiming still leaves a
        stale item; then WAITING -> RUNNING, which only one claimant wins."""
        storage = self.storage
        if isinstance(storage, RDBStorage) and storage.heartbeat_interval:
            storage.record_heartbeat(token._trial_id)
        try:
            return storage.set_trial_state_values(token._trial_id, state=TrialState.RUNNING)
        except optuna.exceptions.UpdateFinishedTrialError:
            return False


class _Heartbeat:
    """Records the heartbeat of a claimed item every interval while the block runs."""

    def __init__(self, storage: BaseStorage, trial_id: int) -> None:
        self._storage = storage
        self._trial_id = trial_id
        interval = storage.heartbeat_interval if isinstance(storage, RDBStorage) else None
        self._interval = interval
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def __enter__(self) -> None:
        if self._interval:
            self._thread.start()

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def _beat(self) -> None:
        assert isinstance(self._storage, RDBStorage) and self._interval
        while not self._done.wait(self._interval):
            try:
                self._storage.record_heartbeat(self._trial_id)
            except Exception:  # noqa: BLE001 - the database is away; the item may go stale
                pass


class _Work:
    """Doing one claimed item of a study's work queue."""

    def __init__(self, study: optuna.Study, queue: optuna.Study, storage: BaseStorage,
                 config: StudyConfig, info: dict[str, Any], stop: StopRequest) -> None:
        if not isinstance(storage, PlannerRDBStorage):
            raise PlannerUsageError("a study shared by workers lives in a database: give"
                                    " --storage postgresql://... (planner.storage.open_storage)")
        self.study, self.queue, self.storage, self.config, self.info = (
            study, queue, storage, config, info)
        self.stop = stop
        self.encoding = LayoutEncoding(config.space)
        self.evaluator = config.evaluator()
        self.objective = _objective(config, storage, stop)

    def do(self, token: FrozenTrial) -> int:
        """Do the item and complete it; returns the trials written (0: the item was lost, i.e.
        failed as stale while this worker was paused). On an error or a second Ctrl-C the
        item is handed back."""
        try:
            with _Heartbeat(self.storage, token._trial_id):
                if self.info["kind"] == "plans":
                    done = self._plans(token)
                else:
                    done = self._trial(token)
        except BaseException:
            _hand_back(self.queue, self.storage, token)
            raise
        if done is None:
            return 0
        n, value = done
        if value is None:  # completed with the trials
            return n
        try:
            self.storage.set_trial_state_values(token._trial_id, TrialState.COMPLETE,
                                                values=[value])
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # failed as stale meanwhile: its retry finds what was written
        return n

    def _plans(self, token: FrozenTrial) -> tuple[int, float | None] | None:
        """A chunk of strategies, written with the item's completion in one transaction."""
        k, size = token.system_attrs[ITEM], self.info["chunk"]
        chunk = self.config.space.valid[k * size:(k + 1) * size]
        records = _evaluate_all(self.evaluator, chunk, self.stop)
        trials = [frozen_trial(r, self.encoding.params(s), self.encoding.distributions)
                  for s, r in zip(chunk, records)]
        if not self.storage.add_trials_at_once(self.study._study_id, trials,
                                                item_id=token._trial_id, item_value=len(trials)):
            return None
        return len(trials), None

    def _trial(self, token: FrozenTrial) -> tuple[int, float | None] | None:
        """One sampler trial, tagged with the item; a retried item first looks for the trial
        its dead claimant may have finished."""
        k = token.system_attrs[ITEM]
        if "failed_trial" in token.system_attrs:
            for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
                if t.system_attrs.get(ITEM) == k:
                    return 0, float(t.number)  # the dead claimant finished it
        storage, objective, numbers = self.storage, self.objective, []

        def tagged(trial: optuna.Trial) -> Any:
            storage.set_trial_system_attr(trial._trial_id, ITEM, k)
            numbers.append(trial.number)
            return objective(trial)

        self.study.optimize(tagged, n_trials=1)
        return 1, float(numbers[-1])


def _hand_back(queue: optuna.Study, storage: BaseStorage, token: FrozenTrial) -> None:
    """Fail a held item and queue it again (as a stale one would be)."""
    try:
        if storage.set_trial_state_values(token._trial_id, TrialState.FAIL):
            retry_stale(queue, storage.get_trial(token._trial_id))
    except optuna.exceptions.UpdateFinishedTrialError:
        pass


def _reclaim(queue: optuna.Study, items: int) -> int:
    """For ``planner run --resume`` of a worker study (no worker running): hand back every
    RUNNING item, and queue again an item left with no live trial (its worker died between
    failing and re-queuing it). Returns how many."""
    storage = queue._storage
    running = queue.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for token in running:
        _hand_back(queue, storage, token)
    live = {t.system_attrs.get(ITEM) for t in queue.get_trials(
        deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE))}
    lost = [k for k in range(items) if k not in live]
    queue.add_trials([optuna.trial.create_trial(
        state=TrialState.WAITING, system_attrs={ITEM: k, "failed_trial": -1})
        for k in lost])
    return len(running) + len(lost)


def queue_state(study: optuna.Study) -> tuple[int, int, int]:
    """(items done, items in all, items lost) of a worker study's queue: an item is lost when it
    has neither a COMPLETE nor a live trial (its worker died between failing and re-queuing
    it); ``planner run --resume`` queues it again."""
    queue = _load_queue(study, study._storage)
    items = study.user_attrs[WORK_QUEUE]["items"]
    by_state: dict[TrialState, set[int]] = {}
    for t in queue.get_trials(deepcopy=False):
        by_state.setdefault(t.state, set()).add(t.system_attrs.get(ITEM))
    done = by_state.get(TrialState.COMPLETE, set())
    live = by_state.get(TrialState.WAITING, set()) | by_state.get(TrialState.RUNNING, set())
    return len(done), items, len(set(range(items)) - done - live)


def coverage(study: optuna.Study, config: StudyConfig) -> tuple[int, int, int]:
    """(distinct plans stored, valid plans missing, plans stored more than once) of an
    exhaustive study: (n, 0, 0) when it covers its space exactly once."""
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
