from __future__ import annotations

from simcore.network import Collective

from ._base import BaseCollective, Costs, Link


def ring_steps(op: Collective, n: int, chunk_bytes: int) -> tuple[int, int, int]:
    """``(sends per chunk, reduce steps among them, message bytes)`` of a ring of n NPUs
    (ASTRA-sim ``Ring.cc``); the reduce steps come first."""
    if op is Collective.ALL_REDUCE:
        return 2 * (n - 1), n - 1, chunk_bytes // n
    if op is Collective.REDUCE_SCATTER:
        return n - 1, n - 1, chunk_bytes // n
    if op is Collective.ALL_GATHER:
        return n - 1, 0, chunk_bytes
    return n * (n - 1) // 2, 0, chunk_bytes // n


class RingCollective(BaseCollective):
    """ASTRA-sim ``Ring``: each NPU sends to its ring neighbour; every receive triggers the next
    send, and each step costs one message, one hand-off ``e`` and, on reduce steps, a reduction
    ``R``. With ``m = D / n`` (NOTES.md section 3.2; ASTRA-sim ``Ring.cc``):

    - all-reduce: ``e + 2(n-1)(S(m) + e) + (n-1) R(m)``
    - reduce-scatter: ``e + (n-1)(S(m) + e + R(m))``
    - all-gather: ``e + (n-1)(S(D) + e)``
    - all-to-all: ``e + n(n-1)/2 (S(m) + e)``
    """

    name = "ring"

    def phase_ns(self, op: Collective, n: int, data_bytes: int, link: Link, costs: Costs) -> int:
        e = costs.endpoint_ns
        if op is Collective.ALL_GATHER:
            return e + (n - 1) * (link.send_ns(1, data_bytes) + e)
        m = data_bytes // n
        step = link.send_ns(1, m) + e
        if op is Collective.ALL_REDUCE:
            return e + 2 * (n - 1) * step + (n - 1) * costs.reduce_ns(m)
        if op is Collective.REDUCE_SCATTER:
            return e + (n - 1) * (step + costs.reduce_ns(m))
        return e + n * (n - 1) // 2 * step
