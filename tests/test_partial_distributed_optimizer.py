"""A distributed optimizer sharded within groups (``shard_group`` with ZeRO-1).

Megatron-LM's ``--num-distributed-optimizer-instances R`` (``megatron/core/distributed/
param_and_grad_buffer.py``, d98e8a64) keeps R copies of the distributed optimizer, each sharded
over dp * cp / R ranks: the gradients are reduce-scattered within an instance, each rank's shard
all-reduced across the R instances, and the updated weights all-gathered within the instance.
InternLM's ``zero1`` size (``hybrid_zero_optim.py``) shards the optimizer the same way. The
optimizer state (fp32 master weights and Adam's two moments, 12 bytes a parameter) is divided by
the shard group instead of the data-parallel group (Rajbhandari et al. 2020, section 5: ZeRO-1's
``K P / N_d``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

import simcore
from planner.cli import main
from planner.exports import export_files
from planner.plan import make_plan
from search_spaces.frameworks import why_not
from simcore.collectives import collective_time
from simcore.megatron.batched import estimate_many
from simcore.megatron.calls import grad_reduction_calls
from simcore.megatron.placement import DpPart
from simcore.megatron.plan import StepPlan
from simcore.network import Collective, Network, NetworkDim, Topology
from simcore.specs import Convention, Recompute, Strategy, SystemSpec, ZeroStage
from tests.test_hsdp import FAST, GB, MODEL, SLOW, SYSTEM, TRAINING

# the two-level network of tests/test_hsdp.py: a fast 4-GPU switch inside, a slow 4-GPU ring
# across
ZERO1 = Strategy(dp=16, pp=8, zero=ZeroStage.OPTIMIZER, recompute=Recompute.FULL)
"""Llama 3 70B in 8 stages, ZeRO-1 over all 16 dp ranks (16 x 8 = 128 GPUs: the 4 x 4 network
is the dp slot's)."""
GROUPED = replace(ZERO1, shard_group=4)
"""The optimizer sharded within the fast 4 (innermost), 4 copies across the slow ring."""


def _system() -> SystemSpec:
    return SystemSpec(name="4x4x8", device=SYSTEM.device,
                      network=Network(dims=(FAST, SLOW, NetworkDim(
                          topology=Topology.SWITCH, npus=8, bandwidth_bytes_per_s=25 * GB,
                          latency_s=5e-6))))


def test_the_collectives_by_hand() -> None:
    p = StepPlan(MODEL, _system(), TRAINING, GROUPED)
    params = 1e9
    reduce, gather = grad_reduction_calls(p, params)
    grads = 2 * params  # bf16 gradients
    assert reduce == [(DpPart.SHARD, Collective.REDUCE_SCATTER, grads),
                      (DpPart.REPLICATE, Collective.ALL_REDUCE, grads / 4)]
    assert gather == [(DpPart.SHARD, Collective.ALL_GATHER, 2 * params / 4)]
    # each on the dimension its group spans: the reduce-scatter and all-gather on the switch,
    # the all-reduce of a quarter of the gradients on the ring
    link = p.comm.total(reduce) + p.comm.total(gather)
    by_hand = (collective_time(Network(dims=(FAST,)), Collective.REDUCE_SCATTER,
                               int(grads)).time_s
               + collective_time(Network(dims=(SLOW,)), Collective.ALL_REDUCE,
                                 int(grads / 4)).time_s
               + collective_time(Network(dims=(FAST,)), Collective.ALL_GATHER,
                                 int(2 * params / 4)).time_s)
    launches = 3 * SYSTEM.device.collective_launch_s  # the host's cost of each call
    assert link == pytest.approx(by_hand + launches, rel=1e-9)


def test_the_optimizer_state_is_sharded_over_the_group() -> None:
    system = _system()
    whole = simcore.estimate(MODEL, system, TRAINING, ZERO1).memory
    grouped = simcore.estimate(MODEL, system, TRAINING, GROUPED).memory
    # K P / N_d with the shard group (4) in place of the dp group (16)
    assert grouped.optimizer == pytest.approx(4 * whole.optimizer, rel=1e-12)
    assert grouped.weights == whole.weights and grouped.gradients == whole.gradients


def test_the_same_bytes_cross_the_ring_and_the_update_is_four_times_longer() -> None:
    # ZeRO-1 over all 16 runs its collectives hierarchically (switch, then ring: the network's
    # dimensions in turn), so a quarter of the gradients crosses the ring either way: the same
    # link time to a part in a thousand (the latencies of the shorter calls apart). What the
    # groups change is the update: each rank steps a quarter of the stage's parameters, not a
    # sixteenth (Adam reads and writes each parameter's state once a step).
    system = _system()
    whole = simcore.estimate(MODEL, system, TRAINING, ZERO1)
    grouped = simcore.estimate(MODEL, system, TRAINING, GROUPED)
    assert grouped.time.dp == pytest.approx(whole.time.dp, rel=1e-3)
    assert grouped.time.optimizer == pytest.approx(4 * whole.time.optimizer, rel=1e-12)


def test_a_shard_group_of_the_whole_dp_group_is_zero1() -> None:
    system = _system()
    assert (simcore.estimate(MODEL, system, TRAINING, replace(ZERO1, shard_group=16))
            == simcore.estimate(MODEL, system, TRAINING, ZERO1))


def test_batched_equals_scalar() -> None:
    system = _system()
    strategies = [replace(ZERO1, shard_group=g) for g in (None, 1, 2, 4, 8)]
    batch = estimate_many(MODEL, system, TRAINING, strategies)
    for i, s in enumerate(strategies):
        e = simcore.estimate(MODEL, system, TRAINING, s)
        assert batch.step_time[i] == e.step_time and batch.peak_memory[i] == e.memory.total


def test_frameworks_and_the_megatron_export() -> None:
    assert why_not("megatron", MODEL, TRAINING, GROUPED) is None
    assert why_not("torchtitan", MODEL, TRAINING, GROUPED) is None
    refused = why_not("deepspeed", MODEL, TRAINING, GROUPED)
    assert refused is not None and refused.startswith("shard_group 4: DeepSpeed shards within")
    # on parts of 141 GB (an H200's): Megatron-LM's optimizer step copies its shard's 16-bit
    # gradients to fp32 (tests/test_main_grad_copy.py), 8.8 GB more, which puts this 70B plan
    # over an H100's 85.5 GB, so the export would refuse it there
    system = _system()
    system = replace(system, device=replace(system.device, hbm_bytes=141e9))
    plan = make_plan(MODEL, system, TRAINING, GROUPED, Convention.MEGATRON)
    assert plan.estimate.fits
    script = export_files(plan, "megatron")["megatron.sh"]
    assert "--use-distributed-optimizer" in script
    assert "--num-distributed-optimizer-instances 4" in script
    assert "--use-megatron-fsdp" not in script


def test_planner_estimate_names_it(capsys) -> None:
    code = main(["estimate", "--model", "llama3-70b", "--system", "dgx-h100-1024", "--tp", "8",
                 "--zero", "1", "--shard-group", "8", "--global-batch", "1024"])
    out = capsys.readouterr().out
    assert code == 0 and "optimizer sharded within 8 ranks" in out
