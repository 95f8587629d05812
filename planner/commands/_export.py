"""``planner export NAME --top K --format F``: the best plans of a study, ready to run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import TracebackType

import yaml
from tqdm.auto import tqdm

from planner.commands._base import BaseCommand
from planner.commands._results import _study
from planner.commands._run import _positive_int, add_storage_argument
from planner.errors import PlannerUsageError
from planner.exports import EXPORTERS, runnable_files
from planner.outputs import RESULTS_DIR, atomic_write, counted, slug, write_folders
from planner.plan import FORMAT, Plan, plan_text, plans_from_study
from planner.progress import progress_bar
from planner.tables import best_count

ALL = "all"
PLAN_SUFFIXES = (".yaml", ".yml", ".json")
"""An ``--out`` ending so names the plan file itself (one plan, ``--format plan``)."""


def _formats(text: str) -> list[str]:
    names = [f.strip() for f in text.split(",") if f.strip()]
    if names == [ALL]:
        return list(EXPORTERS)
    for name in names:
        if name not in EXPORTERS:
            raise PlannerUsageError(f"--format {name}: unknown format; use one of"
                                    f" {', '.join(EXPORTERS)} (several with commas) or {ALL}")
    if not names:
        raise PlannerUsageError(f"--format: give one of {', '.join(EXPORTERS)} or {ALL}")
    return names


_FILE_SUFFIXES = {".txt", ".csv", ".md", ".html", ".htm", ".sh", ".py", ".log", ".toml", ".ini",
                  ".cfg", ".conf"}
"""Suffixes of files, not folders: ``--out plan1.txt`` made a folder of that name (a folder
named ``exports.v2`` stays one)."""


def _names_a_file(out: Path, formats: list[str], plans: list[Plan]) -> bool:
    """Whether ``--out`` names a plan file rather than a folder (an existing folder of that
    name stays a folder); a file name for anything but one plan file is refused."""
    if out.is_dir():
        return False
    if out.suffix.lower() not in PLAN_SUFFIXES:
        if out.suffix.lower() in _FILE_SUFFIXES and not out.exists():  # made a folder of it
            fix = ("a plan file is .yaml, .yml or .json; give one of those, or a folder (no"
                   " suffix)" if formats == ["plan"] and len(plans) == 1 else "only --format"
                   " plan with one plan writes a file; give a folder (no suffix)")
            raise PlannerUsageError(f"--out {out}: a file name, but {fix}")
        return False
    if formats != ["plan"] or len(plans) != 1:
        raise PlannerUsageError(f"--out {out}: a file name takes one plan in --format plan"
                                f" (here {len(plans)} plan(s), --format {','.join(formats)});"
                                " give a folder, where each plan gets a sub-folder")
    return True


def _check_plan_file(out: Path) -> None:
    """Refuse to replace an existing ``--out`` that is not a plan file (a study or a catalog
    YAML of the same suffix, say): only ``--force`` replaces it."""
    if not out.is_file():
        return
    try:
        with out.open("rb") as f:
            data = yaml.safe_load(f.read(1 << 20)) if out.stat().st_size <= 1 << 20 else None
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        data = None
    if not (isinstance(data, dict) and data.get("format") == FORMAT):
        raise PlannerUsageError(f"--out {out}: exists and is not a plan file, which this would"
                                " replace; give another path, or pass --force")


def _listing(files: dict[str, str | bytes]) -> str:
    """The folder's files, sub-folders counted (``traces/ (17 files)``) instead of listed."""
    top = sorted({f.split("/", 1)[0] + "/" for f in files if "/" in f})
    counts = {t: sum(1 for f in files if f.startswith(t)) for t in top}
    return ", ".join([*(f"{t} ({counted(n, 'file')})" for t, n in counts.items()),
                      *sorted(f for f in files if "/" not in f)])


def approx_size(n_bytes: int) -> str:
    """A rough size in decimal units, as ``du -h --si`` would say it."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n_bytes >= scale:
            value = n_bytes / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:,.0f} {unit}"
    return f"{n_bytes} bytes"


class _TraceProgress:
    """A plan's per-NPU traces (``--format chakra``): one stderr line, once the first is
    encoded, with how many files and roughly how large, then a progress bar over them."""

    def __init__(self, rank: int, enabled: bool) -> None:
        self.rank, self.enabled = rank, enabled
        self.bar: tqdm | None = None

    def start(self, files: int, approx_bytes: int) -> None:
        print(f"plan {self.rank}: writing {files:,} Chakra trace files (one per NPU), about"
              f" {approx_size(approx_bytes)}", file=sys.stderr, flush=True)
        self.bar = progress_bar(files, self.enabled, f"plan {self.rank} traces", "file")

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def __enter__(self) -> _TraceProgress:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.bar is not None:
            self.bar.close()


class ExportCommand(BaseCommand):
    name = "export"
    help = ("The best plans of a study as plan files, Megatron-LM arguments, a DeepSpeed config,"
            " torchtitan configs, ASTRA-sim + STAGE inputs or Chakra traces.")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name", help="the study's name (`planner studies` lists them)")
        parser.add_argument("--top", type=_positive_int, default=1,
                            help="how many of the best plans (default 1)")
        parser.add_argument("--format", default="plan", metavar="F",
                            help=f"{', '.join(EXPORTERS)}, several with commas, or {ALL}"
                            " (default plan)")
        parser.add_argument("--out", type=Path,
                            help="folder (default planner-results/exports/NAME); one sub-folder"
                            " per plan, RANK-PLAN; or, for one plan in --format plan, the plan"
                            " file itself (.yaml, .yml or .json)")
        parser.add_argument("--force", action="store_true",
                            help="replace plan folders that hold files this export does not"
                            " write, or a --out file that is not a plan file")
        add_storage_argument(parser)
        parser.add_argument("--quiet", action="store_true",
                            help="no progress bar (the trace files of --format chakra)")

    def run(self, args: argparse.Namespace) -> int:
        formats = _formats(args.format)
        study = _study(args)
        plans = plans_from_study(study, args.top)
        if not plans:
            raise PlannerUsageError(f"study {args.name!r} has no feasible plan to export")
        if args.out is not None and _names_a_file(args.out, formats, plans):
            if not args.force:
                _check_plan_file(args.out)
            atomic_write(args.out, plan_text(plans[0], args.out.suffix.lower()))
            print(f"{args.out}: plan 1 of {args.name} ({plans[0].label})")
            return 0
        folders: dict[str, dict[str, str | bytes]] = {}
        for rank, plan in enumerate(plans, start=1):
            files: dict[str, str | bytes] = {}
            for fmt in formats:
                try:
                    with _TraceProgress(rank, not args.quiet) as progress:
                        files.update(runnable_files(plan, fmt, progress))
                except ValueError as e:  # the framework cannot run this plan as written
                    if args.format != ALL:
                        raise PlannerUsageError(f"--format {fmt}: plan {rank}: {e}") from None
                    print(f"plan {rank}: no {fmt} files: {e}")
            folders[f"{rank}-{slug(plan.label)}"] = files
        out = args.out or RESULTS_DIR / "exports" / slug(args.name)
        for folder in write_folders(out, folders, force=args.force):
            print(f"{folder}/: {_listing(folders[folder.name])}")
        if len(plans) < args.top:
            print(f"(the study has {best_count(study, len(plans))}, fewer than --top"
                  f" {args.top})")
        return 0
