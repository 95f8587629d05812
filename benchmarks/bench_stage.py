"""Timing of the ``stage`` convention (STAGE recomp's rank graph replayed as ASTRA-sim would).

Prints, for llama70b on lab-system1 and gpt175b (vocabulary padded to 50304) on lab-system2, the
time of the ASTRA-sim lab's study loop: ``estimate_stage`` for every dp * tp * sp = 64 split,
recompute off and on (56 strategies; STAGE takes splits that do not divide, so all of them
run). "first pass" runs the loop in a fresh interpreter (what a new study pays, including the
layouts it builds once); "again" is the best of ``--repeat`` further passes. Then the median time
of one estimate for gpt175b on lab-system2 at dp=64 and at dp=16 tp=4.

    python benchmarks/bench_stage.py [--repeat N]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.catalog import load_catalog
from simcore.specs import ModelSpec, Recompute, Strategy, SystemSpec, TrainingSpec
from simcore.stage_adapter import estimate_stage

TRAINING = TrainingSpec(global_batch=512, seq_len=1024)
STUDIES = {"llama70b": ("lab-system1", None), "gpt175b": ("lab-system2", 50304)}
"""Model -> (system, padded vocabulary or None)."""


def _study(name: str) -> tuple[ModelSpec, SystemSpec]:
    catalog = load_catalog()
    system, vocab = STUDIES[name]
    model = catalog.model(name)
    if vocab is not None:
        model = dataclasses.replace(model, vocab=vocab)
    return model, catalog.system(system)


def lab_space(npus: int = 64) -> list[Strategy]:
    pows = [2**i for i in range(npus.bit_length()) if npus % 2**i == 0]
    return [Strategy(dp=dp, tp=tp, sp=sp, recompute=r)
            for dp, tp, sp in itertools.product(pows, repeat=3) if dp * tp * sp == npus
            for r in (Recompute.NONE, Recompute.FULL)]


def space_time(model: ModelSpec, system: SystemSpec) -> tuple[float, float, int, int]:
    """Wall and CPU seconds of one pass over the study, and the valid / invalid counts."""
    ok = bad = 0
    wall, cpu = time.perf_counter(), time.process_time()
    for strategy in lab_space(system.devices):
        try:
            estimate_stage(model, system, TRAINING, strategy)
            ok += 1
        except ValueError:
            bad += 1
    return time.perf_counter() - wall, time.process_time() - cpu, ok, bad


def first_pass(name: str) -> tuple[float, float, int, int]:
    """:func:`space_time` in a fresh interpreter (nothing built yet)."""
    out = subprocess.run([sys.executable, __file__, "--first-pass", name], check=True,
                         capture_output=True, text=True).stdout
    return tuple(json.loads(out))  # type: ignore[return-value]


def median_time(model: ModelSpec, system: SystemSpec, strategy: Strategy, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        estimate_stage(model, system, TRAINING, strategy)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--first-pass", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.first_pass:  # the child of first_pass()
        print(json.dumps(space_time(*_study(opts.first_pass))))
        return
    for name, (system_name, _) in STUDIES.items():
        wall, cpu, ok, bad = first_pass(name)
        model, system = _study(name)
        again = min((space_time(model, system) for _ in range(opts.repeat)), key=lambda r: r[0])
        print(f"{name} {system_name} 56-strategy study: first pass {wall * 1e3:7.1f} ms"
              f" (CPU {cpu * 1e3:7.1f} ms), again best of {opts.repeat} {again[0] * 1e3:7.1f} ms"
              f" (CPU {again[1] * 1e3:7.1f} ms); {ok} valid, {bad} invalid")
    model, system = _study("gpt175b")
    for label, strategy in (("dp=64", Strategy(dp=64)), ("dp=16 tp=4", Strategy(dp=16, tp=4))):
        t = median_time(model, system, strategy, 21)
        print(f"gpt175b lab-system2 {label:<11} one estimate, median of 21: {t * 1e3:8.3f} ms")


if __name__ == "__main__":
    main()
