from __future__ import annotations

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
        e, steps = costs.endpoint_ns, _log2(n)
        if op is Collective.ALL_GATHER:
            return e + sum(
                link.send_ns(n >> (k + 1), data_bytes << k) + e for k in range(steps)
            )
        sizes = [data_bytes >> k for k in range(1, steps + 1)]
        t = e + sum(link.send_ns(1 << k, m) + e for k, m in enumerate(sizes))
        t += sum(costs.reduce_ns(m) for m in sizes[1:])
        if op is Collective.ALL_REDUCE:
            base = 2 * (sizes[-1] // 2)
            t += sum(link.send_ns(n >> (k + 1), base << k) + e for k in range(steps))
        return t
