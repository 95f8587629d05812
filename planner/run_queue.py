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
is tried again with exponential backoff (:class:`_Outage`) for up to ``retry_s`` seconds
(``planner worker --db-retry-s``, default :data:`DB_RETRY_S`); the item in hand is handed back
once the server answers again. Past that window the worker raises :class:`DatabaseLost`, which
names the server and what failed. Exactly-once does not depend on it: an item whose completion
was lost with the connection was either committed with its plans or not at all (point 3).
"""

from __future__ import annotations

import hashlib
import math
import random
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import optuna
import sqlalchemy.exc
from optuna.storages import BaseStorage, RDBStorage
from optuna.trial import FrozenTrial, TrialState

from planner.errors import PlannerUsageError
from planner.record import frozen_trial
from planner.run_common import (
    ITEM,
    StopRequest,
    _bar,
    _check_fingerprint,
    _describe,
    _evaluate_all,
    _objective,
    make_sampler,
)
from planner.storage import (
    QUEUE_SUFFIX,
    WORK_QUEUE,
    PlannerRDBStorage,
    retry_stale,
    shown,
    storage_option,
)
from planner.study_config import StudyConfig
from search_spaces import LayoutEncoding, strategy_label

T = TypeVar("T")

READY_WAIT_S = 60.0
"""How long a joining worker waits for the study's creator to finish setting it up."""
DB_RETRY_S = 60.0
"""How long a worker rides out a lost database before it gives up (a PostgreSQL restart takes
3-30 s)."""
BACKOFF_S = (0.25, 5.0)
"""The first and the longest wait between two attempts while the database is away."""


class DatabaseLost(Exception):
    """The database stayed unreachable for the whole retry window."""

    def __init__(self, where: str, what: str, waited_s: float, cause: str) -> None:
        self.where, self.what, self.waited_s, self.cause = where, what, waited_s, cause
        super().__init__(f"lost the connection to the database at {where} while {what}, and it"
                         f" did not answer for {waited_s:.0f} s ({cause})")


class _Outage:
    """Rides out a lost database: after a failed attempt :meth:`failed` waits (``BACKOFF_S``,
    doubling) and returns, or raises :class:`DatabaseLost` once ``retry_s`` seconds have passed
    since the first failure; :meth:`ok` after a successful attempt ends the outage."""

    def __init__(self, storage: BaseStorage, retry_s: float) -> None:
        self.storage, self.retry_s = storage, retry_s
        self.since: float | None = None
        self.attempts = 0

    def failed(self, error: BaseException, what: str) -> None:
        """Called in an ``except`` block: re-raises an error that is not a lost database."""
        if not PlannerRDBStorage.lost_connection(error):
            raise error
        where = self.storage.where if isinstance(self.storage, PlannerRDBStorage) else "?"
        cause = PlannerRDBStorage.cause(error)
        now = time.monotonic()
        if self.since is None:
            self.since = now
            print(f"worker: lost the database at {where} while {what} ({cause}); retrying for"
                  f" up to {self.retry_s:g} s", file=sys.stderr)
        waited = now - self.since
        if waited >= self.retry_s:
            raise DatabaseLost(where, what, waited, cause) from None
        pause = min(BACKOFF_S[0] * 2 ** self.attempts, BACKOFF_S[1], self.retry_s - waited)
        self.attempts += 1
        time.sleep(pause)

    def ok(self) -> None:
        if self.since is not None:
            print(f"worker: the database answers again after"
                  f" {time.monotonic() - self.since:.1f} s", file=sys.stderr)
        self.since, self.attempts = None, 0


def ride_out(storage: BaseStorage, what: str, call: Callable[[], T],
             retry_s: float = DB_RETRY_S) -> T:
    """``call()``, tried again while the database is away (:class:`_Outage`)."""
    outage = _Outage(storage, retry_s)
    while True:
        try:
            result = call()
        except Exception as e:  # noqa: BLE001 - failed() re-raises what is not an outage
            outage.failed(e, what)
            continue
        outage.ok()
        return result


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
    work = _Work(study, queue, storage, config, info, stop)
    claimer = _Claimer(queue, storage)
    outage = _Outage(storage, retry_s)
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
        if isinstance(storage, PlannerRDBStorage) and storage.heartbeat_interval:
            storage.first_heartbeat(token._trial_id)
        elif isinstance(storage, RDBStorage) and storage.heartbeat_interval:
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
            except Exception:  # noqa: BLE001, S110 - the database is away; the item may go stale
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
        self.held: list[tuple[FrozenTrial, int | None]] = []
        """Items (with the sampler trial they were running) that could not be handed back while
        the database was away: handed back by :meth:`return_held` once it answers."""
        self._trial_id: int | None = None

    def return_held(self) -> None:
        """Hand back the items a lost database kept this worker from handing back (a stale
        check may have done it meanwhile: then this changes nothing)."""
        while self.held:
            token, trial_id = self.held[-1]
            _fail_own_trial(self.storage, trial_id)
            _hand_back(self.queue, self.storage, token)
            self.held.pop()

    def do(self, token: FrozenTrial) -> int:
        """Do the item and complete it; returns the trials written (0: the item was lost, i.e.
        failed as stale while this worker was paused). On an error or a second Ctrl-C the
        item is handed back."""
        self._trial_id = None
        try:
            with _Heartbeat(self.storage, token._trial_id):
                if self.info["kind"] == "plans":
                    done = self._plans(token)
                else:
                    done = self._trial(token)
        except BaseException:
            try:
                _fail_own_trial(self.storage, self._trial_id)
                _hand_back(self.queue, self.storage, token)
            except Exception as e:
                if not PlannerRDBStorage.lost_connection(e):
                    raise
                self.held.append((token, self._trial_id))
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
        except Exception as e:
            if PlannerRDBStorage.lost_connection(e):  # its retry finds the finished trial
                self.held.append((token, None))
            raise
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
            self._trial_id = trial._trial_id
            storage.set_trial_system_attr(trial._trial_id, ITEM, k)
            numbers.append(trial.number)
            return objective(trial)

        self.study.optimize(tagged, n_trials=1)
        return 1, float(numbers[-1])


def _fail_own_trial(storage: BaseStorage, trial_id: int | None) -> None:
    """Fail the sampler trial this worker left RUNNING when its item failed (no-op if it was
    recorded as finished), so that no trial of the study stays RUNNING after the work is done."""
    if trial_id is None:
        return
    try:
        storage.set_trial_state_values(trial_id, TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        pass


def _hand_back(queue: optuna.Study, storage: BaseStorage, token: FrozenTrial) -> None:
    """Fail a held item and queue it again (as a stale one would be)."""
    if isinstance(storage, PlannerRDBStorage):
        storage.requeue_item(queue._study_id, token._trial_id)
        return
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

