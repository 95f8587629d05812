"""Unit conversions at the boundary: the only place where GB, GiB, ns and TFLOP/s appear.

ASTRA-sim's conventions (shared reference NOTES.md sections 3.1 and 4, and the analytical
backend's ``bw_GBps_to_Bpns``): a network link's "GB/s" is 2**30 bytes/s, while
``local-mem-bw`` is decimal GB/s (10**9 bytes/s) and ``peak-perf`` decimal TFLOP/s.
"""

from __future__ import annotations

import re

GIB = 2**30
GB = 10**9
NS_PER_S = 1e9

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def astra_link_gbps_to_bytes_per_s(gbps: float) -> float:
    """ASTRA-sim network bandwidth ("GB/s", really GiB/s) -> bytes/s."""
    return gbps * GIB


def bytes_per_s_to_astra_link_gbps(bytes_per_s: float) -> float:
    return bytes_per_s / GIB


def decimal_gbps_to_bytes_per_s(gbps: float) -> float:
    """ASTRA-sim local-mem-bw (decimal GB/s) -> bytes/s."""
    return gbps * GB


def bytes_per_s_to_decimal_gbps(bytes_per_s: float) -> float:
    return bytes_per_s / GB


def ns_to_s(ns: float) -> float:
    return ns / NS_PER_S


def s_to_ns(s: float) -> float:
    """Seconds -> ns, rounded to the picosecond so that 500e-9 s gives back exactly 500.0."""
    return round(s * NS_PER_S, 3)


def parse_size(text: str) -> int:
    """A message size: an integer of bytes or a number with a unit (KiB, MiB, GiB, KB, MB, GB).

    >>> parse_size("1MiB"), parse_size("4096"), parse_size("1.5 KiB")
    (1048576, 4096, 1536)
    """
    match = _SIZE_RE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise ValueError(
            f"size {text!r} is not a byte count; write an integer of bytes or a number with"
            " KiB, MiB, GiB (binary) or KB, MB, GB (decimal), e.g. 1MiB"
        )
    value = float(match.group(1)) * _SIZE_UNITS[unit]
    if value != int(value):
        raise ValueError(f"size {text!r} is not a whole number of bytes")
    if value <= 0:
        raise ValueError(f"size {text!r} must be > 0 bytes")
    return int(value)
