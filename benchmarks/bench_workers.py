"""Trials per second with 1, 2 and 4 workers, on PostgreSQL and on the embedded journal; and the
time to resume a 10,000-trial study (issue 7).

Run: python benchmarks/bench_workers.py [--postgres URL] [--quick]
(the URL defaults to $PLANNER_TEST_POSTGRES; ``bash .ci/postgres.sh`` starts a server on
loopback and prints one). PostgreSQL: N ``planner worker`` processes on one fresh study, in a
schema of their own, dropped at the end. Journal: ``planner run --jobs N`` (the embedded
storage's workers are joblib processes on one machine). Two rates each: over the whole command
(interpreter start-up and the final read-back included), and over the study's own trials (first
trial started to last trial finished).

Studies: exhaustive - Llama-3-70B on 1,024 H100s (11,856 strategies; --quick: the lab's
1,998-strategy space); sampler - random, 300 trials (--quick 100) on the lab's full space.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
from optuna.trial import TrialState

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.record import frozen_trial  # noqa: E402
from planner.storage import open_storage  # noqa: E402
from planner.study_config import load_study_config  # noqa: E402
from search_spaces import LayoutEncoding  # noqa: E402

BIG = ROOT / "studies" / "llama3-70b-h100-1024.yaml"
MID = """\
name: {name}
model: llama70b
system: lab-system1
training: {{global_batch: 512, seq_len: 1024}}
sampler: {sampler}
n_trials: {n_trials}
seed: 0
space:
  tp: powers_of_two
  pp: [1, 2, 4, 8]
  sp: powers_of_two
  zero: [0, 1, 3]
  recompute: [none, selective, full]
  micro_batch: [1, 2, 4]
"""


def _study_file(folder: Path, name: str, *, sampler: str, n_trials: int, big: bool) -> Path:
    path = folder / f"{name}.yaml"
    if big and sampler == "exhaustive":
        text = BIG.read_text() + f"\nname: {name}\n"
    else:
        text = MID.format(name=name, sampler=sampler, n_trials=n_trials)
    path.write_text(text)
    return path


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    full = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.Popen([sys.executable, "-m", "planner.cli", *args, "--quiet"], env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"failed: {p.args}\n{out}\n{err}")


def _span(study: optuna.Study) -> tuple[int, float]:
    """Finished trials and the seconds from the first trial's start to the last one's end."""
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    first = min(t.datetime_start for t in done)
    last = max(t.datetime_complete for t in done)
    return len(done), max((last - first).total_seconds(), 1e-9)


@contextmanager
def _schema(url: str) -> Iterator[str]:
    """The URL with a fresh schema first on the search path; the schema is dropped after."""
    import sqlalchemy

    schema = f"planner_bench_{uuid.uuid4().hex[:8]}"
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text(f"CREATE SCHEMA {schema}"))
    try:
        yield f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"
    finally:
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text(f"DROP SCHEMA {schema} CASCADE"))
        engine.dispose()


def run_postgres(url: str, folder: Path, workers: int, sampler: str, n: int, big: bool
                 ) -> tuple[int, float, float]:
    name = f"w{workers}-{sampler}-{uuid.uuid4().hex[:6]}"
    path = _study_file(folder, name, sampler=sampler, n_trials=n, big=big)
    start = time.perf_counter()
    _wait([_cli("worker", str(path), "--storage", url) for _ in range(workers)])
    wall = time.perf_counter() - start
    trials, span = _span(optuna.load_study(study_name=name, storage=open_storage(url,
                                                                                 create=False)))
    return trials, wall, span


def run_journal(folder: Path, jobs: int, sampler: str, n: int, big: bool
                ) -> tuple[int, float, float]:
    name = f"j{jobs}-{sampler}"
    path = _study_file(folder, name, sampler=sampler, n_trials=n, big=big)
    label = str(folder / f"{name}.journal")
    start = time.perf_counter()
    _wait([_cli("run", str(path), "--jobs", str(jobs), "--storage", label)])
    wall = time.perf_counter() - start
    trials, span = _span(optuna.load_study(study_name=name, storage=open_storage(label,
                                                                                 create=False)))
    return trials, wall, span


def throughput(url: str | None, folder: Path, quick: bool) -> None:
    n = 100 if quick else 300
    print("\n## Trials per second (whole command / the study's own trials)\n")
    print("| storage | study | 1 worker | 2 workers | 4 workers |")
    print("|---|---|---|---|---|")
    for sampler in ("exhaustive", "random"):
        what = ("exhaustive, " + ("1,998" if quick else "11,856") + " strategies"
                if sampler == "exhaustive" else f"random, {n} trials")
        rows = [("journal (run --jobs N)", lambda w: run_journal(folder, w, sampler, n,
                                                                 not quick))]
        if url:
            rows.append(("PostgreSQL (N planner worker)",
                         lambda w: run_postgres(url, folder, w, sampler, n, not quick)))
        for label, fn in rows:
            cells = []
            for w in (1, 2, 4):
                trials, wall, span = fn(w)
                cells.append(f"{trials / wall:,.0f} / {trials / span:,.0f}")
            print(f"| {label} | {what} | " + " | ".join(cells) + " |", flush=True)


def _fill(storage: optuna.storages.BaseStorage, path: Path, n: int) -> None:
    """A sampler study holding ``n`` finished trials (cycling through the space) and one
    RUNNING trial, as a killed run leaves it, written with add_trials."""
    config = load_study_config(path)
    study = optuna.create_study(study_name=config.name, storage=storage)
    from planner.runner import _describe

    _describe(study, config)
    encoding, evaluator = LayoutEncoding(config.space), config.evaluator()
    valid = config.space.valid
    records = [evaluator(s) for s in valid]
    trials = [frozen_trial(records[i % len(valid)], encoding.params(valid[i % len(valid)]),
                           encoding.distributions) for i in range(n)]
    for i in range(0, n, 1000):
        if hasattr(storage, "add_trials_at_once"):
            storage.add_trials_at_once(study._study_id, trials[i:i + 1000])
        else:
            from planner.storage import batched

            with batched(storage):
                study.add_trials(trials[i:i + 1000])
    study.ask()  # the trial a killed process left RUNNING


def _back_at_work(where: str, path: Path) -> float:
    """Seconds from opening the storage to the point a resumed run starts new trials: the
    study loaded, its RUNNING trial failed and re-queued, the trials left to run counted."""
    from planner.runner import _remaining, open_study

    config = load_study_config(path)
    start = time.perf_counter()
    storage = open_storage(where, create=False)
    study, requeued = open_study(config, storage, where, resume=True)
    _remaining(study, storage, config)
    assert requeued == 1
    return time.perf_counter() - start


def resume(url: str | None, folder: Path) -> None:
    n = 10_000
    print(f"\n## Resuming a {n:,}-trial study (one trial left RUNNING by a killed run)\n")
    print("| storage | back at work (in-process) | `planner run --resume` (whole command,"
          " with the best-plans table) |")
    print("|---|---|---|")
    stores = [("journal", str(folder / "resume.journal"))] + ([("PostgreSQL", url)] if url
                                                              else [])
    for label, where in stores:
        paths = []
        for _ in range(2):
            name = f"resume-{uuid.uuid4().hex[:6]}"
            paths.append(_study_file(folder, name, sampler="random", n_trials=n, big=False))
            _fill(open_storage(where, create=True), paths[-1], n)
        back = _back_at_work(where, paths[0])
        start = time.perf_counter()
        _wait([_cli("run", str(paths[1]), "--resume", "--storage", where)])
        print(f"| {label} | {back:.1f} s | {time.perf_counter() - start:.1f} s |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", default=os.environ.get("PLANNER_TEST_POSTGRES"),
                        help="a PostgreSQL URL (default: $PLANNER_TEST_POSTGRES)")
    parser.add_argument("--quick", action="store_true", help="smaller studies")
    parser.add_argument("--only", choices=("throughput", "resume"))
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    print(f"{os.cpu_count()} cores; PostgreSQL: {'yes' if args.postgres else 'no (--postgres)'}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if args.postgres:
            with _schema(args.postgres) as url:
                if args.only != "resume":
                    throughput(url, folder, args.quick)
                if args.only != "throughput":
                    resume(url, folder)
        else:
            if args.only != "resume":
                throughput(None, folder, args.quick)
            if args.only != "throughput":
                resume(None, folder)


if __name__ == "__main__":
    main()
