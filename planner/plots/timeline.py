"""The timeline of one training step of a plan: a Gantt chart of stages and communication.

One horizontal bar per forward, backward, recompute and exposed communication of each
micro-batch on each pipeline stage (and model chunk, shaded, when interleaved), on rows
``stage i`` (compute) and ``stage i comm`` (exposed tp / sp / fsdp, pipeline p2p), then the
data-parallel gradient reduction and the optimizer step. Idle gaps on a stage's row are the
pipeline bubble. The schedule is :func:`simcore.step_timeline`'s; this module only draws it.

A step with more than :data:`MAX_BARS` spans (thousands of micro-batches times many stages) is
drawn with the first and last ``MAX_BARS / 2`` spans one by one (the pipeline's fill and drain,
where the bubble is) and the steady state between them as one grey bar per row; the title says
so, and a merged bar's hover gives how many spans it holds and their busy time.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

import simcore
from planner.plan import Plan
from simcore.timeline import PHASES, Timeline

__all__ = ["LEGEND_ROW_PX", "MAX_BARS", "timeline_figure"]

MAX_BARS = 12_000
"""Bars drawn at most (the HTML stays a few MB); more spans are merged."""

_COLOURS = {
    "forward": "#4C78A8", "backward": "#F58518", "recompute": "#B279A2", "tp": "#54A24B",
    "sp": "#72B7B2", "fsdp": "#EECA3B", "p2p": "#9D755D", "dp": "#E45756",
    "dp overlapped": "#F2A6A7", "optimizer": "#79706E", "compute": "#4C78A8", "comm": "#E45756",
    "weight grad": "#FFBF79", "ep": "#FF9DA6", "offload": "#BAB0AC",
}
_MERGED = "#8C8C8C"
LEGEND_ROW_PX = 22
"""Height reserved per legend entry (plotly's rows are about 19 px at its 12 px font)."""
_MARGIN = {"t": 110, "b": 110}
_CHUNKED = {"forward", "backward", "recompute"}
"""Phases shaded by model chunk when the schedule interleaves."""


def _ms(seconds: float) -> str:
    value = seconds * 1e3
    if value >= 100:
        return f"{value:,.0f} ms"
    if value >= 1:
        return f"{value:.2f} ms"
    return f"{value:.3g} ms"


def _shade(colour: str, chunk: int, chunks: int) -> str:
    """``colour`` mixed with white, more for later chunks (chunk 0 is the colour itself)."""
    mix = 0.55 * chunk / max(chunks - 1, 1)
    rgb = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * mix):02X}" for c in rgb)


@dataclass(frozen=True)
class _Bars:
    """Spans after merging: one entry per bar (arrays of equal length), times in seconds."""

    row: np.ndarray
    start: np.ndarray
    end: np.ndarray
    busy: np.ndarray
    count: np.ndarray
    phases: np.ndarray
    """Bit mask of the phases a bar holds."""
    stage: np.ndarray
    chunk: np.ndarray
    first: np.ndarray
    """Lowest micro-batch in the bar (-1: none)."""
    last: np.ndarray


def _merge(tl: Timeline, keep: np.ndarray, gap: float) -> _Bars:
    """The spans in ``keep`` (a mask), neighbours of a row joined when the gap between them is
    at most ``gap`` (-inf: join none, inf: one bar per row)."""
    order = np.flatnonzero(keep)
    order = order[np.lexsort((tl.start[order], tl.row[order]))]
    row, start, duration = tl.row[order], tl.start[order], tl.duration[order]
    end = start + duration
    new = np.ones(len(row), bool)
    new[1:] = (row[1:] != row[:-1]) | (start[1:] - end[:-1] > gap)
    heads = np.flatnonzero(new)
    micro = tl.micro_batch[order]
    big = np.iinfo(np.int64).max
    first = np.minimum.reduceat(np.where(micro < 0, big, micro), heads)
    return _Bars(
        row=row[heads], start=start[heads], end=np.maximum.reduceat(end, heads),
        busy=np.add.reduceat(duration, heads), count=np.diff(np.append(heads, len(row))),
        phases=np.bitwise_or.reduceat(np.left_shift(1, tl.phase[order]), heads),
        stage=tl.stage[order][heads], chunk=tl.chunk[order][heads],
        first=np.where(first == big, -1, first), last=np.maximum.reduceat(micro, heads),
    )


def _joined(a: _Bars, b: _Bars) -> _Bars:
    return _Bars(**{f: np.concatenate([getattr(a, f), getattr(b, f)])
                    for f in a.__dataclass_fields__})


def _bars(tl: Timeline) -> tuple[_Bars, tuple[float, float, int] | None]:
    """Every span as a bar; or, past :data:`MAX_BARS`, the first and last ``MAX_BARS / 2``
    spans (fill and drain, where the bubble is) one by one and the steady state between them
    as one bar per row (and that window and its span count)."""
    everything = np.ones(tl.spans, bool)
    if tl.spans <= MAX_BARS:
        return _merge(tl, everything, -np.inf), None
    half = MAX_BARS // 2
    detail = np.zeros(tl.spans, bool)
    detail[np.argsort(tl.start, kind="stable")[:half]] = True
    detail[np.argsort(tl.start + tl.duration, kind="stable")[-half:]] = True
    middle = ~detail
    bars = _joined(_merge(tl, detail, -np.inf), _merge(tl, middle, np.inf))
    window = (float(tl.start[middle].min()), float((tl.start + tl.duration)[middle].max()),
              int(middle.sum()))
    return bars, window


def _group(bars: _Bars, v: int) -> np.ndarray:
    """A legend group per bar: -1 for merged bars, else phase * v + chunk (chunk 0 for phases
    not shaded by chunk)."""
    phase = np.log2(np.maximum(bars.phases, 1)).astype(np.int64)
    shaded = np.isin(phase, [PHASES.index(name) for name in _CHUNKED]) & (bars.chunk >= 0)
    key = phase * v + np.where(shaded, bars.chunk, 0)
    return np.where(bars.count > 1, -1, key)


def _style(key: int, v: int) -> tuple[str, str, bool]:
    """Legend entry, colour, and whether the bars are per-micro-batch ops, of a group."""
    if key < 0:
        return "steady state (merged)", _MERGED, False
    name, chunk = PHASES[key // v], key % v
    per_op = name in _CHUNKED or name in {"tp", "sp", "fsdp", "ep", "p2p"}
    if v > 1 and name in _CHUNKED:
        return f"{name}, chunk {chunk}", _shade(_COLOURS[name], chunk, v), per_op
    return name, _COLOURS[name], per_op


def _hovertemplate(name: str, key: int, per_op: bool, v: int) -> str:
    """customdata: stage, chunk, first and last micro-batch, spans, busy ms, start ms, length ms.

    The length is the bar's own (end - start), not plotly's ``%{x}``: on a bar drawn from a
    ``base`` the hover's x is where the bar ends (start + length)."""
    when = "start %{customdata[6]:,.3f} ms<br>"
    if key < 0:
        return ("<b>steady state</b>: %{customdata[4]:,} spans merged<br>stage %{customdata[0]},"
                " micro-batches %{customdata[2]}-%{customdata[3]}<br>" + when
                + "length %{customdata[7]:,.1f} ms, busy %{customdata[5]:,.1f} ms<extra></extra>")
    head = f"<b>{name}</b><br>"
    if per_op:
        head += "stage %{customdata[0]}" + (", chunk %{customdata[1]}" if v > 1 else "")
        head += ", micro-batch %{customdata[2]}<br>"
    return head + when + "duration %{customdata[7]:,.3f} ms<extra></extra>"


def _traces(tl: Timeline, bars: _Bars) -> list[go.Bar]:
    keys = _group(bars, tl.v)
    data = np.column_stack([bars.stage, bars.chunk, bars.first, bars.last, bars.count,
                            bars.busy * 1e3, bars.start * 1e3, (bars.end - bars.start) * 1e3])
    styles = {int(key): _style(int(key), tl.v) for key in np.unique(keys)}
    traces = []
    for key in sorted(styles, key=lambda k: (k < 0, k)):
        name, colour, per_op = styles[key]
        idx = np.flatnonzero(keys == key)
        traces.append(go.Bar(
            name=name, orientation="h", y=bars.row[idx], base=bars.start[idx] * 1e3,
            x=(bars.end[idx] - bars.start[idx]) * 1e3, customdata=data[idx], width=0.75,
            marker={"color": colour, "line": {"width": 0}},
            texttemplate="%{customdata[2]}" if per_op and name.split(",")[0] in _CHUNKED
            else None,
            textposition="inside", insidetextanchor="middle",
            hovertemplate=_hovertemplate(name, key, per_op, tl.v),
        ))
    return traces


def _title(plan: Plan | str, tl: Timeline, bars: _Bars,
           window: tuple[float, float, int] | None) -> str:
    if isinstance(plan, str):
        head = plan
    else:
        where = f"{plan.study} trial {plan.trial}: " if plan.study else ""
        head = f"{where}{plan.label}"
    if tl.convention == "stage":
        shape = "stage convention (ASTRA-sim totals)"
    else:
        shape = f"{tl.schedule}, p={tl.pp}" + (f", v={tl.v}" if tl.v > 1 else "") \
            + f", m={tl.micro_batches}"
    times = (f"step {_ms(tl.estimate_step_time)} (estimate); timeline ends {_ms(tl.end)}")
    if tl.convention != "stage":
        times += f"; bubble {_ms(tl.bubble)}"
    lines = [head, f"{shape}: {times}"]
    if window is not None:
        low, high, merged = window
        lines.append(f"{tl.spans:,} spans: the first and last {MAX_BARS // 2:,} drawn one by"
                     f" one, the {merged:,} from {_ms(low)} to {_ms(high)} (steady state)"
                     " merged into one bar per row")
    return "<br>".join([lines[0]] + [f"<sup>{line}</sup>" for line in lines[1:]])


def _height(rows: int, entries: int) -> int:
    """Tall enough for the rows and for the legend beside the plot, one row per entry (an
    interleaved plan has one per phase and chunk): plotly cuts a taller legend off."""
    legend = _MARGIN["t"] + _MARGIN["b"] + LEGEND_ROW_PX * entries
    return max(380, 190 + 24 * rows, legend)


def figure_from_timeline(plan: Plan | str, tl: Timeline) -> go.Figure:
    """The figure of a timeline already computed for ``plan`` (or a plan described by a
    label, e.g. a plan on a mixed cluster)."""
    bars, window = _bars(tl)
    fig = go.Figure(_traces(tl, bars))
    note = "<br>".join(textwrap.wrap(tl.note, 150))
    fig.update_layout(
        title={"text": _title(plan, tl, bars, window), "x": 0.01},
        barmode="overlay", template="plotly_white",
        height=_height(len(tl.rows), len(fig.data)),
        xaxis={"title": "time (ms)", "rangemode": "tozero"},
        yaxis={"tickmode": "array", "tickvals": list(range(len(tl.rows))),
               "ticktext": list(tl.rows), "autorange": "reversed", "zeroline": False,
               "showgrid": False},
        uniformtext={"minsize": 8, "mode": "hide"},
        legend={"traceorder": "normal"},
        margin=_MARGIN,
        annotations=[{"text": note, "xref": "paper", "yref": "paper", "x": 0, "y": 0, "yshift": -48,
                      "yanchor": "top", "xanchor": "left", "showarrow": False,
                      "align": "left", "font": {"size": 11}}],
    )
    fig.add_vline(x=tl.estimate_step_time * 1e3, line={"dash": "dash", "width": 1,
                                                       "color": "#333"},
                  annotation_text="estimate", annotation_position="top")
    return fig


def timeline_figure(plan: Plan) -> go.Figure:
    """A plotly timeline of one training step of ``plan``: forwards and backwards per
    micro-batch per stage (per chunk when interleaved), exposed communication on its own rows,
    the gradient reduction and the optimizer step; x in milliseconds."""
    tl = simcore.step_timeline(plan.model, plan.system, plan.training, plan.strategy,
                               plan.convention, estimate=plan.estimate)
    return figure_from_timeline(plan, tl)
