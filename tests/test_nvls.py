"""NVLink SHARP's all-reduce (a dimension's ``nvls``): NCCL runs a ring for all-gathers,
reduce-scatters and an all-reduce of 2-4 GPUs on an H100 NVSwitch node, and NVLS, the switch
reducing, for an all-reduce of 6 GPUs or more (waynehacking8/nccl-collectives-bench@38c093ed
results/scaling_attributed/report.md, NCCL's tuning log). The DGX H100 node (systems/dgx.yaml):
the ring at 392 GB/s, NVLS at 270 GB/s of the tensor plus 89 us a call, from 6 GPUs; their fits
against nccl-tests are in tests/test_dgx_links.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from planner.catalog import load_catalog, system_from_entry
from planner.catalog_write import system_entry
from planner.errors import PlannerUsageError
from planner.exports._astra import caveats
from planner.plan import make_plan
from simcore.collectives import collective_time
from simcore.megatron.placement import AxisNetworks, switch_all_reduce_s, switch_reduced
from simcore.network import Collective, Network, SwitchAllReduce
from simcore.specs import Axis, Convention, Strategy, TrainingSpec

CATALOG = load_catalog()
H100_8 = CATALOG.system("dgx-h100-8")
NODE = H100_8.network.dims[0]
GB, MIB = 1e9, 2**20
PLACEMENT = (Axis.TP, Axis.SP, Axis.DP, Axis.PP)


def _tp(network: Network, tp: int) -> AxisNetworks:
    return AxisNetworks(network, {Axis.TP: tp, Axis.SP: 1, Axis.DP: 1, Axis.PP: 1}, PLACEMENT)


def _ring_s(npus: int, collective: Collective, size: int) -> float:
    """The ring on ``npus`` GPUs of the node, plus its call latency (as AxisNetworks adds it)."""
    network = Network(dims=(replace(NODE, npus=npus),), scheduling=H100_8.network.scheduling)
    return collective_time(network, collective, size).time_s + NODE.call_latency_s


def test_the_dgx_h100_node_has_both_rates() -> None:
    assert NODE.bandwidth_bytes_per_s == pytest.approx(392 * GB)
    assert NODE.nvls == SwitchAllReduce(bandwidth_bytes_per_s=270 * GB, latency_s=89e-6,
                                        min_npus=6)


def test_a_large_all_reduce_of_eight_gpus_is_the_switchs() -> None:
    # 256 MiB: 89 us + 268,435,456 B / 270 GB/s = 89 + 994.2 = 1,083.2 us; measured 1,077.1 us
    # on 8 H200 (stas00/ml-engineering, tests/data/nccl_tests.csv h100-node-fit); the ring alone
    # at 392 GB/s sends 2 x 7/8 of it, about 1.2 ms and more
    size = 256 * MIB
    got = _tp(H100_8.network, 8).collective(Axis.TP, Collective.ALL_REDUCE, size)
    assert got == pytest.approx(89e-6 + size / 270e9, rel=1e-12)
    assert _ring_s(8, Collective.ALL_REDUCE, size) > 1.1 * got


def test_a_small_all_reduce_stays_on_the_ring() -> None:
    # 64 KiB: the switch's 89 us fixed cost against the ring's ~12 us call and hops
    size = 64 * 1024
    got = _tp(H100_8.network, 8).collective(Axis.TP, Collective.ALL_REDUCE, size)
    assert got == pytest.approx(_ring_s(8, Collective.ALL_REDUCE, size), rel=1e-12)
    assert got < 89e-6


def test_four_gpus_and_the_other_collectives_run_the_ring() -> None:
    # NCCL picks the ring at 4 GPUs (the report's tuning log), and for all-gather and
    # reduce-scatter at any size
    size = 256 * MIB
    four = _tp(Network(dims=(replace(NODE, npus=4),), scheduling=H100_8.network.scheduling), 4)
    assert four.collective(Axis.TP, Collective.ALL_REDUCE, size) == pytest.approx(
        _ring_s(4, Collective.ALL_REDUCE, size), rel=1e-12)
    eight = _tp(H100_8.network, 8)
    for collective in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER):
        assert eight.collective(Axis.TP, collective, size) == pytest.approx(
            _ring_s(8, collective, size), rel=1e-12)
    assert switch_all_reduce_s(four.networks[Axis.TP], size) == float("inf")


def test_across_nodes_the_node_phases_run_at_the_switchs_rate() -> None:
    # Two DGX H100: the node's reduce-scatter and all-gather phases of the hierarchical
    # all-reduce, (n - 1) / n of the data each, take the switch's all-reduce time at a link of
    # 2 (n - 1) / n x 270 = 472.5 GB/s; InfiniBand is unchanged
    network = CATALOG.system("dgx-h100-16").network
    reduced = switch_reduced(network)
    assert reduced is not None
    node, ib = reduced.dims
    assert node.bandwidth_bytes_per_s == pytest.approx(2 * 7 / 8 * 270 * GB)
    assert node.nvls is None and ib == network.dims[1]
    nets = AxisNetworks(network, {Axis.TP: 1, Axis.SP: 1, Axis.DP: 16, Axis.PP: 1}, PLACEMENT)
    size = 1024 * MIB
    calls = sum(d.call_latency_s for d in network.dims)
    assert nets.collective(Axis.DP, Collective.ALL_REDUCE, size) == pytest.approx(
        collective_time(reduced, Collective.ALL_REDUCE, size).time_s + calls, rel=1e-12)
    ring = collective_time(network, Collective.ALL_REDUCE, size).time_s + calls
    assert nets.collective(Axis.DP, Collective.ALL_REDUCE, size) < ring
    # ASTRA-sim's systems and A100 nodes have no nvls: nothing changes
    assert switch_reduced(CATALOG.system("dgx-a100-16").network) is None


def test_nvls_survives_a_catalog_round_trip() -> None:
    entry = system_entry(H100_8, device="h100-sxm")
    assert entry["network"][0]["nvls"] == {"bandwidth_gbps": 270, "latency_us": 89,
                                           "min_npus": 6}
    copy = system_from_entry(Path("copy.yaml"), "copy", entry, {"h100-sxm": H100_8.device})
    assert copy.network.dims[0].nvls == NODE.nvls


@pytest.mark.parametrize(("nvls", "field"), [
    ({"bandwidth_gbps": 0, "latency_us": 89, "min_npus": 6}, "nvls.bandwidth_gbps"),
    ({"bandwidth_gbps": 270, "latency_us": -1, "min_npus": 6}, "nvls.latency_us"),
    ({"bandwidth_gbps": 270, "latency_us": 89, "min_npus": 1}, "nvls.min_npus"),
    ({"bandwidth_gbps": 270, "latency_us": 89}, "nvls"),
    ({"bandwidth_gbps": 270, "latency_us": 89, "min_npus": 6, "algo": "x"}, "nvls"),
])
def test_a_bad_nvls_is_one_line_naming_the_field(nvls: dict, field: str) -> None:
    entry = system_entry(H100_8, device="h100-sxm")
    entry["network"][0]["nvls"] = nvls
    with pytest.raises(PlannerUsageError, match=rf"bad\.network\[0\]\.{field}"):
        system_from_entry(Path("bad.yaml"), "bad", entry, {"h100-sxm": H100_8.device})


def test_the_astra_export_says_it_is_not_written() -> None:
    # ASTRA-sim's network.yml has one bandwidth a dimension: the ring's is written, and the
    # export's README says so
    plan = make_plan(CATALOG.model("llama3-8b"), H100_8, TrainingSpec(global_batch=64,
                     seq_len=2048), Strategy(dp=8), Convention.MEGATRON)
    text = " ".join(" ".join(caveats(plan)).split())
    assert "an all-reduce the switch reduces (nvls: NVLink SHARP)" in text
    plain = replace(H100_8, network=Network(dims=(replace(NODE, nvls=None),),
                                            scheduling=H100_8.network.scheduling))
    plan = make_plan(plan.model, plain, plan.training, plan.strategy, Convention.MEGATRON)
    assert "nvls" not in " ".join(caveats(plan))
