"""Reading and writing Chakra execution-trace files (``NAME.<npu>.et``).

A file is a stream of length-delimited protobuf messages, as Chakra's ``protolib``
(``encodeMessage`` / ``decodeMessage``) and ASTRA-sim's feeder read it: a varint byte count, then
the message; first one ``GlobalMetadata``, then one ``Node`` per trace node. The varint framing
is protobuf's own (``google.protobuf.internal``: the Python runtime has no public delimited I/O).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from google.protobuf.internal.decoder import _DecodeVarint32  # type: ignore[attr-defined]
from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]
from google.protobuf.message import DecodeError

from planner.chakra.schema import message_class
from planner.errors import PlannerUsageError
from planner.inputs import read_bytes

__all__ = ["SCHEMA_VERSION", "Trace", "TraceProgress", "attr_value", "encode_traces",
           "read_trace", "trace_bytes", "trace_files", "write_trace"]

SCHEMA_VERSION = "0.0.4"


@dataclass(frozen=True)
class Trace:
    """One NPU's trace: its global metadata and its nodes, in file order."""

    metadata: Any
    nodes: list[Any]


def trace_bytes(nodes: Iterable[Any], attrs: dict[str, str] | None = None) -> bytes:
    """A trace file's bytes: the metadata (schema version 0.0.4 and ``attrs`` as string
    attributes) then ``nodes``, each length-delimited."""
    meta = message_class("GlobalMetadata")(version=SCHEMA_VERSION)
    attr = message_class("AttributeProto")
    for name, value in (attrs or {}).items():
        meta.attr.append(attr(name=name, string_val=value))
    parts = []
    for message in (meta, *nodes):
        data = message.SerializeToString()
        parts += [_VarintBytes(len(data)), data]
    return b"".join(parts)


class TraceProgress(Protocol):
    """Who hears how the per-NPU traces of an export are coming along (a big plan's take a
    minute: 1,024 NPUs, 5.6 million nodes, 551 MB)."""

    def start(self, files: int, approx_bytes: int) -> None:
        """Before the second file: how many files, and their rough total size."""

    def advance(self) -> None:
        """One more file encoded."""


def encode_traces(traces: Sequence[tuple[str, Callable[[], bytes]]],
                  progress: TraceProgress | None = None) -> dict[str, bytes]:
    """``{file name: bytes}`` of each ``(file name, encode)``, in order. ``progress`` hears the
    count and the first file's size times the count (NPUs' traces differ little) once the
    first is encoded, then one step per file."""
    files: dict[str, bytes] = {}
    for name, encode in traces:
        files[name] = encode()
        if progress is None:
            continue
        if len(files) == 1:
            progress.start(len(traces), len(files[name]) * len(traces))
        progress.advance()
    return files


def write_trace(path: Path, nodes: Iterable[Any], attrs: dict[str, str] | None = None) -> None:
    """Write :func:`trace_bytes` to ``path``."""
    path.write_bytes(trace_bytes(nodes, attrs))


MAX_TRACE_BYTES = 1 << 30
"""1 GiB per NPU's trace: the exports refuse graphs above 10 million nodes (about 1 KB each
at most), and Llama-3-70B on 128 H100s writes 1.1 MB per NPU."""


def read_trace(path: Path) -> Trace:
    """Read one trace file; a file that is not a Chakra trace is one :class:`PlannerUsageError`
    line naming it."""
    data = read_bytes(path, "Chakra trace", limit=MAX_TRACE_BYTES)
    messages = []
    pos = 0
    try:
        while pos < len(data):
            size, pos = _DecodeVarint32(data, pos)
            if pos + size > len(data):
                raise DecodeError(f"a message of {size} bytes runs past the end of the file")
            cls = message_class("GlobalMetadata" if not messages else "Node")
            message = cls()
            message.ParseFromString(data[pos:pos + size])
            messages.append(message)
            pos += size
    except (DecodeError, IndexError) as e:
        raise PlannerUsageError(
            f"{path}: not a Chakra execution trace (length-delimited GlobalMetadata then Node"
            f" messages): {e or 'truncated'}") from None
    if not messages:
        raise PlannerUsageError(f"{path}: empty file, not a Chakra execution trace")
    nodes = messages[1:]
    if any(n.type == 0 and not n.name and not n.id for n in nodes):
        raise PlannerUsageError(f"{path}: not a Chakra execution trace (nodes without id, name"
                                " or type)")
    return Trace(messages[0], nodes)


def attr_value(node: Any, name: str, default: Any = None) -> Any:
    """The value of attribute ``name`` whichever of its oneof fields holds it (lists as
    Python lists)."""
    for a in node.attr:
        if a.name == name:
            which = a.WhichOneof("value")
            if which is None:
                return default
            value = getattr(a, which)
            return list(value.values) if which.endswith("_list") else value
    return default


def trace_files(prefix: Path) -> list[Path]:
    """``PREFIX.0.et``, ``PREFIX.1.et``, ... (every NPU, none missing), as ASTRA-sim's
    ``--workload-configuration=PREFIX`` reads them."""
    folder = prefix.parent if str(prefix.parent) else Path(".")
    pattern = re.compile(re.escape(prefix.name) + r"\.(\d+)\.et$")
    found = {}
    if folder.is_dir():
        for p in folder.iterdir():
            m = pattern.match(p.name)
            if m:
                found[int(m.group(1))] = p
    if not found:
        raise PlannerUsageError(f"{prefix}: no trace files {prefix}.0.et, {prefix}.1.et, ...;"
                                " give the prefix ASTRA-sim's --workload-configuration takes")
    missing = sorted(set(range(max(found) + 1)) - set(found))
    if missing:
        raise PlannerUsageError(f"{prefix}: {prefix}.{missing[0]}.et is missing (found"
                                f" {len(found)} files up to NPU {max(found)})")
    return [found[i] for i in range(len(found))]
