"""``estimate()`` for ``stage``-family models: STAGE recomp's graph replayed as ASTRA-sim would.

The mapping from specs to STAGE's arguments: dmodel = hidden, dff = ffn_hidden, head = heads,
seq = the training sequence, batch = the global batch, num_stacks = layers, din = dout = vocab;
weight_sharded = ZeRO-3 / FSDP; activation_recompute = any recompute. The device's peak FLOP/s
and HBM bandwidth are used as ASTRA-sim's peak-perf and local-mem-bw, as the lab's files give
them (STAGE counts one multiply-accumulate as one op and one element as one byte).
"""

from __future__ import annotations

from simcore.estimate import Estimate, MemoryParts, StageEstimate, TimeParts
from simcore.specs import ModelSpec, Recompute, Strategy, SystemSpec, TrainingSpec, ZeroStage
from simcore.stage import StageArgs, astra_estimate, check_args, model_num_ops

__all__ = ["check_stage", "estimate_stage", "stage_args"]

NS = 1e-9


def stage_args(model: ModelSpec, training: TrainingSpec, strategy: Strategy) -> StageArgs:
    return StageArgs(
        dp=strategy.dp, tp=strategy.tp, pp=strategy.pp, sp=strategy.sp,
        weight_sharded=strategy.zero is ZeroStage.PARAMETERS,
        activation_recompute=strategy.recompute is not Recompute.NONE,
        din=model.vocab, dout=model.vocab, dmodel=model.hidden, dff=model.ffn_hidden,
        head=model.heads, seq=training.seq_len, batch=training.global_batch,
        num_stacks=model.layers,
    )


def check_stage(model: ModelSpec, system: SystemSpec, training: TrainingSpec,
                strategy: Strategy) -> StageArgs:
    """STAGE's arguments for this plan; ValueError if STAGE could not build it."""
    if strategy.devices != system.devices:
        raise ValueError(
            f"dp*tp*pp*sp must equal the device count, but got {strategy.devices} for"
            f" {system.devices} devices"
        )
    args = stage_args(model, training, strategy)
    check_args(args)
    return args


def estimate_stage(model: ModelSpec, system: SystemSpec, training: TrainingSpec,
                   strategy: Strategy) -> Estimate:
    args = check_stage(model, system, training, strategy)
    device = system.device
    result = astra_estimate(args, system.network,
                            peak_ops_per_s=device.peak_flops_per_s,
                            local_mem_bytes_per_s=device.hbm_bandwidth_bytes_per_s)
    step = result.max_wall_time_all_ranks * NS
    gpu = result.gpu_time * NS
    time = TimeParts(compute=gpu, comm=max(0.0, step - gpu))
    memory = MemoryParts(weights=0.0, tracked=float(result.max_peak_memory_all_ranks))
    # MACs -> FLOP, rank 0 as typical. MFU counts the model's work (no recompute), HFU what ran.
    hardware_flops = 2.0 * result.et0.sum_num_ops * strategy.devices
    model_ops = model_num_ops(args) if args.activation_recompute else result.et0.sum_num_ops
    model_flops = 2.0 * model_ops * strategy.devices
    capacity = device.peak_flops_per_s * 2 * strategy.devices * step
    fits = memory.total <= device.hbm_bytes
    reason = "" if fits else _reason(result.max_peak_memory_all_ranks, device.hbm_bytes)
    stages = (StageEstimate(0, model.layers, step, 1.0, memory),)
    return Estimate(convention="stage", step_time=step, time=time, memory=memory, peak_stage=0,
                    stages=stages, model_flops=model_flops, hardware_flops=hardware_flops,
                    mfu=model_flops / capacity, hfu=hardware_flops / capacity,
                    tokens_per_s=training.global_batch * training.seq_len / step,
                    hbm_bytes=device.hbm_bytes, fits=fits, reason=reason)


def _reason(tracked: int, hbm: float) -> str:
    """Why the plan does not fit, in GB (1e9 bytes) like the other conventions; the tracker's
    own figure (elements, one byte each in STAGE) on its own, labelled."""
    return (f"the worst rank needs {tracked / 1e9:.1f} GB > {hbm / 1e9:.1f} GB of HBM"
            f" (ASTRA-sim's memory tracker: {tracked:,} elements of one byte)")
