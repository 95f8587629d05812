"""Reading user files (YAML, JSON) and checking their fields: one-line errors that name the
file, the field and the fix (raised as PlannerUsageError)."""

from __future__ import annotations

import dataclasses
import difflib
import math
import reprlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from planner.errors import PlannerUsageError
from simcore.specs import Axis, TrainingSpec

__all__ = ["TRAINING_FLAGS", "boolean", "choice", "fail", "fields", "integer", "load", "number",
           "placement_axes", "training_flags"]

def fail(path: Path, field: str, message: str) -> PlannerUsageError:
    return PlannerUsageError(f"{path}: {field}: {message}")


def load(path: Path, kind: str) -> Any:
    """A YAML (or system JSON) input file, read with every bound of :func:`planner.inputs.load`
    (regular files only, a size limit, no duplicate keys, no over-long numbers)."""
    from planner.inputs import load as bounded  # planner.inputs uses this module's checks

    return bounded(path, kind)


MAX_DEPTH = 32
"""Deeper than any file of ours needs; a deeper document is refused before anything reads it."""
MAX_NODES = 200_000
"""More values than any catalog, study or ASTRA-sim file of ours holds, anchors expanded."""


def _check_shape(path: Path, data: Any) -> None:
    """Refuse documents nested deeper than :data:`MAX_DEPTH` or holding themselves (a YAML
    anchor used inside its own value), which later code could not print or walk."""
    stack: list[tuple[Any, int, frozenset[int]]] = [(data, 0, frozenset())]
    visited = 0
    while stack:
        node, depth, inside = stack.pop()
        visited += 1
        if visited > MAX_NODES:  # aliases that expand exponentially ("billion laughs")
            raise PlannerUsageError(f"{path}: holds over {MAX_NODES:,} values once its anchors"
                                    " are expanded; write it out plainly")
        if not isinstance(node, (dict, list)):
            continue
        if id(node) in inside:
            raise PlannerUsageError(f"{path}: a YAML anchor is used inside its own value; write"
                                    " the value out instead")
        if depth >= MAX_DEPTH:
            raise PlannerUsageError(f"{path}: nested more than {MAX_DEPTH} levels deep; no field"
                                    " needs that, check the brackets")
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            stack.append((child, depth + 1, inside | {id(node)}))


def fields(path: Path, where: str, entry: Any, required: set[str], optional: set[str], *,
           kind: str = "file") -> dict:
    """``entry`` as a dict after checking it is a mapping with every required field and no
    unknown one; ``where`` is its place in the file ("" for the top level, the whole ``kind``
    of file: "study file")."""
    if entry is None:  # an empty file (or only comments), or a field with nothing after it
        raise _empty(path, where, required, kind)
    if not isinstance(entry, Mapping):
        raise fail(path, where or "top level",
                   f"must be a mapping of fields, but got {type(entry).__name__}")
    prefix = f"{where}." if where else ""
    keys = set(map(str, entry))
    unknown = sorted(keys - required - optional)
    if unknown:  # before the missing ones: a misspelt field is both
        raise fail(path, f"{prefix}{unknown[0]}",
                   _unknown_field(unknown[0], required | optional, required - keys))
    missing = sorted(required - keys)
    if missing:
        raise fail(path, f"{prefix}{missing[0]}", "missing; add it")
    return {str(k): v for k, v in entry.items()}


def _empty(path: Path, where: str, required: set[str], kind: str) -> PlannerUsageError:
    needs = (f"write its fields ({', '.join(sorted(required))} at least)" if required
             else "write its fields, or {} for none")
    if not where:
        return PlannerUsageError(f"{path}: the {kind} is empty; {needs}")
    return fail(path, where, f"is empty; {needs}")


def _unknown_field(name: str, allowed: set[str], missing: set[str]) -> str:
    """"unknown field", the closest allowed names (a missing one first), then all of them."""
    close = difflib.get_close_matches(name, sorted(missing), n=1)
    close += [c for c in difflib.get_close_matches(name, sorted(allowed), n=3) if c not in close]
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return f"unknown field{hint}; allowed: {', '.join(sorted(allowed))}"


MAX_NUMBER = 1e12
"""No figure in our files' units (TFLOP/s, GB, GB/s, ns, us) comes near this; a larger one is a
typo, and would overflow once converted to bytes/s or FLOP/s."""
MAX_INTEGER = 10**9
"""No count (layers, heads, batch, devices, splits, trials) comes near this; larger ones would
make the simulator loop for hours."""


MIN_POSITIVE = 1e-9
"""The smallest value a field that must be > 0 takes: below it a bandwidth, a peak or an
efficiency divides a size into an infinite time (``OverflowError`` on a bandwidth of 1e-300)."""


def number(path: Path, field: str, value: Any, *, minimum: float, strict: bool,
           maximum: float = MAX_NUMBER) -> float:
    if isinstance(value, str) and _exponent_text(value):
        raise fail(path, field, f"must be a number, but got {value!r}, which YAML reads as text"
                   " (an exponent needs a decimal point and a sign there); write"
                   f" {_yaml_float(value)} or the number in full")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise fail(path, field, f"must be a number, but got {_short(value)}")
    if value < minimum or (strict and value == minimum):
        op = ">" if strict else ">="
        raise fail(path, field, f"must be {op} {minimum:g}, but got {value!r}")
    if strict and minimum == 0 and value < MIN_POSITIVE:  # 1e-300 GB/s: an infinite time
        raise fail(path, field, f"{value!r} is too small to compute with; give at least"
                   f" {MIN_POSITIVE:g} (check the unit)")
    if value > maximum:
        raise fail(path, field, f"must be <= {maximum:g}, but got {value:g}; check the unit")
    return float(value)


def _exponent_text(text: str) -> bool:
    """``1e30``, ``5E-3``, ``1.0e3``: a number with an exponent that YAML 1.1 (PyYAML) reads as
    a string, its float needing both a dot and a signed exponent (``1.0e+3``)."""
    try:
        return math.isfinite(float(text)) and "e" in text.lower()
    except ValueError:
        return False


def _yaml_float(text: str) -> str:
    """``text`` (:func:`_exponent_text`) as PyYAML reads a float: ``1e3`` -> ``1.0e+3``."""
    mantissa, exponent = text.strip().lower().split("e")
    if "." not in mantissa:
        mantissa += ".0"
    if exponent[:1] not in "+-":
        exponent = "+" + exponent
    return f"{mantissa}e{exponent}"


def boolean(path: Path, field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise fail(path, field, f"must be true or false, but got {_short(value)}")
    return value


TRAINING_FLAGS: dict[str, bool | None] = {
    f.name: f.default for f in dataclasses.fields(TrainingSpec)
    if f.type in ("bool", "bool | None")}
""":class:`TrainingSpec`'s true-or-false options and their defaults; None: the device's or the
stack's choice (flash attention, Transformer Engine, ...), which a file may also write as null."""


def training_flags(path: Path, training: Mapping[str, Any],
                   where: str = "training") -> dict[str, bool | None]:
    """Every true-or-false training option of a study's or plan file's ``training``, its
    default where the file leaves it out."""
    flags: dict[str, bool | None] = {}
    for key, default in TRAINING_FLAGS.items():
        value = training.get(key, default)
        if value is None and default is None:
            flags[key] = None
        elif not isinstance(value, bool):
            also = ", or null for the default" if default is None else ""
            raise fail(path, f"{where}.{key}", f"must be true or false{also}, but got"
                       f" {_short(value)}")
        else:
            flags[key] = value
    return flags


def integer(path: Path, field: str, value: Any, *, minimum: int,
            maximum: int = MAX_INTEGER) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(path, field, f"must be a whole number, but got {_short(value)}")
    if value < minimum:
        raise fail(path, field, f"must be >= {minimum}, but got {value!r}")
    if value > maximum:
        raise fail(path, field, f"must be <= {maximum:,}, but got {value:,}")
    return value


def _short(value: Any) -> str:
    """A value for an error message: at most a line, whatever the user wrote."""
    return reprlib.repr(value)


def choice(path: Path, field: str, value: Any, enum: type) -> Any:
    try:
        return enum(value)
    except ValueError:
        known = ", ".join(e.value for e in enum)
        raise fail(path, field, f"unknown value {value!r}; use one of {known}") from None


def placement_axes(names: Iterable[Any]) -> tuple[Axis, ...] | None:
    """The axes ``names`` lists, innermost first, if it names dp, tp, pp and sp once each;
    else None (the caller says what was wrong, in its own terms)."""
    try:
        axes = tuple(Axis(str(a).strip()) for a in names)
    except ValueError:
        return None
    return axes if sorted(axes) == sorted(Axis) else None
