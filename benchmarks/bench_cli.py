"""How long the ``planner`` command line takes to start (issue 19: "every command, ``--help``
included, pays about 1 s of imports").

Run: python benchmarks/bench_cli.py [--runs 5] [--save before.json] [--baseline before.json]
Times each command below as a whole process (the installed ``planner`` script), ``--runs`` times
in turn after one warm-up round, on an empty journal and user catalog in a temporary folder, and
prints the median wall time of each side by side. ``--save`` keeps the medians as JSON;
``--baseline`` adds a column with a saved run's medians and the ratio, for before / after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ESTIMATE = ["estimate", "--model", "llama3-70b", "--system", "dgx-h100-1024", "--dp", "8",
            "--tp", "8", "--pp", "16", "--micro-batch", "1", "--global-batch", "1024", "--json"]

COMMANDS: dict[str, list[str]] = {
    "python -c pass (floor)": [],
    "planner --help": ["--help"],
    "planner estimate ... --json": ESTIMATE,
    "planner catalog devices": ["catalog", "devices"],
    "planner studies (empty storage)": ["studies"],
}


def planner_script() -> list[str]:
    """The console script beside this interpreter, else ``python -m planner.cli``."""
    script = Path(sys.executable).parent / "planner"
    if script.exists():
        return [str(script)]
    found = shutil.which("planner")
    return [found] if found else [sys.executable, "-m", "planner.cli"]


def wall_s(argv: list[str], env: dict[str, str]) -> float:
    """One run's wall time; a failed command stops the benchmark (a time of an error is no use)."""
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed (exit {done.returncode}): {done.stderr.decode()[-500:]}")
    return elapsed


def medians_s(runs: int, env: dict[str, str]) -> dict[str, float]:
    """Median wall time of each command; the commands take turns so drift hits all alike."""
    planner = planner_script()
    argvs = {label: [sys.executable, "-c", "pass"] if not args else [*planner, *args]
             for label, args in COMMANDS.items()}
    times: dict[str, list[float]] = {label: [] for label in argvs}
    for round_ in range(runs + 1):
        for label, argv in argvs.items():
            elapsed = wall_s(argv, env)
            if round_:  # round 0 warms the file cache and .pyc files
                times[label].append(elapsed)
    return {label: statistics.median(values) for label, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs of each command")
    parser.add_argument("--save", type=Path, help="write the medians to this JSON file")
    parser.add_argument("--baseline", type=Path, help="a JSON file from --save, to compare with")
    args = parser.parse_args()
    baseline: dict[str, float] = json.loads(args.baseline.read_text()) if args.baseline else {}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "s.journal").touch()  # empty: `planner studies` says "No studies in ..."
        env = {**os.environ, "PLANNER_STORAGE": f"{tmp}/s.journal", "PLANNER_CATALOG": f"{tmp}/cat"}
        result = medians_s(args.runs, env)
    print(f"median wall time of {args.runs} runs each ({os.cpu_count()} cores)")
    head = f"{'command':<34}{'median s':>10}"
    print(head + (f"{'baseline s':>12}{'ratio':>8}" if baseline else ""))
    for label, median in result.items():
        row = f"{label:<34}{median:>10.3f}"
        if label in baseline:
            row += f"{baseline[label]:>12.3f}{median / baseline[label]:>8.2f}"
        print(row)
    if args.save:
        args.save.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
