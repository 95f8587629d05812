"""``planner pareto NAME``: step time against peak memory, every trial, the front drawn."""

from __future__ import annotations

import argparse
from pathlib import Path

from planner.commands._base import BaseCommand, hbm_gb
from planner.commands._results import _study
from planner.commands._run import add_storage_argument
from planner.outputs import default_path
from planner.plots import FORMATS, figure_format, write_figure
from planner.plots.pareto import pareto_figure


def add_figure_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--out", type=Path,
                        help=f"where to write (default planner-results/NAME-{what}.html)")
    parser.add_argument("--format", metavar="F",
                        help=f"{' or '.join(FORMATS)} (default: from --out's suffix, else html;"
                        " png needs kaleido and Debian's chromium)")


def figure_path(args: argparse.Namespace, what: str) -> Path:
    return args.out or default_path(args.name, what, figure_format(None, args.format))


class ParetoCommand(BaseCommand):
    name = "pareto"
    help = "A page of step time against peak memory: every trial, the Pareto front, the limit."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name", help="the study's name (`planner studies` lists them)")
        parser.add_argument("--hbm-gb", type=hbm_gb,
                            help="draw this HBM limit too, next to the study's own (which still colours"
                            " the points)")
        add_figure_arguments(parser, "pareto")
        add_storage_argument(parser)

    def run(self, args: argparse.Namespace) -> int:
        study = _study(args)
        path = figure_path(args, "pareto")
        if args.out is None:
            path.parent.mkdir(parents=True, exist_ok=True)
        written = write_figure(pareto_figure(study, args.hbm_gb), path, args.format)
        print(f"wrote {written}")
        return 0
