from __future__ import annotations

from collections.abc import Callable

from simcore.network import Collective

from ._base import BaseCollective, Costs, Link


def _log2(n: int) -> int:
    steps = n.bit_length() - 1
    if n < 2 or 1 << steps != n:
        raise ValueError(f"halvingDoubling needs a power-of-two number of NPUs, but got {n}")
    return steps


class HalvingDoublingCollective(BaseCollective):
    """ASTRA-sim ``HalvingDoubling`` on n = 2^L NPUs: recursive halving with the partner at
    distance 1, 2, ..., n/2 (reduce-scatter), recursive doubling back (all-gather).

    Messages halve, ``m_k = trunc(D / 2^k)``. Two quirks of ASTRA-sim are reproduced: the
    reduction after a receive is charged on the *next* message size, so the reductions are
    ``R(m_2) ... R(m_L)``; and an all-reduce's doubling half restarts from ``2 trunc(m_L / 2)``.

    - reduce-scatter: ``e + sum_k (S_{2^(k-1)}(m_k) + e) + sum_{k>=2} R(m_k)``
    - all-reduce: the same, plus ``sum_k (S_{n/2^(k+1)}(u_k) + e)``, ``u_k = 2^(k+1) trunc(m_L/2)``
    - all-gather: ``e + sum_k (S_{n/2^(k+1)}(2^k D) + e)``
    """

    name = "halvingDoubling"
    supports = frozenset(
        {Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER}
    )

    def check(self, op: Collective, n: int) -> None:
        super().check(op, n)
        _log2(n)

    def phase_ns(self, op: Collective, n: int, data_bytes: int, link: Link, costs: Costs) -> int:
        return self.phase_fn(op, n, link, costs)(data_bytes)

    def phase_fn(self, op: Collective, n: int, link: Link, costs: Costs) -> Callable[[int], int]:
        e, reduce, steps = costs.endpoint_ns, costs.reduce_ns, _log2(n)
        # (latency, bytes per ns) of step k's message: int(latency + bytes / bytes_per_ns)
        halving = [link.message_terms(1 << k) for k in range(steps)]
        doubling = [link.message_terms(n >> (k + 1)) for k in range(steps)]
        if op is Collective.ALL_GATHER:
            def all_gather(d: int) -> int:
                t = e
                for k, (latency, bytes_per_ns) in enumerate(doubling):
                    t += int(latency + (d << k) / bytes_per_ns) + e
                return t
            return all_gather
        all_reduce = op is Collective.ALL_REDUCE

        def reduce_first(d: int) -> int:
            t = e
            m = d
            for k, (latency, bytes_per_ns) in enumerate(halving):
                m >>= 1  # m_(k+1) = trunc(D / 2^(k+1)), to the partner at distance 2^k
                t += int(latency + m / bytes_per_ns) + e
                if k:
                    t += reduce(m)
            if all_reduce:
                base = 2 * (m // 2)
                for k, (latency, bytes_per_ns) in enumerate(doubling):
                    t += int(latency + (base << k) / bytes_per_ns) + e
            return t
        return reduce_first
