"""Counts and summed sizes of one rank's trace (what ASTRA-sim's et0_* statistics count)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from simcore.network import Collective
from simcore.stage._graph import NodeKind, RankGraph
from simcore.stage._replay import roofline_ns

__all__ = ["Inventory", "RooflineTotals", "inventory", "inventory_of", "node_rows",
           "roofline_totals"]


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


Row = tuple[NodeKind, Collective | None, int, int, int]
"""A node as the inventory and the roofline totals read it: (kind, collective, num_ops,
tensor_size, size)."""


def node_rows(graph: RankGraph) -> list[Row]:
    return [(n.kind, n.collective, n.num_ops, n.tensor_size, n.size) for n in graph.nodes]


def inventory(graph: RankGraph) -> Inventory:
    return inventory_of(node_rows(graph))


def inventory_of(nodes: Iterable[Row]) -> Inventory:
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


@dataclass(frozen=True, slots=True)
class RooflineTotals:
    """Duration-weighted sums over a rank's compute nodes, as ASTRA-sim's
    ``Statistics::extract_utilizations`` adds them (astra-sim@518bd513
    astra-sim/workload/Statistics.cc lines 222-266; the per-node figures are set in
    ``Workload::issue_comp``, Workload.cc lines 262-278). Additive, so a repeated trace's totals
    are a scaled sum."""

    compute_ns: int = 0
    compute_bound_ns: int = 0
    compute_util_ns: float = 0.0
    memory_util_ns: float = 0.0
    intensity_ns: float = 0.0

    def metrics(self) -> dict[str, float]:
        """The four figures ASTRA-sim prints for sys[i] when the roofline is on: percentages,
        and the operation intensity in ops per byte. ASTRA-sim starts the total compute time at
        1 ns "to avoid division by zero" (Statistics.cc line 227), and so does this."""
        total = self.compute_ns + 1
        return {
            "compute_bound_pct": 100 * self.compute_bound_ns / total,
            "avg_compute_util_pct": 100 * self.compute_util_ns / total,
            "avg_mem_util_pct": 100 * self.memory_util_ns / total,
            "avg_op_intensity": self.intensity_ns / total,
        }


def roofline_totals(rows: Iterable[Row], peak_ops_per_s: float, local_mem_bytes_per_s: float) -> RooflineTotals:
    """The totals of the compute nodes among ``rows`` (kind, collective, num_ops, tensor_size,
    size): each runs ``trunc(num_ops / perf * 1e9)`` ns at perf = min(bw * OI, peak), with
    compute utilisation perf / peak, memory utilisation (perf / OI) / bw and memory-bound when
    perf < peak. Nodes with tensor_size 0 are skipped, as ASTRA-sim skips them."""
    ns = bound = 0
    cu = mu = oi = 0.0
    for kind, _, num_ops, tensor_size, _ in rows:
        if kind is not NodeKind.COMP or tensor_size == 0:
            continue
        intensity = float(num_ops) / float(tensor_size)
        perf = min(local_mem_bytes_per_s * intensity, peak_ops_per_s)
        d = roofline_ns(num_ops, tensor_size, peak_ops_per_s, local_mem_bytes_per_s)
        ns += d
        if not perf < peak_ops_per_s:
            bound += d
        cu += perf / peak_ops_per_s * d
        mu += perf / intensity / local_mem_bytes_per_s * d
        oi += intensity * d
    return RooflineTotals(ns, bound, cu, mu, oi)
