"""``astra_estimate``: what STAGE recomp + ASTRA-sim (analytical, congestion-unaware) report."""

from __future__ import annotations

import gc
from dataclasses import asdict, dataclass, replace
from typing import Any

from simcore.collectives import Congestion, collective_time, p2p_time
from simcore.network import Collective, Network, PerNetwork
from simcore.stage._args import StageArgs
from simcore.stage._fast import repeated_inventory, repeated_rank
from simcore.stage._graph import Node, RankGraph, build_model
from simcore.stage._inventory import (
    Inventory,
    RooflineTotals,
    inventory,
    inventory_of,
    node_rows,
    roofline_totals,
)
from simcore.stage._replay import RankTimes, replay, replay_flat, roofline_ns
from simcore.stage._symbolic import rank0, rank0_graph

__all__ = ["Inventory", "StageResult", "astra_estimate", "inventory", "model_num_ops"]


@dataclass(frozen=True, slots=True)
class StageResult:
    """ASTRA-sim's report for sys[0] (rank 0), the worst rank, and rank 0's trace inventory.

    Times in ns, memory in the tracker's units (elements), as ASTRA-sim prints them."""

    wall_time: int
    gpu_time: int
    comm_time: int
    exposed_comm: int
    peak_memory_usage: int
    max_wall_time_all_ranks: int
    max_peak_memory_all_ranks: int
    et0: Inventory
    roofline: RooflineTotals
    """sys[0]'s compute nodes, for the lab's metrics (:meth:`metrics`)."""

    def metrics(self) -> dict[str, float]:
        """Compute-bound %, average compute and memory utilisation % and operation intensity
        of sys[0], as ASTRA-sim prints them."""
        return self.roofline.metrics()

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__slots__  # type: ignore[attr-defined]
             if k not in ("et0", "roofline")}
        d.update(self.metrics())
        d["et0"] = asdict(self.et0)
        return d


def astra_estimate(
    args: StageArgs,
    network: Network,
    *,
    peak_ops_per_s: float,
    local_mem_bytes_per_s: float,
) -> StageResult:
    """Build the traces STAGE recomp writes for ``args`` and replay them as ASTRA-sim would on
    ``network`` with the roofline ``peak_ops_per_s`` (1 MAC = 1 op) and
    ``local_mem_bytes_per_s`` (1 element = 1 byte)."""
    if args.npus != network.npus:
        raise ValueError(
            f"`dp * tp * sp * pp == NPUs` must hold, but got dp={args.dp}, tp={args.tp},"
            f" sp={args.sp}, pp={args.pp} (product {args.npus}) and {network.npus} NPUs"
        )
    if not (peak_ops_per_s > 0 and local_mem_bytes_per_s > 0):
        raise ValueError("the roofline needs peak_ops_per_s > 0 and local_mem_bytes_per_s > 0")
    durations = _Durations(network, peak_ops_per_s, local_mem_bytes_per_s)
    paused = gc.isenabled()
    if paused:  # tens of thousands of small objects that all live until we return
        gc.disable()
    try:
        times, inv, totals = _replayed(args, durations)
    finally:
        if paused:
            gc.enable()
    return _result(times, inv, totals)


def model_num_ops(args: StageArgs) -> int:
    """Rank 0's multiply-accumulates without activation recompute: the model's work, forward
    and backward once. STAGE's recompute adds ops to the trace (``q_recomp``, ``k_recomp``,
    ``v_recomp``, ``qk_recomp`` per attention block, ``x1_recomp`` per feed-forward block:
    :mod:`._templates`), forward ops run again; ``StageResult.et0.sum_num_ops`` counts them."""
    plain = replace(args, activation_recompute=False)
    fast = repeated_inventory(plain)  # a long model from its short one, as the replay does
    if fast is not None:
        return fast.sum_num_ops
    rank = rank0(plain)  # the layout's symbolic graph: no nodes built
    if rank is None:
        return inventory(rank0_graph(plain)).sum_num_ops
    return inventory_of(rank.inventory_rows()).sum_num_ops


_CollectiveTimes = dict[tuple[Collective, int, tuple[int, ...]], int]
_COLLECTIVE_TIMES: PerNetwork[_CollectiveTimes] = PerNetwork(lambda _: {})


def _collective_times(network: Network) -> _CollectiveTimes:
    """The collective times known for ``network`` from earlier estimates: a time is a pure
    function of the network (an immutable value) and the key, so they are kept for as long as
    the network lives."""
    times = _COLLECTIVE_TIMES(network)
    if len(times) > 1 << 16:  # a bound, not expected to be reached
        times.clear()
    return times


class _Durations:
    """Compute, collective and point-to-point times, each evaluated once per distinct key."""

    def __init__(self, network: Network, peak_ops_per_s: float,
                 local_mem_bytes_per_s: float) -> None:
        self.network = network
        self.peak = peak_ops_per_s
        self.mem = local_mem_bytes_per_s
        self.comp_cache: dict[tuple[int, int], int] = {}
        self.coll_cache = _collective_times(network)
        self.p2p_cache: dict[tuple[int, int, int], int] = {}

    def comp_ns(self, node: Node) -> int:
        key = (node.num_ops, node.tensor_size)
        t = self.comp_cache.get(key)
        if t is None:
            t = self.comp_cache[key] = roofline_ns(node.num_ops, node.tensor_size, self.peak,
                                                   self.mem)
        return t

    def coll_ns(self, graph: RankGraph, node: Node) -> int:
        assert node.collective is not None and node.axis is not None
        group = graph.groups[node.axis]
        key = (node.collective, node.size, group)
        t = self.coll_cache.get(key)
        if t is None:
            t = self.coll_cache[key] = collective_time(
                self.network, node.collective, node.size, group=list(group),
                congestion=Congestion.UNAWARE,
            ).time_ns
        return t

    def p2p_ns(self, src: int, dst: int, size: int) -> int:
        key = (src, dst, size)
        t = self.p2p_cache.get(key)
        if t is None:
            t = self.p2p_cache[key] = round(p2p_time(self.network, src, dst, size) * 1e9)
        return t


def _replayed(args: StageArgs, durations: _Durations, *, repeat: bool = True
              ) -> tuple[list[RankTimes], Inventory, RooflineTotals]:
    """Build every rank's graph and replay them all; with ``repeat`` a long single-stage model
    comes from a short one (:mod:`._fast`, the same trace) when that is justified."""
    roofline = (durations.peak, durations.mem)
    if repeat:
        fast = repeated_rank(args, durations.comp_ns, durations.coll_ns, durations.p2p_ns,
                             roofline)
        if fast is not None:
            flat, inv, totals = fast
            return replay_flat([flat]), inv, totals
    model = build_model(args)
    times = replay(model.ranks, durations.comp_ns, durations.coll_ns, durations.p2p_ns)
    rows = node_rows(model.ranks[0])
    return times, inventory_of(rows), roofline_totals(rows, *roofline)


def _result(times: list[RankTimes], inv: Inventory, totals: RooflineTotals) -> StageResult:
    first = times[0]
    return StageResult(
        wall_time=first.wall_time,
        gpu_time=first.gpu_time,
        comm_time=first.comm_time,
        exposed_comm=first.exposed_comm,
        peak_memory_usage=first.peak_memory_usage,
        max_wall_time_all_ranks=max(t.wall_time for t in times),
        max_peak_memory_all_ranks=max(t.peak_memory_usage for t in times),
        et0=inv,
        roofline=totals,
    )
