"""The ``megatron`` convention's step (:mod:`simcore.megatron.step_graph`) as Chakra traces.

Node attributes as in :mod:`planner.chakra.stage_et`, except that compute nodes carry their
runtime (``duration_micros``, which ASTRA-sim uses with ``roofline-enabled`` 0,
``Workload::issue_replay``) instead of FLOPs and tensor sizes, communication sizes are bytes,
and there are no ``inputs`` / ``outputs`` (the estimate's memory is not a tensor-liveness
replay). Sends and receives of one transfer share their ``comm_tag``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from planner.chakra.io import TraceProgress, encode_traces, trace_bytes
from planner.chakra.nodes import chakra_node, comm_group_text, number_groups
from planner.chakra.stage_et import COMM_GROUP_FILE
from simcore.megatron.step_graph import StepGraphs
from simcore.stage import NodeKind, RankGraph

__all__ = ["STEP_SCHEMA", "step_comm_groups", "step_trace_files"]

STEP_SCHEMA = {"schema": "parallel_planner megatron convention (one training step)"}


def step_comm_groups(steps: StepGraphs) -> dict[tuple[int, ...], int]:
    """Every communicator group of more than one NPU, numbered from 1 in rank order."""
    return number_groups(g for graph in steps.graphs for g in graph.groups.values())


def _nodes(graph: RankGraph, groups: dict[tuple[int, ...], int], replicas: int
           ) -> Iterator[Any]:
    for n in graph.nodes:
        if n.kind is NodeKind.COLL:
            assert n.axis is not None
            yield chakra_node(n, group=groups[graph.groups[n.axis]])
        elif n.kind is NodeKind.COMP:
            out = chakra_node(n)
            out.duration_micros = n.duration_us
            out.attr.add(name="is_cpu_op", int32_val=0)
            yield out
        else:
            yield chakra_node(n, tag=n.link // replicas, peer=graph.peers[n.link])


def step_trace_files(steps: StepGraphs, name: str, progress: TraceProgress | None = None
                     ) -> dict[str, bytes | str]:
    """``{name.<npu>.et: bytes, comm_group.json: text}`` for every NPU; ``progress`` hears of
    each trace file encoded."""
    groups = step_comm_groups(steps)

    def encoder(g: RankGraph) -> Callable[[], bytes]:
        return lambda: trace_bytes(_nodes(g, groups, steps.replicas), STEP_SCHEMA)

    files: dict[str, bytes | str] = dict(encode_traces(
        [(f"{name}.{g.rank}.et", encoder(g)) for g in steps.graphs], progress))
    files[COMM_GROUP_FILE] = comm_group_text(groups)
    return files
