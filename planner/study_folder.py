"""Where one study lives: a folder of studies (one journal file each, the default), a journal
file shared by several studies, or a database URL.

A command that reads or writes one study opens only that study's storage, so it costs what
that study holds, not what the storage holds (issue 19: with every study in one journal, each
command replayed all of them). The folder is ``planner-results/studies/`` by default (or
``$PLANNER_STORAGE`` / ``--storage`` naming an existing folder, or a path ending in ``/``);
study ``NAME`` is the journal ``NAME.journal`` in it, with its lock and results table beside it
(``NAME.journal.NAME.lock``, ``NAME.journal.NAME.parquet``). A name that is not safe as a file
name gets a hash of itself appended. ``planner studies`` lists the folder and reads each
journal's summary from a cache that the journal's size and modification time keep valid
(:mod:`planner.study_summary`).

Before the folder, the default was the one journal ``planner-results/studies.journal``: where
that file exists and the folder does not, it stays the default, so stored studies are not lost.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from planner.errors import PlannerUsageError
from planner.storage_paths import DEFAULT_STORAGE, is_url, storage_label

if TYPE_CHECKING:
    import optuna

__all__ = ["folder_studies", "is_folder", "load_stored", "missing_study", "stored_names",
           "study_storage"]

_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,150}")
_FIRST_LINE = 64 * 1024
"""How much of a journal is read for the study's name (its first line, the study's creation)."""


def is_folder(label: str) -> bool:
    """The storage is a folder of studies: the default one, an existing folder, or a path that
    ends with a separator."""
    if is_url(label):
        return False
    if label.rstrip("/" + os.sep).endswith(".parquet") and Path(label).is_dir():
        # a study's results table (JOURNAL.NAME.parquet): a journal written into it broke it
        raise PlannerUsageError(f"--storage {label}: a study's results table, the folder"
                                " beside its journal; give the journal (the name before"
                                f" .{Path(label.rstrip('/' + os.sep)).name.split('.')[-2]}"
                                ".parquet) or another folder")
    return (label == str(DEFAULT_STORAGE) or label.endswith(("/", os.sep))
            or Path(label).is_dir())


def _file_stem(name: str) -> str:
    """A file name for the study: the name itself when it is safe, else a safe form of it and
    a hash (two names never share a file)."""
    if _SAFE.fullmatch(name) and name not in (".", ".."):
        return name
    safe = re.sub(r"[^A-Za-z0-9._+-]", "_", name)[:100].lstrip(".") or "study"
    return f"{safe}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"


def study_storage(label: str, name: str) -> str:
    """The storage that holds (or will hold) study ``name``: its own journal in a folder of
    studies, else ``label`` itself."""
    if not is_folder(label):
        return label
    return str(Path(label) / f"{_file_stem(name)}.journal")


def _journal_study_name(path: Path) -> str | None:
    """The study a journal of the folder holds: the name in its first line (Optuna writes the
    study's creation first); None for a file that is not such a journal."""
    try:
        with open(path, "rb") as f:
            first = f.readline(_FIRST_LINE)
    except OSError:
        return None
    try:
        op = json.loads(first)
    except ValueError:
        return None
    if not isinstance(op, dict) or op.get("op_code") != 0:
        return None
    name = op.get("study_name")
    return name if isinstance(name, str) else None


def folder_studies(label: str) -> dict[str, Path]:
    """The studies of a folder, by name, with their journals (sorted by name)."""
    folder = Path(label)
    if not folder.is_dir():
        return {}
    found = {}
    for path in folder.glob("*.journal"):
        name = _journal_study_name(path)
        if name is not None and path.name == f"{_file_stem(name)}.journal":
            found[name] = path
    return dict(sorted(found.items()))


def stored_names(arg: str | None) -> list[str]:
    """Every study in the storage the user meant (sorted)."""
    label = storage_label(arg)
    if is_folder(label):
        return list(folder_studies(label))
    from planner.storage import open_storage, study_names

    return sorted(study_names(open_storage(arg, create=False)))


SHOWN_NAMES = 8
"""Stored names a missing study's line lists before `planner studies` is the way to see all."""


def missing_study(label: str, name: str, names: list[str]) -> PlannerUsageError:
    """The one line for a study that is not stored: the names closest to it, else the first
    stored ones (a storage of hundreds printed every one)."""
    if not names:
        return PlannerUsageError(f"no study named {name!r} in {label}; none is stored yet")
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    if close:
        return PlannerUsageError(f"no study named {name!r} in {label}; did you mean"
                                 f" {' or '.join(close)}? (`planner studies` lists them all)")
    shown = sorted(names)[:SHOWN_NAMES]
    more = (f", and {len(names) - SHOWN_NAMES:,} more (`planner studies` lists them)"
            if len(names) > SHOWN_NAMES else "")
    return PlannerUsageError(f"no study named {name!r} in {label}; stored: {', '.join(shown)}"
                             f"{more}")


def load_stored(arg: str | None, name: str) -> optuna.Study:
    """Study ``name`` of the storage the user meant, opening only its own journal in a folder;
    a one-line error listing the stored names if there is none."""
    import optuna

    from planner.storage import load_existing, open_storage

    label = storage_label(arg)
    if not is_folder(label):
        return load_existing(open_storage(arg, create=False), name, label)
    studies = folder_studies(label)
    if name not in studies:
        if not Path(label).exists():
            raise PlannerUsageError(f"--storage {label}: no studies there yet; run `planner run"
                                    f" STUDY.yaml{_option(label)}` first, or give another"
                                    " --storage")
        raise missing_study(label, name, list(studies))
    storage = open_storage(str(studies[name]), create=False)
    return optuna.load_study(study_name=name, storage=storage)


def _option(label: str) -> str:
    from planner.storage_paths import storage_option

    return storage_option(label)
