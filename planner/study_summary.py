"""``planner studies``: one row per stored study, from a cache in a folder of studies.

A row needs the study's trials (their count and the best plan), and reading a journal costs
what it holds. In a folder of studies (:mod:`planner.study_folder`) each journal's row is kept in
``.summaries.json`` beside them with the journal's size and modification time: a journal that
has not changed since is not read again, one that has is read and its row replaced. The cache is
only a shortcut: deleting it, or a folder where it cannot be written, costs time, not rows.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.errors import PlannerUsageError
from planner.outputs import atomic_write, counted

if TYPE_CHECKING:  # imported where a journal is read: cached rows need neither
    import optuna
    import pandas as pd

__all__ = ["CACHE", "folder_rows", "remember", "study_row"]

CACHE = ".summaries.json"
_VERSION = 2
"""Bumped when a row's columns change: an older cache is read as empty (2: ``finished``)."""


def study_row(study: optuna.Study, best: pd.DataFrame | None = None) -> dict[str, Any]:
    """The study's row: what it was made from, its trials and plans, its best step time
    (``best``: its :func:`planner.tables.best_frame`, when the caller has it)."""
    from planner.results_parquet import RESULTS
    from planner.tables import best_frame

    attrs = study.user_attrs
    trials = len(study.get_trials(deepcopy=False))
    if not {"config", "specs"} & set(attrs):  # another Optuna program's study
        return {"study": study.study_name, "model": "(not planner's)", "system": "-",
                "sampler": "-", "hbm_gb": "-", "trials": trials, "plans": "-",
                "trials kept": "-", "finished": "-", "best step s": "-"}
    cfg = attrs.get("config", {})
    best = best_frame(study, 1) if best is None else best
    results = attrs.get(RESULTS) or {}  # beyond TRIALS_KEPT plans the rest are in its table
    return {"study": study.study_name, "model": cfg.get("model", "?"),
            "system": cfg.get("system", "?"), "sampler": cfg.get("sampler", "?"),
            "hbm_gb": cfg.get("hbm_gb") or "unlimited", "trials": trials,
            "plans": results.get("plans", trials),
            "trials kept": _kept(results),
            "finished": "yes" if unfinished_note(study) is None else "no",
            "best step s": (f"{best['step_time_s'].iloc[0]:.4g}" if not best.empty else "-")}


def unfinished_note(study: optuna.Study, storage: str = "") -> str | None:
    """A warning for a study with fewer plans estimated than its space holds: a run stopped
    before its end (Ctrl-C, a crash), so its best is the best of the plans estimated so far.
    Estimated: its finished trials when every plan becomes a trial (``trials kept: all``), else
    its results table's rows and the plans its bounds ruled out; a study of an Optuna sampler is
    unfinished with fewer finished trials than its ``n_trials``. None when it is whole or when
    its table is gone. ``storage``: the ``--storage`` option its command carries ("" for the
    default storage, :func:`planner.storage_paths.storage_option`)."""
    from planner.results_parquet import RESULTS

    results = study.user_attrs.get(RESULTS) or {}
    plans = results.get("plans")
    if not plans:
        return _unfinished_sampling(study, storage)
    done = _estimated(study, results)
    if done is None or done >= plans:
        return None
    return (f"warning: study {study.study_name!r} is unfinished: {done:,} of its"
            f" {counted(plans, 'plan')} estimated, so its best is the best of those;"
            f" {_finishes(study, storage)}")


_CELL = re.compile(r".+--.+--(hbm[^-]+gb|unlimited)$")
"""A comparison cell's study name (:func:`planner.compare.cell_name`)."""


def _finishes(study: optuna.Study, storage: str) -> str:
    """The command that finishes an unfinished study: a comparison cell's is its comparison,
    run again (there is no study YAML of the cell to resume)."""
    if _CELL.match(study.study_name):
        return f"`planner compare COMPARISON.yaml{storage}` runs it to the end with its other cells"
    return f"`planner run STUDY.yaml --resume{storage}` finishes it"


SAMPLED = ("tpe", "nsga2", "gp")
"""The samplers whose study runs ``n_trials`` Optuna trials (``random`` draws its plans and
records them as the exhaustive path does)."""


def _unfinished_sampling(study: optuna.Study, storage: str) -> str | None:
    """The warning for a study of an Optuna sampler (tpe, nsga2, gp) that finished fewer trials
    than its ``n_trials``: ``planner run --resume`` runs the rest (:func:`planner.runner`)."""
    from optuna.trial import TrialState

    config = study.user_attrs.get("config") or {}
    wanted = config.get("n_trials")
    if config.get("sampler") not in SAMPLED or not isinstance(wanted, int):
        return None
    done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    if done >= wanted:
        return None
    return (f"warning: study {study.study_name!r} is unfinished: {done:,} of its {wanted:,}"
            f" {config['sampler']} trials finished, so its best is the best of those;"
            f" {_finishes(study, storage)}")


def _estimated(study: optuna.Study, results: dict[str, Any]) -> int | None:
    """The plans a study has estimated (or ruled out by bounds) so far; None if unknown."""
    from optuna.trial import TrialState

    from planner.results_parquet import ALL, table_rows

    if results.get("trials_kept", ALL) == ALL and not results.get("prune"):
        return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    rows = table_rows(study)
    return None if rows is None else rows + int(results.get("pruned", 0))


def _kept(results: dict[str, Any]) -> str:
    """Which plans are trials, and how many were pruned by bounds (``planner run --prune``)."""
    kept = str(results.get("trials_kept", "all"))  # results_parquet.ALL (pandas-free here)
    return f"{kept}, {results.get('pruned', 0):,} pruned" if results.get("prune") else kept


def _stamp(path: Path) -> list[int]:
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns]


def _read_cache(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / CACHE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != _VERSION:
        return {}
    rows = data.get("journals")
    return rows if isinstance(rows, dict) else {}


def _write_cache(folder: Path, journals: dict[str, Any]) -> None:
    try:
        atomic_write(folder / CACHE, json.dumps({"version": _VERSION, "journals": journals}))
    except (OSError, PlannerUsageError):
        pass  # a read-only folder: the rows are right, the next call reads again


def remember(journal: Path, study: optuna.Study, best: pd.DataFrame | None = None) -> None:
    """Put the study's row in its folder's cache, stamped with its journal as it is now: what
    ``planner run`` does at its end, with the study in hand, so that the next ``planner
    studies`` need not read the journal again."""
    stamp = _stamp(journal)  # before the row: a write after it makes the stamp stale, not the row
    row = study_row(study, best)
    journals = _read_cache(journal.parent)
    journals[journal.name] = {"stamp": stamp, "row": row}
    _write_cache(journal.parent, journals)


def folder_rows(studies: dict[str, Path], problems: list[str] | None = None
                ) -> list[dict[str, Any]]:
    """The rows of a folder's studies (name -> journal), read from the cache where the journal
    is unchanged; the cache is rewritten when any row was read anew. A study that cannot be
    read (a damaged journal) has no row: its one-line error goes to ``problems`` (raised if
    that is None), and the other studies are still listed."""
    if not studies:
        return []
    from planner.errors import PlannerUsageError

    folder = next(iter(studies.values())).parent
    cached = _read_cache(folder)
    fresh: dict[str, Any] = {}
    rows = []
    for name, path in studies.items():
        stamp = _stamp(path)
        hit = cached.get(path.name)
        if isinstance(hit, dict) and hit.get("stamp") == stamp and "row" in hit:
            row = hit["row"]
        else:
            try:
                row = _fresh_row(name, path)
            except PlannerUsageError as e:
                if problems is None:
                    raise
                problems.append(f"study {name!r}: {e}")
                continue
        fresh[path.name] = {"stamp": stamp, "row": row}
        rows.append(row)
    if fresh != cached:
        _write_cache(folder, fresh)
    return rows


def _fresh_row(name: str, path: Path) -> dict[str, Any]:
    import optuna

    from planner.storage import open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(str(path), create=False)
    return study_row(optuna.load_study(study_name=name, storage=storage))
