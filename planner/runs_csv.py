"""A CSV of measured training runs, read into specs: what ``planner validate`` and ``planner
calibrate`` take.

The columns and what each means: :mod:`planner.runs_columns`.

``model`` may name one entry of a YAML file of several as ``FILE.yaml#NAME``.

A row that cannot be read or estimated is kept with its reason (:class:`SkippedRun`), never an
error: one bad row does not hide the others. A missing column or an unreadable file is a
:class:`PlannerUsageError` naming the file and the fix.
"""

from __future__ import annotations

import csv
import difflib
import io
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from planner.catalog import Catalog
from planner.errors import PlannerUsageError
from planner.inputs import read_text
from planner.runs_columns import AGREE, ALIASES, MEASURED, OPTIONAL, PLAN, REQUIRED
from planner.runs_mixed import largest_part, mixed_plan
from planner.runs_row import (
    SHORTEST_STEP_S,
    SMALLEST_PEAK_GB,
    BadValue,
    RowError,
    allocated,
    as_run_by,
    integer,
    measured,
    memory_stage,
    out_of_memory,
    positive,
    row_framework,
    row_strategy,
    row_training,
)
from planner.units import GB
from simcore.mixed import MixedPlan, MixedSystemSpec
from simcore.specs import DeviceSpec, ModelSpec, Strategy, SystemSpec, TrainingSpec

__all__ = ["MeasuredRun", "SkippedRun", "read_runs", "read_runs_files"]

MAX_ROWS = 100_000
"""More measured runs than any team has; a larger file is refused before it is read."""

GroupKey = tuple[str, str, int, int, str]
"""(model, system, global batch, sequence length, release): the runs of one plan-choice
question (:attr:`MeasuredRun.group`)."""


@dataclass(frozen=True, slots=True)
class MeasuredRun:
    """One measured run: the plan as specs and what was measured."""

    line: int
    """The CSV line (the header is line 1)."""
    name: str
    model_ref: str
    system_ref: str
    model: ModelSpec
    system: SystemSpec | MixedSystemSpec
    """A system of node groups where the run was on a mixed cluster (:attr:`mixed`)."""
    training: TrainingSpec
    strategy: Strategy | None
    """The plan; None for a run on a mixed cluster, whose plan is :attr:`mixed`."""
    step_time_s: float | None
    peak_memory_gb: float | None
    memory_allocated: bool = False
    """``peak_memory_gb`` is PyTorch's allocated peak, not the device's use
    (``memory_measured``)."""
    memory_stage: str = "peak"
    """The pipeline stage ``peak_memory_gb`` is of: ``peak`` (the estimate's highest), ``first``
    or ``last`` (``memory_stage``)."""
    file: str = ""
    """The CSV the run is in, as given on the command line."""
    release: str = ""
    """The software release (or stack) the run was measured on (``release``; empty: one for
    every run): plans measured on different releases are not compared for plan choice, as a
    release alone moves a step time by several percent."""
    framework: str = ""
    """The framework the run was read as (``framework``; empty: none named, the device's and
    model's defaults)."""
    out_of_memory: bool = False
    """The plan was tried and ran out of memory (``out_of_memory``): no step time, no peak; what
    it checks is the estimate's verdict that the plan fits."""
    mixed: MixedPlan | None = None
    """The plan of a run on a cluster that mixes device types (``stages``), on :attr:`system`."""
    model_id: str = ""
    """What :attr:`model_ref` names, whoever wrote it: a catalog name, or a YAML file's
    resolved path and entry (``models.yaml#m`` beside two CSVs in two folders are two models;
    ``./models.yaml#m`` and ``models.yaml#m`` beside one are one). Empty: the ref itself."""
    system_id: str = ""
    """The same for :attr:`system_ref`."""

    @property
    def plan(self) -> Strategy | MixedPlan:
        """The plan, on one device type or on a mixed cluster."""
        return self.mixed if self.mixed is not None else self.strategy  # type: ignore[return-value]

    @property
    def device(self) -> DeviceSpec | None:
        """The run's device; None on a mixed cluster."""
        return self.system.device if isinstance(self.system, SystemSpec) else None

    @property
    def group(self) -> GroupKey:
        """Runs of one model on one system at one batch and sequence length, measured on one
        release: the plans a study of that question would choose between (the model and system
        as what they name: :attr:`model_id`, :attr:`system_id`)."""
        return (self.model_id or self.model_ref, self.system_id or self.system_ref,
                self.training.global_batch, self.training.seq_len, self.release)

    @property
    def group_label(self) -> GroupKey:
        """:attr:`group` as the CSV writes its model and system."""
        return (self.model_ref, self.system_ref, self.training.global_batch,
                self.training.seq_len, self.release)


@dataclass(frozen=True, slots=True)
class SkippedRun:
    line: int
    name: str
    reason: str
    bad_value: bool = False
    """A cell is not a valid value (a typo to fix), not a plan the planner cannot express."""
    file: str = ""
    """The CSV the row is in, as given on the command line."""

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.file else f"line {self.line}"


def ref_id(ref: str, path: Path) -> str:
    """What a ``model`` or ``system`` cell of the CSV at ``path`` names: a catalog name as
    written; a YAML path (``FILE.yaml`` or ``FILE.yaml#NAME``, relative to the CSV's folder) as
    the file's resolved path and the entry, so that one file reached two ways is one, and two
    files of one name in two folders are two (as :meth:`planner.catalog.Catalog._find` reads
    it)."""
    file, hash_, entry = ref.partition("#")
    where = Path(file)
    if where.suffix not in (".yaml", ".yml"):
        return ref
    if not where.is_absolute():
        where = path.parent / where
    return f"{where.resolve()}{hash_}{entry}"


def _spec(find: Callable[[str], object], ref: str, kind: str, path: Path) -> object:
    if not ref:
        raise BadValue(f"{kind} is empty; give a catalog name or a YAML path")
    try:
        return find(ref)
    except PlannerUsageError as e:  # the row's place is said beside it: the file once
        raise BadValue(str(e).removeprefix(f"{path}: ")) from None


def _rows(path: Path) -> tuple[list[str], list[tuple[int, dict[str, str], int]]]:
    """The header and each non-blank row: its line, {column: cell} and how many filled cells
    it has past the last column (an unquoted comma shifted them there)."""
    text = read_text(path, "CSV of measured runs", encoding="utf-8-sig")
    # universal newlines: a file saved with CR alone (classic Mac) ends its lines too
    reader = csv.reader(io.StringIO(text, newline=None))
    unclosed = text.count('"') % 2 and _ends_in_a_quote(text)  # said after the rows
    try:
        header = _canonical(path, [h.strip().lower() for h in next(reader, [])])
        rows = []
        line = begun = reader.line_num + 1  # the line the next record starts on
        for record in reader:
            line, begun = begun, reader.line_num + 1
            if not any(cell.strip() for cell in record):
                continue
            if len(rows) >= MAX_ROWS:
                raise PlannerUsageError(f"{path}: more than {MAX_ROWS:,} runs; split the file")
            spilled = sum(1 for v in record[len(header):] if v.strip())
            if not unclosed:
                _no_rows_inside(path, line, header, record, spilled > 0)
            cells = {k: v.strip() for k, v in zip(header, record) if k}
            unnamed = [i + 1 for i, (k, v) in enumerate(zip(header, record)) if not k and v.strip()]
            if unnamed:  # a header shifted by a column, or a column left unnamed
                cells[""] = str(unnamed[0])
            rows.append((line, cells, spilled))  # where the record starts
    except csv.Error as e:
        raise PlannerUsageError(f"{path}: line {reader.line_num}: not valid CSV: {e}") from None
    if unclosed:  # read as one cell to the end
        raise PlannerUsageError(f"{path}: line {line}: a quote opened in this row is never"
                                " closed (the file ends inside a quoted cell); close it or"
                                " remove it")
    return header, rows


def _no_rows_inside(path: Path, line: int, header: list[str], record: list[str],
                    spilled: bool) -> None:
    """Refuse a cell that runs over lines that read as rows (as many cells as the header, but
    two), or whose row then ``spilled`` filled cells past the header (the rest of the row the
    quote took): a quote opened and closed only on a later line, which took the rows between
    into the cell. A quoted note over several lines of prose is a cell like any other."""
    for i, cell in enumerate(record):
        rows = cell.splitlines()[1:]
        if rows and (spilled or any(row.count(",") >= len(header) - 2 for row in rows)):
            column = header[i] if i < len(header) and header[i] else f"column {i + 1}"
            lines = len(rows)
            raise PlannerUsageError(
                f"{path}: line {line}: {column}: a quote opened in this cell closes only"
                f" {lines} line{'s' if lines > 1 else ''} later, taking the rows between into"
                " it; close the quote on its line or remove it")


def _ends_in_a_quote(text: str) -> bool:
    """Whether the file ends inside a quoted cell (a quote opened and never closed), which the
    lenient reader takes whole into that cell; a bare quote inside an unquoted cell (``5"``)
    does not."""
    try:
        for _ in csv.reader(io.StringIO(text), strict=True):
            pass
    except csv.Error as e:
        return str(e) == "unexpected end of data"
    return False


def _canonical(path: Path, header: list[str]) -> list[str]:
    """The header with each alias (:data:`ALIASES`) under its column's name; an alias beside
    that name is one degree given twice."""
    for alias, name in ALIASES.items():
        if alias in header and name in header:
            raise PlannerUsageError(f"{path}: header: columns {alias!r} and {name!r} both give"
                                    f" {name}; keep one")
    return [ALIASES.get(h, h) for h in header]


def _measured_step(row: dict[str, str], strategy: Strategy | MixedPlan) -> float | None:
    """The row's step time in seconds: ``step_time_s``, or the step its throughput gives
    (``global_batch x seq_len`` tokens over ``tokens_per_s``, or over ``tokens_per_s_per_gpu``
    times the plan's devices); None where none is filled. Two that disagree by more than
    :data:`AGREE` are a value to fix."""
    tokens = integer(row, "global_batch") * integer(row, "seq_len")
    given = {"step_time_s": measured(row, "step_time_s", SHORTEST_STEP_S, "seconds")}
    job = measured(row, "tokens_per_s", 1.0, "tokens a second")
    per_gpu = measured(row, "tokens_per_s_per_gpu", 1.0, "tokens a second")
    given["tokens_per_s"] = None if job is None else tokens / job
    given["tokens_per_s_per_gpu"] = (None if per_gpu is None
                                     else tokens / (per_gpu * strategy.devices))
    filled = {k: v for k, v in given.items() if v is not None}
    if not filled:
        return None
    (first, step), *others = filled.items()
    if step < SHORTEST_STEP_S:
        raise BadValue(f"{first} gives a step of {step:.3g} s, below {SHORTEST_STEP_S:g} s; check"
                       " its unit")
    for key, other in others:
        if abs(other / step - 1) > AGREE:
            raise BadValue(f"{first} and {key} disagree: a step of {step:.4g} s against"
                           f" {other:.4g} s ({tokens:,} tokens a step on {strategy.devices}"
                           " devices); fix one or leave it empty")
    return step


PEAK_OVER_PART = 1.05
"""How far a measured peak may sit above its part's memory (the catalog's figure is the part's
as nvidia-smi reports it; a report's rounding stays inside 5%): beyond, the figure is of another
unit or another part."""


def _check_peak(memory: float | None, device: DeviceSpec) -> None:
    """A measured peak above what its part holds is a value to fix."""
    hbm = device.hbm_bytes / GB
    if memory is not None and memory > PEAK_OVER_PART * hbm:
        raise BadValue(f"peak_memory_gb={memory:g} is above the {hbm:.4g} GB its part"
                       f" ({device.name}) has; give one device's peak in decimal GB, or"
                       " the part's own memory in hbm_gb")


def _check_measured(step: float | None, memory: float | None, oom: bool) -> None:
    if oom and (step is not None or memory is not None):
        raise BadValue("out_of_memory is true but the row has a measured"
                       f" {'step time' if step is not None else 'peak_memory_gb'}: a run"
                       " that ran out of memory has neither; empty the measured cells"
                       " or set out_of_memory false")
    if step is None and memory is None and not oom:
        raise BadValue("no measured step_time_s (or tokens_per_s, tokens_per_s_per_gpu)"
                       " or peak_memory_gb, and out_of_memory is not true; fill one in"
                       " or remove the row")


def _one_type(catalog: Catalog, ref: str, path: Path) -> SystemSpec:
    """The row's system of one device type; a system of node groups is a value to fix."""
    system = catalog.any_system(ref, where=(path, "system"))
    if isinstance(system, MixedSystemSpec):
        raise BadValue(f"system {ref!r} mixes device types; give the plan in a stages cell, as"
                       " `planner mixed` prints it (dp, tp, pp and micro_batch empty)")
    return system


def _mixed_run(row: dict[str, str], catalog: Catalog, path: Path, line: int,
               name: str) -> MeasuredRun:
    """A row measured on a cluster that mixes device types (:mod:`planner.runs_mixed`)."""
    model = _spec(lambda r: catalog.model(r, where=(path, "model")), row.get("model", ""),
                  "model", path)
    system = _spec(lambda r: catalog.any_system(r, where=(path, "system")),
                   row.get("system", ""), "system", path)
    training = row_training(row)
    plan = mixed_plan(row, model, system, training)  # a system of groups, or a value to fix
    step = _measured_step(row, plan)
    memory = measured(row, "peak_memory_gb", SMALLEST_PEAK_GB, "GB")
    oom = out_of_memory(row)
    _check_measured(step, memory, oom)
    _check_peak(memory, largest_part(system, plan))
    return MeasuredRun(
        line=line, name=name, model_ref=row["model"], system_ref=row["system"], model=model,
        model_id=ref_id(row["model"], path), system_id=ref_id(row["system"], path),
        system=system, training=training, strategy=None, step_time_s=step,
        peak_memory_gb=memory, memory_allocated=allocated(row), memory_stage=memory_stage(row),
        file=str(path), release=_printable(row.get("release", "")), out_of_memory=oom,
        mixed=plan)


def _check_gpus(row: dict[str, str], strategy: Strategy, system: SystemSpec) -> None:
    """A filled ``gpus`` must be the plan's and the system's device count: a row that says
    otherwise has a value to fix."""
    if not row.get("gpus"):
        return
    gpus = integer(row, "gpus")
    if gpus != strategy.devices:
        raise BadValue(f"gpus={gpus} but dp*tp*pp*sp = {strategy.devices}; fix the degrees"
                       " or the gpus cell")
    if gpus != system.devices:
        raise BadValue(f"gpus={gpus} but the system {system.name} has {system.devices}"
                       f" devices; name the system with {gpus}")


def _check_header(path: Path, header: list[str]) -> None:
    if not header:
        raise PlannerUsageError(f"{path}: empty; the first line must name the columns"
                                f" ({', '.join(REQUIRED)}, step_time_s and/or peak_memory_gb)")
    for sep, said in ((";", "semicolons"), ("\t", "tabs"), ("|", "bars")):
        if len(header) == 1 and sep in header[0]:
            raise PlannerUsageError(f"{path}: the header is separated by {said}; separate the"
                                    " columns with commas (a spreadsheet's \"CSV, comma\")")
    known = REQUIRED + MEASURED + OPTIONAL
    unknown = [c for c in header if c and c not in known]
    missing = [c for c in REQUIRED if c not in header and not ("stages" in header and c in PLAN)]
    if missing:
        close = difflib.get_close_matches(missing[0], unknown, n=1)
        hint = f" (is {close[0]!r} it? rename it)" if close else ""
        raise PlannerUsageError(f"{path}: header: no column {missing[0]!r}{hint}; the columns"
                                f" {', '.join(REQUIRED)} are required")
    if unknown:
        close = difflib.get_close_matches(unknown[0], [*known, *ALIASES], n=2)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise PlannerUsageError(f"{path}: header: unknown column {unknown[0]!r}; {hint}allowed:"
                                f" {', '.join(known)}")
    if not any(c in header for c in MEASURED):
        raise PlannerUsageError(f"{path}: header: no measured column; add step_time_s (seconds"
                                " per step; or tokens_per_s, tokens_per_s_per_gpu) and/or"
                                " peak_memory_gb (GB per device), or out_of_memory (true for"
                                " a plan that ran out of memory)")
    duplicated = sorted({c for c in header if c and header.count(c) > 1})
    if duplicated:
        raise PlannerUsageError(f"{path}: header: column {duplicated[0]!r} appears twice")


_BIDI = frozenset("\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
"""The marks and overrides that reorder text as a terminal shows it (Unicode's bidirectional
controls): a name holding U+202E printed its end first."""


def _printable(text: str) -> str:
    """A name or release with each control character (and line or paragraph separator, and
    bidirectional control) written as its escape, ``\\x1b``: both are printed in tables and
    messages, where a terminal would act on an escape sequence and a newline would break the
    row."""
    return "".join(c.encode("unicode_escape").decode("ascii")
                   if unicodedata.category(c) in ("Cc", "Zl", "Zp") or c in _BIDI else c
                   for c in text)


def _default_name(line: int, row: dict[str, str]) -> str:
    plan = " ".join(f"{k}{row[k]}" for k in ("dp", "tp", "pp", "sp") if row.get(k))
    extra = [f"mb{row['micro_batch']}"] if row.get("micro_batch") else []
    extra += [row[k] for k in ("recompute",) if row.get(k)]
    where = f"{row.get('model', '?')} on {row.get('system', '?')}"
    return f"line {line}: {where} {plan} {' '.join(extra)}".strip()


def read_runs_files(paths: Iterable[Path], catalog: Catalog,
                    framework: str | None = None) -> tuple[list[MeasuredRun], list[SkippedRun]]:
    """:func:`read_runs` of several CSV files, read as one."""
    runs: list[MeasuredRun] = []
    skipped: list[SkippedRun] = []
    seen: set[Path] = set()
    for path in paths:
        if path.resolve() in seen:  # its runs would count twice in every figure
            raise PlannerUsageError(f"{path}: given twice; give each file once")
        seen.add(path.resolve())
        found, left_out = read_runs(path, catalog, framework)
        runs += found
        skipped += left_out
    return _once(runs, skipped)


def _once(runs: list[MeasuredRun], skipped: list[SkippedRun]
          ) -> tuple[list[MeasuredRun], list[SkippedRun]]:
    """The runs with each one in another file already read left out as a value to fix: one
    file's row copied into another would count one run twice in every figure (a file's own
    repeats are its :func:`read_runs`'s)."""
    first: dict[tuple, MeasuredRun] = {}
    kept: list[MeasuredRun] = []
    for run in runs:
        key = (run.name, run.model_id, run.system_id, run.training, run.strategy, run.mixed,
               run.step_time_s, run.peak_memory_gb, run.memory_stage, run.memory_allocated,
               run.release, run.framework, run.out_of_memory)
        earlier = first.setdefault(key, run)
        if earlier.file == run.file:  # itself, or a row its file tells apart by other cells
            kept.append(run)
            continue
        skipped.append(SkippedRun(run.line, run.name, f"repeats {earlier.file}:{earlier.line}"
                                  " (the same run, plan and figures), which would count one run"
                                  " twice; remove one, or give a second measurement its own"
                                  " name", True, run.file))
    return kept, skipped


def read_runs(path: Path, catalog: Catalog,
              framework: str | None = None) -> tuple[list[MeasuredRun], list[SkippedRun]]:
    """The CSV's runs as specs, and the rows that could not be read with their reason.
    ``framework``: what a row whose ``framework`` cell is empty is read as (``planner validate
    --framework``); None reads it with the device's and model's defaults."""
    header, rows = _rows(path)
    _check_header(path, header)
    if not rows:
        raise PlannerUsageError(f"{path}: no runs under the header; add one row per measured run")
    where = (path, "model")
    runs: list[MeasuredRun] = []
    skipped: list[SkippedRun] = []
    first: dict[tuple[tuple[str, str], ...], int] = {}
    for line, row, spilled in rows:
        name = _printable(row.get("name") or _default_name(line, row))
        same = first.setdefault(tuple(sorted(row.items())), line)
        try:
            if spilled:
                raise BadValue(f"{spilled} more filled cell(s) than the header's"
                                f" {len(header)} columns: a comma in an unquoted cell shifts"
                                " every cell after it; quote that cell or remove the comma")
            if row.get(""):
                raise BadValue(f"a filled cell in column {row['']}, which the header leaves"
                               " unnamed; name the column or empty the cell")
            if same != line:  # a run measured twice differs in its figures or its name
                raise BadValue(f"repeats line {same} cell for cell, which would count one run"
                               " twice; remove one, or give a second measurement its own name")
            if row.get("stages"):
                runs.append(_mixed_run(row, catalog, path, line, name))
                continue
            lacking = [c for c in PLAN if c not in header]
            if lacking:  # a file of mixed-cluster rows, this one without its stages
                raise BadValue(f"stages is empty and the file has no {lacking[0]} column; give"
                               " the plan in stages, or add the columns dp, tp, pp and"
                               " micro_batch")
            strategy = row_strategy(row)
            step = _measured_step(row, strategy)
            memory = measured(row, "peak_memory_gb", SMALLEST_PEAK_GB, "GB")
            oom = out_of_memory(row)
            _check_measured(step, memory, oom)
            model = _spec(lambda r: catalog.model(r, where=where), row.get("model", ""), "model",
                          path)
            system = _spec(lambda r: _one_type(catalog, r, path), row.get("system", ""),
                           "system", path)
            _check_gpus(row, strategy, system)
            hbm = positive(row, "hbm_gb")
            if hbm is not None:  # a part with more or less memory than the catalog's
                system = replace(system, device=replace(system.device, hbm_bytes=hbm * GB))
            _check_peak(memory, system.device)
            run_framework = row_framework(row, framework)
            training = as_run_by(run_framework, model, system, row_training(row), strategy)
            runs.append(MeasuredRun(
                line=line, name=name, model_ref=row["model"], system_ref=row["system"],
                model_id=ref_id(row["model"], path), system_id=ref_id(row["system"], path),
                model=model, system=system, training=training, strategy=strategy,
                step_time_s=step, peak_memory_gb=memory, memory_allocated=allocated(row),
                memory_stage=memory_stage(row),
                file=str(path), release=_printable(row.get("release", "")),
                framework=run_framework, out_of_memory=oom))
        except RowError as e:
            skipped.append(SkippedRun(line, name, str(e), isinstance(e, BadValue), str(path)))
    return runs, skipped
