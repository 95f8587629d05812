"""The DGX systems' links against published nccl-tests all-reduce tables
(tests/data/nccl_tests.csv; sources in its `source` column, fit / check roles as
studies/catalog/systems/dgx.yaml describes). A collective over a whole system costs the
ASTRA-sim-style chunked schedule plus each dimension's per-call latency."""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from planner.catalog import load_catalog
from simcore.collectives import collective_time
from simcore.network import Collective, Network
from simcore.specs import SystemSpec

DATA = Path(__file__).parent / "data" / "nccl_tests.csv"
CATALOG = load_catalog()
ROWS = list(csv.DictReader(DATA.open()))
KIB, MIB, GIB = 2**10, 2**20, 2**30


def _abci() -> SystemSpec:
    """Two A100 nodes with 4 HDR HCAs per 8 GPUs (ABCI): half a DGX's network bandwidth."""
    system = CATALOG.system("dgx-a100-16")
    node, ib = system.network.dims
    ib = replace(ib, bandwidth_bytes_per_s=ib.bandwidth_bytes_per_s / 2)
    return replace(system, network=Network(dims=(node, ib), scheduling=system.network.scheduling))


def _model_s(system: SystemSpec, size: int) -> float:
    network = system.network
    return (collective_time(network, Collective.ALL_REDUCE, size).time_s
            + sum(d.call_latency_s for d in network.dims))


def _mean_error(role: str, system: SystemSpec, low: int, high: int) -> float:
    pairs = [(int(r["size_bytes"]), float(r["time_us"]) * 1e-6) for r in ROWS
             if r["role"] == role and low <= int(r["size_bytes"]) <= high]
    assert pairs, role
    return statistics.fmean(abs(math.expm1(math.log(_model_s(system, s) / t))) for s, t in pairs)


# (role, system, size range, bound): fit figures as dgx.yaml states them, plus a margin; the
# check tables with their measured error, plus a margin.
CASES = [
    ("a100-node-fit", "dgx-a100-8", 256 * KIB, GIB, 0.15),
    ("a100-node-check", "dgx-a100-8", 256 * KIB, GIB, 0.45),  # 39%: the two tables differ 2x
    ("a100-ib-fit", "abci", 256 * KIB, GIB, 0.20),
    ("a100-ib-check", "dgx-a100-16", GIB, 16 * GIB, 0.12),  # OCI, +7% and +9%
    ("h100-node-fit", "dgx-h100-8", 256 * KIB, GIB, 0.15),
    ("h100-node-check", "dgx-h100-8", 128 * MIB, 4 * GIB, 0.10),  # nccl-tests issue 290: 5%
    ("h100-ib-fit", "dgx-h100-16", 256 * MIB, 8 * GIB, 0.05),
    ("h100-ib-check", "dgx-h100-16", 2 * GIB, 16 * GIB, 0.08),  # the log is erratic below 1 GiB
]


@pytest.mark.parametrize(("role", "system", "low", "high", "bound"), CASES,
                         ids=[c[0] for c in CASES])
def test_all_reduce_time_against_nccl_tests(role: str, system: str, low: int, high: int,
                                            bound: float) -> None:
    spec = _abci() if system == "abci" else CATALOG.system(system)
    assert _mean_error(role, spec, low, high) <= bound


def test_small_messages_pay_the_call_latency() -> None:
    # An 8-byte all-reduce on one DGX A100 costs at least the 10.8 us per call NCCL's latency
    # fit gives; the nccl-tests tables measured 18-40 us there.
    assert _model_s(CATALOG.system("dgx-a100-8"), 8) >= 10.8e-6
