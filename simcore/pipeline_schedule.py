"""The pipeline schedules, op by op: the order each stage runs its forwards and backwards
(:func:`stage_order`) and when each op starts and ends (:func:`schedule_pipeline`), an op
starting when its stage is free and its input has arrived from the neighbouring stage.
:mod:`simcore.timeline` draws a step from them.

Schedules (Narayanan et al. 2021, arXiv:2104.04473, section 2.2):

- ``gpipe``: all forwards, then all backwards, micro-batches in order;
- ``1f1b`` (PipeDream-Flush): stage i warms up with ``min(p - i - 1, m)`` forwards, then
  alternates one forward and one backward, then cools down with the remaining backwards;
- ``interleaved``: v model chunks per stage in Megatron-LM's order
  (``megatron/core/pipeline_parallel/schedules.py``): forwards go through the chunks in groups
  of p micro-batches (chunk 0 of micro-batches 0..p-1, chunk 1 of the same, ..., then the next
  group), backwards the same with the chunks reversed; stage i warms up with
  ``min(2 (p - i - 1) + (v - 1) p, m v)`` forwards, then 1F1B, then cool-down;
- ``zb-h1`` (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv:2401.10241, section 3.1):
  each backward split into B (input gradients, which the previous stage waits for) and W (weight
  gradients, which nothing waits for); stage i runs 1F1B's forwards and B passes and its W passes
  ``i`` micro-batches late (W of micro-batch j after B of micro-batch j + i), the rest at the
  end. Stage i then holds at most ``(p - i) + i = p`` micro-batches, 1F1B's peak, and with
  per-micro-batch times F, B, W on every stage the schedule ends at
  ``m (F + B + W) + (p - 1)(F + B - W)``, the paper's bubble and the estimate's closed form.
- ``zbv``: PyTorch's ``ScheduleZBVZeroBubble`` order on a V of two chunks per stage (chunk 0
  runs down the stages, chunk 1 back up; :mod:`simcore.megatron.pipeline`), whose end with
  equal stages and m >= 2p - 1 is the estimate's :func:`simcore.megatron.pipeline.zbv_bubble`
  closed form.

With equal stages and forward / backward times f and b per micro-batch (f/v and b/v per chunk)
the schedule ends at ``(m + p - 1)(f + b)`` for GPipe and 1F1B and ``(m + (p - 1)/v)(f + b)``
interleaved (m a multiple of p): Narayanan's bubbles, and the estimate's
``m * max + (sum - max) / v`` (:func:`simcore.megatron.pipeline.pipeline_time`), so the
timeline ends at the estimate's step time. With unequal stages (the first and last stages hold
the embedding and the LM head) the schedule gives its own end, close to the closed form but
not always equal; the estimate is not changed by it.

Computing the schedule: per stage, an op's end is ``max(previous end, input ready) + its
time``, a max-plus prefix scan done with numpy for a whole stage at once; stages are swept
down (0 .. p-1) and up (p-2 .. 1) until nothing changes (the earliest-start fixed point).
Plans (equal stages but the first and last) converge in three sweeps: 0.02 s for p = 16,
m = 512, v = 2; 0.16 s for p = 64, m = 4096 (half a million ops); 1 s for v = 4 on top (two
million). Random per-chunk times can need tens of sweeps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simcore.specs import ZERO_BUBBLE, Schedule

__all__ = ["PipelineOps", "StageOrder", "schedule_pipeline", "stage_order"]


# -- the order of ops on one stage ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StageOrder:
    """The ops of one stage in the order it runs them (arrays of equal length: 2 m v, or 3 m for
    a zero-bubble schedule)."""

    backward: np.ndarray
    """True for a backward (for zb-h1: its input-gradient pass B)."""
    chunk: np.ndarray
    micro_batch: np.ndarray
    warmup: int
    """Forwards before the steady one-forward-one-backward phase (all of them for GPipe)."""
    wgrad: np.ndarray | None = None
    """zb-h1: True for a weight-gradient pass W (neither a forward nor a B); None otherwise."""

    @property
    def kind(self) -> np.ndarray:
        """0 forward, 1 backward (B), 2 weight gradient (W)."""
        kind = self.backward.astype(np.intp)
        return kind if self.wgrad is None else np.where(self.wgrad, 2, kind)


def _chunk_table(m: int, v: int, group: int) -> tuple[np.ndarray, np.ndarray]:
    """Megatron-LM's schedule table: (micro-batch, chunk) of the k-th forward of a stage. The
    micro-batches go in groups of ``group``; each group runs through chunk 0, then chunk 1, ...;
    the last group takes what is left."""
    micro, chunk = [], []
    for low in range(0, m, group):
        high = min(m, low + group)
        ids = np.arange(low, high)
        micro.append(np.tile(ids, v))
        chunk.append(np.repeat(np.arange(v), high - low))
    return np.concatenate(micro), np.concatenate(chunk)


def _warmup(schedule: Schedule, stage: int, pp: int, m: int, v: int) -> int:
    total = m * v
    if schedule is Schedule.GPIPE:
        return total
    if schedule is Schedule.ONE_F_ONE_B or v == 1:
        return min(pp - stage - 1, total)
    return min(2 * (pp - stage - 1) + (v - 1) * pp, total)


def _interleave(warmup: int, total: int) -> tuple[np.ndarray, np.ndarray]:
    """(is backward, index into the forward or backward sequence) for ``warmup`` forwards,
    then one forward and one backward at a time, then the remaining backwards."""
    steady = total - warmup
    backward = np.concatenate([np.zeros(warmup, bool), np.tile([False, True], steady),
                               np.ones(warmup, bool)])
    pairs = np.stack([np.arange(warmup, total), np.arange(steady)], axis=1).ravel()
    index = np.concatenate([np.arange(warmup), pairs, np.arange(steady, total)])
    return backward, index


def _zero_bubble_order(stage: int, pp: int, m: int) -> StageOrder:
    """ZB-H1 (module docstring): 1F1B's forwards and B passes, each W ``stage`` micro-batches
    after its B, the W passes left over at the end."""
    ops = _interleave(min(pp - stage - 1, m), m)
    kinds: list[int] = []
    micro: list[int] = []
    done = 0  # W passes run so far
    backwards = 0
    for is_backward, index in zip(*ops):
        kinds.append(int(is_backward))
        micro.append(int(index))
        if is_backward:
            backwards += 1
            if backwards - 1 - stage >= done:  # W of micro-batch (this B's - stage)
                kinds.append(2)
                micro.append(done)
                done += 1
    kinds += [2] * (m - done)
    micro += list(range(done, m))
    kind = np.array(kinds)
    return StageOrder(kind == 1, np.zeros(len(kind), np.intp), np.array(micro, np.intp),
                      min(pp - stage - 1, m), kind == 2)


def _zbv_order(rank: int, pp: int, m: int) -> StageOrder:
    """zbv: PyTorch's ``ScheduleZBVZeroBubble`` order for ``rank`` (module docstring of
    :mod:`simcore.megatron.pipeline`), its ops on micro-batches past m dropped as PyTorch drops
    them."""
    n = max(2 * pp - 1, m)
    ops: list[tuple[int, int, int]] = []  # (chunk, kind, micro-batch)
    count = dict.fromkeys(((c, k) for c in (0, 1) for k in (0, 1, 2)), 0)
    f0, b0, w0, f1, b1, w1 = (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)  # (chunk, kind)

    def run(*steps: tuple[int, int]) -> None:
        for step in steps:
            ops.append((*step, count[step]))
            count[step] += 1

    for _ in range(2 * (pp - rank) - 1):
        run(f0)
    for _ in range(rank):
        run(f1, f0)
    for _ in range(pp - rank):
        run(f1, b1, w1)
    while count[f1] < count[f0] or count[f0] < n:
        if count[f0] < n:
            run(f0)
        run(b0, w0, f1, b1, w1)
    for _ in range(rank):
        run(b0, b1)
    for _ in range(pp - rank):
        run(b0, w0)
    for w, b in ((w1, b1), (w0, b0)):
        while count[w] < count[b]:
            run(w)
    chunk, kind, micro = (np.array(x, np.intp) for x in zip(*[op for op in ops if op[2] < m]))
    warmup = int(np.argmax(kind != 0))
    return StageOrder(kind == 1, chunk, micro, warmup, kind == 2)


def stage_order(schedule: Schedule, stage: int, pp: int, m: int, v: int = 1) -> StageOrder:
    """The forwards and backwards stage ``stage`` of ``pp`` runs for ``m`` micro-batches and
    ``v`` model chunks, in the order ``schedule`` runs them (see the module docstring)."""
    if not (0 <= stage < pp and m >= 1 and v >= 1):
        raise ValueError(f"need 0 <= stage < pp, m >= 1 and v >= 1, but got stage={stage},"
                         f" pp={pp}, m={m}, v={v}")
    if schedule is Schedule.ZB_H1:
        if v != 1:
            raise ValueError(f"zb-h1 runs one model chunk per stage, but got v={v}")
        return _zero_bubble_order(stage, pp, m)
    if schedule is Schedule.ZBV:
        if v != 2:
            raise ValueError(f"zbv runs two model chunks per stage, but got v={v}")
        return _zbv_order(stage, pp, m)
    group = m if schedule is Schedule.GPIPE else pp
    micro, chunk = _chunk_table(m, v, group)
    total = m * v
    warmup = _warmup(schedule, stage, pp, m, v)
    if schedule is Schedule.GPIPE:
        backward = np.repeat([False, True], total)
        index = np.tile(np.arange(total), 2)
    else:
        backward, index = _interleave(warmup, total)
    chunks = np.where(backward, v - 1 - chunk[index], chunk[index])
    return StageOrder(backward, chunks, micro[index], warmup)


# -- the discrete-event schedule --------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PipelineOps:
    """Every forward and backward of one step: arrays of shape (pp, 2 m v), each stage's row in
    the order it runs them; times in the units of the durations given."""

    backward: np.ndarray
    chunk: np.ndarray
    micro_batch: np.ndarray
    start: np.ndarray
    end: np.ndarray
    sweeps: int
    """Down-and-up sweeps the fixed point took."""
    kind: np.ndarray | None = None
    """0 forward, 1 backward (B), 2 weight gradient (W, zb-h1 and zbv); None: ``backward``."""

    @property
    def kinds(self) -> np.ndarray:
        return self.backward.astype(np.intp) if self.kind is None else self.kind

    @property
    def makespan(self) -> float:
        return float(self.end.max()) if self.end.size else 0.0

    @property
    def duration(self) -> np.ndarray:
        return self.end - self.start


def _v_dependencies(order: list[StageOrder], pp: int, m: int) -> np.ndarray:
    """:func:`_dependencies` for zbv's V: chunk 0 runs down the stages and chunk 1 back up
    (rank r holds virtual stages r and 2p-1-r); a forward needs the previous virtual stage's,
    a B the next one's; the last virtual stage's B (chunk 1 on stage 0) only its own forward,
    run before it on the same stage."""
    kind = np.stack([o.kind for o in order])
    n = kind.shape[1]
    stage = np.broadcast_to(np.arange(pp)[:, None], kind.shape)
    chunk = np.stack([o.chunk for o in order])
    virtual = np.where(chunk == 0, stage, 2 * pp - 1 - stage)
    micro = np.stack([o.micro_batch for o in order])
    where = np.empty((2 * pp, 3, m), np.intp)
    where[virtual, kind, micro] = stage * n + np.arange(n)[None, :]
    needs = np.full((2 * pp, 3, m), -1, np.intp)
    needs[1:, 0] = where[:-1, 0]
    needs[:-1, 1] = where[1:, 1]
    return needs[virtual, kind, micro]


def _dependencies(order: list[StageOrder], pp: int, m: int, v: int) -> np.ndarray:
    """For every op, the flat index (stage * n + position) of the op on a neighbouring stage
    whose output it needs, or -1: a forward needs the same chunk's forward on the previous stage
    (chunk c on stage 0: chunk c-1 on the last stage); a backward the next stage's (chunk c on
    the last stage: chunk c+1 on stage 0). The last chunk's backward on the last stage needs its
    own forward, which comes earlier on the same stage anyway."""
    kind = np.stack([o.kind for o in order])
    n = kind.shape[1]
    chunk = np.stack([o.chunk for o in order])
    micro = np.stack([o.micro_batch for o in order])
    stage = np.broadcast_to(np.arange(pp)[:, None], kind.shape)
    where = np.empty((pp, 3, v, m), np.intp)
    where[stage, kind, chunk, micro] = stage * n + np.arange(n)[None, :]
    needs = np.full((pp, 3, v, m), -1, np.intp)  # a W needs only its own B, run before it
    needs[1:, 0] = where[:-1, 0]
    needs[0, 0, 1:] = where[pp - 1, 0, :-1]
    needs[:-1, 1] = where[1:, 1]
    needs[pp - 1, 1, :-1] = where[0, 1, 1:]
    return needs[stage, kind, chunk, micro]


def schedule_pipeline(schedule: Schedule, forward: np.ndarray, backward: np.ndarray,
                      m: int, wgrad: np.ndarray | None = None) -> PipelineOps:
    """Earliest start and end of every op when stage i's forward of chunk c lasts
    ``forward[i, c]`` and its backward ``backward[i, c]`` (arrays of shape (pp, v); each op's
    time includes the exchange with its neighbour), for ``m`` micro-batches. For zb-h1,
    ``wgrad[i, c]`` is the part of the backward its W pass takes (the B pass the rest)."""
    forward, backward = np.asarray(forward, float), np.asarray(backward, float)
    if forward.ndim != 2 or forward.shape != backward.shape:
        raise ValueError("forward and backward must both have shape (pp, v)")
    pp, v = forward.shape
    zero_bubble = schedule in ZERO_BUBBLE
    w = np.zeros_like(backward) if wgrad is None or not zero_bubble else np.asarray(wgrad, float)
    order = [stage_order(schedule, i, pp, m, v) for i in range(pp)]
    if schedule is Schedule.ZBV:
        needs = _v_dependencies(order, pp, m)
    else:
        needs = _dependencies(order, pp, m, v)
    rows = np.arange(pp)[:, None]
    kind = np.stack([o.kind for o in order])
    chunk = np.stack([o.chunk for o in order])
    per_kind = np.stack([forward, backward - w, w])  # (kind, pp, v)
    time = per_kind[kind, rows, chunk]
    end, sweeps = _fixed_point(time, needs)
    return PipelineOps(kind == 1, chunk, np.stack([o.micro_batch for o in order]), end - time,
                       end, sweeps, kind if zero_bubble else None)


def _fixed_point(time: np.ndarray, needs: np.ndarray) -> tuple[np.ndarray, int]:
    """End times: per stage ``end[k] = max(end[k-1], ready[k]) + time[k]``, i.e.
    ``end[k] = cum[k] + max(0, max_{j <= k} (ready[j] - cum[j-1]))``, swept over the stages
    until no end moves."""
    pp, n = time.shape
    cum = np.cumsum(time, axis=1)
    before = cum - time
    end = np.zeros_like(time)
    flat = end.reshape(-1)
    has = needs >= 0
    source = np.where(has, needs, 0)
    sweep_order = list(range(pp)) + list(range(pp - 2, 0, -1))
    limit = 4 * (n + pp) + 8  # a valid schedule converges long before; a cycle never does
    for sweep in range(1, limit + 1):
        moved = False
        for i in sweep_order:
            ready = np.where(has[i], flat[source[i]], 0.0)
            new = cum[i] + np.maximum.accumulate(np.maximum(ready - before[i], 0.0))
            if not np.array_equal(new, end[i]):
                end[i] = new
                moved = True
        if not moved:
            return end, sweep
    raise RuntimeError("the pipeline schedule deadlocks (an op waits for one that waits for it)")
