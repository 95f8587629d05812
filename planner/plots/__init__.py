"""Figures (plotly): the Pareto front, system comparisons, step-time breakdowns, timelines.

Every figure is a ``plotly.graph_objects.Figure``; :func:`write_figure` saves it as a
self-contained HTML page (the default: plotly.js inlined, so the page opens offline) or as a PNG
(kaleido, which needs a Chrome or Debian's ``chromium``; see ``../shared/optuna-notes.md``).
"""

from __future__ import annotations

from planner.plots._write import FORMATS, figure_format, figure_html, write_figure

__all__ = ["FORMATS", "figure_format", "figure_html", "write_figure"]
