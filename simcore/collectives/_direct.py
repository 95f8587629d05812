from __future__ import annotations

from collections.abc import Callable

from simcore.network import Collective

from ._base import BaseCollective, Costs, Link


class DirectCollective(BaseCollective):
    """ASTRA-sim ``AllToAll`` ("direct"): every NPU sends to all n-1 others at once (offsets
    1, 2, ..., n-1), so a phase costs the slowest of those messages, not their sum.

    With ``m = D / n``, ``S_j`` the message time to offset ``j``, ``e`` the hand-off, ``R`` the
    reduction:

    - reduce-scatter: ``2e + max_j S_j(m) + R(m)``
    - all-gather: ``2e + max_j S_j(D)``; all-to-all: ``2e + max_j S_j(m)``
    - all-reduce: the second half starts once every first-half message has arrived; each
      reduction completion then releases one send, to offsets 1, 2, ... in order:
      ``a_j = e + S_j(m)``, ``g = sorted(a_j + e + R(m))``, ``g* = min{g_i >= max a}``,
      ``T = e + max_j(max(g_j, g*) + S_j(m))``; with equal hops that is ``3e + 2S(m) + R(m)``.

    Only the default window (all peers at once) is modelled; ``directN`` with N < n-1 raises.
    """

    name = "direct"

    def __init__(self, window: int | None = None) -> None:
        self.window = window

    def check(self, op: Collective, n: int) -> None:
        super().check(op, n)
        if self.window is not None and self.window < n - 1:
            raise ValueError(
                f"direct{self.window} on {n} NPUs (a window below n-1 = {n - 1}) is not"
                " modelled; use direct"
            )

    def phase_ns(self, op: Collective, n: int, data_bytes: int, link: Link, costs: Costs) -> int:
        return self.phase_fn(op, n, link, costs)(data_bytes)

    def phase_fn(self, op: Collective, n: int, link: Link, costs: Costs) -> Callable[[int], int]:
        e, reduce = costs.endpoint_ns, costs.reduce_ns
        # the slowest message: to offset 1 on a uniform dimension, else the first offset with
        # the most hops; int(latency + bytes / bytes_per_ns)
        farthest = 1 if link.uniform or n < 3 else max(range(1, n), key=link.hops)
        latency, bytes_per_ns = link.message_terms(farthest)
        if op is Collective.ALL_GATHER:
            return lambda d: 2 * e + int(latency + d / bytes_per_ns)
        if op is Collective.ALL_TO_ALL:
            return lambda d: 2 * e + int(latency + d // n / bytes_per_ns)
        if op is Collective.REDUCE_SCATTER:
            def reduce_scatter(d: int) -> int:
                m = d // n
                return 2 * e + int(latency + m / bytes_per_ns) + reduce(m)
            return reduce_scatter
        if link.uniform:
            def all_reduce(d: int) -> int:
                m = d // n
                return 3 * e + 2 * int(latency + m / bytes_per_ns) + reduce(m)
            return all_reduce
        terms = [link.message_terms(j) for j in range(1, n)]

        def all_reduce_mixed_hops(d: int) -> int:
            m = d // n
            r = reduce(m)
            sends = [int(hop_latency + m / bw) for hop_latency, bw in terms]
            arrivals = [e + s for s in sends]
            last_arrival = max(arrivals)
            done = sorted(a + e + r for a in arrivals)
            release = next(g for g in done if g >= last_arrival)
            return e + max(max(g, release) + s for g, s in zip(done, sends))
        return all_reduce_mixed_hops
