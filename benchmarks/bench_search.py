"""Search quality and sampler throughput (issue 5's figures).

Run: python benchmarks/bench_search.py [--seeds 5] [--quick]
1. Quality: on Llama-3-70B / 1,024 H100s (studies/llama3-70b-h100-1024.yaml, 11,856 valid
   strategies, HBM 80 GB as a constraint), the exhaustive optimum is found first; then for each
   sampler and seed, the number of trials until a feasible trial is within 1% of it. Budget: 5%
   of the space (593 trials; GP 200, as each of its trials costs about a second here). The table
   gives the median over seeds (">B" when a run never got there within its budget B).
   Encoding: the degrees as one categorical over valid (dp, tp, pp, sp) layouts; the other knobs
   one categorical each (search_spaces/encoding.py).
2. Throughput: trials per second of each sampler on the embedded journal storage, serial and with
   2 worker processes (200 trials; GP 40), start-up included.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import optuna

from planner.runner import _objective, make_sampler, run_study
from planner.storage import open_storage
from planner.study_config import load_study_config

STUDY = Path(__file__).resolve().parent.parent / "studies" / "llama3-70b-h100-1024.yaml"
SAMPLERS = ("tpe", "nsga2", "gp", "random")


def optimum(config) -> float:
    ev = config.evaluator()
    return min(r.values[0] for r in map(ev, config.space.enumerate())
               if r.user_attrs["feasible"])


def trials_to_reach(config, sampler: str, seed: int, target: float, budget: int) -> int | None:
    study = optuna.create_study(sampler=make_sampler(sampler, seed))
    objective = _objective(config)
    for i in range(budget):
        trial = study.ask()
        value = objective(trial)
        study.tell(trial, value)
        if trial.user_attrs["feasible"] and value <= target:
            return i + 1
    return None


def quality(config, seeds: int, quick: bool) -> None:
    best = optimum(config)
    n = len(config.space.valid)
    budget = round(0.05 * n)
    print(f"space {n:,} valid strategies; exhaustive optimum {best:.4f} s; within 1%:"
          f" <= {best * 1.01:.4f} s; 5% of the space = {budget} trials")
    print(f"{'sampler':<8} {'median trials':>14} {'% of space':>10}  per seed")
    for sampler in SAMPLERS:
        cap = min(budget, 200 if sampler == "gp" else budget)
        if quick:
            cap = min(cap, 60)
        runs = [trials_to_reach(config, sampler, seed, best * 1.01, cap) for seed in range(seeds)]
        keyed = sorted((r if r is not None else cap + 1) for r in runs)
        med = statistics.median(keyed)
        shown = f">{cap}" if med > cap else f"{med:g}"
        pct = "-" if med > cap else f"{med / n:.2%}"
        per = ", ".join(str(r) if r is not None else f">{cap}" for r in runs)
        print(f"{sampler:<8} {shown:>14} {pct:>10}  {per}")


def throughput(config, quick: bool) -> None:
    print("trials/s on the journal storage (start-up included)")
    for sampler in SAMPLERS:
        n = 40 if sampler == "gp" else 200
        if quick:
            n = 10
        rates = []
        for jobs in (1, 2):
            with tempfile.TemporaryDirectory() as tmp:
                label = str(Path(tmp) / "s.journal")
                c = replace(config, sampler=sampler, n_trials=n, name=f"t-{sampler}-{jobs}",
                            path=Path(tmp) / "study.yaml")
                c.path.write_text(STUDY.read_text().replace("sampler: exhaustive",
                                  f"sampler: {sampler}\nn_trials: {n}\nname: {c.name}"))
                start = time.perf_counter()
                run_study(c, open_storage(label, create=True), label, jobs=jobs, progress=False)
                rates.append(n / (time.perf_counter() - start))
        print(f"  {sampler:<8} serial {rates[0]:7.1f}   --jobs 2 {rates[1]:7.1f}   ({n} trials)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="tiny budgets, to check it runs")
    parser.add_argument("--only", choices=["quality", "throughput"])
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    config = load_study_config(STUDY)
    if args.only != "throughput":
        quality(config, args.seeds, args.quick)
    if args.only != "quality":
        throughput(config, args.quick)


if __name__ == "__main__":
    main()
