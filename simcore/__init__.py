"""simcore: the built-in simulator. Specs in, estimates out; no files, no Optuna, no plots.

Glossary
- axis vs dim: a parallel *axis* is dp, tp, pp or sp (:class:`simcore.specs.Axis`); a network
  *dimension* is one level of the network (``Network.dims``, innermost first); a tensor
  dimension is never called an axis.
- batch vs micro-batch: the global batch is the sequences of one optimizer step over all data-
  parallel replicas; a micro-batch is what one pipeline stage processes at a time.
- link vs exposed time: link time is how long a communication occupies the network; exposed
  time is the part of it that the step waits for (not hidden behind compute).
- chunk, phase: ASTRA-sim splits a collective into chunks (preferred-dataset-splits); each chunk
  runs one phase per network dimension it crosses.

Units inside are SI: bytes, seconds, bytes/s, FLOP/s. Collective timing follows ASTRA-sim's
analytical backend to the nanosecond (:mod:`simcore.collectives`).
"""

from __future__ import annotations

from simcore.collectives import (
    CollectiveTiming,
    Congestion,
    PhaseTiming,
    collective_time,
    p2p_time,
)
from simcore.network import (
    AlgorithmChoice,
    Collective,
    CollectiveAlgorithm,
    CollectiveScheduling,
    MultiDimOptimization,
    Network,
    NetworkDim,
    SchedulingPolicy,
    Topology,
)

__all__ = [
    "AlgorithmChoice",
    "Collective",
    "CollectiveAlgorithm",
    "CollectiveScheduling",
    "CollectiveTiming",
    "Congestion",
    "MultiDimOptimization",
    "Network",
    "NetworkDim",
    "PhaseTiming",
    "SchedulingPolicy",
    "Topology",
    "collective_time",
    "p2p_time",
]
