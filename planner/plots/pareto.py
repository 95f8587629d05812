"""Step time against peak memory per device: every trial a point, the Pareto front drawn.

Built on ``optuna.visualization.plot_pareto_front``, which shades the trials that break the HBM
constraint by itself (Optuna 5 reads ``trial.constraints``). A study with one objective is
plotted through ``targets=`` (its step time and the peak memory each trial stored), so both
kinds of study give the same picture. On top of Optuna's figure: the front as a line, the
study's HBM limit (and one asked for) as lines, axis labels with units, and a hover that shows
the strategy with its time and memory parts.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

import optuna
import plotly.graph_objects as go
from optuna.trial import FrozenTrial, TrialState

from planner.errors import PlannerUsageError

__all__ = ["INFEASIBLE", "LimitLine", "hover_text", "limit_lines", "log_ticks", "pareto_figure"]

INFEASIBLE = "infeasible (over the study's HBM limit)"
_NUMBER = re.compile(r'"number": (\d+)')


def _targets(trial: FrozenTrial) -> tuple[float, float]:
    return trial.user_attrs["step_time_s"], trial.user_attrs["peak_memory_gb"]


def _parts(attrs: Mapping[str, Any], prefix: str, suffix: str, unit: str, scale: float
           ) -> list[str]:
    out = []
    for key, value in attrs.items():
        if key.startswith(prefix) and key.endswith(suffix) and value:
            name = key[len(prefix):-len(suffix)]
            out.append(f"  {name}: {value * scale:.4g} {unit}")
    return out


def hover_text(trial: FrozenTrial) -> str:
    """The strategy, then the step time and peak memory with their non-zero parts."""
    a = trial.user_attrs
    lines = [f"<b>trial {trial.number}: {a.get('plan', '?')}</b>",
             f"step time {a['step_time_s']:.4g} s (MFU {a.get('mfu', 0):.1%})",
             *_parts(a, "time_", "_s", "s", 1.0),
             f"peak memory {a['peak_memory_gb']:.4g} GB (stage {a.get('peak_stage', 0)})",
             *_parts(a, "memory_", "_gb", "GB", 1.0)]
    if a.get("reason"):
        lines.append(f"<i>{a['reason']}</i>")
    return "<br>".join(lines)


def _plottable(study: optuna.Study) -> dict[int, FrozenTrial]:
    trials = {t.number: t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
              if "step_time_s" in t.user_attrs and "peak_memory_gb" in t.user_attrs}
    if not trials:
        raise PlannerUsageError(f"study {study.study_name!r} has no finished trial to plot yet;"
                                " `planner run STUDY.yaml --resume` runs it to its end")
    return trials


def pareto_figure(study: optuna.Study, hbm_gb: float | None = None) -> go.Figure:
    """The study's trials in the (step time, peak memory) plane, with the study's own HBM limit
    (the one that colours the points; none when it ran unlimited) and, when ``hbm_gb`` differs,
    that limit too."""
    trials = _plottable(study)
    level = optuna.logging.get_verbosity()
    # its log line when no trial fits ("does not have any completed and feasible trials") is
    # the figure's to show: every point is then shaded as over the limit
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        with warnings.catch_warnings():  # plot_pareto_front is marked experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            fig = optuna.visualization.plot_pareto_front(
                study, targets=_targets,
                target_names=["step time (s)", "peak memory per device (GB)"])
    finally:
        optuna.logging.set_verbosity(level)
    front: list[tuple[float, float]] = []
    for trace in fig.data:
        texts = trace.text or ()
        numbers = [int(m.group(1)) if (m := _NUMBER.search(t)) else -1 for t in texts]
        trace.name = _trace_name(trace)
        trace.text = [hover_text(trials[n]) if n in trials else "" for n in numbers]
        trace.hovertemplate = "%{text}<extra></extra>"
        trace.showlegend = True
        _restyle(trace)
        if trace.name == "Pareto front":
            front = sorted(zip(trace.x, trace.y))
    if len(study.directions) == 1:  # Optuna's "best" is then the one fastest trial
        front = _split_front(fig)
    if front:
        fig.add_trace(go.Scatter(x=[x for x, _ in front], y=[y for _, y in front],
                                 mode="lines", line={"color": "#d62728", "shape": "hv"},
                                 name="front", hoverinfo="skip"))
    times = [t.user_attrs["step_time_s"] for t in trials.values()]
    for line in limit_lines(study, hbm_gb):
        fig.add_trace(_limit_trace(line, min(times), max(times)))
    fig.update_layout(title=f"{study.study_name}: step time against peak memory per device"
                      f" ({len(trials):,} trials)", hoverlabel={"align": "left"},
                      legend={"orientation": "h", "y": -0.15})
    _log_axes(fig)
    return fig


class LimitLine(NamedTuple):
    """A horizontal HBM limit on the Pareto page: its height (GB), legend entry and dash."""

    gb: float
    name: str
    dash: str


def limit_lines(study: optuna.Study, hbm_gb: float | None) -> list[LimitLine]:
    """The study's own limit (the one the points are coloured by), then ``hbm_gb`` when it is
    another."""
    own = (study.user_attrs.get("config") or {}).get("hbm_gb")
    lines = []
    if own is not None:
        lines.append(LimitLine(own, f"study's HBM limit {own:g} GB (colours the points)", "dash"))
    if hbm_gb is not None and hbm_gb != own:
        lines.append(LimitLine(hbm_gb, f"asked HBM limit {hbm_gb:g} GB (--hbm-gb)", "dot"))
    return lines


def _limit_trace(line: LimitLine, low: float, high: float) -> go.Scatter:
    """A trace, not add_hline: its annotation misplaces on log axes."""
    return go.Scatter(x=[low, high], y=[line.gb, line.gb], mode="lines", name=line.name,
                      line={"color": "#444", "dash": line.dash}, hoverinfo="name")


_MANTISSAS = ((1.0,), (1.0, 2.0, 5.0), tuple(float(m) for m in range(1, 10)))


def log_ticks(low: float, high: float, unit: str) -> tuple[list[float], list[str]]:
    """Tick values and labels (``"2 s"``, ``"50 GB"``) for a log axis over [low, high]: the
    decades, 1-2-5 or 1..9 per decade, the coarsest giving at least three ticks; else the two
    ends."""
    decades = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
    values: list[float] = []
    for mantissas in _MANTISSAS:
        values = [float(f"{m * 10.0 ** d:.12g}") for d in decades for m in mantissas]
        values = [v for v in values if low <= v <= high]
        if len(values) >= 3:
            break
    if len(values) < 2:
        values = sorted({float(f"{low:.3g}"), *values, float(f"{high:.3g}")})
    return values, [f"{v:g} {unit}" for v in values]


def _log_axes(fig: go.Figure) -> None:
    """Log axes (times and memories span decades: a bad plan is 100x slower) whose every label
    reads as a value with its unit (plotly's own minor labels are bare digits)."""
    xs = [float(x) for t in fig.data for x in (t.x or ()) if x is not None]
    ys = [float(y) for t in fig.data for y in (t.y or ()) if y is not None]
    for update, points, unit in ((fig.update_xaxes, xs, "s"), (fig.update_yaxes, ys, "GB")):
        values, labels = log_ticks(min(points), max(points), unit)
        update(type="log", tickmode="array", tickvals=values, ticktext=labels)


_COLORS = {"Pareto front": ("#d62728", 9), "feasible": ("#1f77b4", 6)}


def _restyle(trace: Any) -> None:
    """One colour per kind instead of Optuna's trial-number colour scales (and their bars)."""
    if trace.name in _COLORS:
        color, size = _COLORS[trace.name]
        trace.marker = {"color": color, "size": size, "opacity": 0.75,
                        "line": {"width": 0.5, "color": "#333"}}


def _split_front(fig: go.Figure) -> list[tuple[float, float]]:
    """Re-split the feasible points into the (step time, memory) front and the rest."""
    kinds = {t.name: t for t in fig.data}
    feasible, best = kinds.get("feasible"), kinds.get("Pareto front")
    if feasible is None or best is None:
        return sorted(zip(best.x, best.y)) if best is not None else []
    points = [(x, y, text) for t in (feasible, best) for x, y, text in zip(t.x, t.y, t.text)]
    points.sort(key=lambda p: (p[0], p[1]))
    on_front, rest, lowest = [], [], float("inf")
    for p in points:  # fastest first: on the front iff it needs less memory than all faster
        (on_front if p[1] < lowest else rest).append(p)
        lowest = min(lowest, p[1])
    for trace, chosen in ((best, on_front), (feasible, rest)):
        trace.x = [p[0] for p in chosen]
        trace.y = [p[1] for p in chosen]
        trace.text = [p[2] for p in chosen]
    return [(p[0], p[1]) for p in on_front]


def _trace_name(trace: Any) -> str:
    kind = str(trace.hovertemplate or "")
    marker_color = getattr(trace.marker, "color", None)
    if marker_color == "#cccccc" or "Infeasible" in kind:
        return INFEASIBLE
    if "Best" in kind:
        return "Pareto front"
    return "feasible"
