"""The short model's block pattern (:mod:`._fast`): its nodes cut into segments (the first
embeddings, the blocks, the last embeddings, the weight updates), each node's block and tensors,
and the check that its blocks 1 and 2 are the same pattern, which a longer model repeats.
Also the lazy views of a long trace's dependencies and tensors (:class:`Rows`, :class:`Sides`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from simcore.stage._graph import Node, NodeKind, RankGraph

K = 4
"""Blocks of the short model: block 0, two middle blocks to compare, the last block."""

_STACK = re.compile(r"stack_(\d+)_")

# segments, in trace order
_E1, _B, _E2, _W = range(4)
_COMP = int(NodeKind.COMP)


def _block_of(name: str) -> int:
    m = _STACK.match(name)
    return -1 if m is None else int(m.group(1))


_TENSORS: dict[str, tuple[int, str]] = {}


def _tensor(name: str) -> tuple[int, str]:
    """A tensor name as (block or -1, name without the block prefix)."""
    found = _TENSORS.get(name)
    if found is None:
        m = _STACK.match(name)
        found = (-1, name) if m is None else (int(m.group(1)), name[m.end():])
        if len(_TENSORS) < 1 << 16:  # the short models' names: a few hundred per layout
            _TENSORS[name] = found
    return found


class _Lists:
    """CSR arrays kept as numpy (compact), as lists once something reads them (only tests and
    the plain fallbacks do: the replay uses the dependants and :mod:`._memory`)."""

    __slots__ = ("_arrays", "_lists")

    def __init__(self, *arrays: np.ndarray) -> None:
        self._arrays: tuple[np.ndarray, ...] | None = arrays
        self._lists: tuple[list[int], ...] = ()

    def lists(self) -> tuple[list[int], ...]:
        if self._arrays is not None:
            self._lists = tuple(a.tolist() for a in self._arrays)
            self._arrays = None
        return self._lists


class _Rows(Sequence[list[int]]):
    """Each node's dependencies in a long trace: (values, pointers) sliced on demand."""

    __slots__ = ("_csr",)

    def __init__(self, csr: _Lists) -> None:
        self._csr = csr

    def __len__(self) -> int:
        return len(self._csr.lists()[1]) - 1

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        values, ptr = self._csr.lists()
        if i < 0:
            i += len(ptr) - 1
        if not 0 <= i < len(ptr) - 1:
            raise IndexError(i)
        return values[ptr[i]:ptr[i + 1]]

    def __iter__(self) -> Iterator[list[int]]:
        values, ptr = self._csr.lists()
        return (values[p:q] for p, q in pairwise(ptr))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]


class _Sides(Sequence[tuple[tuple[int, int], ...]]):
    """The inputs (or outputs) of every node of a long trace, made on demand from the plan's
    (tensor keys, size slots, pointers) and a strategy's sizes."""

    __slots__ = ("_entries", "_sizes")

    def __init__(self, entries: _Lists, sizes: list[int]) -> None:
        self._entries, self._sizes = entries, sizes

    def __len__(self) -> int:
        return len(self._entries.lists()[2]) - 1

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        keys, slots, ptr = self._entries.lists()
        if i < 0:
            i += len(ptr) - 1
        if not 0 <= i < len(ptr) - 1:
            raise IndexError(i)
        p, q = ptr[i], ptr[i + 1]
        sizes = self._sizes
        return tuple([(k, sizes[s]) for k, s in zip(keys[p:q], slots[p:q])])

    def __iter__(self) -> Iterator[tuple[tuple[int, int], ...]]:
        return (self[i] for i in range(len(self)))


@dataclass(frozen=True, slots=True)
class _Short:
    """The short trace's structure as arrays: per node its segment, block and position in the
    segment; dependencies and tensor entries as CSR (pointer, values) lists."""

    seg: np.ndarray
    block: np.ndarray
    local: np.ndarray
    dep_ptr: np.ndarray
    dep: np.ndarray
    in_ptr: np.ndarray
    in_block: np.ndarray
    in_rest: np.ndarray
    out_ptr: np.ndarray
    out_block: np.ndarray
    out_rest: np.ndarray
    rests: int


@dataclass(frozen=True, slots=True)
class _Pattern:
    """The short model's structure: its nodes and kinds, where its segments start and how long
    they are (by (segment, block)), and the same as arrays (:class:`_Short`)."""

    nodes: Sequence[Node]
    kind: list[int]
    starts: dict[tuple[int, int], int]
    lens: dict[tuple[int, int], int]
    short: _Short


def _build_pattern(graph: RankGraph) -> _Pattern | None:
    nodes = graph.nodes
    index = {node.id: i for i, node in enumerate(nodes)}
    kind = [int(node.kind) for node in nodes]
    deps = [[index[d] for d in node.deps] for node in nodes]

    # segment of every node: (segment, block); they must come in trace order
    seg: list[tuple[int, int]] = []
    for node in nodes:
        j = _block_of(node.name)
        update = node.name.endswith("@1")
        if j < 0:
            seg.append((_E2 if update else _E1, -1))
        else:
            seg.append((_W if update else _B, j))
    if seg != sorted(seg):
        return None
    starts: dict[tuple[int, int], int] = {}
    lens: dict[tuple[int, int], int] = {}
    for i, key in enumerate(seg):
        starts.setdefault(key, i)
        lens[key] = lens.get(key, 0) + 1
    wanted = {(_E1, -1), (_E2, -1), *((s, j) for s in (_B, _W) for j in range(K))}
    if not set(lens) <= wanted or any((s, j) not in lens for s in (_B, _W) for j in (1, 2)):
        return None
    if not _blocks_repeat(nodes, kind, deps, seg, starts, lens):
        return None
    if not _ends_stay_at_ends(nodes, deps, seg, starts, lens):
        return None
    return _Pattern(nodes, kind, starts, lens, _short_arrays(nodes, deps, seg, starts))


def _blocks_repeat(nodes: Sequence[Node], kind: list[int], deps: list[list[int]],
                   seg: list[tuple[int, int]], starts: dict, lens: dict) -> bool:
    """Blocks 1 and 2 are the same pattern: kinds, links, collectives and dependencies and
    tensors at the same offsets relative to the block (numbers are checked per strategy)."""

    def relative(i: int, j: int) -> tuple:
        node = nodes[i]
        rel = []
        for d in deps[i]:
            s, b = seg[d]
            rel.append((s, b - j if b >= 0 else None, d - starts[seg[d]]))
        ios = tuple(
            tuple((b - j if b >= 0 else None, rest)
                  for b, rest in (_tensor(name) for name, _ in side))
            for side in (node.inputs, node.outputs))
        return (kind[i], node.link, node.collective, node.axis, tuple(rel), ios)

    for s in (_B, _W):
        a, b = (s, 1), (s, 2)
        if lens[a] != lens[b] or any(
            relative(starts[a] + k, 1) != relative(starts[b] + k, 2) for k in range(lens[a])
        ):
            return False
    return True


def _ends_stay_at_ends(nodes: Sequence[Node], deps: list[list[int]],
                       seg: list[tuple[int, int]], starts: dict, lens: dict) -> bool:
    """The ends only reach the first and the last block (which is where the model puts them)."""
    for s in (_E1, _E2):
        for i in range(starts.get((s, -1), 0), starts.get((s, -1), 0) + lens.get((s, -1), 0)):
            reached = [seg[d][1] for d in deps[i]]
            reached += [_tensor(name)[0] for side in (nodes[i].inputs, nodes[i].outputs)
                        for name, _ in side]
            if any(j not in (-1, 0, K - 1) for j in reached):
                return False
    return True


def _short_arrays(nodes: Sequence[Node], deps: list[list[int]], seg: list[tuple[int, int]],
                  starts: dict) -> _Short:
    rests: dict[str, int] = {}

    def entries(side_of: Callable[[Node], tuple]) -> tuple[np.ndarray, ...]:
        ptr, blocks, ids = [0], [], []
        for node in nodes:
            for name, _ in side_of(node):
                b, rest = _tensor(name)
                blocks.append(b)
                ids.append(rests.setdefault(rest, len(rests)))
            ptr.append(len(blocks))
        return tuple(np.array(x, dtype=np.int64) for x in (ptr, blocks, ids))

    ins = entries(lambda node: node.inputs)
    outs = entries(lambda node: node.outputs)
    dep_ptr = np.cumsum([0] + [len(d) for d in deps])
    return _Short(
        seg=np.array([s for s, _ in seg]), block=np.array([b for _, b in seg]),
        local=np.array([i - starts[key] for i, key in enumerate(seg)]),
        dep_ptr=dep_ptr, dep=np.array([d for ds in deps for d in ds], dtype=np.int64),
        in_ptr=ins[0], in_block=ins[1], in_rest=ins[2],
        out_ptr=outs[0], out_block=outs[1], out_rest=outs[2], rests=len(rests))
