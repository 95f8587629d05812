"""A comparison: one study's question on several systems under several HBM limits.

A comparison YAML names a base study (the model, the training step, the space and the sampler)
and the systems and limits to ask it on::

    name: lab-llama70b-systems         # default: the file's name without .yaml
    description: Llama-70B, lab system 1 against lab system 2
    study: ../lab4b-llama70b-system1.yaml   # the base study, relative to this file
    systems: [lab-system1, lab-system2]     # catalog names or system YAML paths
    hbm_gb: [40, 80, unlimited]             # numbers (GB per device) or unlimited

Each (system, limit) cell is a study of its own in the storage, named
``<name>--<system>--hbm<X>gb`` (or ``--unlimited``): the base study with its system and limit
replaced, run by :func:`planner.runner.run_study` with the base study's sampler. A cell that is
already stored with the same fingerprint is resumed, so an exhaustive cell estimates only what
it does not hold yet and a second comparison run reads the stored trials. The space must have a
valid strategy on every system's device count (``dp: auto`` adapts to it).

The result is one row per cell (:data:`COLUMNS`): the cell's fastest feasible plan, every part
of its step time, its peak memory, MFU and tokens/s, how many distinct feasible plans the cell
holds, and the study's name; a cell without a feasible plan keeps its row with NaN figures.
With an exhaustive base a tighter limit is never faster than a looser one on the same system
(its feasible plans are a subset); a sampler's cells carry no such guarantee.

Every problem with the file is one line naming it, the field and the fix (PlannerUsageError).
"""

from __future__ import annotations

import math
import os
import re
import reprlib
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import joblib
import optuna
import pandas as pd
from optuna.trial import TrialState

from planner.catalog import Catalog, load_catalog
from planner.fields import fail, load, number
from planner.fields import fields as check_fields
from planner.runner import run_study
from planner.storage import study_names
from planner.study_config import StudyConfig, load_study_config
from planner.tables import best_frame
from simcore.estimate import TimeParts
from simcore.specs import SystemSpec

__all__ = ["Cell", "CellRun", "Comparison", "COLUMNS", "NO_PLAN", "TIME_PARTS", "cell_name",
           "cell_row", "check_stored", "limit_label", "load_comparison", "run_comparison"]

TIME_PARTS = tuple(f.name for f in fields(TimeParts))
"""The parts of a step time, as simcore splits it: compute, tp, sp, dp, pp, fsdp, bubble,
optimizer and comm (the ``stage`` convention's exposure as one figure)."""

COLUMNS = ["system", "devices", "device", "hbm_gb", "plan", "step_time_s",
           *(f"time_{p}_s" for p in TIME_PARTS), "peak_memory_gb", "mfu", "tokens_per_s",
           "feasible_plans", "trials", "study"]
NO_PLAN = "no feasible plan"

_REQUIRED = {"study", "systems", "hbm_gb"}
_OPTIONAL = {"name", "description"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_UNLIMITED = "unlimited"


def limit_label(hbm_gb: float | None) -> str:
    """``40 GB`` or ``unlimited``."""
    return _UNLIMITED if hbm_gb is None else f"{hbm_gb:g} GB"


@dataclass(frozen=True)
class Cell:
    """One system under one HBM limit: a study of its own."""

    system: SystemSpec
    hbm_gb: float | None
    """The HBM limit per device in GB; None is unlimited."""
    config: StudyConfig

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def label(self) -> str:
        return f"{self.system.name} / {limit_label(self.hbm_gb)}"


@dataclass(frozen=True)
class Comparison:
    """A checked comparison file: the base study and one cell per (system, limit)."""

    name: str
    path: Path
    study_path: Path
    systems: tuple[SystemSpec, ...]
    limits: tuple[float | None, ...]
    cells: tuple[Cell, ...]
    description: str = ""

    @property
    def model(self) -> str:
        return self.cells[0].config.model.name


# -- reading the file --------------------------------------------------------------------------
def _name(path: Path, raw: dict) -> str:
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not _NAME.match(name):
        raise fail(path, "name", f"must be letters, digits, '.', '_' or '-' (it names the study"
                   f" and output files), but got {name!r}")
    return name


def _study_path(path: Path, value: Any) -> Path:
    if not isinstance(value, str) or not value.strip():
        raise fail(path, "study", "must be the path of a study YAML, relative to this file")
    study = Path(value)
    if not study.is_absolute():
        study = Path(os.path.normpath(path.parent / study))
    if not study.is_file():
        what = ("is a folder" if study.is_dir() else "is not a regular file" if study.exists()
                else "does not exist")
        raise fail(path, "study", f"{study} {what}; give the base study YAML's path relative to"
                   " this file, e.g. ../lab4b-llama70b-system1.yaml")
    return study


def _items(path: Path, field: str, value: Any, example: str) -> list:
    if not isinstance(value, list) or not value:
        raise fail(path, field, f"must be a non-empty list, e.g. {example}")
    return value


def _system_ref(path: Path, ref: str, catalog: Catalog) -> str:
    """What load_study_config resolves to the same system: the catalog name, or an absolute
    YAML path (a relative one is relative to the comparison file)."""
    if catalog.has_system(ref) or Path(ref).is_absolute():
        return ref
    return str((path.parent / ref).resolve())


def _systems(path: Path, value: Any, catalog: Catalog) -> list[tuple[str, SystemSpec]]:
    out: list[tuple[str, SystemSpec]] = []
    for i, ref in enumerate(_items(path, "systems", value, "[lab-system1, lab-system2]")):
        field = f"systems[{i}]"
        if not isinstance(ref, str) or not ref.strip():
            raise fail(path, field, f"must be a system name (planner catalog systems) or a YAML"
                       f" path, but got {ref!r}")
        spec = catalog.system(ref, where=(path, field))
        if any(spec.name == s.name for _, s in out):
            raise fail(path, field, f"system {spec.name!r} is listed twice; list each once")
        out.append((_system_ref(path, ref, catalog), spec))
    return out


def _limit(path: Path, field: str, value: Any) -> float | None:
    if isinstance(value, str) and value.strip().lower() == _UNLIMITED:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value <= 0):
        raise fail(path, field, f"must be a number of GB > 0 or unlimited, but got"
                   f" {reprlib.repr(value)}")
    return number(path, field, value, minimum=0, strict=True)


def _limits(path: Path, value: Any) -> list[float | None]:
    out: list[float | None] = []
    for i, item in enumerate(_items(path, "hbm_gb", value, "[40, 80, unlimited]")):
        limit = _limit(path, f"hbm_gb[{i}]", item)
        # limits that print alike name one cell (cell_name: 140 and 140.0000001 are hbm140gb)
        same = [j for j, seen in enumerate(out) if limit_label(seen) == limit_label(limit)]
        if same and out[same[0]] == limit:
            raise fail(path, f"hbm_gb[{i}]", f"{limit_label(limit)} is listed twice; list each"
                       " limit once")
        if same:
            raise fail(path, f"hbm_gb[{i}]", f"{limit!r} and hbm_gb[{same[0]}]'s {out[same[0]]!r}"
                       f" both name the cell of {limit_label(limit)}; list each limit once")
        out.append(limit)
    return out


def cell_name(name: str, system: SystemSpec, hbm_gb: float | None) -> str:
    """``<name>--<system>--hbm<X>gb`` or ``<name>--<system>--unlimited``."""
    limit = _UNLIMITED if hbm_gb is None else f"hbm{hbm_gb:g}gb"
    return f"{name}--{system.name}--{limit}"


def _cell_config(study: Path, ref: str, system: SystemSpec, hbm_gb: float | None, name: str,
                 catalog: Catalog) -> StudyConfig:
    """The base study with its system and limit replaced, under the cell's own name."""
    config = load_study_config(study, hbm_gb=hbm_gb, system=ref, catalog=catalog)
    if hbm_gb is None and config.hbm_gb is not None:  # the base has a limit; this cell has none
        config = replace(config, hbm_gb=None, hbm_override=None, system=system,
                         space=replace(config.space, system=system))
    return replace(config, name=name)


def _check_space(path: Path, i: int, cell: Cell) -> None:
    space = cell.config.space
    if not space.valid:
        n = cell.system.devices
        raise fail(path, f"systems[{i}]", f"{cell.system.name} ({n} devices): the space of"
                   f" {cell.config.path} has no valid strategy there ({space.first_reason()});"
                   f" widen that study's space (dp: auto, tp / pp / sp lists whose products"
                   f" divide {n}) or drop the system")


def load_comparison(path: Path, *, catalog: Catalog | None = None) -> Comparison:
    """Read and check a comparison YAML and build every cell's study (nothing is run)."""
    catalog = catalog or load_catalog()
    raw = check_fields(path, "", load(path, "comparison YAML"), _REQUIRED, _OPTIONAL,
                       kind="comparison file")
    name = _name(path, raw)
    study = _study_path(path, raw["study"])
    systems = _systems(path, raw["systems"], catalog)
    limits = _limits(path, raw["hbm_gb"])
    cells = []
    for i, (ref, system) in enumerate(systems):
        for limit in limits:
            config = _cell_config(study, ref, system, limit, cell_name(name, system, limit),
                                  catalog)
            cell = Cell(system, limit, config)
            _check_space(path, i, cell)
            cells.append(cell)
    return Comparison(name=name, path=path, study_path=study,
                      systems=tuple(s for _, s in systems), limits=tuple(limits),
                      cells=tuple(cells), description=str(raw.get("description", "")))


# -- running it ----------------------------------------------------------------------------
def _cell_storage(label: str, cell: Cell, create: bool) -> tuple[optuna.storages.BaseStorage, str]:
    """The storage that holds the cell's study (its own journal in a folder of studies) and
    that storage's label."""
    from planner.storage import open_storage
    from planner.study_folder import study_storage

    where = study_storage(label, cell.name)
    return open_storage(where, create=create), where


def check_stored(comparison: Comparison, label: str) -> None:
    """Refuse, before anything runs, a stored cell study made from something else. A cell's
    journal that does not exist yet is not made here (a compare stopped in its first cell left
    an empty journal of every cell it never began)."""
    from planner.storage_paths import is_url
    from planner.study_folder import study_storage

    for cell in comparison.cells:
        if not is_url(label) and not Path(study_storage(label, cell.name)).exists():
            continue
        storage, _ = _cell_storage(label, cell, create=True)
        if cell.name not in set(study_names(storage)):
            continue
        study = optuna.load_study(study_name=cell.name, storage=storage)
        if study.user_attrs.get("fingerprint") != cell.config.fingerprint():
            raise fail(comparison.path, "name", f"the stored study {cell.name!r} in {label} was"
                       " made from a different base study, system or limit; set another name"
                       " or --storage")


def _feasible_counts(study: optuna.Study) -> tuple[int, int]:
    """Distinct feasible plans, and finished trials."""
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    feasible = {t.user_attrs.get("plan") for t in done if t.user_attrs.get("feasible")}
    return len(feasible), len(done)


def cell_row(cell: Cell, study: optuna.Study) -> dict[str, Any]:
    """The cell's table row: its fastest feasible plan (NaN figures if there is none)."""
    best = best_frame(study, 1)
    feasible, trials = _feasible_counts(study)
    hbm: Any = _UNLIMITED if cell.hbm_gb is None else (
        int(cell.hbm_gb) if cell.hbm_gb.is_integer() else cell.hbm_gb)
    row: dict[str, Any] = {"system": cell.system.name, "devices": cell.system.devices,
                           "device": cell.system.device.name, "hbm_gb": hbm}
    numbers = [c for c in COLUMNS if c.startswith("time_")
               or c in ("step_time_s", "peak_memory_gb", "mfu", "tokens_per_s")]
    if best.empty:
        row["plan"] = NO_PLAN
        row.update({c: math.nan for c in numbers})
    else:
        first = best.iloc[0]
        row["plan"] = first["plan"]
        row.update({c: float(first[c]) if c in best.columns else 0.0 for c in numbers})
    row.update(feasible_plans=feasible, trials=trials, study=cell.name)
    return row


@dataclass(frozen=True)
class CellRun:
    """What running one cell did."""

    cell: Cell
    added: int
    seconds: float


def _run_cell_in_worker(path: Path, index: int, label: str) -> int:
    """One sampler cell in a worker process (the file is re-read there); returns trials added."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cell = load_comparison(path).cells[index]
    storage, where = _cell_storage(label, cell, create=False)
    return run_study(cell.config, storage, where, resume=True, jobs=1, progress=False).added


def run_comparison(comparison: Comparison, label: str, *,
                   jobs: int = 1, progress: bool = True,
                   on_cell: Callable[[CellRun], None] | None = None) -> pd.DataFrame:
    """Run or resume every cell's study, then the table (one row per cell, :data:`COLUMNS`).

    An exhaustive base spends ``jobs`` worker processes on each cell's estimates in turn; a
    sampler's cells run side by side, one worker process each (the runner's sampler workers
    re-read a study file, which a cell's system and limit are not in).
    """
    check_stored(comparison, label)
    cells = comparison.cells
    exhaustive = cells[0].config.sampler == "exhaustive"
    if not exhaustive and jobs > 1 and len(cells) > 1:
        for cell in cells:  # every cell begins now: each worker opens its own
            _cell_storage(label, cell, create=True)
        start = time.perf_counter()
        added = joblib.Parallel(n_jobs=min(jobs, len(cells)))(
            joblib.delayed(_run_cell_in_worker)(comparison.path, i, label)
            for i in range(len(cells)))
        seconds = time.perf_counter() - start
        for cell, n in zip(cells, added):
            if on_cell:
                on_cell(CellRun(cell, n, seconds))
        studies = [optuna.load_study(study_name=c.name,
                                     storage=_cell_storage(label, c, create=False)[0])
                   for c in cells]
    else:
        studies = []
        for cell in cells:
            start = time.perf_counter()
            storage, where = _cell_storage(label, cell, create=True)
            report = run_study(cell.config, storage, where, resume=True, jobs=jobs,
                               progress=progress)
            studies.append(report.study)
            if on_cell:
                on_cell(CellRun(cell, report.added, time.perf_counter() - start))
            if report.late_stop and cell is not cells[-1]:
                # the Ctrl-C came as the cell's last trials finished: stop before the next
                raise KeyboardInterrupt
    rows = [cell_row(cell, study) for cell, study in zip(cells, studies)]
    return pd.DataFrame(rows, columns=COLUMNS)
