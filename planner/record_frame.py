"""Many strategies' records at once, as a table: the columns of ``planner trials`` (but ``number``
and ``state``), estimated together (:func:`simcore.megatron.batched.estimate_many`), each figure
equal to :class:`planner.record.Evaluator`'s record of that strategy; and the records of such
rows back. Kept apart from :mod:`planner.record` so that the light commands (``planner
estimate``) import no pandas."""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import numpy as np
import pandas as pd

import simcore
from planner.record import CONSTRAINT, Evaluator, Record
from planner.units import GB
from search_spaces import strategy_label
from simcore.megatron.batched import BatchResult, estimate_many
from simcore.megatron.batched_result import MEMORY_PARTS, TIME_PARTS, from_estimates
from simcore.specs import Convention, Precision, Strategy

__all__ = ["frame", "records_from_frame"]


def frame(evaluator: Evaluator, strategies: Sequence[Strategy]) -> pd.DataFrame:
    """Every strategy's record as one row (the columns of ``planner trials`` but ``number``
    and ``state``), estimated at once (:func:`estimate_many`): each figure equal to
    ``Evaluator.__call__``'s. ValueError if a strategy's shapes do not divide."""
    specs = (evaluator.model, evaluator.system, evaluator.training)
    if evaluator.convention is Convention.MEGATRON:
        result = estimate_many(*specs, strategies, evaluator.convention)
        why = _megatron_reasons(result)
    else:  # estimate_many runs these one by one anyway; their estimates give the reason
        estimates = [simcore.estimate(*specs, s, evaluator.convention) for s in strategies]
        result = from_estimates(estimates)
        why = lambda rows: [estimates[i].reason for i in rows]
    df = _strategy_columns(strategies) | _estimate_columns(result, evaluator.convention.value)
    frame = pd.DataFrame(df)
    peak = frame["peak_memory_gb"].to_numpy()
    feasible = (np.ones(len(frame), bool) if evaluator.hbm_gb is None
                else peak <= evaluator.hbm_gb)
    reason = np.full(len(frame), "", dtype=object)
    over = np.flatnonzero(~feasible & ~result.fits)  # simcore's own reason
    reason[over] = why(over)
    limit = np.flatnonzero(~feasible & result.fits)  # fits the device, not the limit
    reason[limit] = [f"needs {p:.1f} GB of HBM, over the {evaluator.hbm_gb:g} GB limit"
                     for p in peak[limit].tolist()]
    frame.insert(frame.columns.get_loc("step_time_s"), "feasible", feasible)
    frame["reason"] = reason
    return frame


_KNOBS = ("dp", "tp", "pp", "sp", "zero", "recompute", "micro_batch", "schedule", "v",
          "placement", "sequence_parallel", "precision", "first_stage_layers",
          "last_stage_layers", "shard_group", "ep", "etp", "ep_overlap", "ep_dedup",
          "recompute_layers", "offload_layers")
_OPTIONAL = {"precision": Precision.BF16.value, "first_stage_layers": None,
             "last_stage_layers": None, "shard_group": None, "ep": 1, "etp": None,
             "ep_overlap": None, "ep_dedup": None, "recompute_layers": None,
             "offload_layers": None}
"""Attributes a trial stores only when they differ from this
(:func:`planner.record.strategy_attrs`)."""
_NOT_ATTRS = ("number", "state")


def _strategy_columns(strategies: Sequence[Strategy]) -> dict[str, Any]:
    """:func:`planner.record.strategy_attrs` as columns; ``precision`` always, uneven stages
    and the HSDP shard group nullable."""
    columns = zip(*map(attrgetter(*_KNOBS), strategies))
    cols = dict(zip(_KNOBS, map(list, columns))) if strategies else {k: [] for k in _KNOBS}
    return {
        "plan": [strategy_label(s) for s in strategies],
        "dp": np.array(cols["dp"], np.int64), "tp": np.array(cols["tp"], np.int64),
        "pp": np.array(cols["pp"], np.int64), "sp": np.array(cols["sp"], np.int64),
        "zero": np.array([int(z) for z in cols["zero"]], np.int64),
        "recompute": [r.value for r in cols["recompute"]],
        "micro_batch": np.array(cols["micro_batch"], np.int64),
        "schedule": [x.value for x in cols["schedule"]], "v": np.array(cols["v"], np.int64),
        "placement": [",".join(a.value for a in p) for p in cols["placement"]],
        "sequence_parallel": np.array(cols["sequence_parallel"], bool),
        "precision": [p.value for p in cols["precision"]],
        "first_stage_layers": pd.array(list(cols["first_stage_layers"]), dtype="Int64"),
        "last_stage_layers": pd.array(list(cols["last_stage_layers"]), dtype="Int64"),
        "shard_group": pd.array(list(cols["shard_group"]), dtype="Int64"),
        "ep": pd.array([e if e > 1 else None for e in cols["ep"]], dtype="Int64"),
        "etp": pd.array(list(cols["etp"]), dtype="Int64"),
        "ep_overlap": pd.array([1 if o else None for o in cols["ep_overlap"]],
                               dtype="Int64"),  # 1 or none, as the nullable columns beside it
        "ep_dedup": pd.array([1 if o else None for o in cols["ep_dedup"]], dtype="Int64"),
        "recompute_layers": pd.array(list(cols["recompute_layers"]), dtype="Int64"),
        "offload_layers": pd.array(list(cols["offload_layers"]), dtype="Int64"),
    }


def _estimate_columns(r: BatchResult, convention: str) -> dict[str, Any]:
    """:func:`planner.record.estimate_attrs` as columns (the same floating-point operations)."""
    out: dict[str, Any] = {"step_time_s": r.step_time}
    for name in TIME_PARTS:
        out[f"time_{name}_s"] = getattr(r.time, name)
    out["peak_memory_gb"] = r.peak_memory / GB
    for name in MEMORY_PARTS:
        out[f"memory_{name}_gb"] = getattr(r.memory, name) / GB
    out.update(mfu=r.mfu, hfu=r.hfu, tokens_per_s=r.tokens_per_s, model_flops=r.model_flops,
               peak_stage=r.peak_stage, convention=np.full(len(r), convention, object))
    return out


_REASON_PARTS = {"weights": "weights", "gradients": "gradients", "optimizer": "optimizer",
                 "activations": "activations", "gathered weights": "gathered_weights"}


def _megatron_reasons(r: BatchResult) -> Any:
    """``simcore.megatron.step._reason`` of the rows asked, from the peak stage's parts: the
    same words and the same largest part (the first of equal ones, as ``max`` picks)."""
    parts = np.stack([getattr(r.memory, f) for f in _REASON_PARTS.values()], axis=1)
    names = list(_REASON_PARTS)
    gb = 1e9

    def reasons(rows: np.ndarray) -> list[str]:
        largest = np.argmax(parts[rows], axis=1)
        return [f"stage {stage} needs {total / gb:.1f} GB > {hbm / gb:.1f} GB of HBM"
                f" (largest part: {names[k]}, {part / gb:.1f} GB)"
                for stage, total, hbm, k, part in zip(
                    r.peak_stage[rows].tolist(), r.peak_memory[rows].tolist(),
                    r.hbm_bytes[rows].tolist(), largest.tolist(),
                    parts[rows, largest].tolist())]

    return reasons


def records_from_frame(frame: pd.DataFrame, hbm_gb: float | None,
                       with_memory: bool) -> list[Record]:
    """Records of rows of :meth:`Evaluator.frame` (objective values, constraint, attributes
    as :func:`strategy_attrs` and :func:`estimate_attrs` store them)."""
    out = []
    for row in frame.drop(columns=[c for c in _NOT_ATTRS if c in frame.columns]
                          ).to_dict("records"):
        for key, default in _OPTIONAL.items():
            if key not in row:
                continue
            if pd.isna(row[key]) or row[key] == default:
                del row[key]
            elif key in ("ep_overlap", "ep_dedup"):
                row[key] = True
            elif key != "precision":  # a nullable integer read back as a float
                row[key] = int(row[key])
        peak = row["peak_memory_gb"]
        constraints = {} if hbm_gb is None else {CONSTRAINT: peak - hbm_gb}
        values = [row["step_time_s"]] + ([peak] if with_memory else [])
        out.append(Record(values, row, constraints))
    return out
