"""End-to-end study times with storage (issue 5's figures).

Run: python benchmarks/bench_study.py
- the lab's 56-strategy study (stage convention), exhaustive, into a fresh journal file: goal
  under 3 s; and the same best plan as a plain loop over enumerate() calling simcore.estimate;
- Llama-3-70B on 1,024 H100s with pp, micro-batch, schedule, recompute and ZeRO/FSDP open
  (11,856 valid strategies), exhaustive, into a fresh journal: goal under 30 s.
Each is timed in-process (`planner run` minus interpreter start-up) and as the whole command.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

import simcore
from planner.runner import run_study
from planner.storage import open_storage
from planner.study_config import load_study_config
from planner.tables import best_frame

STUDIES = Path(__file__).resolve().parent.parent / "studies"


def in_process(path: Path, jobs: int = 1) -> tuple[float, optuna.Study, object]:
    with tempfile.TemporaryDirectory() as tmp:
        label = str(Path(tmp) / "studies.journal")
        start = time.perf_counter()
        config = load_study_config(path)
        report = run_study(config, open_storage(label, create=True), label, jobs=jobs,
                           progress=False)
        best = best_frame(report.study, 5)
        return time.perf_counter() - start, best, config


def whole_command(path: Path) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PLANNER_STORAGE=str(Path(tmp) / "studies.journal"))
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "planner.cli", "run", str(path), "--quiet"],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        return time.perf_counter() - start


def plain_best(config) -> tuple[str, float]:
    from search_spaces import strategy_label
    best = None
    for s in config.space.enumerate():
        est = simcore.estimate(config.model, config.system, config.training, s,
                               config.convention)
        feasible = config.hbm_gb is None or est.memory.total / 1e9 <= config.hbm_gb
        if feasible and (best is None or est.step_time < best[1]):
            best = (strategy_label(s), est.step_time)
    return best


def main() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for name, jobs in (("lab4b-llama70b-system1", 1), ("lab4b-llama70b-system1", 2),
                       ("lab4b-gpt175b-system2", 1), ("llama3-70b-h100-1024", 1),
                       ("llama3-70b-h100-1024", 2)):
        path = STUDIES / f"{name}.yaml"
        elapsed, best, config = in_process(path, jobs)
        line = (f"{name}: {len(config.space.valid):,} strategies, exhaustive, jobs {jobs}:"
                f" {elapsed:.2f} s in-process")
        if jobs == 1:
            line += f", {whole_command(path):.2f} s as `planner run`"
        print(line)
        if name.startswith("lab4b") and jobs == 1:
            label, step = plain_best(config)
            row = best.iloc[0]
            same = row["plan"] == label and row["step_time_s"] == step
            print(f"  best {row['plan']} {row['step_time_s']:.6g} s; plain loop {label}"
                  f" {step:.6g} s: {'same' if same else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
