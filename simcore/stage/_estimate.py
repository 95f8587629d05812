"""``astra_estimate``: what STAGE recomp + ASTRA-sim (analytical, congestion-unaware) report."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from simcore.collectives import Congestion, collective_time, p2p_time
from simcore.network import Collective, Network
from simcore.stage._args import StageArgs
from simcore.stage._graph import Node, NodeKind, RankGraph, build_model
from simcore.stage._replay import RankTimes, replay, roofline_ns

__all__ = ["Inventory", "StageResult", "astra_estimate", "inventory"]


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


_SHORT = {
    Collective.ALL_REDUCE: "AR",
    Collective.ALL_GATHER: "AG",
    Collective.REDUCE_SCATTER: "RS",
    Collective.ALL_TO_ALL: "A2A",
}


def inventory(graph: RankGraph) -> Inventory:
    counts: dict[str, int] = {}

    def add(key: str, size: int) -> None:
        counts[f"n_{key}"] = counts.get(f"n_{key}", 0) + 1
        counts[f"{key}_size"] = counts.get(f"{key}_size", 0) + size

    ops = tensor = comps = 0
    for n in graph.nodes:
        if n.kind is NodeKind.COMP:
            comps += 1
            ops += n.num_ops
            tensor += n.tensor_size
        elif n.kind is NodeKind.COLL:
            assert n.collective is not None
            add(_SHORT[n.collective], n.size)
        else:
            add("send" if n.kind is NodeKind.SEND else "recv", n.size)
    fields = {k: counts.get(k, 0) for k in Inventory.__slots__}  # type: ignore[attr-defined]
    fields.update(n_comp=comps, sum_num_ops=ops, sum_tensor_size=tensor)
    return Inventory(**fields)


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

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__slots__ if k != "et0"}  # type: ignore[attr-defined]
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
    model = build_model(args)
    comp_cache: dict[tuple[int, int], int] = {}
    coll_cache: dict[tuple[Collective, int, tuple[int, ...]], int] = {}
    p2p_cache: dict[tuple[int, int, int], int] = {}

    def comp_ns(node: Node) -> int:
        key = (node.num_ops, node.tensor_size)
        t = comp_cache.get(key)
        if t is None:
            t = comp_cache[key] = roofline_ns(node.num_ops, node.tensor_size, peak_ops_per_s,
                                              local_mem_bytes_per_s)
        return t

    def coll_ns(graph: RankGraph, node: Node) -> int:
        assert node.collective is not None and node.axis is not None
        group = graph.groups[node.axis]
        key = (node.collective, node.size, group)
        t = coll_cache.get(key)
        if t is None:
            t = coll_cache[key] = collective_time(
                network, node.collective, node.size, group=list(group),
                congestion=Congestion.UNAWARE,
            ).time_ns
        return t

    def p2p_ns(src: int, dst: int, size: int) -> int:
        key = (src, dst, size)
        t = p2p_cache.get(key)
        if t is None:
            t = p2p_cache[key] = round(p2p_time(network, src, dst, size) * 1e9)
        return t

    times: list[RankTimes] = replay(model.ranks, comp_ns, coll_ns, p2p_ns)
    first = times[0]
    return StageResult(
        wall_time=first.wall_time,
        gpu_time=first.gpu_time,
        comm_time=first.comm_time,
        exposed_comm=first.exposed_comm,
        peak_memory_usage=first.peak_memory_usage,
        max_wall_time_all_ranks=max(t.wall_time for t in times),
        max_peak_memory_all_ranks=max(t.peak_memory_usage for t in times),
        et0=inventory(model.ranks[0]),
    )
