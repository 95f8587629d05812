"""The numbers STAGE writes into a trace, from its symbolic shapes, exactly as STAGE computes them.

STAGE recomp (astra-sim/symbolic_tensor_graph@0b44904d) never rounds a dimension. A dimension is
a sympy expression (``Din/tp``; ``symbolic_tensor_graph/tensor.py`` lines 76-83); a size is the
product of a shape's dimensions (``Tensor.eval_size``, tensor.py lines 117-122) and an op count
the product of the output and contracted dimensions (``ops/einsum.py`` lines 64-68; times
``float(amp)`` = 5.0 for the norm, ``ops/element.py`` lines 26-28), each one expression in which
common symbols cancel (``Head`` always does). Only when a node is written does STAGE turn one into
a number:

- ``float(expr.evalf(subs=values))`` (``Tensor.eval_expr``, tensor.py line 114);
- a compute node's ``tensor_size`` is the float sum output + x1 + x2
  (``graph/convert_chakra.py`` lines 43-56);
- the trace stores ``int(...)`` of it: num_ops, tensor_size, comm_size
  (``chakra/backends/chakra_00_4_backend/chakra_00_4_backend.py`` lines 91, 94, 112, 133, 147);
- an input/output entry is ``str(float)`` (same file, line 58), which ASTRA-sim reads with
  ``std::stoull`` (astra-sim@518bd51 ``workload/LocalMemUsageTracker.cc`` line 35).

So a remainder is truncated once, on the whole product: ``--din 50257 --tp 8 --batch 3 --seq 10``
gives the one-hot input 3 * 10 * 50257 / 8 = 188,463.75 -> 188,463 elements.

``evalf`` (sympy 1.14, 15 digits) is exact for a whole value below 2^53. Other values are rounded
the way it rounds them (:func:`_evalf`), which is not always the nearest float: for
``Batch*Din*Seq/(dp*sp*tp)`` at 5664, 984788, 3783 / (59*3*38) it gives 3137223582.315789 where
the nearest float is 3137223582.3157897.

STAGE itself refuses nothing here; two cases are refused with one line each (:class:`Refused`):
a count below one element (STAGE would write 0, which this estimate does not model) and a count
that does not fit the trace's int64 (uint64 for tensor_size) fields, where STAGE's protobuf
writer stops with an error.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from math import prod
from typing import NamedTuple

from simcore.stage._shapes import Dim

__all__ = ["EXACT_BELOW", "Count", "Refused", "Total", "count_of", "entry_size", "number",
           "numbers"]

EXACT_BELOW = 1 << 53
"""Whole values below this are written exactly (a double's integers)."""
INT64_END = 1 << 63
UINT64_END = 1 << 64

_FLAGS = {"Batch": "--batch", "Seq": "--seq", "Dmodel": "--dmodel", "Dff": "--dff",
          "Head": "--head", "Din": "--din", "Dout": "--dout", "dp": "--dp", "tp": "--tp",
          "sp": "--sp"}


class Refused(ValueError):
    """Arguments whose trace STAGE cannot write or this estimate does not model."""


class Count(NamedTuple):
    """``amp * prod(num) / prod(den)`` over STAGE's symbols, common symbols cancelled."""

    num: tuple[str, ...]
    """Sorted, with repeats (``Dmodel**2`` is two entries)."""
    den: tuple[str, ...]
    amp: int | None = None
    """The element-wise op's float factor (``Element`` ops), or None: a plain product."""

    def __str__(self) -> str:
        text = "*".join(self.num) or "1"
        if self.den:
            text += "/" + (self.den[0] if len(self.den) == 1 else f"({'*'.join(self.den)})")
        return text if self.amp is None else f"{self.amp}*{text}"


class Total(NamedTuple):
    """A compute node's tensor_size: output + x1 + x2, added as floats in this order."""

    parts: tuple[Count, ...]


def count_of(shape: Iterable[Dim], amp: int | None = None) -> Count:
    """The product of a shape's dimensions, as sympy simplifies it."""
    num: Counter[str] = Counter()
    den: Counter[str] = Counter()
    for d in shape:
        num.update(d.num)
        den.update(d.den)
    common = num & den
    num -= common
    den -= common
    return Count(tuple(sorted(num.elements())), tuple(sorted(den.elements())), amp)


def _fraction(c: Count, value_of: Callable[[str], int]) -> tuple[int, int]:
    return (prod(value_of(s) for s in c.num) * (1 if c.amp is None else c.amp),
            prod(value_of(s) for s in c.den))


def stage_float(c: Count, value_of: Callable[[str], int]) -> float:
    """``float(expr.evalf(subs=values))`` for the count's expression."""
    n, d = _fraction(c, value_of)
    q, r = divmod(n, d)
    if not r and q < EXACT_BELOW:
        return float(q)
    return _evalf(c, value_of)


def number(v: Count | Total, value_of: Callable[[str], int]) -> int:
    """The integer STAGE writes for ``v`` (num_ops, comm_size or tensor_size); raises
    :class:`Refused` below one element or beyond the trace's integer fields."""
    if isinstance(v, Total):
        parts = [_whole(c, value_of) for c in v.parts]
        if all(p is not None for p in parts) and sum(parts) < EXACT_BELOW:  # type: ignore[arg-type]
            return sum(parts)  # type: ignore[arg-type]
        total = 0.0
        for c in v.parts:
            total += stage_float(c, value_of)
        if total >= UINT64_END:
            raise Refused(f"a tensor_size of {total:.4g} elements does not fit the trace's"
                          " uint64 field: STAGE's Chakra writer stops there; give smaller sizes")
        return int(total)
    whole = _whole(v, value_of)
    if whole is not None:
        return whole
    value = stage_float(v, value_of)
    if value >= INT64_END:
        raise Refused(f"{v} = {_flags(v, value_of)} = {value:.4g} does not fit the int64 field"
                      " STAGE writes it to (its protobuf writer stops there); give smaller sizes")
    return int(value)


def numbers(vs: Iterable[Count | Total], value_of: Callable[[str], int]) -> list[int]:
    """:func:`number` of each of ``vs``, faster for many: whole products below 2^53 (the common
    case) take a few multiplications each, and each count is worked out once."""
    values = {s: value_of(s) for s in _FLAGS}
    found: dict[Count, int | None] = {}

    def whole(c: Count) -> int | None:
        if c in found:
            return found[c]
        n = 1 if c.amp is None else c.amp
        d = 1
        for s in c.num:
            n *= values[s]
        for s in c.den:
            d *= values[s]
        q, r = divmod(n, d)
        w = found[c] = q if not r and 0 < q < EXACT_BELOW else None
        return w

    out = []
    for v in vs:
        if type(v) is Count:
            w = whole(v)
        else:
            parts = [whole(c) for c in v.parts]  # type: ignore[union-attr]
            w = None if None in parts else sum(parts)  # type: ignore[arg-type]
            w = w if w is not None and w < EXACT_BELOW else None
        out.append(number(v, values.__getitem__) if w is None else w)
    return out


def _whole(c: Count, value_of: Callable[[str], int]) -> int | None:
    """The count when it is whole and below 2^53; raises :class:`Refused` below one."""
    n, d = _fraction(c, value_of)
    if n < d:
        raise Refused(
            f"{c} = {_flags(c, value_of)} = {n / d:.3g} is below one element per rank: STAGE"
            " would write 0; give larger sizes or smaller parallel degrees")
    q, r = divmod(n, d)
    return q if not r and q < EXACT_BELOW else None


def entry_size(c: Count, value_of: Callable[[str], int]) -> int:
    """An input/output entry: ``std::stoull(str(float))`` (digits before any '.' or 'e')."""
    whole = _whole(c, value_of)
    if whole is not None:
        return whole
    text = repr(stage_float(c, value_of))
    digits = text[:len(text) - len(text.lstrip("0123456789"))]
    return int(digits)


def _flags(c: Count, value_of: Callable[[str], int]) -> str:
    def side(symbols: tuple[str, ...]) -> str:
        return " * ".join(f"{_FLAGS[s]} {value_of(s)}" for s in symbols) or "1"

    text = side(c.num) + (f" / ({side(c.den)})" if c.den else "")
    return text if c.amp is None else f"{c.amp} * {text}"


# -- sympy 1.14's evalf of a product, bit for bit -------------------------------------------------
# Sources (sympy 1.14.0, mpmath 1.3.0): EvalfMixin.evalf (sympy/core/evalf.py) evaluates at
# dps_to_prec(15) + 4 = 57 bits and rounds to 53 (Float._new -> mpf_norm, round-half-even);
# evalf_mul multiplies the exact mantissas of its factors, each evaluated at 57 + len(args) + 5
# bits, dropping `working_prec` low bits whenever the summed bit counts pass 3 * working_prec,
# then rounds to 57 bits (round-half-even); a factor is an integer (exact), the Float amp
# (exact), x**2 (exact here) or x**-1 = mpf_div(1, x) rounded down (mpf_pow_int's round_fast).
# STAGE's products have at most one reciprocal per symbol and squares of Dmodel or Seq only.

_PREC = 53 + 4


def _mpf(man: int, exp: int, prec: int, nearest: bool) -> tuple[int, int, int]:
    """mpmath's ``normalize``: (mantissa, exponent, bit count), rounded to ``prec`` bits
    (half-even or down) and stripped of trailing zero bits."""
    bc = man.bit_length()
    n = bc - prec
    if n > 0:
        if nearest:
            t = man >> (n - 1)
            man = (t >> 1) + 1 if t & 1 and (t & 2 or man & ((1 << (n - 1)) - 1)) else t >> 1
        else:
            man >>= n
        exp += n
    zeros = (man & -man).bit_length() - 1
    man >>= zeros
    return man, exp + zeros, man.bit_length()


def _reciprocal(x: int, prec: int) -> tuple[int, int, int]:
    """``mpf_div(1, x, prec, round_down)``."""
    man, exp, bc = _mpf(x, 0, prec, nearest=False)
    if man == 1:
        return 1, -exp, 1
    extra = max(prec - 1 + bc + 5, 5)
    quot, rem = divmod(1 << extra, man)
    if rem:
        quot, extra = (quot << 1) + 1, extra + 1
    return _mpf(quot, -exp - extra, prec, nearest=False)


def _evalf(c: Count, value_of: Callable[[str], int]) -> float:
    powers = Counter(c.num)
    plain = sorted(s for s, k in powers.items() if k == 1)
    # sympy orders a Mul's args: the number, the symbols, then the powers by base name
    # (STAGE's squares are of capitalised names, its reciprocals of dp, sp, tp)
    raised = sorted([(s, k) for s, k in powers.items() if k > 1] + [(s, -1) for s in c.den])
    if any(k not in (2, -1) for _, k in raised) or len(set(c.den)) != len(c.den):
        raise AssertionError(f"STAGE writes no count of the form {c}")
    n_args = (c.amp is not None) + len(plain) + len(raised)
    wp = _PREC + n_args + 5
    factors = [] if c.amp is None else [_mpf(c.amp, 0, wp, nearest=False)]
    factors += [_mpf(value_of(s), 0, wp, nearest=False) for s in plain]
    for s, k in raised:
        factors.append(_mpf(value_of(s) ** 2, 0, wp, nearest=False) if k == 2
                       else _reciprocal(value_of(s), wp))
    man, exp, bc = 1, 0, 1
    for m, e, b in factors:
        man, exp, bc = man * m, exp + e, bc + b
        while bc > 3 * wp:
            man, exp, bc = man >> wp, exp + wp, bc - wp
    man, exp, _ = _mpf(man, exp, _PREC, nearest=True)
    man, exp, _ = _mpf(man, exp, 53, nearest=True)
    return math.ldexp(man, exp)
