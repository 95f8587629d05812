"""STAGE ``main.py``'s arguments (branch ``recomp``) as one validated value."""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["StageArgs", "coordinates_of", "rank_of", "stage_groups"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StageArgs:
    """The flags of STAGE recomp ``main.py`` that shape the graph (names as on its command line).

    Every size is a count of elements; STAGE writes one element as one byte and one
    multiply-accumulate as one op (shared reference NOTES.md section 4).
    """

    dp: int = 1
    """Data-parallel degree; 1 means no data parallelism."""
    tp: int = 1
    """Tensor-parallel degree (heads, FFN columns and hidden activations are split)."""
    pp: int = 1
    """Pipeline degree: blocks go to stages round-robin, no micro-batches."""
    sp: int = 1
    """Sequence-parallel degree (activations split along the sequence)."""
    weight_sharded: bool = False
    """FSDP: weights stored sharded over dp (and sp) and all-gathered before use."""
    activation_recompute: bool = False
    """Recompute q, k, v, qk and the FFN hidden activation in backward."""
    din: int = 51200
    """Input vocabulary (rows of the input embedding)."""
    dout: int = 25600
    """Output vocabulary (columns of the output embedding)."""
    dmodel: int = 25600
    dff: int = 25600 * 4
    head: int = 1024
    seq: int = 1024
    batch: int = 1024
    """Global batch (sequences of one step over all data-parallel replicas)."""
    num_stacks: int = 32
    """Transformer blocks (one attention + one FFN each)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("weight_sharded", "activation_recompute"):
                if not isinstance(value, bool):
                    raise ValueError(f"{f.name} must be a bool, but got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{f.name} >= 1` must hold (a whole number), but got {value!r}")
        if self.num_stacks < 2:
            # transformer() in STAGE's models/transformer.py links out_emb to the last block
            # only from the second block on; with one block the graph falls apart.
            raise ValueError(
                f"`num_stacks >= 2` must hold (STAGE recomp connects out_emb only then), but"
                f" got num_stacks={self.num_stacks}"
            )
        if self.pp > self.num_stacks + 1:
            raise ValueError(
                f"`pp <= num_stacks + 1` must hold (blocks go round-robin to stages; an empty"
                f" stage has no rank), but got pp={self.pp}, num_stacks={self.num_stacks}"
            )

    @property
    def npus(self) -> int:
        """Ranks STAGE writes a trace for: dp * tp * sp * pp."""
        return self.dp * self.tp * self.sp * self.pp

    def value_of(self, symbol: str) -> int:
        """The value of one of STAGE's shape symbols (``Batch``, ``Dmodel``, ``dp``, ...)."""
        return getattr(self, _SYMBOL_FIELDS[symbol])


def rank_of(a: StageArgs, pos: int, dp: int = 0, tp: int = 0, sp: int = 0) -> int:
    """STAGE's rank of (dp, tp, sp) coordinates on the ``pos``-th pipeline stage."""
    return dp + a.dp * (tp + a.tp * (sp + a.sp * pos))


def coordinates_of(a: StageArgs, rank: int) -> tuple[int, int, int, int]:
    """(pipeline position, dp, tp, sp) of ``rank``: the inverse of :func:`rank_of`."""
    rest, dp = divmod(rank, a.dp)
    rest, tp = divmod(rest, a.tp)
    pos, sp = divmod(rest, a.sp)
    return pos, dp, tp, sp


def stage_groups(a: StageArgs, pos: int, dp: int = 0, tp: int = 0, sp: int = 0
                 ) -> dict[str, tuple[int, ...]]:
    """The communicator groups, per axis, of the rank at (dp, tp, sp) on the ``pos``-th stage
    (by default the stage's representative rank)."""
    return {
        "dp": tuple(rank_of(a, pos, i, tp, sp) for i in range(a.dp)),
        "tp": tuple(rank_of(a, pos, dp, i, sp) for i in range(a.tp)),
        "sp": tuple(rank_of(a, pos, dp, tp, i) for i in range(a.sp)),
    }


_SYMBOL_FIELDS = {
    "Batch": "batch",
    "Seq": "seq",
    "Dmodel": "dmodel",
    "Dff": "dff",
    "Head": "head",
    "Din": "din",
    "Dout": "dout",
    "dp": "dp",
    "tp": "tp",
    "sp": "sp",
    "pp": "pp",
}
