"""Where results are written: default paths, and writing whole or not at all.

Every file the planner writes goes through :func:`atomic_write` (a temporary file beside the
target, then a rename) or :func:`write_folders` (a temporary folder, then one rename per
folder), so Ctrl-C or a failing exporter never leaves a half-written file behind.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from planner.errors import PlannerUsageError

__all__ = ["RESULTS_DIR", "atomic_write", "check_targets", "counted", "default_path", "slug",
           "text_table", "write_files", "write_folders"]

RESULTS_DIR = Path("planner-results")
"""The folder of every default output (the storage's default journal too: planner.storage's
RESULTS_DIR, which is this; defined here so that writing a file does not import Optuna)."""


def slug(text: str) -> str:
    """A file-name-safe form of a plan label or study name."""
    keep = "".join(c if c.isalnum() or c in "-_.=" else "_" for c in text)
    return keep.strip("_") or "plan"


def counted(n: int, noun: str, plural: str = "s") -> str:
    """``n`` and the noun, singular for one: "1 row", "3 rows", "2 micro-batches"."""
    return f"{n:,} {noun}{'' if n == 1 else plural}"


def default_path(study: str, kind: str, suffix: str) -> Path:
    return RESULTS_DIR / f"{slug(study)}-{kind}.{suffix}"


def atomic_write(path: Path, data: str | bytes, suffixes: tuple[str, ...] = ()) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, then a rename.
    An unwritable folder is a one-line error, and so is an existing path it must not replace:
    a device, pipe or socket, or (``suffixes``: what the command writes, e.g. ``.html``) a file
    whose suffix names another kind, such as a runs CSV given to ``--out`` by mistake (a name
    without a suffix is the command's own, as its default format writes it), or a symbolic
    link (the rename would replace the link and leave its file as it was; the catalog's
    writes refuse one too, :func:`planner.catalog_write.check_writable`)."""
    folder = check_output(path, suffixes)
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".part")
    except OSError as e:
        raise PlannerUsageError(f"{path}: cannot write in {folder}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(tmp, new_file_mode())  # mkstemp makes 0600; give what open() would
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_output(path: Path, suffixes: tuple[str, ...] = ()) -> Path:
    """What :func:`atomic_write` refuses, said before any long work (nothing is written): its
    folder, which exists."""
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_symlink():
        raise PlannerUsageError(f"{path}: is a symbolic link (to {os.readlink(path)}); give the"
                                " file's own path")
    if path.is_dir():
        raise PlannerUsageError(f"{path}: is a folder; give a file path")
    refuse_special(path, "give a file path")
    if suffixes and path.suffix and path.is_file() and path.suffix.lower() not in suffixes:
        raise PlannerUsageError(f"{path}: exists and is not a {suffixes[0]} file, which this"
                                f" would replace; give a {suffixes[0]} path")
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "does not exist"
        raise PlannerUsageError(f"{path}: the folder {folder} {what}; create it or choose"
                                " another output path")
    return folder


def refuse_special(path: Path, fix: str) -> None:
    """A one-line error for an existing ``path`` that is no regular file to replace: a device,
    pipe or socket (``fix``: what to give instead)."""
    if path.exists() and not path.is_file():
        raise PlannerUsageError(f"{path}: is not a regular file (a device, pipe or socket);"
                                f" {fix}")


def new_file_mode() -> int:
    """The permissions ``open()`` gives a new file under the user's umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


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


def write_folders(root: Path, folders: Mapping[str, Mapping[str, str | bytes]], *,
                  force: bool = False) -> list[Path]:
    """Write ``{folder: {file: text or bytes}}`` under ``root`` (file names may hold
    sub-folders, ``traces/workload.0.et``); each folder appears whole or not at all. An
    existing folder of the same name is replaced where it holds only files this writes again
    (an earlier export of the same formats), or with ``force``; a file of that name, or a
    folder holding others (a user's results beside an earlier export), is refused before
    anything is written (:func:`check_targets`)."""
    _check_folder(root)
    check_targets(root, folders, force)
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


def check_targets(root: Path, folders: Mapping[str, Mapping[str, str | bytes]],
                  force: bool) -> None:
    """Refuse, before :func:`write_folders` writes anything, a folder it would replace that is
    a file, or that holds files it would not write again (only with ``force`` are they
    dropped)."""
    for name, files in folders.items():
        target = root / name
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            raise PlannerUsageError(f"{target}: is a file where this plan's folder goes; move it"
                                    " or choose another --out")
        if force or not target.is_dir():
            continue
        kept = sorted(str(p.relative_to(target)) for p in target.rglob("*")
                      if not p.is_dir() and str(p.relative_to(target)) not in files)
        if kept:
            more = f" and {len(kept) - 1} more" if len(kept) > 1 else ""
            raise PlannerUsageError(f"{target}: holds {kept[0]}{more}, which this export would"
                                    " delete (it replaces the folder whole); move them, choose"
                                    " another --out, or pass --force")


def _column_cells(values: list[object]) -> tuple[bool, list[str]] | None:
    """One column as pandas prints it: (numeric, its cells), or None when pandas' rules for it
    are not the simple ones reproduced here (floats beyond 1e6 or below 1e-6, NaN, bools,
    numbers mixed with text)."""
    if all(isinstance(v, str) for v in values):
        return False, [str(v) for v in values]
    if all(type(v) is int for v in values):
        return True, [f"{v:d}" for v in values]
    if all(type(v) is float for v in values):
        floats = [float(v) for v in values]  # type: ignore[arg-type]
        if any(math.isnan(x) or abs(x) > 1e6 or 0 < abs(x) < 1e-6 for x in floats):
            return None
        cells = [f"{x:.6f}" for x in floats]  # display.precision 6, then zeros trimmed alike
        while all(c.endswith("0") for c in cells):
            cells = [c[:-1] for c in cells]
        return True, [c + "0" if c.endswith(".") else c for c in cells]
    return None


def text_table(rows: Sequence[Mapping[str, object]]) -> str:
    """The rows as ``pandas.DataFrame(rows).to_string(index=False)`` prints them, without
    importing pandas (about 0.3 s) for the usual cells: text, whole numbers, and floats from
    1e-6 to 1e6; anything else is handed to pandas."""
    names = list(rows[0]) if rows else []
    columns: list[list[str]] = []
    for i, name in enumerate(names):
        values = [row.get(name) for row in rows]
        if any(list(row) != names for row in rows) or (found := _column_cells(values)) is None:
            import pandas as pd

            return str(pd.DataFrame(rows).to_string(index=False))
        numeric, cells = found
        header = f" {name}" if numeric else name
        width = max(len(header), *(len(c) for c in cells))
        columns.append([header.rjust(width), *(c.rjust(width) for c in cells)])
    if not columns:
        import pandas as pd

        return str(pd.DataFrame(rows).to_string(index=False))
    return "\n".join(" ".join(line) for line in zip(*columns, strict=True))
