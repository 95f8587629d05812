"""Chakra traces read back as the per-NPU graphs :func:`simcore.stage.replay_traces` runs.

What each node becomes (the attributes ASTRA-sim's workload layer reads, astra-sim@518bd513
``astra-sim/workload/Workload.cc``):

- ``COMP_NODE``: ``num_ops`` and ``tensor_size`` (roofline) and ``duration_micros`` (replay);
- ``COMM_COLL_NODE``: ``comm_type``, ``comm_size`` (bytes; STAGE writes elements, one byte
  each) and ``pg_name``: a group of ``comm_group.json``, or every NPU when empty, ``"0"`` or
  absent (NOTES.md section 3.4);
- ``COMM_SEND_NODE`` / ``COMM_RECV_NODE``: ``comm_dst`` / ``comm_src``, ``comm_tag``,
  ``comm_size``; the k-th send from a to b with a tag meets the k-th receive at b from a with it;
- ``METADATA_NODE`` / ``INVALID_NODE``: skipped (no time), as ASTRA-sim skips them;
- a collective without ``comm_size`` (what the text converter of the HOTI 2024 tutorial wrote):
  skipped, as ASTRA-sim at that tutorial ran it (a CPU operator with no runtime; ASTRA-sim
  518bd513 refuses such a trace instead);
- ``inputs`` / ``outputs`` string lists of (tensor, size) pairs: the local-memory tracker's.

Not replayed, each refused with one line: CPU operators (``is_cpu_op`` true), remote-memory
loads and stores, and collectives other than all-reduce, all-gather, reduce-scatter and
all-to-all.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from planner.chakra.io import Trace, attr_value
from planner.chakra.schema import COLLECTIVE_TYPES, NODE_TYPES
from planner.errors import PlannerUsageError
from planner.inputs import read_text
from simcore.network import Collective
from simcore.stage import SKIPPED, Node, NodeKind, RankGraph

__all__ = ["read_comm_groups", "trace_graphs"]

_KINDS = {"COMP_NODE": NodeKind.COMP, "COMM_COLL_NODE": NodeKind.COLL,
          "COMM_SEND_NODE": NodeKind.SEND, "COMM_RECV_NODE": NodeKind.RECV,
          "METADATA_NODE": NodeKind.COMP, "INVALID_NODE": NodeKind.COMP}
_COLLECTIVES = {COLLECTIVE_TYPES.index(c.name): c for c in Collective}
_WHOLE = ("", "0")
"""``pg_name`` values that mean every NPU."""


def read_comm_groups(path: Path | None) -> dict[str, tuple[int, ...]]:
    """ASTRA-sim's ``--comm-group-configuration`` JSON: ``{"1": [0, 2], ...}``."""
    if path is None:
        return {}
    try:
        data = json.loads(read_text(path, "communicator-group file"))
        groups = {str(k): tuple(int(r) for r in v) for k, v in data.items()}
    except OSError as e:
        raise PlannerUsageError(f"{path}: cannot read ({e.strerror or e})") from None
    except (ValueError, TypeError, AttributeError):
        raise PlannerUsageError(f"{path}: not a communicator-group file; write a JSON object of"
                                ' group id -> ranks, e.g. {"1": [0, 1]}') from None
    return groups


def _side(node: Any, name: str) -> tuple[tuple[str, int], ...]:
    values = attr_value(node, name, [])
    if not isinstance(values, list):
        return ()
    return tuple((str(values[i]), int(values[i + 1])) for i in range(0, len(values) - 1, 2))


def _where(path: Path, node: Any) -> str:
    return f"{path}: node {node.id} ({node.name or 'unnamed'})"


def _node(path: Path, npu: int, npus: int, node: Any, index: int,
          groups: dict[str, tuple[int, ...]]) -> tuple[Node, str | None]:
    """The simcore node of one Chakra node (ids re-numbered by ``index``; deps later), and its
    communicator group's name for a collective."""
    kind_name = NODE_TYPES[node.type] if node.type < len(NODE_TYPES) else "?"
    if kind_name not in _KINDS:
        raise PlannerUsageError(f"{_where(path, node)}: {kind_name} nodes (remote memory) are"
                                " not replayed (ASTRA-sim 518bd51 itself stops on them after the"
                                " run: Statistics::extract_comp_comm_overlap takes GPU and COMM"
                                " nodes only)")
    kind = _KINDS[kind_name]
    if kind_name == "COMP_NODE" and bool(attr_value(node, "is_cpu_op", False)):
        raise PlannerUsageError(f"{_where(path, node)}: CPU operators (is_cpu_op) are not"
                                " replayed (ASTRA-sim 518bd51 itself stops on them after the run:"
                                " Statistics::extract_comp_comm_overlap takes GPU and COMM nodes"
                                " only)")
    out = Node(index, kind, node.name, inputs=_side(node, "inputs"),
               outputs=_side(node, "outputs"))
    if kind_name in ("METADATA_NODE", "INVALID_NODE"):
        out.duration_us = SKIPPED
        return out, None
    if kind_name == "COMM_COLL_NODE" and attr_value(node, "comm_size") is None:
        out.kind, out.duration_us = NodeKind.COMP, SKIPPED  # as ASTRA-sim at the tutorial
        return out, None
    if kind is NodeKind.COMP:
        out.num_ops = int(attr_value(node, "num_ops", 0) or 0)
        out.tensor_size = int(attr_value(node, "tensor_size", 0) or 0)
        out.duration_us = int(node.duration_micros)
        return out, None
    out.size = int(attr_value(node, "comm_size", 0) or 0)
    if kind is NodeKind.COLL:
        number = int(attr_value(node, "comm_type", 0) or 0)
        if number not in _COLLECTIVES:
            name = COLLECTIVE_TYPES[number] if number < len(COLLECTIVE_TYPES) else number
            raise PlannerUsageError(f"{_where(path, node)}: collective {name} is not replayed;"
                                    " all-reduce, all-gather, reduce-scatter and all-to-all are")
        out.collective = _COLLECTIVES[number]
        pg = str(attr_value(node, "pg_name", "") or "")
        if pg not in _WHOLE and pg not in groups:
            raise PlannerUsageError(f"{_where(path, node)}: communicator group {pg!r} is not in"
                                    " the comm-group file; pass --comm-group FILE")
        out.axis = pg if pg not in _WHOLE else ""
        return out, out.axis
    peer = attr_value(node, "comm_dst" if kind is NodeKind.SEND else "comm_src")
    if peer is None or not 0 <= int(peer) < npus or int(peer) == npu:
        raise PlannerUsageError(f"{_where(path, node)}: its peer NPU {peer} is not another of"
                                f" the {npus} NPUs")
    out.link = int(peer)  # the peer for now; the transfer's index after matching
    return out, None


def trace_graphs(paths: list[Path], traces: list[Trace],
                 groups: dict[str, tuple[int, ...]]) -> list[RankGraph]:
    """One graph per NPU (``traces[i]`` is NPU i), sends matched with receives."""
    npus = len(traces)
    graphs: list[tuple[list[Node], dict[str, tuple[int, ...]]]] = []
    transfers: dict[tuple[int, int, int], list[list[tuple[int, Node]]]] = defaultdict(
        lambda: [[], []])
    for npu, (path, trace) in enumerate(zip(paths, traces)):
        index = {n.id: i for i, n in enumerate(trace.nodes)}
        if len(index) != len(trace.nodes):
            raise PlannerUsageError(f"{path}: two nodes share an id")
        nodes: list[Node] = []
        own = {"": tuple(range(npus))}
        for i, chakra in enumerate(trace.nodes):
            node, pg = _node(path, npu, npus, chakra, i, groups)
            if pg:
                own[pg] = groups[pg]
                if npu not in groups[pg]:
                    raise PlannerUsageError(f"{_where(path, chakra)}: NPU {npu} is not in its"
                                            f" communicator group {pg} {list(groups[pg])}")
            for dep in (*chakra.data_deps, *chakra.ctrl_deps):
                if dep not in index:
                    raise PlannerUsageError(f"{_where(path, chakra)}: depends on node {dep},"
                                            " which is not in the trace")
                if index[dep] not in node.deps:
                    node.deps.append(index[dep])
            if node.kind in (NodeKind.SEND, NodeKind.RECV):
                tag = int(attr_value(chakra, "comm_tag", 0) or 0)
                src, dst = (npu, node.link) if node.kind is NodeKind.SEND else (node.link, npu)
                transfers[(src, dst, tag)][node.kind is NodeKind.RECV].append((npu, node))
            nodes.append(node)
        graphs.append((nodes, own))
    peers: list[dict[int, int]] = [{} for _ in range(npus)]
    for link, ((src, dst, tag), (sends, recvs)) in enumerate(sorted(transfers.items())):
        if len(sends) != len(recvs):
            raise PlannerUsageError(f"NPU {src} -> NPU {dst} tag {tag}: {len(sends)} sends but"
                                    f" {len(recvs)} receives; every send needs its receive")
        for k, ((_, send), (_, recv)) in enumerate(zip(sends, recvs)):
            send.link = recv.link = link * (1 << 20) + k
            peers[src][send.link] = dst
            peers[dst][recv.link] = src
    return [RankGraph(npu, npu, tuple(nodes), own, peers[npu])
            for npu, (nodes, own) in enumerate(graphs)]
