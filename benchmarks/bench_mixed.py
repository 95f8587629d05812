"""Search time of Metis's rows on mixed A100 + V100 clusters (issue 15: each under 5 s on one
core), beside Metis's own search time on the same rows.

Run: python benchmarks/bench_mixed.py  (CPU seconds of the search, median of 3; one process)

Metis's figures are not re-run here (its code is CC BY-NC; the team measured it): 612 search
steps on 16 + 16 GPUs; 58,078 steps, 88 s wall (26 s CPU) on 32 + 32 GPUs with 20 layers; 1.7
million steps and 757 s (its paper, on a laptop) on 128 + 128 GPUs with 40 layers.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from planner.mixed_config import load_mixed_study
from search_spaces.mixed import search_mixed

ROOT = Path(__file__).resolve().parent.parent
ROWS = [("metis-16-16", "612 steps (time not given)"), ("metis-32-32", "88 s (26 s CPU)"),
        ("metis-64-64", "3,734 steps (time not given)"), ("metis-128-128", "757 s (paper)")]


def main() -> None:
    print(f"{'study':<15} {'plans':>7} {'search s (CPU)':>15} {'best s/step':>12}  Metis")
    for name, metis in ROWS:
        study = load_mixed_study(ROOT / "studies" / "mixed" / f"{name}.yaml")
        times = []
        for _ in range(3):
            start = time.process_time()
            result = search_mixed(study.space)
            times.append(time.process_time() - start)
        best = result.best()
        print(f"{name:<15} {len(result.table):>7,} {statistics.median(times):>15.2f}"
              f" {best['step_time_s']:>12.4f}  {metis}")


if __name__ == "__main__":
    main()
