"""The ``megatron`` convention's step (:mod:`simcore.megatron.step_graph`) as Chakra traces.

Node attributes as in :mod:`planner.chakra.stage_et`, except that compute nodes carry their
runtime (``duration_micros``, which ASTRA-sim uses with ``roofline-enabled`` 0,
``Workload::issue_replay``) instead of FLOPs and tensor sizes, communication sizes are bytes,
and there are no ``inputs`` / ``outputs`` (the estimate's memory is not a tensor-liveness
replay). Sends and receives of one transfer share their ``comm_tag``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from planner.chakra.io import trace_bytes
from planner.chakra.schema import COLLECTIVE_TYPES, message_class
from planner.chakra.stage_et import COMM_GROUP_FILE, comm_group_text
from simcore.megatron.step_graph import StepGraphs
from simcore.network import Collective
from simcore.stage import NodeKind, RankGraph

__all__ = ["STEP_SCHEMA", "step_comm_groups", "step_trace_files"]

STEP_SCHEMA = {"schema": "parallel_planner megatron convention (one training step)"}

_NODE_TYPE = {NodeKind.COMP: 4, NodeKind.SEND: 5, NodeKind.RECV: 6, NodeKind.COLL: 7}
_COMM_TYPE = {c: COLLECTIVE_TYPES.index(c.name) for c in Collective}


def step_comm_groups(steps: StepGraphs) -> dict[tuple[int, ...], int]:
    """Every communicator group of more than one NPU, numbered from 1 in rank order."""
    found = sorted({g for graph in steps.graphs for g in graph.groups.values() if len(g) > 1})
    return {g: i for i, g in enumerate(found, start=1)}


def _nodes(graph: RankGraph, groups: dict[tuple[int, ...], int], replicas: int
           ) -> Iterator[Any]:
    node_cls, attr = message_class("Node"), message_class("AttributeProto")
    for n in graph.nodes:
        out = node_cls(id=n.id + 1, name=n.name, type=_NODE_TYPE[n.kind],
                       data_deps=[d + 1 for d in n.deps])
        if n.kind is NodeKind.COMP:
            out.duration_micros = n.duration_us
            out.attr.append(attr(name="is_cpu_op", int32_val=0))
        elif n.kind is NodeKind.COLL:
            assert n.collective is not None and n.axis is not None
            out.attr.extend([attr(name="comm_size", int64_val=n.size),
                             attr(name="comm_type", int64_val=_COMM_TYPE[n.collective]),
                             attr(name="pg_name", string_val=str(groups[graph.groups[n.axis]])),
                             attr(name="is_cpu_op", int32_val=0)])
        else:
            side = "comm_dst" if n.kind is NodeKind.SEND else "comm_src"
            out.attr.extend([attr(name="comm_size", int64_val=n.size),
                             attr(name="comm_tag", int32_val=n.link // replicas),
                             attr(name=side, int32_val=graph.peers[n.link]),
                             attr(name="is_cpu_op", int32_val=0)])
        yield out


def step_trace_files(steps: StepGraphs, name: str) -> dict[str, bytes | str]:
    """``{name.<npu>.et: bytes, comm_group.json: text}`` for every NPU."""
    groups = step_comm_groups(steps)
    files: dict[str, bytes | str] = {
        f"{name}.{g.rank}.et": trace_bytes(_nodes(g, groups, steps.replicas), STEP_SCHEMA)
        for g in steps.graphs}
    files[COMM_GROUP_FILE] = comm_group_text(groups)
    return files
