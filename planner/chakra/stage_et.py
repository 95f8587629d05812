"""The ``stage`` convention's traces as Chakra files: what STAGE recomp writes, without STAGE.

One trace per NPU from :func:`simcore.stage.build_model` (one representative graph per pipeline
stage; every rank of a stage runs it with its own communicator groups and pipeline peers). The
node attributes are STAGE's (STAGE recomp 0b44904d ``symbolic_tensor_graph/chakra/backends/
chakra_00_4_backend/chakra_00_4_backend.py``, with ``ConvertChakra.with_comm_info`` on, as the
lab runs it; shared reference NOTES.md section 1.3):

- compute: ``num_ops`` (int64, MACs) and ``tensor_size`` (uint64, elements);
- collective: ``comm_size`` (int64, elements), ``comm_type`` (int64, Chakra's enum),
  ``pg_name`` (the communicator group's id in ``comm_group.json``), ``is_cpu_op`` 0;
- send / receive: ``comm_size``, ``comm_tag``, ``comm_dst`` / ``comm_src`` (int32),
  ``is_cpu_op`` 0;
- every node: ``inputs`` / ``outputs`` as a string list of (tensor name, elements) pairs, which
  ASTRA-sim's local-memory tracker reads.

Where this differs from STAGE's own files, and why it does not change what ASTRA-sim does:
node ids are this project's (STAGE's order kept, so ASTRA-sim issues ready nodes in the same
order); STAGE's control dependencies (recompute, chained collectives) are written as data
dependencies, which ASTRA-sim's feeder resolves alike (astra-sim/chakra@f37c2bb
``src/feeder_v3/common.h`` lines 22-23); tags count transfers from 0 instead of from a random
number; group ids number the groups in rank order instead of STAGE's enumeration.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from planner.chakra.io import TraceProgress, encode_traces, trace_bytes
from planner.chakra.nodes import chakra_node, comm_group_text, number_groups
from planner.chakra.schema import message_class
from simcore.stage import NodeKind, RankGraph, StageModel
from simcore.stage._args import coordinates_of, rank_of, stage_groups

__all__ = ["COMM_GROUP_FILE", "comm_groups", "rank_traces", "stage_trace_files",
           "write_stage_traces"]

COMM_GROUP_FILE = "comm_group.json"
STAGE_SCHEMA = {"schema": "parallel_planner stage convention (STAGE recomp graph)"}


def _groups(model: StageModel, npu: int) -> dict[str, tuple[int, ...]]:
    pos, dp, tp, sp = coordinates_of(model.args, npu)
    return stage_groups(model.args, pos, dp, tp, sp)


def comm_groups(model: StageModel) -> dict[tuple[int, ...], int]:
    """Every communicator group of more than one NPU, numbered from 1 in rank order."""
    return number_groups(g for npu in range(model.args.npus)
                         for g in _groups(model, npu).values())


def _peer(model: StageModel, graph: RankGraph, npu: int, link: int) -> int:
    """The NPU at the other end of pipeline transfer ``link`` for ``npu``: the same (dp, tp, sp)
    coordinates on the other stage."""
    _, dp, tp, sp = coordinates_of(model.args, npu)
    other, _, _, _ = coordinates_of(model.args, graph.peers[link])
    return rank_of(model.args, other, dp, tp, sp)


def _io(attr: Any, name: str, side: tuple[tuple[str, int], ...]) -> Any:
    values = [str(v) for entry in side for v in entry]
    return attr(name=name, string_list=message_class("StringList")(values=values))


def rank_traces(model: StageModel, npu: int, groups: dict[tuple[int, ...], int]
                ) -> Iterator[Any]:
    """The Chakra nodes of ``npu``'s trace."""
    attr = message_class("AttributeProto")
    pos, *_ = coordinates_of(model.args, npu)
    graph = model.ranks[pos]
    own = _groups(model, npu)
    for n in graph.nodes:
        if n.kind is NodeKind.COLL:
            assert n.axis is not None
            out = chakra_node(n, group=groups[own[n.axis]])
        elif n.kind is NodeKind.COMP:
            out = chakra_node(n)
            out.attr.extend([attr(name="num_ops", int64_val=n.num_ops),
                             attr(name="tensor_size", uint64_val=n.tensor_size)])
        else:
            out = chakra_node(n, tag=n.link, peer=_peer(model, graph, npu, n.link))
        out.attr.extend([_io(attr, "inputs", n.inputs), _io(attr, "outputs", n.outputs)])
        yield out


def stage_trace_files(model: StageModel, name: str, progress: TraceProgress | None = None
                      ) -> dict[str, bytes | str]:
    """``{name.<npu>.et: bytes, comm_group.json: text}`` for every NPU; ``progress`` hears of
    each trace file encoded."""
    groups = comm_groups(model)

    def encoder(npu: int) -> Callable[[], bytes]:
        return lambda: trace_bytes(rank_traces(model, npu, groups), STAGE_SCHEMA)

    files: dict[str, bytes | str] = dict(encode_traces(
        [(f"{name}.{npu}.et", encoder(npu)) for npu in range(model.args.npus)], progress))
    files[COMM_GROUP_FILE] = comm_group_text(groups)
    return files


def write_stage_traces(model: StageModel, folder: Path, name: str) -> list[Path]:
    """``folder/name.<npu>.et`` for every NPU and ``folder/comm_group.json``; the paths
    written. The traces of an earlier, larger set in the folder (``name.<n>.et`` past this
    one's NPUs) are removed: ``planner replay folder/name`` reads every one there, and refused
    the set as one of more NPUs than its network has."""
    from planner.outputs import write_files

    folder.mkdir(parents=True, exist_ok=True)
    written = write_files(folder, stage_trace_files(model, name))
    mine = {p.name for p in written}
    for stale in folder.glob(f"{name}.*.et"):
        npu = stale.name.removeprefix(f"{name}.").removesuffix(".et")
        if npu.isdigit() and stale.name not in mine:
            stale.unlink()
    return written
