"""One micro-batch, op by op: the per-stage forward and backward times ``simcore.timeline``
schedules, split from the same terms :func:`simcore.megatron.step.estimate_megatron` sums."""

from __future__ import annotations

from dataclasses import dataclass, replace

from simcore.megatron.calls import embedding_calls, head_calls
from simcore.megatron.checks import check_plan
from simcore.megatron.layer_step import dense_layer, moe_layer
from simcore.megatron.parts import Ends, Layer
from simcore.megatron.pipeline import head_stage
from simcore.megatron.plan import StepPlan
from simcore.megatron.recompute import recomputed_share
from simcore.megatron.step import (
    _dp_time,
    _ends,
    _optimizer_time,
    _stage,
    partial_layers,
    pp_exposed,
)
from simcore.specs import ModelSpec, Strategy, SystemSpec, TrainingSpec

__all__ = ["OpTime", "StagePhases", "stage_phases"]


@dataclass(frozen=True, slots=True)
class OpTime:
    """One forward or one backward of one micro-batch through one model chunk of one stage, with
    its exposed communication (seconds). The parts add up to what the estimate charges."""

    compute: float
    """Forward (or backward) kernels, the LM head and loss included on the last chunk."""
    recompute: float = 0.0
    """Backward only: the forward recomputed before it (activation recomputation)."""
    tp: float = 0.0
    """Exposed tensor-parallel communication (the embedding's on the first chunk)."""
    sp: float = 0.0
    """Exposed context-parallel K/V exchange."""
    fsdp: float = 0.0
    """Exposed FSDP / ZeRO-3 weight all-gathers (and gradient reduce-scatters in backward)."""
    p2p: float = 0.0
    """The pipeline point-to-point exchange of this op: the estimate charges every stage one per
    forward and one per backward per chunk (Megatron-LM's blocking send/receive pairs)."""
    wgrad: float = 0.0
    """Backward only: the weight-gradient GEMMs within ``compute``, which a zero-bubble schedule
    runs as a pass of its own (W)."""
    ep: float = 0.0
    """An MoE model's expert all-to-alls (dispatch and combine) on the critical path."""
    offload: float = 0.0
    """Activation offloading's copies (forward) or reloads (backward) that outlast the
    compute they run beside."""

    @property
    def total(self) -> float:
        return (self.compute + self.recompute + self.tp + self.sp + self.fsdp + self.p2p
                + self.ep + self.offload)


@dataclass(frozen=True, slots=True)
class StagePhases:
    """One pipeline stage for one micro-batch, chunk by chunk, and its share of the step's end."""

    stage: int
    forward: tuple[OpTime, ...]
    """One per model chunk (v of them; one without interleaving)."""
    backward: tuple[OpTime, ...]
    dp_link: float
    """The stage's data-parallel gradient reduction (and ZeRO parameter all-gather), link time."""
    dp_exposed: float
    """The part of it the step waits for after the last backward."""
    optimizer: float

    @property
    def micro_batch_time(self) -> float:
        """Forward plus backward of one micro-batch over all chunks: the estimate's stage time."""
        return sum(op.total for op in self.forward) + sum(op.total for op in self.backward)


def _chunk_ops(p: StepPlan, layer: Layer, ends: Ends, i: int, compute: float,
               moe: Layer | None = None) -> tuple[list[OpTime], list[OpTime]]:
    """Forward and backward of each model chunk of stage ``i``: the terms of :func:`_stage`,
    split by direction (embedding on the first chunk of the first stage, LM head on the last
    chunk of the last stage; an MoE stage's MoE layers spread evenly over its chunks)."""
    s, v = p.s, p.s.v
    chunks = p.chunk_layers[i]  # layers of each chunk of this stage
    p2p = pp_exposed(p, compute) if s.pp > 1 else 0.0  # ``compute``: the stage's kernels
    fwd = [OpTime(compute=k * layer.fwd_compute, tp=k * layer.tp_fwd, sp=k * layer.sp_fwd,
                  fsdp=k * layer.fsdp_fwd, p2p=p2p, offload=k * layer.offload_fwd)
           for k in chunks]
    bwd = [OpTime(compute=k * layer.bwd_compute, recompute=k * layer.recompute,
                  tp=k * layer.tp_bwd, sp=k * layer.sp_bwd, fsdp=k * layer.fsdp_bwd, p2p=p2p,
                  wgrad=k * p.kernels.wgrad, offload=k * layer.offload_bwd) for k in chunks]
    if moe is not None and p.stage_moe_layers[i]:
        n = p.stage_moe_layers[i] / v  # of each chunk's layers, MoE ones
        fwd = [replace(op, compute=(k - n) * layer.fwd_compute + n * moe.fwd_compute,
                       tp=(k - n) * layer.tp_fwd + n * moe.tp_fwd, sp=(k - n) * layer.sp_fwd
                       + n * moe.sp_fwd, ep=n * moe.ep_fwd,
                       offload=(k - n) * layer.offload_fwd + n * moe.offload_fwd)
               for k, op in zip(chunks, fwd)]
        bwd = [replace(op, compute=(k - n) * layer.bwd_compute + n * moe.bwd_compute,
                       recompute=(k - n) * layer.recompute + n * moe.recompute,
                       tp=(k - n) * layer.tp_bwd + n * moe.tp_bwd, sp=(k - n) * layer.sp_bwd
                       + n * moe.sp_bwd, wgrad=(k - n) * p.kernels.wgrad + n * moe.wgrad,
                       ep=n * moe.ep_bwd,
                       offload=(k - n) * layer.offload_bwd + n * moe.offload_bwd)
               for k, op in zip(chunks, bwd)]
    if i == 0:
        embedding = p.comm.total(embedding_calls(p))
        fwd[0] = replace(fwd[0], compute=fwd[0].compute + ends.embedding_fwd,
                         tp=fwd[0].tp + embedding)
        bwd[0] = replace(bwd[0], compute=bwd[0].compute + ends.embedding_bwd)
    if i == head_stage(s.schedule, s.pp):
        gather = p.comm.total(head_calls(p, False))
        scatter = p.comm.total(head_calls(p, True))
        last_f, last_b = fwd[-1], bwd[-1]
        fwd[-1] = replace(last_f, compute=last_f.compute + ends.head_fwd, tp=last_f.tp + gather)
        bwd[-1] = replace(last_b, compute=last_b.compute + ends.head_bwd, tp=last_b.tp + scatter,
                          wgrad=last_b.wgrad + ends.head_wgrad)
    return fwd, bwd


def stage_phases(model: ModelSpec, system: SystemSpec, training: TrainingSpec,
                 strategy: Strategy) -> tuple[StagePhases, ...]:
    """Per stage, the forward and backward of one micro-batch per model chunk, split into compute
    and exposed communication, with the stage's gradient reduction and optimizer step: the
    quantities :func:`estimate_megatron` sums, for a timeline of the step.

    Each stage's ``micro_batch_time`` is the estimate's stage time; the estimate's dp and
    optimizer parts are the maxima over the stages of ``dp_exposed`` and ``optimizer``.
    """
    check_plan(model, system, training, strategy)
    p = StepPlan(model, system, training, strategy)
    layer = dense_layer(p)
    moe = moe_layer(p) if p.moe is not None else None
    ends = _ends(p)
    out = []
    for i in range(strategy.pp):
        stage = _stage(p, layer, ends, i, moe=moe)
        dense, sparse = layer, moe
        share = recomputed_share(p, i, stage.layers, strategy.pp)
        if share < 1.0:  # recompute_layers: each chunk's average layer is the stage's
            dense, sparse = partial_layers(p, layer, moe, share)
        fwd, bwd = _chunk_ops(p, dense, ends, i, stage.compute, sparse)
        link, exposed = _dp_time(p, stage)
        out.append(StagePhases(i, tuple(fwd), tuple(bwd), link, exposed,
                               _optimizer_time(p, stage)))
    return tuple(out)
