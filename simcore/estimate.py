"""What an estimate returns: the step time and its parts, the peak memory and its parts.

Every convention (``megatron``, ``stage``, ``mlp``) returns an :class:`Estimate`. Times are
seconds, memory bytes. An infeasible plan (one that does not fit in HBM) is an estimate with
``fits=False`` and a reason, not an error.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["TimeParts", "MemoryParts", "StageEstimate", "Estimate"]


@dataclass(frozen=True, slots=True)
class TimeParts:
    """One training step, split into what the step waits for (seconds)."""

    compute: float
    """Forward, backward and recompute kernels on the critical path (steady state)."""
    tp: float = 0.0
    """Exposed tensor-parallel communication (all-reduce, or all-gather + reduce-scatter)."""
    sp: float = 0.0
    """Exposed context-parallel K/V exchange."""
    dp: float = 0.0
    """Exposed data-parallel gradient reduction (and ZeRO parameter all-gather)."""
    pp: float = 0.0
    """Exposed pipeline point-to-point transfers."""
    fsdp: float = 0.0
    """Exposed FSDP / ZeRO-3 weight all-gathers and gradient reduce-scatters."""
    ep: float = 0.0
    """An MoE model's expert-parallel all-to-alls (token dispatch and combine) and expert-tp
    collectives."""
    bubble: float = 0.0
    """Pipeline fill and drain."""
    optimizer: float = 0.0
    """The optimizer step."""
    comm: float = 0.0
    """Exposed communication not split by kind: the ``stage`` convention replays a trace and,
    as ASTRA-sim, reports its exposure as one figure."""
    offload: float = 0.0
    """Exposed activation offloading: copies to host memory and reloads that outlast the
    layers they run beside."""

    @property
    def total(self) -> float:
        # the fields in order, spelled out (a loop over them costs a tenth of an estimate)
        return (self.compute + self.tp + self.sp + self.dp + self.pp + self.fsdp + self.ep
                + self.bubble + self.optimizer + self.comm + self.offload)


@dataclass(frozen=True, slots=True)
class MemoryParts:
    """Peak memory of one device, split by what holds it (bytes)."""

    weights: float
    gradients: float = 0.0
    optimizer: float = 0.0
    activations: float = 0.0
    gathered_weights: float = 0.0
    """FSDP / ZeRO-3 weights gathered for the layers in use."""
    comm_buffers: float = 0.0
    overhead: float = 0.0
    """The stated allowance for framework, CUDA context and allocator."""
    tracked: float = 0.0
    """The ``stage`` convention's peak of live tensors by ASTRA-sim's memory tracker (weights,
    gradients and activations together, one byte per element as STAGE counts)."""
    step_copy: float = 0.0
    """What the optimizer step's fp32 copy of the 16-bit gradients adds to the peak beyond
    the backward's activations and communication buffers, which the step has freed
    (:attr:`simcore.specs.TrainingSpec.main_grad_copy`): the copy's bytes less them, 0 where
    the backward's peak is the higher."""

    @property
    def total(self) -> float:
        return (self.weights + self.gradients + self.optimizer + self.activations
                + self.gathered_weights + self.comm_buffers + self.overhead + self.tracked
                + self.step_copy)


@dataclass(frozen=True, slots=True)
class StageEstimate:
    """One pipeline stage: what it holds and how long one micro-batch takes on it."""

    stage: int
    layers: int
    micro_batch_time: float
    """Forward plus backward of one micro-batch on this stage, with its exposed communication."""
    in_flight: float
    """Micro-batches whose activations the stage holds at its peak (layer-weighted)."""
    memory: MemoryParts
    device: str = ""
    """The device type the stage runs on (a system may mix them, :mod:`simcore.mixed`)."""


@dataclass(frozen=True, slots=True)
class Estimate:
    convention: str
    step_time: float
    """Seconds per training step (= time.total)."""
    time: TimeParts
    memory: MemoryParts
    """The peak stage's memory."""
    peak_stage: int
    stages: tuple[StageEstimate, ...]
    model_flops: float
    """FLOP of one step without recompute (forward + backward, attention and LM head included)."""
    hardware_flops: float
    """FLOP of one step as executed (with recompute)."""
    mfu: float
    hfu: float
    tokens_per_s: float
    hbm_bytes: float
    fits: bool
    reason: str = ""
    """Why the plan does not fit; empty when it does."""

    @property
    def peak_memory(self) -> float:
        return self.memory.total

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["time"]["total"] = self.time.total
        out["memory"]["total"] = self.memory.total
        out["peak_memory"] = self.memory.total
        for stage, est in zip(out["stages"], self.stages):
            stage["memory"]["total"] = est.memory.total
        return out
