"""Where the storage is, as names and paths only: the default folder of studies, the storage the
user meant, and how to print it. Apart from :mod:`planner.storage` so that commands that only
read a folder's cached rows (``planner studies``) import no Optuna."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

__all__ = ["DEFAULT_STORAGE", "LEGACY_STORAGE", "QUEUE_SUFFIX", "RESULTS_DIR", "WORK_QUEUE",
           "is_url", "shown", "storage_label", "storage_option"]

RESULTS_DIR = Path("planner-results")
DEFAULT_STORAGE = RESULTS_DIR / "studies"
"""A folder of studies, one journal each (:mod:`planner.study_folder`)."""
LEGACY_STORAGE = RESULTS_DIR / "studies.journal"
"""The default before the folder: one journal for every study. Where it exists and the folder
does not, it stays the default (its studies stay where the user finds them)."""
WORK_QUEUE = "work_queue"
"""User attribute of a study shared by workers: what its work queue holds (planner.runner)."""
QUEUE_SUFFIX = " (work queue)"
"""A work queue is the study of this name after the shared study's (a space: no user's name)."""
def storage_label(arg: str | None) -> str:
    """The storage the user meant: ``--storage``, else ``$PLANNER_STORAGE``, else the default
    (the folder of studies, or the one journal of earlier versions where only it exists)."""
    label = arg or os.environ.get("PLANNER_STORAGE")
    if label:
        return label
    if LEGACY_STORAGE.is_file() and not DEFAULT_STORAGE.exists():
        return str(LEGACY_STORAGE)
    return str(DEFAULT_STORAGE)


def storage_option(label: str) -> str:
    """`` --storage LABEL`` for a command the planner suggests, or "" for the default storage:
    a hint run as printed reads the storage the user gave (a URL without its password)."""
    if label == storage_label(None) and label in (str(DEFAULT_STORAGE), str(LEGACY_STORAGE)):
        return ""
    return f" --storage {shlex.quote(shown(label))}"


def is_url(label: str) -> bool:
    return "://" in label


def shown(label: str) -> str:
    """A storage as printed: a database URL without its password."""
    if not is_url(label):
        return label
    try:
        from sqlalchemy.engine import make_url

        return make_url(label).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy reads: its password hidden still
        return _USER_PASSWORD.sub(r"\1***@", label)


_USER_PASSWORD = re.compile(r"(://[^/:@]*:)[^@/]*@")
"""``user:password@`` in a URL SQLAlchemy cannot read (a port that is not a number)."""
