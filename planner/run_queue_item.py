"""One item of a shared study's work queue, in a worker's hands (:mod:`planner.run_queue`, whose
docstring says why each plan is recorded exactly once): claiming it (:class:`Claimer`), beating
its heartbeat while it is done (:class:`Heartbeat`), doing and completing it (:class:`ItemWork`),
and handing it back when that fails (:func:`hand_back`)."""

from __future__ import annotations

import random
import threading
from typing import Any

import optuna
from optuna.storages import BaseStorage, RDBStorage
from optuna.trial import FrozenTrial, TrialState

from planner.errors import PlannerUsageError
from planner.record import frozen_trial
from planner.run_common import ITEM, StopRequest, _evaluate_all, _objective
from planner.storage_rdb import PlannerRDBStorage, retry_stale
from planner.study_config import StudyConfig
from search_spaces import LayoutEncoding

__all__ = ["Claimer", "Heartbeat", "ItemWork", "fail_own_trial", "hand_back"]


class Claimer:
    """Claims WAITING items of a queue: turns one RUNNING (planner.run_queue, point 1) and hands
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


class Heartbeat:
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


class ItemWork:
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
            fail_own_trial(self.storage, trial_id)
            hand_back(self.queue, self.storage, token)
            self.held.pop()

    def do(self, token: FrozenTrial) -> int:
        """Do the item and complete it; returns the trials written (0: the item was lost, i.e.
        failed as stale while this worker was paused). On an error or a second Ctrl-C the
        item is handed back."""
        self._trial_id = None
        try:
            with Heartbeat(self.storage, token._trial_id):
                if self.info["kind"] == "plans":
                    done = self._plans(token)
                else:
                    done = self._trial(token)
        except BaseException:
            try:
                fail_own_trial(self.storage, self._trial_id)
                hand_back(self.queue, self.storage, token)
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


def fail_own_trial(storage: BaseStorage, trial_id: int | None) -> None:
    """Fail the sampler trial this worker left RUNNING when its item failed (no-op if it was
    recorded as finished), so that no trial of the study stays RUNNING after the work is done."""
    if trial_id is None:
        return
    try:
        storage.set_trial_state_values(trial_id, TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        pass


def hand_back(queue: optuna.Study, storage: BaseStorage, token: FrozenTrial) -> None:
    """Fail a held item and queue it again (as a stale one would be)."""
    if isinstance(storage, PlannerRDBStorage):
        storage.requeue_item(queue._study_id, token._trial_id)
        return
    try:
        if storage.set_trial_state_values(token._trial_id, TrialState.FAIL):
            retry_stale(queue, storage.get_trial(token._trial_id))
    except optuna.exceptions.UpdateFinishedTrialError:
        pass
