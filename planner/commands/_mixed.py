"""``planner mixed STUDY.yaml``: the best plan on a cluster that mixes device types, beside the
best plan on each device group alone."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pandas as pd

from planner.commands._base import BaseCommand, seed
from planner.errors import Interrupted, PlannerUsageError
from planner.exports.hetero import FRAMEWORKS, export_hetero, runs_on, why_not
from planner.mixed_config import MixedStudy, load_mixed_study
from planner.outputs import atomic_write, check_output, counted, write_folders
from search_spaces.mixed import MixedResult, search_mixed, space_size
from search_spaces.mixed_sample import sample_mixed
from simcore.mixed.estimate import StageCosts

MAX_PLANS = 100_000
"""Spaces up to this many plans are estimated whole (about a minute at 0.5 ms a plan)."""
TRIALS = 500

_SHOWN = ["plan", "groups", "stages", "micro_batches", "recompute", "zero", "step_time_s",
          "peak_memory_gb", "mfu", "fits", "frameworks"]


def add_frameworks(study: MixedStudy, result: MixedResult) -> None:
    """The ``frameworks`` column: which frameworks run each plan as written (comma-separated)."""
    sp = study.space
    result.table["frameworks"] = [
        ",".join(runs_on(sp.model, sp.system, sp.training, result.plans[label]))
        for label in result.table["plan"]] if not result.table.empty else []


def best_for(result: MixedResult, framework: str) -> pd.Series | None:
    """The fastest fitting plan ``framework`` can run, or None."""
    table = result.table
    if table.empty:
        return None
    rows = table[table["fits"] & table["frameworks"].str.split(",").map(
        lambda fs: framework in fs)]
    return None if rows.empty else rows.iloc[0]


def _row(row: pd.Series | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}


def summary(study: MixedStudy, result: MixedResult, seconds: float, top: int,
            size: int) -> dict[str, Any]:
    """What the command reports: the best plan, the best on each group alone, the best that
    uses more than one group, and whether mixing pays."""
    names = [g.name for g in study.space.system.groups]
    best = result.best()
    alone = {n: _row(result.best(n)) for n in names}
    table = result.table
    fitting = table[table["fits"] & table["groups"].str.contains(r"\+", regex=True)] \
        if not table.empty else table
    mixed = _row(fitting.iloc[0]) if not fitting.empty else None
    fastest_alone = min((r for r in alone.values() if r), default=None,
                        key=lambda r: r["step_time_s"])
    gain = None
    if mixed and fastest_alone:
        gain = fastest_alone["step_time_s"] / mixed["step_time_s"] - 1
    runnable = {f: _row(best_for(result, f)) for f in FRAMEWORKS}
    why = {}
    if best is not None:
        sp, plan = study.space, result.plans[best["plan"]]
        why = {f: why_not(f, sp.model, sp.system, sp.training, plan) for f in FRAMEWORKS}
    return {
        "study": study.name, "model": study.space.model.name, "system": study.space.system.name,
        "plans": len(table), "layouts": result.skeletons, "search_s": seconds,
        "sampled_trials": result.trials, "interrupted": result.interrupted,
        "space_plans_at_most": size,
        "best": _row(best), "alone": alone, "best_mixed": mixed, "mixing_speedup": gain,
        "best_by_framework": runnable, "best_not_runnable_because": why,
        "top": [_row(r) for _, r in table.head(top).iterrows()],
    }


def report_lines(study: MixedStudy, s: dict[str, Any], top: pd.DataFrame) -> list[str]:
    system = study.space.system
    groups = " + ".join(f"{g.devices} {g.device.name} ({g.name})" for g in system.groups)
    tr = study.space.training
    lines = [(f"study {study.name}: {study.space.model.name} on {system.name} ({groups}),"
             f" global batch {tr.global_batch} x {tr.seq_len} tokens")]
    if study.description:
        lines.append(study.description)
    if study.space.profiles is not None:
        lines.append(f"layer costs measured (profile {study.space.profiles.name}); stage shapes"
                     " without a profile are left out")
    if s["sampled_trials"] is None:
        lines.append(f"searched {counted(s['plans'], 'plan')} ({s['layouts']:,} group orders"
                     f" and stage layouts x micro-batches x knobs, each layer split solved) in"
                     f" {s['search_s']:.2f} s: the whole space")
    else:
        cut = " (interrupted)" if s.get("interrupted") else ""
        lines.append(f"sampled {s['layouts']:,} group orders and layouts in"
                     f" {s['sampled_trials']:,} Optuna TPE trials{cut}, {s['plans']:,} plans"
                     f" ({s['search_s']:.2f} s) of at most"
                     f" {s['space_plans_at_most']:,}: the best found, not proven best (--max-plans"
                     f" {s['space_plans_at_most']} estimates them all)")
    best = s["best"]
    if best is None:
        lines.append("no plan fits in the devices' HBM")
        return lines
    lines.append(f"best plan: {best['plan']}  {best['step_time_s']:.4g} s/step, MFU"
                 f" {best['mfu']:.1%}, peak {best['peak_memory_gb']:.1f} GB")
    for name, row in s["alone"].items():
        shown = "no plan fits" if row is None else f"{row['step_time_s']:.4g} s  {row['plan']}"
        lines.append(f"  {name} alone: {shown}")
    mixed, gain = s["best_mixed"], s["mixing_speedup"]
    if mixed is None:
        lines.append("  mixed: no plan over several groups fits")
    elif gain is None:  # no group fits alone
        lines.append(f"  mixed: {mixed['step_time_s']:.4g} s  {mixed['plan']}: only mixing fits"
                     " (no group alone has the memory)")
    elif gain > 0:
        lines.append(f"  mixed: {mixed['step_time_s']:.4g} s  {mixed['plan']}: mixing pays,"
                     f" {gain:.1%} faster than the best group alone")
    else:
        lines.append(f"  mixed: {mixed['step_time_s']:.4g} s  {mixed['plan']}: mixing does not"
                     f" pay ({-gain:.1%} slower than the best group"
                     " alone); leave the slower devices idle or give them other work")
    for f, row in s["best_by_framework"].items():
        reason = s["best_not_runnable_because"].get(f)
        if reason is None:
            lines.append(f"  {f}: runs the best plan as written")
        elif row is None:
            lines.append(f"  {f}: runs no fitting plan ({reason})")
        else:
            lines.append(f"  {f}: {row['step_time_s']:.4g} s  {row['plan']} (the best plan"
                         f" cannot run: {reason})")
    if not top.empty:
        lines.append("")
        lines.append(top.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return lines


class MixedCommand(BaseCommand):
    name = "mixed"
    help = ("Search a cluster that mixes device types: the best plan, and the best on each"
            " device group alone.")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("study", type=Path, metavar="STUDY.yaml",
                            help="a study whose system is made of node groups"
                            " (studies/mixed/metis-*.yaml)")
        parser.add_argument("--top", type=int, default=10, metavar="N",
                            help="plans to list (default 10)")
        parser.add_argument("--out", type=Path, metavar="FILE",
                            help="write every plan with its estimate (.csv or .parquet)")
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument("--max-plans", type=int, default=MAX_PLANS, metavar="N",
                            help="estimate every plan when the space holds at most N (default"
                            f" {MAX_PLANS:,}); above it, sample it with Optuna (0: always"
                            " sample)")
        parser.add_argument("--trials", type=int, default=TRIALS, metavar="N",
                            help="Optuna trials (group orders and layouts, each with every"
                            f" micro-batch count and knob) when the space is sampled (default"
                            f" {TRIALS})")
        parser.add_argument("--seed", type=seed, default=0,
                            help="the sampler's seed (default 0)")
        parser.add_argument("--timeline", type=Path, metavar="FILE",
                            help="draw one step of the best plan, each stage's row naming its"
                            " device (.html, or .png with Chromium)")
        parser.add_argument("--export", type=Path, metavar="DIR",
                            help="write the launch files of the best plan each framework can"
                            " run, one sub-folder per framework")
        parser.add_argument("--framework", choices=[*FRAMEWORKS, "all"], default="all",
                            help="with --export: flagscale (hetero process meshes), megatron"
                            " (one tp and dp, a custom pipeline layout) or all (default)")
        parser.add_argument("--force", action="store_true",
                            help="with --export: replace framework folders that hold files the"
                            " export does not write")

    def run(self, args: argparse.Namespace) -> int:
        if args.top < 0:
            raise PlannerUsageError(f"--top must be >= 0, not {args.top}")
        if args.out is not None and args.out.suffix not in (".csv", ".parquet"):
            raise PlannerUsageError(f"--out {args.out}: use a .csv or .parquet file name")
        if args.out is not None:  # before the search, not after it
            check_output(args.out, (args.out.suffix,))
        if args.timeline is not None:
            try:
                check_output(args.timeline, (".html", ".htm", ".png"))
            except PlannerUsageError as e:
                raise PlannerUsageError(f"--timeline {e}") from None
        if args.max_plans < 0 or args.trials < 1:
            raise PlannerUsageError("--max-plans must be >= 0 and --trials >= 1")
        study = load_mixed_study(args.study)
        start = time.perf_counter()
        size = space_size(study.space)
        if size <= args.max_plans:
            result = search_mixed(study.space)
        else:
            # ERROR: Optuna warns of a trial Ctrl-C stopped with a traceback; sample_mixed says it
            optuna.logging.set_verbosity(optuna.logging.ERROR)
            result = sample_mixed(study.space, args.trials, args.seed,
                                  progress=sys.stderr.isatty())
        seconds = time.perf_counter() - start
        add_frameworks(study, result)
        s = summary(study, result, seconds, args.top, size)
        if args.out is not None:
            _write(result.table, args.out)
        written = _export(study, result, args) if args.export is not None else []
        if args.timeline is not None:
            written.append(_timeline(study, result, args.timeline))
        s["written"] = written
        if args.json:
            print(json.dumps(s, indent=2))
        else:
            top = result.table.head(args.top)[_SHOWN] if not result.table.empty \
                else result.table
            print("\n".join(report_lines(study, s, top)))
            if args.out is not None:
                print(f"every plan: {args.out}")
            for line in written:
                print(line)
        if result.interrupted:
            raise Interrupted(f"interrupted after {result.trials:,} of {args.trials:,} trials;"
                              " the best of what was sampled is above")
        return 0


def _timeline(study: MixedStudy, result: MixedResult, path: Path) -> str:
    from planner.plots import write_figure
    from planner.plots.timeline import figure_from_timeline
    from simcore.mixed.timeline import mixed_timeline

    best = result.best()
    if best is None:
        raise PlannerUsageError(f"--timeline: {study.name} has no plan that fits to draw")
    sp = study.space
    costs = StageCosts(sp.model, sp.system, sp.training, sp.profiles)
    tl = mixed_timeline(sp.model, sp.system, sp.training, result.plans[best["plan"]], costs,
                        step_time=float(best["step_time_s"]))
    written = write_figure(figure_from_timeline(f"{study.name}: {best['plan']}", tl), path)
    return f"timeline of the best plan: {written}"


def _export(study: MixedStudy, result: MixedResult, args: argparse.Namespace) -> list[str]:
    """Write each framework's best runnable plan under ``args.export``; the lines to print."""
    sp = study.space
    frameworks = FRAMEWORKS if args.framework == "all" else (args.framework,)
    folders: dict[str, dict[str, str]] = {}
    lines = []
    for f in frameworks:
        row = best_for(result, f)
        if row is None:
            if args.framework != "all":
                raise PlannerUsageError(f"--framework {f}: it runs no plan of {study.name}"
                                        " that fits")
            lines.append(f"{f}: runs no plan that fits; nothing written")
            continue
        estimate = (f"step time {row['step_time_s']:.4g} s, peak memory"
                    f" {row['peak_memory_gb']:.1f} GB (fits)")
        folders[f] = export_hetero(f, sp.model, sp.system, sp.training,
                                   result.plans[row["plan"]], estimate)
    for folder in write_folders(args.export, folders, force=args.force):
        lines.append(f"{folder}/: {', '.join(sorted(folders[folder.name]))}")
    return lines


def _write(table: pd.DataFrame, path: Path) -> None:
    """The table, written whole or not at all (:func:`planner.outputs.atomic_write`)."""
    data = (table.to_parquet(index=False) if path.suffix == ".parquet"
            else table.to_csv(index=False))
    atomic_write(path, data, (path.suffix,))
