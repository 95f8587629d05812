"""The frozen, validated inputs of an estimate: model, device, system, training and strategy.

Units are SI throughout: bytes, seconds, bytes/s, FLOP/s (one multiply-accumulate = 2 FLOP).
One module a concern: the named choices (:mod:`simcore.specs.choices`), the model
(:mod:`simcore.specs.model`), the hardware (:mod:`simcore.specs.hardware`), the training step
(:mod:`simcore.specs.training`) and the strategy (:mod:`simcore.specs.strategy`); import them
from here.
"""

from __future__ import annotations

from simcore.specs.choices import (
    DEFAULT_PLACEMENT,
    ZERO_BUBBLE,
    Activation,
    Axis,
    Convention,
    CpComm,
    CrossEntropy,
    Family,
    Precision,
    Recompute,
    RecomputeModule,
    Schedule,
    SelectiveRecompute,
    ZeroStage,
)
from simcore.specs.hardware import DeviceSpec, SystemSpec
from simcore.specs.model import ModelSpec, MoESpec
from simcore.specs.strategy import Strategy
from simcore.specs.training import TRAINING_CHOICES, TrainingSpec

__all__ = [
    "DEFAULT_PLACEMENT",
    "ZERO_BUBBLE",
    "Activation",
    "Axis",
    "Convention",
    "CpComm",
    "CrossEntropy",
    "DeviceSpec",
    "Family",
    "ModelSpec",
    "MoESpec",
    "Precision",
    "Recompute",
    "RecomputeModule",
    "Schedule",
    "SelectiveRecompute",
    "TRAINING_CHOICES",
    "Strategy",
    "SystemSpec",
    "TrainingSpec",
    "ZeroStage",
]
