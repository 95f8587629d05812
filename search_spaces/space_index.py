"""A strategy space's valid plans as flat indices into its candidates' product, checked a
column at a time with numpy (:meth:`search_spaces.space.StrategySpace.valid_indices`), and the
knobs at such indices as arrays (:meth:`~search_spaces.space.StrategySpace.columns_at`): a
million plans counted or sliced without building a strategy object each."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from search_spaces.space import _experts_ok, _shard_group_ok
from simcore.conventions import implementation
from simcore.specs import ZERO_BUBBLE, Convention, Schedule

if TYPE_CHECKING:
    from search_spaces.space import StrategySpace

__all__ = ["columns_at", "valid_index_array"]


def columns_at(space: StrategySpace, flat: np.ndarray) -> dict[str, np.ndarray]:
    """The knobs of the strategies at these flat indices as arrays, in the form
    :func:`simcore.megatron.bounds.lower_bounds` reads (codes for the enums)."""
    from simcore.megatron.bounds import (
        PARTIAL_RECOMPUTE,
        PRECISION_CODES,
        RECOMPUTE_CODES,
        SCHEDULE_CODES,
    )

    layouts, pipes = space.layouts(), space.pipelines()
    li, zi, ri, mi, pi, _, si, qi, ui, hi, _, ki, oi = np.unravel_index(
        np.asarray(flat, np.int64), space._shape())
    lay = np.array([(x.dp, x.tp, x.pp, x.sp) for x in layouts], np.int64)[li]
    zero = np.array([int(z) for z in space.zero], np.int64)[zi]
    ends = np.array([[space._ends(x.pp, k) or 0 for k in space.uneven] for x in layouts],
                    np.int64)[li, ui]
    group = np.asarray(space.shard_group, np.int64)[hi]
    return {
        "dp": lay[:, 0], "tp": lay[:, 1], "pp": lay[:, 2], "sp": lay[:, 3], "zero": zero,
        "shard_ranks": np.where(group > 0, group, lay[:, 0] * lay[:, 3]),
        "recompute": np.where(np.asarray(space.recompute_layers, np.int64)[ki] > 0,
                              PARTIAL_RECOMPUTE, np.array([RECOMPUTE_CODES[r] for r in
                                                           space.recompute], np.int64)[ri]),
        "micro_batch": np.asarray(space.micro_batch, np.int64)[mi],
        "schedule": np.array([SCHEDULE_CODES[p.schedule.value] for p in pipes],
                             np.int64)[pi],
        "v": np.array([p.v for p in pipes], np.int64)[pi],
        "sequence_parallel": np.asarray(space.sequence_parallel, bool)[si],
        "precision": np.array([PRECISION_CODES[q] for q in space.precision], np.int64)[qi],
        "first_stage_layers": np.maximum(ends, 0),
        "offload_layers": np.asarray(space.offload_layers, np.int64)[oi],
    }


def valid_index_array(space: StrategySpace) -> np.ndarray:
    """Flat indices (into the space's product, :meth:`StrategySpace._shape`) of its valid
    candidates, ascending, checked a column at a time (simcore's ``valid_plans``)."""
    layouts, pipes = space.layouts(), space.pipelines()
    if not layouts or not pipes:
        return np.empty(0, np.int64)
    lay = np.array([(x.dp, x.tp, x.pp, x.sp) for x in layouts], np.int64)
    read = (len(layouts), len(space.micro_batch), len(pipes), len(space.sequence_parallel),
            len(space.uneven))
    li, mi, pi, si, ui = np.indices(read).reshape(len(read), -1)
    ends = np.array([[space._ends(x.pp, k) or 0 for k in space.uneven] for x in layouts],
                    np.int64)[li, ui]
    columns = {
        "dp": lay[li, 0], "tp": lay[li, 1], "pp": lay[li, 2], "sp": lay[li, 3],
        "micro_batch": np.asarray(space.micro_batch, np.int64)[mi],
        "v": np.array([p.v for p in pipes], np.int64)[pi],
        "interleaved": np.array([p.schedule is Schedule.INTERLEAVED for p in pipes])[pi],
        "zero_bubble": np.array([p.schedule in ZERO_BUBBLE for p in pipes])[pi],
        "zbv": np.array([p.schedule is Schedule.ZBV for p in pipes])[pi],
        "sequence_parallel": np.asarray(space.sequence_parallel, bool)[si],
    }
    check = implementation(space.convention).valid_plans
    assert check is not None
    if space.uneven != (0,):  # only the megatron convention reads the ends' columns
        columns["first_stage_layers"] = columns["last_stage_layers"] = np.maximum(ends, 0)
    ok = check(space.model, space.system, space.training, columns)
    if space.uneven != (0,):
        shorts = np.asarray(space.uneven, np.int64)[ui]
        ok &= (ends >= 0) & ((shorts == 0) | (space.convention is Convention.MEGATRON))
    ok = ok.reshape(read[0], 1, 1, read[1], read[2], 1, read[3], 1, read[4], 1, 1, 1, 1)
    ok = ok & space._precision_ok().reshape(1, 1, 1, 1, 1, 1, 1, -1, 1, 1, 1, 1, 1)
    hsdp = np.array([[[_shard_group_ok(x, z, k) for k in space.shard_group] for z in space.zero]
                     for x in layouts], bool)
    ok = ok & hsdp.reshape(len(layouts), len(space.zero), 1, 1, 1, 1, 1, 1, 1, -1, 1, 1, 1)
    # a dense model (the only kind listed here): no expert parallelism
    dense = np.array([[ep == 1 and (etp is None or etp == x.tp)
                       and _experts_ok(x, ep, etp, space.etp)
                       for ep, etp, _, _ in space.experts()] for x in layouts], bool)
    ok = ok & dense.reshape(len(layouts), 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, 1, 1)
    if space.recompute_layers != (0,):
        partial = np.array([[[[space._partial_ok(x.pp, p.v, r, k)
                               for k in space.recompute_layers] for p in pipes]
                             for r in space.recompute] for x in layouts], bool)
        ok = ok & partial.reshape(len(layouts), 1, len(space.recompute), 1, len(pipes),
                                  1, 1, 1, 1, 1, 1, -1, 1)
    if space.offload_layers != (0,):
        offload = np.array([[[space._offload_ok(x.pp, r, k) for k in space.offload_layers]
                             for r in space.recompute] for x in layouts], bool)
        ok = ok & offload.reshape(len(layouts), 1, len(space.recompute), 1, 1, 1, 1, 1, 1,
                                  1, 1, 1, -1)
    found = np.flatnonzero(np.broadcast_to(ok, space._shape()))
    found.flags.writeable = False
    return found
