"""Replay traces that were read, not built: any per-NPU graphs, timed as ASTRA-sim's analytical
(congestion-unaware) backend times them.

Compute nodes take the roofline time when the system enables it (``Workload::issue_comp``;
a node with tensor_size 0 is skipped, taking no time) and otherwise their recorded runtime,
``duration_micros`` x 1000 ns, or 1 ns when it is 0 (``Workload::issue_replay``, astra-sim@518bd513
astra-sim/workload/Workload.cc lines 213-228). Collectives, sends and receives are timed and
scheduled as for STAGE's traces (:mod:`._replay`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from simcore.network import Network
from simcore.stage._estimate import _Durations
from simcore.stage._graph import SKIPPED, Node, RankGraph
from simcore.stage._inventory import RooflineTotals, node_rows, roofline_totals
from simcore.stage._replay import RankTimes, replay

__all__ = ["TraceTimes", "replay_traces"]


@dataclass(frozen=True, slots=True)
class TraceTimes:
    """What ASTRA-sim reports for one NPU: its times and, with the roofline on, its totals for
    the lab's metrics (None when it is off: ASTRA-sim then prints no utilisation)."""

    times: RankTimes
    roofline: RooflineTotals | None


class _TraceDurations(_Durations):
    def __init__(self, network: Network, peak_ops_per_s: float | None,
                 local_mem_bytes_per_s: float) -> None:
        super().__init__(network, peak_ops_per_s or 0.0, local_mem_bytes_per_s)
        self.roofline = peak_ops_per_s is not None

    def comp_ns(self, node: Node) -> int:
        if node.duration_us == SKIPPED:
            return 0
        if not self.roofline:
            return node.duration_us * 1000 if node.duration_us else 1
        if node.tensor_size == 0:
            return 0
        return super().comp_ns(node)


def replay_traces(graphs: Sequence[RankGraph], network: Network, *,
                  peak_ops_per_s: float | None,
                  local_mem_bytes_per_s: float) -> list[TraceTimes]:
    """Replay every NPU's graph together (``graphs[i].rank == i``); ``peak_ops_per_s`` None
    means the roofline is off."""
    if len(graphs) != network.npus:
        raise ValueError(f"{len(graphs)} traces for a network of {network.npus} NPUs; give one"
                         " trace per NPU")
    d = _TraceDurations(network, peak_ops_per_s, local_mem_bytes_per_s)
    times = replay(graphs, d.comp_ns, d.coll_ns, d.p2p_ns)
    out = []
    for graph, t in zip(graphs, times):
        totals = None
        if peak_ops_per_s is not None:
            totals = roofline_totals(node_rows(graph), peak_ops_per_s, local_mem_bytes_per_s)
        out.append(TraceTimes(t, totals))
    return out
