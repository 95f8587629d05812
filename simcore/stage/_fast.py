"""A long model's trace without building it: one short model's trace, its middle block repeated.

With one pipeline stage (``pp == 1``) STAGE's graph is the embeddings, then the blocks in order,
then the weight updates of the embeddings and of the blocks in order (:mod:`._graph`). Each
block's nodes depend only on its own tensors and on its two neighbours (the links between
blocks); the free-collective chain also only ever reaches the previous block. So the trace of
``n`` blocks is the trace of :data:`K` blocks with the middle block's pattern repeated: block 0
and the last block as in the short model, every other block as the short model's block 1.

That is not taken on trust: the short model is used only when its blocks 1 and 2 are the same
pattern (same kinds, durations, sizes, and dependencies and tensors at the same relative
offsets), which is what a longer model repeats. Anything else (other stage counts, short
models, a pattern that does not repeat) returns ``None`` and the caller builds the model.

The layout of the long trace (kinds, dependencies, tensors, where the repeated blocks are) does
not depend on the sizes: the short model comes from one symbolic graph per layout
(:mod:`._symbolic`), so the layout is worked out once per (layout, number of blocks) and cached
(:class:`_Plan`); a strategy only brings its durations and tensor sizes, which are checked to
repeat as well. The replay (:mod:`._periodic`) skips the blocks whose schedule provably repeats.

Extrapolating the *results* instead (replay a few short models, continue each figure linearly
in the number of blocks) is not exact: llama70b shapes at tp=64 with recompute on 64 NPUs have a
peak memory that grows by ~10.5 M elements per block up to ~26 blocks and by ~145 M beyond (the
peak moves to another point of the step), while every time figure stays affine.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from itertools import pairwise

import numpy as np

from simcore.stage._args import StageArgs
from simcore.stage._fast_pattern import (
    _B,
    _COMP,
    _STACK,
    _W,
    K,
    _build_pattern,
    _Lists,
    _Pattern,
    _Rows,
    _Short,
    _Sides,
)
from simcore.stage._graph import Node, RankGraph
from simcore.stage._inventory import Inventory, RooflineTotals, inventory_of, roofline_totals
from simcore.stage._memory import MemoryPlan, memory_plan
from simcore.stage._periodic import Geometry
from simcore.stage._replay import FlatRank, Repeated
from simcore.stage._symbolic import Rank0, layout_key, rank0, rank0_graph

__all__ = ["K", "add_scaled", "repeated_inventory", "repeated_rank"]

_PLANS: OrderedDict[tuple, _Plan | None] = OrderedDict()
_MAX_PLANS = 32  # ~2 MB each; a study of one model uses about 14
_PATTERNS: dict[tuple, _Pattern | None] = {}  # one per layout: a few dozen at most


def repeated_inventory(args: StageArgs) -> Inventory | None:
    """Rank 0's inventory of ``args`` from its short model, as :func:`repeated_rank` scales
    it (the middle blocks' nodes are the same whatever their times), or ``None`` where that
    path does not apply."""
    n = args.num_stacks
    if args.pp != 1 or n <= K:
        return None
    short = replace(args, num_stacks=K)
    rank = rank0(short)
    if rank is None or not rank.names:
        return None
    plan = _plan(short, rank, n)
    if plan is None:
        return None
    return _scaled_inventory(rank, plan, n)


def _scaled_inventory(rank: Rank0, plan: _Plan, n: int) -> Inventory:
    """The inventory of ``n`` blocks: the short model's plus n - K middle blocks."""
    return add_scaled(inventory_of(rank.inventory_rows()),
                      inventory_of(rank.inventory_rows(plan.middle)), n - K)


def repeated_rank(
    args: StageArgs,
    comp_ns: Callable[[Node], int],
    coll_ns: Callable[[RankGraph, Node], int],
    p2p_ns: Callable[[int, int, int], int],
    roofline: tuple[float, float],
) -> tuple[FlatRank, Inventory, RooflineTotals] | None:
    """Rank 0 of ``args`` flattened, its inventory and its roofline totals at ``roofline``
    (peak ops/s, local memory bytes/s); or ``None``."""
    n = args.num_stacks
    if args.pp != 1 or n <= K:
        return None
    short = replace(args, num_stacks=K)
    rank = rank0(short)
    if rank is None:  # a number from 2^53 on: the builder computes it (or raises)
        rank0_graph(short)
        return None
    if not rank.names:
        return None
    plan = _plan(short, rank, n)
    if plan is None:
        return None
    dur = rank.durations(comp_ns, coll_ns)
    in_sizes, out_sizes = rank.entry_sizes()
    if not plan.numbers_repeat(dur, in_sizes, out_sizes):
        return None
    inv = _scaled_inventory(rank, plan, n)
    totals = add_scaled(roofline_totals(rank.inventory_rows(), *roofline),
                        roofline_totals(rank.inventory_rows(plan.middle), *roofline), n - K)
    flat = plan.long_rank(rank.names, dur, in_sizes, out_sizes)
    return flat, inv, totals  # type: ignore[return-value]


def _plan(short: StageArgs, rank: Rank0, n: int) -> _Plan | None:
    """The cached layout of ``n`` blocks for ``short``'s layout (module docstring)."""
    key = (layout_key(short), n)
    if key in _PLANS:
        _PLANS.move_to_end(key)
        plan = _PLANS[key]
    else:
        pattern = _pattern(short, rank)
        plan = _PLANS[key] = None if pattern is None else _layout(pattern, n)
        if len(_PLANS) > _MAX_PLANS:
            _PLANS.popitem(last=False)
    if plan is not None and plan.short_names != rank.names:
        raise AssertionError("one layout gave two short graphs")  # rank0's contract
    return plan


def _pattern(short: StageArgs, rank: Rank0) -> _Pattern | None:
    """The short model's verified block pattern for ``short``'s layout (any number of blocks
    uses it), or ``None`` if it does not repeat."""
    key = layout_key(short)
    if key not in _PATTERNS:
        _PATTERNS[key] = _build_pattern(rank.graph())
    return _PATTERNS[key]


@dataclass(frozen=True, slots=True)
class _Plan:
    """The size-independent layout of one long trace (module docstring)."""

    short_names: tuple[str, ...]
    runs: tuple[tuple[int, int, int], ...]
    """(first short node, short nodes, copies) in long-trace order."""
    repeats: tuple[tuple[int, int, int], ...]
    """(first of block 1, first of block 2, length) of nodes, input slots and output slots
    whose numbers must repeat."""
    kind: list[int]
    link: list[int]
    deps: _Rows
    in_entries: _Lists
    """Tensor keys, size slots and per-node pointers of the inputs (likewise outputs)."""
    out_entries: _Lists
    origin: list[tuple[int, int, int]]
    """Per long segment: (its first index, the short segment's first index, its block)."""
    firsts: list[int]
    """The first indices of ``origin``, for bisection."""
    middle: list[int]
    geometry: Geometry
    children: list[list[int]]
    pending: list[int]
    memory: MemoryPlan | None

    def numbers_repeat(self, dur: list[int], in_sizes: list[int], out_sizes: list[int]) -> bool:
        """Whether a strategy's durations and sizes repeat from block 1 to block 2."""
        return all(values[a:a + n] == values[b:b + n]
                   for values, (a, b, n) in zip((dur, dur, in_sizes, in_sizes, out_sizes,
                                                 out_sizes), self.repeats))

    def long_rank(self, names: tuple[str, ...], short: list[int], in_sizes: list[int],
                  out_sizes: list[int]) -> FlatRank:
        """Rank 0's long trace from the short trace's node names and durations and one
        strategy's entry sizes."""
        dur: list[int] = []
        for start, count, copies in self.runs:
            dur += short[start:start + count] * copies
        origin, firsts = self.origin, self.firsts

        def name_of(i: int) -> str:
            first, start, b = origin[bisect.bisect_right(firsts, i) - 1]
            name = names[start + i - first]
            return name if b < 0 else _STACK.sub(f"stack_{b}_", name, count=1)

        return FlatRank(
            rank=0, kind=self.kind, dur=dur, link=self.link, deps=self.deps,
            inputs=_Sides(self.in_entries, in_sizes), outputs=_Sides(self.out_entries, out_sizes),
            names=name_of,
            repeat=Repeated(self.geometry, self.children, self.pending, self.memory, in_sizes,
                            out_sizes))


_Run = tuple[int, int, np.ndarray]
"""Long segments copied from one short segment: (segment, its short block, the long blocks)."""


def _layout(pattern: _Pattern, n: int) -> _Plan:
    """The long model: E1 | B0 | B1 x (n - 2) | B_last | E2 | W0 | W1 x (n - 2) | W_last, every
    reference of a copied node moved with it (an end's references to short blocks K-2, K-1 move
    to the model's last two)."""
    starts, lens, short = pattern.starts, pattern.lens, pattern.short
    runs, seg_start, total = _segments(lens, n)
    arrays, origin = _copies(pattern, runs, seg_start, n)
    counts = arrays["dep_count"]
    assert len(counts) == total
    return _Plan(
        short_names=tuple(node.name for node in pattern.nodes),
        runs=tuple((starts[(s, bs)], lens[(s, bs)], len(blocks)) for s, bs, blocks in runs),
        repeats=_repeats(short, starts, lens),
        kind=_copied(pattern.kind, runs, starts, lens),
        link=_copied([node.link for node in pattern.nodes], runs, starts, lens),
        deps=_Rows(_Lists(arrays["dep"], np.concatenate([[0], np.cumsum(counts)]))),
        in_entries=_entries(arrays["in_key"], arrays["in_node"], arrays["in_slot"], total),
        out_entries=_entries(arrays["out_key"], arrays["out_node"], arrays["out_slot"], total),
        origin=origin,
        firsts=[o[0] for o in origin],
        middle=[i for s in (_B, _W) for i in range(starts[(s, 1)], starts[(s, 1)] + lens[(s, 1)])],
        geometry=_geometry(pattern.kind, starts, lens, n, total, seg_start, arrays["dep"],
                           arrays["dep_owner"]),
        children=_children(arrays["dep"], arrays["dep_owner"], total),
        pending=counts.tolist(),
        memory=memory_plan(arrays["out_key"], arrays["out_node"], arrays["out_slot"],
                           arrays["in_key"], arrays["in_node"], arrays["in_slot"]),
    )


def _segments(lens: dict, n: int) -> tuple[list[_Run], np.ndarray, int]:
    """The runs of the long model, where each (segment, block) starts (``[segment, block + 1]``,
    the ends at column 0) and the number of nodes."""

    def source(b: int) -> int:
        return 0 if b == 0 else K - 1 if b == n - 1 else 1

    runs: list[_Run] = []
    for s in range(4):
        if s in (_B, _W):
            for bs, blocks in ((0, [0]), (1, list(range(1, n - 1))), (K - 1, [n - 1])):
                if (s, bs) in lens:
                    runs.append((s, bs, np.array(blocks)))
        elif (s, -1) in lens:
            runs.append((s, -1, np.array([-1])))
    seg_start = np.zeros((4, n + 1), dtype=np.int64)
    pos = 0
    for s in range(4):
        for b in (range(n) if s in (_B, _W) else (-1,)):
            seg_start[s, b + 1] = pos
            pos += lens.get((s, source(b) if b >= 0 else -1), 0)
    return runs, seg_start, pos


def _copies(pattern: _Pattern, runs: list[_Run], seg_start: np.ndarray, n: int
            ) -> tuple[dict[str, np.ndarray], list[tuple[int, int, int]]]:
    """Every dependency and tensor entry of the long model, in node order: dependency targets,
    their owners and each node's count; tensor keys (block ``b``'s tensor ``r`` is ``b * R +
    r``, an end's ``-1 - r``), owners and size slots; and where each copied segment starts."""
    short, starts, lens = pattern.short, pattern.starts, pattern.lens

    def moved(bs: int, blocks: np.ndarray, ref: np.ndarray) -> np.ndarray:
        """Short block ``ref`` (per entry) as seen from long ``blocks`` copied from ``bs``."""
        if bs >= 0:
            out = blocks[:, None] + (ref - bs)[None, :]
        else:
            out = np.where(ref < K // 2, ref, n - K + ref)[None, :]
        return np.where(ref[None, :] < 0, -1, out)

    parts: dict[str, list[np.ndarray]] = {}

    def add(name: str, values: np.ndarray) -> None:
        parts.setdefault(name, []).append(values.ravel())

    origin: list[tuple[int, int, int]] = []
    for s, bs, blocks in runs:
        a, length = starts[(s, bs)], lens[(s, bs)]
        first = seg_start[s, blocks + 1]  # long start of each copy
        origin += [(f, a, b) for f, b in zip(first.tolist(), blocks.tolist())]
        per_node = np.diff(short.dep_ptr[a:a + length + 1])
        d = short.dep[short.dep_ptr[a]:short.dep_ptr[a + length]]
        target = seg_start[short.seg[d][None, :], moved(bs, blocks, short.block[d]) + 1]
        add("dep", target + short.local[d][None, :])
        add("dep_owner", first[:, None] + np.repeat(np.arange(length), per_node)[None, :])
        add("dep_count", np.tile(per_node, len(blocks)))
        for side, ptr, tb, rest in (("in", short.in_ptr, short.in_block, short.in_rest),
                                    ("out", short.out_ptr, short.out_block, short.out_rest)):
            p, q = ptr[a], ptr[a + length]
            t = moved(bs, blocks, tb[p:q])
            add(f"{side}_key", np.where(t < 0, -1 - rest[p:q], t * short.rests + rest[p:q]))
            owner = np.repeat(np.arange(length), np.diff(ptr[a:a + length + 1]))
            add(f"{side}_node", first[:, None] + owner[None, :])
            add(f"{side}_slot", np.tile(np.arange(p, q), len(blocks)))
    return {k: np.concatenate(v) for k, v in parts.items()}, origin


def _copied(values: list[int], runs: list[_Run], starts: dict, lens: dict) -> list[int]:
    """A per-node list of the short model copied out to the long model."""
    out: list[int] = []
    for s, bs, blocks in runs:
        a = starts[(s, bs)]
        out += values[a:a + lens[(s, bs)]] * len(blocks)
    return out


def _rows(values: np.ndarray, counts: np.ndarray) -> list[list[int]]:
    """CSR values with per-row counts as a list of lists."""
    flat = values.tolist()
    ptr = np.concatenate([[0], np.cumsum(counts)]).tolist()
    return [flat[p:q] for p, q in pairwise(ptr)]


def _children(dep: np.ndarray, owner: np.ndarray, total: int) -> list[list[int]]:
    """Per node, the nodes depending on it (order is irrelevant: the ready queues are heaps)."""
    order = np.argsort(dep, kind="stable")
    return _rows(owner[order], np.bincount(dep, minlength=total))


def _entries(key: np.ndarray, node: np.ndarray, slot: np.ndarray, total: int) -> _Lists:
    ptr = np.concatenate([[0], np.cumsum(np.bincount(node, minlength=total))])
    return _Lists(key, slot, ptr)


def _repeats(short: _Short, starts: dict, lens: dict) -> tuple[tuple[int, int, int], ...]:
    """Nodes, then input slots, then output slots of blocks 1 and 2 (B then W each)."""
    out = []
    for ptr in (None, short.in_ptr, short.out_ptr):
        for s in (_B, _W):
            a, b, length = starts[(s, 1)], starts[(s, 2)], lens[(s, 1)]
            if ptr is None:
                out.append((a, b, length))
            else:
                out.append((int(ptr[a]), int(ptr[b]), int(ptr[a + length] - ptr[a])))
    return tuple(out)


def _geometry(kind: list[int], starts: dict, lens: dict, n: int, total: int,
              seg_start: np.ndarray, dep: np.ndarray, dep_owner: np.ndarray) -> Geometry:
    """Where the middle blocks 1 .. n-2 are, and the checkpoints: the first and the last
    compute node of the block pattern and of the weight-update pattern.

    The replay's proof needs every dependant of a node of blocks 2 .. n-3 to be a middle-block
    node (whose dependencies are the pattern's, so that the dependants repeat too); the middle
    blocks are laid out so, and if an end depended on such a node there are no checkpoints
    (and the replay never skips)."""
    block = np.full(total, -1, dtype=np.int64)
    step = np.zeros(total, dtype=np.int64)
    marker = np.full(total, -1, dtype=np.int64)
    for s in (_B, _W):
        first, length = int(seg_start[s, 2]), lens[(s, 1)]
        stop = first + (n - 2) * length
        block[first:stop] = np.repeat(np.arange(1, n - 1), length)
        step[first:stop] = length
    reached = block[dep]
    ends_reach_in = ((block[dep_owner] < 0) & (reached >= 2) & (reached <= n - 3)).any()
    key = 0
    for s in (_B, _W) if not ends_reach_in else ():
        first, length = int(seg_start[s, 2]), lens[(s, 1)]
        stop = first + (n - 2) * length
        comps = [k for k in range(length) if kind[starts[(s, 1)] + k] == _COMP]
        for k in dict.fromkeys(comps[:1] + comps[-1:]):
            marker[first + k:stop:length] = key
            key += 1
    return Geometry(n=n, b1=int(seg_start[_B, 2]), lb=lens[(_B, 1)], w1=int(seg_start[_W, 2]),
                    lw=lens[(_W, 1)], block=block.tolist(), step=step.tolist(),
                    marker=marker.tolist())


def add_scaled(a: object, b: object, times: int) -> object:
    """Field-wise ``a + times * b`` of two dataclass values of one type."""
    return type(a)(**{f.name: getattr(a, f.name) + times * getattr(b, f.name)
                      for f in fields(a)})  # type: ignore[arg-type]
