"""Saving figures: HTML by default, PNG when a browser for kaleido is there."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import plotly.graph_objects as go

from planner.errors import PlannerUsageError
from planner.outputs import atomic_write

__all__ = ["FORMATS", "figure_format", "figure_html", "write_figure"]

FORMATS = ("html", "png")


def figure_html(fig: go.Figure, *, full_html: bool = True, include_plotlyjs: bool | str = True
                ) -> str:
    """The figure as HTML; plotly.js inlined unless told otherwise (the page works offline)."""
    return fig.to_html(full_html=full_html, include_plotlyjs=include_plotlyjs,
                       config={"displaylogo": False})


def _chrome() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def figure_format(path: Path | None, fmt: str | None) -> str:
    """``fmt``, else the suffix of ``path``, else HTML; a one-line error for anything else."""
    given = fmt
    fmt = fmt or (path.suffix.lstrip(".").lower() if path is not None and path.suffix
                  else "html")
    if fmt not in FORMATS:
        where = f"--format {fmt}" if given else f"--out {path}"
        raise PlannerUsageError(f"{where}: unknown figure format {fmt!r}; use html or png")
    return fmt


def write_figure(fig: go.Figure, path: Path, fmt: str | None = None) -> Path:
    """Save ``fig`` to ``path`` as ``fmt`` (default: from the suffix, else HTML)."""
    fmt = figure_format(path, fmt)
    if fmt == "html":
        atomic_write(path, figure_html(fig), (".html", ".htm"))
        return path
    chrome = _chrome()
    if chrome is None:
        raise PlannerUsageError("PNG needs a Chrome for kaleido: install Debian's chromium"
                                " (apt-get install chromium) or use HTML (the default)")
    try:
        import kaleido  # noqa: F401 - plotly's image engine
    except ImportError:
        raise PlannerUsageError("PNG needs kaleido: pip install 'parallel-planner[png]'"
                                " (or use HTML, the default)") from None
    os.environ.setdefault("BROWSER_PATH", chrome)  # where kaleido (choreographer) finds it
    try:
        png = fig.to_image(format="png", width=1100, height=650)
    except Exception as e:  # noqa: BLE001 - kaleido's browser failures come in many types
        raise PlannerUsageError(f"PNG export failed ({type(e).__name__}: {e}); use HTML") from None
    atomic_write(path, png, (".png",))
    return path
