"""What a batched estimate returns: the figures of :class:`simcore.estimate.Estimate` as numpy
arrays over the strategies, one element per strategy in the order given."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from simcore.estimate import Estimate, MemoryParts, TimeParts

__all__ = ["BatchResult", "MemoryColumns", "TimeColumns", "from_estimates", "merge"]


@dataclass(frozen=True, slots=True)
class TimeColumns:
    """:class:`TimeParts` over the strategies (seconds)."""

    compute: np.ndarray
    tp: np.ndarray
    sp: np.ndarray
    dp: np.ndarray
    pp: np.ndarray
    fsdp: np.ndarray
    ep: np.ndarray
    bubble: np.ndarray
    optimizer: np.ndarray
    comm: np.ndarray
    offload: np.ndarray


@dataclass(frozen=True, slots=True)
class MemoryColumns:
    """:class:`MemoryParts` of each strategy's peak stage (bytes)."""

    weights: np.ndarray
    gradients: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    gathered_weights: np.ndarray
    comm_buffers: np.ndarray
    overhead: np.ndarray
    tracked: np.ndarray
    step_copy: np.ndarray


TIME_PARTS = tuple(f.name for f in fields(TimeParts))
MEMORY_PARTS = tuple(f.name for f in fields(MemoryParts))
"""The parts' names, in their ``total``'s order (tests check the columns name the same)."""


@dataclass(frozen=True, slots=True)
class BatchResult:
    """Each figure of :class:`Estimate` (but the per-stage detail and the reason text) as an
    array over the strategies; ``peak_memory`` is ``memory.total``."""

    step_time: np.ndarray
    time: TimeColumns
    memory: MemoryColumns
    peak_memory: np.ndarray
    peak_stage: np.ndarray
    """Index of the stage whose memory comes closest to its device's HBM (int64)."""
    model_flops: np.ndarray
    hardware_flops: np.ndarray
    mfu: np.ndarray
    hfu: np.ndarray
    tokens_per_s: np.ndarray
    hbm_bytes: np.ndarray
    fits: np.ndarray
    """True where every stage fits in its HBM (bool)."""

    def __len__(self) -> int:
        return len(self.step_time)


def from_estimates(estimates: Sequence[Estimate]) -> BatchResult:
    """The arrays of estimates already made one by one (the scalar fallback)."""

    def column(get, dtype=float) -> np.ndarray:  # type: ignore[no-untyped-def]
        return np.fromiter((get(e) for e in estimates), dtype, len(estimates))

    return BatchResult(
        step_time=column(lambda e: e.step_time),
        time=TimeColumns(**{n: column(lambda e, n=n: getattr(e.time, n)) for n in TIME_PARTS}),
        memory=MemoryColumns(**{n: column(lambda e, n=n: getattr(e.memory, n))
                                for n in MEMORY_PARTS}),
        peak_memory=column(lambda e: e.memory.total),
        peak_stage=column(lambda e: e.peak_stage, np.int64),
        model_flops=column(lambda e: e.model_flops),
        hardware_flops=column(lambda e: e.hardware_flops),
        mfu=column(lambda e: e.mfu),
        hfu=column(lambda e: e.hfu),
        tokens_per_s=column(lambda e: e.tokens_per_s),
        hbm_bytes=column(lambda e: e.hbm_bytes),
        fits=column(lambda e: e.fits, bool),
    )


def merge(parts: Sequence[tuple[np.ndarray, BatchResult]], n: int) -> BatchResult:
    """One result of ``n`` strategies from results of subsets, each with the strategies'
    positions in the whole."""

    def put(get) -> np.ndarray:  # type: ignore[no-untyped-def]
        first = get(parts[0][1])
        out = np.empty(n, first.dtype)
        for where, part in parts:
            out[where] = get(part)
        return out

    return BatchResult(
        step_time=put(lambda r: r.step_time),
        time=TimeColumns(**{k: put(lambda r, k=k: getattr(r.time, k)) for k in TIME_PARTS}),
        memory=MemoryColumns(**{k: put(lambda r, k=k: getattr(r.memory, k))
                                for k in MEMORY_PARTS}),
        peak_memory=put(lambda r: r.peak_memory),
        peak_stage=put(lambda r: r.peak_stage),
        model_flops=put(lambda r: r.model_flops),
        hardware_flops=put(lambda r: r.hardware_flops),
        mfu=put(lambda r: r.mfu),
        hfu=put(lambda r: r.hfu),
        tokens_per_s=put(lambda r: r.tokens_per_s),
        hbm_bytes=put(lambda r: r.hbm_bytes),
        fits=put(lambda r: r.fits),
    )
