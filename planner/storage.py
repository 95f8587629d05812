"""Where studies live: an embedded journal file by default, or any Optuna RDB URL.

The default is ``planner-results/studies.journal`` in the working directory (or
``$PLANNER_STORAGE``), beside the tables and plots the planner writes to ``planner-results/``.
Optuna's JournalStorage appends one line per change and survives a killed process (a torn last
line is ignored); on this machine it records trials several times faster than SQLite
(``benchmarks/bench_storage.py``). ``--storage`` takes a journal path or a URL such as
``sqlite:///studies.db`` or ``postgresql://user@host/db``, used unchanged.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import (
    BaseJournalBackend,
    JournalFileBackend,
    JournalFileSymlinkLock,
)

from planner.errors import PlannerUsageError

__all__ = [
    "DEFAULT_STORAGE",
    "RESULTS_DIR",
    "BatchedJournalFileBackend",
    "batched",
    "open_storage",
    "storage_label",
    "study_names",
]

RESULTS_DIR = Path("planner-results")
DEFAULT_STORAGE = RESULTS_DIR / "studies.journal"


def storage_label(arg: str | None) -> str:
    """The storage the user meant: ``--storage``, else ``$PLANNER_STORAGE``, else the default."""
    return arg or os.environ.get("PLANNER_STORAGE") or str(DEFAULT_STORAGE)


def is_url(label: str) -> bool:
    return "://" in label


def open_storage(arg: str | None, *, create: bool) -> BaseStorage:
    """Open the storage; ``create=False`` refuses a journal file that does not exist yet."""
    label = storage_label(arg)
    if is_url(label):
        try:
            return RDBStorage(label)
        except (ImportError, ModuleNotFoundError) as e:
            raise PlannerUsageError(f"--storage {label}: the database driver is missing ({e});"
                                    " install it, e.g. pip install psycopg2-binary") from None
        except Exception as e:  # noqa: BLE001 - SQLAlchemy's errors for a bad URL are many
            raise PlannerUsageError(f"--storage {label}: cannot open the database:"
                                    f" {type(e).__name__}: {str(e).splitlines()[0]}") from None
    path = Path(label)
    if not create and not path.exists():
        raise PlannerUsageError(f"--storage {label}: no studies there yet; run `planner run"
                                " STUDY.yaml` first, or give --storage")
    if path.is_dir():
        raise PlannerUsageError(f"--storage {label}: is a directory; give a file path such as"
                                f" {path / 'studies.journal'}")
    path.parent.mkdir(parents=True, exist_ok=True)
    return BatchedJournalStorage(BatchedJournalFileBackend(str(path)))


class BatchedJournalStorage(JournalStorage):
    """A JournalStorage that keeps its batched file backend at hand for :func:`batched`."""

    def __init__(self, backend: BatchedJournalFileBackend) -> None:
        super().__init__(backend)
        self.file_backend = backend


class BatchedJournalFileBackend(BaseJournalBackend):
    """Optuna's journal file, with batches: inside :meth:`batch` the file lock is held once and
    the appended log lines are written (and fsync-ed) together when the batch ends.

    Outside a batch it is exactly ``JournalFileBackend``. Recording the exhaustive path's trials
    with ``Study.add_trials`` takes one lock, write and fsync per trial otherwise, about 1.2 ms
    each here: 14 s for 12,000 trials, against 1.3 s batched (``benchmarks/bench_storage.py``).
    While the lock is held no other process appends, so the file's lines are numbered
    ``0 .. F-1`` and the buffered ones ``F ..``; a process killed mid-batch loses only that
    batch, never a line of the file (Optuna releases a stale lock after its grace period).
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = JournalFileSymlinkLock(path)
        self._file = JournalFileBackend(path, lock_obj=self._lock)
        self._buffer: list[dict[str, Any]] | None = None
        self._file_lines: int | None = None

    def read_logs(self, log_number_from: int) -> Iterable[dict[str, Any]]:
        if self._buffer is None:
            return self._file.read_logs(log_number_from)
        if self._file_lines is None or log_number_from < self._file_lines:
            logs = list(self._file.read_logs(log_number_from))
            self._file_lines = log_number_from + len(logs)
            return logs + self._buffer
        return self._buffer[log_number_from - self._file_lines:]

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        if self._buffer is None:
            self._file.append_logs(logs)
        else:
            self._buffer.extend(logs)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        while not self._lock.acquire():
            time.sleep(0.001)
        self._buffer, self._file_lines = [], None
        try:
            yield
            self._flush()
        finally:
            self._buffer, self._file_lines = None, None
            self._lock.release()

    def _flush(self) -> None:
        if not self._buffer:
            return
        text = "\n".join(json.dumps(log, separators=(",", ":")) for log in self._buffer) + "\n"
        with open(self._path, "ab") as f:
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())


def batched(storage: BaseStorage | None) -> contextlib.AbstractContextManager[None]:
    """One batch of writes on a batched journal file; any other storage writes as it goes."""
    if isinstance(storage, BatchedJournalStorage):
        return storage.file_backend.batch()
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
