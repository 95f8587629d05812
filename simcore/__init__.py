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
from simcore.conventions import CONVENTIONS, ConventionImpl, implementation, register
from simcore.estimate import Estimate, MemoryParts, StageEstimate, TimeParts
from simcore.mixed import (
    LayerProfiles,
    MixedPlan,
    MixedStage,
    MixedSystemSpec,
    check_mixed,
    estimate_mixed,
)
from simcore.mixed.timeline import mixed_timeline
from simcore.timeline import Timeline, step_timeline
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
from simcore.specs import (
    Convention,
    DeviceSpec,
    Family,
    ModelSpec,
    Strategy,
    SystemSpec,
    TrainingSpec,
)


def convention_of(model: ModelSpec) -> Convention:
    """The graph convention a model family is simulated with."""
    if model.family is Family.MLP:
        return Convention.MLP
    if model.family is Family.STAGE:
        return Convention.STAGE
    return Convention.MEGATRON


def estimate(
    model: ModelSpec,
    system: SystemSpec,
    training: TrainingSpec,
    strategy: Strategy,
    convention: Convention | None = None,
) -> Estimate:
    """Step time and peak memory of one training step: the objective of every study.

    ``gpt`` and ``llama`` models follow the ``megatron`` convention, ``mlp`` the DistIR MLP,
    ``stage`` STAGE's recomp graph on ASTRA-sim; ``convention`` overrides the family's (a GPT
    or Llama shape run as STAGE builds it, as the ASTRA-sim lab does). Raises ValueError when
    the plan's shapes do not divide; a plan that does not fit in HBM is an estimate with
    ``fits=False``.
    """
    impl = implementation(convention or convention_of(model))
    return impl.estimate(model, system, training, strategy)


def check(
    model: ModelSpec,
    system: SystemSpec,
    training: TrainingSpec,
    strategy: Strategy,
    convention: Convention | None = None,
) -> None:
    """Raise ValueError, naming the field and what is allowed, if ``estimate`` could not run
    this plan; much cheaper than estimating it (search spaces filter with it)."""
    implementation(convention or convention_of(model)).check(model, system, training, strategy)


__all__ = [
    "estimate",
    "check",
    "step_timeline",
    "CONVENTIONS",
    "ConventionImpl",
    "register",
    "implementation",
    "check_mixed",
    "estimate_mixed",
    "mixed_timeline",
    "MixedPlan",
    "MixedStage",
    "MixedSystemSpec",
    "LayerProfiles",
    "Timeline",
    "convention_of",
    "Convention",
    "Estimate",
    "MemoryParts",
    "StageEstimate",
    "TimeParts",
    "ModelSpec",
    "DeviceSpec",
    "SystemSpec",
    "TrainingSpec",
    "Strategy",
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
