"""Which embedded storage records trials fastest here (issue 5: re-measure and choose).

Run: python benchmarks/bench_storage.py [--trials 2000]
Records the same finished trials (the Llama-3-70B / 1,024 H100 space's first N strategies, with
every estimate attribute) with Study.add_trials into: the batched journal file the planner uses,
Optuna's plain journal file, SQLite, and memory (the floor); then 100 random-sampler trials
through Study.optimize on each.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from planner.record import frozen_trial
from planner.runner import BATCH, _objective
from planner.storage import batched, open_storage
from planner.study_config import load_study_config
from search_spaces import LayoutEncoding

STUDY = Path(__file__).resolve().parent.parent / "studies" / "llama3-70b-h100-1024.yaml"


def storages(tmp: Path):
    yield "journal, batched (planner)", open_storage(str(tmp / "b.journal"), create=True)
    yield "journal, plain", JournalStorage(JournalFileBackend(str(tmp / "p.journal")))
    yield "sqlite", f"sqlite:///{tmp / 's.db'}"
    yield "memory", None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=2000)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    config = load_study_config(STUDY)
    enc = LayoutEncoding(config.space)
    strategies = config.space.enumerate()[: args.trials]
    ev = config.evaluator()
    trials = [frozen_trial(ev(s), enc.params(s), enc.distributions) for s in strategies]
    print(f"add_trials of {len(trials)} finished trials, batches of {BATCH}; then 100 random"
          " trials via optimize")
    with tempfile.TemporaryDirectory() as tmp:
        for name, storage in storages(Path(tmp)):
            study = optuna.create_study(storage=storage, study_name="a")
            target = storage if not isinstance(storage, str) else None
            start = time.perf_counter()
            for i in range(0, len(trials), BATCH):
                with batched(target):
                    study.add_trials(trials[i:i + BATCH])
            added = time.perf_counter() - start
            study2 = optuna.create_study(storage=storage, study_name="b",
                                         sampler=optuna.samplers.RandomSampler(seed=0))
            start = time.perf_counter()
            study2.optimize(_objective(config, target), n_trials=100)
            opt = time.perf_counter() - start
            print(f"  {name:<28} add_trials {len(trials) / added:8.0f} trials/s   optimize"
                  f" {100 / opt:6.1f} trials/s")


if __name__ == "__main__":
    main()
