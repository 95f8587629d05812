"""Counts and summed sizes of one rank's trace (what ASTRA-sim's et0_* statistics count)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from simcore.network import Collective
from simcore.stage._graph import NodeKind, RankGraph

__all__ = ["Inventory", "inventory", "inventory_of"]


@dataclass(frozen=True, slots=True)
class Inventory:
    """Counts and summed sizes of one rank's trace (elements; MACs for ``sum_num_ops``)."""

    n_comp: int
    sum_num_ops: int
    sum_tensor_size: int
    n_AR: int
    AR_size: int
    n_AG: int
    AG_size: int
    n_RS: int
    RS_size: int
    n_A2A: int
    A2A_size: int
    n_send: int
    send_size: int
    n_recv: int
    recv_size: int


_FIELDS = {
    Collective.ALL_REDUCE: ("n_AR", "AR_size"),
    Collective.ALL_GATHER: ("n_AG", "AG_size"),
    Collective.REDUCE_SCATTER: ("n_RS", "RS_size"),
    Collective.ALL_TO_ALL: ("n_A2A", "A2A_size"),
}
"""Per collective, its count and size fields (sends and receives: ``n_send``, ...)."""


def inventory(graph: RankGraph) -> Inventory:
    return inventory_of((n.kind, n.collective, n.num_ops, n.tensor_size, n.size)
                        for n in graph.nodes)


def inventory_of(nodes: Iterable[tuple[NodeKind, Collective | None, int, int, int]]
                 ) -> Inventory:
    """The inventory of nodes given as (kind, collective, num_ops, tensor_size, size)."""
    counts = dict.fromkeys(Inventory.__slots__, 0)  # type: ignore[attr-defined]
    for kind, collective, num_ops, tensor_size, size in nodes:
        if kind is NodeKind.COMP:
            counts["n_comp"] += 1
            counts["sum_num_ops"] += num_ops
            counts["sum_tensor_size"] += tensor_size
            continue
        if kind is NodeKind.COLL:
            assert collective is not None
            count, total = _FIELDS[collective]
        elif kind is NodeKind.SEND:
            count, total = "n_send", "send_size"
        else:
            count, total = "n_recv", "recv_size"
        counts[count] += 1
        counts[total] += size
    return Inventory(**counts)
