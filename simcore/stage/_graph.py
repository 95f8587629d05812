"""The per-rank execution graph STAGE recomp writes (one Chakra trace per rank), rebuilt.

Steps, as STAGE's ``main.py`` runs them (NOTES.md section 5):
1. blocks from :mod:`._templates` are named ``in_emb_*``, ``out_emb_*``, ``stack_<i>_mha_*``,
   ``stack_<i>_ffn_*`` and linked (a linked leaf becomes an identity of its source);
2. every weight W gets an update ``W@1 = W + dW`` (plain SGD, ``GradUpdater``);
3. tensors go to pipeline stages round-robin (in_emb -> 0, block i -> (i+1) mod pp,
   out_emb -> (num_stacks+1) mod pp); an input produced on another stage becomes a received
   copy (``shadow_*``) and the producer sends it;
4. per tensor: one compute node, then one collective per parallel axis whose layout the
   consumer reads differently, separately for each input (one collective per consumer);
   zero-op compute nodes (leaves, identities) are dropped and their dependants re-pointed;
5. recomputed ops get a control dependency on the block's backward start, and when more than
   two collectives have no dependency at all they are chained in node order.

Every rank of one stage runs the same graph (only its communicator groups differ), so one
representative rank per stage is built. Node ids keep STAGE's relative order, which is the
order ASTRA-sim issues ready nodes in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from itertools import pairwise

from simcore.network import Collective
from simcore.stage._args import StageArgs, rank_of, stage_groups
from simcore.stage._counts import Total, count_of, entry_size, number
from simcore.stage._shapes import PARALLEL_AXES, Shape, einsum, match_collectives, parse_shape
from simcore.stage._templates import Row, attention, embedding, feed_forward

__all__ = ["SKIPPED", "Node", "NodeKind", "RankGraph", "StageModel", "build_model"]


class NodeKind(IntEnum):
    COMP = 1
    COLL = 2
    SEND = 3
    RECV = 4


@dataclass(slots=True, eq=False)
class _Tensor:
    id: str
    row: Row
    x1: _Tensor | None
    x2: _Tensor | None
    x1_shape: Shape
    x2_shape: Shape
    stage: int = 0
    op: str = ""
    grad: _Tensor | None = None
    after: _Tensor | None = None
    y_shape: Shape = ()
    y_hidden: Shape = ()
    ops: int = 0
    tensor_size: int = 0
    y_size: int = 0
    io_size: int = 0
    """The size an input/output entry names (``y_size`` but for STAGE's str(float) quirk)."""
    tag: str = ""
    """Which instantiation of the row (embeddings rename symbols): tensors with equal row, op
    and tag have equal layouts, so they are evaluated once."""


@dataclass(slots=True, eq=False)
class Node:
    """One node of a rank's trace."""

    id: int
    kind: NodeKind
    name: str
    num_ops: int = 0
    tensor_size: int = 0
    collective: Collective | None = None
    axis: str | None = None
    size: int = 0
    """Elements communicated (comm_size): collectives, sends and receives."""
    link: int = -1
    """Index of the pipeline transfer a send or receive belongs to."""
    deps: list[int] = field(default_factory=list)
    inputs: tuple[tuple[str, int], ...] = ()
    outputs: tuple[tuple[str, int], ...] = ()
    duration_us: int = 0
    """A compute node's recorded runtime (Chakra ``duration_micros``), used when the roofline is
    off; STAGE's traces leave it 0; :data:`SKIPPED` for a node that takes no time at all."""


SKIPPED = -1
"""``Node.duration_us`` of a node ASTRA-sim skips (metadata and invalid nodes)."""


@dataclass(frozen=True, slots=True)
class RankGraph:
    """The trace of one representative rank of a pipeline stage."""

    stage: int
    rank: int
    nodes: tuple[Node, ...]
    """In id order; ``deps`` hold data and control dependencies alike."""
    groups: dict[str, tuple[int, ...]]
    """Communicator group (ranks, ascending) of this rank per parallel axis."""
    peers: dict[int, int]
    """Pipeline transfer index -> the rank at the other end."""


@dataclass(frozen=True, slots=True)
class StageModel:
    """All representative ranks; ``ranks[0]`` is rank 0 (the stage holding in_emb)."""

    args: StageArgs
    ranks: tuple[RankGraph, ...]


class _Builder:
    def __init__(self, args: StageArgs) -> None:
        self.args = args
        self._evaluated: dict[tuple[int, str, str], tuple] = {}
        self._update_rows: dict[int, Row] = {}
        self.axes = tuple(a for a in PARALLEL_AXES if args.value_of(a) > 1)

    # The numbers STAGE writes for a shape (:mod:`._counts`: a remainder is truncated once, on
    # the whole product); overridden by the symbolic builder, which keeps them as expressions.
    def count(self, shape: Shape, amp: int | None = None) -> int:
        """num_ops or comm_size: ``int(float(evalf(amp * prod(shape))))``."""
        return number(count_of(shape, amp), self.args.value_of)

    def total(self, *shapes: Shape) -> int:
        """A compute node's tensor_size: its output's and inputs' sizes added as floats."""
        return number(Total(tuple(count_of(s) for s in shapes)), self.args.value_of)

    def entry(self, shape: Shape) -> int:
        """The size of an input/output entry, as ASTRA-sim reads it."""
        return entry_size(count_of(shape), self.args.value_of)

    # -- 1. blocks, links, updates ------------------------------------------------------------
    def instantiate(self, rows: list[Row], prefix: str, rename: tuple[str, str] | None
                    ) -> dict[str, _Tensor]:
        out: dict[str, _Tensor] = {}
        tag = "" if rename is None else rename[0]
        for row in rows:
            s1, s2 = parse_shape(row.x1_shape), parse_shape(row.x2_shape)
            if rename is not None:
                s1 = tuple(d.renamed(*rename) for d in s1)
                s2 = tuple(d.renamed(*rename) for d in s2)
            t = _Tensor(f"{prefix}{row.name}@0", row, out.get(row.x1) if row.x1 else None,
                        out.get(row.x2) if row.x2 else None, s1, s2, op=row.op, tag=tag)
            out[row.name] = t
        for row in rows:
            t = out[row.name]
            if row.grad_of is not None and out[row.grad_of].row.weight:
                out[row.grad_of].grad = t
            if row.after is not None:
                t.after = out[row.after]
        return out

    def build_tensors(self) -> list[_Tensor]:
        a = self.args
        ws, rc = a.weight_sharded, a.activation_recompute
        emb = embedding(weight_sharded=ws)
        in_emb = self.instantiate(emb, "in_emb_", ("Dout", "Dmodel"))
        out_emb = self.instantiate(emb, "out_emb_", ("Din", "Dmodel"))
        mha_rows = attention(weight_sharded=ws, recompute=rc)
        ffn_rows = feed_forward(weight_sharded=ws, recompute=rc)
        stacks = []
        for i in range(a.num_stacks):
            mha = self.instantiate(mha_rows, f"stack_{i}_mha_", None)
            ffn = self.instantiate(ffn_rows, f"stack_{i}_ffn_", None)
            _link(mha["norm"], ffn["x0"])
            _link(ffn["dx0"], mha["d_norm"])
            stacks.append((mha, ffn))
        _link(in_emb["y"], stacks[0][0]["x"])
        _link(stacks[0][0]["d_x"], in_emb["dy"])
        for i in range(1, a.num_stacks):
            _link(stacks[i - 1][1]["norm"], stacks[i][0]["x"])
            _link(stacks[i][0]["d_x"], stacks[i - 1][1]["dnorm"])
        _link(stacks[-1][1]["norm"], out_emb["x"])
        _link(out_emb["dx"], stacks[-1][1]["dnorm"])
        _link(out_emb["y"], out_emb["dy"])

        pp = a.pp
        tensors: list[_Tensor] = []
        for t in in_emb.values():
            t.stage = 0
            tensors.append(t)
        for t in out_emb.values():
            t.stage = (a.num_stacks + 1) % pp
            tensors.append(t)
        for i, (mha, ffn) in enumerate(stacks):
            for t in (*mha.values(), *ffn.values()):
                t.stage = (i + 1) % pp
                tensors.append(t)
        updates = []
        for t in tensors:
            if t.row.weight:
                assert t.grad is not None
                upd = _Tensor(t.id[:-2] + "@1", self.update_row(t.row), t, t.grad, (), (),
                              stage=t.stage, op="A", tag=t.tag)
                updates.append(upd)
        tensors.extend(updates)
        for t in tensors:
            self.evaluate(t)
        return tensors

    def update_row(self, weight: Row) -> Row:
        """The row of ``W@1 = W + dW``; one per weight row, so that updates are evaluated once
        (the template rows live as long as the builder, so their ids are stable)."""
        row = self._update_rows.get(id(weight))
        if row is None:
            row = self._update_rows[id(weight)] = Row(weight.name, "A")
        return row

    def evaluate(self, t: _Tensor) -> None:
        key = (id(t.row), t.op, t.tag)
        done = self._evaluated.get(key)
        if done is None:
            self._evaluate(t)
            self._evaluated[key] = (t.x1_shape, t.x2_shape, t.y_shape, t.y_hidden, t.ops,
                                    t.y_size, t.io_size, t.tensor_size)
        else:
            (t.x1_shape, t.x2_shape, t.y_shape, t.y_hidden, t.ops, t.y_size, t.io_size,
             t.tensor_size) = done

    def _evaluate(self, t: _Tensor) -> None:
        op = t.op
        if t.x1_shape == () and op == "A":  # a weight update reads W and dW as W is stored
            assert t.x1 is not None
            t.x1_shape = t.x2_shape = t.x1.x1_shape
        # op counts: ops/einsum.py lines 64-68, add.py 31, element.py 26-28, reshape.py 28;
        # leaves, identities and shadows count 0
        if op == "M":
            t.y_shape, t.y_hidden = einsum(t.row.spec, t.x1_shape, t.x2_shape)
            ops = self.count(t.y_shape + t.y_hidden)
        elif op == "R":
            t.y_shape = t.x2_shape
            ops = self.count(t.y_shape)
        else:
            t.y_shape = t.x1_shape
            ops = (self.count(t.x1_shape) if op == "A" else
                   self.count(t.x1_shape, t.row.amp) if op == "E" else 0)
        t.ops = ops
        t.y_size = self.count(t.y_shape)
        t.io_size = self.entry(t.y_shape)
        t.tensor_size = self.total(t.y_shape, *(s for s in (t.x1_shape, t.x2_shape) if s))

    # -- 3.-5. one rank per stage ------------------------------------------------------------
    def rank_graphs(self) -> tuple[RankGraph, ...]:
        a = self.args
        tensors = self.build_tensors()
        order: list[int] = []
        for t in tensors:
            if t.stage not in order:
                order.append(t.stage)
        by_stage: dict[int, list[_Tensor]] = {s: [] for s in order}
        for t in tensors:
            by_stage[t.stage].append(t)
        # pipeline transfers, in STAGE's order: per stage, per tensor, x1 then x2
        links: list[tuple[_Tensor, int]] = []  # (remote tensor, receiving stage)
        shadows: dict[int, dict[int, _Tensor]] = {s: {} for s in order}
        for s in order:
            for t in by_stage[s]:
                for x in (t.x1, t.x2):
                    if x is not None and x.stage != s and id(x) not in shadows[s]:
                        sh = _Tensor("shadow_" + x.id, x.row, None, None, x.y_shape, (),
                                     stage=s, op="S", y_shape=x.y_shape, y_hidden=x.y_hidden,
                                     y_size=x.y_size, io_size=x.io_size)
                        shadows[s][id(x)] = sh
                        links.append((x, s))

        reps = {s: rank_of(a, order.index(s)) for s in order}
        graphs = []
        for pos, s in enumerate(order):
            groups = stage_groups(a, pos)
            peers = {}
            for k, (x, dst) in enumerate(links):
                if x.stage == s:
                    peers[k] = reps[dst]
                elif dst == s:
                    peers[k] = reps[x.stage]
            nodes = self.stage_nodes(s, by_stage[s], shadows[s], links)
            graphs.append(RankGraph(s, reps[s], nodes, groups, peers))
        return tuple(graphs)

    def stage_nodes(self, s: int, own: list[_Tensor], shadows: dict[int, _Tensor],
                    links: list[tuple[_Tensor, int]]) -> tuple[Node, ...]:
        def view(x: _Tensor) -> _Tensor:
            return shadows[id(x)] if x.stage != s else x

        def io(x: _Tensor) -> tuple[str, int]:
            x = view(x)
            if x.op == "I":
                assert x.x1 is not None
                x = view(x.x1)
            return (x.id, x.io_size)

        nodes: list[Node] = []
        comp_of: dict[int, Node] = {}
        comms_of: dict[int, tuple[list[Node], list[Node]]] = {}
        tensors = [*own, *shadows.values()]
        for t in tensors:
            comp = Node(len(nodes), NodeKind.COMP, t.id, t.ops, t.tensor_size)
            nodes.append(comp)
            comp_of[id(t)] = comp
            if t.ops:
                comp.inputs = tuple(io(x) for x in (t.x1, t.x2) if x is not None)
                comp.outputs = (io(t),)
            per_input: list[list[Node]] = []
            for x, want in ((t.x1, t.x1_shape), (t.x2, t.x2_shape)):
                chain: list[Node] = []
                if x is not None:
                    src = view(x)
                    for coll, axis in match_collectives(src.y_shape, src.y_hidden, want,
                                                        self.axes):
                        n = Node(len(nodes), NodeKind.COLL, t.id, collective=coll, axis=axis,
                                 size=src.y_size, inputs=(io(x),))
                        if chain:
                            n.deps.append(chain[-1].id)
                        chain.append(n)
                        nodes.append(n)
                    if chain:
                        comp.deps.append(chain[-1].id)
                per_input.append(chain)
            comms_of[id(t)] = (per_input[0], per_input[1])
        recv_of: dict[int, Node] = {}
        for k, (x, dst) in enumerate(links):
            if x.stage == s:
                n = Node(len(nodes), NodeKind.SEND, x.id, size=x.y_size, link=k,
                         deps=[comp_of[id(x)].id], inputs=(io(x),))
                nodes.append(n)
            elif dst == s:
                sh = shadows[id(x)]
                n = Node(len(nodes), NodeKind.RECV, sh.id, size=sh.y_size, link=k,
                         outputs=((sh.id, sh.io_size),))
                nodes.append(n)
                recv_of[id(sh)] = n

        def output(x: _Tensor) -> Node:
            x = view(x)
            return recv_of[id(x)] if x.op == "S" else comp_of[id(x)]

        for t in tensors:
            c1, c2 = comms_of[id(t)]
            for x, chain in ((t.x1, c1), (t.x2, c2)):
                if x is not None:
                    (chain[0] if chain else comp_of[id(t)]).deps.append(output(x).id)
        # drop zero-op compute nodes, re-pointing their dependants to their single parent
        empty = {n.id for n in nodes if n.kind is NodeKind.COMP and n.num_ops == 0}
        resolved: dict[int, int | None] = {}

        def resolve(i: int) -> int | None:
            if i not in empty:
                return i
            if i not in resolved:
                parents = [p for p in (resolve(d) for d in nodes[i].deps) if p is not None]
                if len(parents) > 1:
                    raise AssertionError(f"zero-op node {nodes[i].name} has several parents")
                resolved[i] = parents[0] if parents else None
            return resolved[i]

        kept = [n for n in nodes if n.id not in empty]
        for n in kept:
            deps: list[int] = []
            for d in n.deps:
                p = resolve(d)
                if p is not None and p not in deps:
                    deps.append(p)
            n.deps = deps
        for t in own:
            if t.after is not None:
                parent = output(t.after)
                c1, _ = comms_of[id(t)]
                child = c1[0] if c1 else comp_of[id(t)]
                pid = resolve(parent.id)
                if pid is not None and pid not in child.deps:
                    child.deps.append(pid)
        free = [n for n in kept if not n.deps and n.kind in (NodeKind.COLL, NodeKind.SEND)]
        if len(free) > 2:  # HybridGraph.comm_add_ctrl_dep: chain dependency-free collectives
            for prev, n in pairwise(free):
                n.deps.append(prev.id)
        return tuple(kept)


def _link(source: _Tensor, leaf: _Tensor) -> None:
    """A leaf fed by another block's tensor becomes an identity of it (``ConnectGraph``)."""
    leaf.op = "I"
    leaf.x1 = source


def build_model(args: StageArgs) -> StageModel:
    """The representative rank graph of every pipeline stage."""
    return StageModel(args, _Builder(args).rank_graphs())
