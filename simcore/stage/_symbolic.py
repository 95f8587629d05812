"""The short model's rank graph built once per layout, then evaluated per set of sizes.

Which nodes STAGE writes, their names, dependencies, collectives and axes follow from the block
tables, ``weight_sharded``, ``activation_recompute`` and which parallel axes are > 1; the sizes
only fill in numbers. So :class:`_Builder` is run once per such layout with every size kept as a
polynomial over the tables' symbolic shapes (:class:`Poly`: ``size(shape)`` is the monomial
``shape``; the builder only adds sizes, multiplies them with each other or with an int, and asks
whether one is zero, and a polynomial of sizes is zero exactly when it has no terms, because
every shape's size is a whole number >= 1). Evaluating the polynomials for the actual sizes gives
the same integers :func:`build_model` computes, from the same code path.

The builder's other use of the sizes is its error for a split that is not whole: every dimension
the symbolic build asked the size of is checked first, and if one is not whole the concrete build
runs (and raises its own error).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from math import prod
from typing import NamedTuple

from simcore.network import Collective
from simcore.stage._args import StageArgs
from simcore.stage._graph import (
    Node,
    NodeKind,
    RankGraph,
    _Builder,
    _Tensor,
    build_model,
    stage_groups,
)
from simcore.stage._shapes import PARALLEL_AXES, Dim, Shape

__all__ = ["Poly", "Rank0", "layout_key", "rank0", "rank0_graph"]


class Poly(NamedTuple):
    """``sum(coef * size(monomial))`` with positive coefficients; never zero (zero is ``0``).

    A tuple underneath, so that the many lookups of a build hash and compare it in C."""

    terms: tuple[tuple[Shape, int], ...]
    """(monomial as sorted dims, coefficient), sorted by monomial."""

    @staticmethod
    def of(shape: Shape) -> Poly:
        return Poly(((tuple(sorted(shape)), 1),))

    def __add__(self, other: Poly | int) -> Poly:  # type: ignore[override]
        if isinstance(other, int):
            if other == 0:
                return self
            other = Poly((((), other),))
        merged: dict[Shape, int] = dict(self.terms)
        for mono, c in other.terms:
            merged[mono] = merged.get(mono, 0) + c
        return Poly(tuple(sorted(merged.items())))

    __radd__ = __add__

    def __mul__(self, other: Poly | int) -> Poly | int:  # type: ignore[override]
        if isinstance(other, int):
            return 0 if other == 0 else Poly(tuple((m, c * other) for m, c in self.terms))
        merged: dict[Shape, int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in other.terms:
                mono = tuple(sorted(m1 + m2))
                merged[mono] = merged.get(mono, 0) + c1 * c2
        return Poly(tuple(sorted(merged.items())))

    __rmul__ = __mul__

    def __bool__(self) -> bool:
        return True

    def value(self, dims: dict[Dim, int]) -> int:
        return sum(c * prod(dims[d] for d in mono) for mono, c in self.terms)


class _SymbolicBuilder(_Builder):
    """:class:`_Builder` with every size a :class:`Poly`; records the dimensions it sized."""

    def __init__(self, args: StageArgs) -> None:
        super().__init__(args)
        self.dims: dict[Dim, None] = {}

    def size(self, shape: Shape) -> Poly:  # type: ignore[override]
        for d in shape:
            self.dims[d] = None
        return Poly.of(shape)

    def build_tensors(self) -> list[_Tensor]:
        """The evaluated tensors, shared by the layouts that differ only in their axes: the
        tensors read no axis (only the per-rank graph does) and nothing changes them later."""
        a = self.args
        key = (a.weight_sharded, a.activation_recompute, a.pp, a.num_stacks)
        if key not in _TENSORS:
            _TENSORS[key] = (super().build_tensors(), tuple(self.dims))
        tensors, dims = _TENSORS[key]
        self.dims.update(dict.fromkeys(dims))
        return tensors


_TENSORS: dict[tuple, tuple[list[_Tensor], tuple[Dim, ...]]] = {}  # per (ws, rc, pp, blocks)


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

    dims: tuple[Dim, ...]
    polys: tuple[Poly, ...]
    """``values`` = the polynomials evaluated, then the constants."""
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
    index: dict[Poly | int, int] = {}  # every number, in order of appearance

    def ref(v: Poly | int) -> int:
        return index.setdefault(v, len(index))

    rows = [_Row(n.id, n.kind, n.name, ref(n.num_ops), ref(n.tensor_size), n.collective,
                 n.axis, ref(n.size), n.link, tuple(n.deps),
                 tuple((name, ref(s)) for name, s in n.inputs),
                 tuple((name, ref(s)) for name, s in n.outputs)) for n in graph.nodes]
    polys = [v for v in index if isinstance(v, Poly)]
    constants = [v for v in index if not isinstance(v, Poly)]
    order = {v: i for i, v in enumerate([*polys, *constants])}
    at = [order[v] for v in index]  # ref -> value index

    nodes = tuple(row._replace(
        num_ops=at[row.num_ops], tensor_size=at[row.tensor_size], size=at[row.size],
        inputs=tuple((nm, at[r]) for nm, r in row.inputs),
        outputs=tuple((nm, at[r]) for nm, r in row.outputs)) for row in rows)
    timings, timing = _timings(nodes)
    return _Recipe(
        tuple(builder.dims), tuple(polys), tuple(constants),  # type: ignore[arg-type]
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


def _dim_values(dims: tuple[Dim, ...], value_of: Callable[[str], int]) -> dict[Dim, int] | None:
    """Each dimension's size, or ``None`` if one is not whole."""
    out: dict[Dim, int] = {}
    for d in dims:
        num = prod(value_of(s) for s in d.num)
        den = prod(value_of(s) for s in d.den)
        if num % den:
            return None
        out[d] = num // den
    return out


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
    ``None`` for several stages or a split that is not whole (:func:`build_model` then builds,
    or raises)."""
    recipe = _recipe(args)
    dims = None if recipe is None else _dim_values(recipe.dims, args.value_of)
    if recipe is None or dims is None or (recipe.nodes and not recipe.timings):
        return None
    values = [p.value(dims) for p in recipe.polys]
    values += recipe.constants
    return Rank0(recipe, values, stage_groups(args, 0))


def rank0_graph(args: StageArgs) -> RankGraph:
    """``build_model(args).ranks[0]``, from the layout's symbolic graph where possible."""
    rank = rank0(args)
    return build_model(args).ranks[0] if rank is None else rank.graph()

