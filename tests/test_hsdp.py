"""HSDP (``Strategy.shard_group``): ZeRO-3 sharded within a shard group, replicated across.

Memory: ZeRO-3's ``16 P / N_d`` (Rajbhandari et al. 2020, section 5) with the shard group in
place of the data-parallel group. Time: the per-layer all-gather and reduce-scatter over the shard
group, and one all-reduce of each rank's gradient shard across the replicas per step (PyTorch
FSDP2 on a 2-D mesh, torchtitan's ``dp_replicate`` x ``dp_shard``), timed on the network
dimension each group spans.
"""

from __future__ import annotations

import tomllib
from dataclasses import replace

import pytest

import simcore
from planner.catalog import load_catalog
from planner.exports import export_files
from planner.plan import make_plan, strategy_dict, strategy_from_attrs
from search_spaces.frameworks import why_not
from search_spaces.space import StrategySpace
from simcore.collectives import collective_time
from simcore.megatron.batched import estimate_many
from simcore.megatron.calls import fsdp_layer_calls, grad_reduction_calls
from simcore.megatron.layers import layer_shape
from simcore.megatron.placement import DpPart
from simcore.megatron.plan import StepPlan
from simcore.network import Collective, Network, NetworkDim, Topology
from simcore.specs import (
    Axis,
    Convention,
    Recompute,
    Strategy,
    SystemSpec,
    TrainingSpec,
    ZeroStage,
)

CATALOG = load_catalog()
MODEL = CATALOG.model("llama3-70b")
GB = 1e9
FAST = NetworkDim(topology=Topology.SWITCH, npus=4, bandwidth_bytes_per_s=400 * GB,
                  latency_s=1e-6)
SLOW = NetworkDim(topology=Topology.RING, npus=4, bandwidth_bytes_per_s=25 * GB, latency_s=5e-6)
SYSTEM = SystemSpec(name="4x4", device=CATALOG.device("h100-sxm"),
                    network=Network(dims=(FAST, SLOW)))
"""16 GPUs: a fast 4-GPU switch inside, a slow 4-GPU ring across."""
TRAINING = TrainingSpec(global_batch=32, seq_len=2048, overlap_grad_reduce=False)
ZERO3 = Strategy(dp=16, zero=ZeroStage.PARAMETERS, recompute=Recompute.FULL)
HSDP = replace(ZERO3, shard_group=4)
"""Shard within the fast 4 (innermost), replicate x 4 across the slow ring."""


def test_hsdp_memory_is_zero3_with_the_shard_group_for_the_dp_group() -> None:
    shape = layer_shape(MODEL)
    params = MODEL.layers * shape.layer_params + shape.embedding_params + shape.head_params
    mem = simcore.estimate(MODEL, SYSTEM, TRAINING, HSDP).memory
    # PyTorch FSDP's fp32 shards (simcore.megatron.stack.uses_fp32_shards): no 16-bit shard, 4
    # bytes of fp32 gradient and 12 of master weights and Adam's moments per parameter, each / 4
    # (the shard group), not / 16 (the dp group)
    assert mem.weights == 0.0
    assert mem.gradients == pytest.approx(4 * params / 4, rel=1e-12)
    assert mem.optimizer == pytest.approx(12 * params / 4, rel=1e-12)
    full = simcore.estimate(MODEL, SYSTEM, TRAINING, ZERO3).memory
    assert mem.gradients == pytest.approx(4 * full.gradients, rel=1e-12)
    assert mem.optimizer == pytest.approx(4 * full.optimizer, rel=1e-12)
    assert mem.gathered_weights == full.gathered_weights  # one layer gathered either way


def test_fsdp_collectives_run_over_the_shard_group() -> None:
    p = StepPlan(MODEL, SYSTEM, TRAINING, HSDP)
    gathers, scatters = fsdp_layer_calls(p)
    layer = layer_shape(MODEL).layer_params
    assert gathers == [(DpPart.SHARD, Collective.ALL_GATHER, 2 * layer / 4)]
    assert scatters == [(DpPart.SHARD, Collective.REDUCE_SCATTER, 2 * layer)]
    # the shard part sits on the fast switch: same time as a collective on FAST alone
    launch = SYSTEM.device.collective_launch_s
    alone = collective_time(Network(dims=(FAST,)), Collective.ALL_GATHER, int(2 * layer / 4))
    assert p.comm.total(gathers) == pytest.approx(alone.time_s + launch, rel=1e-12)


def test_replica_all_reduce_is_timed_on_the_replica_dimension() -> None:
    p = StepPlan(MODEL, SYSTEM, TRAINING, HSDP)
    shape = layer_shape(MODEL)
    params = MODEL.layers * shape.layer_params + shape.embedding_params + shape.head_params
    reduce, gather = grad_reduction_calls(p, params)
    shard = 2 * params / 4  # each rank's bf16 gradient shard
    assert reduce == [(DpPart.REPLICATE, Collective.ALL_REDUCE, shard)] and gather == []
    # once per step, not overlapped (overlap_grad_reduce False): the ring of 4 across
    ring = collective_time(Network(dims=(SLOW,)), Collective.ALL_REDUCE, int(shard)).time_s
    est = simcore.estimate(MODEL, SYSTEM, TRAINING, HSDP)
    assert est.time.dp == pytest.approx(ring + SYSTEM.device.collective_launch_s, rel=1e-12)
    fast = collective_time(Network(dims=(FAST,)), Collective.ALL_REDUCE, int(shard)).time_s
    assert ring > 2 * fast  # the slow dimension, not the switch
    assert simcore.estimate(MODEL, SYSTEM, TRAINING, ZERO3).time.dp == 0.0


def test_a_shard_group_of_the_whole_dp_group_is_zero3() -> None:
    whole = simcore.estimate(MODEL, SYSTEM, TRAINING, replace(ZERO3, shard_group=16))
    assert whole == simcore.estimate(MODEL, SYSTEM, TRAINING, ZERO3)


def test_shard_group_rules() -> None:
    for zero in (ZeroStage.NONE, ZeroStage.GRADIENTS):
        with pytest.raises(ValueError, match="needs zero=1 .* or zero=3"):
            Strategy(dp=16, zero=zero, shard_group=4)
    with pytest.raises(ValueError, match="multiple of sp=2"):
        Strategy(dp=8, sp=2, zero=ZeroStage.PARAMETERS, shard_group=3)
    with pytest.raises(ValueError, match="dividing dp\\*sp=16"):
        Strategy(dp=16, zero=ZeroStage.PARAMETERS, shard_group=5)


def test_batched_equals_scalar_with_shard_groups() -> None:
    strategies = [replace(ZERO3, shard_group=g) for g in (None, 1, 2, 4, 8)]
    strategies += [replace(ZERO3, dp=8, sp=2, shard_group=g) for g in (2, 4)]
    batch = estimate_many(MODEL, SYSTEM, TRAINING, strategies)
    for i, s in enumerate(strategies):
        e = simcore.estimate(MODEL, SYSTEM, TRAINING, s)
        assert batch.step_time[i] == e.step_time and batch.peak_memory[i] == e.memory.total


def test_space_enumerates_shard_groups_only_with_zero1_and_zero3() -> None:
    space = StrategySpace(model=MODEL, system=SYSTEM, training=TRAINING,
                          convention=Convention.MEGATRON, tp=(1,), zero=tuple(ZeroStage),
                          recompute=(Recompute.FULL,), shard_group=(0, 4, 8, 16))
    found = {(s.zero, s.shard_group) for s in space.valid}
    assert found == {(z, None) for z in ZeroStage} | {
        (z, g) for z in (ZeroStage.OPTIMIZER, ZeroStage.PARAMETERS) for g in (4, 8)}
    assert set(space.valid) == {s for s in space.candidates()
                                   if space.reason_invalid(s) is None}


def test_frameworks_and_exports_write_the_shard_group() -> None:
    for framework in ("megatron", "torchtitan"):
        assert why_not(framework, MODEL, TRAINING, HSDP) is None
    # DeepSpeed shards within groups only as MiCS, whose model must be built under
    # deepspeed.zero.MiCS_Init (mics.py's assertion), which Megatron-DeepSpeed's pretrain_gpt.py
    # does not do (4efb479d: deepspeed.zero.Init)
    assert "MiCS_Init" in why_not("deepspeed", MODEL, TRAINING, HSDP)
    plan = make_plan(MODEL, SYSTEM, TRAINING, HSDP, Convention.MEGATRON)
    toml = tomllib.loads(export_files(plan, "torchtitan")["torchtitan.toml"])
    assert toml["parallelism"]["data_parallel_shard_degree"] == 4
    assert toml["parallelism"]["data_parallel_replicate_degree"] == 4
    script = export_files(plan, "megatron")["megatron.sh"]
    assert "--use-megatron-fsdp" in script
    assert "--num-distributed-optimizer-instances 4" in script
    with pytest.raises(ValueError, match="MiCS_Init"):
        export_files(plan, "deepspeed")
    assert strategy_from_attrs(strategy_dict(HSDP)) == HSDP
    assert Axis.DP in StepPlan(MODEL, SYSTEM, TRAINING, HSDP).comm.nets.networks
