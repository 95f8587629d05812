"""Where studies live: embedded journal files by default, or any Optuna RDB URL.

The default is the folder ``planner-results/studies/`` in the working directory (or
``$PLANNER_STORAGE``), one journal per study (:mod:`planner.study_folder`), beside the tables
and plots the planner writes to ``planner-results/``. Optuna's JournalStorage appends one line
per change; on this machine it records trials several times faster than SQLite
(``benchmarks/bench_storage.py``). ``--storage`` takes a folder, a journal path (several studies
in one file) or a URL such as ``sqlite:///studies.db`` or ``postgresql://user@host/db``, used
unchanged.

Crash safety of the journal (a process killed with SIGKILL at any instant):

- Every write happens under :class:`JournalLock`: a kernel lock (``flock``) on the journal, which
  the kernel drops when its holder dies, plus Optuna's own symlink lock (so a plain Optuna writer
  is excluded too). A symlink lock left by a dead planner process is recognised (its target
  marks it as ours and nobody holds the kernel lock) and removed at once, instead of after
  Optuna's 30 s grace period.
- A killed writer can leave a torn last line. Optuna ignores it while it is last, but the next
  append would glue a new line onto it and break the file for every reader. Under the lock,
  before appending, the torn tail is cut off (:func:`repair_tail`), so the file is always a
  sequence of whole lines: every change before the kill, nothing of the one it interrupted.

RDB URLs open a :class:`PlannerRDBStorage`: Optuna's ``RDBStorage`` plus two bulk writes (Optuna
writes every attribute in a statement or two of its own, about 50 round trips per trial), and
optionally Optuna's heartbeat (``open_storage(..., heartbeat=S)``): a trial whose process stopped
beating for ``3 S`` seconds is failed and re-queued by the next process that starts a trial.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import stat
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import optuna
from optuna.storages import (
    BaseStorage,
    JournalStorage,
    RDBStorage,
    RetryHeartbeatStaleTrialCallback,
)
from optuna.storages.journal import (
    BaseJournalBackend,
    JournalFileBackend,
    JournalFileSymlinkLock,
)

from planner.errors import PlannerUsageError
from planner.storage_paths import (  # the light names, re-exported
    DEFAULT_STORAGE,
    LEGACY_STORAGE,
    RESULTS_DIR,
    is_url,
    shown,
    storage_label,
    storage_option,
)

__all__ = [
    "DEFAULT_STORAGE",
    "LEGACY_STORAGE",
    "QUEUE_SUFFIX",
    "RESULTS_DIR",
    "WORK_QUEUE",
    "BatchedJournalFileBackend",
    "JournalLock",
    "PlannerRDBStorage",
    "batched",
    "is_url",
    "open_storage",
    "repair_tail",
    "shown",
    "storage_label",
    "storage_option",
    "study_names",
]

WORK_QUEUE = "work_queue"
"""User attribute of a study shared by workers: what its work queue holds (planner.runner)."""
QUEUE_SUFFIX = " (work queue)"
"""A work queue is the study of this name after the shared study's (a space: no user's name)."""


def open_storage(arg: str | None, *, create: bool, heartbeat: int | None = None
                 ) -> BaseStorage:
    """Open the storage; ``create=False`` refuses a journal file that does not exist yet.

    ``heartbeat`` (seconds, RDB URLs only): record a heartbeat of every running trial at that
    interval; trials silent for ``3 * heartbeat`` seconds are failed and retried."""
    label = storage_label(arg)
    if is_url(label):
        return _open_rdb(label, heartbeat)
    path = Path(label)
    if not create and not path.exists():
        raise PlannerUsageError(f"--storage {label}: no studies there yet; run `planner run"
                                f" STUDY.yaml{storage_option(label)}` first, or give another"
                                " --storage")
    if path.is_dir():  # a folder of studies is opened a study at a time (study_folder)
        raise PlannerUsageError(f"--storage {label}: is a folder of studies; name the study"
                                " (planner studies lists them)")
    _check_journal(path, label)
    path.parent.mkdir(parents=True, exist_ok=True)
    return BatchedJournalStorage(BatchedJournalFileBackend(str(path)))


JOURNAL_START = b'{"op_code":'
"""How every line of an Optuna journal begins (``json.dumps`` of a log, ``op_code`` first)."""


def _check_journal(path: Path, label: str) -> None:
    """Refuse a file that exists and is neither empty nor an Optuna journal: a journal would be
    written into it (after its torn-looking last line was cut), destroying the user's file."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise PlannerUsageError(f"--storage {label}: is not a regular file; give a journal"
                                    " file path such as planner-results/studies.journal")
        with open(path, "rb") as f:
            start = f.read(2 * len(JOURNAL_START))
    except FileNotFoundError:
        return
    except OSError as e:
        raise PlannerUsageError(f"--storage {label}: cannot be read ({e.strerror})") from None
    start = start.replace(b" ", b"")[:len(JOURNAL_START)]
    if start and start != JOURNAL_START[:len(start)]:
        raise PlannerUsageError(
            f"--storage {label}: is not an Optuna journal, and planner would overwrite it;"
            " give a new file (such as planner-results/studies.journal) or a journal a planner"
            " run made")


def _open_rdb(label: str, heartbeat: int | None, attempts: int = 4) -> PlannerRDBStorage:
    """An RDBStorage; a few attempts, since processes starting together on an empty database
    race to create its tables (the loser's CREATE fails; on retry the tables are there)."""
    engine: dict[str, Any] = {"pool_pre_ping": True}
    if label.startswith("postgresql"):  # a server gone silent fails a connect, not hangs it
        engine["connect_args"] = {"connect_timeout": PlannerRDBStorage.CONNECT_TIMEOUT_S}
    kwargs: dict[str, Any] = {"engine_kwargs": engine}
    if heartbeat is not None:
        kwargs.update(heartbeat_interval=heartbeat, grace_period=3 * heartbeat,
                      heartbeat_stale_trial_callback=retry_stale)
    for attempt in range(attempts):
        try:
            with warnings.catch_warnings():  # heartbeat arguments are marked experimental
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return PlannerRDBStorage(label, **kwargs)
        except (ImportError, ModuleNotFoundError) as e:
            raise PlannerUsageError(f"--storage {label}: the database driver is missing ({e});"
                                    " install it, e.g. pip install 'parallel-planner[postgres]'"
                                    ) from None
        except Exception as e:  # noqa: BLE001 - SQLAlchemy's errors for a bad URL are many
            if attempt + 1 < attempts and _schema_race(e):
                time.sleep(0.2 * (attempt + 1))
                continue
            raise PlannerUsageError(f"--storage {label}: cannot open the database:"
                                    f" {type(e).__name__}: {str(e).splitlines()[0]}") from None
    raise AssertionError("unreachable")


class PlannerRDBStorage(RDBStorage):
    """Optuna's RDBStorage with two bulk writes, each one transaction of a few statements.

    - :meth:`add_trials_at_once`: trials made with ``create_trial`` (finished ones on the
      exhaustive path, WAITING work items), numbered as Optuna numbers them (under the study
      row's lock, the count of the study's trials), optionally completing a work item in the
      same transaction, and only if that item is still RUNNING: the trials and the item's
      completion are written together or not at all.
    - :meth:`batch`: ``set_trial_user_attr`` calls inside it are written together at its end.

    Both write Optuna's own tables through its own models (``optuna.storages._rdb.models``), as
    its ``create_new_trial`` would (a test compares the two trial by trial).
    """

    CONNECT_TIMEOUT_S: ClassVar[int] = 10
    """How long a connection attempt to PostgreSQL may take before it counts as failed."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self._pending: list[tuple[int, str, Any]] | None = None

    @property
    def where(self) -> str:
        """The server as printed: ``host:port/database`` (never the password)."""
        url = self.engine.url
        port = f":{url.port}" if url.port else ""
        return f"{url.host or 'localhost'}{port}/{url.database or ''}"

    @staticmethod
    def lost_connection(error: BaseException) -> bool:
        """The error, or one it was raised from, is a lost or refused connection (a server
        restart, a cut network) or a transaction the server aborted: worth trying again once
        the server answers. Optuna wraps these in ``StorageInternalError`` ("invalid data ...
        exceeding max length"), which alone says nothing of the cause."""
        import sqlalchemy.exc

        seen: BaseException | None = error
        while seen is not None:
            if isinstance(seen, sqlalchemy.exc.DBAPIError) and seen.connection_invalidated:
                return True
            if isinstance(seen, (sqlalchemy.exc.OperationalError,
                                 sqlalchemy.exc.InterfaceError)):
                return True
            seen = seen.__cause__ or seen.__context__
        return False

    @staticmethod
    def cause(error: BaseException) -> str:
        """The first line of the driver's own message under Optuna's and SQLAlchemy's."""
        import sqlalchemy.exc

        seen: BaseException = error
        while seen.__cause__ is not None or seen.__context__ is not None:
            if isinstance(seen, sqlalchemy.exc.DBAPIError) and seen.orig is not None:
                seen = seen.orig
                break
            seen = seen.__cause__ or seen.__context__  # type: ignore[assignment]
        if isinstance(seen, sqlalchemy.exc.DBAPIError) and seen.orig is not None:
            seen = seen.orig
        text = (str(seen).strip().splitlines() or [""])[0]
        return f"{type(seen).__name__}: {text}" if text else type(seen).__name__

    def first_heartbeat(self, trial_id: int) -> None:
        """Optuna's ``record_heartbeat``, raising: a trial whose first heartbeat is not stored
        would never go stale."""
        super().record_heartbeat(trial_id)

    def record_heartbeat(self, trial_id: int) -> None:
        """A heartbeat missed while the database is away is skipped, not raised: Optuna's
        heartbeat thread would die with a traceback on stderr."""
        try:
            super().record_heartbeat(trial_id)
        except Exception as e:
            if not self.lost_connection(e):
                raise

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        self._pending = []
        try:
            yield
            if self._pending:
                self._write_user_attrs(self._pending)
        finally:
            self._pending = None

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        if self._pending is None:
            super().set_trial_user_attr(trial_id, key, value)
        else:
            self._pending.append((trial_id, key, value))

    def _write_user_attrs(self, attrs: list[tuple[int, str, Any]]) -> None:
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session
        from sqlalchemy import delete, insert

        last = {(t, k): v for t, k, v in attrs}
        ids = {t for t, _ in last}
        table = models.TrialUserAttributeModel.__table__
        with _create_scoped_session(self.scoped_session) as session:
            for trial_id in ids:
                trial = models.TrialModel.find_or_raise_by_id(trial_id, session)
                self.check_trial_is_updatable(trial_id, trial.state)
            session.execute(delete(table).where(table.c.trial_id.in_(ids),
                                                table.c.key.in_({k for _, k in last})))
            session.execute(insert(table), [{"trial_id": t, "key": k, "value_json": json.dumps(v)}
                                            for (t, k), v in last.items()])

    def get_n_trials(self, study_id: int, state: Any = None) -> int:
        """One COUNT query (Optuna's default reads every trial back)."""
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session
        from optuna.trial import TrialState
        from sqlalchemy import func

        states = (state,) if isinstance(state, TrialState) else state
        with _create_scoped_session(self.scoped_session) as session:
            query = session.query(func.count(models.TrialModel.trial_id)).filter(
                models.TrialModel.study_id == study_id)
            if states is not None:
                query = query.filter(models.TrialModel.state.in_(tuple(states)))
            return int(query.scalar())

    def user_attr_values(self, study_id: int, key: str, state: Any) -> list[Any]:
        """One user attribute of the study's trials in ``state``, in one query (reading the
        trials back through Optuna reads every attribute of every trial)."""
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        attr, trial = models.TrialUserAttributeModel, models.TrialModel
        with _create_scoped_session(self.scoped_session) as session:
            rows = session.query(attr.value_json).join(trial, attr.trial_id == trial.trial_id) \
                .filter(trial.study_id == study_id, trial.state == state, attr.key == key).all()
        return [json.loads(r[0]) for r in rows]

    def add_trials_at_once(self, study_id: int, trials: Sequence[optuna.trial.FrozenTrial], *,
                            item_id: int | None = None, item_value: float = 0.0) -> bool:
        """Add the trials in one transaction; with ``item_id``, complete that RUNNING trial (a
        work item) with ``item_value`` too, or write nothing and return False if it is no longer
        RUNNING."""
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session
        from optuna.trial import TrialState
        from sqlalchemy import func

        rows = _rows(trials)  # before the transaction: its locks are held as briefly as may be
        with _create_scoped_session(self.scoped_session) as session:
            models.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)
            item = None
            if item_id is not None:
                item = models.TrialModel.find_or_raise_by_id(item_id, session, for_update=True)
                if item.state != TrialState.RUNNING:
                    return False
            base = session.query(func.count(models.TrialModel.trial_id)).filter(
                models.TrialModel.study_id == study_id).scalar()
            if trials:
                _insert_trials(session, study_id, base, rows)
            if item is not None:
                stored, kind = models.TrialValueModel.value_to_stored_repr(item_value)
                session.add(models.TrialValueModel(trial_id=item_id, objective=0, value=stored,
                                                   value_type=kind))
                item.state = TrialState.COMPLETE
                item.datetime_complete = datetime.datetime.now()
        return True

    def requeue_item(self, study_id: int, item_id: int) -> bool:
        """Fail a RUNNING work item and add it again as a WAITING trial (with the system
        attributes Optuna's ``RetryHeartbeatStaleTrialCallback`` gives it), in one transaction;
        False (nothing written) if it is no longer RUNNING. Done in two transactions, as
        ``fail_stale_trials`` and its callback do, a connection lost between them left an item
        failed and never queued again."""
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session
        from optuna.trial import TrialState, create_trial
        from sqlalchemy import func

        with _create_scoped_session(self.scoped_session) as session:
            models.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)
            item = models.TrialModel.find_or_raise_by_id(item_id, session, for_update=True)
            if item.state != TrialState.RUNNING:
                return False
            attrs = {a.key: json.loads(a.value_json) for a in item.system_attributes}
            attrs = {"failed_trial": item.number, "retry_history": [], **attrs}
            attrs["retry_history"] = [*attrs["retry_history"], item.number]
            item.state = TrialState.FAIL
            item.datetime_complete = datetime.datetime.now()
            base = session.query(func.count(models.TrialModel.trial_id)).filter(
                models.TrialModel.study_id == study_id).scalar()
            retry = create_trial(state=TrialState.WAITING, system_attrs=attrs)
            _insert_trials(session, study_id, base, _rows([retry]))
        return True


def _utc(moment: datetime.datetime | None) -> datetime.datetime | None:
    """Optuna's RDB datetimes: naive UTC."""
    if moment is None:
        return None
    return moment.astimezone(datetime.UTC).replace(tzinfo=None)


@dataclass
class _Rows:
    """The rows of finished trials in Optuna's tables, built before the transaction; each
    attribute row knows the index of its trial (``_trial``) until the trial ids exist."""

    trials: list[dict[str, Any]]
    children: list[tuple[Any, list[dict[str, Any]]]]


def _rows(trials: Sequence[optuna.trial.FrozenTrial]) -> _Rows:
    from optuna.distributions import distribution_to_json
    from optuna.storages._rdb import models

    values, params, user, system = [], [], [], []
    for i, t in enumerate(trials):
        for objective, v in enumerate(t.values or []):
            stored, kind = models.TrialValueModel.value_to_stored_repr(v)
            values.append({"_trial": i, "objective": objective, "value": stored,
                           "value_type": kind})
        for name, value in t.params.items():
            dist = t.distributions[name]
            params.append({"_trial": i, "param_name": name,
                           "param_value": dist.to_internal_repr(value),
                           "distribution_json": distribution_to_json(dist)})
        user += [{"_trial": i, "key": k, "value_json": json.dumps(v)}
                 for k, v in t.user_attrs.items()]
        system += [{"_trial": i, "key": k, "value_json": json.dumps(v)}
                   for k, v in t.system_attrs.items()]
    heads = [{"state": t.state, "datetime_start": _utc(t.datetime_start),
              "datetime_complete": _utc(t.datetime_complete)} for t in trials]
    children = [(models.TrialValueModel, values), (models.TrialParamModel, params),
                (models.TrialUserAttributeModel, user),
                (models.TrialSystemAttributeModel, system)]
    return _Rows(heads, children)


def _insert_trials(session: Any, study_id: int, base: int, rows: _Rows) -> None:
    """Insert the rows, the trials numbered from ``base``."""
    from optuna.storages._rdb import models
    from sqlalchemy import insert

    table = models.TrialModel.__table__
    heads = [{**h, "number": base + i, "study_id": study_id} for i, h in enumerate(rows.trials)]
    ids = session.execute(
        insert(table).returning(table.c.trial_id, sort_by_parameter_order=True), heads,
    ).scalars().all()
    for model, children in rows.children:
        for r in children:  # single use: filled in place
            r["trial_id"] = ids[r.pop("_trial")]
        if children:
            session.execute(insert(model.__table__), children)


def retry_stale(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """What happens to a trial whose process stopped beating, once it is failed: re-queued with
    its parameters (Optuna's ``RetryHeartbeatStaleTrialCallback``), except a trial of a study
    shared by workers, whose work item is re-queued instead (so it is not run twice)."""
    if study.study_name.endswith(QUEUE_SUFFIX) or WORK_QUEUE not in study.user_attrs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            RetryHeartbeatStaleTrialCallback()(study, trial)


def _schema_race(e: Exception) -> bool:
    """An error of two processes creating Optuna's tables at once (not a bad URL)."""
    text = str(e).lower()
    return any(k in text for k in ("already exists", "duplicate key", "unique constraint",
                                   "deadlock"))


class BatchedJournalStorage(JournalStorage):
    """A JournalStorage that keeps its batched file backend at hand for :func:`batched`."""

    def __init__(self, backend: BatchedJournalFileBackend) -> None:
        super().__init__(backend)
        self.file_backend = backend


class JournalLock:
    """Optuna's symlink lock on a journal file, made safe against a holder killed by SIGKILL.

    ``acquire`` first takes, in this order: a lock between the threads of this process, and a
    kernel lock (``flock``) on the journal file itself, which the kernel releases when the
    holding process dies. Then it creates Optuna's symlink ``<journal>.lock`` pointing at the
    journal through a marker path (``<dir>/./<name>``, still the journal for ``os.stat``), so a
    plain Optuna writer is excluded as usual. A planner process holds the kernel lock for as
    long as its symlink exists, so a marked symlink found while holding the kernel lock was left
    by a dead planner process: it is removed at once. An unmarked one belongs to a plain Optuna
    writer and is waited for (Optuna's grace period applies).
    """

    _thread_locks: ClassVar[dict[str, threading.Lock]] = {}
    _guard = threading.Lock()

    def __init__(self, path: str) -> None:
        self._journal = os.path.abspath(path)
        self._marker = os.path.join(os.path.dirname(self._journal), ".",
                                    os.path.basename(self._journal))
        self._symlink = JournalFileSymlinkLock(self._journal)
        self._symlink._lock_target_file = self._marker  # what the symlink points at
        self.lock_file = self._journal + ".lock"
        with JournalLock._guard:
            self._thread_lock = JournalLock._thread_locks.setdefault(self._journal,
                                                                     threading.Lock())
        self._fd: int | None = None

    def acquire(self) -> bool:
        self._thread_lock.acquire()
        fd = None
        try:
            fd = os.open(self._journal, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._remove_dead_marker()
            self._symlink.acquire()
        except BaseException:
            if fd is not None:
                os.close(fd)  # closing drops the kernel lock
            self._thread_lock.release()
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        try:
            self._symlink.release()
        finally:
            fd, self._fd = self._fd, None
            if fd is not None:
                os.close(fd)
            self._thread_lock.release()

    def _remove_dead_marker(self) -> None:
        try:
            target = os.readlink(self.lock_file)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.EINVAL):
                return
            raise
        if target == self._marker or self._is_marker(target):
            os.unlink(self.lock_file)

    def _is_marker(self, target: str) -> bool:
        """A planner marker made where the journal used to be (its folder since moved or
        reached by another path): ``<any dir>/./<name>``. Plain Optuna writers point at the
        journal's own path, which has no ``/./``."""
        name = os.path.basename(self._journal)
        return target.endswith(os.path.join(os.sep + ".", name)) and target != self._journal


def repair_tail(path: str) -> int:
    """Cut a torn last line (no newline: its writer was killed mid-write) off the journal, and
    then any last lines that are not JSON (garbage Optuna skips only while it is last), under
    its lock; returns the bytes removed."""
    with open(path, "rb+") as f:
        size = end = f.seek(0, os.SEEK_END)
        while end > 0:
            start = _line_start(f, end - 1 if _ends_line(f, end) else end)
            if _ends_line(f, end) and _is_json(f, start, end):
                break
            end = start
        if end == size:
            return 0
        f.truncate(end)
        f.flush()
        os.fsync(f.fileno())
        return size - end


def _ends_line(f: Any, end: int) -> bool:
    """The byte before ``end`` is a newline."""
    f.seek(end - 1)
    return f.read(1) == b"\n"


def _line_start(f: Any, end: int) -> int:
    """Where the line holding the bytes before ``end`` begins (after the newline before it)."""
    block = 1 << 16
    while end > 0:
        start = max(0, end - block)
        f.seek(start)
        i = f.read(end - start).rfind(b"\n")
        if i >= 0:
            return start + i + 1
        end = start
    return 0


def _is_json(f: Any, start: int, end: int) -> bool:
    f.seek(start)
    try:
        json.loads(f.read(end - start))
    except ValueError:
        return False
    return True


class BatchedJournalFileBackend(BaseJournalBackend):
    """Optuna's journal file, with batches: inside :meth:`batch` the file lock is held once and
    the appended log lines are written (and fsync-ed) together when the batch ends.

    Outside a batch it writes as ``JournalFileBackend`` does, with :class:`JournalLock` and the
    torn-tail repair (module docstring). Recording the exhaustive path's trials with
    ``Study.add_trials`` takes one lock, write and fsync per trial otherwise, about 1.2 ms each
    here: 14 s for 12,000 trials, against 1.3 s batched (``benchmarks/bench_storage.py``).
    While the lock is held no other process appends, so the file's lines are numbered
    ``0 .. F-1`` and the buffered ones ``F ..``; a process killed mid-batch loses only that
    batch (or its unwritten end), never a line already in the file.
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = JournalLock(path)
        self._file = JournalFileBackend(path, lock_obj=self._lock)  # type: ignore[arg-type]
        self._buffer: list[dict[str, Any]] | None = None
        self._file_lines: int | None = None

    @property
    def path(self) -> str:
        return self._path

    def read_logs(self, log_number_from: int) -> Iterable[dict[str, Any]]:
        if self._buffer is None:
            return self._checked(log_number_from)
        if self._file_lines is None or log_number_from < self._file_lines:
            logs = list(self._checked(log_number_from))
            self._file_lines = log_number_from + len(logs)
            return logs + self._buffer
        return self._buffer[log_number_from - self._file_lines:]

    def _checked(self, log_number_from: int) -> Iterator[dict[str, Any]]:
        """Optuna's reading, with a line that is not a journal entry (before the last: Optuna
        skips a bad last line) as one line naming the file and the fix."""
        try:
            yield from self._file.read_logs(log_number_from)
        except ValueError:  # json.JSONDecodeError, or Optuna's "Invalid log format."
            raise PlannerUsageError(
                f"{self._path}: a line that is not an Optuna journal entry, with entries after"
                f" it; `planner repair {self._path}` keeps every valid entry (and a .bak copy)"
            ) from None

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        if self._buffer is not None:
            self._buffer.extend(logs)
            return
        self._lock.acquire()
        try:
            repair_tail(self._path)
            self._write(logs)
        finally:
            self._lock.release()

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        self._lock.acquire()
        try:
            repair_tail(self._path)
            self._buffer, self._file_lines = [], None
            yield
            if self._buffer:
                self._write(self._buffer)
        finally:
            self._buffer, self._file_lines = None, None
            self._lock.release()

    def _write(self, logs: list[dict[str, Any]]) -> None:
        text = "\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n"
        with open(self._path, "ab") as f:
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())


def batched(storage: BaseStorage | None) -> contextlib.AbstractContextManager[None]:
    """One batch of writes on a batched journal file (or of user attributes on a database);
    any other storage writes as it goes."""
    if isinstance(storage, BatchedJournalStorage):
        return storage.file_backend.batch()
    if isinstance(storage, PlannerRDBStorage):
        return storage.batch()
    return contextlib.nullcontext()


def study_names(storage: BaseStorage) -> list[str]:
    return optuna.get_all_study_names(storage=storage)


def load_existing(storage: BaseStorage, name: str, label: str) -> optuna.Study:
    """A stored study by name; a one-line error listing the stored names if there is none."""
    names = study_names(storage)
    if name not in names:
        known = ", ".join(sorted(names)) or "none yet"
        raise PlannerUsageError(f"no study named {name!r} in {label}; stored: {known}")
    return optuna.load_study(study_name=name, storage=storage)
