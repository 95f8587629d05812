"""Collectives over a sub-group of ranks: one logical ring, as ASTRA-sim's CommunicatorGroup.

ASTRA-sim builds one ring over the group's NPUs in the order the group lists them, runs ``ring``
on it (forced when the system lists more than one implementation per collective), hands each
packet off in a hard-coded 10 ns, and times every hop ``u -> v`` on the lowest network dimension
in which u and v differ (NOTES.md section 3.4).

Every NPU's next send waits only for its predecessor's message, so the finish time of the NPU at
position ``i`` is a longest path that moves one ring position per step:
``T_i = W (10 + sum_k (10 + red_k)) + (the W*K hop delays met walking backwards from i)``,
with ``W = ceil(chunks / active)`` waves and ``K`` sends per chunk.
"""

from __future__ import annotations

from collections.abc import Sequence

from simcore.network import Collective, Network

from ._base import Costs, Link
from ._ring import ring_steps

GROUP_HANDOFF_NS = 10
"""ASTRA-sim MemBus "Fast" hand-off, used for rings of a communicator group, whatever the
endpoint delay (``MemBus.cc``)."""


def p2p_ns(network: Network, links: Sequence[Link], src: int, dst: int, message_bytes: int) -> int:
    """One message from ``src`` to ``dst``, timed on the lowest dimension where they differ."""
    dim = network.lowest_differing_dim(src, dst)
    a, b = network.address(src)[dim], network.address(dst)[dim]
    link = links[dim]
    return link.message_ns(link.topology.hops(a, b), message_bytes)


def group_ring_ns(
    network: Network,
    links: Sequence[Link],
    op: Collective,
    group: Sequence[int],
    chunk_bytes: int,
    n_waves: int,
    costs: Costs,
    rank: int,
) -> int:
    """Finish time on ``rank`` of a ring collective over ``group`` (in the order listed)."""
    n = len(group)
    sends, reduce_steps, message = ring_steps(op, n, chunk_bytes)
    per_wave = GROUP_HANDOFF_NS * (1 + sends) + reduce_steps * costs.reduce_ns(message)
    hop_into = [p2p_ns(network, links, group[i - 1], group[i], message) for i in range(n)]
    moves = n_waves * sends
    laps, rest = divmod(moves, n)
    pos = group.index(rank)
    walk = laps * sum(hop_into) + sum(hop_into[(pos - j) % n] for j in range(rest))
    return n_waves * per_wave + walk
