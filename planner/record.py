"""One strategy's estimate as what an Optuna trial stores: objective values, the HBM constraint
and every part of the estimate as user attributes, so tables and plots never re-simulate.

User attributes (all JSON scalars): the strategy that ran (``dp`` ... ``sequence_parallel``),
``step_time_s`` and its parts ``time_<part>_s``, ``peak_memory_gb`` and its parts
``memory_<part>_gb`` (on the peak stage), ``mfu``, ``hfu``, ``tokens_per_s``, ``model_flops``,
``peak_stage``, ``convention``, ``feasible`` and ``reason`` (why not, in one line).
The constraint ``hbm_gb`` is peak memory minus the limit (<= 0 is feasible; none when unlimited).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import simcore
from planner.units import GB
from search_spaces import strategy_label
from simcore.estimate import Estimate
from simcore.layout import format_layout
from simcore.specs import Convention, ModelSpec, Precision, Strategy, SystemSpec, TrainingSpec

if TYPE_CHECKING:
    import optuna
    import pandas as pd

__all__ = ["CONSTRAINT", "Evaluator", "Record", "frozen_trial", "strategy_attrs"]

CONSTRAINT = "hbm_gb"


@dataclass(frozen=True, slots=True)
class Record:
    values: list[float]
    user_attrs: dict[str, Any]
    constraints: dict[str, float]


def strategy_attrs(s: Strategy) -> dict[str, Any]:
    """The strategy as a trial stores it; ``precision`` only when it is not bf16, so bf16
    trials are stored as before fp8 (and read back as bf16), and ``first_stage_layers`` /
    ``last_stage_layers`` only when set (even stages are stored as before), and ``shard_group``
    (HSDP), ``ep`` and ``etp`` (experts), ``recompute_layers`` and ``offload_layers`` only
    when set."""
    out = {"dp": s.dp, "tp": s.tp, "pp": s.pp, "sp": s.sp, "zero": int(s.zero),
           "recompute": s.recompute.value, "micro_batch": s.micro_batch,
           "schedule": s.schedule.value, "v": s.v,
           "placement": ",".join(a.value for a in s.placement),
           "sequence_parallel": s.sequence_parallel, "plan": strategy_label(s)}
    if s.precision is not Precision.BF16:
        out["precision"] = s.precision.value
    for name in ("first_stage_layers", "last_stage_layers", "shard_group", "etp",
                 "recompute_layers", "offload_layers"):
        if getattr(s, name) is not None:  # only when set
            out[name] = getattr(s, name)
    if s.layout is not None:  # Megatron's layout string
        out["layout"] = format_layout(s.layout)
    if s.ep > 1:
        out["ep"] = s.ep
    if s.ep_overlap:
        out["ep_overlap"] = True
    if s.ep_dedup:
        out["ep_dedup"] = True
    return out


def estimate_attrs(est: Estimate) -> dict[str, Any]:
    out: dict[str, Any] = {"step_time_s": est.step_time}
    for f in fields(est.time):
        out[f"time_{f.name}_s"] = getattr(est.time, f.name)
    out["peak_memory_gb"] = est.memory.total / GB
    for f in fields(est.memory):
        out[f"memory_{f.name}_gb"] = getattr(est.memory, f.name) / GB
    out.update(mfu=est.mfu, hfu=est.hfu, tokens_per_s=est.tokens_per_s,
               model_flops=est.model_flops, peak_stage=est.peak_stage,
               convention=est.convention)
    return out


@dataclass(frozen=True)
class Evaluator:
    """What a study asks of each strategy: simcore's estimate under the study's HBM limit."""

    model: ModelSpec
    system: SystemSpec
    training: TrainingSpec
    convention: Convention
    hbm_gb: float | None
    """None: unlimited, every plan feasible."""
    with_memory: bool
    """Peak memory is a second objective."""

    def __call__(self, strategy: Strategy) -> Record:
        """Estimate one strategy; ValueError if its shapes do not divide."""
        est = simcore.estimate(self.model, self.system, self.training, strategy,
                               self.convention)
        attrs = strategy_attrs(strategy) | estimate_attrs(est)
        peak = attrs["peak_memory_gb"]
        constraints: dict[str, float] = {}
        if self.hbm_gb is None:
            feasible, reason = True, ""
        else:
            constraints[CONSTRAINT] = peak - self.hbm_gb
            feasible = peak <= self.hbm_gb
            reason = "" if feasible else (est.reason or f"needs {peak:.1f} GB of HBM, over the"
                                          f" {self.hbm_gb:g} GB limit")
        attrs.update(feasible=feasible, reason=reason)
        values = [est.step_time] + ([peak] if self.with_memory else [])
        return Record(values, attrs, constraints)

    def frame(self, strategies: Sequence[Strategy]) -> pd.DataFrame:
        """Every strategy's record as one row, estimated at once
        (:func:`planner.record_frame.frame`)."""
        from planner.record_frame import frame

        return frame(self, strategies)

    def records(self, frame: pd.DataFrame) -> list[Record]:
        """The records of :meth:`frame`'s rows (or of rows read back from a results file),
        each equal to :meth:`__call__`'s record of that strategy."""
        from planner.record_frame import records_from_frame

        return records_from_frame(frame, self.hbm_gb, self.with_memory)


def frozen_trial(record: Record, params: dict[str, Any],
                 distributions: dict[str, optuna.distributions.BaseDistribution]
                 ) -> optuna.trial.FrozenTrial:
    """A finished trial to add to a study without sampling (the exhaustive path)."""
    import optuna

    return optuna.trial.create_trial(values=record.values, params=params,
                                     distributions=distributions,
                                     user_attrs=record.user_attrs,
                                     constraints=record.constraints or None)
