from __future__ import annotations

import abc
import argparse


class BaseCommand(abc.ABC):
    """One subcommand: its name, one-line help, its arguments and what it does."""

    name: str
    help: str

    @abc.abstractmethod
    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    @abc.abstractmethod
    def run(self, args: argparse.Namespace) -> int:
        """Do the work; return the exit code. Raise PlannerUsageError for bad input."""


def hbm_gb(text: str) -> float:
    """``--hbm-gb``: GB of HBM per device, a number > 0 (argparse turns the error into one line)."""
    from planner.fields import MAX_NUMBER

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of GB, not {text!r}") from None
    if not 0 < value <= MAX_NUMBER:
        raise argparse.ArgumentTypeError(f"must be a number of GB > 0, not {text}")
    return value
