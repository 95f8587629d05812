"""Timing of ``simcore.stage.astra_estimate`` (STAGE recomp -> ASTRA-sim replay).

Prints the median time of one estimate for GPT-175B (96 layers) on lab-system2 at dp=64 and
at dp=16 tp=4, and the total time of the 56-strategy lab design space (dp*tp*sp = 64, pp = 1,
activation_recompute 0/1, weight_sharded 0) for llama70b on lab-system1 and for gpt175b on
lab-system2 (strategies whose shapes do not divide raise ValueError and are counted).

    python benchmarks/bench_stage.py [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.catalog import load_catalog
from simcore.stage import StageArgs, astra_estimate

GPT175B = {"dmodel": 12288, "dff": 49152, "head": 96, "seq": 1024, "batch": 512, "din": 50257, "dout": 50257,
               "num_stacks": 96}
LLAMA70B = {"dmodel": 8192, "dff": 28672, "head": 64, "seq": 1024, "batch": 512, "din": 32000, "dout": 32000,
                "num_stacks": 80}
SYSTEMS = {"lab-system1": (450e12, 3000e9), "lab-system2": (45e12, 300e9)}


def _system(name: str):
    network = load_catalog().system(name).network
    peak, mem = SYSTEMS[name]
    return network, {"peak_ops_per_s": peak, "local_mem_bytes_per_s": mem}


def lab_space(npus: int = 64):
    pows = [1 << k for k in range(npus.bit_length()) if npus % (1 << k) == 0]
    out = []
    for dp in pows:
        for tp in pows:
            for sp in pows:
                if dp * tp * sp == npus:
                    for rc in (False, True):
                        out.append({"dp": dp, "tp": tp, "sp": sp, "pp": 1, "activation_recompute": rc,
                                        "weight_sharded": False})
    return out


def median_time(args: StageArgs, network, roofline, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        astra_estimate(args, network, **roofline)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def space_time(model: dict, network, roofline) -> tuple[float, int, int]:
    ok = bad = 0
    t0 = time.perf_counter()
    for strat in lab_space(network.npus):
        try:
            astra_estimate(StageArgs(**model, **strat), network, **roofline)
            ok += 1
        except ValueError:
            bad += 1
    return time.perf_counter() - t0, ok, bad


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=21)
    opts = parser.parse_args()
    net2, roof2 = _system("lab-system2")
    net1, roof1 = _system("lab-system1")
    for label, strat in (("dp=64", {"dp": 64}), ("dp=16 tp=4", {"dp": 16, "tp": 4})):
        try:
            t = median_time(StageArgs(**GPT175B, **strat), net2, roof2, opts.repeat)
        except ValueError as exc:  # din = dout = 50257 is odd: tp > 1 does not divide it
            print(f"gpt175b lab-system2 {label:<11} invalid: {exc}")
            continue
        print(f"gpt175b lab-system2 {label:<11} median of {opts.repeat}: {t * 1e3:9.3f} ms")
    for name, model, net, roof in (("llama70b", LLAMA70B, net1, roof1),
                                   ("gpt175b", GPT175B, net2, roof2)):
        total, ok, bad = space_time(model, net, roof)
        print(f"{name} {'lab-system1' if net is net1 else 'lab-system2'} 56-strategy space:"
              f" {total * 1e3:9.1f} ms total ({ok} valid, {bad} invalid)")


if __name__ == "__main__":
    main()
