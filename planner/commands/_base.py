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
