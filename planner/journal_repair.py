"""``planner repair JOURNAL``: drop the lines of a journal file that are not Optuna journal
entries, keeping every valid one in order (issue 20).

A killed writer leaves at most a torn last line, which the planner cuts before it appends
(:func:`planner.storage_journal.repair_tail`). A line damaged otherwise (an editor, a disk
error, another program writing into the file) stops every reader once an entry follows it:
Optuna raises on a bad line that is not the last. The repair keeps each line that parses as an
entry Optuna's journal replays (:func:`planner.journal_entry.is_journal_entry`: an ``op_code``
and the keys its operation reads), as Optuna wrote it, under the journal's lock, and writes the
result atomically after copying the file to ``JOURNAL.bak`` (``JOURNAL.bak.1`` and on where an
earlier repair's copy is there). Entries are never edited, only
dropped.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from planner.journal_entry import is_journal_entry
from planner.storage import JournalLock

__all__ = ["Repair", "repair_journal"]


@dataclass(frozen=True)
class Repair:
    kept: int
    """Valid entries, in their order."""
    dropped: list[int]
    """Line numbers (1-based) of the lines dropped."""
    backup: Path | None
    """The copy of the file as it was (None when nothing was dropped)."""


def _is_entry(line: bytes) -> bool:
    if not line.endswith(b"\n"):
        return False
    try:
        entry = json.loads(line)
    except ValueError:
        return False
    return is_journal_entry(entry)


def _free_backup(path: Path) -> Path:
    """``JOURNAL.bak``, else ``JOURNAL.bak.1``, ``.bak.2``, ...: an earlier repair's copy, the
    only one of the lines it dropped, is never replaced."""
    backup = path.with_name(path.name + ".bak")
    n = 0
    while backup.exists() or backup.is_symlink():
        n += 1
        backup = path.with_name(f"{path.name}.bak.{n}")
    return backup


def repair_journal(path: Path) -> Repair:
    """Drop the lines of ``path`` that are not journal entries; a ``.bak`` copy first."""
    lock = JournalLock(str(path))
    lock.acquire()
    try:
        lines = path.read_bytes().splitlines(keepends=True)
        keep = [line for line in lines if _is_entry(line)]
        dropped = [i for i, line in enumerate(lines, 1) if not _is_entry(line)]
        if not dropped:
            return Repair(len(keep), [], None)
        backup = _free_backup(path)
        shutil.copy2(path, backup)
        tmp = path.with_name(path.name + ".repair")
        with open(tmp, "wb") as f:
            f.writelines(keep)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return Repair(len(keep), dropped, backup)
    finally:
        lock.release()
