"""Which STAGE arguments give a trace, decided from the block tables alone.

STAGE takes any sizes and degrees: a dimension that a degree does not divide stays a fraction,
and only the number written for a whole product is truncated (:mod:`._counts`). What is refused
is what :func:`~simcore.stage._counts.number` refuses: a count below one element, or one too
large for the trace's integer fields. Building the graph finds the same thing, but a search
space asks for every candidate layout; evaluating the expressions of the three block tables is
enough.
"""

from __future__ import annotations

from functools import cache

from simcore.stage._args import StageArgs
from simcore.stage._counts import Count, Total, numbers
from simcore.stage._symbolic import stage_numbers

__all__ = ["check_args"]


@cache
def _numbers(weight_sharded: bool, recompute: bool) -> tuple[Count | Total, ...]:
    return stage_numbers(weight_sharded, recompute)


def check_args(args: StageArgs) -> None:
    """Raise ValueError (naming the flags) if STAGE's trace for ``args`` cannot be estimated."""
    numbers(_numbers(args.weight_sharded, args.activation_recompute), args.value_of)
