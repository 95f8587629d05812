"""Symbolic tensor dimensions the way STAGE writes them, and what their layouts imply.

A dimension is a monomial of STAGE's symbols, e.g. ``Dmodel/(Head*sp)``. A tensor's layout is
its shape plus its *hidden* dimensions (contracted dimensions it is still a partial sum over).
Comparing the producer's layout with the one a consumer asks for gives the collectives STAGE
inserts (``graph/coll_comm_matcher.py``; shared reference NOTES.md section 5.3).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from functools import cache
from typing import NamedTuple

from simcore.network import Collective

__all__ = ["PARALLEL_AXES", "Dim", "Shape", "einsum", "match_collectives", "parse_shape"]

PARALLEL_AXES = ("dp", "tp", "sp")
"""STAGE's spatial parallel symbols, in the order its matcher tries them."""


class Dim(NamedTuple):
    """``prod(num) / prod(den)`` of symbol names; both sorted so that equal means equal.

    A plain tuple underneath, so that shapes hash fast (they key several caches)."""

    num: tuple[str, ...]
    den: tuple[str, ...] = ()

    @property
    def symbols(self) -> frozenset[str]:
        return frozenset(self.num) | frozenset(self.den)

    def renamed(self, old: str, new: str) -> Dim:
        return Dim(
            tuple(sorted(new if s == old else s for s in self.num)),
            tuple(sorted(new if s == old else s for s in self.den)),
        )

    def __str__(self) -> str:
        num = "*".join(self.num) or "1"
        if not self.den:
            return num
        den = self.den[0] if len(self.den) == 1 else "(" + "*".join(self.den) + ")"
        return f"{num}/{den}"


Shape = tuple[Dim, ...]


def _parse_dim(text: str) -> Dim:
    top, _, bottom = text.strip().partition("/")
    num = tuple(sorted(s for s in top.strip("() ").split("*") if s.strip() not in ("", "1")))
    den = tuple(sorted(s.strip() for s in bottom.strip("() ").split("*") if s.strip()))
    return Dim(tuple(s.strip() for s in num), den)


@cache
def parse_shape(text: str) -> Shape:
    """``"Batch/dp, Seq/sp, Dmodel/tp"`` -> three dims; ``""`` -> ()."""
    return tuple(_parse_dim(t) for t in text.split(",") if t.strip())


def einsum(spec: str, x1: Shape, x2: Shape) -> tuple[Shape, Shape]:
    """Output shape and hidden (contracted) dims of ``x1, x2 -> y``; ops = prod(y) * prod(hidden)."""
    inputs, y_letters = spec.split("->")
    l1, l2 = inputs.split(",")
    if len(l1) != len(x1) or len(l2) != len(x2):
        raise ValueError(f"einsum {spec!r} does not fit shapes of rank {len(x1)} and {len(x2)}")
    dims: dict[str, Dim] = {}
    for letter, dim in (*zip(l1, x1), *zip(l2, x2)):
        if dims.setdefault(letter, dim) != dim:
            raise ValueError(f"einsum {spec!r}: letter {letter!r} is both {dims[letter]} and {dim}")
    y = tuple(dims[c] for c in y_letters)
    hidden = tuple(dims[c] for c in l1 if c not in y_letters)
    return y, hidden


class _End(Enum):
    PARTITION = "partition"
    REDUCED = "reduced"


def _parallel_ends(shape: Shape, hidden: Shape, axes: Sequence[str]) -> dict[str, tuple[_End, Dim]]:
    """Which tensor dim each parallel axis splits (or, in hidden, still sums over).

    One axis per dimension, taken in ``axes`` order: STAGE's matcher gives ``Dmodel/(dp*sp)``
    to dp only (NOTES.md section 5.3, the FSDP quirk)."""
    remaining = list(axes)
    ends: dict[str, tuple[_End, Dim]] = {}
    for kind, dims in ((_End.PARTITION, shape), (_End.REDUCED, hidden)):
        for dim in dims:
            axis = next((a for a in remaining if a in dim.symbols), None)
            if axis is not None:
                remaining.remove(axis)
                ends[axis] = (kind, dim)
    return ends


@cache
def match_collectives(
    from_shape: Shape, from_hidden: Shape, to_shape: Shape, axes: tuple[str, ...]
) -> tuple[tuple[Collective, str], ...]:
    """The collectives (and the axis of each) that turn the producer's layout into the one the
    consumer reads, in ``axes`` order. Split -> whole: all-gather; partial sum -> split:
    reduce-scatter; partial sum -> whole: all-reduce; split on another dim: all-to-all."""
    produced = _parallel_ends(from_shape, from_hidden, axes)
    wanted = _parallel_ends(to_shape, (), axes)
    result = []
    for axis in axes:
        if axis not in produced:
            if axis in wanted:
                raise ValueError(f"a consumer wants {axis} split but the producer is not")
            continue
        (p_kind, p_dim) = produced[axis]
        w_kind, w_dim = wanted.get(axis, (_End.REDUCED, None))
        if p_kind is _End.PARTITION:
            if w_kind is _End.REDUCED:
                result.append((Collective.ALL_GATHER, axis))
            elif w_dim != p_dim:
                result.append((Collective.ALL_TO_ALL, axis))
        elif w_kind is _End.PARTITION:
            result.append((Collective.REDUCE_SCATTER, axis))
        else:
            result.append((Collective.ALL_REDUCE, axis))
    return tuple(result)

