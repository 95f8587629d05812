"""How NCCL uses a cluster's network cards: pipeline sends, and rings across nodes.

A dimension between nodes that gives a send rate (``NetworkDim.p2p_bandwidth_bytes_per_s``:
what one GPU's share of its node's NICs carries, 24 GB/s per 200G NIC as NCCL's maintainer puts
it, NVIDIA/nccl-tests issue 119) is a cluster's link, timed as NCCL drives it:

- a pipeline's sends cross the boundaries they cross at that rate (:func:`send_mean`);
- an all-reduce, reduce-scatter or all-gather may also run as NCCL's flat ring over every rank
  of the group (:func:`flat_ring`), whose time does not grow with the number of nodes, where the
  hierarchical schedule's step between nodes does. NCCL's tuner takes the faster algorithm;
  the caller takes the lesser of the two times.

A network whose outermost dimension gives no send rate (ASTRA-sim's own systems) is timed as
ASTRA-sim times it; nothing here applies.
"""

from __future__ import annotations

from dataclasses import replace

from simcore.collectives import p2p_time
from simcore.network import Collective, Network, NetworkDim, Topology


def is_cluster(network: Network) -> bool:
    """Whether the network's outermost dimension is a cluster's link with a send rate."""
    return network.dims[-1].p2p_bandwidth_bytes_per_s is not None


def send_mean(network: Network, size: int) -> float:
    """Seconds of one of a pipeline stage's sends (:meth:`AxisNetworks.p2p`): the mean of a send
    across the outermost and across the innermost dimension (one send across the only
    dimension of a one-dimension network), each at its send bandwidth plus its call latency;
    a send to the next rank when the outermost dimension gives no send rate."""
    if not is_cluster(network):
        return (p2p_time(network, 0, 1, size, congestion=network.congestion)
                + network.dims[0].call_latency_s)
    sends = Network(dims=tuple(d.for_sends() for d in network.dims),
                    scheduling=network.scheduling, congestion=network.congestion)
    outer = network.npus // network.dims[-1].npus  # rank 0 and this differ in the last only
    times = [p2p_time(sends, 0, dst, size, congestion=network.congestion)
             + network.dims[0 if dst == 1 else -1].call_latency_s
             for dst in {1, outer}]
    return sum(times) / len(times)


_RING_SENDS = {Collective.ALL_REDUCE: 2, Collective.REDUCE_SCATTER: 1, Collective.ALL_GATHER: 1}
"""Passes of the ring: an all-reduce is a reduce-scatter then an all-gather."""


def flat_ring(network: Network, collective: Collective, size: int) -> float | None:
    """Seconds of the collective as NCCL's ring over all ``n`` ranks of the group, spread over
    ``N`` nodes of ``g`` ranks each (``size`` as ASTRA-sim takes it: the whole tensor, the
    per-rank input for an all-gather); None where it does not apply (not a cluster's link,
    one dimension of one node, an all-to-all).

    Each rank sends ``passes (n - 1) / n`` of the tensor round the ring. Every GPU sends that
    over its link inside the node, and a node's NICs carry it once for the node's ``g`` ranks
    (the rings' channels spread over them), so the ring runs at the lesser of the innermost
    link and ``g`` times the send rate. Its steps each wait a hop: ``passes (n - 1)`` steps, of
    which the share ``N / n`` cross between nodes (NCCL's tuner counts a ring's latency so).
    Two DGX A100s (8 x 24 GB/s a node): a bus bandwidth of 192 GB/s, as OCI measured with NCCL's
    ring forced (189 GB/s); three nodes of 4 HDR NICs: 96 GB/s, as nccl-tests issue 119."""
    passes = _RING_SENDS.get(collective)
    outer = network.dims[-1]
    if passes is None or outer.p2p_bandwidth_bytes_per_s is None:
        return None
    n, nodes = network.npus, outer.npus
    per_node = n // nodes
    tensor = size * n if collective is Collective.ALL_GATHER else size
    rate = per_node * outer.p2p_bandwidth_bytes_per_s
    inner = network.dims[:-1]
    if inner:
        rate = min(rate, *(d.bandwidth_bytes_per_s for d in inner))
    steps = passes * (n - 1)
    crossing = steps * nodes / n
    hop_outer = _hop(outer)
    hop_inner = _hop(inner[0]) if inner else hop_outer
    return (passes * (n - 1) / n * tensor / rate
            + crossing * hop_outer + (steps - crossing) * hop_inner)


def _hop(dim: NetworkDim) -> float:
    """Latency of one message between two ranks of the dimension (its route's hops)."""
    if dim.topology in (Topology.MESH_2D, Topology.TORUS_2D):
        dim = replace(dim, topology=Topology.RING, npus=2, width=None)
    elif dim.npus != 2:
        dim = replace(dim, npus=2)
    return p2p_time(Network(dims=(dim,)), 0, 1, 1)
