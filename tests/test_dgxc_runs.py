"""NVIDIA's DGX Cloud benchmarks (NVIDIA/dgxc-benchmarking, releases 24.11.1-25.05.01): Llama
3.1 8B, 70B and 405B pre-trained with NeMo (Megatron-Core and Transformer Engine) on 8-2,304
H100s, BF16 and FP8, each plan weak-scaled over five or six GPU counts. Nothing is fit on them
(tests/data/validation/README.md, "NVIDIA's DGX Cloud benchmarks"). The issue's held-out
check asks for a mean error below 14% on multi-node runs and 8% on one node: on these runs, not
fit on, the multi-node runs meet it by far and the six one-node runs (Llama 3.1 8B, estimated
5-17% slow) do not."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from planner.cli import main

DATA = Path(__file__).parent / "data" / "validation"
FILE = str(DATA / "dgxc-h100-check.csv")
RUNS = 104  # the 104 Llama 3.1 H100 runs of the benchmarks' step-time tables
MAPE = 0.07  # measured 6.5%
MEDIAN = 0.065  # measured 5.9%
MULTI_NODE_MAPE = 0.07  # measured 6.2% over 98 runs (issue 14's multi-node target: 14%)
ONE_NODE_MAPE = 0.12  # measured 11.3% over 6 runs, Llama 3.1 8B (issue 14's one-node target: 8%)


def _data(capsys) -> dict:
    assert main(["validate", FILE, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _gpus(name: str) -> int:
    return int(name.rsplit(" x", 1)[1])


def test_every_run_is_expressed_and_its_error_held(capsys) -> None:
    data = _data(capsys)
    assert data["skipped"] == []
    assert data["step_time_runs"] == RUNS
    assert data["step_time_mape"] <= MAPE
    assert data["step_time_median_ape"] <= MEDIAN


def test_multi_node_and_one_node_errors(capsys) -> None:
    rows = _data(capsys)["rows"]
    multi = [abs(r["step_time_error"]) for r in rows if _gpus(r["name"]) > 8]
    one = [abs(r["step_time_error"]) for r in rows if _gpus(r["name"]) == 8]
    assert (len(multi), len(one)) == (98, 6)
    assert statistics.mean(multi) <= MULTI_NODE_MAPE <= 0.14
    assert statistics.mean(one) <= ONE_NODE_MAPE


def test_releases_and_precisions_are_not_plan_choices(capsys) -> None:
    # Each row's release names the benchmark release and the precision: one plan re-measured by
    # a later release, or the same plan in BF16 and FP8, is no choice between plans.
    data = _data(capsys)
    assert data["groups"] == []
