"""InternLM's 2023 A100 throughput table as a check (tests/data/validation/internlm-check.csv;
README there, "InternLM's A100 runs"). Nothing is fit on them.

InternLM/InternLM@c18bec9 ``doc/en/train_performance.md``: InternLM-7B on 8 to 1,024 A100 SXM4
80GB (4 x 100G RoCE a node), four plans at each GPU count, tokens a GPU a second (TGS) with 16,384
tokens a GPU a step (micro_num 4 x micro_bsz 2 x 2,048 at tp 1; micro_bsz 4 at tp 2, over 2 GPUs).
"""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import simcore
from planner.calibration import calibrate
from planner.catalog import load_catalog
from planner.cli import main
from planner.runs_csv import read_runs
from planner.study_config import load_study_config
from planner.validation import validate

DATA = Path(__file__).parent / "data" / "validation"

# What the estimate reaches on the 32 runs (held so that a modelling change that loses accuracy
# fails): measured 12.2% MAPE, 10.5% median error; regret 0.05% over 8 groups (0.4% at 8 GPUs,
# where two rows are one plan measured twice), Kendall tau 0.83.
INTERNLM_MAPE = 0.13
INTERNLM_MEDIAN = 0.11
INTERNLM_REGRET = 0.005


def _data(capsys) -> dict:
    assert main(["validate", str(DATA / "internlm-check.csv"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["skipped"] == [] and data["step_time_runs"] == 32
    return data


def test_step_times_from_the_table() -> None:
    """The table's 1,024-GPU tp 1 figures: 3,625 TGS sharded within the node, 2,271 over all of
    dp: 16,384 / 3,625 = 4.520 s and 16,384 / 2,271 = 7.214 s a step. A GPU count is one
    plan-choice group: tp 1 runs dp 1,024 x 2 x 4 = 8,192 sequences, tp 2 dp 512 x 4 x 4 =
    8,192."""
    with (DATA / "internlm-check.csv").open(newline="") as f:
        rows = {row["name"]: row for row in csv.DictReader(f)}
    assert len(rows) == 32
    assert float(rows["InternLM 7B x1024 tp1 zero1=8"]["step_time_s"]) == round(16384 / 3625, 4)
    assert float(rows["InternLM 7B x1024 tp1 zero1=-1"]["step_time_s"]) == round(16384 / 2271, 4)
    tp1, tp2 = rows["InternLM 7B x1024 tp1 zero1=8"], rows["InternLM 7B x1024 tp2 zero1=4"]
    assert int(tp1["global_batch"]) == 1024 * 2 * 4 == int(tp2["global_batch"]) == 512 * 4 * 4
    # zero1=8 at tp 1 is the optimizer sharded within the node's 8 ranks; on one node that is
    # the whole dp group, plain ZeRO-1
    assert tp1["shard_group"] == "8" and tp2["shard_group"] == "4"
    assert rows["InternLM 7B x8 tp1 zero1=8"]["shard_group"] == ""


def test_error_and_plan_choice(capsys) -> None:
    data = _data(capsys)
    assert data["step_time_mape"] <= INTERNLM_MAPE
    assert data["step_time_median_ape"] <= INTERNLM_MEDIAN
    assert data["regret_mean"] <= INTERNLM_REGRET
    # the measured fastest plan, tp 1 with the optimizer sharded within the node, is the one
    # picked at every GPU count from 16 (at 8 its twin, the same plan, is)
    groups = {g["key"]["system"]: g for g in data["groups"]}
    assert len(groups) == 8
    for system, g in groups.items():
        assert g["fastest"].endswith("tp1 zero1=8")
        if system != "internlm-a100-8":
            assert g["picked"] == g["fastest"]


def test_the_broadcast_gather_is_not_modelled(capsys) -> None:
    """Sharded over all 1,024 ranks InternLM gathers the weights with 1,024 broadcasts; measured
    60% slower than sharded within the node (7.21 s against 4.52), estimated 6% (its
    hierarchical all-gather of the same bytes): the row is 41% fast. Within the node the rows
    stay within 14%."""
    rows = {row["name"]: row for row in _data(capsys)["rows"]}
    assert rows["InternLM 7B x1024 tp1 zero1=-1"]["step_time_error"] < -0.35
    node = [row["step_time_error"] for name, row in rows.items()
            if name.endswith(("zero1=8", "zero1=4"))]
    assert len(node) == 16 and all(-0.14 < e < 0 for e in node)


def test_the_cluster_entry() -> None:
    """studies/catalog/systems/internlm.yaml: the DGX A100 node, and between nodes the ABCI A100
    fit (7.57 GB/s a GPU with 4 x 200G ports per 8 GPUs, systems/dgx.yaml's header) at 4 x 100G:
    7.57 x 100 / 200 = 3.79 GB/s; sends at half of a 100G port's 12 GB/s (two GPUs a port)."""
    catalog = load_catalog()
    node, roce = catalog.system("internlm-a100-1024").network.dims
    assert roce.npus == 128 and node.npus == 8
    assert roce.bandwidth_bytes_per_s == round(7.57 * 100 / 200, 2) * 1e9
    assert roce.p2p_bandwidth_bytes_per_s == 12e9 / 2
    assert node == catalog.system("dgx-a100-1024").network.dims[0]
    assert catalog.system("internlm-a100-1024").device.name == "a100-80gb"


def test_the_roce_study_shards_the_optimizer_within_the_node() -> None:
    """studies/llama2-7b-a100-roce-1024.yaml: Llama 2 7B on the same cluster at one sequence of
    4,096 a GPU. Every fastest plan shards the optimizer within groups: the best, dp 1,024 with
    groups of 8 (a node), runs 1.19 s against 1.38 s for the same plan sharded over all 1,024
    (a hierarchical reduce-scatter and all-gather across 128 nodes, where within a node only each
    rank's eighth is all-reduced across them). The direction InternLM measured on its 7B."""
    config = load_study_config(Path(__file__).parents[1] / "studies"
                               / "llama2-7b-a100-roce-1024.yaml")
    assert config.space.framework == "megatron" and config.system.name == "internlm-a100-1024"
    times = {s: simcore.estimate(config.model, config.system, config.training, s).step_time
             for s in config.space.valid}
    assert len(times) == 135
    best = min(times, key=times.__getitem__)
    assert (best.dp, best.tp, best.micro_batch, best.shard_group) == (1024, 1, 1, 8)
    whole = replace(best, shard_group=None)
    assert times[whole] > 1.1 * times[best]


def test_calibrating_the_a100_on_a_fifth_improves_the_rest() -> None:
    """Issue 14's check of `planner calibrate` on a set the shipped A100 was not fit on: fit on
    every fifth InternLM run (offset 0: 7 runs), the other 25 go from 12.4% MAPE to under 7%
    (measured 5.8%; `python benchmarks/bench_calibrate_fifths.py --case
    internlm-check.csv:a100-80gb`: 11.2-12.9% -> 4.3-6.0% over the five offsets)."""
    runs, _ = read_runs(DATA / "internlm-check.csv", load_catalog())
    fifth, rest = runs[::5], [r for i, r in enumerate(runs) if i % 5]
    start = runs[0].system.device
    fit = calibrate(fifth, start, "a100-internlm", trials=120)
    before = validate(rest, system_for=lambda r: replace(r.system, device=start)).summary()
    after = validate(rest, system_for=lambda r: replace(r.system, device=fit.device)).summary()
    assert before["step_time_mape"] > 0.11
    assert after["step_time_mape"] < 0.07
