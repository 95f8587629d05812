"""AMD Instinct parts (`mi355x`, `mi350x`; `mi300x` since earlier) and their one-node systems
(studies/catalog/systems/amd.yaml), checked on MLPerf Training v5.1's Llama 3.1 8B runs on them
(tests/data/validation/mlperf-check.csv; README there, "AMD Instinct"). Nothing is fit on the
runs: the devices take the H100's constants with the GEMM rates scaled by measured matmul peaks."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from planner.catalog import load_catalog
from planner.cli import main
from simcore.collectives import collective_time
from simcore.network import Collective, Network

DATA = Path(__file__).parent / "data" / "validation"
GIB = 2**30


def test_the_mi355x_and_mi350x_entries() -> None:
    """stas00/ml-engineering@744d01e: MI355X 2.5 PFLOPS BF16 and 5 FP8 dense, 288 GB at 8 TB/s,
    1,024 Matrix Cores at 4 a CU; the MI350X the same silicon at 2,200 MHz against 2,400, its
    peaks scaled by the clock. The GEMM rates are h100-sxm's scaled by the measured maximum
    achievable matmul fraction of peak, MI355X 68.0% against the H100's 80.3%."""
    catalog = load_catalog()
    mi355x, mi350x, h100 = (catalog.device(n) for n in ("mi355x", "mi350x", "h100-sxm"))
    assert (mi355x.peak_flops_per_s, mi355x.fp8_peak_flops_per_s) == (2500e12, 5000e12)
    assert (mi355x.hbm_bytes, mi355x.hbm_bandwidth_bytes_per_s) == (288e9, 8000e9)
    assert mi355x.sm_count == 1024 // 4
    assert mi350x.peak_flops_per_s == pytest.approx(2500e12 * 2200 / 2400, rel=2e-4)
    assert mi350x.fp8_peak_flops_per_s == pytest.approx(5000e12 * 2200 / 2400, rel=2e-4)
    assert mi355x.matmul_efficiency == pytest.approx(0.605 * 68.0 / 80.3, abs=5e-4)
    assert mi355x.fused_matmul_efficiency == pytest.approx(0.666 * 68.0 / 80.3, abs=5e-4)
    assert h100.matmul_efficiency == 0.605 and h100.fused_matmul_efficiency == 0.666
    for field in ("matmul_efficiency", "fused_matmul_efficiency", "memory_efficiency",
                  "fused_attention_efficiency", "host_kernel_s", "transformer_engine"):
        assert getattr(mi350x, field) == getattr(mi355x, field), field


def _busbw(network: Network, size: int) -> float:
    """nccl-tests' / ml-engineering's bus bandwidth of an all-reduce: 2 (n - 1) / n x size / t."""
    n = network.npus
    return 2 * (n - 1) / n * size / collective_time(network, Collective.ALL_REDUCE, size).time_s


def test_the_infinity_fabric_link_as_fit() -> None:
    """ml-engineering@744d01e network/README.md ran all_reduce_bench.py on one 8 x MI300X node
    with a 4 GiB payload: busbw 47.671 GB/s over 2 GPUs and 312.912 over 8. Each GPU has its
    own link to each other (64 GB/s peak each way), so the node is a FullyConnected dimension
    with RCCL's direct all-reduce; its link, 46.8 GB/s, is the least-squares fit of the log of
    the two (-3.1% and +3.3%). MI355X / MI350X take it scaled by the peak per link: 76.5 / 64."""
    catalog = load_catalog()
    node = catalog.system("amd-mi300x-8").network
    (dim,) = node.dims
    assert dim.npus == 8 and dim.bandwidth_bytes_per_s == 46.8e9
    eight = _busbw(node, 4 * GIB) / 1e9
    two = _busbw(replace(node, dims=(replace(dim, npus=2),)), 4 * GIB) / 1e9
    # the least-squares fit leaves the two errors of opposite sign and alike (-3.1%, +3.3%)
    assert 0.0 < eight / 312.912 - 1 < 0.05
    assert -0.05 < two / 47.671 - 1 < 0.0
    assert abs(math.log(eight / 312.912)) < 0.035 and abs(math.log(two / 47.671)) < 0.035
    for name in ("amd-mi355x-8", "amd-mi350x-8"):
        (link,) = catalog.system(name).network.dims
        assert link.bandwidth_bytes_per_s == pytest.approx(46.8e9 * 76.5 / 64, rel=1e-3)


def test_the_steps_as_read_from_the_logs() -> None:
    """The logs print throughput a block: AMD's first MI355X run's second block is 12,288
    samples between block_start (1759966624658 ms) and block_stop (1759967026079 ms), 30.61 a
    second (the logged 30.619); its ten runs' medians put a step of 32 samples at 1.0427 s. The
    MI350X's logs 1.2842 s: 1.232 times the MI355X, where the clock scales the peak by 1.091."""
    assert round(12288 / ((1759967026079 - 1759966624658) / 1000), 2) == 30.61
    with (DATA / "mlperf-check.csv").open(newline="") as f:
        rows = {row["name"]: row for row in csv.DictReader(f)}
    mi355x = float(rows["mlperf v5.1 amd llama31-8b mi355x x8"]["step_time_s"])
    mi350x = float(rows["mlperf v5.1 amd llama31-8b mi350x x8"]["step_time_s"])
    assert mi355x == 1.0427 and round(32 / mi355x, 2) == 30.69
    assert round(mi350x / mi355x, 3) == 1.232 and round(2400 / 2200, 3) == 1.091
    for name in ("amd llama31-8b mi355x x8", "amd llama31-8b mi350x x8",
                 "gigacomputing llama31-8b mi355x x8"):
        row = rows["mlperf v5.1 " + name]
        assert (row["dp"], row["tp"], row["micro_batch"], row["global_batch"]) == (
            "8", "1", "2", "32")
        assert row["precision"] == "fp8" and row["framework"] == "megatron"


def test_the_amd_runs_as_estimated(capsys) -> None:
    """Not fit on: MI355X +3.3% (AMD) and -2.1% (GigaComputing's air-cooled node, measured 5.5%
    slower than AMD's), MI350X -10.8% (its 1,000 W hold it below the clock-scaled peak)."""
    assert main(["validate", str(DATA / "mlperf-check.csv"), "--json"]) == 0
    rows = {row["name"].removeprefix("mlperf v5.1 "): row
            for row in json.loads(capsys.readouterr().out)["rows"]}
    assert 0.02 <= rows["amd llama31-8b mi355x x8"]["step_time_error"] <= 0.045
    assert -0.035 <= rows["gigacomputing llama31-8b mi355x x8"]["step_time_error"] <= -0.01
    assert -0.12 <= rows["amd llama31-8b mi350x x8"]["step_time_error"] <= -0.095
    # one plan on one chip: the two MI355X nodes are estimated alike
    assert rows["amd llama31-8b mi355x x8"]["predicted_step_time_s"] == pytest.approx(
        rows["gigacomputing llama31-8b mi355x x8"]["predicted_step_time_s"])
