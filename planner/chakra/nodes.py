"""What the project's trace writers share: a simcore graph node as a Chakra node, with its
communication attributes, and the communicator groups numbered for ``comm_group.json``.

Attributes as STAGE recomp writes them (0b44904d ``chakra_00_4_backend.py``, with
``ConvertChakra.with_comm_info``): collectives ``comm_size`` (int64), ``comm_type`` (Chakra's
enum), ``pg_name`` (the group's id), ``is_cpu_op`` 0; sends and receives ``comm_size``,
``comm_tag``, ``comm_dst`` / ``comm_src`` (int32), ``is_cpu_op`` 0. Ids and dependencies are
shifted by one (Chakra ids start at 1 in STAGE's files).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from planner.chakra.schema import COLLECTIVE_TYPES, message_class
from simcore.network import Collective
from simcore.stage import Node, NodeKind

__all__ = ["chakra_node", "comm_group_text", "number_groups"]

_NODE_TYPE = {NodeKind.COMP: 4, NodeKind.SEND: 5, NodeKind.RECV: 6, NodeKind.COLL: 7}
_COMM_TYPE = {c: COLLECTIVE_TYPES.index(c.name) for c in Collective}


def number_groups(groups: Iterable[tuple[int, ...]]) -> dict[tuple[int, ...], int]:
    """Every communicator group of more than one NPU, numbered from 1 in rank order."""
    found = sorted({g for g in groups if len(g) > 1})
    return {g: i for i, g in enumerate(found, start=1)}


def comm_group_text(groups: dict[tuple[int, ...], int]) -> str:
    """ASTRA-sim's ``--comm-group-configuration`` JSON: ``{"id": [npus]}``."""
    return json.dumps({str(i): list(g) for g, i in groups.items()}) + "\n"


def chakra_node(n: Node, *, group: int | None = None, tag: int | None = None,
                peer: int | None = None) -> Any:
    """``n`` as a Chakra node: id, name, type, data dependencies and, for a collective, its
    ``group`` id, for a send or receive its ``tag`` and ``peer``; compute attributes are the
    caller's (the conventions time compute differently)."""
    attr = message_class("AttributeProto")
    out = message_class("Node")(id=n.id + 1, name=n.name, type=_NODE_TYPE[n.kind],
                                data_deps=[d + 1 for d in n.deps])
    if n.kind is NodeKind.COLL:
        assert n.collective is not None
        out.attr.extend([attr(name="comm_size", int64_val=n.size),
                         attr(name="comm_type", int64_val=_COMM_TYPE[n.collective]),
                         attr(name="pg_name", string_val=str(group)),
                         attr(name="is_cpu_op", int32_val=0)])
    elif n.kind in (NodeKind.SEND, NodeKind.RECV):
        side = "comm_dst" if n.kind is NodeKind.SEND else "comm_src"
        out.attr.extend([attr(name="comm_size", int64_val=n.size),
                         attr(name="comm_tag", int32_val=tag),
                         attr(name=side, int32_val=peer),
                         attr(name="is_cpu_op", int32_val=0)])
    return out
