"""``planner report NAME``: one HTML page with the study's inputs, best plans and figures."""

from __future__ import annotations

import argparse
from pathlib import Path

from planner.commands._base import BaseCommand
from planner.commands._results import _study
from planner.commands._run import _positive_int, add_storage_argument
from planner.errors import PlannerUsageError
from planner.outputs import atomic_write, default_path
from planner.storage import storage_label, storage_option


class ReportCommand(BaseCommand):
    name = "report"
    help = ("One HTML page of a study: inputs, best plans, Pareto front, step-time breakdown and"
            " the best plan's timeline.")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name", help="the study's name (`planner studies` lists them)")
        parser.add_argument("--top", type=_positive_int, default=10,
                            help="best plans in the table and the breakdown (default 10)")
        parser.add_argument("--out", type=Path,
                            help="where to write (default planner-results/NAME-report.html)")
        add_storage_argument(parser)

    def run(self, args: argparse.Namespace) -> int:
        from planner.report import build_report, report_html  # plotly only when used

        if (args.out is not None and args.out.suffix.lower() not in ("", ".html", ".htm")
                and not args.out.exists()):  # an existing one: atomic_write says what it is
            # an HTML page named .png or .csv (the figures' commands refuse such a name)
            raise PlannerUsageError(f"--out {args.out}: a report is an HTML page; give a .html"
                                    " path (`planner pareto` and `show` write PNG figures)")
        study = _study(args)
        where = storage_option(storage_label(args.storage))
        page = report_html(build_report(study, args.top, where))
        path = args.out or default_path(args.name, "report", "html")
        if args.out is None:
            path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, page, (".html", ".htm"))
        print(f"wrote {path}")
        return 0
