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

The replay itself still runs over every node. Extrapolating the *results* instead (replay a few
short models, continue each figure linearly in the number of blocks) is not exact: llama70b
shapes at tp=64 with recompute on 64 NPUs have a peak memory that grows by ~10.5 M elements per
block up to ~26 blocks and by ~145 M beyond (the peak moves to another point of the step), while
every time figure stays affine. A shortcut of the replay has to prove a periodic schedule state.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import fields, replace

from simcore.stage._args import StageArgs
from simcore.stage._graph import Node, RankGraph, build_model
from simcore.stage._replay import FlatRank, flatten

__all__ = ["K", "repeated_rank"]

K = 4
"""Blocks of the short model: block 0, two middle blocks to compare, the last block."""

_STACK = re.compile(r"stack_(\d+)_")

# segments, in trace order
_E1, _B, _E2, _W = range(4)


def _block_of(name: str) -> int:
    m = _STACK.match(name)
    return -1 if m is None else int(m.group(1))


def repeated_rank(
    args: StageArgs,
    comp_ns: Callable[[Node], int],
    coll_ns: Callable[[RankGraph, Node], int],
    p2p_ns: Callable[[int, int, int], int],
) -> tuple[FlatRank, RankGraph, list[Node], int] | None:
    """Rank 0 of ``args`` flattened, the short model's rank graph, the nodes of one middle block
    (block and weight updates) and how many middle blocks the long model adds; or ``None``."""
    n = args.num_stacks
    if args.pp != 1 or n <= K:
        return None
    graph = build_model(replace(args, num_stacks=K)).ranks[0]
    if len(graph.nodes) == 0:
        return None
    flat = flatten(graph, comp_ns, coll_ns, p2p_ns)
    nodes = graph.nodes

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

    # tensor keys: (block or -1, name without the block prefix)
    def tensor(name: str) -> tuple[int, str]:
        m = _STACK.match(name)
        return (-1, name) if m is None else (int(m.group(1)), name[m.end():])

    def relative(i: int, j: int) -> tuple:
        """Node ``i`` of block ``j`` with every reference relative to block ``j``."""
        deps = []
        for d in flat.deps[i]:
            s, b = seg[d]
            deps.append((s, b - j if b >= 0 else None, d - starts[seg[d]]))
        ios = tuple(
            tuple((b - j if b >= 0 else None, rest, size)
                  for (b, rest), size in ((tensor(name), size) for name, size in side))
            for side in (flat.inputs[i], flat.outputs[i]))
        return (flat.kind[i], flat.dur[i], flat.link[i], tuple(deps), ios)

    for s in (_B, _W):
        a, b = (s, 1), (s, 2)
        if lens[a] != lens[b] or any(
            relative(starts[a] + k, 1) != relative(starts[b] + k, 2) for k in range(lens[a])
        ):
            return None

    # the ends may only reach the first and the last block (which is where the model puts them)
    for s in (_E1, _E2):
        for i in range(starts.get((s, -1), 0), starts.get((s, -1), 0) + lens.get((s, -1), 0)):
            reached = [seg[d][1] for d in flat.deps[i]]
            reached += [tensor(name)[0] for side in (flat.inputs[i], flat.outputs[i])
                        for name, _ in side]
            if any(j not in (-1, 0, K - 1) for j in reached):
                return None

    # the long model: E1 | B0 | B1 x (n - 2) | B_last | E2 | W0 | W1 x (n - 2) | W_last
    def source(b: int) -> int:
        return 0 if b == 0 else K - 1 if b == n - 1 else 1

    def length(s: int, b: int) -> int:
        return lens.get((s, source(b)), 0) if s in (_B, _W) else lens.get((s, -1), 0)

    new_start: dict[tuple[int, int], int] = {}
    pos = 0
    for s in range(4):
        for b in (range(n) if s in (_B, _W) else (-1,)):
            new_start[(s, b)] = pos
            pos += length(s, b)
    total = pos

    def target(j: int, b_src: int, b_new: int) -> int:
        """Block ``j`` as seen from template block ``b_src`` -> its block seen from ``b_new``."""
        if b_src < 0:  # an end: blocks 0, 1 stay, blocks K-2, K-1 are the model's last two
            return j if j < K // 2 else n - K + j
        return b_new + (j - b_src)

    # tensor keys as ints: block b's tensor ``rest`` is b * M + id(rest), an end's -1 - id
    rests: dict[str, int] = {}
    for side in (*flat.inputs, *flat.outputs):
        for name, _ in side:
            rests.setdefault(tensor(name)[1], len(rests))
    m = len(rests)

    def spec(i: int, b_src: int) -> tuple:
        """Node ``i`` of template segment block ``b_src`` as offsets: deps as (base slot,
        local), tensors as (key offset, size); the slots are (segment, block - b_src)."""
        dep = []
        for d in flat.deps[i]:
            ds, db = seg[d]
            dep.append(((ds, None if db < 0 else db - b_src), d - starts[seg[d]]))
        ios = []
        for side in (flat.inputs[i], flat.outputs[i]):
            one = []
            for name, size in side:
                tb, rest = tensor(name)
                r = rests[rest]
                one.append((None, -1 - r, size) if tb < 0 else (tb - b_src, r, size))
            ios.append(one)
        return dep, ios[0], ios[1]

    kind: list[int] = []
    dur: list[int] = []
    link: list[int] = []
    deps: list[list[int]] = []
    inputs: list[tuple] = []
    outputs: list[tuple] = []
    origin: list[tuple[int, int, int]] = []  # (first index, template start, block)
    specs: dict[tuple[int, int], tuple] = {}
    for s in range(4):
        for b in (range(n) if s in (_B, _W) else (-1,)):
            b_src = source(b) if b >= 0 else -1
            start = starts.get((s, b_src))
            if start is None:
                continue
            stop = start + lens[(s, b_src)]
            origin.append((len(kind), start, b))
            kind += flat.kind[start:stop]
            dur += flat.dur[start:stop]
            link += flat.link[start:stop]
            if b < 0:  # an end: references to blocks K-2, K-1 move to the model's last two
                for i in range(start, stop):
                    deps.append([new_start[(seg[d][0], target(seg[d][1], -1, 0)
                                            if seg[d][1] >= 0 else -1)] + d - starts[seg[d]]
                                 for d in flat.deps[i]])
                    for side, into in ((flat.inputs[i], inputs), (flat.outputs[i], outputs)):
                        one = []
                        for name, size in side:
                            tb, rest = tensor(name)
                            r = rests[rest]
                            one.append((-1 - r if tb < 0 else target(tb, -1, 0) * m + r, size))
                        into.append(tuple(one))
                continue
            tmpl = specs.get((s, b_src))
            if tmpl is None:
                tmpl = specs[(s, b_src)] = _segment(
                    [spec(i, b_src) for i in range(start, stop)], m)
            slots, dep_rows, in_rows, out_rows = tmpl
            bases = [new_start[(ds, -1 if r is None else b + r)] for ds, r in slots]
            bm = b * m
            deps += [[bases[si] + loc for si, loc in row] for row in dep_rows]
            inputs += [tuple([(bm * f + c, size) for f, c, size in row]) for row in in_rows]
            outputs += [tuple([(bm * f + c, size) for f, c, size in row]) for row in out_rows]
    assert len(kind) == total

    def name_of(i: int) -> str:
        first, start, b = max(o for o in origin if o[0] <= i)
        name = nodes[start + i - first].name
        return name if b < 0 else _STACK.sub(f"stack_{b}_", name, count=1)

    long_flat = FlatRank(rank=flat.rank, kind=kind, dur=dur, link=link, deps=deps,
                         inputs=inputs, outputs=outputs, names=name_of)
    middle = [nodes[i] for s in (_B, _W)
              for i in range(starts[(s, 1)], starts[(s, 1)] + lens[(s, 1)])]
    return long_flat, graph, middle, n - K


def _segment(rows: list[tuple], m: int) -> tuple:
    """A template segment's rows with every block-relative reference as an offset: the slots
    (segment, relative block) the dependencies index into, and tensor keys as ``b * m * f + c``
    (``f`` = 1 for a block's tensor, 0 for an end's)."""
    slots: list[tuple[int, int | None]] = []
    dep_rows = []
    for dep, _, _ in rows:
        row = []
        for slot, loc in dep:
            if slot not in slots:
                slots.append(slot)
            row.append((slots.index(slot), loc))
        dep_rows.append(row)
    in_rows, out_rows = (
        [[(0, k, size) if r is None else (1, r * m + k, size) for r, k, size in side]
         for side in sides]
        for sides in (([row[1] for row in rows]), ([row[2] for row in rows])))
    return slots, dep_rows, in_rows, out_rows


def add_scaled(a: object, b: object, times: int) -> object:
    """Field-wise ``a + times * b`` of two dataclass values of one type."""
    return type(a)(**{f.name: getattr(a, f.name) + times * getattr(b, f.name)
                      for f in fields(a)})  # type: ignore[arg-type]
