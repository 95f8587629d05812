"""Fixed costs per operation (simcore.megatron.kernels): kernel floors, wave quantisation, flash
attention's time and memory, and the per-call costs of collectives. Hand calculations in the
comments."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.catalog import load_catalog
from simcore import estimate
from simcore.collectives import collective_time
from simcore.megatron.activations import layer_activations
from simcore.megatron.kernels import KernelCosts, layer_kernels
from simcore.megatron.layers import layer_shape
from simcore.megatron.placement import axis_networks
from simcore.network import Collective, Network, NetworkDim, Topology
from simcore.specs import (
    Axis,
    Convention,
    DeviceSpec,
    Family,
    ModelSpec,
    Recompute,
    Strategy,
    TrainingSpec,
    ZeroStage,
)

A100 = DeviceSpec(name="a100", peak_flops_per_s=312e12, hbm_bytes=80e9,
                  hbm_bandwidth_bytes_per_s=2039e9, matmul_efficiency=0.75,
                  memory_efficiency=0.5, kernel_launch_s=5e-6, sm_count=108)
COSTS = KernelCosts.of(A100)
CATALOG = load_catalog()


def test_wave_quantisation_by_hand() -> None:
    # 1024 x 384 output in 128 x 128 tiles: 8 x 3 = 24 tiles on 108 SMs, one wave 24/108 full.
    assert COSTS.waves(1024, 384) == pytest.approx(24 / 108)
    # 2048 x 8192: 16 x 64 = 1024 tiles = 10 waves of 108 (1080 slots): 1024 / 1080.
    assert COSTS.waves(2048, 8192) == pytest.approx(1024 / 1080)
    # Without an SM count there is no quantisation.
    assert KernelCosts.of(replace(A100, sm_count=0)).waves(1024, 384) == 1.0


def test_gemm_time_is_the_slowest_of_launch_flops_and_bytes() -> None:
    # Large: 8192^3, 64 x 64 tiles = 4096 = 37.9 waves -> 38 waves: 4096 / 4104 busy.
    flops = 2 * 8192**3
    expected = flops / (312e12 * 0.75 * 4096 / 4104)
    assert COSTS.gemm(8192, 8192, 8192) == pytest.approx(expected)
    # Tiny: 64 x 64 x 64 is 0.5 MFLOP, well under the 5 us launch floor.
    assert COSTS.gemm(64, 64, 64) == pytest.approx(5e-6)
    # Skinny: 8 x 8192 x 8192 moves 2 B x (8*8192 + 8192^2 + 8*8192) = 134.5 MB at 1019.5 GB/s
    # (132 us), while its 1.07 GFLOP at one tile's share of the SMs (64 of 108) take 8 us.
    moved = 2 * (8 * 8192 + 8192 * 8192 + 8 * 8192)
    assert COSTS.gemm(8, 8192, 8192) == pytest.approx(moved / (2039e9 * 0.5))


def test_elementwise_floor() -> None:
    assert COSTS.elementwise(1e3) == pytest.approx(5e-6)
    assert COSTS.elementwise(1e9) == pytest.approx(1e9 / (2039e9 * 0.5))


def test_kernel_counts_of_a_layer() -> None:
    gpt = CATALOG.model("gpt-1.7b")
    llama = CATALOG.model("llama3-8b")
    kw = dict(micro_batch=1, queries=2048, seq_len=2048, tp=1, sequence_parallel=False,
              act_bytes=2)
    # GPT, unfused attention: 4 GEMMs (QKV, projection, FC1, FC2), 5 element-wise kernels (two
    # norms, two residual adds, GELU) and the core's 5 (QK^T, softmax, dropout, PV, layout).
    gpt_k = layer_kernels(gpt, layer_shape(gpt), COSTS, flash=False, **kw)
    assert gpt_k.kernels_forward == 4 + 5 + 5
    # Backward: 2 GEMMs per GEMM, 2 kernels per element-wise one, 7 for the core.
    assert gpt_k.kernels_backward == 8 + 10 + 7
    # Llama, flash: RoPE is a sixth element-wise kernel, the core one flash kernel each way.
    llama_k = layer_kernels(llama, layer_shape(llama), COSTS, flash=True, **kw)
    assert (llama_k.kernels_forward, llama_k.kernels_backward) == (4 + 6 + 1, 8 + 12 + 1)


def test_launch_floor_makes_small_micro_batches_slower_per_sequence() -> None:
    # The floors add per kernel: with a 20 us floor, 8 micro-batches of one short sequence each
    # pay 8x the floors of one micro-batch of 8, so the gap between them widens.
    model = ModelSpec(name="small", family=Family.GPT, layers=8, hidden=512, ffn_hidden=2048,
                      heads=8, vocab=32000, seq_len=256)
    base = CATALOG.system("dgx-a100-8")
    training = TrainingSpec(global_batch=64, seq_len=256)

    def gap(launch_s: float) -> float:
        system = replace(base, device=replace(base.device, kernel_launch_s=launch_s))
        one = estimate(model, system, training, Strategy(dp=8, micro_batch=1)).step_time
        eight = estimate(model, system, training, Strategy(dp=8, micro_batch=8)).step_time
        return one - eight

    assert gap(20e-6) > gap(0.0) > 0


def test_flash_attention_keeps_only_the_log_sum_exp() -> None:
    # Llama-3-8B layer, micro-batch 1, sequence 8192, tp 1: the unfused core would keep the
    # scores, 2 B x 32 heads x 8192^2 (4.3 GB) and more; flash keeps 4 B x 32 x 8192 = 1 MiB.
    model = CATALOG.model("llama3-8b")
    kw = dict(micro_batch=1, seq_len=8192, tp=1, sp=1, sequence_parallel=False,
              recompute=Recompute.NONE)
    flash = layer_activations(model, layer_shape(model), flash=True, **kw)
    unfused = layer_activations(model, layer_shape(model), flash=False, **kw)
    assert flash.attention_core == 4 * 32 * 8192
    assert unfused.full - flash.full == pytest.approx(2 * 32 * 8192**2 - 4 * 32 * 8192)


def test_llama3_8b_at_8k_with_context_parallel_fits() -> None:
    # The example: Llama-3-8B, sequence 8192, tp 1, cp 2 was refused as 130 GB with the
    # s^2 scores stored; with flash attention (the llama default) and the distributed optimizer
    # it fits an 80 GB H100.
    est = estimate(CATALOG.model("llama3-8b"), CATALOG.system("dgx-h100-8"),
                   TrainingSpec(global_batch=8, seq_len=8192),
                   Strategy(dp=4, sp=2, zero=ZeroStage.OPTIMIZER))
    assert est.fits, est.reason
    # With flash attention off the scores are back: 2 B x 32 heads x 4096 x 8192 per layer.
    off = estimate(CATALOG.model("llama3-8b"), CATALOG.system("dgx-h100-8"),
                   TrainingSpec(global_batch=8, seq_len=8192, flash_attention=False),
                   Strategy(dp=4, sp=2, zero=ZeroStage.OPTIMIZER))
    assert not off.fits


def test_flash_default_by_family_and_device() -> None:
    from simcore.megatron import uses_flash_attention
    training = TrainingSpec(global_batch=8, seq_len=2048)
    gpt, llama = CATALOG.model("gpt-1.7b"), CATALOG.model("llama3-8b")
    a100, h100 = CATALOG.system("dgx-a100-8"), CATALOG.system("dgx-h100-8")
    assert uses_flash_attention(llama, a100, training)
    assert not uses_flash_attention(gpt, a100, training)
    assert uses_flash_attention(gpt, h100, training)
    assert not uses_flash_attention(llama, h100, replace(training, flash_attention=False))


def test_call_latency_adds_once_per_dimension_spanned() -> None:
    dims = (NetworkDim(topology=Topology.SWITCH, npus=8, bandwidth_bytes_per_s=200e9,
                       latency_s=1e-6, call_latency_s=10e-6),
            NetworkDim(topology=Topology.SWITCH, npus=2, bandwidth_bytes_per_s=20e9,
                       latency_s=5e-6, call_latency_s=3e-6))
    network = Network(dims=dims)
    nets = axis_networks(network, {Axis.DP: 16, Axis.TP: 1, Axis.PP: 1, Axis.SP: 1},
                         (Axis.TP, Axis.SP, Axis.DP, Axis.PP))
    size = 64 << 20
    # dp spans both dimensions: ASTRA-sim's time plus 10 + 3 us.
    expected = collective_time(network, Collective.ALL_REDUCE, size).time_s + 13e-6
    assert nets.collective(Axis.DP, Collective.ALL_REDUCE, size) == pytest.approx(expected)
    # The collective timing itself stays ASTRA-sim's: no call latency in it.
    bare = Network(dims=tuple(replace(d, call_latency_s=0.0) for d in dims))
    assert collective_time(network, Collective.ALL_REDUCE, size).time_s == \
        collective_time(bare, Collective.ALL_REDUCE, size).time_s


def test_collective_launch_is_charged_per_tp_collective() -> None:
    # GPT-1.7B, tp 8, one micro-batch of one sequence, no recompute: forward 2 all-reduces per
    # layer x 24 layers + 1 for the embedding, all on the critical path; backward ones may hide
    # behind weight gradients. So 10 us more per collective adds at least 49 x 10 us.
    model = CATALOG.model("gpt-1.7b")
    system = CATALOG.system("dgx-a100-8")
    training = TrainingSpec(global_batch=1, seq_len=2048)
    strategy = Strategy(dp=1, tp=8, sequence_parallel=False)
    base = estimate(model, system, training, strategy)
    slower = replace(system, device=replace(system.device, collective_launch_s=
                                            system.device.collective_launch_s + 10e-6))
    more = estimate(model, slower, training, strategy)
    assert more.time.tp - base.time.tp >= 49 * 10e-6 - 1e-12


def test_astra_lab_systems_have_no_fixed_costs() -> None:
    # The lab's systems come from ASTRA-sim's files, which set none of the new constants, so
    # their estimates and collectives keep ASTRA-sim's numbers.
    for name in ("lab-system1", "lab-system2"):
        system = CATALOG.system(name)
        assert system.device.kernel_launch_s == 0 and system.device.sm_count == 0
        assert system.device.collective_launch_s == 0
        assert all(d.call_latency_s == 0 for d in system.network.dims)


def test_stage_convention_unchanged_by_device_constants() -> None:
    model = CATALOG.model("llama70b")
    system = CATALOG.system("lab-system1")
    training = TrainingSpec(global_batch=512, seq_len=1024)
    strategy = Strategy(dp=8, tp=8)
    base = estimate(model, system, training, strategy, Convention.STAGE)
    floors = replace(system, device=replace(system.device, kernel_launch_s=1e-3, sm_count=4,
                                            collective_launch_s=1e-3))
    assert estimate(model, floors, training, strategy, Convention.STAGE).step_time == \
        base.step_time


