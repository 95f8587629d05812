"""Step-time breakdown: one stacked bar per plan, split into what the step waits for.

The parts are a table's ``time_<part>_s`` columns (what every trial stores, see
:mod:`planner.record`): compute, exposed tp / sp / dp / pp / fsdp communication, the pipeline
bubble, the optimizer, and ``comm``, the ``stage`` convention's exposed communication reported
as one figure. simcore's step time is the sum of its parts, so each bar ends at the step time.
Works on any table with those columns: a study's best plans, a comparison's cells.
"""

from __future__ import annotations

import math
from dataclasses import fields

import pandas as pd
import plotly.graph_objects as go

from simcore.estimate import TimeParts

__all__ = ["PARTS", "PART_NAMES", "breakdown_figure", "part_columns"]

PARTS = tuple(f.name for f in fields(TimeParts))
"""simcore's step-time parts, in the order the bars stack them."""

PART_NAMES = {
    "compute": "compute", "tp": "tp comm (exposed)", "sp": "sp comm (exposed)",
    "dp": "dp comm (exposed)", "pp": "pp comm (exposed)", "fsdp": "fsdp comm (exposed)",
    "ep": "expert all-to-all (exposed)",
    "bubble": "pipeline bubble", "optimizer": "optimizer", "comm": "comm (exposed, all kinds)",
    "offload": "activation offload (exposed)",
}
_COLORS = {
    "compute": "#4C78A8", "tp": "#F58518", "sp": "#E45756", "dp": "#72B7B2", "pp": "#54A24B",
    "fsdp": "#EECA3B", "bubble": "#B279A2", "optimizer": "#9D755D", "comm": "#FF9DA6",
    "ep": "#D67195", "offload": "#BAB0AC",
}
NO_PLAN = "no feasible plan"


def part_columns(df: pd.DataFrame) -> list[tuple[str, str]]:
    """``(column, part)`` for every ``time_<part>_s`` column that is non-zero somewhere:
    simcore's parts in their order, then any other part the table holds."""
    parts = [c.removeprefix("time_").removesuffix("_s") for c in df.columns
             if isinstance(c, str) and c.startswith("time_") and c.endswith("_s")]
    ordered = [p for p in PARTS if p in parts] + [p for p in parts if p not in PARTS]
    out = []
    for part in ordered:
        column = f"time_{part}_s"
        values = pd.to_numeric(df[column], errors="coerce")
        if (values.fillna(0) != 0).any():
            out.append((column, part))
    return out


def _labels(values: pd.Series) -> list[str]:
    """The bars' labels as text, made unique (a repeated label would merge two bars)."""
    seen: dict[str, int] = {}
    out = []
    for value in values.astype(str):
        seen[value] = seen.get(value, 0) + 1
        out.append(value if seen[value] == 1 else f"{value} #{seen[value]}")
    return out


def _totals(df: pd.DataFrame, columns: list[str]) -> list[float]:
    """Each row's step time: ``step_time_s`` if the table has it, else the sum of the parts;
    NaN for a row without figures (no feasible plan)."""
    parts = df[columns].apply(pd.to_numeric, errors="coerce") if columns else pd.DataFrame()
    out = []
    for i in range(len(df)):
        known = parts.iloc[i].notna().any() if columns else False
        if "step_time_s" in df.columns and pd.notna(df["step_time_s"].iloc[i]):
            out.append(float(df["step_time_s"].iloc[i]))
        elif known:
            out.append(float(parts.iloc[i].fillna(0).sum()))
        else:
            out.append(math.nan)
    return out


def _xy(horizontal: bool, labels: list, values: list) -> dict:
    return {"y": labels, "x": values} if horizontal else {"x": labels, "y": values}


def breakdown_figure(df: pd.DataFrame, label: str, *, title: str | None = None,
                     orientation: str = "h", detail: str | None = None) -> go.Figure:
    """Stacked bars of ``df``'s ``time_<part>_s`` columns, one bar per row, labelled by the
    ``label`` column (e.g. ``plan``), first row on top (``orientation="h"``) or left
    (``"v"``). Each bar ends at the row's step time, written beside it; a row without figures
    (NaN) is marked "no feasible plan". Hover shows each part in seconds and as a share of the
    step, and the ``detail`` column's text if given (e.g. ``plan`` when bars are labelled by
    cell)."""
    if label not in df.columns:
        raise ValueError(f"breakdown_figure: no column {label!r}; columns: {list(df.columns)}")
    if detail is not None and detail not in df.columns:
        raise ValueError(f"breakdown_figure: no column {detail!r}; columns: {list(df.columns)}")
    if orientation not in ("h", "v"):
        raise ValueError(f"breakdown_figure: orientation must be 'h' or 'v', not {orientation!r}")
    horizontal = orientation == "h"
    labels = _labels(df[label])
    parts = part_columns(df)
    totals = _totals(df, [c for c, _ in parts])
    value_axis = "x" if horizontal else "y"
    extra = [""] * len(df) if detail is None else [f"<br>{v}" for v in df[detail].astype(str)]
    fig = go.Figure()
    for column, part in parts:
        values = pd.to_numeric(df[column], errors="coerce").tolist()
        values = [math.nan if math.isnan(t) else (0.0 if math.isnan(v) else v)
                  for v, t in zip(values, totals)]
        share = [v / t if t and not math.isnan(t) else math.nan for v, t in zip(values, totals)]
        name = PART_NAMES.get(part, part)
        fig.add_trace(go.Bar(
            **_xy(horizontal, labels, values), name=name, orientation=orientation,
            marker_color=_COLORS.get(part), customdata=list(zip(share, extra)),
            hovertemplate=(f"<b>%{{{'y' if horizontal else 'x'}}}</b>%{{customdata[1]}}<br>"
                           f"{name}: %{{{value_axis}:.4g}} s (%{{customdata[0]:.1%}} of the"
                           " step)<extra></extra>")))
    _add_totals(fig, labels, totals, horizontal)
    n = len(labels)
    fig.update_layout(
        barmode="stack", title=title, template="plotly_white",
        legend={"traceorder": "normal", "title_text": "step time parts"},
        height=max(360, 120 + 48 * n) if horizontal else 520,
        margin={"l": 10, "r": 10, "t": 70 if title else 30, "b": 10})
    if horizontal:
        fig.update_xaxes(title_text="step time (s)", rangemode="tozero")
        fig.update_yaxes(autorange="reversed", automargin=True)
    else:
        fig.update_yaxes(title_text="step time (s)", rangemode="tozero")
        fig.update_xaxes(automargin=True)
    return fig


def _add_totals(fig: go.Figure, labels: list[str], totals: list[float], horizontal: bool
                ) -> None:
    """The step time at each bar's end, and "no feasible plan" where there is no bar."""
    at = [0.0 if math.isnan(t) else t for t in totals]
    text = [f" {NO_PLAN}" if math.isnan(t) else f" {t:.4g} s" for t in totals]
    fig.add_trace(go.Scatter(
        **_xy(horizontal, labels, at), mode="text", text=text, showlegend=False,
        textposition="middle right" if horizontal else "top center", hoverinfo="skip",
        cliponaxis=False, name="step time"))
