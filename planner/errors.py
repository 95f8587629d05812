"""Errors the command line turns into one line on stderr and exit code 2."""

from __future__ import annotations


class PlannerUsageError(Exception):
    """Bad input from the user: a file, a field or an option. The message says what to fix."""



class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with the line that says what is kept and how to continue: the command line prints
    it once, as ``planner COMMAND: LINE``, and exits 130."""
