"""One live writer per study on a local storage (issue 20 #1, #7).

Two ``planner run`` (``--resume`` or not) of one study at once would each estimate what the
study lacks and store it twice, and a resume fails the trials it finds RUNNING, even those of a
live run. So ``planner run`` holds, for its whole life, a kernel lock (``flock``) on a file
beside the storage, ``<journal>.<study>.lock``, with its pid written in it; a second run of the
study is refused at once, naming that pid. The kernel drops the lock when its holder dies
(SIGKILL included), so a resume after a kill proceeds, and then every RUNNING trial it finds is
really a dead process's. A database shared by machines (PostgreSQL) has no such file: its
workers coordinate through the work queue and heartbeats (``planner.run_queue``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import time
from collections.abc import Iterator

from optuna.storages import BaseStorage, RDBStorage

from planner.errors import PlannerUsageError
from planner.storage import BatchedJournalStorage

__all__ = ["StudyBusy", "lock_path", "study_writer"]

_PID_WAIT_S = 1.0
"""How long to wait for a holder that just took the lock to write its pid."""


class StudyBusy(PlannerUsageError):
    """Another live process is writing the study."""


def local_file(storage: BaseStorage) -> str | None:
    """The file a local storage lives in (a journal, a SQLite database), else None."""
    if isinstance(storage, BatchedJournalStorage):
        return storage.file_backend.path
    if isinstance(storage, RDBStorage) and storage.url.startswith("sqlite:///"):
        database = storage.url[len("sqlite:///"):]
        return database if database and database != ":memory:" else None
    return None


def lock_path(storage_file: str, study: str) -> str:
    """``<storage>.<study>.lock``; a study name that is not a plain file name is shortened and
    told apart by its hash."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", study)[:60]
    if safe != study:
        safe += "-" + hashlib.sha256(study.encode()).hexdigest()[:8]
    return f"{storage_file}.{safe}.lock"


@contextlib.contextmanager
def study_writer(storage: BaseStorage, study: str, label: str) -> Iterator[None]:
    """Hold the study's writer lock while the block runs; :class:`StudyBusy` if a live process
    holds it. No lock for a storage that is not a local file."""
    where = local_file(storage)
    if where is None:
        yield
        return
    path = lock_path(where, study)
    fd = _take(path, study, label)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while held: a process waiting on this file retries on a new one
        os.close(fd)


def _take(path: str, study: str, label: str) -> int:
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise StudyBusy(f"study {study!r} in {label} is being written by planner run"
                            f" ({holder}); wait for it to end, or stop it, then run again"
                            " (add --resume to continue it)") from None
        if _same_file(fd, path):
            break
        os.close(fd)  # its holder removed the file meanwhile: take the new one
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _same_file(fd: int, path: str) -> bool:
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)


def _holder(fd: int) -> str:
    """``pid N`` of the lock's holder (which writes it right after taking the lock)."""
    deadline = time.monotonic() + _PID_WAIT_S
    while True:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        if text.isdigit():
            return f"pid {text}"
        if time.monotonic() > deadline:
            return "pid unknown"
        time.sleep(0.05)
