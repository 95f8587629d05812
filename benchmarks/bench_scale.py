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

4. ``planner run`` of the whole space end to end, in a subprocess on a fresh storage (results
   streamed to Parquet, the fronts and best plans kept as Optuna trials): wall time, CPU time,
   peak RSS of the child, valid plans, CPU ms per plan, beside the issue's targets (120 s wall,
   2 GB, 0.1 ms of CPU per plan). ``--skip-run`` leaves it out.

Not here: the issue's 96,096-strategy study (its YAML is not in the repository).
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
        end_to_end(len(valid))


TARGETS = {"wall_s": 120.0, "rss_gb": 2.0, "cpu_ms_per_plan": 0.1}
"""Issue 17's targets for `planner run` of this space on 2 cores."""


def end_to_end(valid: int) -> None:
    """Section 4: `planner run` of the space in a child process on a fresh journal."""
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as folder:
        storage = Path(folder) / "studies.journal"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "planner.cli", "run", str(SPACE),
                               "--storage", str(storage), "--quiet"],
                              capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise SystemExit(f"planner run failed ({done.returncode}): {done.stderr}")
        table = sum(p.stat().st_size for p in Path(folder).glob("*.parquet/*"))
        journal = storage.stat().st_size
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rss_gb = after.ru_maxrss / 1e6  # kB on Linux; the largest child so far
    per = cpu_s / valid * 1e3
    print("\n4. planner run of the whole space, end to end (a child process, fresh storage)")
    print(f"   {'':22}{'measured':>12}{'target':>10}")
    for what, got, want, unit in (("wall time", wall, TARGETS["wall_s"], "s"),
                                  ("peak RSS", rss_gb, TARGETS["rss_gb"], "GB"),
                                  ("CPU per valid plan", per, TARGETS["cpu_ms_per_plan"], "ms")):
        mark = "ok" if got <= want else "over"
        print(f"   {what:22}{got:10.3f} {unit:3}{want:8g} {unit:3} {mark}")
    print(f"   CPU {cpu_s:.1f} s for {valid:,} valid plans; results table {table / 1e6:.0f} MB,"
          f" journal {journal / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
