"""One training step as a timeline: which stage computes or communicates what, and when.

The ``megatron`` convention's timeline is a discrete-event schedule of the plan's pipeline
schedule. Every stage runs its forwards and backwards (one per micro-batch and model chunk) in
the order its schedule gives (:func:`simcore.pipeline_schedule.stage_order`); an op starts when
its stage is free and its input has arrived from the neighbouring stage. An op lasts what the
estimate charges for it (:func:`simcore.megatron.phases.stage_phases`): its compute (the
embedding on the first chunk, the LM head and loss on the last), its exposed tp / sp / fsdp
communication, and its pipeline point-to-point exchange, which the estimate counts as stage time
(Megatron-LM's blocking send/receive pairs) and which therefore occupies the sending stage; the
neighbour may start when it ends. After the last backward (the pipeline flush) come the exposed
part of the data-parallel gradient reduction and the optimizer step, as in the estimate. The
schedules, and how their ops' starts and ends are computed: :mod:`simcore.pipeline_schedule`.

The ``mlp`` convention's stages are equal by construction: its timeline is the same schedule
with the estimate's per-micro-batch times (backward = 2 x forward, as the estimate counts;
interleaving is not modelled, as in the estimate). The ``stage`` convention (STAGE's graph
replayed as ASTRA-sim would: no micro-batches, layers round-robin over the stages) reports only
rank 0's busy GPU time and the step's wall time; its timeline is two bars, that compute and the
rest of the step (exposed communication and waiting for the other stages), not their real
interleaving.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simcore.estimate import Estimate
from simcore.megatron.checks import micro_batches
from simcore.megatron.phases import stage_phases
from simcore.pipeline_schedule import PipelineOps, StageOrder, schedule_pipeline, stage_order
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
