"""The shape rules a Megatron-style plan must obey; each failure is one line naming the field
and what is allowed (a ValueError)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from simcore.megatron.precision import fp8_problem
from simcore.specs import (
    Axis,
    CpComm,
    ModelSpec,
    Recompute,
    RecomputeModule,
    Schedule,
    Strategy,
    SystemSpec,
    TrainingSpec,
    ZeroStage,
)

__all__ = ["check_plan", "micro_batches", "recompute_modules_problem", "valid_plans"]


def _divisors(n: int) -> str:
    found = [d for d in range(1, n + 1) if n % d == 0]
    shown = found if len(found) <= 12 else found[:6] + ["..."] + found[-3:]
    return ", ".join(map(str, shown))


def _must_divide(field: str, degree: int, what: str, total: int, why: str) -> None:
    if total % degree:
        raise ValueError(
            f"{field}={degree} must divide {what}={total} ({why}); allowed {field}:"
            f" {_divisors(total)}"
        )


def recompute_modules_problem(model: ModelSpec, training: TrainingSpec) -> str | None:
    """Why Megatron-LM would refuse the training's ``recompute_modules`` for this model, or None:
    ``mla_up_proj`` "is only supported with multi_latent_attention"
    (``megatron/core/transformer/transformer_config.py``, d98e8a64)."""
    modules = training.recompute_modules or ()
    if RecomputeModule.MLA_UP_PROJ in modules and model.mla_latent is None:
        return (f"recompute_modules mla_up_proj needs multi-head latent attention, but"
                f" {model.name} has none (a model entry gives mla_latent and mla_up_params);"
                " drop mla_up_proj")
    return None


def micro_batches(training: TrainingSpec, strategy: Strategy) -> int:
    """Micro-batches per pipeline per step: global batch / (dp * micro-batch)."""
    return training.global_batch // (strategy.dp * strategy.micro_batch)


def check_plan(
    model: ModelSpec, system: SystemSpec, training: TrainingSpec, strategy: Strategy
) -> None:
    s = strategy
    if s.devices != system.devices:
        raise ValueError(
            f"dp*tp*pp*sp must equal the device count, but dp={s.dp} * tp={s.tp} * pp={s.pp}"
            f" * sp={s.sp} = {s.devices} and {system.name} has {system.devices} devices"
        )
    _must_divide("tp", s.tp, "heads", model.heads, "tensor parallelism splits the heads")
    _must_divide("tp", s.tp, "kv_heads", model.n_kv_heads, "each rank holds whole K/V heads")
    _must_divide("tp", s.tp, "ffn_hidden", model.ffn_hidden, "tp splits the MLP columns")
    if s.uneven:
        _check_uneven(model, s)
    elif model.layers % (s.pp * s.v):
        raise ValueError(
            f"pp*v={s.pp * s.v} must divide layers={model.layers} (each stage holds as many"
            f" layers); allowed pp*v: {_divisors(model.layers)}"
        )
    _must_divide("sp", s.sp, "seq_len", training.seq_len, "context parallelism splits the sequence")
    if training.cp_comm is CpComm.A2A and s.sp > 1:
        for what, heads in (("heads", model.heads), ("kv_heads", model.n_kv_heads)):
            _must_divide("sp", s.sp, f"{what}/tp", heads // s.tp,
                         "cp_comm a2a gives each rank cp-th of a tp rank's heads")
    if s.sequence_parallel and s.tp > 1:
        _must_divide("tp", s.tp, "seq_len/sp", training.seq_len // s.sp,
                     "sequence parallelism splits the sequence over tp")
    replicas = s.dp * s.micro_batch
    if training.global_batch % s.dp:  # no micro-batch can tile it: say so, not "divisors of"
        raise ValueError(
            f"dp={s.dp} must divide global_batch={training.global_batch} (each data-parallel"
            " replica takes an equal share of the batch); change the batch or dp")
    if training.global_batch % replicas:
        raise ValueError(
            f"dp*micro_batch={replicas} must divide global_batch={training.global_batch}"
            " (micro-batches tile the batch); allowed micro_batch:"
            f" divisors of {training.global_batch // s.dp}"
        )
    _check_experts(model, s)
    if s.recompute is Recompute.SELECTIVE and training.recompute_modules is not None:
        problem = recompute_modules_problem(model, training)
        if problem is not None:
            raise ValueError(problem)
    if s.precision.quantized:
        problem = fp8_problem(system.device, s.precision)
        if problem is not None:
            raise ValueError(problem)
    if s.offload_layers is not None:
        _check_offload(model, system, s.offload_layers)
    if s.schedule is Schedule.ZB_H1 and s.pp < 2:
        raise ValueError("schedule=zb-h1 needs pp >= 2; use 1f1b with pp=1")
    if s.schedule is Schedule.ZBV:
        _check_zbv(training, s)
    if s.schedule is Schedule.INTERLEAVED:
        if s.pp < 2:
            raise ValueError("schedule=interleaved needs pp >= 2; use 1f1b with pp=1")
        m = micro_batches(training, s)
        if m % s.pp:
            raise ValueError(
                f"schedule=interleaved needs the micro-batch count ({m}) to be a multiple of"
                f" pp={s.pp}; change micro_batch or dp, or use schedule=1f1b"
            )


def _check_offload(model: ModelSpec, system: SystemSpec, n: int) -> None:
    """Activation offloading (:attr:`Strategy.offload_layers`): fewer layers than the model's
    (Megatron-Core refuses all of them), over a host link the device's entry states."""
    if n >= model.layers:
        raise ValueError(f"offload_layers={n} must be below the model's {model.layers} layers"
                         " (Megatron-Core offloads fewer than all of them)")
    if system.device.host_bandwidth_bytes_per_s is None:
        raise ValueError(f"offload_layers needs the device's link to host memory, but"
                         f" {system.device.name} has no host_bandwidth_gbps in its catalog"
                         " entry; add it (GB/s each way) or drop offload_layers")


def _check_zbv(training: TrainingSpec, s: Strategy) -> None:
    """zbv: a pipeline of equal chunks, filled. The closed form of its bubble
    (:func:`simcore.megatron.pipeline.zbv_bubble`) holds from 2p - 1 micro-batches, the count
    PyTorch's schedule pads its order to; with fewer the V never fills and the step is not
    modelled. The first and last chunks' counts (torchtitan's ``less_layers``, both on rank 0)
    are not modelled either."""
    if s.pp < 2:
        raise ValueError("schedule=zbv needs pp >= 2; use 1f1b with pp=1")
    if s.uneven:
        raise ValueError("schedule=zbv is modelled with equal chunks only; drop"
                         " first_stage_layers / last_stage_layers or use 1f1b or interleaved")
    m = micro_batches(training, s)
    if m < 2 * s.pp - 1:
        raise ValueError(
            f"schedule=zbv needs at least 2*pp-1={2 * s.pp - 1} micro-batches to fill its V,"
            f" but gets {m}; lower micro_batch or dp, or use 1f1b or interleaved")


def _check_experts(model: ModelSpec, s: Strategy) -> None:
    """Expert parallelism's rules (Megatron-LM ``megatron/training/arguments.py`` and
    ``parallel_state.py``): ep divides the experts, etp each expert's FFN; with tp > 1 the
    tokens entering an MoE layer are split by sequence parallelism; the expert grid keeps pp
    outermost as the dense one does."""
    moe = model.moe
    if s.ep_overlap and s.ep == 1:
        raise ValueError("ep_overlap overlaps the expert all-to-alls, which need ep > 1")
    if s.ep_dedup and s.ep == 1:
        raise ValueError("ep_dedup deduplicates the expert all-to-alls, which need ep > 1")
    if moe is None:
        if s.ep > 1 or (s.etp is not None and s.etp != s.tp):
            raise ValueError(f"ep={s.ep}, etp={s.expert_tp}: expert parallelism needs a model"
                             f" with MoE layers, and {model.name} has none; use ep=1")
        return
    _must_divide("ep", s.ep, "experts", moe.experts, "each rank holds whole experts")
    _must_divide("etp", s.expert_tp, "expert_ffn", moe.expert_ffn,
                 "expert tensor parallelism splits each expert's FFN")
    if moe.shared_width:
        _must_divide("tp", s.tp, "shared experts' width", moe.shared_width,
                     "tp splits the shared experts' FFN")
    if s.tp > 1 and not s.sequence_parallel:
        raise ValueError(f"tp={s.tp} with MoE layers needs sequence parallelism (Megatron-LM"
                         " requires --sequence-parallel with experts and tensor parallelism)")
    if s.placement[-1] != Axis.PP:
        raise ValueError("MoE plans need pp outermost in the placement (the expert grid"
                         " etp x ep x edp regroups the ranks inside each pipeline stage)")
    if s.zero is ZeroStage.PARAMETERS:
        raise ValueError("zero=3 (FSDP) of an MoE model is not modelled yet; use zero 0, 1 or"
                         " 2 (DeepSeek-V3 trained with ZeRO-1)")


def _check_uneven(model: ModelSpec, s: Strategy) -> None:
    """Megatron-LM's rules for uneven stages (``transformer_config.py`` d98e8a64, "Uneven PP"):
    the middle stages split the rest evenly, and with virtual stages each stage's count is a
    multiple of v (``arguments.py``: set v by ``--num-virtual-stages-per-pipeline-rank``), or the
    first / last stage is one layer short of the others' multiple of v, the embedding / loss
    counted as a layer (``--account-for-embedding/loss-in-pipeline-split``,
    :meth:`Strategy.short_ends`)."""
    counts = s.stage_layers(model.layers)  # one line when the rest does not split
    if s.layout is not None:
        if sum(counts) != model.layers:
            raise ValueError(f"layout holds {sum(counts)} transformer layers, but the model"
                             f" has {model.layers}")
        return
    if s.v > 1 and any(n % s.v for n in counts) and s.short_ends(model.layers) is None:
        raise ValueError(
            f"v={s.v} must divide every stage's layers ({', '.join(map(str, counts))}), or the"
            " first / last stage be one layer short of the others' multiple of v (Megatron-LM's"
            " uneven pipeline and account-for-embedding/loss splits)"
        )


def valid_plans(model: ModelSpec, system: SystemSpec, training: TrainingSpec,
                columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """:func:`check_plan` over many strategies at once: True where it would pass. ``columns``
    holds equal-length integer arrays ``dp``, ``tp``, ``pp``, ``sp``, ``micro_batch``, ``v`` and
    boolean arrays ``interleaved`` and ``sequence_parallel`` (the rules in the same order); and
    optionally ``first_stage_layers`` and ``last_stage_layers`` (0 for an equal share),
    boolean ``zero_bubble`` (schedule zb-h1 or zbv) and boolean ``zbv``."""
    dp, tp, pp, sp = (np.asarray(columns[k], np.int64) for k in ("dp", "tp", "pp", "sp"))
    mb, v = np.asarray(columns["micro_batch"], np.int64), np.asarray(columns["v"], np.int64)
    interleaved = np.asarray(columns["interleaved"], bool)
    seqpar = np.asarray(columns["sequence_parallel"], bool)
    seq, batch = training.seq_len, training.global_batch
    ok = dp * tp * pp * sp == system.devices
    for total in (model.heads, model.n_kv_heads, model.ffn_hidden):
        ok &= total % tp == 0
    first = np.asarray(columns.get("first_stage_layers", np.zeros_like(pp)), np.int64)
    last = np.asarray(columns.get("last_stage_layers", np.zeros_like(pp)), np.int64)
    ok &= _stages_ok(model.layers, pp, v, first, last)
    if "zero_bubble" in columns:
        ok &= ~np.asarray(columns["zero_bubble"], bool) | (pp >= 2)
    ok &= seq % sp == 0
    if training.cp_comm is CpComm.A2A:  # check_plan's heads per tp rank over sp
        for heads in (model.heads, model.n_kv_heads):
            ok &= (sp == 1) | ((heads // np.maximum(tp, 1)) % sp == 0)
    ok &= ~(seqpar & (tp > 1)) | ((seq // sp) % tp == 0)
    ok &= batch % (dp * mb) == 0
    m = batch // (dp * mb)
    ok &= ~interleaved | ((pp >= 2) & (m % pp == 0))
    if "zbv" in columns:  # _check_zbv
        zbv = np.asarray(columns["zbv"], bool)
        ok &= ~zbv | ((pp >= 2) & (first == 0) & (last == 0) & (m >= 2 * pp - 1))
    return ok


def _stages_ok(layers: int, pp: np.ndarray, v: np.ndarray, first: np.ndarray,
               last: np.ndarray) -> np.ndarray:
    """:func:`check_plan`'s layer rules over arrays (first, last = 0: an equal share)."""
    even = (first == 0) & (last == 0)
    rest = layers - first - last
    middle_stages = pp - (first > 0) - (last > 0)
    split = np.where(middle_stages > 0, (rest > 0) & (rest % np.maximum(middle_stages, 1) == 0),
                     rest == 0)
    middle = rest // np.maximum(middle_stages, 1)
    chunks = (first % v == 0) & (last % v == 0) & ((middle_stages == 0) | (middle % v == 0))
    # or the first / last stage one layer short of N slots per stage (Strategy.short_ends)
    first_count = np.where(first > 0, first, middle)
    last_count = np.where(last > 0, last, middle)
    n = first_count + (first_count % v != 0)
    short = ((n % v == 0) & ((first_count == n) | (first_count == n - 1))
             & ((last_count == n) | (last_count == n - 1))
             & ((middle_stages == 0) | (middle == n)))
    chunks |= short
    uneven = (pp >= 2) & (rest >= 0) & split & chunks
    return np.where(even, layers % (pp * v) == 0, uneven)
