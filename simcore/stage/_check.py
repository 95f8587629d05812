"""Which STAGE arguments give whole tensor splits, decided from the block tables alone.

Building the graph finds the same thing (``_Builder.size``), but a search space asks for every
candidate layout; reading the shapes of the three block tables is enough and takes microseconds.
"""

from __future__ import annotations

from functools import cache

from simcore.stage._args import StageArgs
from simcore.stage._graph import _not_whole
from simcore.stage._shapes import Dim, parse_shape
from simcore.stage._templates import attention, embedding, feed_forward

__all__ = ["check_args"]


@cache
def _dims(weight_sharded: bool, recompute: bool) -> tuple[Dim, ...]:
    """Every dimension the blocks read, with the embeddings' renames (``build_tensors``)."""
    found: dict[Dim, None] = {}
    emb = embedding(weight_sharded=weight_sharded)
    blocks = [(emb, ("Dout", "Dmodel")), (emb, ("Din", "Dmodel")),
              (attention(weight_sharded=weight_sharded, recompute=recompute), None),
              (feed_forward(weight_sharded=weight_sharded, recompute=recompute), None)]
    for rows, rename in blocks:
        for row in rows:
            for text in (row.x1_shape, row.x2_shape):
                for d in parse_shape(text):
                    found[d.renamed(*rename) if rename else d] = None
    return tuple(found)


def check_args(args: StageArgs) -> None:
    """Raise ValueError (naming the flags) unless every split STAGE makes is whole."""
    for d in _dims(args.weight_sharded, args.activation_recompute):
        if d.value(args.value_of).denominator != 1:
            raise ValueError(_not_whole(d, args))
