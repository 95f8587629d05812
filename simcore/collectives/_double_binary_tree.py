from __future__ import annotations

import heapq

from simcore.network import Collective

from ._base import BaseCollective, Costs, Link


def _tree(n: int, root_is_max: bool) -> tuple[int, dict[int, list[int]]]:
    """ASTRA-sim ``BinaryTree``: a perfect tree of n-1 NPUs numbered in order, under a dummy
    root NPU with that tree as its only child. The root is NPU n-1 (RootMax) or 0 (RootMin).

    In a perfect tree numbered 1..n-1 in order, node i has height h = trailing zeros of i and,
    for h >= 1, children i -/+ 2^(h-1); its root is n/2.
    """
    shift = 0 if root_is_max else 1
    children: dict[int, list[int]] = {}
    for i in range(1, n):
        h = (i & -i).bit_length() - 1
        kids = [i - (1 << (h - 1)), i + (1 << (h - 1))] if h else []
        children[i - 1 + shift] = [k - 1 + shift for k in kids]
    root = n - 1 if root_is_max else 0
    children[root] = [n // 2 - 1 + shift]
    return root, children


class DoubleBinaryTreeCollective(BaseCollective):
    """ASTRA-sim ``DoubleBinaryTreeAllReduce``: full-size messages up a binary tree (reducing)
    and back down; successive chunks alternate between the RootMax and RootMin trees.

    The NPUs do not act alike, so this is not a per-phase closed form: :meth:`all_reduce_ns`
    walks both trees once per chunk (O(chunks x n)), each NPU starting its next chunk in its
    first free stream slot, and reports NPU 0 as ASTRA-sim's sys[0]. One dimension only.
    """

    name = "doubleBinaryTree"
    supports = frozenset({Collective.ALL_REDUCE})

    def check(self, op: Collective, n: int) -> None:
        super().check(op, n)
        if n < 2 or n & (n - 1):
            raise ValueError(f"doubleBinaryTree needs a power-of-two number of NPUs, but got {n}")

    def phase_ns(self, op: Collective, n: int, data_bytes: int, link: Link, costs: Costs) -> int:
        return self.all_reduce_ns(n, data_bytes, 1, 1, link, costs)

    def all_reduce_ns(
        self, n: int, chunk_bytes: int, chunks: int, active: int, link: Link, costs: Costs
    ) -> int:
        e, r = costs.endpoint_ns, costs.reduce_ns(chunk_bytes)

        def hop(a: int, b: int) -> int:
            return link.message_ns(link.topology.hops(a, b), chunk_bytes)

        trees = [_tree(n, root_is_max=True), _tree(n, root_is_max=False)]
        slots = [[0] * active for _ in range(n)]
        finish0 = 0
        for c in range(chunks):
            root, children = trees[c % 2]
            start = [heapq.heappop(s) for s in slots]
            up: dict[int, int] = {}

            def send_up(v: int) -> int:
                kids = children.get(v, [])
                if not kids:
                    up[v] = start[v] + e
                else:
                    up[v] = max(max(start[v], send_up(k) + hop(k, v)) for k in kids) + e + r
                return up[v]

            send_up(root)
            done = [0] * n
            done[root] = up[root]
            stack = [root]
            while stack:
                v = stack.pop()
                for k in children.get(v, []):
                    arrival = done[v] + hop(v, k)
                    if children.get(k):
                        done[k] = max(up[k], arrival) + e + r
                        stack.append(k)
                    else:
                        done[k] = max(up[k], arrival) + e
            for i in range(n):
                heapq.heappush(slots[i], done[i])
            finish0 = max(finish0, done[0])
        return finish0
