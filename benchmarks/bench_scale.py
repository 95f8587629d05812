"""Issue 17's scale figures, each beside its baseline, in one run.

Run: python benchmarks/bench_scale.py [--quick]

The space: Calculon's GPT-3 175B / 1,024-GPU search space in the project's knobs
(benchmarks/studies/gpt3-175b-calculon-1024.yaml: 5,930,496 candidates, 1,109,952 valid).

1. Listing the valid strategies, CPU seconds: one by one (every candidate built as a Strategy
   and passed to simcore.check, the path before issue 17) and as arrays (the shape rules run
   once over the knobs they read, only valid strategies built). ``--quick`` times the one-by-one
   path on a sixteenth of the candidates and scales it.
2. Estimating every valid strategy with ``simcore.estimate`` one at a time: CPU seconds and ms
   per strategy, on a sample of 20,000 valid strategies (spread over the list), scaled.
3. The batched estimate (``simcore.megatron.batched.estimate_many``) of every valid strategy, in
   chunks of :data:`CHUNK` consecutive ones (bounded memory): CPU seconds, ms per strategy, and
   a check that it equals ``simcore.estimate`` on the 20,000 of item 2.

4. ``planner run`` end to end, each in a child process on a fresh storage (results streamed to
   Parquet, the fronts and best plans kept as Optuna trials): wall time, peak RSS, CPU ms per
   plan (the child and its workers), beside the issue's targets and the old path's figures as
   the issue measured them (its "Why"): a 92,496-plan GPT-3 175B study
   (benchmarks/studies/gpt3-175b-92k-1024.yaml, the size of the issue's 96,096-strategy one:
   target 10 s), and the whole space serially and with ``--jobs 2`` (target 120 s, 2 GB, 0.1 ms
   of CPU per plan); then the same with ``--prune`` (plans that bounds prove cannot be kept are
   not estimated, :mod:`planner.prune`), beside the unpruned runs. ``--skip-run`` leaves it
   out.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

import simcore
from planner.study_config import load_study_config
from simcore.megatron.batched import estimate_many

SPACE = Path(__file__).resolve().parent / "studies" / "gpt3-175b-calculon-1024.yaml"
CHUNK = 200_000
"""Strategies per batched call: the arrays of one call stay well under 1 GB."""


def cpu(fn):
    start = time.process_time()
    out = fn()
    return out, time.process_time() - start


def one_by_one(space) -> int:
    return sum(1 for s in space.candidates() if space.reason_invalid(s) is None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="time the one-by-one listing on a sixteenth of the space")
    parser.add_argument("--skip-run", action="store_true",
                        help="leave out section 4 (planner run of the whole space)")
    args = parser.parse_args()
    config = load_study_config(SPACE)
    space = config.space
    print(f"space: {SPACE.name}: {space.size:,} candidates")

    valid, arrays_s = cpu(lambda: space.valid)
    if args.quick:
        part = replace(space, micro_batch=space.micro_batch[:1])  # a sixteenth: 1 of 16 micro-batch sizes
        _, part_s = cpu(lambda: one_by_one(part))
        scale = space.size / part.size
        old_s, old_note = part_s * scale, f" (scaled from {part.size:,} candidates)"
    else:
        n_old, old_s = cpu(lambda: one_by_one(space))
        assert n_old == len(valid), (n_old, len(valid))
        old_note = ""
    print("\n1. listing the valid strategies (CPU s)")
    print(f"   one by one (before)   {old_s:8.2f}{old_note}")
    print(f"   as arrays             {arrays_s:8.2f}   {len(valid):,} valid;"
          f" {old_s / arrays_s:.1f}x faster")

    step = max(1, len(valid) // 20_000)
    sample = valid[::step]
    model, system, training, conv = config.model, config.system, config.training, config.convention
    scalar, est_s = cpu(lambda: [simcore.estimate(model, system, training, s, conv)
                                 for s in sample])
    per = est_s / len(sample)
    print("\n2. simcore.estimate, one strategy at a time")
    print(f"   {per * 1e3:.3f} ms per strategy ({len(sample):,} sampled);"
          f" {per * len(valid):.0f} CPU s for all {len(valid):,}")

    def batched() -> list[np.ndarray]:
        return [estimate_many(model, system, training, valid[i:i + CHUNK], conv).step_time
                for i in range(0, len(valid), CHUNK)]

    steps, batch_s = cpu(batched)
    step_time = np.concatenate(steps)
    same = np.array_equal(step_time[::step][:len(sample)], [e.step_time for e in scalar])
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print("\n3. batched estimate (simcore.megatron.batched.estimate_many), every valid strategy")
    print(f"   {batch_s:8.2f} CPU s for all {len(valid):,}:"
          f" {batch_s / len(valid) * 1e3:.4f} ms per strategy,"
          f" {per * len(valid) / batch_s:.1f}x the one-at-a-time estimate;"
          f" chunks of {CHUNK:,}; peak RSS {rss_gb:.2f} GB (with the strategy list)")
    print(f"   equal to simcore.estimate on the {len(sample):,} sampled: {same}")
    if not args.skip_run:
        end_to_end()


MID = Path(__file__).resolve().parent / "studies" / "gpt3-175b-92k-1024.yaml"
RUNS = (
    # (label, study, extra arguments, target wall s, the old path as issue 17 measured it)
    ("92,496 plans", MID, [], 10.0,
     "old path, 96,096 plans: 79 CPU-s, 1.8 GB, 376 MB journal"),
    ("1,109,952 plans", SPACE, [], 120.0,
     "old path: not finished, stopped at 8 GB after 702 s (310,272 trials)"),
    ("1,109,952 plans --jobs 2", SPACE, ["--jobs", "2"], 120.0, ""),
    ("92,496 plans --prune", MID, ["--prune"], 10.0, "the 92,496 plans above, unpruned"),
    ("1,109,952 plans --prune", SPACE, ["--prune"], 120.0, "the 1,109,952 above, unpruned"),
    ("1,109,952 --prune --jobs 2", SPACE, ["--prune", "--jobs", "2"], 120.0,
     "the --jobs 2 run above, unpruned"),
)
TARGETS = {"rss_gb": 2.0, "cpu_ms_per_plan": 0.1}
"""Issue 17's targets for `planner run` on 2 cores (and each run's wall time above)."""


def planner_run(study: Path, extra: list[str]) -> tuple[float, float, float, int]:
    """(wall s, CPU s of the child and its workers, peak RSS GB, valid plans) of one
    `planner run` on a fresh journal."""
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as folder:
        storage = Path(folder) / "studies.journal"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "planner.cli", "run", str(study),
                               "--storage", str(storage), "--quiet", *extra],
                              capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"planner run failed ({done.returncode}): {done.stderr}")
    plans = int(done.stdout.split(" valid strategies")[0].rsplit("\n", 1)[-1].replace(",", ""))
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu_s, after.ru_maxrss / 1e6, plans  # ru_maxrss: kB, the largest child


def end_to_end() -> None:
    """Section 4: `planner run` of each study in a child process on a fresh journal."""
    print("\n4. planner run end to end (a child process, fresh storage; targets: wall as shown,"
          f" {TARGETS['rss_gb']:g} GB, {TARGETS['cpu_ms_per_plan']:g} ms CPU per plan)")
    print(f"   {'':26}{'wall s':>8}{'target':>8}{'peak GB':>9}{'CPU ms/plan':>13}   baseline")
    for label, study, extra, target, baseline in RUNS:
        wall, cpu_s, rss_gb, plans = planner_run(study, extra)
        per = cpu_s / plans * 1e3
        ok = (wall <= target and rss_gb <= TARGETS["rss_gb"]
              and per <= TARGETS["cpu_ms_per_plan"])
        print(f"   {label:26}{wall:8.1f}{target:8g}{rss_gb:9.2f}{per:13.3f}   {baseline}"
              f"{'' if ok else '  (over a target)'}")


if __name__ == "__main__":
    main()
