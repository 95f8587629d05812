"""Reading user files (YAML, JSON) and checking their fields: one-line errors that name the
file, the field and the fix (raised as PlannerUsageError)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from planner.errors import PlannerUsageError

__all__ = ["fail", "load", "fields", "number", "integer", "choice"]

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader when built in: the catalogs load several times faster."""


def fail(path: Path, field: str, message: str) -> PlannerUsageError:
    return PlannerUsageError(f"{path}: {field}: {message}")


def load(path: Path, kind: str) -> Any:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise PlannerUsageError(f"{path}: no such file; give the path of the {kind}") from None
    except OSError as e:
        raise PlannerUsageError(f"{path}: cannot read the {kind}: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PlannerUsageError(f"{path}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    try:
        if kind == "system JSON":
            return json.loads(text)
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader
    except json.JSONDecodeError as e:
        raise PlannerUsageError(f"{path}: line {e.lineno}: not valid JSON: {e.msg}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or "cannot be parsed"
        raise PlannerUsageError(f"{path}: {where}not valid YAML: {problem}") from None
    except RecursionError:
        raise PlannerUsageError(f"{path}: nested too deeply to read") from None


def fields(path: Path, where: str, entry: Any, required: set[str], optional: set[str]) -> dict:
    """``entry`` as a dict after checking it is a mapping with every required field and no
    unknown one; ``where`` is its place in the file ("" for the top level)."""
    if not isinstance(entry, Mapping):
        raise fail(path, where or "top level",
                   f"must be a mapping of fields, but got {type(entry).__name__}")
    prefix = f"{where}." if where else ""
    keys = set(map(str, entry))
    missing = sorted(required - keys)
    if missing:
        raise fail(path, f"{prefix}{missing[0]}", "missing; add it")
    unknown = sorted(keys - required - optional)
    if unknown:
        allowed = ", ".join(sorted(required | optional))
        raise fail(path, f"{prefix}{unknown[0]}", f"unknown field; allowed: {allowed}")
    return {str(k): v for k, v in entry.items()}


def number(path: Path, field: str, value: Any, *, minimum: float, strict: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise fail(path, field, f"must be a number, but got {value!r}")
    if value < minimum or (strict and value == minimum):
        op = ">" if strict else ">="
        raise fail(path, field, f"must be {op} {minimum:g}, but got {value!r}")
    return float(value)


def integer(path: Path, field: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(path, field, f"must be a whole number, but got {value!r}")
    if value < minimum:
        raise fail(path, field, f"must be >= {minimum}, but got {value!r}")
    return value


def choice(path: Path, field: str, value: Any, enum: type) -> Any:
    try:
        return enum(value)
    except ValueError:
        known = ", ".join(e.value for e in enum)
        raise fail(path, field, f"unknown value {value!r}; use one of {known}") from None


