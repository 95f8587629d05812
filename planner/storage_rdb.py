"""Optuna's RDB storage as the planner opens it: a few attempts on a fresh database, two bulk
writes (:class:`PlannerRDBStorage`), and the re-queueing of a trial whose process stopped beating
(:func:`retry_stale`). :func:`planner.storage.open_storage` opens it for an RDB URL."""

from __future__ import annotations

import contextlib
import datetime
import json
import re
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

from planner.errors import PlannerUsageError
from planner.storage_paths import QUEUE_SUFFIX, WORK_QUEUE, shown

__all__ = ["PlannerRDBStorage", "open_rdb", "retry_stale"]


def open_rdb(label: str, heartbeat: int | None, attempts: int = 4) -> PlannerRDBStorage:
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
            hint = (" (pip install 'parallel-planner[postgres]')"
                    if label.startswith("postgresql") else "")
            raise PlannerUsageError(f"--storage {shown(label)}: the database driver is missing"
                                    f" ({e}); install it{hint}") from None
        except Exception as e:  # noqa: BLE001 - SQLAlchemy's errors for a bad URL are many
            if attempt + 1 < attempts and _schema_race(e):
                time.sleep(0.2 * (attempt + 1))
                continue
            raise PlannerUsageError(f"--storage {shown(label)}: cannot open the database:"
                                    f" {type(e).__name__}: {_masked(str(e), label)}") from None
    raise AssertionError("unreachable")


def _masked(error: str, label: str) -> str:
    """An error's first line with the URL's password, where it repeats it, as ``***``."""
    first = (error.splitlines() or [""])[0]
    try:
        from sqlalchemy.engine import make_url

        password = make_url(label).password
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy reads: the label's own shape
        found = re.search(r"://[^/:@]*:([^@/]*)@", label)
        password = found.group(1) if found else None
    return _hide(first, str(password)) if password else first


def _hide(text: str, password: str) -> str:
    """``text`` with ``password`` as ``***`` where a URL or a libpq message shows it
    (``:PASSWORD@``, ``password=PASSWORD``), and anywhere when it is long enough not to be a
    common piece of words (a password ``p`` turned "psycopg" into "***syco***g")."""
    text = text.replace(f":{password}@", ":***@")
    text = re.sub(rf"(password\s*=\s*['\"]?){re.escape(password)}", r"\1***", text)
    return text.replace(password, "***") if len(password) >= 6 else text


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

