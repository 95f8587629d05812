"""``planner validate RUNS.csv``: the estimate against measured runs, per run and as a ranking."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from planner.catalog import load_catalog
from planner.commands._base import BaseCommand
from planner.errors import PlannerUsageError
from planner.fields import MAX_NUMBER
from planner.outputs import counted
from planner.runs_csv import read_runs_files
from planner.validation import BREAKDOWNS, RunResult, Validation, less_memory, validate
from search_spaces.frameworks import FRAMEWORKS
from simcore import host_wait


def percent(value: float | int | None, signed: bool = False) -> str:
    """A fraction as a percentage for the reports; '-' when there is none."""
    if value is None:
        return "-"
    return f"{value:+.1%}" if signed else f"{value:.1%}"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


HOST_SAYS = 0.05
"""A run whose predicted step waits this share of it for the host or more says so."""


def host_waits(v: Validation) -> list[float]:
    """Seconds of each run's predicted step its devices wait for the host to issue the layers'
    kernels (:func:`simcore.host_wait`), in ``v.results``' order."""
    return [0.0 if r.run.strategy is None  # a mixed cluster's stages: not said
            else host_wait(r.run.model, r.run.system, r.run.training, r.run.strategy,
                           step_time=r.predicted_step_time_s) for r in v.results]


def report_lines(v: Validation, waits: list[float] | None = None) -> list[str]:
    """The human-readable report: one line per run (``waits``: :func:`host_waits`, said where
    a run's step waits for the host), then the figures and the groups."""
    waits = waits or [0.0] * len(v.results)
    width = max([len(r.run.name) for r in v.results] + [4])
    width = min(width, 60)
    lines = [f"{'run':<{width}}  {'step s':>9} {'measured':>9} {'error':>7}"
             f"  {'mem GB':>7} {'measured':>8} {'error':>7}"]
    for r, wait in zip(v.results, waits, strict=True):
        share = wait / r.predicted_step_time_s if r.predicted_step_time_s else 0.0
        measured = "OOM" if r.run.out_of_memory else _num(r.run.step_time_s, '9.4g')
        lines.append(
            f"{r.run.name[:width]:<{width}}  {r.predicted_step_time_s:9.4g}"
            f" {measured:>9} {percent(r.step_time_error, True):>7}"
            f"  {r.predicted_peak_memory_gb:7.1f} {_num(r.run.peak_memory_gb, '8.1f'):>8}"
            f" {percent(r.memory_error, True):>7}"
            + (f"  host {share:.0%}" if share >= HOST_SAYS else "")
            + _fit_note(r))
    s = v.summary()
    lines.append("")
    lines.append(f"step time: {counted(s['step_time_runs'], 'run')}, MAPE"
                 f" {percent(s['step_time_mape'])},"
                 f" median error {percent(s['step_time_median_ape'])}")
    lines.append(f"peak memory: {counted(s['memory_runs'], 'run')}, MAPE"
                 f" {percent(s['memory_mape'])},"
                 f" median error {percent(s['memory_median_ape'])}")
    ran = len(v.results) - s["out_of_memory_runs"]
    if s["over_memory_runs"]:
        lines.append(f"fit: {s['over_memory_runs']} of {counted(ran, 'run')}"
                     " estimated over"
                     " their device's memory, which each ran in (a study would not offer those"
                     " plans)")
    if s["out_of_memory_runs"]:
        lines.append(f"out of memory: {counted(s['out_of_memory_runs'], 'plan')} ran out of"
                     f" memory; the estimate has {s['out_of_memory_estimated_fits']} of them"
                     " fitting (a study would offer those plans)")
    if v.groups:
        lines.append(f"plan choice: {counted(len(v.groups), 'group')} of runs of one model on"
                     " one system"
                     f" (same global batch and sequence); regret mean {percent(s['regret_mean'])},"
                     f" median {percent(s['regret_median'])}; the fastest picked in"
                     f" {s['picked_fastest']} of {len(v.groups)}; Kendall tau mean"
                     f" {_num(s['kendall_tau_mean'], '.2f')}")
        if s["groups_with_out_of_memory"]:
            lines.append("  with the plans that ran out of memory: the first choice (the fastest"
                         " estimated to fit, a study's recommendation) ran out of memory in"
                         f" {s['first_choice_out_of_memory']} of"
                         f" {counted(s['groups_with_out_of_memory'], 'group')} with such plans"
                         + ("" if s["first_choice_regret_mean"] is None else
                            "; where it ran, its regret mean"
                            f" {percent(s['first_choice_regret_mean'])}"))
        for g in v.groups:
            model, system, batch, seq, release = g.key
            on = f", release {release}" if release else ""
            failed = (f"; first choice {g.first_choice.run.name!r} ran out of memory"
                      if g.first_choice is not None and g.first_choice_out_of_memory else "")
            lines.append(f"  {model} on {system}, batch {batch}, seq {seq}{on}:"
                         f" {counted(len(g.runs), 'run')},"
                         f" regret {percent(g.regret)}, tau {g.kendall_tau:.2f}; picked"
                         f" {g.picked.run.name!r}, fastest {g.fastest.run.name!r}{failed}")
    else:
        lines.append("plan choice: no group of two or more timed plans of one model on one"
                     " system")
    for bad, what in ((True, "with a value to fix"), (False, "the planner cannot express")):
        rows = [sk for sk in v.skipped if sk.bad_value is bad]
        if rows:
            lines.append(f"left out: {counted(len(rows), 'row')} {what}")
            lines += [f"  {sk.where} ({sk.name}): {sk.reason}" for sk in rows]
    return lines


def _fit_note(r: RunResult) -> str:
    """What a run's line says of the estimate's fit: a plan that ran estimated over memory, or a
    plan that ran out of memory estimated to fit (each a wrong verdict), or one that ran out of
    memory estimated over it (a right one)."""
    if r.run.out_of_memory:
        return "  over memory" if not r.fits else "  estimated to fit, ran out of memory"
    return "" if r.fits else "  over memory"


def breakdown_lines(v: Validation, by: str) -> list[str]:
    """The figures per value of ``by`` (``--by``): runs, MAPE, median and mean signed error."""
    rows = v.breakdown(by)
    width = min(max([len(str(r[by])) for r in rows] + [len(by)]), 60)
    lines = ["", f"by {by}:", f"  {by:<{width}}  {'runs':>5} {'MAPE':>7} {'median':>7}"
             f" {'mean':>7}  {'mem runs':>8} {'mem MAPE':>8}"]
    for r in rows:
        lines.append(f"  {str(r[by])[:width]:<{width}}  {r['step_time_runs']:>5}"
                     f" {percent(r['step_time_mape']):>7}"
                     f" {percent(r['step_time_median_ape']):>7}"
                     f" {percent(r['step_time_mean_error'], True):>7}"
                     f"  {r['memory_runs']:>8} {percent(r['memory_mape']):>8}")
    return lines


class _Once(argparse.Action):
    """An option given at most once (a second ``--by`` was kept, the first dropped silently)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        if getattr(namespace, self.dest) is not None:
            parser.error(f"{option_string} given twice; give one")
        setattr(namespace, self.dest, values)


class ValidateCommand(BaseCommand):
    name = "validate"
    help = "Estimate measured runs (a CSV) and report the error and the plan-choice regret."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("runs", type=Path, nargs="+", metavar="RUNS.csv",
                            help="measured runs: model, system, global_batch, seq_len, dp, tp,"
                            " pp, micro_batch, step_time_s (or tokens_per_s,"
                            " tokens_per_s_per_gpu) and/or peak_memory_gb, or out_of_memory"
                            " true for a plan that ran out of memory (see the README for the"
                            " optional columns); several files are read as one")
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument("--by", choices=sorted(BREAKDOWNS), default=None, action=_Once,
                            help="also split the figures by the runs' release, model, system,"
                            " device, precision or file, or by a knob of their plans (gpus, nodes,"
                            " dp, tp, pp, cp, micro_batch, micro_batches, zero, recompute,"
                            " schedule, cp_comm) or their framework: per value its runs,"
                            " MAPE, median and mean signed error (fast or slow as a body)")
        parser.add_argument("--margin-gb", type=float, default=0.0, metavar="GB",
                            help="judge each plan's fit against its part's memory less GB, as a"
                            " study whose hbm_gb is below the part's does: how the plans that"
                            " ran out of memory, the runs estimated over and each group's first"
                            " choice move with a margin (default 0)")
        parser.add_argument("--framework", choices=FRAMEWORKS, default=None,
                            help="read every row whose framework cell is empty as this"
                            " framework runs it: its defaults for the cells left empty, and"
                            " a plan it cannot run as written left out with the reason (rows"
                            " on a mixed cluster, whose plans are in stages, as they are)")

    def run(self, args: argparse.Namespace) -> int:
        runs, skipped = read_runs_files(args.runs, load_catalog(), args.framework)
        if not (0 <= args.margin_gb < MAX_NUMBER):
            raise PlannerUsageError(f"--margin-gb {args.margin_gb:g}: give the GB to keep free,"
                                    " 0 or more")
        try:
            result = validate(runs, skipped, system_for=less_memory(args.margin_gb))
        except ValueError as e:  # a part with less memory than the margin
            raise PlannerUsageError(f"--margin-gb {args.margin_gb:g}: {e}") from None
        waits = host_waits(result)
        if args.json:
            data = result.to_dict()
            for row, wait in zip(data["rows"], waits, strict=True):
                row["predicted_host_wait_s"] = wait
            if args.by is not None:
                data["by"] = {"field": args.by, "rows": result.breakdown(args.by)}
            print(json.dumps(data, indent=2))
        else:
            lines = report_lines(result, waits)
            if any(waits):
                lines.append("host N%: the share of the predicted step its devices wait for the"
                             " host to issue the layers' kernels (host_kernel_us)")
            if args.margin_gb:
                lines.append(f"fits judged against each part's memory less {args.margin_gb:g} GB"
                             " (--margin-gb)")
            if args.by is not None:
                lines += breakdown_lines(result, args.by)
            print("\n".join(lines))
        bad = sum(sk.bad_value for sk in result.skipped)
        if bad:
            where = "in skipped" if args.json else "as left out"
            print(f"planner validate: {counted(bad, 'row')} with a value to fix (listed {where});"
                  " the figures leave them out", file=sys.stderr)
            return 1
        if not result.results:  # every row left out: no figure at all
            left = counted(len(result.skipped), "row")
            where = "in skipped" if args.json else "above"
            print(f"planner validate: no row could be estimated ({left} left out, listed"
                  f" {where}); the plans need a fix", file=sys.stderr)
            return 1
        return 0
