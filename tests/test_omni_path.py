"""Jean Zay's two effects (tests/data/validation/README.md, "Jean Zay's 2024 runs"): over
Omni-Path the communicators crossing between nodes at once add up (a network dimension's
``per_communicator``, simcore/megatron/placement.py), and under ``CUDA_LAUNCH_BLOCKING=1`` each
kernel pays the host's time (``launch_blocking``, simcore/megatron/kernels.py)."""

from __future__ import annotations

import json

from dataclasses import replace
from pathlib import Path

import pytest

from planner.catalog import load_catalog, system_from_entry
from planner.cli import main
from planner.errors import PlannerUsageError
from planner.plan import make_plan, read_plan, write_plan
from planner.study_config import load_study_config
from simcore import estimate
from simcore.megatron.kernels import BLOCKING_HOST_S, KernelCosts, layer_kernels
from simcore.megatron.layers import layer_shape
from simcore.megatron.placement import AxisNetworks
from simcore.network import Network, NetworkDim, Topology
from simcore.specs import Axis, Convention, DeviceSpec, Strategy, TrainingSpec

GB = 1e9
PLACEMENT = (Axis.TP, Axis.SP, Axis.DP, Axis.PP)
NODE = NetworkDim(topology=Topology.SWITCH, npus=8, bandwidth_bytes_per_s=231 * GB,
                  latency_s=0.58e-6)
OPA = NetworkDim(topology=Topology.SWITCH, npus=4, bandwidth_bytes_per_s=0.494 * GB,
                 latency_s=8.8e-6, per_communicator=True)
CATALOG = load_catalog(user=False)


def _outer_bandwidth(network: Network, axis: Axis, **degrees: int) -> float:
    full = {Axis.TP: 1, Axis.SP: 1, Axis.DP: 1, Axis.PP: 1}
    full.update({Axis[k.upper()]: v for k, v in degrees.items()})
    group = AxisNetworks(network, full, PLACEMENT).networks[axis]
    assert group is not None
    return group.dims[-1].bandwidth_bytes_per_s


@pytest.mark.parametrize(("tp", "per_gpu"), [
    (1, 0.494),      # dp 32: all 8 GPUs of a node in one group, one communicator a node
    (2, 0.988),      # dp 16: 4 a node, 2 communicators at once: 8 / 4 = 2x
    (4, 1.976),      # dp 8: 2 a node, 4 communicators: 4x
    (8, 3.952),      # dp 4: one a node, 8 communicators: 8x
])
def test_communicators_add_up_across_omni_path(tp: int, per_gpu: float) -> None:
    network = Network(dims=(NODE, OPA))
    assert _outer_bandwidth(network, Axis.DP, tp=tp, dp=32 // tp) == pytest.approx(per_gpu * GB)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_a_rate_per_link_prices_every_group_alike(tp: int) -> None:
    network = Network(dims=(NODE, replace(OPA, per_communicator=False)))
    assert _outer_bandwidth(network, Axis.DP, tp=tp, dp=32 // tp) == pytest.approx(0.494 * GB)


def test_a_pipeline_send_between_nodes_is_one_communicator_of_its_own() -> None:
    # tp 8 fills a node, pp 4 crosses the nodes: one rank a node, eight pairs at once: 8 x 0.494.
    network = Network(dims=(NODE, OPA))
    assert _outer_bandwidth(network, Axis.PP, tp=8, pp=4) == pytest.approx(3.952 * GB)


def test_jean_zay_a100_nodes_are_per_communicator_and_v100_nodes_are_not() -> None:
    a100 = CATALOG.system("jean-zay-a100-32").network.dims
    v100 = CATALOG.system("jean-zay-v100-32gb-8").network.dims
    assert [d.per_communicator for d in a100] == [False, True]
    assert [d.per_communicator for d in v100] == [False, False]
    assert not any(d.per_communicator for d in CATALOG.system("dgx-a100-32").network.dims)


def test_per_communicator_must_be_true_or_false(tmp_path: Path) -> None:
    entry = {"device": "a100-80gb", "network": [
        {"topology": "Switch", "npus": 8, "bandwidth_gbps": 231, "latency_us": 0.58},
        {"topology": "Switch", "npus": 2, "bandwidth_gbps": 0.5, "latency_us": 8.8,
         "per_communicator": "yes"}]}
    devices = {"a100-80gb": CATALOG.device("a100-80gb")}
    with pytest.raises(PlannerUsageError, match=r"per_communicator.*must be true or false"):
        system_from_entry(tmp_path / "systems.yaml", "opa-2", entry, devices)
    entry["network"][1]["per_communicator"] = True
    system = system_from_entry(tmp_path / "systems.yaml", "opa-2", entry, devices)
    assert system.network.dims[1].per_communicator


A100 = DeviceSpec(name="a100", peak_flops_per_s=312e12, hbm_bytes=80e9,
                  hbm_bandwidth_bytes_per_s=2039e9, matmul_efficiency=0.75,
                  memory_efficiency=0.5, kernel_launch_s=5e-6, sm_count=108)


def test_launch_blocking_adds_the_host_time_to_every_kernel() -> None:
    free, blocking = KernelCosts.of(A100), KernelCosts.of(A100, launch_blocking=True)
    assert blocking.elementwise(1e9) == pytest.approx(free.elementwise(1e9) + 200e-6)
    assert blocking.gemm(64, 64, 64) == pytest.approx(5e-6 + 200e-6)  # the 5 us floor, then
    assert BLOCKING_HOST_S == 200e-6


def test_a_blocking_llama_layer_pays_its_kernel_count_in_host_time() -> None:
    # Megatron-Core's Llama layer with flash attention: 11 kernels forward (4 GEMMs, 6
    # element-wise: two norms, two residual adds, SwiGLU, RoPE; 1 flash) and 21 backward
    # (8 GEMMs, 12 element-wise, 1 flash): 11 x 200 us = 2.2 ms and 21 x 200 us = 4.2 ms.
    llama = CATALOG.model("llama3-8b")
    kw = dict(micro_batch=1, queries=2048, seq_len=2048, tp=1, sequence_parallel=False,
              act_bytes=2, flash=True)
    free = layer_kernels(llama, layer_shape(llama), KernelCosts.of(A100), **kw)
    blocking = layer_kernels(llama, layer_shape(llama),
                             KernelCosts.of(A100, launch_blocking=True), **kw)
    assert blocking.forward - free.forward == pytest.approx(2.2e-3)
    assert blocking.backward - free.backward == pytest.approx(4.2e-3)


def test_launch_blocking_costs_more_with_more_micro_batches() -> None:
    # The host's time is per kernel, so per micro-batch: at the same plan, micro-batch 1 runs
    # twice the kernels of micro-batch 2 (Jean Zay's runs: +10% to +19% measured).
    model, system = CATALOG.model("llama2-7b"), CATALOG.system("jean-zay-a100-8")
    training = TrainingSpec(global_batch=64, seq_len=2048, launch_blocking=True)

    def step(micro_batch: int, tr: TrainingSpec) -> float:
        return estimate(model, system, tr, Strategy(dp=8, micro_batch=micro_batch)).step_time

    free = replace(training, launch_blocking=False)
    assert step(1, training) - step(2, training) > step(1, free) - step(2, free) + 0.1


def test_a_study_sets_launch_blocking_and_refuses_a_number(tmp_path: Path, capsys) -> None:
    study = tmp_path / "study.yaml"
    text = ("model: llama2-7b\nsystem: jean-zay-a100-8\ntraining:\n  global_batch: 64\n"
            "  seq_len: 2048\n  launch_blocking: {}\nspace: {{tp: [1, 2], pp: [1]}}\n")
    study.write_text(text.format("true"))
    assert load_study_config(study).training.launch_blocking is True
    study.write_text(text.format("1"))
    assert main(["run", str(study), "--storage", str(tmp_path / "s.db")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "training.launch_blocking" in err[0] and "true or false" in err[0]


def test_a_plan_file_keeps_both_and_estimates_the_same(tmp_path: Path) -> None:
    model, system = CATALOG.model("llama2-7b"), CATALOG.system("jean-zay-a100-32")
    training = TrainingSpec(global_batch=64, seq_len=2048, launch_blocking=True)
    plan = make_plan(model, system, training, Strategy(dp=16, tp=2), Convention.MEGATRON)
    path = tmp_path / "plan.yaml"
    write_plan(plan, path)
    again = read_plan(path)
    assert again.training.launch_blocking
    assert [d.per_communicator for d in again.system.network.dims] == [False, True]
    assert again.estimate.step_time == plan.estimate.step_time


def test_estimate_launch_blocking_flag(capsys) -> None:
    # Llama 2 7B, 32 layers, dp 8 at batch 64: 8 micro-batches of one sequence a GPU, no
    # recompute; each layer runs 11 + 21 kernels a micro-batch (above): 32 x 32 x 8 kernels at
    # 200 us = 1.64 s more (the data-parallel reduce that overlaps the backward moves it a little).
    args = ["estimate", "--model", "llama2-7b", "--system", "jean-zay-a100-8", "--global-batch",
            "64", "--seq-len", "2048", "--dp", "8", "--micro-batch", "1", "--json"]

    def step(*extra: str) -> float:
        assert main([*args, *extra]) == 0
        return json.loads(capsys.readouterr().out)["step_time"]

    assert step("--launch-blocking") - step() == pytest.approx(32 * 32 * 8 * 200e-6, rel=0.02)
