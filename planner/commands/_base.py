from __future__ import annotations

import abc
import argparse
import os


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


def max_jobs() -> int:
    """``--jobs`` bound: 4 worker processes per core (os.cpu_count()); more only wait for a
    core while each holds its own copy of the planner (about 100 MB)."""
    return 4 * (os.cpu_count() or 1)


def jobs(text: str) -> int:
    """``--jobs``: worker processes, 1 to :func:`max_jobs` (argparse makes the error one line)."""
    limit = max_jobs()
    if not text.strip().isdigit() or len(text.strip()) > 9:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {limit}, not"
                                         f" {text[:20]!r}")
    value = int(text)
    if not 1 <= value <= limit:
        raise argparse.ArgumentTypeError(f"must be from 1 to {limit} (4 per core on this"
                                         f" machine's {os.cpu_count() or 1}), not {value}")
    return value


def positive_int(text: str) -> int:
    """A whole number >= 1 of at most 9 digits, for counts given on the command line."""
    if not text.strip().isdigit() or len(text.strip()) > 9 or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to 999,999,999, not"
                                         f" {text[:20]!r}")
    return int(text)


def add_storage_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--storage", metavar="PATH|URL",
                        help="a folder of studies (one journal each; an existing folder or a"
                        " path ending in /), a journal file, or an Optuna RDB URL (default:"
                        " $PLANNER_STORAGE or planner-results/studies/)")


def seed(text: str) -> int:
    """``--seed``: a whole number from 0 to 2**32 - 1 (numpy's, which Optuna's samplers and
    CMA-ES take; beyond it they raised ValueError after the set-up)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"give a whole number from 0 to {2**32 - 1}, not"
                                         f" {value}")
    return value


def at_least_one(text: str) -> int:
    """A whole number >= 1 (``--top`` and the like)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {value}")
    return value

