"""Every plan of an exhaustive study as a row of a Parquet table beside the study, so a study of
any size streams its results in bounded memory while its Optuna study keeps only what Optuna's
users need (:data:`TRIALS_KEPT`).

The table is a Parquet dataset: the folder ``<storage file>.<study>.parquet`` (journal and
SQLite storages) of part files, one per chunk of plans, each written by a ``ParquetWriter`` as
one row group, first under a hidden name then renamed: a part is there whole or not at all, so
a run killed at any instant leaves a readable table (pandas, pyarrow and DuckDB read the folder
as one table). The columns are those of ``planner trials``; ``number`` is the plan's row in the
table (in the order written), ``state`` is ``COMPLETE``.

The study says it has one in its user attribute ``results``:
``{"parquet": path, "plans": N, "trials_kept": "all" | "front+best"}``, and for a study pruned
by bounds (``planner run --prune``, :mod:`planner.prune`) ``"prune": true``, ``"pruned"``
(plans never estimated, not in the table) and ``"seeds"``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from planner.errors import PlannerUsageError
from planner.storage import is_url

if TYPE_CHECKING:
    from optuna.storages import BaseStorage

__all__ = ["ALL", "BEST_KEPT", "FRONT_BEST", "RESULTS", "TRIALS_KEPT", "ResultsTable",
           "check_own_table", "check_table_name", "kept_numbers", "pareto_mask", "results_path",
           "table_path", "table_rows"]

RESULTS = "results"
"""Study user attribute: where the study's table is, how many plans, which are trials."""
ALL, FRONT_BEST = "all", "front+best"
TRIALS_KEPT = 20_000
"""Above this many valid plans, a study's Optuna trials are only the fronts and the best
:data:`BEST_KEPT`. Why 20,000: an Optuna trial costs ~19-27 KB of memory once loaded and its
journal is re-read from the first line on every batch written (issue 17: 96,096 trials took
1.8 GB and 79 CPU-s, 310,272 trials did not finish in 8 GB), so 20,000 trials stay near 0.4 GB
and ~15 s; every shipped study (13,176 plans at most) stays whole, as before."""
BEST_KEPT = 1_000
"""Feasible plans kept as trials by step time (beyond the fronts), for ``best --top``."""


def results_path(label: str, study: str) -> Path | None:
    """The table of a study in the storage ``label``: beside a journal or SQLite file; None
    for a server database (PostgreSQL: every plan is a trial there, as before)."""
    if is_url(label):
        if not label.startswith("sqlite:///"):
            return None
        label = label.removeprefix("sqlite:///")
    return Path(f"{label}{_suffix(study)}")


def check_own_table(storage: BaseStorage, study: str) -> None:
    """Refuse a study whose table (:func:`results_path`) another study of the storage already
    has: names that differ only in the characters a file name cannot hold (``big+1`` and
    ``big_1``) shared one table, each then showing the other's plans."""
    mine = _suffix(study)
    for other in storage.get_all_studies():
        if other.study_name != study and _suffix(other.study_name) == mine:
            raise PlannerUsageError(f"study {study!r}: its results table would be the one of"
                                    f" stored study {other.study_name!r} (file names hold only"
                                    " letters, digits, '.', '_' and '-'); choose another name")


NAME_MAX = 255
"""The bytes of a file name on Linux's file systems (ext4, xfs, tmpfs: NAME_MAX)."""


def check_table_name(label: str, study: str) -> None:
    """Refuse, before the study is made, a name whose table's file name (the storage file's
    name, then the study's: ``NAME.journal.NAME.parquet`` in a folder of studies) would be
    longer than a file name holds: the run failed with "File name too long" and left the study
    behind, empty."""
    path = results_path(label, study)
    if path is not None and len(path.name.encode()) > NAME_MAX:
        raise PlannerUsageError(f"study {study[:40]!r}...: its results table's file name would"
                                f" be {len(path.name.encode())} bytes, over the {NAME_MAX} a file"
                                " name holds; shorten the study's name")


def _suffix(study: str) -> str:
    """What a study's table adds to its storage file's name."""
    return f".{re.sub(r'[^A-Za-z0-9._-]', '_', study)}.parquet"


class ResultsTable:
    """The Parquet dataset of one study's plans: appended a part at a time, read as a whole."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _parts(self) -> list[Path]:
        if not self.path.is_dir():
            return []
        return sorted(p for p in self.path.glob("part-*.parquet"))

    def rows(self) -> int:
        """Rows written so far (from the parts' footers, reading no data)."""
        return sum(pq.ParquetFile(p).metadata.num_rows for p in self._parts())

    def plans(self) -> set[str]:
        """The plans written so far (only the ``plan`` column is read)."""
        parts = self._parts()
        if not parts:
            return set()
        return set(pq.read_table(parts, columns=["plan"]).column("plan").to_pylist())

    def append(self, frame: pd.DataFrame) -> None:
        """``frame`` as the next part, one row group; numbered on from the rows written."""
        if frame.empty:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        for stale in self.path.glob(".part-*"):  # left by a run killed while writing
            stale.unlink()
        parts = self._parts()
        start = self.rows()
        index = int(parts[-1].stem.removeprefix("part-")) + 1 if parts else 0
        frame = frame.assign(number=np.arange(start, start + len(frame)), state="COMPLETE")
        if "model_flops" in frame and frame["model_flops"].dtype == object:
            # a step's FLOPs are exact Python integers, past int64 on the largest runs
            # (Llama-3-405B on 16,384 GPUs: 4e19): the table keeps them as float64
            frame["model_flops"] = frame["model_flops"].astype(np.float64)
        table = pa.Table.from_pandas(frame[["number", "state", *frame.columns[:-2]]],
                                     preserve_index=False)
        final = self.path / f"part-{index:06d}.parquet"
        hidden = self.path / f".{final.name}.tmp"
        with pq.ParquetWriter(hidden, table.schema) as writer:
            writer.write_table(table, row_group_size=len(table))
        os.replace(hidden, final)

    def read(self, columns: list[str] | None = None, numbers: Any = None) -> pd.DataFrame:
        """The table (or some columns; only the rows of ``numbers``), in row order."""
        parts = self._parts()
        if not parts:
            return pd.DataFrame(columns=columns or [])
        dataset = ds.dataset([str(p) for p in parts], format="parquet")
        where = None if numbers is None else ds.field("number").isin(list(numbers))
        df = dataset.to_table(columns=columns, filter=where).to_pandas()
        return df.sort_values("number").reset_index(drop=True) if "number" in df else df


def table_path(study: Any) -> Path | None:
    """Where a study's results table is (None: its ``results`` attribute names none): beside
    the journal or SQLite file the study was opened from, where ``planner run`` writes it
    (:func:`results_path`), so a storage folder moved or copied whole reads its own table; the
    path the attribute stored (where the table was first written) for a storage that does not
    say where it is, or that is the same file spelled otherwise. A table found only at the
    stored path, not beside the storage (the journal moved without it), is refused in one line
    naming both."""
    results = study.user_attrs.get(RESULTS) or {}
    stored = results.get("parquet")
    if not stored:
        return None
    label = _storage_file(getattr(study, "_storage", None))
    here = results_path(label, study.study_name) if label else None
    if here is None:
        return Path(stored)
    if here.exists() or not Path(stored).is_dir():
        return here
    if _same_file(_storage_of(stored, study.study_name), _storage_of(str(here), study.study_name)):
        return Path(stored)  # one storage spelled two ways (a SQLite URL's ?timeout=)
    raise PlannerUsageError(
        f"{label}: study {study.study_name!r} keeps its plans in a results table beside"
        f" its storage, {here}, which is missing; it is at {stored} (the storage was moved"
        " without it?): move that folder beside the storage")


def _storage_of(table: str, study: str) -> str:
    """The storage file a table path was made from (:func:`results_path`), its query dropped."""
    return table.removesuffix(_suffix(study)).split("?", 1)[0]


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _storage_file(storage: Any) -> str | None:
    """The journal path or ``sqlite:///`` URL of an opened storage; None for a server."""
    backend = getattr(storage, "file_backend", None)  # planner.storage_journal's journal
    if backend is not None:
        return str(backend.path)
    url = getattr(getattr(storage, "_backend", storage), "url", None)  # RDB (Optuna caches it)
    return url if isinstance(url, str) and url.startswith("sqlite:///") else None


def table_rows(study: Any) -> int | None:
    """Rows in a study's results table (its plans estimated so far); None when it has none
    or the table is gone."""
    path = table_path(study)
    if path is None or not path.is_dir():
        return None
    return ResultsTable(path).rows()


def pareto_mask(step: np.ndarray, memory: np.ndarray) -> np.ndarray:
    """Which points no other point dominates in (step time, memory), both minimised (a point
    equal to a front point is on it too, as in Optuna's ``best_trials``)."""
    if len(step) == 0:
        return np.zeros(0, bool)
    pairs, inverse = np.unique(np.stack([step, memory], axis=1), axis=0, return_inverse=True)
    # pairs are sorted by step, then memory: a pair is dominated by an earlier one with less
    # or equal memory (distinct pairs: the earlier is better in one figure at least)
    earlier = np.minimum.accumulate(np.concatenate([[np.inf], pairs[:-1, 1]]))
    return (pairs[:, 1] < earlier)[inverse.ravel()]


def kept_numbers(df: pd.DataFrame, best: int = BEST_KEPT) -> np.ndarray:
    """The rows of a big study kept as Optuna trials: the Pareto front in (step time, peak
    memory) of every plan, that of the HBM-feasible plans, and the ``best`` feasible plans by
    step time. ``df``: columns number, step_time_s, peak_memory_gb, feasible."""
    step = df["step_time_s"].to_numpy()
    memory = df["peak_memory_gb"].to_numpy()
    feasible = df["feasible"].to_numpy(bool)
    keep = pareto_mask(step, memory)
    rows = np.flatnonzero(feasible)
    keep[rows[pareto_mask(step[rows], memory[rows])]] = True
    fastest = np.lexsort((df["number"].to_numpy()[rows], memory[rows], step[rows]))[:best]
    keep[rows[fastest]] = True
    return np.sort(df["number"].to_numpy()[keep])
