"""ASTRA-sim 1.0's text workloads, converted to Chakra nodes as Chakra's text converter does.

The format (mlcommons/chakra@21585d8 ``src/converter/text_converter.py``): line 1 the
parallelism (``MICRO``, ``DATA``, ``MODEL``, ``HYBRID_DATA_MODEL``, ``HYBRID_MODEL_DATA``,
``HYBRID_DLRM`` / ``HYBRID_DLRM_ENHANCED`` followed by the last bottom-MLP layer's index; ASTRA-sim
1.0's ``HYBRID_TRANSFORMER`` and ``HYBRID_CUSTOMIZED`` are refused, as the converter refuses
them), line 2 the layer count, then one line per layer: name, a reserved
field, then forward compute time, comm type and size, input-gradient compute time, comm type and
size, weight-gradient compute time, comm type and size, and the update time (unused). Times are
microseconds (``duration_micros``), sizes bytes; comm types ``ALLREDUCE``, ``ALLGATHER``,
``REDUCESCATTER``, ``ALLTOALL`` (anything else, ``NONE`` included, becomes an all-reduce, as in
the converter).

Per pass, what each parallelism emits (every NPU the same graph; dependencies as the converter
writes them, data dependencies only; pass i + 1 waits on pass i through the layers' last
nodes):

- ``MICRO``: each layer's weight-gradient collective, nothing else;
- ``DATA``: forward compute chain; backward per layer (last first) weight-gradient compute, its
  collective, then (not for the first layer) input-gradient compute;
- ``MODEL``: forward compute then its collective per layer; backward per layer input-gradient
  compute, its collective (not for the first layer), weight-gradient compute;
- ``HYBRID_DATA_MODEL`` / ``HYBRID_MODEL_DATA``: ``MODEL`` plus each layer's weight-gradient
  collective;
- ``HYBRID_DLRM`` (``_ENHANCED`` alike): forward compute chain, an all-to-all after every layer
  whose forward comm type is ``ALLTOALL`` (the embedding), which the last bottom-MLP layer's
  forward awaits; backward per layer (last first) weight-gradient compute, its collective unless
  ``NONE``, then input-gradient compute (not for the first layer); after the input gradient of
  the first top-MLP layer, the embedding's backward collective, which the embedding's weight
  gradient awaits (``convert_hybrid_dlrm``, lines 368-442).

``hoti2024``: write what the converter of the HOTI 2024 tutorial wrote (its Chakra,
willjwon/chakra-tutorial@2ba2969): no ``comm_size`` on collectives. ASTRA-sim at that tutorial
ran such collectives in no time, which is how the tutorial's demo 2 reports 195.206 ms, the sum
of the compute times.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.chakra.schema import COLLECTIVE_TYPES, message_class
from planner.errors import PlannerUsageError
from planner.inputs import read_text

__all__ = ["PARALLELISMS", "TextWorkload", "read_text_workload", "text_nodes"]

PARALLELISMS = ("MICRO", "DATA", "MODEL", "HYBRID_DATA_MODEL", "HYBRID_MODEL_DATA",
                "HYBRID_DLRM", "HYBRID_DLRM_ENHANCED")
_DLRM = ("HYBRID_DLRM", "HYBRID_DLRM_ENHANCED")
_COMM = {"ALLREDUCE": "ALL_REDUCE", "ALLGATHER": "ALL_GATHER",
         "REDUCESCATTER": "REDUCE_SCATTER", "ALLTOALL": "ALL_TO_ALL"}


@dataclass(frozen=True)
class Layer:
    name: str
    fwd: tuple[int, str, int]
    ig: tuple[int, str, int]
    wg: tuple[int, str, int]
    """Each phase: compute time (us), comm type, comm size (bytes)."""


@dataclass(frozen=True)
class TextWorkload:
    parallelism: str
    layer_count: int
    layers: tuple[Layer, ...]
    last_bottom_layer: int = -1
    """``HYBRID_DLRM``: index of the last bottom-MLP layer (line 1's second field)."""


def read_text_workload(path: Path) -> TextWorkload:
    """Parse a text workload; a malformed one is one :class:`PlannerUsageError` line naming the
    line."""
    lines = read_text(path, "text workload").splitlines()
    if len(lines) < 3 or not lines[0].split():
        raise PlannerUsageError(f"{path}: not a text workload: expected the parallelism, the"
                                " layer count, then one line per layer")
    parallelism = lines[0].split()[0]
    if parallelism not in PARALLELISMS:
        raise PlannerUsageError(f"{path}, line 1: parallelism {parallelism!r} is not supported"
                                " (nor by Chakra's text converter);"
                                f" use one of {', '.join(PARALLELISMS)}")
    bottom = -1
    if parallelism in _DLRM:
        try:
            bottom = int(lines[0].split()[1])
        except (ValueError, IndexError):
            raise PlannerUsageError(f"{path}, line 1: {parallelism} takes the index of the last"
                                    " bottom-MLP layer after it") from None
    try:
        count = int(lines[1].split()[0])
    except (ValueError, IndexError):
        raise PlannerUsageError(f"{path}, line 2: the layer count must be a whole number")
    layers = []
    for number, line in enumerate(lines[2:], start=3):
        f = line.split()
        if not f:
            continue
        try:
            layers.append(Layer(f[0], (int(f[2]), f[3], int(f[4])), (int(f[5]), f[6], int(f[7])),
                                (int(f[8]), f[9], int(f[10]))))
        except (ValueError, IndexError):
            raise PlannerUsageError(
                f"{path}, line {number}: expected name, reserved, then compute time, comm type"
                " and comm size for forward, input gradient and weight gradient") from None
        _check_numbers(path, number, layers[-1])
    if count != len(layers):
        raise PlannerUsageError(f"{path}, line 2: says {count} layers but {len(layers)} follow")
    if parallelism in _DLRM:
        _check_dlrm(path, layers, bottom)
    return TextWorkload(parallelism, count, tuple(layers), bottom)


UINT64_FIELD = 2**63 - 1
"""The largest time or size both of a Chakra node's fields hold: ``duration_micros`` is a
``uint64`` and the ``comm_size`` attribute an ``int64`` (planner/chakra/nodes.py)."""


def _check_numbers(path: Path, number: int, layer: Layer) -> None:
    """Each phase's compute time and comm size are counts: 0 .. 2**63 - 1."""
    for phase, (time_us, _, size) in zip(("forward", "input gradient", "weight gradient"),
                                         (layer.fwd, layer.ig, layer.wg), strict=True):
        for what, v in (("compute time", time_us), ("comm size", size)):
            if not 0 <= v <= UINT64_FIELD:
                raise PlannerUsageError(f"{path}, line {number}: the {phase}'s {what} {v} must"
                                        f" be a whole number from 0 to {UINT64_FIELD}")


def _check_dlrm(path: Path, layers: list[Layer], bottom: int) -> None:
    """What the converter needs of a DLRM workload, where it would crash without it."""
    if not 0 < bottom < len(layers) - 1:
        raise PlannerUsageError(f"{path}, line 1: the last bottom-MLP layer {bottom} must be"
                                f" after the embedding and before the last of {len(layers)}"
                                " layers")
    if layers[0].fwd[1] != "ALLTOALL":
        raise PlannerUsageError(f"{path}, line 3: a DLRM's first layer (the embedding) needs"
                                " the forward comm type ALLTOALL")


@dataclass
class _Nodes:
    hoti2024: bool
    nodes: list[Any] = field(default_factory=list)

    def add(self, name: str, kind: int, deps: list[Any | None]) -> Any:
        node = message_class("Node")(id=len(self.nodes), name=name, type=kind,
                                     data_deps=[d.id for d in deps if d is not None])
        self.nodes.append(node)
        return node

    def comp(self, layer: Layer, phase: str, time_us: int, deps: list[Any | None]) -> Any:
        node = self.add(f"COMP_NODE_{layer.name}_{phase}", 4, deps)
        node.duration_micros = time_us
        return node

    def coll(self, name: str, comm: str, size: int, deps: list[Any | None]) -> Any:
        node = self.add(f"COMM_COLL_NODE_{name}_{comm}", 7, deps)
        attr = message_class("AttributeProto")
        node.attr.append(attr(name="comm_type",
                              int64_val=COLLECTIVE_TYPES.index(_COMM.get(comm, "ALL_REDUCE"))))
        if not self.hoti2024:
            node.attr.append(attr(name="comm_size", int64_val=size))
        return node


MAX_NODES = 10_000_000
"""The most nodes a text workload unrolls into: the Chakra exports' bound
(:data:`planner.exports._chakra.MAX_NODES`), a few GB in memory."""

NODES_PER_LAYER = 6
"""At most a compute and a collective node for each of a layer's three phases in a pass."""


def text_nodes(w: TextWorkload, passes: int = 1, hoti2024: bool = False) -> list[Any]:
    """One NPU's Chakra nodes (every NPU runs the same); more than :data:`MAX_NODES` is one
    :class:`PlannerUsageError` line."""
    most = MAX_NODES // (NODES_PER_LAYER * max(1, len(w.layers)))
    if passes > most:
        raise PlannerUsageError(f"--passes {passes:,}: {len(w.layers)} layers over that many"
                                f" passes is over {MAX_NODES:,} nodes; give at most {most:,}")
    if w.parallelism in _DLRM:
        return _dlrm_nodes(w, passes, _Nodes(hoti2024))
    out = _Nodes(hoti2024)
    layers, n = w.layers, len(w.layers)
    wg_comm: list[Any | None] = [None] * n  # the previous pass's, which the next forward awaits
    wg_comp: list[Any | None] = [None] * n
    hybrid = w.parallelism.startswith("HYBRID")
    for _ in range(passes):
        if w.parallelism == "MICRO":
            for layer in layers:
                out.coll(layer.name, layer.wg[1], layer.wg[2], [])
            continue
        if w.parallelism == "DATA":
            fwd: list[Any] = []
            for i, layer in enumerate(layers):
                fwd.append(out.comp(layer, "FWD", layer.fwd[0],
                                    [fwd[i - 1] if i else None, wg_comm[i]]))
            prev = fwd[-1]
            for i in reversed(range(n)):
                layer = layers[i]
                comp = out.comp(layer, "BWD_WG", layer.wg[0], [prev])
                wg_comm[i] = out.coll(layer.name, layer.wg[1], layer.wg[2], [comp])
                if i != 0:
                    prev = out.comp(layer, "BWD_IG", layer.ig[0], [comp])
            continue
        fwd_comm: list[Any] = []
        for i, layer in enumerate(layers):
            waits = wg_comm[i] if hybrid else wg_comp[i]
            comp = out.comp(layer, "FWD", layer.fwd[0], [fwd_comm[i - 1] if i else None, waits])
            fwd_comm.append(out.coll(layer.name, layer.fwd[1], layer.fwd[2], [comp]))
        ig_comm: Any | None = None
        for k, i in enumerate(reversed(range(n))):
            layer = layers[i]
            deps = [fwd_comm[-1]] if k == 0 else [wg_comp[i + 1], ig_comm]
            ig = out.comp(layer, "BWD_IG", layer.ig[0], deps)
            if k != w.layer_count - 1:
                name = layer.name + ("_IG_COMM_" if w.parallelism == "HYBRID_DATA_MODEL" else "")
                ig_comm = out.coll(name, layer.ig[1], layer.ig[2], [ig])
            wg_comp[i] = out.comp(layer, "BWD_WG", layer.wg[0], [ig])
            if hybrid:
                wg_comm[i] = out.coll(layer.name, layer.wg[1], layer.wg[2], [wg_comp[i]])
    return out.nodes


def _dlrm_nodes(w: TextWorkload, passes: int, out: _Nodes) -> list[Any]:
    """``convert_hybrid_dlrm``: see the module docstring."""
    layers, n, bottom = w.layers, len(w.layers), w.last_bottom_layer
    wg_comm: list[Any | None] = [None] * n  # the previous pass's, which the next forward awaits
    wg_comp: list[Any | None] = [None] * n
    fwd_comm: list[Any | None] = [None] * n
    for _ in range(passes):
        fwd: list[Any] = []
        for i, layer in enumerate(layers):
            deps = [wg_comm[i] if wg_comm[i] is not None else wg_comp[i],
                    fwd[i - 1] if i else None, fwd_comm[0] if i == bottom else None]
            fwd.append(out.comp(layer, "FWD", layer.fwd[0], deps))
            if layer.fwd[1] == "ALLTOALL":
                fwd_comm[i] = out.coll(layer.name, layer.fwd[1], layer.fwd[2], [fwd[i]])
        ig_comp: list[Any | None] = [None] * n
        ig_comm: Any | None = None
        for i in reversed(range(n)):
            layer = layers[i]
            deps = [fwd[-1]] if i == n - 1 else [ig_comp[i + 1], ig_comm if i == 0 else None]
            wg_comp[i] = out.comp(layer, "BWD_WG", layer.wg[0], deps)
            if layer.wg[1] != "NONE":
                wg_comm[i] = out.coll(layer.name, layer.wg[1], layer.wg[2], [wg_comp[i]])
            if i != 0:
                ig_comp[i] = out.comp(layer, "BWD_IG", layer.ig[0], [wg_comp[i]])
            if i == bottom + 1:
                first = layers[0]
                ig_comm = out.coll(first.name, first.ig[1], first.ig[2], [ig_comp[i]])
    return out.nodes
