"""`planner calibrate` on a fifth of a check file, judged on the other four fifths.

Issue 14's check of calibration: a team fits its device on a fifth of its measured runs and
the fit must improve the rest. For each check file and device in tests/data/validation, and
each of the five ways to take every fifth run (offsets 0-4), this fits the shipped device on
that fifth and prints the other runs' MAPE before and after: with the baseline pull (a fixed
weight of 0.02 on the squared distance from the starting values in units of each constant's
range, whatever the number of runs; searched as today, around the start), with the pull that
weakens as runs grow in number (``planner.calibration._prior``), and with that pull and the
check ``planner calibrate`` runs today (from three runs the fit is kept only if its refits
predict left-out runs better, by more than ``planner.calibration.CV_MARGIN`` standard errors of
the per-run gain; one or two runs are kept where the device is off on them by
``planner.calibration.OFF_BY`` or more). Where the other runs hold a group of plans of one
model on one system, their plan-choice regret before and with today's fit is printed too: a
fit can lower the error and rank worse (amp-t4-check.csv, tests/data/validation/README.md).

    python benchmarks/bench_calibrate_fifths.py [--trials 120] [--case FILE:DEVICE ...]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from joblib import Parallel, delayed

from planner import calibration
from planner.catalog import load_catalog
from planner.runs_csv import MeasuredRun, read_runs
from planner.validation import validate

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "validation"
CASES = (("a100-check.csv", "a100-80gb"), ("a100-check.csv", "a100-40gb"),
         ("h100-check.csv", "h100-sxm"), ("v100-check.csv", "v100-32gb"),
         ("a100-zb-check.csv", "a100-80gb"), ("a100-megatron-check.csv", "a100-40gb"),
         ("a100-megatron-check.csv", "a100-80gb"),
         ("long-context-check.csv", "h100-sxm"), ("long-context-check.csv", "b200"),
         ("internlm-check.csv", "a100-80gb"), ("megatron-ci-h100-check.csv", "h100-sxm"),
         ("flagperf-check.csv", "a100-80gb"), ("flagperf-check.csv", "h100-sxm"),
         ("nanotron-h100-check.csv", "h100-sxm"), ("kempner-h200-check.csv", "h200"),
         ("mlperf-check.csv", "h100-sxm"), ("gpt3-h100-check.csv", "h100-sxm"),
         ("jean-zay-check.csv", "a100-80gb"), ("nemotron-check.csv", "h100-sxm"),
         ("dgxc-h100-check.csv", "h100-sxm"), ("moe-check.csv", "h100-sxm"),
         ("libai-v100-check.csv", "v100-32gb"),
         ("bloom-sweeps-a100-check.csv", "a100-80gb"),
         ("aleph-alpha-a100-check.csv", "a100-80gb"),
         ("megatron-ci-2024-a100-check.csv", "a100-80gb"),
         ("amp-t4-check.csv", "t4"))
FIXED_WEIGHT = 0.02


def _fixed_prior(values: dict[str, float], start: dict[str, float],
                 constants: Sequence[calibration.Constant], runs: int) -> float:
    """The baseline: a fixed weight, distances in units of each constant's range."""
    return FIXED_WEIGHT * sum(((values[c.key] - start[c.key]) / (c.high - c.low)) ** 2
                              for c in constants)


def _rest(rest: list[MeasuredRun], device) -> tuple[float, float | None]:
    """The other runs' step-time MAPE and plan-choice regret (None: no group of two plans)."""
    result = validate(rest, system_for=lambda r: replace(
        r.system, device=replace(device, name=r.system.device.name)))
    summary = result.summary()
    return summary["step_time_mape"], summary["regret_mean"]


def _rest_mape(rest: list[MeasuredRun], device) -> float:
    return _rest(rest, device)[0]


def _case(file: str, device: str, offset: int, trials: int) -> tuple:
    runs, _ = read_runs(DATA / file, load_catalog())
    runs = [r for r in runs if r.system.device.name == device]
    fifth = runs[offset::5]
    rest = [r for i, r in enumerate(runs) if i % 5 != offset]
    start = runs[0].system.device
    constants = calibration._constants(fifth, None)
    today = calibration._prior
    calibration._prior = _fixed_prior  # this worker process's own module
    fixed = calibration._fit(fifth, start, "fifth", constants, trials, 0, lambda i, n: None)
    calibration._prior = today
    by_runs = calibration._fit(fifth, start, "fifth", constants, trials, 0, lambda i, n: None)
    checked = calibration.calibrate(fifth, start, "fifth", trials=trials).device
    (before, regret_before), (today, regret_today) = _rest(rest, start), _rest(rest, checked)
    return (file, device, offset, len(fifth), len(rest), before,
            _rest_mape(rest, fixed), _rest_mape(rest, by_runs), today,
            regret_before, regret_today)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=120)
    parser.add_argument("--case", action="append", metavar="FILE:DEVICE",
                        help="only this check file and device (repeatable; default: every case)")
    args = parser.parse_args()
    if any(":" not in c for c in args.case or ()):
        parser.error("--case takes FILE:DEVICE, e.g. long-context-check.csv:h100-sxm")
    cases = CASES if not args.case else [tuple(c.split(":", 1)) for c in args.case]
    jobs = [(f, d, o) for f, d in cases for o in range(5)]
    rows = Parallel(n_jobs=2)(delayed(_case)(f, d, o, args.trials) for f, d, o in jobs)
    print(f"{'':46s}the other four fifths' MAPE{'':46s}their regret")
    print(f"{'file':24s} {'device':10s} off fit/rest   before  fixed pull  pull by runs"
          "  + cross-check (today)   before   today")
    for file, device, offset, n_fit, n_rest, before, *after, reg_before, reg_today in rows:
        regrets = ("" if reg_before is None
                   else f"       {reg_before:7.1%} {reg_today:7.1%}")
        print(f"{file:24s} {device:10s} {offset:3d} {n_fit:3d}/{n_rest:<4d} {before:7.1%}"
              f"     {after[0]:7.1%}       {after[1]:7.1%}       {after[2]:7.1%}{regrets}")
    n = len(rows)
    print()
    for k, label in enumerate(("fixed pull (the baseline)", "pull by runs",
                               "pull by runs + cross-check (today)")):
        worse = sum(r[6 + k] > r[5] + 1e-4 for r in rows)
        better = sum(r[6 + k] < r[5] - 1e-4 for r in rows)
        mean = sum(r[6 + k] - r[5] for r in rows) / n
        print(f"{label:36s}: worse on the rest in {worse} of {n} fits, better in {better};"
              f" mean change {mean * 100:+.2f} points")
    ranked = [r for r in rows if r[9] is not None]
    if ranked:
        worse = sum(r[10] > r[9] + 1e-4 for r in ranked)
        better = sum(r[10] < r[9] - 1e-4 for r in ranked)
        mean = sum(r[10] - r[9] for r in ranked) / len(ranked)
        print(f"{'regret of the rest (today)':36s}: worse in {worse} of {len(ranked)}"
              f" fits whose rest has a group of plans, better in {better};"
              f" mean change {mean * 100:+.2f} points")


if __name__ == "__main__":
    main()
