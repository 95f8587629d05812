"""The local-memory tracker's peak for a long repeated trace, over arrays instead of per node.

The rules are :func:`peak_memory_direct`'s (a tensor is live from its
writer's start to the latest end of its readers; read but never written means live from 0;
sizes from the writer, else from the first reader in (end, index) order): here the tensors, their
writer and their readers are laid out once per trace shape (:class:`MemoryPlan`), and the
per-schedule work is a few array operations. Where those rules could depend on details the
arrays leave out, :func:`peak_memory` returns ``None`` and the caller walks the trace instead:
a size of 0 (skipped by the tracker), a reader of an unwritten tensor disagreeing on its size, a
reader not after the writer (the tracker's "written twice" error), or ticks or sizes too large
for int64 arithmetic. A tensor written twice is caught when the plan is made (``plan`` is ``None``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["MemoryPlan", "memory_plan", "peak_memory", "peak_memory_direct"]


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Tensors of a trace (dense ids), each one's writer and its readers grouped by tensor."""

    write_node: np.ndarray
    """Per written tensor, its writer and the output-size slot of its size."""
    write_slot: np.ndarray
    read_node: np.ndarray
    """Reader entries grouped by tensor (``group_start`` = first entry of each group)."""
    read_slot: np.ndarray
    group_start: np.ndarray
    group_writer: np.ndarray
    """Per group, the tensor's writer node, or -1."""
    group_write_slot: np.ndarray


def memory_plan(out_key: np.ndarray, out_node: np.ndarray, out_slot: np.ndarray,
                in_key: np.ndarray, in_node: np.ndarray, in_slot: np.ndarray
                ) -> MemoryPlan | None:
    """The plan of a trace's output and input entries (tensor key, node, size slot each), or
    ``None`` if a tensor is written twice. Keys are ints spanning a small range."""
    keys = np.concatenate([out_key, in_key]).astype(np.int64)
    low = int(keys.min()) if len(keys) else 0
    span = int(keys.max()) - low + 1 if len(keys) else 0
    t_out, t_in = out_key - low, in_key - low  # tensor ids: the keys moved to start at 0
    if len(t_out) and np.bincount(t_out, minlength=span).max() > 1:
        return None
    writer = np.full(span, -1, dtype=np.int64)
    slot = np.zeros(span, dtype=np.int64)
    writer[t_out] = out_node
    slot[t_out] = out_slot
    order = np.argsort(t_in, kind="stable")
    t_read = t_in[order]
    first = np.flatnonzero(np.r_[True, t_read[1:] != t_read[:-1]]) if len(t_read) else t_read
    group_tensor = t_read[first]
    return MemoryPlan(
        write_node=np.asarray(out_node, dtype=np.int64),
        write_slot=np.asarray(out_slot, dtype=np.int64),
        read_node=np.asarray(in_node, dtype=np.int64)[order],
        read_slot=np.asarray(in_slot, dtype=np.int64)[order], group_start=first,
        group_writer=writer[group_tensor], group_write_slot=slot[group_tensor])


def peak_memory(plan: MemoryPlan, start: np.ndarray, end: np.ndarray, in_sizes: np.ndarray,
                out_sizes: np.ndarray) -> int | None:
    """The tracker's peak for node ticks ``start``/``end`` and the trace's input/output entry
    sizes, or ``None`` where the arrays cannot decide it (module docstring)."""
    n = len(end)
    if (len(in_sizes) and in_sizes.min() <= 0) or (len(out_sizes) and out_sizes.min() <= 0):
        return None
    if n and int(end.max()) >= (1 << 62) // n:
        return None
    largest = max(int(in_sizes.max()) if len(in_sizes) else 0,
                  int(out_sizes.max()) if len(out_sizes) else 0)
    if largest * 2 * (len(plan.write_node) + len(plan.group_start)) >= 1 << 62:
        return None  # the running total could leave int64
    deltas_t = [start[plan.write_node]]
    deltas_v = [out_sizes[plan.write_slot]]
    if len(plan.read_node):
        g = plan.group_start
        read_end = end[plan.read_node]
        last = np.maximum.reduceat(read_end, g)
        first = np.minimum.reduceat(read_end * n + plan.read_node, g)
        has_writer = plan.group_writer >= 0
        w = plan.group_writer[has_writer]
        if not (first[has_writer] > end[w] * n + w).all():
            return None
        sizes = in_sizes[plan.read_slot]
        low = np.minimum.reduceat(sizes, g)
        if not (low == np.maximum.reduceat(sizes, g))[~has_writer].all():
            return None
        size = np.where(has_writer, out_sizes[plan.group_write_slot], low)
        unwritten = size[~has_writer]
        deltas_t += [np.zeros(len(unwritten), dtype=np.int64), last]
        deltas_v += [unwritten, -size]
    ticks = np.concatenate(deltas_t)
    values = np.concatenate(deltas_v)
    # the order within a tick does not matter: only the totals after whole ticks are read
    order = np.argsort(ticks)
    ticks, live = ticks[order], np.cumsum(values[order])
    settled = np.r_[ticks[1:] != ticks[:-1], True]  # after every delta of a tick is applied
    return max(0, int(live[settled].max())) if len(live) else 0


def peak_memory_direct(inputs: Sequence[tuple[tuple[object, int], ...]],
                        outputs: Sequence[tuple[tuple[object, int], ...]],
                        start: list[int], end: list[int]) -> int:
    """The tracker's peak (``LocalMemUsageTracker.cc``) without walking the nodes in end order: a tensor's write tick is
    its writer's start and its last read the latest end of its readers. The walk fails when a
    reader comes before the tensor's writer in (end, index) order; so does this."""
    write: dict[object, int] = {}  # tensor -> writer index
    last_read: dict[object, int] = {}
    first_read: dict[object, int] = {}  # tensor -> its first reader in (end, index) order
    for i, ins in enumerate(inputs):
        e = end[i]
        for name, size in ins:
            if size:
                last = last_read.get(name)
                if last is None:
                    last_read[name] = e
                    first_read[name] = i
                elif e > last:
                    last_read[name] = e
                elif e < end[first_read[name]]:  # an equal end comes later in index order
                    first_read[name] = i
        for name, size in outputs[i]:
            if size:
                if name in write:
                    raise AssertionError(f"tensor {name} written twice")
                write[name] = i
    delta: dict[int, int] = {}
    for name, i in write.items():
        size = _size_in(outputs[i], name)
        r = first_read.get(name)
        if r is not None and (end[r], r) <= (end[i], i):  # (a node reading its own output too)
            raise AssertionError(f"tensor {name} written twice")
        tick = start[i]
        delta[tick] = delta.get(tick, 0) + size
    for name, r in first_read.items():
        w = write.get(name)
        size = _size_in(inputs[r], name) if w is None else _size_in(outputs[w], name)
        if w is None:
            delta[0] = delta.get(0, 0) + size
        tick = last_read[name]
        delta[tick] = delta.get(tick, 0) - size
    peak = live = 0
    for tick in sorted(delta):
        live += delta[tick]
        peak = max(peak, live)
    return peak


def _size_in(side: tuple[tuple[object, int], ...], name: object) -> int:
    """The (first nonzero) size ``side`` gives tensor ``name``."""
    return next(size for n, size in side if n == name and size)
