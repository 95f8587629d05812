"""A pipeline's sends: a stage's two per micro-batch, one between nodes and one inside when its
stages span several nodes, at the dimension's send bandwidth (`p2p_bandwidth_gbps`), which the DGX
links between nodes take from NCCL's maintainer's per-NIC figure (studies/catalog/systems/dgx.yaml
header: 24 GB/s per 200G NIC, NVIDIA/nccl-tests issue 119). A network whose outermost dimension
gives no send bandwidth (ASTRA-sim's own systems) times a send as ASTRA-sim routes it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from planner.catalog import load_catalog, system_from_entry
from planner.catalog_write import system_entry
from planner.errors import PlannerUsageError
from simcore.megatron.placement import AxisNetworks
from simcore.network import Collective, Network, NetworkDim, Topology
from simcore.specs import Axis

CATALOG = load_catalog()
GB = 1e9
MB = 10**6

# One DGX A100 pair as dgx.yaml gives it: NVSwitch 231 GB/s, 0.58 us a hop, 10.8 us a call;
# InfiniBand 15.1 GB/s per GPU (all-reduce fit), sends at 24 GB/s, 8.8 us a hop, 0.7 us a call.
NODE = NetworkDim(topology=Topology.SWITCH, npus=8, bandwidth_bytes_per_s=231 * GB,
                  latency_s=0.58e-6, call_latency_s=10.8e-6)
IB = NetworkDim(topology=Topology.SWITCH, npus=2, bandwidth_bytes_per_s=15.1 * GB,
                latency_s=8.8e-6, call_latency_s=0.7e-6, p2p_bandwidth_bytes_per_s=24 * GB)
TWO_NODES = Network(dims=(NODE, IB))
PLAIN = Network(dims=(NODE, replace(IB, p2p_bandwidth_bytes_per_s=None)))  # as ASTRA-sim's
PLACEMENT = (Axis.TP, Axis.SP, Axis.DP, Axis.PP)


def _nets(network: Network, dp: int, pp: int) -> AxisNetworks:
    return AxisNetworks(network, {Axis.TP: 1, Axis.SP: 1, Axis.DP: dp, Axis.PP: pp}, PLACEMENT)


def test_a_pipeline_over_two_nodes_sends_across_them() -> None:
    # dp 2 x pp 8 on 16 GPUs: dp takes 2 of a node's 8, pp the other 4 and both nodes, so four
    # stages sit on each node and the boundary between stages 3 and 4 crosses InfiniBand. Stage
    # 3 sends its activation across it and its gradient to stage 2 over NVLink. A 10 MB send:
    # across, the switch's 2 hops of 8.8 us + 10e6 B / 24e9 B/s + the 0.7 us call = 435.0 us;
    # inside, 2 x 0.58 + 10e6 / 231e9 + 10.8 us = 55.25 us; each of the stage's sends costs the
    # mean, 245.1 us (before: the NVLink send alone, 55.25 us).
    seconds = _nets(TWO_NODES, dp=2, pp=8).p2p(Axis.PP, 10 * MB)
    across = 2 * 8.8e-6 + 10e6 / 24e9 + 0.7e-6
    inside = 2 * 0.58e-6 + 10e6 / 231e9 + 10.8e-6
    assert seconds == pytest.approx((across + inside) / 2, abs=1e-9)  # whole ns, as ASTRA-sim


def test_a_pipeline_of_a_stage_a_node_sends_every_send_across() -> None:
    # tp 8 fills each node, pp 2 spans the two: both of a stage's sends cross InfiniBand.
    nets = AxisNetworks(TWO_NODES, {Axis.TP: 8, Axis.SP: 1, Axis.DP: 1, Axis.PP: 2}, PLACEMENT)
    seconds = nets.p2p(Axis.PP, 10 * MB)
    assert seconds == pytest.approx(2 * 8.8e-6 + 10e6 / 24e9 + 0.7e-6, abs=1e-9)


def test_a_pipeline_inside_one_node_sends_over_nvlink() -> None:
    # pp 8 on one node: 2 hops of 0.58 us + 10e6 / 231e9 + 10.8 us = 55.25 us.
    seconds = _nets(Network(dims=(NODE,)), dp=1, pp=8).p2p(Axis.PP, 10 * MB)
    assert seconds == pytest.approx(2 * 0.58e-6 + 10e6 / 231e9 + 10.8e-6, abs=1e-9)


def test_without_a_send_bandwidth_the_link_bandwidth_times_the_send() -> None:
    # ASTRA-sim's systems have one bandwidth: 10e6 / 15.1e9 = 662.3 us on the wire.
    nets = AxisNetworks(PLAIN, {Axis.TP: 8, Axis.SP: 1, Axis.DP: 1, Axis.PP: 2}, PLACEMENT)
    seconds = nets.p2p(Axis.PP, 10 * MB)
    assert seconds == pytest.approx(2 * 8.8e-6 + 10e6 / 15.1e9 + 0.7e-6, abs=1e-9)


def test_collectives_keep_the_all_reduce_fit() -> None:
    # The send bandwidth is for sends only: dp's all-reduce over both nodes is the same with it.
    size = 256 * MB
    with_sends = _nets(TWO_NODES, dp=16, pp=1).collective(Axis.DP, Collective.ALL_REDUCE, size)
    without = _nets(PLAIN, dp=16, pp=1).collective(Axis.DP, Collective.ALL_REDUCE, size)
    assert with_sends == without > 0


@pytest.mark.parametrize(("system", "gbps"), [("dgx-a100-16", 24), ("dgx-h100-16", 48),
                                              ("dgx1-v100-16", 1.5)])
def test_catalog_links_between_nodes_carry_the_nic_rate(system: str, gbps: float) -> None:
    # 24 GB/s per 200G NIC, 12 per 100G (nccl-tests issue 119): a DGX A100 GPU has one HDR 200G
    # NIC, a DGX H100 GPU one NDR 400G, a DGX-1's 8 V100s share one 100G port (12 / 8).
    between = CATALOG.system(system).network.dims[-1]
    assert between.p2p_bandwidth_bytes_per_s == pytest.approx(gbps * GB)
    assert CATALOG.system(system).network.dims[0].p2p_bandwidth_bytes_per_s is None


def test_the_send_bandwidth_survives_a_catalog_round_trip() -> None:
    system = CATALOG.system("dgx-a100-16")
    entry = system_entry(system, device="a100-80gb")
    copy = system_from_entry(Path("copy.yaml"), "copy", entry, {"a100-80gb": system.device})
    assert copy.network.dims[-1].p2p_bandwidth_bytes_per_s == pytest.approx(24 * GB)
    assert copy.network.dims[0].p2p_bandwidth_bytes_per_s is None


def test_a_bad_send_bandwidth_is_one_line() -> None:
    system = CATALOG.system("dgx-a100-16")
    entry = system_entry(system, device="a100-80gb")
    entry["network"][1]["p2p_bandwidth_gbps"] = -1
    with pytest.raises(PlannerUsageError, match=r"bad\.network\[1\]\.p2p_bandwidth_gbps"):
        system_from_entry(Path("bad.yaml"), "bad", entry, {"a100-80gb": system.device})


def _without_send_rate(system):
    return replace(system, network=Network(
        dims=tuple(replace(d, p2p_bandwidth_bytes_per_s=None) for d in system.network.dims),
        scheduling=system.network.scheduling))


def test_the_zero_bubble_check_comes_closer() -> None:
    # The zero-bubble paper's Tables 6-7 (tests/data/validation/a100-zb-check.csv): pp 16-32
    # over 2-4 nodes of 8, every stage a GPU. Sends timed on the first NVLink hop at the
    # all-reduce fit: 2.8% mean error; each stage's own sends at the NIC's rate: 1.9%.
    from planner.runs_csv import read_runs
    from simcore import estimate
    path = Path(__file__).parent / "data" / "validation" / "a100-zb-check.csv"
    runs, _ = read_runs(path, CATALOG)

    def mape(system_of) -> float:
        errors = [abs(estimate(r.model, system_of(r.system), r.training, r.strategy).step_time
                      / r.step_time_s - 1) for r in runs]
        return sum(errors) / len(errors)

    now, before = mape(lambda s: s), mape(_without_send_rate)
    assert now < before
    assert now <= 0.025
    assert before == pytest.approx(0.028, abs=0.002)


def test_without_a_send_bandwidth_a_send_is_routed_as_astra_sim_does() -> None:
    # ASTRA-sim's congestion-unaware backend times a send on the lowest dimension the two ranks
    # differ in, for neighbouring pp ranks the innermost: dp 2 x pp 8 over the two nodes sends
    # over NVLink, 2 x 0.58 + 10e6 / 231e9 + 10.8 us, as before the send rate existed, so
    # ASTRA-sim's own systems (which never set it) keep its timing.
    seconds = _nets(PLAIN, dp=2, pp=8).p2p(Axis.PP, 10 * MB)
    assert seconds == pytest.approx(2 * 0.58e-6 + 10e6 / 231e9 + 10.8e-6, abs=1e-9)


def test_a_mixed_cluster_sends_between_nodes_at_the_send_rate() -> None:
    # planner mixed times a stage boundary over the link it crosses (simcore/mixed/estimate.py):
    # at the link's send rate where it gives one, 10e6 / 24e9 on the wire, not 10e6 / 15.1e9.
    from simcore.collectives import p2p_time
    from simcore.mixed.estimate import _link_network
    seconds = p2p_time(_link_network(IB), 0, 1, 10 * MB)
    assert seconds == pytest.approx(2 * 8.8e-6 + 10e6 / 24e9, abs=1e-9)
