"""``planner sweep STUDY.yaml``: throughput and step time against one knob or the device count.

No study is created: the study's valid plans are estimated directly and the figure (and with
``--csv`` the points) written. DistIR's grid figure::

    planner sweep studies/distir-mlp-16.yaml --x tp --lines micro_batches --panels dp
"""

from __future__ import annotations

import argparse
import csv
import io
import time
from pathlib import Path
from typing import TYPE_CHECKING

from planner.commands._base import BaseCommand, hbm_gb
from planner.errors import PlannerUsageError

if TYPE_CHECKING:
    from planner.sweep import SweepRequest

_KNOB_HELP = ("dp, tp (or hp), pp, sp, zero, recompute, micro_batch, micro_batches (the count),"
              " schedule, v, placement, sequence_parallel, precision, devices, global_batch,"
              " width")


def _counts(text: str) -> tuple[int, ...]:
    """``2,4,8``: whole numbers >= 1, each once (argparse turns the error into one line)."""
    try:
        values = tuple(dict.fromkeys(int(t) for t in text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be whole numbers separated by commas, e.g."
                                         f" 2,4,8, not {text!r}") from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"must be whole numbers >= 1, not {text!r}")
    return values


def _where(text: str) -> tuple[str, tuple[str, ...]]:
    knob, eq, values = text.partition("=")
    items = tuple(v.strip() for v in values.split(",") if v.strip())
    if not eq or not knob.strip() or not items:
        raise argparse.ArgumentTypeError(f"{text!r} must be KNOB=VALUE[,VALUE...], e.g. tp=1 or"
                                         " micro_batches=1,2,4")
    return knob.strip(), items


class SweepCommand(BaseCommand):
    name = "sweep"
    help = ("A figure of throughput and step time against one knob or the device count, the"
            " rest fixed (--where) or the best plan per point; no study is stored.")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("study", type=Path,
                            help="a study YAML (e.g. studies/distir-mlp-16.yaml)")
        parser.add_argument("--x", metavar="KNOB", help="the knob on the x axis (default with"
                            f" --devices: devices): {_KNOB_HELP}")
        parser.add_argument("--lines", metavar="KNOB", help="one line per value of this knob")
        parser.add_argument("--panels", metavar="KNOB",
                            help="one panel per value of this knob (the panels share axes)")
        parser.add_argument("--where", metavar="KNOB=V[,V...]", type=_where, action="append",
                            default=[], help="keep only plans whose KNOB takes these values (one"
                            " value fixes it; repeat for several knobs); every knob not on --x,"
                            " --lines or --panels is re-optimised per point")
        parser.add_argument("--devices", metavar="N[,N...]", type=_counts, default=(),
                            help="re-make the study on its system resized to N devices (a one-"
                            "dimensional network only) and sweep them")
        parser.add_argument("--global-batch", metavar="B[,B...]", type=_counts, default=(),
                            help="re-make the study with these global batches (lines, by default)")
        parser.add_argument("--width", metavar="W[,W...]", type=_counts, default=(),
                            help="re-make the study with these MLP widths (mlp family: DistIR's"
                            " input dim)")
        parser.add_argument("--hbm-gb", type=hbm_gb,
                            help="HBM limit per device in GB (default: the study's)")
        parser.add_argument("--out", type=Path,
                            help="where to write the figure (default planner-results/"
                            "NAME-sweep-KNOB.html)")
        parser.add_argument("--format", metavar="F", help="html (default) or png")
        parser.add_argument("--csv", type=Path, metavar="PATH", help="also write the points here")

    def run(self, args: argparse.Namespace) -> int:
        from planner.outputs import atomic_write, check_output, counted, default_path
        from planner.plots import figure_format, write_figure
        from planner.plots.sweep import sweep_figure, sweep_info
        from planner.study_config import load_study_config
        from planner.sweep import run_sweep, sweep_rows

        request = _request(args)
        # both checked before the sweep writes either (a bad --csv came after the figure)
        if args.out is not None:
            check_output(args.out, (".html", ".htm", ".png"))
        if args.csv is not None:
            check_output(args.csv, (".csv",))
            if args.out is not None and args.csv.resolve() == args.out.resolve():
                raise PlannerUsageError(f"--csv {args.csv}: the same file as --out; give each"
                                        " its own")
        start = time.perf_counter()
        config = load_study_config(args.study, hbm_gb=args.hbm_gb)
        sweep = run_sweep(config, request)
        fmt = figure_format(args.out, args.format)
        out = args.out or default_path(config.name, f"sweep-{request.x}", fmt)
        if args.out is None:
            out.parent.mkdir(parents=True, exist_ok=True)
        write_figure(sweep_figure(sweep_info(sweep)), out, fmt)
        print(f"{counted(len(sweep.points), 'point')} from {counted(sweep.estimated, 'plan')} in"
              f" {time.perf_counter() - start:.1f} s")
        print(f"wrote {out}")
        if args.csv is not None:
            atomic_write(args.csv, _csv_text(sweep_rows(sweep)), (".csv",))
            print(f"wrote {args.csv}")
        return 0


def _request(args: argparse.Namespace) -> SweepRequest:
    """The sweep asked for, every knob name checked (one line for the first bad one)."""
    from planner.sweep import SweepRequest, knob_name

    if args.x is None and not args.devices:
        raise PlannerUsageError("--x: missing; name the knob to sweep (e.g. --x tp) or give"
                                " --devices 2,4,8")
    x = knob_name("--x", args.x) if args.x is not None else "devices"
    lines = knob_name("--lines", args.lines) if args.lines is not None else None
    panels = knob_name("--panels", args.panels) if args.panels is not None else None
    if lines is None and len(args.global_batch) > 1 and "global_batch" not in (x, panels):
        lines = "global_batch"
    where: dict[str, tuple[str, ...]] = {}
    for knob, values in args.where:
        name = knob_name("--where", knob)
        if name in where:  # the later one would silently replace the earlier
            raise PlannerUsageError(f"--where {knob}: {name} is given twice; list its values"
                                    f" once (--where {name}=A,B)")
        where[name] = values
    return SweepRequest(x=x, lines=lines, panels=panels, where=where, devices=args.devices,
                        global_batches=args.global_batch, widths=args.width)


def _csv_text(rows: list[dict[str, object]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]) if rows else ["plan"])
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()
