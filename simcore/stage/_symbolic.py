"""The short model's rank graph built once per layout, then evaluated per set of sizes.

Which nodes STAGE writes, their names, dependencies, collectives and axes follow from the block
tables, ``weight_sharded``, ``activation_recompute`` and which parallel axes are > 1; the sizes
only fill in numbers. So :class:`_Builder` is run once per such layout with every number kept as
the expression STAGE evaluates (:class:`~simcore.stage._counts.Count`, or a
:class:`~simcore.stage._counts.Total` for a tensor_size): the builder asks for numbers only
through ``count``, ``total`` and ``entry``, and only asks whether a count is zero, which a count
never is (:func:`~simcore.stage._counts.number` refuses one below one element). Evaluating the
expressions for the actual sizes with :func:`~simcore.stage._counts.number` gives the same
integers :func:`build_model` computes, from the same code path. An entry's size is its count's
number below 2^53 (``std::stoull(str(float))`` differs only from 1e16 on), so layouts with a
number from 2^53 on are left to :func:`build_model`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from simcore.network import Collective
from simcore.stage._args import StageArgs, stage_groups
from simcore.stage._counts import EXACT_BELOW, Count, Total, count_of, numbers
from simcore.stage._graph import (
    Node,
    NodeKind,
    RankGraph,
    _Builder,
    _Tensor,
    build_model,
)
from simcore.stage._shapes import PARALLEL_AXES, Shape

__all__ = ["Rank0", "layout_key", "rank0", "rank0_graph", "stage_numbers"]

Number = Count | Total
"""An unevaluated number of the trace."""


class _SymbolicBuilder(_Builder):
    """:class:`_Builder` with every number an expression; records the expressions it made."""

    def __init__(self, args: StageArgs) -> None:
        super().__init__(args)
        self.numbers: dict[Number, None] = {}

    def count(self, shape: Shape, amp: int | None = None) -> Count:  # type: ignore[override]
        c = count_of(shape, amp)
        self.numbers[c] = None
        return c

    def total(self, *shapes: Shape) -> Total:  # type: ignore[override]
        t = Total(tuple(count_of(s) for s in shapes))
        self.numbers[t] = None
        return t

    def entry(self, shape: Shape) -> Count:  # type: ignore[override]
        return self.count(shape)

    def build_tensors(self) -> list[_Tensor]:
        """The evaluated tensors, shared by the layouts that differ only in their axes: the
        tensors read no axis (only the per-rank graph does) and nothing changes them later."""
        a = self.args
        key = (a.weight_sharded, a.activation_recompute, a.pp, a.num_stacks)
        if key not in _TENSORS:
            _TENSORS[key] = (super().build_tensors(), tuple(self.numbers))
        tensors, numbers = _TENSORS[key]
        self.numbers.update(dict.fromkeys(numbers))
        return tensors


_TENSORS: dict[tuple, tuple[list[_Tensor], tuple[Number, ...]]] = {}  # per (ws, rc, pp, blocks)


def stage_numbers(weight_sharded: bool, recompute: bool) -> tuple[Number, ...]:
    """Every number STAGE evaluates for the tensors of a model with these switches (the same
    expressions for any number of blocks and stages)."""
    builder = _SymbolicBuilder(StageArgs(weight_sharded=weight_sharded,
                                         activation_recompute=recompute, num_stacks=2))
    builder.build_tensors()
    return tuple(builder.numbers)


class _Row(NamedTuple):
    """A node of a symbolic rank graph, every number an index into the evaluated values."""

    id: int
    kind: NodeKind
    name: str
    num_ops: int
    tensor_size: int
    collective: Collective | None
    axis: str | None
    size: int
    link: int
    deps: tuple[int, ...]
    inputs: tuple[tuple[str, int], ...]
    outputs: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class _Recipe:
    """One symbolic rank graph: its nodes with every number as an index into ``values``."""

    numbers: tuple[Number, ...]
    """``values`` = these evaluated, then the constants: the nodes' numbers, then the other
    numbers the build evaluated."""
    constants: tuple[int, ...]
    nodes: tuple[_Row, ...]
    names: tuple[str, ...]
    timings: tuple[tuple[NodeKind, Collective | None, str | None, int, int], ...]
    """The distinct things that take time: (COMP, -, -, num_ops, tensor_size) or (COLL,
    collective, axis, size, -1); ``()`` if a node is neither (several stages)."""
    timing: tuple[int, ...]
    """Per node, its entry of ``timings``."""
    in_values: tuple[int, ...]
    out_values: tuple[int, ...]
    """The size of every input (output) entry, node after node."""


_RECIPES: dict[tuple, _Recipe | None] = {}  # per layout of the short model: a few dozen


def layout_key(args: StageArgs) -> tuple:
    """What the structure of ``args``' graph depends on (module docstring)."""
    axes = tuple(a for a in PARALLEL_AXES if args.value_of(a) > 1)
    return (args.weight_sharded, args.activation_recompute, axes, args.pp, args.num_stacks)


def _recipe(args: StageArgs) -> _Recipe | None:
    """The symbolic rank-0 graph of ``args``'s layout (built on first use), or ``None`` when
    there is more than one stage (the stage placement then depends on more than the layout)."""
    key = layout_key(args)
    if key not in _RECIPES:
        _RECIPES[key] = None if args.pp != 1 else _build_recipe(args)
    return _RECIPES[key]


def _build_recipe(args: StageArgs) -> _Recipe:
    builder = _SymbolicBuilder(args)
    graph = builder.rank_graphs()[0]
    index: dict[Number | int, int] = {}  # every number, in order of appearance

    def ref(v: Number | int) -> int:
        return index.setdefault(v, len(index))

    rows = [_Row(n.id, n.kind, n.name, ref(n.num_ops), ref(n.tensor_size), n.collective,
                 n.axis, ref(n.size), n.link, tuple(n.deps),
                 tuple((name, ref(s)) for name, s in n.inputs),
                 tuple((name, ref(s)) for name, s in n.outputs)) for n in graph.nodes]
    numbers = [v for v in index if not isinstance(v, int)]
    # and the numbers of tensors no node shows (leaves, identities): evaluated so that rank0
    # refuses what build_model refuses
    numbers += [v for v in builder.numbers if v not in index]
    constants = [v for v in index if isinstance(v, int)]
    order = {v: i for i, v in enumerate([*numbers, *constants])}
    at = [order[v] for v in index]  # ref -> value index

    nodes = tuple(row._replace(
        num_ops=at[row.num_ops], tensor_size=at[row.tensor_size], size=at[row.size],
        inputs=tuple((nm, at[r]) for nm, r in row.inputs),
        outputs=tuple((nm, at[r]) for nm, r in row.outputs)) for row in rows)
    timings, timing = _timings(nodes)
    return _Recipe(
        tuple(numbers), tuple(constants),  # type: ignore[arg-type]
        nodes, names=tuple(row.name for row in nodes), timings=timings, timing=timing,
        in_values=tuple(r for row in nodes for _, r in row.inputs),
        out_values=tuple(r for row in nodes for _, r in row.outputs))


def _timings(nodes: tuple[_Row, ...]) -> tuple[tuple, tuple[int, ...]]:
    """The distinct timings of the nodes and each node's; both empty if a node is neither a
    computation nor a collective."""
    timings: dict[tuple, int] = {}
    timing = []
    for row in nodes:
        if row.kind is NodeKind.COMP:
            key: tuple = (row.kind, None, None, row.num_ops, row.tensor_size)
        elif row.kind is NodeKind.COLL:
            key = (row.kind, row.collective, row.axis, row.size, -1)
        else:
            return (), ()
        timing.append(timings.setdefault(key, len(timings)))
    return tuple(timings), tuple(timing)


class Rank0:
    """Rank 0's trace of a single-stage model at one set of sizes, without its node objects:
    names, durations, entry sizes and inventory straight from the layout's symbolic graph."""

    __slots__ = ("_groups", "_recipe", "_values")

    def __init__(self, recipe: _Recipe, values: list[int], groups: dict[str, tuple[int, ...]]
                 ) -> None:
        self._recipe, self._values, self._groups = recipe, values, groups

    @property
    def names(self) -> tuple[str, ...]:
        return self._recipe.names

    def durations(self, comp_ns: Callable[[Node], int],
                  coll_ns: Callable[[RankGraph, Node], int]) -> list[int]:
        """What :func:`simcore.stage._replay.flatten` gives as ``dur``: each distinct timing
        asked once, of a node carrying the fields a duration reads (the callables are pure
        functions of those: num_ops and tensor_size; collective, size and the axis' group)."""
        v = self._values
        graph = RankGraph(0, 0, (), self._groups, {})
        times = [
            comp_ns(Node(0, kind, "", v[a], v[b])) if kind is NodeKind.COMP else
            coll_ns(graph, Node(0, kind, "", collective=coll, axis=axis, size=v[a]))
            for kind, coll, axis, a, b in self._recipe.timings]
        return [times[k] for k in self._recipe.timing]

    def entry_sizes(self) -> tuple[list[int], list[int]]:
        """The sizes of all input entries and of all output entries, node after node."""
        v = self._values
        return [v[r] for r in self._recipe.in_values], [v[r] for r in self._recipe.out_values]

    def inventory_rows(self, nodes: Iterable[int] | None = None
                       ) -> Iterator[tuple[NodeKind, Collective | None, int, int, int]]:
        """(kind, collective, num_ops, tensor_size, size) of the nodes (default: all)."""
        v, rows = self._values, self._recipe.nodes
        for i in range(len(rows)) if nodes is None else nodes:
            row = rows[i]
            yield row.kind, row.collective, v[row.num_ops], v[row.tensor_size], v[row.size]

    def graph(self) -> RankGraph:
        """The rank graph itself (node objects)."""
        v = self._values
        nodes = tuple(
            Node(i, kind, name, v[ops], v[ts], coll, axis, v[size], link, list(deps),
                 tuple([(nm, v[r]) for nm, r in ins]), tuple([(nm, v[r]) for nm, r in outs]))
            for (i, kind, name, ops, ts, coll, axis, size, link, deps, ins, outs)
            in self._recipe.nodes)
        return RankGraph(0, 0, nodes, self._groups, {})


def rank0(args: StageArgs) -> Rank0 | None:
    """Rank 0 of a single-stage ``args`` from its layout's symbolic graph (built once), or
    ``None`` for several stages or a number from 2^53 on (:func:`build_model` then builds);
    raises :class:`~simcore.stage._counts.Refused` as :func:`build_model` would."""
    recipe = _recipe(args)
    if recipe is None or (recipe.nodes and not recipe.timings):
        return None
    values = numbers(recipe.numbers, args.value_of)
    if values and max(values) >= EXACT_BELOW:
        return None
    values += recipe.constants
    return Rank0(recipe, values, stage_groups(args, 0))


def rank0_graph(args: StageArgs) -> RankGraph:
    """``build_model(args).ranks[0]``, from the layout's symbolic graph where possible."""
    rank = rank0(args)
    return build_model(args).ranks[0] if rank is None else rank.graph()

