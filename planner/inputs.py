"""Every input file is read here: bounded in size, regular files only, YAML without duplicate
keys or numbers too long for any field.

- Special files (FIFOs, devices such as /dev/zero, sockets, folders) are refused before they
  are read: a FIFO would block forever, a device never ends.
- A file over :data:`MAX_INPUT_BYTES` is refused without reading it.
- A YAML mapping that gives one key twice is refused with the key and its line (PyYAML keeps
  the last one silently).
- A number literal over :data:`MAX_DIGITS` digits is refused with its line (Python refuses to
  parse over 4,300 digits, and over 309 would overflow a float).

Every problem is a :class:`PlannerUsageError` naming the file.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from planner.errors import PlannerUsageError

__all__ = ["MAX_DIGITS", "MAX_INPUT_BYTES", "load", "read_bytes", "read_text"]

MAX_INPUT_BYTES = 64 * 2**20
"""64 MiB: the largest input we read (catalogs, studies, ASTRA-sim files, measured-runs CSVs,
Metis profiles) is under 1 MB; a larger file is a mistake, and reading it whole could exhaust
memory."""
MAX_DIGITS = 32
"""No field takes a number longer than this (the longest, a 64-bit seed, has 20 digits)."""


def read_bytes(path: Path, kind: str, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; one-line errors otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
    except FileNotFoundError:
        raise PlannerUsageError(f"{path}: no such file; give the path of the {kind}") from None
    except OSError as e:
        raise PlannerUsageError(f"{path}: cannot read the {kind}: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # before fdopen, which refuses a folder with its own error
        os.close(fd)
        raise PlannerUsageError(f"{path}: not a regular file ({_file_type(st.st_mode)}); give"
                                f" the path of the {kind}")
    with os.fdopen(fd, "rb") as f:
        if st.st_size > limit:
            raise PlannerUsageError(f"{path}: {st.st_size:,} bytes, over the {_size(limit)} limit"
                                    f" for a {kind}; give the right file")
        try:
            raw = f.read(limit + 1)
        except OSError as e:
            raise PlannerUsageError(f"{path}: cannot read the {kind}: {e.strerror}") from None
    if len(raw) > limit:  # grew while we read it
        raise PlannerUsageError(f"{path}: over the {_size(limit)} limit for a {kind}; give the"
                                " right file")
    return raw


def read_text(path: Path, kind: str, encoding: str = "utf-8") -> str:
    """:func:`read_bytes`, decoded (``utf-8-sig`` drops a byte-order mark)."""
    raw = read_bytes(path, kind)
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as e:
        raise PlannerUsageError(f"{path}: not UTF-8 text (byte {e.start}); save it as UTF-8"
                                ) from None


def _file_type(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
             (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "a special file")


def _size(limit: int) -> str:
    return f"{limit // 2**20} MiB" if limit >= 2**20 else f"{limit:,}-byte"


class _InputError(yaml.YAMLError):
    """A problem of ours found while constructing the document, with its line."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(problem)
        self.line, self.problem = line, problem


def _check_digits(node: yaml.Node, key: str = "") -> None:
    if node.tag == "tag:yaml.org,2002:int" and isinstance(node, yaml.ScalarNode):
        digits = sum(c.isdigit() for c in node.value)
        if digits > MAX_DIGITS:
            where = f"{key}: " if key else ""
            raise _InputError(node.start_mark.line + 1, f"{where}a {digits}-digit number; no"
                              f" field takes over {MAX_DIGITS} digits, check the value")


_BASE_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader when built in: the catalogs load several times faster."""


class _Loader(_BASE_LOADER):  # type: ignore[misc, valid-type]
    """The safe loader, refusing duplicate keys and over-long numbers."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor`: its keys may be overridden, as YAML intends
            _check_digits(key_node)
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base class says so
                break
            if first is not None:
                raise _InputError(line, f"{key}: given twice (first on line {first}); keep one")
            seen[key] = line
            _check_digits(value_node, str(key))
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        _check_digits(node)
        return super().construct_yaml_int(node)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


def _json_int(text: str) -> int:
    digits = sum(c.isdigit() for c in text)
    if digits > MAX_DIGITS:
        raise _InputError(0, f"a {digits}-digit number; no field takes over {MAX_DIGITS}"
                          " digits, check the value")
    return int(text)


def load(path: Path, kind: str) -> Any:
    """A YAML (or, for ``kind == "system JSON"``, JSON) file, read through :func:`read_text`
    and checked for duplicate keys, over-long numbers and its shape (depth, size, cycles)."""
    from planner.fields import _check_shape

    text = read_text(path, kind)
    try:
        if kind == "system JSON":
            data = json.loads(text, parse_int=_json_int)
        else:
            data = yaml.load(text, Loader=_Loader)  # a safe loader
    except json.JSONDecodeError as e:
        raise PlannerUsageError(f"{path}: line {e.lineno}: not valid JSON: {e.msg}") from None
    except _InputError as e:
        where = f"line {e.line}: " if e.line else ""
        raise PlannerUsageError(f"{path}: {where}{e.problem}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or "cannot be parsed"
        raise PlannerUsageError(f"{path}: {where}not valid YAML: {problem}") from None
    except RecursionError:
        raise PlannerUsageError(f"{path}: nested too deeply to read") from None
    _check_shape(path, data)
    return data
