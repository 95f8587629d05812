"""The ``mlp`` convention: the DistIR study's stack of matmul + ReLU layers.

Santhanam et al., "DistIR: An Intermediate Representation for Optimizing Distributed Neural
Networks" (EuroMLSys 2021), section 5: an MLP of ``layers`` square matmuls of width ``hidden``,
each followed by a ReLU, trained with data parallelism (dp), horizontal (tensor) parallelism
(hp = the strategy's tp) and pipeline parallelism (pp) with micro-batches, on a fully connected
topology. Horizontal parallelism splits pairs of layers Megatron-style (the first by columns, the
second by rows) and all-reduces the pair's output, forward and backward. Weights, activations and
gradients are fp32 (4 bytes), plain SGD (no optimizer state).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from simcore.estimate import Estimate, MemoryParts, StageEstimate, TimeParts
from simcore.megatron.pipeline import in_flight, pipeline_time
from simcore.megatron.placement import axis_networks
from simcore.network import Collective
from simcore.specs import Axis, ModelSpec, Strategy, SystemSpec, TrainingSpec

__all__ = ["BYTES", "check_mlp", "estimate_mlp", "valid_mlp_plans"]

BYTES = 4
"""fp32 weights, activations and gradients."""


def check_mlp(model: ModelSpec, system: SystemSpec, training: TrainingSpec, s: Strategy) -> None:
    if s.devices != system.devices:
        raise ValueError(
            f"dp*tp*pp*sp must equal the device count, but got {s.devices} for"
            f" {system.devices} devices"
        )
    if s.sp != 1:
        raise ValueError(f"the mlp family has no sequence to split; sp must be 1, not {s.sp}")
    if model.hidden % s.tp:
        raise ValueError(f"tp={s.tp} must divide hidden={model.hidden} (hp splits the width)")
    if model.layers % s.pp:
        raise ValueError(f"pp={s.pp} must divide layers={model.layers}")
    if training.global_batch % (s.dp * s.micro_batch):
        raise ValueError(
            f"dp*micro_batch={s.dp * s.micro_batch} must divide"
            f" global_batch={training.global_batch}"
        )


def valid_mlp_plans(model: ModelSpec, system: SystemSpec, training: TrainingSpec,
                    columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """:func:`check_mlp` over arrays of strategies (columns as
    :func:`simcore.megatron.checks.valid_plans` takes them): True where it would pass."""
    dp, tp, pp, sp = (np.asarray(columns[k], np.int64) for k in ("dp", "tp", "pp", "sp"))
    mb = np.asarray(columns["micro_batch"], np.int64)
    return ((dp * tp * pp * sp == system.devices) & (sp == 1) & (model.hidden % tp == 0)
            & (model.layers % pp == 0) & (training.global_batch % (dp * mb) == 0))


def estimate_mlp(model: ModelSpec, system: SystemSpec, training: TrainingSpec,
                 strategy: Strategy) -> Estimate:
    """Throughput and memory of the DistIR MLP under (dp, hp = tp, pp, micro-batches)."""
    s = strategy
    check_mlp(model, system, training, s)
    device = system.device
    w, b = model.hidden, s.micro_batch
    n = model.layers // s.pp
    m = training.global_batch // (s.dp * b)
    nets = axis_networks(system.network, {Axis.DP: s.dp, Axis.TP: s.tp, Axis.PP: s.pp,
                                          Axis.SP: 1}, s.placement)
    flop_rate = device.peak_flops_per_s * device.matmul_efficiency
    byte_rate = device.hbm_bandwidth_bytes_per_s * device.memory_efficiency
    fwd_layer = 2 * b * w * w / s.tp / flop_rate + 2 * b * w * BYTES / byte_rate  # matmul + ReLU
    compute = 3 * n * fwd_layer  # backward = 2 x forward
    pair_ar = nets.collective(Axis.TP, Collective.ALL_REDUCE, b * w * BYTES)
    tp = 2 * (n / 2) * pair_ar if s.tp > 1 else 0.0  # one all-reduce per layer pair, fwd and bwd
    pp = 2 * nets.p2p(Axis.PP, b * w * BYTES) if s.pp > 1 else 0.0
    stage_time = compute + tp + pp
    pipe, _ = pipeline_time([stage_time] * s.pp, m, 1)
    params = n * w * w / s.tp
    dp_link = nets.collective(Axis.DP, Collective.ALL_REDUCE, params * BYTES)
    optimizer = 3 * params * BYTES / byte_rate  # SGD: read weight and gradient, write weight
    time = TimeParts(compute=m * compute, tp=m * tp, pp=m * pp, bubble=pipe - m * stage_time,
                     dp=dp_link, optimizer=optimizer)
    flight = in_flight(s.schedule, 0, s.pp, m, 1)
    memory = MemoryParts(weights=params * BYTES, gradients=params * BYTES,
                         activations=n * b * w * BYTES * 2 * flight,  # matmul and ReLU outputs
                         overhead=device.memory_overhead_bytes)
    step = time.total
    flops = 3 * 2 * training.global_batch * w * w * model.layers
    capacity = device.peak_flops_per_s * s.devices * step
    fits = memory.total <= device.hbm_bytes
    reason = "" if fits else (f"needs {memory.total / 1e9:.1f} GB > {device.hbm_bytes / 1e9:.1f}"
                              " GB of HBM")
    stages = (StageEstimate(0, n, stage_time, flight, memory),)
    return Estimate(convention="mlp", step_time=step, time=time, memory=memory, peak_stage=0,
                    stages=stages, model_flops=flops, hardware_flops=flops, mfu=flops / capacity,
                    hfu=flops / capacity, tokens_per_s=training.global_batch / step,
                    hbm_bytes=device.hbm_bytes, fits=fits, reason=reason)
