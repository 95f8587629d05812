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
from simcore.megatron.placement import AxisNetworks
from simcore.network import Collective, Network
from simcore.specs import Axis, SystemSpec

DATA = Path(__file__).parent / "data" / "nccl_tests.csv"
CATALOG = load_catalog()
ROWS = list(csv.DictReader(DATA.open()))
KIB, MIB, GIB = 2**10, 2**20, 2**30


def _abci(nodes: int = 2) -> SystemSpec:
    """A100 nodes with 4 HDR HCAs per 8 GPUs (ABCI; nccl-tests issue 119's servers): half a
    DGX's network bandwidth."""
    system = CATALOG.system("dgx-a100-16")
    node, ib = system.network.dims
    ib = replace(ib, npus=nodes, bandwidth_bytes_per_s=ib.bandwidth_bytes_per_s / 2)
    return replace(system, network=Network(dims=(node, ib), scheduling=system.network.scheduling))


def _model_s(system: SystemSpec, size: int,
             collective: Collective = Collective.ALL_REDUCE) -> float:
    """The time of a collective of nccl-tests' ``size`` (all-gather: the gathered output, which
    is the ranks' inputs together) as the estimate prices it for a group of every GPU of the
    system (simcore.megatron.placement.AxisNetworks: the chunked schedule plus the call
    latencies, or for an all-reduce the switch's own where it is faster)."""
    network = system.network
    if collective is Collective.ALL_GATHER:
        size //= network.npus
    degrees = {Axis.TP: 1, Axis.SP: 1, Axis.DP: network.npus, Axis.PP: 1}
    group = AxisNetworks(network, degrees, (Axis.TP, Axis.SP, Axis.DP, Axis.PP))
    return group.collective(Axis.DP, collective, size)


def _mean_error(role: str, system: SystemSpec, low: int, high: int) -> float:
    rows = [(int(r["size_bytes"]), float(r["time_us"]) * 1e-6, Collective(r["collective"]))
            for r in ROWS if r["role"] == role and low <= int(r["size_bytes"]) <= high]
    assert rows, role
    assert all(int(r["gpus"]) == system.network.npus for r in ROWS if r["role"] == role)
    return statistics.fmean(abs(math.expm1(math.log(_model_s(system, s, c) / t)))
                            for s, t, c in rows)


# (role, system, size range, bound): fit figures as dgx.yaml states them, plus a margin; the
# check tables with their measured error, plus a margin.
CASES = [
    ("a100-node-fit", "dgx-a100-8", 256 * KIB, GIB, 0.15),
    ("a100-node-check", "dgx-a100-8", 256 * KIB, GIB, 0.45),  # 39%: the two tables differ 2x
    ("a100-ib-fit", "abci", 256 * KIB, GIB, 0.20),
    ("a100-ib-check", "dgx-a100-16", GIB, 16 * GIB, 0.12),  # OCI, +7% and +9%
    # nccl-tests issue 119, 3 nodes: +34%. The hierarchical schedule's step between nodes grows
    # with their number where NCCL's ring does not (dgx.yaml's header); not changed.
    ("a100-ib4-n3-check", "abci-3", 64 * MIB, GIB, 0.40),
    # The H100 node's ring rate (all-gather, reduce-scatter, an all-reduce of 2-4 GPUs) fit on
    # the 4-GPU table of the three: 12.8%, all-gathers fast by 12-30%, all-reduces slow by 0-21%
    ("h100-ring-fit", "dgx-h100-4", 256 * KIB, GIB, 0.15),
    ("h100-ring-check", "dgx-h100-2", 256 * MIB, 8 * GIB, 0.06),  # 2 GPUs: 4.2%
    # NVLink SHARP (nvls), the ring's rate held: fit on the 8-GPU table, 7.1%
    ("h100-node-fit", "dgx-h100-8", 256 * KIB, GIB, 0.10),
    ("h100-node-check", "dgx-h100-8", 128 * MIB, 4 * GIB, 0.05),  # nccl-tests issue 290: 2.6%
    ("h100-nvls-check", "dgx-h100-6", 256 * MIB, 8 * GIB, 0.05),  # 6 GPUs: 2.7%
    # Two nodes: 8.0% and 9.8%, where they were 1.4% and 6% with the node's old all-reduce rate.
    # The switch's all-reduce inside each node now paces these (placement.switch_reduced), so
    # InfiniBand's 42.5 GB/s is kept as it was fit, not re-identified from this table.
    ("h100-ib-fit", "dgx-h100-16", 256 * MIB, 8 * GIB, 0.09),
    ("h100-ib-check", "dgx-h100-16", 2 * GIB, 16 * GIB, 0.11),  # the log is erratic below 1 GiB
    # NVIDIA/nccl-tests issue 309's two HGX H100 hosts (8 x 400G each, NCCL 2.26.2): 8.4% from
    # 32 MiB to 16 GiB (-5.9..+12.4%). Below 32 MiB the estimate is 1.2-2.3x slow (166 us at 1
    # MiB against 72): the chunked hierarchical schedule's latencies against NCCL's NVLSTree;
    # kept, as training's short collectives are where the estimate already runs fast
    # (tests/data/validation/README.md, "Short steps at large data parallelism").
    ("h100-ib2-check", "dgx-h100-16", 32 * MIB, 16 * GIB, 0.10),
]


@pytest.mark.parametrize(("role", "system", "low", "high", "bound"), CASES,
                         ids=[c[0] for c in CASES])
def test_all_reduce_time_against_nccl_tests(role: str, system: str, low: int, high: int,
                                            bound: float) -> None:
    if system.startswith("abci"):
        spec = _abci(int(system[5:] or 2))
    elif system == "dgx-h100-6":  # 6 GPUs of a node: the catalog has 1, 2, 4 and 8
        node = CATALOG.system("dgx-h100-8")
        spec = replace(node, network=Network(dims=(replace(node.network.dims[0], npus=6),),
                                             scheduling=node.network.scheduling))
    else:
        spec = CATALOG.system(system)
    assert _mean_error(role, spec, low, high) <= bound


def test_small_messages_pay_the_call_latency() -> None:
    # An 8-byte all-reduce on one DGX A100 costs at least the 10.8 us per call NCCL's latency
    # fit gives; the nccl-tests tables measured 18-40 us there.
    assert _model_s(CATALOG.system("dgx-a100-8"), 8) >= 10.8e-6


# Jean Zay's links (studies/catalog/systems/jean-zay.yaml), fit on BigScience's all_reduce_bench.py
# runs on that cluster (one 4e9-byte fp32 all-reduce per trial; the median duration is the
# table's time): the V100 node on its 1-node run, Omni-Path between V100 nodes on the 4-node
# run, checked on the 16-node run; Omni-Path between A100 nodes on its 4-node run.


def _jean_zay(family: str, nodes: int) -> SystemSpec:
    """The catalog's ``family`` (``jean-zay-a100``) at ``nodes`` nodes."""
    per_node = CATALOG.families[f"{family}-{{gpus}}"].per_node
    return CATALOG.system(f"{family}-{per_node * nodes}")


JEAN_ZAY_CASES = [
    ("jz-v100-node-fit", "jean-zay-v100-32gb", 1, 0.01),
    ("jz-v100-opa-fit", "jean-zay-v100-32gb", 4, 0.01),
    ("jz-v100-opa-check", "jean-zay-v100-32gb", 16, 0.25),  # 23% fast: 16 nodes, 8 months apart
    ("jz-a100-opa-fit", "jean-zay-a100", 4, 0.01),
]


@pytest.mark.parametrize(("role", "system", "nodes", "bound"), JEAN_ZAY_CASES,
                         ids=[c[0] for c in JEAN_ZAY_CASES])
def test_jean_zay_links_against_bigscience_all_reduce_bench(role: str, system: str, nodes: int,
                                                             bound: float) -> None:
    spec = _jean_zay(system, nodes)
    assert spec.network.npus == int(next(r["gpus"] for r in ROWS if r["role"] == role))
    assert _mean_error(role, spec, 0, 16 * GIB) <= bound


def test_jean_zay_omni_path_is_far_below_its_line_rate() -> None:
    # 4 x 100 Gb/s Omni-Path per A100 node is 6.25 GB/s per GPU; NCCL reached a busbw of
    # 5.07 GB/s on the ring over 32 GPUs (the table): the hierarchical schedule's per-GPU share
    # of the node's links is below a tenth of the line rate.
    _, opa = _jean_zay("jean-zay-a100", 4).network.dims
    assert opa.bandwidth_bytes_per_s < 0.1 * 6.25e9
