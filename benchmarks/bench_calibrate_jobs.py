"""`planner calibrate --jobs`: the fit and its cross-validation refits in several processes,
beside the same calibration in one.

The case is the largest file of one device in tests/data/validation: Aleph Alpha's 234 A100
runs (the fit and five refits of 4/5 of them). Wall seconds of ``calibrate()`` in this process,
one call at each job count, and whether the device each finds is the same (it must be: every fit
is seeded).

    python benchmarks/bench_calibrate_jobs.py [--trials 100] [--jobs 2]

The whole command, start-up included: ``farm-bench -n 3 --timeout 900 -- planner calibrate
tests/data/validation/aleph-alpha-a100-check.csv --device a100-80gb --name aa --out /tmp/aa.yaml
--force --jobs 2 --vs '...--jobs 1'``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from planner.calibration import calibrate
from planner.catalog import load_catalog
from planner.runs_csv import read_runs

RUNS = Path(__file__).resolve().parents[1] / "tests" / "data" / "validation" / \
    "aleph-alpha-a100-check.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    runs, _ = read_runs(RUNS, load_catalog())
    runs = [r for r in runs if r.system.device.name == "a100-80gb" and not r.out_of_memory]
    device = runs[0].system.device
    print(f"{len(runs)} runs on {device.name}, {args.trials} trials a fit, six fits"
          f" ({os.cpu_count()} cores)")
    found = {}
    for jobs in (1, args.jobs):
        start = time.perf_counter()
        fit = calibrate(runs, device, "bench", trials=args.trials, jobs=jobs)
        found[jobs] = fit.device
        print(f"  --jobs {jobs}: {time.perf_counter() - start:6.1f} s wall")
    print(f"  the same device at both: {found[1] == found[args.jobs]}")


if __name__ == "__main__":
    main()
