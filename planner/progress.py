"""Progress on stderr: tqdm's bar, as ``planner run`` shows it. Off when asked (``--quiet``) and
when stderr is not a terminal, so that logs and captured output hold no bar."""

from __future__ import annotations

import sys

from tqdm.auto import tqdm

__all__ = ["progress_bar"]


def progress_bar(total: int | None, enabled: bool, what: str, unit: str) -> tqdm:
    """A bar of ``total`` ``unit``s named ``what``, cleared when done."""
    return tqdm(total=total, unit=unit, desc=what, disable=not enabled or None,
                file=sys.stderr, dynamic_ncols=True, leave=False)
