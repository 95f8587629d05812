"""One training step as a timeline: which stage computes or communicates what, and when.

The ``megatron`` convention's timeline is a discrete-event schedule of the plan's pipeline
schedule. Every stage runs its forwards and backwards (one per micro-batch and model chunk) in
the order its schedule gives (:func:`stage_order`); an op starts when its stage is free and its
input has arrived from the neighbouring stage. An op lasts what the estimate charges for it
(:func:`simcore.megatron.phases.stage_phases`): its compute (the embedding on the first chunk,
the LM head and loss on the last), its exposed tp / sp / fsdp communication, and its pipeline
point-to-point exchange, which the estimate counts as stage time (Megatron-LM's blocking
send/receive pairs) and which therefore occupies the sending stage; the neighbour may start
when it ends. After the last backward (the pipeline flush) come the exposed part of the
data-parallel gradient reduction and the optimizer step, as in the estimate.

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

The ``mlp`` convention's stages are equal by construction: its timeline is the same schedule
with the estimate's per-micro-batch times (backward = 2 x forward, as the estimate counts;
interleaving is not modelled, as in the estimate). The ``stage`` convention (STAGE's graph
replayed as ASTRA-sim would: no micro-batches, layers round-robin over the stages) reports only
rank 0's busy GPU time and the step's wall time; its timeline is two bars, that compute and the
rest of the step (exposed communication and waiting for the other stages), not their real
interleaving.

Computing the schedule: per stage, an op's end is ``max(previous end, input ready) + its
time``, a max-plus prefix scan done with numpy for a whole stage at once; stages are swept
down (0 .. p-1) and up (p-2 .. 1) until nothing changes (the earliest-start fixed point).
Plans (equal stages but the first and last) converge in three sweeps: 0.02 s for p = 16,
m = 512, v = 2; 0.16 s for p = 64, m = 4096 (half a million ops); 1 s for v = 4 on top (two
million). Random per-chunk times can need tens of sweeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simcore.estimate import Estimate
from simcore.megatron.checks import micro_batches
from simcore.megatron.phases import stage_phases
from simcore.specs import (
    ZERO_BUBBLE,
    Convention,
    ModelSpec,
    Schedule,
    Strategy,
    SystemSpec,
    TrainingSpec,
)

__all__ = [
    "PHASES",
    "PipelineOps",
    "StageOrder",
    "Timeline",
    "schedule_pipeline",
    "stage_order",
    "step_timeline",
]

PHASES = ("forward", "backward", "recompute", "tp", "sp", "fsdp", "p2p", "dp", "dp overlapped",
          "optimizer", "compute", "comm", "weight grad", "ep", "offload")
"""What a span of the timeline is; ``Timeline.phase`` indexes this tuple. ``dp overlapped`` is
the gradient reduction hidden behind the last backward, ``compute`` and ``comm`` the ``stage``
convention's two totals, ``weight grad`` a zero-bubble schedule's W pass, ``ep`` an MoE
layer's expert all-to-alls (dispatch and combine), ``offload`` activation offloading's copies
that outlast the compute beside them."""

_PHASE = {name: i for i, name in enumerate(PHASES)}


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


# -- the step of a plan -----------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Timeline:
    """One training step as spans on rows (seconds). Span arrays are parallel; ``stage``,
    ``chunk`` and ``micro_batch`` are -1 where they do not apply."""

    convention: str
    schedule: str
    pp: int
    v: int
    micro_batches: int
    rows: tuple[str, ...]
    """Row labels, top to bottom."""
    row: np.ndarray
    phase: np.ndarray
    """Index into :data:`PHASES`."""
    stage: np.ndarray
    chunk: np.ndarray
    micro_batch: np.ndarray
    start: np.ndarray
    duration: np.ndarray
    pipeline_end: float
    """When the last backward ends (the flush); for ``stage``, when rank 0's compute ends."""
    end: float
    """The timeline's end: the step as this schedule runs it."""
    bubble: float
    """Pipeline fill and drain as the estimate defines it: pipeline end - m x the slowest
    stage's micro-batch time."""
    estimate_step_time: float
    note: str = ""
    """What the timeline shows, in a sentence."""
    sweeps: int = field(default=0)

    @property
    def spans(self) -> int:
        return len(self.start)

    @property
    def phase_names(self) -> list[str]:
        return [PHASES[i] for i in self.phase]


class _Spans:
    """Collects spans as arrays, then keeps only the rows that have any."""

    def __init__(self) -> None:
        self.parts: list[dict[str, np.ndarray]] = []

    def add(self, row, phase, start, duration, stage=-1, chunk=-1, micro_batch=-1) -> None:
        start = np.atleast_1d(np.asarray(start, float))
        duration = np.broadcast_to(np.asarray(duration, float), start.shape)
        keep = duration > 0
        cols = {"row": row, "phase": phase, "stage": stage, "chunk": chunk,
                "micro_batch": micro_batch}
        part = {k: np.broadcast_to(np.asarray(val, np.int64), start.shape)[keep]
                for k, val in cols.items()}
        part["start"], part["duration"] = start[keep], duration[keep]
        self.parts.append(part)

    def arrays(self, labels: list[str]) -> tuple[tuple[str, ...], dict[str, np.ndarray]]:
        cols = {k: np.concatenate([p[k] for p in self.parts]) for k in self.parts[0]}
        used = np.unique(cols["row"])
        renumber = np.full(len(labels), -1, np.int64)
        renumber[used] = np.arange(len(used))
        cols["row"] = renumber[cols["row"]]
        return tuple(labels[i] for i in used), cols


_OP_PARTS = ("recompute", "compute", "tp", "sp", "fsdp", "ep", "p2p", "offload")
"""The parts of an op in the order they are drawn (recompute before the backward it feeds)."""


def _pipeline_spans(spans: _Spans, ops: PipelineOps, parts: np.ndarray,
                    per_stage: int = 2) -> None:
    """Every op's parts as spans: compute on the stage's row (``per_stage`` i), communication
    on its communication row (+1) and, with ``per_stage`` 3 (an MoE plan), the expert
    all-to-alls on a row of their own (+2). ``parts`` has shape (pp, kinds, v,
    len(_OP_PARTS)): kinds forward, backward and (zb-h1) weight gradient."""
    pp = ops.start.shape[0]
    stage = np.broadcast_to(np.arange(pp)[:, None], ops.start.shape).ravel()
    kind = ops.kinds.ravel()
    chunk, micro = ops.chunk.ravel(), ops.micro_batch.ravel()
    times = parts[stage, kind, chunk]  # (ops, parts)
    starts = ops.start.ravel()[:, None] + np.cumsum(times, axis=1) - times
    compute_phase = np.array([_PHASE["forward"], _PHASE["backward"],
                              _PHASE["weight grad"]])[kind]
    for j, name in enumerate(_OP_PARTS):
        if name == "compute":
            phase, row = compute_phase, per_stage * stage
        elif name == "recompute":
            phase, row = _PHASE["recompute"], per_stage * stage
        elif name == "ep" and per_stage == 3:
            phase, row = _PHASE[name], per_stage * stage + 2
        else:
            phase, row = _PHASE[name], per_stage * stage + 1
        spans.add(row, phase, starts[:, j], times[:, j], stage, chunk, micro)


def _tail_spans(spans: _Spans, rows: int, at: float, dp_exposed: float, dp_hidden: float,
                optimizer: float) -> float:
    """The gradient reduction (its hidden part ending at the flush, its exposed part after it)
    and the optimizer step on the last two rows; returns the step's end."""
    spans.add(rows, _PHASE["dp overlapped"], at - dp_hidden, dp_hidden)
    spans.add(rows, _PHASE["dp"], at, dp_exposed)
    spans.add(rows + 1, _PHASE["optimizer"], at + dp_exposed, optimizer)
    return at + dp_exposed + optimizer


def _bubble(flush: float, busy: float) -> float:
    """The pipeline's idle time, ``flush - busy`` (the slowest stage's m micro-batches), 0 when
    that is rounding: the schedule's end is a running sum of op times, ``busy`` a product, and
    with one stage they differ in the last bits (-1.8e-15 s for llama70b, dp 16, tp 4, m 32).
    The slowest stage runs back to back, so the schedule never ends before ``busy``."""
    gap = flush - busy
    return 0.0 if gap <= 1e-12 * flush else gap


def _stage_labels(pp: int, experts: bool = False) -> list[str]:
    rows = ("{} ", "{} comm", "{} all-to-all") if experts else ("{} ", "{} comm")
    return [row.format(f"stage {i}").rstrip() for i in range(pp) for row in rows]


def _megatron_timeline(model: ModelSpec, system: SystemSpec, training: TrainingSpec,
                       strategy: Strategy, step_time: float) -> Timeline:
    phases = stage_phases(model, system, training, strategy)
    m, v, pp = micro_batches(training, strategy), strategy.v, strategy.pp
    parts = np.array([[[[getattr(op, name) for name in _OP_PARTS] for op in ops]
                       for ops in (st.forward, st.backward)] for st in phases])
    wgrad = np.array([[op.wgrad for op in st.backward] for st in phases])
    if strategy.schedule in ZERO_BUBBLE:  # the W pass apart from the rest of the backward
        w_parts = np.zeros_like(parts[:, 1])
        w_parts[..., _OP_PARTS.index("compute")] = wgrad
        parts = np.stack([parts[:, 0], parts[:, 1] - w_parts, w_parts], axis=1)
    totals = parts.sum(axis=3)
    ops = schedule_pipeline(strategy.schedule, totals[:, 0], totals[:, 1:].sum(axis=1), m,
                            wgrad)
    spans = _Spans()
    experts = model.moe is not None  # the all-to-alls on rows of their own
    per_stage = 3 if experts else 2
    _pipeline_spans(spans, ops, parts, per_stage)
    flush = ops.makespan
    critical = max(phases, key=lambda st: st.dp_exposed)
    end = _tail_spans(spans, per_stage * pp, flush, critical.dp_exposed,
                      critical.dp_link - critical.dp_exposed,
                      max(st.optimizer for st in phases))
    labels = _stage_labels(pp, experts) + ["dp grad reduce", "optimizer"]
    rows, cols = spans.arrays(labels)
    stage_times = [st.micro_batch_time for st in phases]
    equal = "" if max(stage_times) - min(stage_times) <= 1e-12 * max(stage_times) else (
        " Stages differ (embedding, LM head), so the schedule's end may differ slightly from the"
        " estimate's closed form; the estimate is unchanged.")
    passes = ("forward, backward (input gradients) and weight-gradient passes" if
              strategy.schedule in ZERO_BUBBLE else "forward/backward")
    note = (f"{strategy.schedule} schedule, p={pp}, v={v}, m={m}: {passes} per"
            " micro-batch and chunk with exposed tp/sp/fsdp and p2p drawn after each op's"
            " compute; then the exposed dp reduction and the optimizer." + equal)
    return Timeline("megatron", str(strategy.schedule), pp, v, m, rows, **cols,
                    pipeline_end=flush, end=end, bubble=_bubble(flush, m * max(stage_times)),
                    estimate_step_time=step_time, note=note, sweeps=ops.sweeps)


def _mlp_timeline(training: TrainingSpec, strategy: Strategy, est: Estimate) -> Timeline:
    m = training.global_batch // (strategy.dp * strategy.micro_batch)
    pp, t = strategy.pp, est.time
    compute, tp, p2p = t.compute / m, t.tp / m, t.pp / m
    fwd = [0.0, compute / 3, tp / 2, 0.0, 0.0, 0.0, p2p / 2, 0.0]  # backward = 2 x forward
    bwd = [0.0, 2 * compute / 3, tp / 2, 0.0, 0.0, 0.0, p2p / 2, 0.0]
    parts = np.broadcast_to(np.array([[fwd], [bwd]]), (pp, 2, 1, len(_OP_PARTS)))
    totals = parts.sum(axis=3)
    schedule = Schedule.GPIPE if strategy.schedule is Schedule.GPIPE else Schedule.ONE_F_ONE_B
    ops = schedule_pipeline(schedule, totals[:, 0], totals[:, 1], m)
    spans = _Spans()
    _pipeline_spans(spans, ops, parts)
    flush = ops.makespan
    end = _tail_spans(spans, 2 * pp, flush, t.dp, 0.0, t.optimizer)
    rows, cols = spans.arrays(_stage_labels(pp) + ["dp grad reduce", "optimizer"])
    stage_time = float(totals[0].sum())
    note = (f"{schedule} schedule (the mlp estimate does not interleave), p={pp}, m={m}:"
            " equal stages, backward = 2 x forward; the dp all-reduce is not overlapped.")
    return Timeline("mlp", str(schedule), pp, 1, m, rows, **cols, pipeline_end=flush, end=end,
                    bubble=_bubble(flush, m * stage_time), estimate_step_time=est.step_time,
                    note=note, sweeps=ops.sweeps)


def _stage_timeline(strategy: Strategy, est: Estimate) -> Timeline:
    compute, comm = est.time.compute, est.time.comm
    spans = _Spans()
    spans.add(0, _PHASE["compute"], 0.0, compute)
    spans.add(1, _PHASE["comm"], compute, comm)
    rows, cols = spans.arrays(["rank 0 compute", "exposed comm and waits"])
    note = ("ASTRA-sim replay of STAGE's graph (no micro-batches, layers round-robin over"
            f" {strategy.pp} stage(s)): only totals are known, rank 0's busy GPU time and the"
            " rest of the worst rank's step, drawn one after the other, not interleaved as run.")
    return Timeline("stage", "none", strategy.pp, 1, 1, rows, **cols, pipeline_end=compute,
                    end=compute + comm, bubble=0.0, estimate_step_time=est.step_time, note=note)


def step_timeline(model: ModelSpec, system: SystemSpec, training: TrainingSpec,
                  strategy: Strategy, convention: Convention | None = None, *,
                  estimate: Estimate | None = None) -> Timeline:
    """The timeline of one training step of this plan (see the module docstring for what each
    convention's timeline shows). ``estimate``, if given, must be this plan's (it saves
    estimating again); raises ValueError when the plan's shapes do not divide."""
    import simcore  # the package's dispatch; imported here as simcore imports this module
    from simcore.conventions import implementation

    convention = convention or simcore.convention_of(model)
    est = estimate or simcore.estimate(model, system, training, strategy, convention)
    return implementation(convention).timeline(model, system, training, strategy, est)
