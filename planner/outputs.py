"""Where results are written: default paths, and writing whole or not at all.

Every file the planner writes goes through :func:`atomic_write` (a temporary file beside the
target, then a rename) or :func:`write_folders` (a temporary folder, then one rename per
folder), so Ctrl-C or a failing exporter never leaves a half-written file behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from planner.errors import PlannerUsageError
from planner.storage import RESULTS_DIR

__all__ = ["RESULTS_DIR", "atomic_write", "default_path", "slug", "write_files", "write_folders"]



def slug(text: str) -> str:
    """A file-name-safe form of a plan label or study name."""
    keep = "".join(c if c.isalnum() or c in "-_.=" else "_" for c in text)
    return keep.strip("_") or "plan"


def default_path(study: str, kind: str, suffix: str) -> Path:
    return RESULTS_DIR / f"{slug(study)}-{kind}.{suffix}"


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, then a rename.
    An unwritable folder is a one-line error."""
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise PlannerUsageError(f"{path}: the folder {folder} does not exist; create it or"
                                " choose another output path")
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".part")
    except OSError as e:
        raise PlannerUsageError(f"{path}: cannot write in {folder}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give what open() would
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _check_folder(folder: Path) -> None:
    if folder.exists() and not folder.is_dir():
        raise PlannerUsageError(f"{folder}: exists and is not a folder; choose another --out")


def write_files(folder: Path, files: Mapping[str, str | bytes]) -> list[Path]:
    """Write ``{file: text or bytes}`` under ``folder`` (names may hold sub-folders); the paths
    written. Not atomic: :func:`write_folders` wraps it for that."""
    written = []
    for file, data in files.items():
        path = folder / file
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data)
        written.append(path)
    return written


def write_folders(root: Path, folders: Mapping[str, Mapping[str, str | bytes]]) -> list[Path]:
    """Write ``{folder: {file: text or bytes}}`` under ``root`` (file names may hold
    sub-folders, ``traces/workload.0.et``); each folder appears whole (an existing one of the
    same name is replaced) or not at all."""
    _check_folder(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=root, prefix=".export-"))
    except OSError as e:
        raise PlannerUsageError(f"{root}: cannot write there: {e.strerror}; choose another"
                                " --out") from None
    written = []
    try:
        for name, files in folders.items():
            folder = staging / name
            folder.mkdir()
            write_files(folder, files)
        for name in folders:
            target = root / name
            if target.is_dir():
                shutil.rmtree(target)
            os.replace(staging / name, target)
            written.append(target)
    except OSError as e:
        raise PlannerUsageError(f"{root}: cannot write there: {e.strerror}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return written
