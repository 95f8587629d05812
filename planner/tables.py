"""A study as a pandas table: one row per trial with every strategy knob, every part of the
estimate and feasibility, read from what the trials stored (nothing is re-simulated)."""

from __future__ import annotations

import optuna
import pandas as pd

__all__ = ["KNOBS", "PLACEMENTS", "UNEVEN_KNOBS", "best_frame", "format_best", "trials_frame"]

KNOBS = ["dp", "tp", "pp", "sp", "zero", "recompute", "micro_batch", "schedule", "v",
         "placement", "sequence_parallel", "precision"]
UNEVEN_KNOBS = ["first_stage_layers", "last_stage_layers"]
"""Stored only on plans with uneven pipeline stages (:func:`planner.record.strategy_attrs`), so
a study's table has these columns only when it holds such plans."""
_FIRST = ["number", "state", "plan", *KNOBS, *UNEVEN_KNOBS, "feasible", "step_time_s",
          "peak_memory_gb"]
_LAST = ["reason"]
_NOT_FIGURES = {"number", "state", "plan", "feasible", "reason", *KNOBS, *UNEVEN_KNOBS}
PLACEMENTS = "placements"
"""best_frame's column: the placements of the plans a row stands for, its own first."""


def trials_frame(study: optuna.Study) -> pd.DataFrame:
    """Every trial: Optuna's own table, with the user attributes as plain columns."""
    df = study.trials_dataframe(attrs=("number", "state", "user_attrs"), multi_index=False)
    if df.empty:
        return pd.DataFrame(columns=_FIRST + _LAST)
    df = df.rename(columns=lambda c: c.removeprefix("user_attrs_"))
    if "plan" in df.columns:  # trials store precision only when it is not bf16
        df["precision"] = df["precision"].fillna("bf16") if "precision" in df else "bf16"
    first = [c for c in _FIRST if c in df.columns]
    last = [c for c in _LAST if c in df.columns]
    rest = [c for c in df.columns if c not in first and c not in last]
    middle = sorted(rest, key=lambda c: (not c.startswith("time_"), not c.startswith("memory_")))
    return df[first + middle + last].reset_index(drop=True)


def best_frame(study: optuna.Study, top: int | None = None,
               frame: pd.DataFrame | None = None) -> pd.DataFrame:
    """Finished feasible trials, fastest first. With two objectives, only the Pareto front
    (Optuna's ``best_trials``, which counts feasible trials only). ``frame``: the study's
    :func:`trials_frame`, when the caller has it already."""
    df = trials_frame(study) if frame is None else frame
    if df.empty or "feasible" not in df.columns:
        return df.iloc[0:0]
    df = df[(df["state"] == "COMPLETE") & df["feasible"].astype(bool)]
    if len(study.directions) > 1:
        front = {t.number for t in study.best_trials}
        df = df[df["number"].isin(front)]
    df = df.sort_values(["step_time_s", "peak_memory_gb", "number"], kind="stable")
    df = df.drop_duplicates(subset="plan")  # a sampler may run one plan more than once
    df = _group_placements(df)
    return df.head(top) if top else df


def _group_placements(df: pd.DataFrame) -> pd.DataFrame:
    """One row for plans that differ only in placement and have every figure of their
    estimate identical: the first (best-ranked) one, listing all their placements."""
    if df.empty or "placement" not in df.columns:
        return df.assign(**{PLACEMENTS: [[] for _ in range(len(df))]})
    key = [k for k in KNOBS + UNEVEN_KNOBS if k != "placement" and k in df.columns]
    key += [c for c in df.columns if c not in _NOT_FIGURES]
    ids = df.groupby(key, sort=False, dropna=False).ngroup()
    lists = df["placement"].groupby(ids).agg(list)
    first = ~ids.duplicated()
    return df[first].assign(**{PLACEMENTS: [lists[i] for i in ids[first]]})


def format_best(df: pd.DataFrame) -> str:
    """The best plans as a short text table."""
    if df.empty:
        return "no feasible plan"
    columns = {
        "trial": df["number"].to_numpy(),
        "plan": df["plan"].to_numpy(),
        "step s": df["step_time_s"].map(lambda v: f"{v:.4g}").to_numpy(),
        "tokens/s": df["tokens_per_s"].map(lambda v: f"{v:,.0f}").to_numpy(),
        "MFU": df["mfu"].map(lambda v: f"{v:.1%}").to_numpy(),
        "peak GB": df["peak_memory_gb"].map(lambda v: f"{v:.1f}").to_numpy(),
    }
    others = [len(p) - 1 for p in df[PLACEMENTS]] if PLACEMENTS in df.columns else []
    if any(others):
        columns["same figures"] = [_others(n) for n in others]
    show = pd.DataFrame(columns, index=range(1, len(df) + 1))
    return show.to_string()


def _others(n: int) -> str:
    return f"+{n} placement{'s' if n > 1 else ''}" if n else ""

