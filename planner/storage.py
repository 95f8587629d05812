"""Where studies live: embedded journal files by default, or any Optuna RDB URL.

The default is the folder ``planner-results/studies/`` in the working directory (or
``$PLANNER_STORAGE``), one journal per study (:mod:`planner.study_folder`), beside the tables
and plots the planner writes to ``planner-results/``. Optuna's JournalStorage appends one line
per change; on this machine it records trials several times faster than SQLite
(``benchmarks/bench_storage.py``). ``--storage`` takes a folder, a journal path (several studies
in one file) or a URL such as ``sqlite:///studies.db`` or ``postgresql://user@host/db``, used
unchanged.

The journal (:mod:`planner.storage_journal`) is written in batches and stays a sequence of whole
lines whatever instant a writer is killed at. RDB URLs open a
:class:`~planner.storage_rdb.PlannerRDBStorage` (:mod:`planner.storage_rdb`): Optuna's
``RDBStorage`` plus two bulk writes, and optionally Optuna's heartbeat
(``open_storage(..., heartbeat=S)``): a trial whose process stopped beating for ``3 S`` seconds
is failed and re-queued by the next process that starts a trial.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

import optuna
from optuna.storages import BaseStorage

from planner.errors import PlannerUsageError
from planner.storage_journal import (
    BatchedJournalFileBackend,
    BatchedJournalStorage,
    JournalLock,
    repair_tail,
)
from planner.storage_paths import (  # the light names, re-exported
    DEFAULT_STORAGE,
    LEGACY_STORAGE,
    QUEUE_SUFFIX,
    RESULTS_DIR,
    WORK_QUEUE,
    is_url,
    shown,
    storage_label,
    storage_option,
)
from planner.storage_rdb import PlannerRDBStorage, open_rdb, retry_stale

__all__ = [
    "DEFAULT_STORAGE",
    "LEGACY_STORAGE",
    "QUEUE_SUFFIX",
    "RESULTS_DIR",
    "WORK_QUEUE",
    "BatchedJournalFileBackend",
    "BatchedJournalStorage",
    "JournalLock",
    "PlannerRDBStorage",
    "batched",
    "is_url",
    "load_existing",
    "open_storage",
    "repair_tail",
    "retry_stale",
    "shown",
    "storage_label",
    "storage_option",
    "study_names",
]


def open_storage(arg: str | None, *, create: bool, heartbeat: int | None = None
                 ) -> BaseStorage:
    """Open the storage; ``create=False`` refuses a journal file that does not exist yet.

    ``heartbeat`` (seconds, RDB URLs only): record a heartbeat of every running trial at that
    interval; trials silent for ``3 * heartbeat`` seconds are failed and retried."""
    label = storage_label(arg)
    if is_url(label):
        sqlite = _sqlite_file(label)
        if label.startswith("sqlite:") and sqlite is None:  # sqlite://, sqlite:///:memory:
            raise PlannerUsageError(f"--storage {label}: an in-memory database, gone when the"
                                    " command ends (its studies with it); give a file,"
                                    " sqlite:///PATH, or a journal path")
        if not create and sqlite is not None and not sqlite.exists():  # Optuna would make it
            raise PlannerUsageError(f"--storage {label}: {sqlite} does not exist, so no studies"
                                    f" are there yet; run `planner run STUDY.yaml"
                                    f"{storage_option(label)}` first, or give another --storage")
        return open_rdb(label, heartbeat)
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


def _sqlite_file(url: str) -> Path | None:
    """The file of a ``sqlite:///PATH`` URL (its query dropped); None for a server or an
    in-memory database."""
    if not url.startswith("sqlite:///"):
        return None
    path = url.removeprefix("sqlite:///").split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


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
            f"--storage {label}: is not an Optuna journal (a run would write into it); give a"
            " journal a planner run made, or a new file such as planner-results/studies.journal")



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
        from planner.study_folder import missing_study

        raise missing_study(label, name, names)
    return optuna.load_study(study_name=name, storage=storage)
