"""The comparison figure (best step time per system per HBM limit) and its HTML page.

:func:`comparison_figure` draws a comparison table (:mod:`planner.compare`, one row per cell):
grouped bars, one group per system, one bar per HBM limit, each labelled with its step time and
winning plan (MFU and peak memory too in the hover); a cell without a feasible plan is marked
"no feasible plan" where its bar would be.
:func:`figures_page` puts several figures in one self-contained page (plotly.js inlined once).
"""

from __future__ import annotations

import html
import math

import pandas as pd
import plotly.graph_objects as go

from planner.plots._write import figure_html

__all__ = ["cell_text", "comparison_figure", "figures_page"]

NO_PLAN = "no feasible plan"
_COLORS = ("#4C78A8", "#F58518", "#54A24B", "#B279A2", "#E45756", "#72B7B2", "#EECA3B")


def _limit_text(value: object) -> str:
    if isinstance(value, str):
        return value
    return f"{float(value):g} GB"  # type: ignore[arg-type]


def _hover(row: pd.Series) -> str:
    if pd.isna(row["step_time_s"]):
        return (f"<b>{row['system']}, HBM {_limit_text(row['hbm_gb'])}</b><br>{NO_PLAN}"
                f" ({row.get('trials', '?')} plans tried)")
    return (f"<b>{row['system']}, HBM {_limit_text(row['hbm_gb'])}</b><br>{row['plan']}<br>"
            f"step {row['step_time_s']:.4g} s, MFU {row['mfu']:.1%},"
            f" {row['tokens_per_s']:,.0f} tokens/s<br>peak memory"
            f" {row['peak_memory_gb']:.1f} GB<br>{row['feasible_plans']} feasible plans of"
            f" {row['trials']}")


def cell_text(plan: object, words_per_line: int = 2) -> str:
    """The winning plan as a bar's label: its words, a few per line ("" for no plan)."""
    if not isinstance(plan, str):
        return ""
    words = plan.split()
    return "<br>".join(" ".join(words[i:i + words_per_line])
                       for i in range(0, len(words), words_per_line))


def comparison_figure(table: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Best step time per system (groups) per HBM limit (bars), from a comparison table with
    columns system, hbm_gb, plan, step_time_s, mfu, tokens_per_s, peak_memory_gb,
    feasible_plans and trials."""
    systems = list(dict.fromkeys(table["system"]))
    limits = list(dict.fromkeys(table["hbm_gb"].map(_limit_text)))
    fig = go.Figure()
    for i, limit in enumerate(limits):
        rows = table[table["hbm_gb"].map(_limit_text) == limit]
        rows = rows.set_index("system").reindex(systems).reset_index()
        color = _COLORS[i % len(_COLORS)]
        times, plans = rows["step_time_s"].tolist(), rows["plan"].tolist()
        hover = [_hover(r) if pd.notna(r["hbm_gb"]) else "" for _, r in rows.iterrows()]
        fig.add_trace(go.Bar(
            x=systems, y=times, name=f"HBM {limit}", marker_color=color, offsetgroup=limit,
            text=[cell_text(p) if not math.isnan(t) else "" for t, p in zip(times, plans)],
            texttemplate="<b>%{y:.3g} s</b><br>%{text}", textposition="outside",
            textfont={"size": 10}, hovertext=hover, hoverinfo="text", cliponaxis=False))
        empty = [(s, h) for s, t, h in zip(systems, times, hover) if math.isnan(t)]
        if empty:
            fig.add_trace(go.Scatter(
                x=[s for s, _ in empty], y=[0] * len(empty), mode="markers+text",
                text=[NO_PLAN.replace(" plan", "<br>plan")] * len(empty),
                textposition="top center", marker={"symbol": "x-thin-open", "size": 12,
                                                   "color": color, "line": {"width": 2}},
                offsetgroup=limit, hovertext=[h for _, h in empty], hoverinfo="text",
                showlegend=False, name=f"HBM {limit}: {NO_PLAN}", cliponaxis=False))
    fig.update_layout(
        barmode="group", scattermode="group", title=title, template="plotly_white",
        yaxis_title="best step time (s)", xaxis_title="system", legend_title_text="limit",
        height=480, margin={"t": 90 if title else 50})
    fig.update_yaxes(rangemode="tozero", range=_headroom(table["step_time_s"]))
    return fig


def _headroom(times: pd.Series) -> list[float] | None:
    """A y range with room above the tallest bar for its label (time and plan, four lines)."""
    top = times.max()
    return None if pd.isna(top) else [0.0, float(top) * 1.4]


def figures_page(title: str, figures: list[go.Figure], intro: str = "") -> str:
    """One self-contained HTML page: a heading, an optional paragraph, then the figures, with
    plotly.js inlined once (in the first figure)."""
    divs = [figure_html(fig, full_html=False, include_plotlyjs=(i == 0))
            for i, fig in enumerate(figures)]
    paragraph = f"<p>{html.escape(intro)}</p>\n" if intro else ""
    body = "\n".join(f"<div class=\"figure\">{d}</div>" for d in divs)
    return (f"<!DOCTYPE html>\n<html>\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>body {{font-family: sans-serif;"
            f" margin: 1.5em;}} .figure {{margin-bottom: 2em;}}</style>\n</head>\n<body>\n"
            f"<h1>{html.escape(title)}</h1>\n{paragraph}{body}\n</body>\n</html>\n")
