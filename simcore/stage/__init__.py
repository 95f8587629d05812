"""The ``stage`` convention: a transformer step exactly as STAGE (branch ``recomp``) writes it
for ASTRA-sim, replayed as ASTRA-sim's analytical backend runs it.

``astra_estimate(args, network, peak_ops_per_s=..., local_mem_bytes_per_s=...)`` reproduces the
lab's STAGE -> Chakra -> ASTRA-sim pipeline without running either tool: the per-rank graph
(:mod:`._graph`, from the block tables in :mod:`._templates`), then ASTRA-sim's scheduling,
roofline, statistics and local-memory tracker (:mod:`._replay`). Units are STAGE's: one
multiply-accumulate is one op, one element is one byte (shared reference NOTES.md sections 4-5).
"""

from __future__ import annotations

from simcore.stage._args import StageArgs
from simcore.stage._check import check_args
from simcore.stage._estimate import (
    Inventory,
    StageResult,
    astra_estimate,
    inventory,
    model_num_ops,
)
from simcore.stage._graph import SKIPPED, Node, NodeKind, RankGraph, StageModel, build_model
from simcore.stage._inventory import RooflineTotals
from simcore.stage._replay import RankTimes, roofline_ns
from simcore.stage._traces import TraceTimes, replay_traces

__all__ = [
    "SKIPPED",
    "Inventory",
    "Node",
    "NodeKind",
    "RankGraph",
    "RankTimes",
    "RooflineTotals",
    "StageArgs",
    "StageModel",
    "StageResult",
    "TraceTimes",
    "astra_estimate",
    "build_model",
    "check_args",
    "inventory",
    "model_num_ops",
    "replay_traces",
    "roofline_ns",
]
