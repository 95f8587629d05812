"""What a study may choose, and which choices make a plan simcore can run.

A :class:`StrategySpace` holds the allowed values of every knob. The degrees' constraints
(dp * tp * pp * sp = devices; tp divides the heads, kv heads and FFN width; pp * v divides the
layers; sp divides the sequence; micro-batches tile the global batch; the interleaved
schedule's rules; for the ``stage`` convention, STAGE's own: at least one element per rank; fp8
only on devices with an FP8 peak, in the megatron convention) are simcore's own
(:func:`simcore.check`), so the space and the simulator can never disagree.
A space's ``framework`` then keeps only the plans that framework can run
(:mod:`search_spaces.frameworks`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import numpy as np

import simcore
from search_spaces.frameworks import ANY, why_not
from simcore.conventions import implementation
from simcore.megatron.stack import uses_flash_attention
from simcore.specs import (
    DEFAULT_PLACEMENT,
    Axis,
    Convention,
    ModelSpec,
    Precision,
    Recompute,
    Schedule,
    Strategy,
    SystemSpec,
    TrainingSpec,
    ZeroStage,
)

__all__ = ["Layout", "PipelineChoice", "StrategySpace", "divisors", "powers_of_two",
           "short_ends"]

DEGREES = ("dp", "tp", "pp", "sp")


def powers_of_two(limit: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``limit``."""
    return tuple(2**i for i in range(limit.bit_length()) if 2**i <= limit)


def divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def short_ends(layers: int, pp: int, uneven: int) -> int | None:
    """The first (and last) stage's layers when each holds ``uneven`` fewer than the stages
    between, which split the rest evenly: ``middle = (layers + 2 uneven) / pp``, e.g. Llama-3
    405B's 126 = 7 + 14 x 8 + 7 on pp 16 (Llama 3 paper section 3.3.2: the first and last stages
    one layer short; torchtitan's ``pipeline_parallel_first_stage_less_layers`` /
    ``_last_stage_less_layers``, ``torchtitan/config/configs.py`` b5bcd76c). None when there is
    no such split (pp < 3, or the middle does not divide, or nothing left at the ends)."""
    if pp < 3 or (layers + 2 * uneven) % pp:
        return None
    first = (layers + 2 * uneven) // pp - uneven
    return first if first >= 1 else None


def _experts_ok(layout: Layout, ep: int, etp: int | None,
                etps: tuple[int | None, ...] = (None,)) -> bool:
    """The expert grid fits the layout: ep x etp divides tp x sp x dp
    (:meth:`simcore.specs.Strategy._check_experts`); and ``etp`` equal to the layout's tp is
    left out where the space also offers None (the same plan, tp's default)."""
    if _etp_repeats(layout, etp, etps):
        return False
    return (layout.tp * layout.sp * layout.dp) % (ep * (layout.tp if etp is None else etp)) == 0


def _etp_repeats(layout: Layout, etp: int | None, etps: tuple[int | None, ...]) -> bool:
    """``etp`` equal to the layout's tp where the space also offers None: the same plan."""
    return etp is not None and etp == layout.tp and None in etps


def _shard_group_ok(layout: Layout, zero: ZeroStage, group: int) -> bool:
    """The space's shard-group rule: 0 (no shard group) always; else zero 1 or 3 and a
    multiple of sp that properly divides dp * sp
    (:meth:`simcore.specs.Strategy._check_shard_group`)."""
    if group == 0:
        return True
    ranks = layout.dp * layout.sp
    return (zero in (ZeroStage.OPTIMIZER, ZeroStage.PARAMETERS) and group < ranks
            and ranks % group == 0 and group % layout.sp == 0)


@dataclass(frozen=True, slots=True)
class Layout:
    """The four degrees of one plan."""

    dp: int
    tp: int
    pp: int
    sp: int

    @property
    def label(self) -> str:
        return f"dp{self.dp}-tp{self.tp}-pp{self.pp}-sp{self.sp}"


@dataclass(frozen=True, slots=True)
class PipelineChoice:
    """A schedule with its model chunks per device (v > 1 only for interleaved, and zbv's 2)."""

    schedule: Schedule
    v: int = 1

    @property
    def label(self) -> str:
        interleaved = self.schedule is Schedule.INTERLEAVED
        return self.schedule.value + (f"-v{self.v}" if interleaved and self.v > 1 else "")


@dataclass(frozen=True)
class StrategySpace:
    """Allowed values of every knob for one model, system and training step.

    ``dp`` may be None: data parallelism takes whatever the other degrees leave.
    """

    model: ModelSpec
    system: SystemSpec
    training: TrainingSpec
    convention: Convention
    dp: tuple[int, ...] | None = None
    tp: tuple[int, ...] = (1,)
    pp: tuple[int, ...] = (1,)
    sp: tuple[int, ...] = (1,)
    zero: tuple[ZeroStage, ...] = (ZeroStage.NONE,)
    recompute: tuple[Recompute, ...] = (Recompute.NONE,)
    micro_batch: tuple[int, ...] = (1,)
    schedule: tuple[Schedule, ...] = (Schedule.ONE_F_ONE_B,)
    v: tuple[int, ...] = (1,)
    """Model chunks per device for the interleaved schedule (zbv uses 2, the others 1)."""
    placement: tuple[tuple[Axis, ...], ...] = (DEFAULT_PLACEMENT,)
    sequence_parallel: tuple[bool, ...] = (True,)
    framework: str = ANY
    """Only plans this framework can run (:mod:`search_spaces.frameworks`); ``any``: all."""
    precision: tuple[Precision, ...] = (Precision.BF16,)
    """The linear layers' GEMM format (:class:`simcore.specs.Precision`)."""
    uneven: tuple[int, ...] = (0,)
    """How many layers fewer the first and the last pipeline stage hold than each stage between
    (:func:`short_ends`); 0 is the even split. Plans set Megatron-LM's
    ``first_stage_layers`` / ``last_stage_layers`` from it."""
    shard_group: tuple[int, ...] = (0,)
    """Shard-group sizes for ZeRO-1 (a partial distributed optimizer) and ZeRO-3 (HSDP)
    (:attr:`simcore.specs.Strategy.shard_group`); 0 shards over the whole data-parallel group.
    A size applies where zero is 1 or 3, it is a multiple of sp and a proper divisor of
    dp * sp (equal to dp * sp it is the 0 plan)."""
    ep: tuple[int, ...] = (1,)
    """Expert-parallel degrees (MoE models; :attr:`simcore.specs.Strategy.ep`)."""
    etp: tuple[int | None, ...] = (None,)
    """Expert tensor-parallel degrees; None: the plan's tp (Megatron-LM's default)."""
    ep_overlap: tuple[bool, ...] = (False,)
    """Expert all-to-alls overlapped with another micro-batch's compute or not
    (:attr:`simcore.specs.Strategy.ep_overlap`); overlap applies where ep > 1."""
    ep_dedup: tuple[bool, ...] = (False,)
    """Expert all-to-alls deduplicated across nodes (DeepEP / HybridEP) or not
    (:attr:`simcore.specs.Strategy.ep_dedup`); it applies where ep > 1."""
    recompute_layers: tuple[int, ...] = (0,)
    """Partial full recompute (:attr:`simcore.specs.Strategy.recompute_layers`): the layers of
    each model chunk that recompute; 0 recomputes them all. A count applies to recompute=full
    plans whose even chunk (layers / (pp v)) holds more layers than it (else it is the 0 plan)."""
    offload_layers: tuple[int, ...] = (0,)
    """Activation offloading (:attr:`simcore.specs.Strategy.offload_layers`): the layers that
    copy their activations to host memory; 0 offloads none. A count applies to plans Megatron
    offloads in (pp 1, no recompute, fewer than the model's layers) on a device whose entry
    gives its host link, in the megatron convention."""

    @property
    def devices(self) -> int:
        return self.system.devices

    # -- the knobs, as the encodings see them --------------------------------------------------
    def layouts(self) -> tuple[Layout, ...]:
        """Every (dp, tp, pp, sp) from the allowed lists whose product is the device count."""
        n = self.devices
        found = []
        for tp, pp, sp in itertools.product(self.tp, self.pp, self.sp):
            rest, r = divmod(n, tp * pp * sp)
            if r == 0 and rest >= 1 and (self.dp is None or rest in self.dp):
                found.append(Layout(rest, tp, pp, sp))
        return tuple(found)

    def pipelines(self) -> tuple[PipelineChoice, ...]:
        out = []
        for s in self.schedule:
            if s is Schedule.INTERLEAVED:
                out.extend(PipelineChoice(s, v) for v in self.v if v > 1)
            elif s is Schedule.ZBV:
                out.append(PipelineChoice(s, 2))
            else:
                out.append(PipelineChoice(s))
        return tuple(out)

    def experts(self) -> tuple[tuple[int, int | None, bool, bool], ...]:
        """Every (ep, etp, ep_overlap, ep_dedup) from the allowed lists (overlap and dedup only
        with ep > 1)."""
        return tuple((ep, etp, overlap, dedup) for ep, etp, overlap, dedup in
                     itertools.product(self.ep, self.etp, self.ep_overlap, self.ep_dedup)
                     if not (overlap or dedup) or ep > 1)

    def candidates(self) -> Iterator[Strategy]:
        """Every combination of the allowed values with the right product, valid or not."""
        for (layout, zero, rc, mb, pipe, place, seqpar, precision, short, group, expert,
             partial, offload) in itertools.product(
                self.layouts(), self.zero, self.recompute, self.micro_batch, self.pipelines(),
                self.placement, self.sequence_parallel, self.precision, self.uneven,
                self.shard_group, self.experts(), self.recompute_layers, self.offload_layers):
            ends = self._ends(layout.pp, short)
            ep, etp, ov, dedup = expert
            if (ends == -1 or not _shard_group_ok(layout, zero, group)
                    or not _experts_ok(layout, ep, etp, self.etp)
                    or not self._partial_ok(layout.pp, pipe.v, rc, partial)
                    or not self._offload_ok(layout.pp, rc, offload)):
                continue  # no split with the ends this much shorter, no such shard group,
                # expert grid, partial recompute or offloading
            yield Strategy(dp=layout.dp, tp=layout.tp, pp=layout.pp, sp=layout.sp, zero=zero,
                           recompute=rc, micro_batch=mb, schedule=pipe.schedule, v=pipe.v,
                           placement=place, sequence_parallel=seqpar, precision=precision,
                           first_stage_layers=ends, last_stage_layers=ends,
                           shard_group=group or None, ep=ep, etp=etp, ep_overlap=ov,
                           ep_dedup=dedup, recompute_layers=partial or None,
                           offload_layers=offload or None)

    def _offload_ok(self, pp: int, recompute: Recompute, offload: int) -> bool:
        """Whether ``offload_layers`` = ``offload`` makes a plan: 0 always; else with pp 1, no
        recompute and fewer than the model's layers, on a device with a host link, in the
        megatron convention (:func:`simcore.megatron.checks.check_plan` says why not)."""
        return offload == 0 or (pp == 1 and recompute is Recompute.NONE
                                and self.convention is Convention.MEGATRON
                                and offload < self.model.layers
                                and self.system.device.host_bandwidth_bytes_per_s is not None)

    def _partial_ok(self, pp: int, v: int, recompute: Recompute, partial: int) -> bool:
        """Whether ``recompute_layers`` = ``partial`` makes a plan of its own: 0 always; else
        under full recompute in the megatron convention, fewer than an even chunk's layers (more
        is the 0 plan)."""
        return partial == 0 or (recompute is Recompute.FULL
                                and self.convention is Convention.MEGATRON
                                and partial < self.model.layers // (pp * v))

    def _ends(self, pp: int, short: int) -> int | None:
        """The first/last stage's layers for ``uneven`` = ``short`` (None: even; -1: none)."""
        if short == 0:
            return None
        ends = short_ends(self.model.layers, pp, short)
        return -1 if ends is None else ends

    @property
    def size(self) -> int:
        """How many candidates the lists make (before the shape rules)."""
        return (len(self.layouts()) * len(self.zero) * len(self.recompute)
                * len(self.micro_batch) * len(self.pipelines()) * len(self.placement)
                * len(self.sequence_parallel) * len(self.precision) * len(self.uneven)
                * len(self.shard_group) * len(self.experts()) * len(self.recompute_layers)
                * len(self.offload_layers))

    # -- validity ------------------------------------------------------------------------------
    def reason_invalid(self, strategy: Strategy) -> str | None:
        """Why simcore cannot run this strategy, or None if it can."""
        try:
            simcore.check(self.model, self.system, self.training, strategy, self.convention)
        except ValueError as e:
            return str(e)
        return self._framework_refuses(strategy)

    @cached_property
    def _flash(self) -> bool:
        """The plans' attention is flash attention (the training's, else the model's and
        device's default)."""
        return uses_flash_attention(self.model, self.system, self.training)

    def _framework_refuses(self, strategy: Strategy) -> str | None:
        if self.framework == ANY:
            return None
        return why_not(self.framework, self.model, self.training, strategy,
                       bf16=self.system.device.bf16, flash=self._flash)

    @cached_property
    def valid(self) -> tuple[Strategy, ...]:
        """Every valid strategy, in a fixed order (the lists' order). Where the convention checks
        arrays of strategies (``valid_plans``), the candidates are never built one by one: the
        rules run once over (layout, micro-batch, pipeline, sequence parallelism), the knobs
        they read, and only valid strategies become objects."""
        if implementation(self.convention).valid_plans is None or self.model.moe is not None:
            return tuple(s for s in self.candidates() if self.reason_invalid(s) is None)
        found = self._strategies(self._valid_indices())
        if self.framework == ANY:  # valid_indices() holds exactly these
            return tuple(found)
        return tuple(s for s in found if self._framework_refuses(s) is None)

    def valid_indices(self) -> np.ndarray | None:
        """The valid strategies as flat indices into the candidates' product (ascending, in
        :attr:`valid`'s order), without building one object: :meth:`strategies_at` builds the
        strategies of any slice of them (a worker process builds its own chunk). None where the
        strategies must be checked one by one (a convention without ``valid_plans``, or a
        ``framework`` rule)."""
        if (implementation(self.convention).valid_plans is None or self.framework != ANY
                or self.model.moe is not None):  # MoE plans: checked one by one
            return None
        return self._valid_indices()

    def strategies_at(self, flat: np.ndarray) -> list[Strategy]:
        """The strategies at these flat indices (from :meth:`valid_indices`)."""
        return list(self._strategies(np.asarray(flat, np.int64)))

    def columns_at(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """The knobs of the strategies at these flat indices as arrays, in the form
        :func:`simcore.megatron.bounds.lower_bounds` reads (codes for the enums)."""
        from search_spaces.space_index import columns_at

        return columns_at(self, flat)

    def valid_layouts(self) -> list[Layout]:
        """The layouts that hold at least one valid strategy, in :attr:`valid`'s order (from the
        indices where it can: the layout is the slowest-varying knob of the product)."""
        indices = self.valid_indices()
        if indices is None:
            seen = dict.fromkeys(Layout(s.dp, s.tp, s.pp, s.sp) for s in self.valid)
            return list(seen)
        rows = np.unique(np.unravel_index(indices, self._shape())[0])
        layouts = self.layouts()
        return [layouts[i] for i in rows.tolist()]

    @cached_property
    def valid_count(self) -> int:
        """How many strategies :attr:`valid` holds, from the indices where it can (listing a
        million strategies takes seconds; counting them, milliseconds)."""
        indices = self.valid_indices()
        return len(self.valid) if indices is None else len(indices)

    def _shape(self) -> tuple[int, ...]:
        """The candidates' product, in :meth:`candidates`' order (the last knob fastest)."""
        return (len(self.layouts()), len(self.zero), len(self.recompute),
                len(self.micro_batch), len(self.pipelines()), len(self.placement),
                len(self.sequence_parallel), len(self.precision), len(self.uneven),
                len(self.shard_group), len(self.experts()), len(self.recompute_layers),
                len(self.offload_layers))

    def _valid_indices(self) -> np.ndarray:
        """Flat indices (into :meth:`_shape`) of the valid candidates, ascending (computed once
        per space, read-only)."""
        return self._valid_index_array

    @cached_property
    def _valid_index_array(self) -> np.ndarray:
        from search_spaces.space_index import valid_index_array

        return valid_index_array(self)

    def _precision_ok(self) -> np.ndarray:
        """Which of the allowed precisions the device and convention can run (the same rule as
        :func:`simcore.check`, which needs a strategy)."""
        return np.array([simcore.precision_problem(self.system.device, self.convention, p)
                         is None for p in self.precision], bool)

    def _strategies(self, flat: np.ndarray) -> Iterator[Strategy]:
        """The strategies at these flat indices."""
        layouts, pipes = self.layouts(), self.pipelines()
        shape = self._shape()
        experts = self.experts()
        for li, zi, ri, mi, pi, ci, si, qi, ui, hi, ei, ki, oi in zip(
                *(a.tolist() for a in np.unravel_index(flat, shape))):
            layout, pipe = layouts[li], pipes[pi]
            ep, etp, overlap, dedup = experts[ei]
            ends = self._ends(layout.pp, self.uneven[ui])
            yield Strategy(dp=layout.dp, tp=layout.tp, pp=layout.pp, sp=layout.sp,
                           zero=self.zero[zi], recompute=self.recompute[ri],
                           micro_batch=self.micro_batch[mi], schedule=pipe.schedule, v=pipe.v,
                           placement=self.placement[ci],
                           sequence_parallel=self.sequence_parallel[si],
                           precision=self.precision[qi], first_stage_layers=ends,
                           last_stage_layers=ends, shard_group=self.shard_group[hi] or None,
                           ep=ep, etp=etp, ep_overlap=overlap, ep_dedup=dedup,
                           recompute_layers=self.recompute_layers[ki] or None,
                           offload_layers=self.offload_layers[oi] or None)

    def enumerate(self) -> tuple[Strategy, ...]:
        """Every valid strategy exactly once."""
        return self.valid

    def first_reason(self) -> str:
        """Why the space is empty: the reason the first candidate fails (for error messages)."""
        for s in self.candidates():
            why = self.reason_invalid(s)
            if why is not None:
                return why
        if not self.layouts():
            return f"no dp, tp, pp, sp from the lists multiplies to {self.devices} devices"
        return self._first_pairing()

    def _first_pairing(self) -> str:
        """Why :meth:`candidates` made no strategy of the first layout: the first knob the
        lists pair with it that makes no plan."""
        layout = self.layouts()[0]
        for zero, rc, pipe, short, group, expert, partial, offload in itertools.product(
                self.zero, self.recompute, self.pipelines(), self.uneven, self.shard_group,
                self.experts(), self.recompute_layers, self.offload_layers):
            ranks = layout.dp * layout.sp
            if self._ends(layout.pp, short) == -1:
                return (f"uneven {short}: no split of {self.model.layers} layers over pp"
                        f" {layout.pp} has first and last stages {short} layer(s) short")
            if not _shard_group_ok(layout, zero, group):
                return (f"shard_group {group} with dp x sp = {ranks} and zero {int(zero)}: a"
                        f" shard group is a multiple of sp ({layout.sp}) that divides dp x sp"
                        " and is smaller, under zero 1 or 3")
            if _etp_repeats(layout, expert[1], self.etp):
                continue  # the same plan as etp None, not a reason
            if not _experts_ok(layout, *expert[:2], self.etp):
                return (f"ep {expert[0]} x etp {expert[1] or layout.tp} must divide tp x sp x"
                        f" dp = {layout.tp * ranks}")
            if not self._partial_ok(layout.pp, pipe.v, rc, partial):
                return (f"recompute_layers {partial}: needs recompute full, the megatron"
                        " convention and fewer layers than a stage's"
                        f" {self.model.layers // (layout.pp * pipe.v)}")
            if not self._offload_ok(layout.pp, rc, offload):
                return (f"offload_layers {offload}: needs pp 1, recompute none, the megatron"
                        " convention, fewer layers than the model's and a device with a host"
                        " link")
        return "each pairing of the lists' knobs is left out"

