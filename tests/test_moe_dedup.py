"""The deduplicated expert dispatch (``ep_dedup``: DeepEP / HybridEP, Megatron-LM's flex
dispatcher; DeepSeek-V3 arXiv:2412.19437 section 3.2.2): a token crosses to each remote node
holding any of its experts once, then is forwarded over NVLink."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import simcore
from planner.catalog import load_catalog
from planner.exports import export_files
from planner.plan import make_plan, strategy_dict, strategy_from_attrs
from planner.runs_csv import read_runs
from search_spaces import strategy_label
from search_spaces.frameworks import why_not
from search_spaces.space import StrategySpace
from simcore.megatron.placement import pairwise_all_to_all
from simcore.network import Network
from simcore.specs import Convention, Precision, Recompute, Strategy, TrainingSpec, ZeroStage

CATALOG = load_catalog()
QWEN = CATALOG.model("qwen3-30b-a3b")  # 128 experts, top-8
H100_16 = CATALOG.system("dgx-h100-16")
# CUDA graphs, as Megatron-Bridge's Qwen3 presets run them: the host's time per kernel
# (DeviceSpec.host_kernel_s) stays out of these hand calculations
TRAINING = TrainingSpec(global_batch=1024, seq_len=4096, cuda_graphs=True)
EP16 = Strategy(dp=16, ep=16, etp=1, precision=Precision.FP8, zero=ZeroStage.OPTIMIZER)
"""Megatron-Bridge's Qwen3-30B-A3B H100 plan: ep 16 over two nodes of 8."""


def test_the_dedup_all_to_all_in_closed_form() -> None:
    # Two nodes of 8, top-8: a token reaches the other node with probability 1 - (1/2)^8, so
    # the network between nodes carries size / 8 * (1 - 1/256) against size / 2 without
    # deduplication (0.249 of it); the node's links forward every copy not for the rank it
    # lands on, size * 7 / 8 (by hand, with the DGX H100 links: 392 and 42.5 GB/s).
    node, ib = H100_16.network.dims
    net = Network(dims=(node, ib), scheduling=H100_16.network.scheduling)
    size = 268_435_456
    across = size / 8 * (1 - 0.5**8)
    inside = size * 7 / 8
    expected = max(across / 42.5e9 + ib.latency_s, inside / 392e9 + node.latency_s)
    assert pairwise_all_to_all(net, size, dedup_k=8) == pytest.approx(expected, rel=1e-12)
    assert pairwise_all_to_all(net, size) == pytest.approx(size / 2 / 42.5e9 + ib.latency_s)
    # within one node there is nothing to deduplicate
    one = Network(dims=(node,), scheduling=H100_16.network.scheduling)
    assert pairwise_all_to_all(one, size, dedup_k=8) == pairwise_all_to_all(one, size)


def test_the_estimate_charges_the_deduplicated_all_to_alls() -> None:
    plain = simcore.estimate(QWEN, H100_16, TRAINING, EP16)
    dedup = simcore.estimate(QWEN, H100_16, TRAINING, replace(EP16, ep_dedup=True))
    # The flex dispatcher's small kernels (simcore.megatron.moe.DISPATCH_KERNELS: 15 forward
    # and 10 backward against the all-to-all dispatcher's 19 and 7) are one launch fewer a
    # layer without recompute: 48 layers x 64 micro-batches (1024 / dp 16) of H100's 13.8 us
    # launch floor
    assert EP16.recompute is Recompute.NONE
    fewer = 48 * 64 * H100_16.device.kernel_launch_s * ((19 - 15) + (7 - 10))
    assert plain.time.compute - dedup.time.compute == pytest.approx(fewer)
    # every all-to-all goes from the IB bound (size / 2) to the NVLink or the IB one of the
    # closed form above: about a quarter of the bytes across nodes
    assert 0.2 * plain.time.ep < dedup.time.ep < 0.35 * plain.time.ep
    # ep 8 inside a node: the same as without
    in_node = Strategy(dp=16, ep=8, etp=1, precision=Precision.FP8, zero=ZeroStage.OPTIMIZER)
    assert (simcore.estimate(QWEN, H100_16, TRAINING, replace(in_node, ep_dedup=True)).time.ep
            == simcore.estimate(QWEN, H100_16, TRAINING, in_node).time.ep)
    with pytest.raises(ValueError, match="ep_dedup .* need ep > 1"):
        simcore.check(QWEN, H100_16, TRAINING, replace(EP16, ep=1, ep_dedup=True))


def test_megatron_writes_the_flex_dispatcher_and_others_refuse() -> None:
    s = replace(EP16, ep_dedup=True)
    plan = make_plan(QWEN, H100_16, TRAINING, s, Convention.MEGATRON)
    script = str(export_files(plan, "megatron")["megatron.sh"])
    assert "--moe-token-dispatcher-type flex" in script
    assert "--moe-flex-dispatcher-backend deepep" in script
    assert "--moe-token-dispatcher-type alltoall" not in script
    assert why_not("megatron", QWEN, TRAINING, s) is None
    assert "ep_dedup" in str(why_not("torchtitan", QWEN, TRAINING, s))
    assert strategy_label(s).endswith("ep-dedup")
    assert strategy_from_attrs({**strategy_dict(s), "plan": ""}) == s
    assert "ep_dedup" not in strategy_dict(EP16)


def test_the_space_and_the_runs_csv_take_it(tmp_path: Path) -> None:
    space = StrategySpace(model=QWEN, system=H100_16, training=TRAINING,
                          convention=Convention.MEGATRON, tp=(1,), pp=(1,), sp=(1,),
                          zero=(ZeroStage.OPTIMIZER,), micro_batch=(1,), ep=(1, 8, 16),
                          etp=(1,), ep_dedup=(False, True))
    valid = set(space.valid)
    assert valid == {s for s in space.candidates() if space.reason_invalid(s) is None}
    assert {(s.ep, s.ep_dedup) for s in valid} == {(1, False), (8, False), (8, True),
                                                   (16, False), (16, True)}
    csv = tmp_path / "runs.csv"
    csv.write_text("model,system,global_batch,seq_len,dp,tp,pp,micro_batch,ep,etp,ep_dedup,"
                   "step_time_s\nqwen3-30b-a3b,dgx-h100-16,1024,4096,16,1,1,1,16,1,true,29.3\n")
    runs, skipped = read_runs(csv, CATALOG)
    assert not skipped and runs[0].strategy.ep_dedup
