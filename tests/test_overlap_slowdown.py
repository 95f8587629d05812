"""Compute slows while a collective runs beside it (the devices' ``overlap_slowdown``).

Lee et al. 2025, "Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed
Deep Learning" (arXiv:2507.03114), abstract: overlapping computation and communication slows the
computation by 18.9% on average (up to 40%) on A100, H100, MI250 and MI210. The estimate charges
a collective of ``c`` s hidden behind ``k`` s of compute ``max(0, c - k) + slowdown * min(c, k)``
(simcore/megatron/layer_step.py, and step.py for the gradient reduction); these tests check
that closed form on the parts it touches.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.calibration import CONSTANTS, calibrate
from planner.catalog import load_catalog
from planner.runs_csv import read_runs
from simcore import estimate
from simcore.megatron import layer_time
from simcore.network import Network, NetworkDim, Topology
from simcore.specs import DeviceSpec, Strategy, SystemSpec, TrainingSpec, ZeroStage
from tests.test_validation_set import DATA

LEE_2025_MEAN_SLOWDOWN = 0.189  # arXiv:2507.03114, abstract
# CUDA graphs: the host's time per kernel (DeviceSpec.host_kernel_s) stays out of these hand
# calculations of the GPU's timeline
TRAINING = TrainingSpec(global_batch=64, seq_len=1024, cuda_graphs=True)


def _system(slowdown: float, gb_per_s: float) -> SystemSpec:
    """8 catalog A100s on one switch of ``gb_per_s`` links, compute slowing by ``slowdown``."""
    device = replace(load_catalog().device("a100-80gb"), overlap_slowdown=slowdown)
    dim = NetworkDim(topology=Topology.SWITCH, npus=8, bandwidth_bytes_per_s=gb_per_s * 1e9,
                     latency_s=1e-6)
    return SystemSpec(name="switch-8", device=device, network=Network(dims=(dim,)))


def test_the_catalog_s_devices_slow_by_the_measured_mean() -> None:
    catalog = load_catalog()
    for name in ("a100-80gb", "a100-40gb", "h100-sxm", "h200", "b200", "mi300x", "v100-16gb"):
        assert catalog.device(name).overlap_slowdown == LEE_2025_MEAN_SLOWDOWN, name


def test_the_astra_lab_s_devices_overlap_for_free() -> None:
    # ASTRA-sim overlaps compute and communication without contention; the lab's systems keep
    # its numbers to the nanosecond (tests/test_astra_lab_files.py).
    lab = load_catalog().system("lab-system1")
    assert lab.device.overlap_slowdown == 0.0


def test_a_comm_bound_fsdp_gather_charges_the_slowdown_on_the_whole_forward() -> None:
    # 1 GB/s links: each layer's ZeRO-3 all-gather outlasts its forward (comm-bound), so the
    # forward costs gather + slowdown * forward. The forward alone is the plan without ZeRO-3.
    model = load_catalog().model("gpt-1.7b")
    fsdp = Strategy(dp=8, micro_batch=2, zero=ZeroStage.PARAMETERS)
    plain = replace(fsdp, zero=ZeroStage.NONE)
    c = LEE_2025_MEAN_SLOWDOWN
    forward, _ = layer_time(model, _system(c, 1.0), TRAINING, plain)
    free, _ = layer_time(model, _system(0.0, 1.0), TRAINING, fsdp)
    slowed, _ = layer_time(model, _system(c, 1.0), TRAINING, fsdp)
    assert free > 2 * forward  # comm-bound: the gather is exposed beyond the forward
    assert slowed - free == pytest.approx(c * forward, rel=1e-9)


def test_a_compute_bound_fsdp_gather_charges_the_slowdown_on_the_gather() -> None:
    # 1 TB/s links: the gather hides behind the forward (free: exactly the forward), and costs
    # slowdown * gather. Halving the slowdown halves the extra time.
    model = load_catalog().model("gpt-1.7b")
    fsdp = Strategy(dp=8, micro_batch=8, zero=ZeroStage.PARAMETERS)
    plain = replace(fsdp, zero=ZeroStage.NONE)
    forward, _ = layer_time(model, _system(0.0, 1000.0), TRAINING, plain)
    free, _ = layer_time(model, _system(0.0, 1000.0), TRAINING, fsdp)
    assert free == pytest.approx(forward, rel=1e-12)
    extra = layer_time(model, _system(0.2, 1000.0), TRAINING, fsdp)[0] - forward
    half = layer_time(model, _system(0.1, 1000.0), TRAINING, fsdp)[0] - forward
    assert 0 < extra < 0.2 * forward  # slowdown * min(gather, forward) with gather < forward
    assert half == pytest.approx(extra / 2, rel=1e-9)


def test_the_gradient_reduction_s_hidden_part_is_slowed() -> None:
    # The reduction of ``link`` s, exposed ``e`` s without slowdown (the last bucket, or what
    # outlasts the backward), costs e + slowdown * (link - e). ``link`` is what it costs when
    # it waits for the backward (overlap_grad_reduce false).
    model = load_catalog().model("gpt-1.7b")
    plan = Strategy(dp=8, micro_batch=1)
    c = LEE_2025_MEAN_SLOWDOWN
    serial = replace(TRAINING, overlap_grad_reduce=False)
    link = estimate(model, _system(c, 20.0), serial, plan).time.dp
    exposed = estimate(model, _system(0.0, 20.0), TRAINING, plan).time.dp
    slowed = estimate(model, _system(c, 20.0), TRAINING, plan).time.dp
    assert 0 < exposed < link
    assert slowed == pytest.approx(exposed + c * (link - exposed), rel=1e-9)


@pytest.mark.parametrize("value", [-0.1, 1.0, float("nan")])
def test_a_slowdown_outside_zero_to_one_is_refused(value: float) -> None:
    with pytest.raises(ValueError, match="overlap_slowdown"):
        DeviceSpec(name="x", peak_flops_per_s=1e12, hbm_bytes=1e9,
                   hbm_bandwidth_bytes_per_s=1e9, overlap_slowdown=value)


def test_calibrate_keeps_the_measured_slowdown_unless_asked() -> None:
    # The catalog takes it from Lee et al.'s measurement; `--fit overlap_slowdown` fits it.
    assert not next(c for c in CONSTANTS if c.key == "overlap_slowdown").by_default
    catalog = load_catalog()
    runs, _ = read_runs(DATA / "v100-fit.csv", catalog)
    start = catalog.device("v100-16gb")
    default = calibrate(runs, start, "v", trials=3)
    assert "overlap_slowdown" not in {c.key for c in default.constants}
    assert default.device.overlap_slowdown == start.overlap_slowdown
    asked = calibrate(runs, start, "v", trials=3, only=["overlap_slowdown"])
    assert [c.key for c in asked.constants] == ["overlap_slowdown"]
