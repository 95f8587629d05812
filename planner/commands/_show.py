"""``planner show NAME --plan N``: a timeline of one training step of a stored study's plan."""

from __future__ import annotations

import argparse
from pathlib import Path

from planner.commands._base import BaseCommand
from planner.commands._results import _study
from planner.commands._run import add_storage_argument
from planner.outputs import default_path
from planner.plan import plan_at
from planner.plots import FORMATS, figure_format, write_figure
from planner.storage import storage_label, storage_option


class ShowCommand(BaseCommand):
    name = "show"
    help = ("A timeline of one training step of a stored plan: forward/backward per micro-batch"
            " and stage, exposed communication, bubble (plotly HTML or PNG).")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name", help="the study's name (`planner studies` lists them)")
        parser.add_argument("--plan", type=int, default=1, metavar="N",
                            help="the N-th best plan in `planner best NAME` order (default 1)")
        parser.add_argument("--out", type=Path, metavar="FILE",
                            help="where to write (default"
                            " planner-results/NAME-plan-N-timeline.html)")
        parser.add_argument("--format", choices=FORMATS,
                            help="html (default; self-contained) or png (needs kaleido and"
                            " a Chrome)")
        add_storage_argument(parser)

    def run(self, args: argparse.Namespace) -> int:
        from planner.plots.timeline import timeline_figure  # plotly: only when drawing

        fmt = figure_format(args.out, args.format)
        study = _study(args)
        plan = plan_at(study, args.plan, storage_option(storage_label(args.storage)))
        fig = timeline_figure(plan)
        out = args.out or default_path(args.name, f"plan-{args.plan}-timeline", fmt)
        if args.out is None:
            out.parent.mkdir(parents=True, exist_ok=True)
        write_figure(fig, out, fmt)
        est = plan.estimate
        print(f"wrote {out}: plan {args.plan} of {args.name} ({plan.label}), step"
              f" {est.step_time * 1e3:,.1f} ms")
        return 0
