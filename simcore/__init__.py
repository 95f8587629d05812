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

from dataclasses import replace

from simcore.collectives import (
    CollectiveTiming,
    Congestion,
    PhaseTiming,
    collective_time,
    p2p_time,
)
from simcore.conventions import CONVENTIONS, ConventionImpl, implementation, register
from simcore.estimate import Estimate, MemoryParts, StageEstimate, TimeParts
from simcore.megatron.precision import fp8_problem
from simcore.mixed import (
    LayerProfiles,
    MixedPlan,
    MixedStage,
    MixedSystemSpec,
    check_mixed,
    estimate_mixed,
)
from simcore.mixed.timeline import mixed_timeline
from simcore.network import (
    AlgorithmChoice,
    Collective,
    CollectiveAlgorithm,
    CollectiveScheduling,
    MultiDimOptimization,
    Network,
    NetworkDim,
    SchedulingPolicy,
    SwitchAllReduce,
    Topology,
)
from simcore.specs import (
    Convention,
    DeviceSpec,
    Family,
    ModelSpec,
    Precision,
    Strategy,
    SystemSpec,
    TrainingSpec,
)
from simcore.timeline import Timeline, step_timeline

_TRANSFORMER = (Convention.MEGATRON, Convention.STAGE)
CONVENTIONS_OF_FAMILY = {Family.GPT: _TRANSFORMER, Family.LLAMA: _TRANSFORMER,
                         Family.STAGE: _TRANSFORMER, Family.MLP: (Convention.MLP,)}
"""The conventions each model family can be estimated with: a transformer as Megatron-LM or
STAGE builds it, the DistIR MLP only as itself."""


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
    convention = convention or convention_of(model)
    if strategy.precision is not Precision.BF16:
        _check_precision(system, strategy, convention)
    if strategy.uneven or strategy.recompute_layers is not None:
        _check_uneven(strategy, convention)
    return implementation(convention).estimate(model, system, training, strategy)


def host_wait(model: ModelSpec, system: SystemSpec, training: TrainingSpec,
              strategy: Strategy, convention: Convention | None = None, *,
              step_time: float | None = None) -> float:
    """Seconds of the step the devices wait for the host to issue the layers' kernels
    (:attr:`DeviceSpec.host_kernel_s`, :func:`simcore.megatron.layer_step.host_wait`): the
    step against the same plan with no host time. ``step_time``: the plan's own estimated
    step, when the caller has it (else it is estimated here). 0 under CUDA graphs or launch
    blocking, on a device without host time, and for a plan whose layers outlast the host."""
    if not system.device.host_kernel_s or training.cuda_graphs or training.launch_blocking:
        return 0.0
    if step_time is None:
        step_time = estimate(model, system, training, strategy, convention).step_time
    free = replace(system, device=replace(system.device, host_kernel_s=0.0))
    return max(0.0, step_time - estimate(model, free, training, strategy, convention).step_time)


def check(
    model: ModelSpec,
    system: SystemSpec,
    training: TrainingSpec,
    strategy: Strategy,
    convention: Convention | None = None,
) -> None:
    """Raise ValueError, naming the field and what is allowed, if ``estimate`` could not run
    this plan; much cheaper than estimating it (search spaces filter with it)."""
    convention = convention or convention_of(model)
    if strategy.precision is not Precision.BF16:
        _check_precision(system, strategy, convention)
    if strategy.uneven or strategy.recompute_layers is not None:
        _check_uneven(strategy, convention)
    implementation(convention).check(model, system, training, strategy)


def precision_problem(device: DeviceSpec, convention: Convention,
                      precision: Precision) -> str | None:
    """Why a plan in ``precision`` cannot run on ``device`` under ``convention``, or None. fp8 is
    modelled in the megatron convention only: the stage convention replays STAGE's graph exactly
    as ASTRA-sim runs it, in 16-bit."""
    if precision is Precision.BF16:
        return None
    if convention is not Convention.MEGATRON:
        return (f"precision {precision.value} needs the megatron convention, but the plan uses"
                f" the {convention.value} convention (16-bit only); use precision bf16")
    return fp8_problem(device, precision)


def _check_precision(system: SystemSpec, strategy: Strategy, convention: Convention) -> None:
    problem = precision_problem(system.device, convention, strategy.precision)
    if problem is not None:
        raise ValueError(problem)


def _check_uneven(strategy: Strategy, convention: Convention) -> None:
    """Uneven stages and partial recompute are modelled in the megatron convention only: the
    mlp convention is the DistIR study's equal stages, and STAGE's graph spreads the layers
    round-robin and recomputes all or none."""
    if convention is Convention.MEGATRON:
        return
    if strategy.recompute_layers is not None:
        raise ValueError(
            f"recompute_layers needs the megatron convention, but the plan uses the"
            f" {convention.value} convention (every layer or none); leave recompute_layers"
            " empty")
    if strategy.uneven:
        raise ValueError(
            "first_stage_layers / last_stage_layers / layout need the megatron convention, but"
            f" the plan uses the {convention.value} convention (equal stages only)"
        )


__all__ = [
    "CONVENTIONS",
    "CONVENTIONS_OF_FAMILY",
    "AlgorithmChoice",
    "Collective",
    "CollectiveAlgorithm",
    "CollectiveScheduling",
    "CollectiveTiming",
    "Congestion",
    "Convention",
    "ConventionImpl",
    "DeviceSpec",
    "Estimate",
    "LayerProfiles",
    "MemoryParts",
    "MixedPlan",
    "MixedStage",
    "MixedSystemSpec",
    "ModelSpec",
    "MultiDimOptimization",
    "Network",
    "NetworkDim",
    "PhaseTiming",
    "Precision",
    "SchedulingPolicy",
    "StageEstimate",
    "Strategy",
    "SwitchAllReduce",
    "SystemSpec",
    "TimeParts",
    "Timeline",
    "Topology",
    "TrainingSpec",
    "check",
    "check_mixed",
    "collective_time",
    "convention_of",
    "estimate",
    "estimate_mixed",
    "host_wait",
    "implementation",
    "mixed_timeline",
    "p2p_time",
    "precision_problem",
    "register",
    "step_timeline",
]
