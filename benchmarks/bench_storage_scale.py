"""Issue 19 item 1: what a command on one study costs when the storage holds 10^5 trials in 20
studies, in a folder of studies (one journal each, the default) beside one shared journal (the
default before), in one run.

Run: python benchmarks/bench_storage_scale.py [--runs 3]

Fills both storages with the same 20 studies (19 exhaustive studies of the lab's Llama-70B on
lab system 1 in the megatron convention, 5,328 plans each, all kept as trials, and the lab's
56-plan study), then times as whole commands (a child process each, interpreter start-up
included; the median of ``--runs``): ``planner best`` of the small study, ``planner studies``
(in the folder: with its summary cache deleted before each run, so it reads every journal, then
with the rows each run left in the cache, as ``planner run`` leaves them), and ``planner best``
of a big study. Target: under 2 s for ``best`` of the
small study and ``studies``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402

from planner.runner import run_study  # noqa: E402
from planner.storage import open_storage  # noqa: E402
from planner.study_config import load_study_config  # noqa: E402
from planner.study_folder import is_folder, study_storage  # noqa: E402
from planner.study_summary import CACHE, remember  # noqa: E402
from planner.tables import best_frame  # noqa: E402

BIG = """\
name: {name}
model: llama70b
system: lab-system1
training: {{global_batch: 512, seq_len: 1024}}
objectives: [step_time, peak_memory]
sampler: exhaustive
space:
  tp: powers_of_two
  pp: [1, 2, 4, 8]
  sp: powers_of_two
  zero: [0, 1, 2, 3]
  recompute: [none, selective, full]
  micro_batch: [1, 2, 4]
  schedule: [1f1b, gpipe]
"""
SMALL = ROOT / "studies" / "lab4b-llama70b-system1-megatron.yaml"
STUDIES = 20
TARGET_S = 2.0


def fill(label: str, folder: Path) -> tuple[int, float]:
    """The 20 studies into the storage ``label``; (trials stored, seconds)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    start, trials = time.perf_counter(), 0
    paths = [SMALL]
    for i in range(STUDIES - 1):
        path = folder / f"big{i:02d}.yaml"
        path.write_text(BIG.format(name=f"big{i:02d}"))
        paths.append(path)
    for path in paths:
        config = load_study_config(path)
        where = study_storage(label, config.name)
        report = run_study(config, open_storage(where, create=True), where, progress=False)
        trials += report.added
        if is_folder(label):  # as `planner run` does at its end: the study's row cached
            remember(Path(where), report.study, best_frame(report.study, 5))
    return trials, time.perf_counter() - start


def timed(argv: list[str], runs: int, cold: Path | None = None) -> float:
    """Median wall seconds of the command as a child process (``cold``: a file deleted before
    each run, the summary cache)."""
    times = []
    for _ in range(runs):
        if cold is not None:
            cold.unlink(missing_ok=True)
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "planner.cli", *argv],
                              capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise SystemExit(f"planner {' '.join(argv)} failed: {done.stderr}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per command (median)")
    args = parser.parse_args()
    small = load_study_config(SMALL).name
    with tempfile.TemporaryDirectory(prefix="bench-storage-scale-") as tmp:
        work = Path(tmp)
        storages = {"one journal (before)": str(work / "one.journal"),
                    "folder (default now)": str(work / "folder") + "/"}
        print(f"{STUDIES} studies: {small} (56 plans) and {STUDIES - 1} of 5,328 plans each")
        for what, label in storages.items():
            trials, seconds = fill(label, work)
            print(f"  filled {what}: {trials:,} trials in {seconds:.0f} s")
        print(f"\nwall seconds, median of {args.runs} (target {TARGET_S:g} s for the first two)")
        print(f"  {'command':34}" + "".join(f"{w:>22}" for w in storages))
        cache = Path(storages["folder (default now)"]) / CACHE
        rows = [("best (the small study)", ["best", small], None),
                ("studies (no cached rows)", ["studies"], cache),
                ("studies (cached rows)", ["studies"], None),
                ("best (a big study)", ["best", "big00"], None)]
        for title, argv, cold in rows:
            cells = [timed([*argv, "--storage", label], args.runs, cold)
                     for label in storages.values()]
            print(f"  {title:34}" + "".join(f"{c:22.2f}" for c in cells))


if __name__ == "__main__":
    main()
