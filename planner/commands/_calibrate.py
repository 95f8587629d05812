"""``planner calibrate RUNS.csv --device NAME --name NEW``: a device calibrated to a team's own
measured runs, written into the user's catalog (or ``--out``) for systems to name."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from planner.calibration import (
    CONSTANTS,
    CV_MARGIN,
    DEFAULT_TRIALS,
    OFF_BY,
    RANKING_WORSE,
    Fit,
    at_edge,
    calibrate,
)
from planner.catalog import device_from_entry, load_catalog, user_catalog_dir
from planner.catalog_write import check_entry_name, check_writable, device_entry, write_entry
from planner.commands._base import BaseCommand, jobs
from planner.commands._validate import percent
from planner.errors import Interrupted, PlannerUsageError
from planner.inputs import load
from planner.outputs import counted
from planner.runs_csv import MeasuredRun, SkippedRun, read_runs_files
from planner.validation import Validation, validate
from search_spaces.frameworks import FRAMEWORKS
from simcore.specs import DeviceSpec


def _figures(v: Validation) -> dict[str, Any]:
    s = v.summary()
    keep = ("step_time_runs", "step_time_mape", "step_time_median_ape", "memory_runs",
            "memory_mape", "memory_median_ape", "groups_count", "regret_mean", "regret_median")
    return {k: s[k] for k in keep}


def _cross_validation(fit: Fit) -> dict[str, Any] | None:
    cv = fit.cross_validation
    if cv is None:
        return None
    return {"folds": cv.folds, "before": round(cv.before, 6), "after": round(cv.after, 6),
            "gain_se": round(cv.gain_se, 6)}


def _entry_text(fit: Fit, runs_csv: list[Path], base: str) -> str:
    entry: dict[str, Any] = device_entry(fit.device)
    today = datetime.date.today().isoformat()
    files = ", ".join(str(p) for p in runs_csv)
    entry["source"] = (f"{base} calibrated by `planner calibrate` on {today} to"
                       f" {len(fit.runs)} measured runs in {files}")
    entry["calibration"] = {
        "base_device": base, "runs_csv": files, "runs": len(fit.runs),
        "fitted": [c.key for c in fit.constants],
        "before": _figures(fit.before), "after": _figures(fit.after),
        "cross_validation": _cross_validation(fit), "kept": fit.kept,
    }
    header = (f"# {fit.device.name}: {base} with its constants fitted to measured runs;"
              " see `calibration`.\n")
    return header + yaml.safe_dump({fit.device.name: entry}, sort_keys=False, width=100)


def _check_clash(name: str, target: Path, out_given: bool) -> None:
    catalog = load_catalog()
    if name in catalog.devices and not out_given:
        where = catalog.sources[("device", name)]
        if where.resolve() != target.resolve():
            raise PlannerUsageError(f"--name: {name}: a device of that name is in {where};"
                                    " choose another name")
    if target.exists() and target.parent == user_catalog_dir() / "devices":
        data = load(target, "catalog YAML")
        if not (isinstance(data, dict) and set(data) == {name}):
            raise PlannerUsageError(f"{target}: holds other entries; choose another name")


def _is_device_file(path: Path) -> bool:
    """``path`` holds catalog device entries only (``NAME: {peak_tflops: ..., ...}``), as
    calibrate writes them: what ``--force`` may replace (not a study, a journal or a plan)."""
    try:
        data = yaml.safe_load(path.read_bytes()) if path.stat().st_size <= 1 << 20 else None
    except (OSError, yaml.YAMLError):
        return False
    return (isinstance(data, dict) and bool(data)
            and all(isinstance(v, dict) and "peak_tflops" in v for v in data.values()))


class CalibrateCommand(BaseCommand):
    name = "calibrate"
    help = ("Fit a device's calibration constants to measured runs (a CSV, as `validate` takes)"
            " and write the calibrated device into your catalog.")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("runs", type=Path, nargs="+", metavar="RUNS.csv",
                            help="measured runs, the format of `planner validate` (one file or"
                            " several, fit together)")
        parser.add_argument("--device", required=True,
                            help="the device the runs ran on: a catalog name, or FILE.yaml#NAME"
                            " for a starting point of your own (rows on other devices are left"
                            " out)")
        parser.add_argument("--name", required=True, help="the calibrated device's name")
        parser.add_argument("--out", type=Path, metavar="FILE",
                            help="write the device entry here instead of your catalog"
                            " (<catalog>/devices/NAME.yaml)")
        parser.add_argument("--force", action="store_true",
                            help="replace a device of the same name in your catalog, or"
                            " the file --out names")
        parser.add_argument("--fit", metavar="KEYS",
                            help="comma-separated constants to fit (default: every one the runs"
                            " measure, but "
                            f"{', '.join(c.key for c in CONSTANTS if not c.by_default)}, fitted"
                            f" only by name): {', '.join(c.key for c in CONSTANTS)}")
        parser.add_argument("--trials", type=int, default=DEFAULT_TRIALS,
                            help=f"fit trials (default {DEFAULT_TRIALS})")
        parser.add_argument("--seed", type=int, default=0, help="the fit's seed (default 0)")
        parser.add_argument("--jobs", type=jobs, default=1,
                            help="processes for the fit and its cross-validation refits"
                            " (default 1; the device is the same at any count)")
        parser.add_argument("--framework", choices=FRAMEWORKS, default=None,
                            help="read every row whose framework cell is empty as this"
                            " framework runs it (as `planner validate --framework`)")
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def run(self, args: argparse.Namespace) -> int:
        check_entry_name(args.name)
        if not 1 <= args.trials <= 100_000:
            raise PlannerUsageError(f"--trials must be between 1 and 100000, got {args.trials}")
        if not 0 <= args.seed < 2**32:  # CMA-ES's seed (numpy's range)
            raise PlannerUsageError(f"--seed {args.seed}: give a whole number from 0 to"
                                    f" {2**32 - 1}")
        catalog = load_catalog()
        base = catalog.device(args.device)
        target = args.out or user_catalog_dir() / "devices" / f"{args.name}.yaml"
        _check_clash(args.name, target, args.out is not None)
        where = "the user catalog" if args.out is None else "--out"
        check_writable(target, where)
        if args.out is not None and args.out.suffix.lower() not in (".yaml", ".yml"):
            raise PlannerUsageError(f"--out {args.out}: a device entry is YAML; give a .yaml"
                                    " file name")
        if target.exists() and not args.force:
            raise PlannerUsageError(f"{target}: already exists; pass --force to replace it")
        if target.exists() and not _is_device_file(target):  # even with --force
            raise PlannerUsageError(f"{target}: exists and is not a device entry, which --force"
                                    " would replace; give another --out")
        runs, skipped = read_runs_files(args.runs, catalog, args.framework)
        bad = [sk for sk in skipped if sk.bad_value]
        if bad:  # a typo would silently leave its run out of the fit
            first = bad[0]
            raise PlannerUsageError(f"{first.where} ({first.name}): {first.reason}"
                                    + (f" (and {len(bad) - 1} more)" if len(bad) > 1
                                       else "") + "; fix the value, `planner validate` lists"
                                    " every row")
        # a run on a mixed cluster tells no one device's constants apart from the others'
        mixed = sum(r.device is None for r in runs)
        on_device = [r for r in runs if r.device is not None and r.device.name == base.name]
        # a plan that ran out of memory has no step time or peak to fit a constant to
        mine = [r for r in on_device if not r.out_of_memory]
        if on_device and not mine:
            raise PlannerUsageError(f"{', '.join(str(p) for p in args.runs)}: every run on"
                                    f" {base.name!r} ran out of memory; give runs with a"
                                    " step_time_s or peak_memory_gb to fit")
        # rows read but not expressible as a plan (their device unknown): left out, said below
        unread = tuple(sk for sk in skipped if not sk.bad_value)
        if not mine:
            found = sorted({r.device.name for r in runs if r.device is not None}
                           | ({"a mixed cluster"} if mixed else set()))
            files = ", ".join(str(p) for p in args.runs)
            also = ""
            if unread:
                first = unread[0]
                also = (f"; {counted(len(unread), 'row')} the planner cannot express left out,"
                        f" {first.where} ({first.name}): {first.reason}")
            raise PlannerUsageError(f"{files}: no run is on device {base.name!r} (the"
                                    f" runs' devices: {', '.join(found) or 'none'}{also})")
        mine, cannot = _estimable(mine, base.name, args.runs)
        cannot = unread + cannot
        oom = sum(r.out_of_memory for r in on_device)
        show = sys.stderr.isatty() and not args.json
        progress = (lambda i, n: print(f"\rfitting and cross-validating: trial {i}/{n}", end="",
                                       file=sys.stderr)) if show else None
        only = (None if args.fit is None
                else [k.strip().lower() for k in args.fit.split(",") if k.strip()])
        try:
            fit = calibrate(mine, base, args.name, trials=args.trials, seed=args.seed, only=only,
                            progress=progress, jobs=args.jobs)
        except ValueError as e:
            raise PlannerUsageError(f"--fit: {e}") from None
        except KeyboardInterrupt:
            if show:
                print(file=sys.stderr)
            raise Interrupted(f"interrupted while fitting; nothing written to {target}") from None
        if show:
            print(file=sys.stderr)
        text = _entry_text(fit, [p.resolve() for p in args.runs], base.name)
        device_from_entry(target, args.name, yaml.safe_load(text)[args.name])  # reads back
        write_entry(target, text, where)
        if args.json:
            out = {"device": args.name, "file": str(target), "runs": len(mine),
                   "out_of_memory_left_out": oom, "mixed_cluster_left_out": mixed,
                   "cannot_express_left_out": [f"{sk.where} ({sk.name}): {sk.reason}"
                                               for sk in cannot],
                   "fitted": {c.key: c.value(fit.device) for c in fit.constants},
                   "base": {c.key: c.value(base) for c in fit.constants},
                   "before": _figures(fit.before), "after": _figures(fit.after),
                   "cross_validation": _cross_validation(fit), "kept": fit.kept,
                   "at_edge": {c.key: edge for c in fit.constants
                               if (edge := at_edge(c, base, fit.device)) is not None},
                   "ranks_worse": _ranks_worse(fit)}
            print(json.dumps(out, indent=2))
        else:
            print("\n".join(self._report(fit, base)))
            if oom:
                print(f"left out: {counted(oom, 'plan')} that ran out of memory (no step time or"
                      " peak to fit; `planner validate` checks them)")
            if mixed:
                print(f"left out: {counted(mixed, 'run')} on a mixed cluster (a device is fit on"
                      " runs of its own; `planner validate` checks them)")
            for sk in cannot:
                print(f"left out: {sk.where} ({sk.name}): {sk.reason}")
            if args.out is None:
                print(f"wrote device {args.name} to {target}; a system YAML naming"
                      f" `device: {args.name}` uses it")
            else:
                print(f"wrote device {args.name} to {target}; put it in"
                      f" {user_catalog_dir() / 'devices'} for a system to name it")
        return 0

    @staticmethod
    def _report(fit: Fit, base: DeviceSpec) -> list[str]:
        b, a = fit.before.summary(), fit.after.summary()
        runs = f"{len(fit.runs)} run{'' if len(fit.runs) == 1 else 's'}"
        out = [f"fitted {len(fit.constants)} constants of {base.name} to {runs}:"]
        for c in fit.constants:
            out.append(f"  {c.key:<22} {c.value(base):9.4g} -> {c.value(fit.device):9.4g}")
        out.append(f"  {'':<26} {'before':>8} {'after':>8}")
        for label, key in (("step time MAPE", "step_time_mape"),
                           ("step time median error", "step_time_median_ape"),
                           ("memory MAPE", "memory_mape"),
                           ("memory median error", "memory_median_ape"),
                           ("plan-choice regret mean", "regret_mean")):
            out.append(f"  {label:<26} {percent(b[key]):>8} {percent(a[key]):>8}")
        return out + _cross_validation_lines(fit, base) + _notices(fit, base)


_EDGES = {"floor": "at the floor of its range", "ceiling": "at the ceiling of its range",
          "edge": "at the edge of what the fit searches around its start"}


def _ranks_worse(fit: Fit) -> bool:
    """The fit raises its own runs' plan-choice regret by more than :data:`RANKING_WORSE`."""
    before, after = fit.before.summary()["regret_mean"], fit.after.summary()["regret_mean"]
    return before is not None and after is not None and after > before + RANKING_WORSE


def _notices(fit: Fit, base: DeviceSpec) -> list[str]:
    """What to check before trusting the fit: constants that stopped at an edge of what the fit
    may search, and a ranking of the runs' plans worse than the starting device's."""
    out = []
    for c in fit.constants:
        edge = at_edge(c, base, fit.device)
        if edge is not None:
            out.append(f"note: {c.key} stopped {_EDGES[edge]} ({c.value(fit.device):.4g}): the"
                       " runs would push it further, so it may stand in for a cost the"
                       " estimate does not model (check the runs' stack options)")
    if _ranks_worse(fit):
        b, a = fit.before.summary(), fit.after.summary()
        out.append(f"note: the fit ranks these runs' plans worse than {base.name} did"
                   f" (plan-choice regret {percent(b['regret_mean'])} ->"
                   f" {percent(a['regret_mean'])}, Kendall tau {b['kendall_tau_mean']:.2f} ->"
                   f" {a['kendall_tau_mean']:.2f}): its step times are closer, its first choices"
                   " are not; compare plans with both devices, or fit fewer constants (--fit)")
    return out


def _cross_validation_lines(fit: Fit, base: DeviceSpec) -> list[str]:
    cv = fit.cross_validation
    if cv is None:
        few = f"{len(fit.runs)} run{'' if len(fit.runs) == 1 else 's'}, too few to cross-validate"
        off = (f"{base.name} is off on them by {percent(fit.off)} (mean absolute log error), "
               f"{'less than' if fit.off < OFF_BY else 'at least'} half a run's error"
               f" ({percent(OFF_BY)})")
        if fit.off < OFF_BY:
            return [f"{few}: {off}, too little to tell from noise, so {fit.device.name} keeps"
                    f" {base.name}'s constants; give three or more runs"]
        if fit.kept:
            return [f"{few}: {off}, but the fit does not lower it, so {fit.device.name} keeps"
                    f" {base.name}'s constants"]
        return [f"{few}: {off}, and the fit lowers it by {percent(fit.gain)}, so the fit is"
                " taken"]
    how = "leaving one run out at a time" if cv.folds == len(fit.runs) else f"{cv.folds} folds"
    line = (f"cross-validated ({how}): mean absolute log error {percent(cv.before)} ->"
            f" {percent(cv.after)} on runs each refit was not fit on (standard error of the"
            f" gain {percent(cv.gain_se)})")
    if not fit.kept:
        return [line]
    why = ("do not predict the runs they were not fit on better" if cv.after >= cv.before else
           f"predict the runs they were not fit on better by less than {CV_MARGIN:g} standard"
           " errors of the gain, which chance could make")
    return [line, (f"the refits {why}, so {fit.device.name} keeps {base.name}'s constants (the"
                   " runs disagree with one another or are too few; more runs, or --fit with"
                   " fewer constants, may settle it)")]


def _estimable(runs: list[MeasuredRun], device: str, files: list[Path]
               ) -> tuple[list[MeasuredRun], tuple[SkippedRun, ...]]:
    """The runs the planner can estimate (a plan it cannot express tells no constant) and the
    others with their reasons, or a one-line error when none is left: a fit of no run would
    write the device unchanged."""
    check = validate(runs)
    if check.results:
        return [r.run for r in check.results], check.skipped
    first = check.skipped[0]
    raise PlannerUsageError(f"{', '.join(str(p) for p in files)}: no run on {device!r} the"
                            f" planner can estimate ({counted(len(check.skipped), 'run')} left"
                            f" out; {first.where} ({first.name}): {first.reason}); nothing to"
                            " fit")
