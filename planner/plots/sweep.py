"""The sweep figure: throughput (top row) and step time (bottom row) against one knob.

One line per ``--lines`` value, one column of panels per ``--panels`` value; the panels share
their axes, so DistIR's grid (one panel per dp degree, x = hp degree on a log axis, one line per
micro-batch count) reads across at a glance. Two steps as every figure here: :func:`sweep_info`
(a plain value tests check) and :func:`sweep_figure` (the drawing).
"""

from __future__ import annotations

from typing import NamedTuple

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from planner.sweep import KNOBS, Sweep, Value
from search_spaces import strategy_label

__all__ = ["SeriesPoint", "SweepInfo", "sweep_figure", "sweep_info"]


class SeriesPoint(NamedTuple):
    x: Value
    throughput: float
    step_time_s: float
    plan: str
    """The plan drawn (the best of ``candidates`` listed plans)."""
    candidates: int


class SweepInfo(NamedTuple):
    title: str
    x_label: str
    x_log: bool
    """A numeric knob: a log axis with a tick at every value, as DistIR draws degrees."""
    x_values: list[Value]
    throughput_unit: str
    lines_label: str | None
    line_values: list[Value | None]
    panels_label: str | None
    panel_values: list[Value | None]
    series: dict[tuple[Value | None, Value | None], list[SeriesPoint]]
    """(panel, line) -> its points in x order; a (panel, line) with no feasible plan is absent."""


def sweep_info(sweep: Sweep) -> SweepInfo:
    r = sweep.request
    series: dict[tuple[Value | None, Value | None], list[SeriesPoint]] = {}
    x_values = sweep.values("x")
    for p in sorted(sweep.points, key=lambda p: x_values.index(p.x)):
        series.setdefault((p.panel, p.line), []).append(SeriesPoint(
            p.x, p.throughput, p.estimate.step_time, strategy_label(p.strategy), p.candidates))
    rest = "best plan per point" if any(p.candidates > 1 for p in sweep.points) else "fixed plans"
    return SweepInfo(
        title=f"{sweep.study}: throughput and step time against {r.x} ({rest},"
              f" {sweep.estimated} plans estimated)",
        x_label=KNOBS[r.x].label, x_log=KNOBS[r.x].kind is int and all(
            isinstance(v, int) and v > 0 for v in x_values),
        x_values=x_values, throughput_unit=sweep.throughput_unit,
        lines_label=KNOBS[r.lines].short if r.lines else None,
        line_values=sweep.values("line"),
        panels_label=KNOBS[r.panels].short if r.panels else None,
        panel_values=sweep.values("panel"), series=series)


def _name(label: str | None, value: Value | None) -> str:
    return "" if label is None else f"{label} = {value}"


def sweep_figure(info: SweepInfo) -> go.Figure:
    cols = len(info.panel_values)
    fig = make_subplots(rows=2, cols=cols, shared_xaxes=True, shared_yaxes=True,
                        horizontal_spacing=0.02 if cols > 1 else 0.1, vertical_spacing=0.06,
                        subplot_titles=[_name(info.panels_label, p) for p in info.panel_values])
    colors = qualitative.Plotly
    for i, line in enumerate(info.line_values):
        name = _name(info.lines_label, line) or "best plan"
        for col, panel in enumerate(info.panel_values, start=1):
            points = info.series.get((panel, line))
            if not points:
                continue
            hover = [f"{p.plan}<br>best of {p.candidates} listed plans" for p in points]
            xs = [p.x if info.x_log else str(p.x) for p in points]
            for row, ys in ((1, [p.throughput for p in points]),
                            (2, [p.step_time_s for p in points])):
                fig.add_trace(go.Scatter(
                    x=xs, y=ys, name=name, legendgroup=name,
                    showlegend=row == 1 and col == _first_panel(info, line),
                    mode="lines+markers", line={"color": colors[i % len(colors)]},
                    text=hover, hovertemplate="%{x}: %{y:.4~s}<br>%{text}<extra>" + name
                    + "</extra>"), row=row, col=col)
    _axes(fig, info)
    return fig


def _first_panel(info: SweepInfo, line: Value | None) -> int:
    """The first panel (1-based) that draws ``line``: the one whose trace is in the legend."""
    for col, panel in enumerate(info.panel_values, start=1):
        if info.series.get((panel, line)):
            return col
    return 0


def _axes(fig: go.Figure, info: SweepInfo) -> None:
    ticks = [str(v) for v in info.x_values]
    if info.x_log:
        fig.update_xaxes(type="log", tickvals=info.x_values, ticktext=ticks)
    else:
        fig.update_xaxes(type="category", categoryorder="array", categoryarray=ticks)
    fig.update_xaxes(matches="x")  # the panels share their axes, as DistIR's grid
    fig.add_annotation(text=info.x_label, xref="paper", yref="paper", x=0.5, y=-0.07,
                       showarrow=False, yanchor="top", font={"size": 14})
    fig.update_yaxes(title_text=f"throughput ({info.throughput_unit})", tickformat="~s", row=1,
                     col=1, rangemode="tozero")
    fig.update_yaxes(rangemode="tozero", row=1)
    fig.update_yaxes(title_text="step time", tickformat="~s", ticksuffix="s", row=2, col=1)
    fig.update_layout(title=info.title, template="plotly_white", hovermode="closest",
                      height=650, width=max(700, 300 * len(info.panel_values)),
                      margin={"b": 140},
                      legend={"orientation": "h", "yanchor": "top", "y": -0.14,
                              "xanchor": "center", "x": 0.5})
