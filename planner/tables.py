"""A study as a pandas table: one row per trial with every strategy knob, every part of the
estimate and feasibility, read from what the trials stored (nothing is re-simulated). A study
that keeps only its fronts and best plans as trials (``results``, :mod:`planner.results_parquet`)
is read from its results table instead: one row per plan, ``number`` its row there."""

from __future__ import annotations

import optuna
import pandas as pd

from planner.results_parquet import ALL, RESULTS, ResultsTable, pareto_mask, table_path

__all__ = ["KNOBS", "PLACEMENTS", "OPTIONAL_KNOBS", "best_count", "best_frame", "format_best",
           "mfu_note", "results_table", "trials_frame"]

KNOBS = ["dp", "tp", "pp", "sp", "zero", "recompute", "micro_batch", "schedule", "v",
         "placement", "sequence_parallel", "precision"]
OPTIONAL_KNOBS = ["first_stage_layers", "last_stage_layers", "shard_group", "ep", "etp",
                  "ep_overlap", "ep_dedup", "recompute_layers", "offload_layers"]
"""Stored only on plans with uneven pipeline stages, an HSDP shard group, expert parallelism,
partial recompute or activation offloading (:func:`planner.record.strategy_attrs`), so a
study's table has these columns only when it holds such plans."""
_FIRST = ["number", "state", "plan", *KNOBS, *OPTIONAL_KNOBS, "feasible", "step_time_s",
          "peak_memory_gb"]
_LAST = ["reason"]
_NOT_FIGURES = {"number", "state", "plan", "feasible", "reason", *KNOBS, *OPTIONAL_KNOBS}
PLACEMENTS = "placements"
"""best_frame's column: the placements of the plans a row stands for, its own first."""


def results_table(study: optuna.Study) -> ResultsTable | None:
    """The study's results table when its plans are not all trials, else None."""
    results = study.user_attrs.get(RESULTS)
    if not results or results.get("trials_kept") == ALL:
        return None
    path = table_path(study)
    return ResultsTable(path) if path is not None else None


def trials_frame(study: optuna.Study) -> pd.DataFrame:
    """Every trial (every plan of a study with a results table): Optuna's own table, with the
    user attributes as plain columns."""
    table = results_table(study)
    if table is not None:
        df = table.read()
        if df.empty:
            return pd.DataFrame(columns=_FIRST + _LAST)
        return _from_table(df)
    df = study.trials_dataframe(attrs=("number", "state", "user_attrs"), multi_index=False)
    if df.empty:
        return pd.DataFrame(columns=_FIRST + _LAST)
    df = df.rename(columns=lambda c: c.removeprefix("user_attrs_"))
    return _ordered(df)


def _ordered(df: pd.DataFrame) -> pd.DataFrame:
    """The columns in the table's order: the plan and its knobs, feasibility and the two
    objectives, the time parts, the memory parts, the other figures, the reason."""
    if "plan" in df.columns:  # trials store precision only when it is not bf16
        df["precision"] = df["precision"].fillna("bf16") if "precision" in df else "bf16"
    first = [c for c in _FIRST if c in df.columns]
    last = [c for c in _LAST if c in df.columns]
    rest = [c for c in df.columns if c not in first and c not in last]
    middle = sorted(rest, key=lambda c: (not c.startswith("time_"), not c.startswith("memory_")))
    return df[first + middle + last].reset_index(drop=True)


def best_count(study: optuna.Study, n: int) -> str:
    """``n`` of a study's best plans in words: feasible plans, or with two objectives the plans
    of its Pareto front (what :func:`best_frame` holds)."""
    if len(study.directions) > 1:
        return f"{n:,} plan{'' if n == 1 else 's'} on its Pareto front (step time and memory)"
    return f"{n:,} feasible plan{'' if n == 1 else 's'}"


def best_frame(study: optuna.Study, top: int | None = None,
               frame: pd.DataFrame | None = None) -> pd.DataFrame:
    """Finished feasible trials, fastest first. With two objectives, only the Pareto front
    (Optuna's ``best_trials``, which counts feasible trials only). ``frame``: the study's
    :func:`trials_frame`, when the caller has it already. A study with a results table:
    only the rows that can be among the best are read."""
    table = results_table(study)
    if frame is None and table is not None:
        frame = _best_rows(table, len(study.directions) > 1, top)
    df = trials_frame(study) if frame is None else frame
    if df.empty or "feasible" not in df.columns:
        return df.iloc[0:0]
    df = df[(df["state"] == "COMPLETE") & df["feasible"].astype(bool)]
    if len(study.directions) > 1 and table is not None:
        df = df[pareto_mask(df["step_time_s"].to_numpy(), df["peak_memory_gb"].to_numpy())]
    elif len(study.directions) > 1:
        front = {t.number for t in study.best_trials}
        df = df[df["number"].isin(front)]
    df = df.sort_values(["step_time_s", "peak_memory_gb", "number"], kind="stable")
    df = df.drop_duplicates(subset="plan")  # a sampler may run one plan more than once
    df = _group_placements(df)
    return df.head(top) if top else df


def _best_rows(table: ResultsTable, front: bool, top: int | None) -> pd.DataFrame:
    """The rows of a results table that :func:`best_frame` can return: feasible, on the front
    with two objectives, and with ``top``, those whose (step time, memory) is among the first
    ``top`` distinct ones (plans grouped by placement share both figures)."""
    cols = ["number", "step_time_s", "peak_memory_gb", "feasible"]
    df = table.read(cols)
    df = df[df["feasible"].astype(bool)]
    if front:
        df = df[pareto_mask(df["step_time_s"].to_numpy(), df["peak_memory_gb"].to_numpy())]
    if top:
        pairs = df[cols[1:3]].drop_duplicates().nsmallest(top, cols[1:3], keep="all")
        df = df.merge(pairs, on=cols[1:3])
    rows = table.read(numbers=df["number"])
    return _from_table(rows)


def _from_table(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of a results table as :func:`trials_frame` orders them; the uneven-stage columns
    only when a plan has them (as a study's trials store them)."""
    uneven = [c for c in OPTIONAL_KNOBS if c in df.columns and df[c].isna().all()]
    return _ordered(df.drop(columns=uneven)[sorted(df.columns.drop(uneven))])


def _group_placements(df: pd.DataFrame) -> pd.DataFrame:
    """One row for plans that differ only in placement and have every figure of their
    estimate identical: the first (best-ranked) one, listing all their placements."""
    if df.empty or "placement" not in df.columns:
        return df.assign(**{PLACEMENTS: [[] for _ in range(len(df))]})
    key = [k for k in KNOBS + OPTIONAL_KNOBS if k != "placement" and k in df.columns]
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
    note = mfu_note(df)
    return show.to_string() + (f"\n{note}" if note else "")


def mfu_note(df: pd.DataFrame) -> str | None:
    """What MFU is measured against, when a quantised plan among ``df`` can pass 100%."""
    if "precision" in df.columns and (df["precision"].fillna("bf16") != "bf16").any():
        return ("MFU against the bf16 peak (as Megatron-LM reports it): fp8, mxfp8 and nvfp4"
                " plans can pass 100%")
    return None


def _others(n: int) -> str:
    return f"+{n} placement{'s' if n > 1 else ''}" if n else ""

