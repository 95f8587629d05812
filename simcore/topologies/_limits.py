"""Bounds on network sizes and collective scheduling, checked where a system is read."""

from __future__ import annotations

from collections.abc import Sequence

from simcore.network import CollectiveAlgorithm, NetworkDim

MAX_NPUS = 2**20
"""1,048,576 NPUs in one system: 64 times the largest cluster the project plans for (16,384
accelerators, README); a larger count is a typo, and the NPU-by-NPU models would run for hours."""
MAX_ACTIVE_CHUNKS = 64
"""Chunks in flight per dimension: ASTRA-sim's configurations use 1 to 4; more than a
collective's chunks (about ``preferred_dataset_splits``) changes nothing, and the tree model
keeps a slot per NPU per active chunk."""
MAX_DATASET_SPLITS = 1024
"""Chunks per collective: ASTRA-sim's configurations use 4 to 10; every chunk is simulated."""


def network_size_problem(npus: Sequence[int]) -> str | None:
    """Why NPU counts per dimension make too large a system, or None."""
    total = 1
    for n in npus:
        total *= n
        if total > MAX_NPUS:
            return (f"{' x '.join(map(str, npus))} NPUs is over the {MAX_NPUS:,} a system may"
                    " have (64 times the largest cluster planned for, 16,384); check the counts")
    return None


def algorithm_problem(dims: Sequence[NetworkDim]) -> tuple[int, str] | None:
    """``(dimension, why)`` when the network's algorithms cannot be modelled for a collective
    over every NPU, whatever its size: found when the system is read, not in the first trial."""
    active = [i for i, d in enumerate(dims) if d.npus > 1]
    for i, dim in enumerate(dims):
        for collective, choice in dim.algorithms.items():
            kind = choice.algorithm
            if kind is CollectiveAlgorithm.ONE_DIRECT:
                return i, (f"oneDirect ({collective}) is not modelled: its NPUs do not act alike;"
                           " use direct")
            if kind is CollectiveAlgorithm.DOUBLE_BINARY_TREE and len(active) > 1:
                return i, (f"doubleBinaryTree ({collective}) is modelled on one-dimensional"
                           f" networks only, but this one has {len(active)} dimensions of more"
                           " than one NPU; use ring or halvingDoubling")
            if i > 0 and _spans_all(kind) and not _spans_all(dims[0].algorithm(collective)
                                                              .algorithm):
                return i, (f"{kind} ({collective}) spans every NPU: list it on dimension 0 (and"
                           " every dimension), or use a per-dimension algorithm")
    return None


def _spans_all(kind: CollectiveAlgorithm) -> bool:
    """oneRing, oneDirect, oneHalvingDoubling: one ring (or set of peers) over every NPU."""
    return kind.value.startswith("one")
