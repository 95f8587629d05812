"""``planner compare COMPARISON.yaml``: one model on several systems under several HBM limits.

Runs (or resumes) one study per (system, limit) cell, prints the best plan of each, and writes
``DIR/NAME.csv`` (the table, one row per cell) and ``DIR/NAME.html`` (the comparison figure and
the best plans' step-time breakdown in one page).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import optuna
import pandas as pd

from planner.commands._base import BaseCommand, jobs
from planner.commands._run import add_storage_argument
from planner.compare import CellRun, Comparison, limit_label, load_comparison, run_comparison
from planner.errors import Interrupted, PlannerUsageError
from planner.outputs import counted
from planner.plots._write import atomic_write
from planner.storage import RESULTS_DIR, storage_label, storage_option


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise PlannerUsageError(f"--out {out}: is a file; give a folder (created if missing)")


def _format(table: pd.DataFrame) -> str:
    """The table as a short text table: one line per cell."""
    def num(column: str, fmt: str) -> list[str]:
        return ["-" if pd.isna(v) else format(v, fmt) for v in table[column]]

    show = pd.DataFrame({
        "system": table["system"], "HBM": table["hbm_gb"].map(
            lambda v: v if isinstance(v, str) else f"{v:g} GB"),
        "best plan": table["plan"], "step s": num("step_time_s", ".4g"),
        "tokens/s": num("tokens_per_s", ",.0f"), "MFU": num("mfu", ".1%"),
        "peak GB": num("peak_memory_gb", ".1f"),
        "feasible": [f"{f:,}/{t:,}" for f, t in zip(table["feasible_plans"], table["trials"])],
    })
    return show.to_string(index=False)


def _header(comparison: Comparison) -> str:
    limits = ", ".join(limit_label(x) for x in comparison.limits)
    systems = ", ".join(f"{s.name} ({s.devices} x {s.device.name})" for s in comparison.systems)
    config = comparison.cells[0].config
    how = ("exhaustive" if config.sampler == "exhaustive"
           else f"{counted(config.n_trials, 'trial')} of {config.sampler}")
    return (f"comparison {comparison.name}: {comparison.model} from {comparison.study_path}"
            f" ({config.convention} convention, {how})\n  systems: {systems}\n  HBM limits:"
            f" {limits} ({len(comparison.cells)} cells)")


def _cell_line(run: CellRun) -> None:
    cell = run.cell
    valid = len(cell.config.space.valid)
    print(f"  {cell.label}: {run.added:,} new trials ({valid:,} valid strategies) in"
          f" {run.seconds:.1f} s, study {cell.name}", flush=True)


def _write(comparison: Comparison, table: pd.DataFrame, out: Path) -> tuple[Path, Path]:
    from planner.plots.breakdown import breakdown_figure
    from planner.plots.compare import comparison_figure, figures_page

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PlannerUsageError(f"--out {out}: cannot create the folder: {e.strerror}") from None
    csv = out / f"{comparison.name}.csv"
    page = out / f"{comparison.name}.html"
    atomic_write(csv, table.to_csv(index=False))
    cells = table.assign(cell=[f"{s} / {h if isinstance(h, str) else f'{h:g} GB'}"
                               for s, h in zip(table["system"], table["hbm_gb"])])
    model = comparison.model
    figures = [
        comparison_figure(table, f"{model}: best step time per system and HBM limit"),
        breakdown_figure(cells, "cell", title=f"{model}: where the best plan's step goes",
                         detail="plan"),
    ]
    intro = comparison.description or f"{model} from {comparison.study_path}"
    atomic_write(page, figures_page(f"{comparison.name}", figures, intro), (".html", ".htm"))
    return csv, page


class CompareCommand(BaseCommand):
    name = "compare"
    help = "One model on several systems under several HBM limits: best plan per cell, CSV + HTML."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("comparison", type=Path,
                            help="the comparison YAML (see studies/compare/)")
        parser.add_argument("--out", type=Path, default=RESULTS_DIR,
                            help=f"folder for NAME.csv and NAME.html (default {RESULTS_DIR}/)")
        add_storage_argument(parser)
        parser.add_argument("--jobs", type=jobs, default=1,
                            help="worker processes (default 1)")
        parser.add_argument("--quiet", action="store_true", help="no progress bars")

    def run(self, args: argparse.Namespace) -> int:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        comparison = load_comparison(args.comparison)
        _check_out(args.out)
        label = storage_label(args.storage)
        print(_header(comparison), flush=True)
        start = time.perf_counter()
        try:
            table = run_comparison(comparison, label, jobs=args.jobs,
                                   progress=not args.quiet, on_cell=_cell_line)
        except KeyboardInterrupt:
            raise Interrupted(f"interrupted: finished trials are kept in {label}; run `planner"
                              f" compare {args.comparison}{storage_option(label)}` again to"
                              " continue") from None
        print(f"{counted(len(comparison.cells), 'cell')} in"
              f" {time.perf_counter() - start:.1f} s, stored in"
              f" {label}")
        print(_format(table))
        csv, page = _write(comparison, table, args.out)
        print(f"wrote {csv} and {page}")
        return 0
