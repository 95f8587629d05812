"""Search time of Metis's rows on mixed A100 + V100 clusters (issue 15: each under 5 s on one
core), beside Metis's own search time on the same rows.

Run: python benchmarks/bench_mixed.py [TRIALS]  (CPU seconds of the search, median of 3; one
process). Then the same rows sampled with Optuna (``planner mixed --max-plans 0 --trials
TRIALS``, default 500) for seeds 0, 1 and 2: CPU seconds and how much slower the sampled best is
than the proven best.

Metis's figures are not re-run here (its code is CC BY-NC; the team measured it): 612 search
steps on 16 + 16 GPUs; 58,078 steps, 88 s wall (26 s CPU) on 32 + 32 GPUs with 20 layers; 1.7
million steps and 757 s (its paper, on a laptop) on 128 + 128 GPUs with 40 layers.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import optuna

from planner.mixed_config import load_mixed_study
from search_spaces.mixed import search_mixed
from search_spaces.mixed_sample import sample_mixed

ROOT = Path(__file__).resolve().parent.parent
ROWS = [("metis-16-16", "612 steps (time not given)"), ("metis-32-32", "88 s (26 s CPU)"),
        ("metis-64-64", "3,734 steps (time not given)"), ("metis-128-128", "757 s (paper)")]


def main() -> None:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print(f"{'study':<15} {'plans':>7} {'search s (CPU)':>15} {'best s/step':>12}  Metis"
          f"  | sampled, {trials} trials, seeds 0-2: CPU s, slower than the best")
    for name, metis in ROWS:
        study = load_mixed_study(ROOT / "studies" / "mixed" / f"{name}.yaml")
        times = []
        for _ in range(3):
            start = time.process_time()
            result = search_mixed(study.space)
            times.append(time.process_time() - start)
        best = result.best()["step_time_s"]
        sampled = []
        for seed in range(3):
            start = time.process_time()
            found = sample_mixed(study.space, trials, seed).best()["step_time_s"]
            sampled.append(f"{time.process_time() - start:.1f} s {found / best - 1:+.1%}")
        print(f"{name:<15} {len(result.table):>7,} {statistics.median(times):>15.2f}"
              f" {best:>12.4f}  {metis}  | {', '.join(sampled)}")


if __name__ == "__main__":
    main()
