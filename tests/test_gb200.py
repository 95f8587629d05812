"""The GB200 NVL72 entries (studies/catalog/devices/gpus.yaml ``gb200``,
studies/catalog/systems/gb200.yaml): the datasheet's rack figures divided by its 72 GPUs, a job
of up to 64 GPUs in one NVLink domain, a larger one in racks of 64 joined by InfiniBand."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner.catalog import load_catalog
from planner.cli import main
from planner.errors import PlannerUsageError
from planner.study_config import load_study_config
from simcore import estimate
from simcore.megatron.batched import estimate_many
from simcore.specs import Strategy, TrainingSpec

GB = 1e9
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def no_user_catalog(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANNER_CATALOG", str(tmp_path / "user-catalog"))


def test_the_device_is_the_nvl72_datasheet_per_gpu() -> None:
    """GB200 NVL72 datasheet, per rack of 72 GPUs: 360 PFLOPS FP16/BF16 and 720 PFLOPS FP8, both
    with 2:4 sparsity (half dense), 13.4 TB of HBM3e at 576 TB/s."""
    gpu = load_catalog().device("gb200")
    assert gpu.peak_flops_per_s == pytest.approx(360e15 / 2 / 72, rel=1e-3)  # 2,500 TFLOPS
    assert gpu.fp8_peak_flops_per_s == pytest.approx(720e15 / 2 / 72, rel=1e-3)
    assert gpu.hbm_bytes == pytest.approx(13.4e12 / 72, rel=1e-3)  # 186 GB
    assert gpu.hbm_bandwidth_bytes_per_s == pytest.approx(576e12 / 72)
    b200 = load_catalog().device("b200")  # the same chip: its constants but the TE GEMM rate
    assert (gpu.matmul_efficiency, gpu.fused_attention_efficiency, gpu.sm_count) == (
        b200.matmul_efficiency, b200.fused_attention_efficiency, b200.sm_count)
    # fit on gb200-fit.csv (tests/test_validation_set.py): about the B200 entry's GEMM rate a GPU
    assert gpu.fused_matmul_efficiency * gpu.peak_flops_per_s == pytest.approx(
        b200.matmul_efficiency * b200.peak_flops_per_s, rel=0.02)


def test_up_to_64_gpus_are_one_nvlink_domain_and_more_are_racks_of_64() -> None:
    catalog = load_catalog()
    rack = catalog.system("dgx-gb200-64")
    assert [d.npus for d in rack.network.dims] == [64]
    assert rack.network.dims[0].bandwidth_bytes_per_s == pytest.approx(694 * GB)  # DGX B200's
    four = catalog.system("dgx-gb200-256")
    assert [d.npus for d in four.network.dims] == [64, 4]
    assert four.network.dims[1].bandwidth_bytes_per_s == pytest.approx(42.5 * GB)
    assert [d.npus for d in catalog.system("dgx-gb200-8").network.dims] == [8]
    assert [d.npus for d in catalog.system("dgx-gb200-72").network.dims] == [72]  # a whole rack
    with pytest.raises(PlannerUsageError, match="64"):
        catalog.system("dgx-gb200-96")  # one and a half racks


def test_tp_16_stays_on_nvlink_in_a_rack_but_crosses_infiniband_between_two_dgx_b200s() -> None:
    """GPT-3 175B (96 heads) at tp 16: on an NVL72 rack its all-gathers and reduce-scatters stay
    on NVLink (694 GB/s a GPU); between two DGX B200 nodes each adds a phase over InfiniBand
    (42.5 GB/s a GPU) to the same in-node phase, so the tp time is longer there, and the step.
    Both issue their collectives as torch.distributed calls (no Transformer Engine userbuffers,
    which only the rack could run and which cost the host a kernel's time a collective:
    simcore/megatron/layer_step.py host_wait), and the boxes are given the rack's host (a Grace
    host takes 150 us a kernel, the DGX B200's x86 one 110 us: gpus.yaml), so only the network
    differs."""
    catalog = load_catalog()
    model = catalog.model("gpt3-175b")
    training = TrainingSpec(global_batch=64, seq_len=2048, tp_comm_overlap=False)
    plan = Strategy(dp=4, tp=16, pp=1, micro_batch=1)
    rack_system, box_system = catalog.system("dgx-gb200-64"), catalog.system("dgx-b200-64")
    host = rack_system.device.host_kernel_s
    box_system = replace(box_system, device=replace(box_system.device, host_kernel_s=host))
    rack = estimate(model, rack_system, training, plan)
    boxes = estimate(model, box_system, training, plan)
    assert rack.time.tp < boxes.time.tp
    assert rack.step_time < boxes.step_time


def test_the_rack_study_holds_megatron_bridges_plan_and_finds_none_slower(capsys) -> None:
    """studies/llama3-405b-gb200-256.yaml: Megatron-Bridge's recipe for Llama 3.1 405B on 256
    GB200s (tp 4 x pp 16 x vp 4, FP8 current scaling, the first and last stages 7 layers)
    measured 56.89 s a step in container 26.04.01 (1536 x 8192 / (864 x 256)) and up to 61.98 s in
    the five other releases of gb200-fit.csv (the device's GEMM rate is fit on them); the estimate
    of it lies in that range, and the exhaustive study's best plan is estimated no slower."""
    assert main(["estimate", "--model", "llama3-405b", "--system", "dgx-gb200-256", "--dp", "4",
                 "--tp", "4", "--pp", "16", "--micro-batch", "1", "--zero", "1",
                 "--recompute", "none", "--schedule", "interleaved", "--v", "4",
                 "--precision", "fp8", "--first-stage-layers", "7", "--last-stage-layers", "7",
                 "--global-batch", "1536", "--seq-len", "8192", "--grad-bytes", "2",
                 "--json"]) == 0
    recipe = json.loads(capsys.readouterr().out)["step_time"]
    assert 1536 * 8192 / (864 * 256) <= recipe <= 1536 * 8192 / (793 * 256)  # 56.89-61.98 s
    config = load_study_config(ROOT / "studies" / "llama3-405b-gb200-256.yaml")
    indices = config.space.valid_indices()
    assert indices is not None
    result = estimate_many(config.model, config.system, config.training,
                           config.space.strategies_at(indices))
    fits = result.peak_memory <= config.system.device.hbm_bytes
    assert float(result.step_time[fits].min()) <= recipe
