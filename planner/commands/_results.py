"""``planner best / trials / studies``: read stored studies; nothing is re-simulated."""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from planner.commands._base import BaseCommand, add_storage_argument
from planner.commands._base import at_least_one as _positive_int
from planner.errors import PlannerUsageError
from planner.outputs import atomic_write
from planner.storage_paths import storage_label, storage_option
from planner.study_folder import folder_studies, is_folder, load_stored

if TYPE_CHECKING:
    import optuna
    import pandas as pd


def _study(args: argparse.Namespace) -> optuna.Study:
    import optuna

    from planner.study_summary import unfinished_note

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = load_stored(args.storage, args.name)
    if not {"config", "specs"} & set(study.user_attrs):  # planner.run_common stores both
        raise PlannerUsageError(f"study {args.name!r}: not a planner study (it stores no"
                                " model, system or plans; another Optuna program made it, or"
                                " its creation was cut short); planner reads only its own")
    note = unfinished_note(study, storage_option(storage_label(args.storage)))
    if note:
        print(note, file=sys.stderr)
    return study


class BestCommand(BaseCommand):
    name = "best"
    help = "The best feasible plans of a stored study (the Pareto front with two objectives)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name", help="the study's name (`planner studies` lists them)")
        parser.add_argument("--top", type=_positive_int, default=5, help="how many (default 5)")
        add_storage_argument(parser)

    def run(self, args: argparse.Namespace) -> int:
        from planner.tables import best_frame, format_best

        study = _study(args)
        print(format_best(best_frame(study, args.top)))
        return 0


_OTHER = {"csv": (".parquet", "parquet"), "parquet": (".csv", "csv")}
"""Each table format, with the suffix of the other and its option."""


def _check_target(path: Path, kind: str) -> None:
    """Refuse an output path whose folder does not exist, or named for the other format,
    before reading anything."""
    suffix, other = _OTHER[kind]
    if path.suffix.lower() == suffix:
        raise PlannerUsageError(f"--{kind} {path}: a {kind} file named {suffix}; use --{other}"
                                f" {path}, or name it .{kind}")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise PlannerUsageError(f"--{kind} {path}: the folder {folder} does not exist; create"
                                " it or choose another path")
    # an existing file of another kind (the journal read, a study YAML) is not replaced
    if path.is_file() and path.suffix and path.suffix.lower() != f".{kind}":
        raise PlannerUsageError(f"--{kind} {path}: exists and is not a .{kind} file, which this"
                                f" would replace; give a .{kind} path")


def _write(df: pd.DataFrame, path: Path, kind: str) -> None:
    """The table as CSV or Parquet, written whole or not at all."""
    try:
        if kind == "csv":
            data: str | bytes = df.to_csv(index=False)
        else:
            buffer = io.BytesIO()
            df.to_parquet(buffer, index=False)
            data = buffer.getvalue()
    except ImportError as e:
        raise PlannerUsageError(f"--parquet: {e}; install pyarrow") from None
    atomic_write(path, data)
    print(f"wrote {len(df):,} trials to {path}")


class TrialsCommand(BaseCommand):
    name = "trials"
    help = "Every trial of a stored study: strategy, estimate parts, feasibility; CSV / Parquet."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name", help="the study's name")
        parser.add_argument("--csv", type=Path, help="write the table as CSV")
        parser.add_argument("--parquet", type=Path, help="write the table as Parquet")
        add_storage_argument(parser)

    def run(self, args: argparse.Namespace) -> int:
        for path, kind in ((args.csv, "csv"), (args.parquet, "parquet")):
            if path:
                _check_target(path, kind)
        if args.csv and args.parquet and args.csv.resolve() == args.parquet.resolve():
            raise PlannerUsageError(f"--parquet {args.parquet}: the same file as --csv; give"
                                    " each its own")
        import pandas as pd

        from planner.tables import trials_frame

        df = trials_frame(_study(args))
        if args.csv:
            _write(df, args.csv, "csv")
        if args.parquet:
            _write(df, args.parquet, "parquet")
        if df.empty:  # pandas' "Empty DataFrame / Columns: [...]" said nothing of why
            print(f"study {args.name!r} has no trials stored yet")
        elif not (args.csv or args.parquet):
            cols = [c for c in ("number", "state", "plan", "step_time_s", "peak_memory_gb",
                                "feasible") if c in df.columns]
            with pd.option_context("display.max_rows", 60, "display.width", 200):
                print(df[cols].to_string(index=False, max_rows=60))
        return 0


class StudiesCommand(BaseCommand):
    name = "studies"
    help = ("The studies in the storage: model, system, sampler, trials, plans (and which"
            " are kept as trials), whether the run finished, best step time.")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_storage_argument(parser)

    def run(self, args: argparse.Namespace) -> int:
        from planner.outputs import text_table
        from planner.study_summary import folder_rows, study_row

        label = storage_label(args.storage)
        problems: list[str] = []
        if is_folder(label):  # each study's own journal, its row cached while it is unchanged
            rows = folder_rows(folder_studies(label), problems)
        else:
            import optuna

            from planner.storage import open_storage

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            storage = open_storage(args.storage, create=False)
            rows = [study_row(optuna.load_study(study_name=name, storage=storage))
                    for name in sorted(optuna.get_all_study_names(storage))]
        if rows:
            print(text_table(rows))
        elif not problems:
            print(f"no studies in {storage_label(args.storage)}")
        for line in problems:  # a damaged journal: listed apart, the others still shown
            print(f"planner studies: {line}", file=sys.stderr)
        return 1 if problems else 0
