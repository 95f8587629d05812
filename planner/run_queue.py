"""Workers sharing a study on a database (``planner worker``; ``planner run --resume`` of such a
study drains what is left as one worker).

queue)"``) made once, by the process that created the study, before the study is marked ready:
one WAITING trial per item - a chunk of the exhaustive space's strategies (item ``k`` is
``space.valid[k*size:(k+1)*size]``; every worker checks it enumerates the same plans by their
hash), or one sampler trial each (``n_trials`` items). Why each plan (or trial) is recorded
exactly once, with any number of workers, on PostgreSQL:

1. An item is claimed by turning its WAITING trial RUNNING with ``set_trial_state_values``,
   which locks the row (``SELECT ... FOR UPDATE``) and refuses unless the state is still
   WAITING: of concurrent claimants exactly one wins. Only the claimant completes an item.
2. A claimant records a heartbeat before claiming and while it works. If it dies, the item goes
   stale; ``PlannerRDBStorage.requeue_item`` turns it FAIL (again a row-locked transition
   that exactly one process wins) and adds the item back as a new WAITING trial in the same
   transaction (so a connection lost midway cannot leave it failed and never queued again).
   So at any time an unfinished item has at most one live (WAITING or RUNNING) trial.
3. A chunk of strategies is written together with its item's completion in one transaction
   (``PlannerRDBStorage.add_trials_at_once``) that locks the item's row and writes nothing
   unless the item is still RUNNING: a chunk is written once, with its completion, or not at
   all (by a claimant that died, or that was paused past the grace period and lost the item).
4. A sampler item's trial runs through ``Study.optimize`` (Optuna's own transactions), tagged
   with the item. A re-queued item first looks for a COMPLETE trial with its tag (its dead
   claimant may have finished it) and runs one only if there is none. The residual risk here
   is the one of any lease: a claimant paused past the grace period while its trial runs.

Workers wait until no item is pending, so the item of a worker that died is done by another.

A lost database (a server restart, a cut network) is ridden out: every call of the worker loop
is tried again with exponential backoff (:class:`planner.db_outage.Outage`) for up to
``retry_s`` seconds (``planner worker --db-retry-s``, default :data:`DB_RETRY_S`); the item in
hand is handed back once the server answers again. Past that window the worker raises
:class:`DatabaseLost`, which names the server and what failed. Exactly-once does not depend on
it: an item whose completion was lost with the connection was either committed with its plans or
not at all (point 3).
"""

from __future__ import annotations

import hashlib
import math
import random
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any

import optuna
import sqlalchemy.exc
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from planner.db_outage import DB_RETRY_S, DatabaseLost, Outage, ride_out
from planner.errors import PlannerUsageError
from planner.run_common import (
    ITEM,
    StopRequest,
    _bar,
    _check_fingerprint,
    _describe,
    make_sampler,
)
from planner.run_queue_item import Claimer, ItemWork, hand_back
from planner.storage import (
    QUEUE_SUFFIX,
    WORK_QUEUE,
    PlannerRDBStorage,
    shown,
    storage_option,
)
from planner.study_config import StudyConfig
from search_spaces import strategy_label

__all__ = ["DB_RETRY_S", "READY_WAIT_S", "DatabaseLost", "WorkerReport", "chunk_size",
           "join_study", "queue_state", "ride_out", "run_worker"]

READY_WAIT_S = 60.0
"""How long a joining worker waits for the study's creator to finish setting it up."""


@dataclass(frozen=True)
class WorkerReport:
    study: optuna.Study
    created: bool
    """This worker created the study (and its work queue)."""
    added: int
    """Trials this worker recorded."""



# -- workers sharing a study on a database -----------------------------------------------------
def run_worker(config: StudyConfig, storage: PlannerRDBStorage, label: str, *,
               progress: bool = True, retry_s: float = DB_RETRY_S) -> WorkerReport:
    """Join the study (creating it and its work queue if it does not exist yet) and work on its
    queue until no item is pending; see the module docstring. Ctrl-C: the item in hand is
    finished, then ``KeyboardInterrupt``. A database away for longer than ``retry_s`` seconds:
    :class:`DatabaseLost`."""
    study, created = ride_out(storage, "joining the study",
                              lambda: join_study(config, storage, label), retry_s)
    queue = ride_out(storage, "loading the work queue", lambda: _load_queue(study, storage),
                     retry_s)
    with StopRequest() as stop:
        added = _drain(study, queue, storage, config, stop, progress, retry_s=retry_s)
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
           config: StudyConfig, stop: StopRequest, progress: bool, poll: float = 0.5, *,
           retry_s: float = DB_RETRY_S) -> int:
    """Claim and do items until none is WAITING or RUNNING; returns the trials recorded. A lost
    database is ridden out for ``retry_s`` seconds (module docstring)."""
    info = ride_out(storage, "reading the study", lambda: _info(study, config), retry_s)
    work = ItemWork(study, queue, storage, config, info, stop)
    claimer = Claimer(queue, storage)
    outage = Outage(storage, retry_s)
    added = 0
    failures = 0
    with _bar(None, progress, "worker") as bar:
        while not stop.requested:
            try:
                work.return_held()
                token = claimer.claim()
                if token is None:
                    if not _pending(queue):
                        _fail_orphans(study, info)
                        break
                    _fail_stale(queue, storage)  # a dead worker's item comes back
                    outage.ok()
                    time.sleep(poll)
                    continue
                n = work.do(token)
            except Exception as e:  # the database went away, or a deadlock between workers
                if PlannerRDBStorage.lost_connection(e):
                    outage.failed(e, "claiming or recording a work item")
                    continue
                if not isinstance(e, TRANSIENT):
                    raise
                failures += 1
                if failures > MAX_TRANSIENT:
                    raise
                print(f"worker: database error ({type(e).__name__}), retrying: the item in hand"
                      " goes back to the queue", file=sys.stderr)
                time.sleep(poll * failures)
                continue
            outage.ok()
            failures = 0
            added += n
            bar.update(n)
    stop.check()
    return added


TRANSIENT: tuple[type[Exception], ...] = (optuna.exceptions.StorageInternalError,
                                          sqlalchemy.exc.OperationalError,
                                          sqlalchemy.exc.InterfaceError)
"""Database errors a worker retries: a lost connection (for up to ``retry_s``), or another
error of a transaction, such as a deadlock between workers (``MAX_TRANSIENT`` times). The item
in hand is handed back (or goes stale), so exactly-once still holds."""
MAX_TRANSIENT = 5


def _fail_stale(study: optuna.Study, storage: BaseStorage | None = None) -> None:
    """Queue again the items whose claimant stopped beating; on a PlannerRDBStorage each in one
    transaction (``requeue_item``), so a connection lost midway cannot leave one failed and
    never queued again."""
    if isinstance(storage, PlannerRDBStorage) and storage.heartbeat_interval:
        for trial_id in storage._get_stale_trial_ids(study._study_id):
            storage.requeue_item(study._study_id, trial_id)
        return
    with warnings.catch_warnings():  # experimental since 2.9, still so marked in 5.0
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def _fail_orphans(study: optuna.Study, info: dict[str, Any]) -> None:
    """With every item done, fail the sampler trials still RUNNING: each item's own trial is
    finished, so these are orphans, made by a worker whose connection was lost between the
    trial's creation and its first heartbeat (no heartbeat, so never stale). Exhaustive items
    add finished trials only."""
    if info["kind"] != "trials":
        return
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        try:
            study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another worker failed it first


def _pending(queue: optuna.Study) -> bool:
    return bool(queue.get_trials(deepcopy=False,
                                 states=(TrialState.WAITING, TrialState.RUNNING)))


def _reclaim(queue: optuna.Study, items: int) -> int:
    """For ``planner run --resume`` of a worker study (no worker running): hand back every
    RUNNING item, and queue again an item left with no live trial (its worker died between
    failing and re-queuing it). Returns how many."""
    storage = queue._storage
    running = queue.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for token in running:
        hand_back(queue, storage, token)
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

