from __future__ import annotations

from collections.abc import Callable

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
        return self.phase_fn(op, n, link, costs)(data_bytes)

    def phase_fn(self, op: Collective, n: int, link: Link, costs: Costs) -> Callable[[int], int]:
        e, reduce = costs.endpoint_ns, costs.reduce_ns
        latency, bytes_per_ns = link.message_terms(1)  # S(b) = int(latency + b / bytes_per_ns)
        if op is Collective.ALL_GATHER:
            return lambda d: e + (n - 1) * (int(latency + d / bytes_per_ns) + e)
        if op is Collective.ALL_REDUCE:
            def all_reduce(d: int) -> int:
                m = d // n
                return e + 2 * (n - 1) * (int(latency + m / bytes_per_ns) + e) + (n - 1) * reduce(m)
            return all_reduce
        if op is Collective.REDUCE_SCATTER:
            def reduce_scatter(d: int) -> int:
                m = d // n
                return e + (n - 1) * (int(latency + m / bytes_per_ns) + e + reduce(m))
            return reduce_scatter
        steps = n * (n - 1) // 2
        return lambda d: e + steps * (int(latency + d // n / bytes_per_ns) + e)
