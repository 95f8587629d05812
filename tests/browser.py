"""Open a page in headless Chromium (Debian's ``chromium``) and return the DOM after its
scripts ran; None where no Chromium is installed (`.ci/run` installs it)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

# The flags a sandboxed, offline machine needs (shared env notes: without the
# background-networking ones Chromium keeps trying to reach Google's hosts).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=20000", "--dump-dom"]


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def rendered_dom(page: Path) -> str | None:
    browser = chromium()
    if browser is None:
        return None
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}",
                               page.resolve().as_uri()],
                              capture_output=True, text=True, timeout=120, check=False)
    return done.stdout


def plots(dom: str) -> list[str]:
    """The DOM of each plotly figure on the page, in order."""
    return dom.split('class="plotly-graph-div')[1:]
