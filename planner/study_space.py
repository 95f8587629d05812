"""A study's ``space:`` mapping, checked field by field and turned into a
:class:`search_spaces.StrategySpace`: each knob a list of values (or ``powers_of_two`` for a
degree), every problem one line naming the file, the field and the fix
(:mod:`planner.study_config` reads the rest of the study)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from planner.fields import choice, fail, fields, integer, placement_axes
from search_spaces import StrategySpace, powers_of_two
from simcore.specs import (
    Axis,
    Convention,
    ModelSpec,
    Precision,
    Recompute,
    Schedule,
    SystemSpec,
    TrainingSpec,
    ZeroStage,
)

__all__ = ["as_list", "degrees", "enums", "space_from_entry", "zero_stage_of"]

_SPACE_KNOBS = {"dp", "tp", "pp", "sp", "zero", "fsdp", "recompute", "micro_batch", "schedule",
                "v", "placement", "sequence_parallel", "precision", "uneven", "shard_group",
                "ep", "etp", "ep_overlap", "ep_dedup", "recompute_layers", "offload_layers"}
_POWERS = ("powers_of_two", "powers of two")


def as_list(path: Path, field: str, value: Any) -> list:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise fail(path, field, "is empty; list at least one value")
    return items


def degrees(path: Path, field: str, value: Any, limit: int) -> tuple[int, ...]:
    if isinstance(value, str) and value.strip().lower() in _POWERS:
        return powers_of_two(limit)
    if isinstance(value, str) and not value.strip().isdigit():  # powers_of_2, "all", ...
        raise fail(path, field, f"must be a whole number, a list of them or powers_of_two, but"
                   f" got {value!r}")
    out = []
    for i, item in enumerate(as_list(path, field, value)):
        out.append(integer(path, f"{field}[{i}]" if isinstance(value, list) else field, item,
                           minimum=1))
    return tuple(dict.fromkeys(out))


def enums(path: Path, field: str, value: Any, enum: type) -> tuple:
    return tuple(dict.fromkeys(choice(path, field, item, enum)
                               for item in as_list(path, field, value)))


def _bools(path: Path, field: str, value: Any) -> tuple[bool, ...]:
    out = []
    for item in as_list(path, field, value):
        if not isinstance(item, bool):
            raise fail(path, field, f"must be true or false (or a list of them), but got {item!r}")
        out.append(item)
    return tuple(dict.fromkeys(out))


def _placements(path: Path, field: str, value: Any) -> tuple[tuple[Axis, ...], ...]:
    items = as_list(path, field, value)
    if all(isinstance(i, str) and "," not in i for i in items) and len(items) == 4:
        items = [items]  # one placement written as a list of axes
    out = []
    for item in items:
        axes_text = item.split(",") if isinstance(item, str) else item
        if not isinstance(axes_text, list):
            raise fail(path, field, f"{item!r} must list dp, tp, pp and sp, innermost first")
        axes = placement_axes(axes_text)
        if axes is None:
            raise fail(path, field, f"{item!r} must name dp, tp, pp and sp once each, innermost"
                       " first, e.g. tp,sp,dp,pp")
        out.append(axes)
    return tuple(dict.fromkeys(out))


def space_from_entry(path: Path, raw: Any, model: ModelSpec, system: SystemSpec,
                     training: TrainingSpec, convention: Convention,
                     framework: str) -> StrategySpace:
    e = fields(path, "space", raw, set(), _SPACE_KNOBS)
    n = system.devices
    if "zero" in e and "fsdp" in e:
        raise fail(path, "space.fsdp", "give zero or fsdp, not both (fsdp: true is zero: 3)")
    kw: dict[str, Any] = {}
    dp = e.get("dp", "auto")
    kw["dp"] = None if dp == "auto" else degrees(path, "space.dp", dp, n)
    for knob in ("tp", "pp", "sp"):
        if knob in e:
            kw[knob] = degrees(path, f"space.{knob}", e[knob], n)
    if "zero" in e:
        kw["zero"] = tuple(ZeroStage(integer(path, "space.zero", z, minimum=0)) if
                           isinstance(z, int) and 0 <= z <= 3 else
                           zero_stage_of(path, z) for z in as_list(path, "space.zero", e["zero"]))
    if "fsdp" in e:
        kw["zero"] = tuple(ZeroStage.PARAMETERS if f else ZeroStage.NONE
                           for f in _bools(path, "space.fsdp", e["fsdp"]))
    if "recompute" in e:
        kw["recompute"] = enums(path, "space.recompute", e["recompute"], Recompute)
    if "micro_batch" in e:
        kw["micro_batch"] = degrees(path, "space.micro_batch", e["micro_batch"],
                                     training.global_batch)
        if convention is Convention.STAGE and kw["micro_batch"] != (1,):
            # STAGE's graph takes the step's whole batch (--batch): each value gave the same
            # figures, and micro_batch 1000000000 was ranked a plan
            raise fail(path, "space.micro_batch", "the stage convention runs STAGE's graph,"
                       " which has no micro-batches (its batch is the step's); drop micro_batch,"
                       " or use convention: megatron")
    if "schedule" in e:
        kw["schedule"] = enums(path, "space.schedule", e["schedule"], Schedule)
    if "v" in e:
        kw["v"] = degrees(path, "space.v", e["v"], model.layers)
    if "placement" in e:
        kw["placement"] = _placements(path, "space.placement", e["placement"])
    if "sequence_parallel" in e:
        kw["sequence_parallel"] = _bools(path, "space.sequence_parallel", e["sequence_parallel"])
    if "precision" in e:
        kw["precision"] = enums(path, "space.precision", e["precision"], Precision)
    if "uneven" in e:  # layers fewer on the first and last stage (search_spaces.space.short_ends)
        kw["uneven"] = tuple(dict.fromkeys(integer(path, "space.uneven", k, minimum=0)
                                           for k in as_list(path, "space.uneven", e["uneven"])))
    if "shard_group" in e:  # shard groups for ZeRO-1 and ZeRO-3; 0: the whole dp * sp group
        kw["shard_group"] = tuple(dict.fromkeys(
            integer(path, "space.shard_group", k, minimum=0)
            for k in as_list(path, "space.shard_group", e["shard_group"])))
    if "recompute_layers" in e:  # layers of each chunk that full recompute runs; 0: all
        kw["recompute_layers"] = tuple(dict.fromkeys(
            integer(path, "space.recompute_layers", k, minimum=0)
            for k in as_list(path, "space.recompute_layers", e["recompute_layers"])))
        if (any(kw["recompute_layers"])
                and Recompute.FULL not in kw.get("recompute", (Recompute.NONE,))):
            raise fail(path, "space.recompute_layers", "it applies to full recompute; add full"
                       " to space.recompute, e.g. recompute: [none, full]")
    if "offload_layers" in e:  # layers that offload their activations to host memory; 0: none
        kw["offload_layers"] = tuple(dict.fromkeys(
            integer(path, "space.offload_layers", k, minimum=0)
            for k in as_list(path, "space.offload_layers", e["offload_layers"])))
        if any(kw["offload_layers"]) and system.device.host_bandwidth_bytes_per_s is None:
            raise fail(path, "space.offload_layers", f"device {system.device.name} has no"
                       " host_bandwidth_gbps in its catalog entry (its link to host memory);"
                       " add it or drop offload_layers")
    _experts(path, e, model, n, kw)
    space = StrategySpace(model=model, system=system, training=training, convention=convention,
                          framework=framework, **kw)
    if Schedule.INTERLEAVED in space.schedule and not any(v > 1 for v in space.v):
        raise fail(path, "space.v", "the interleaved schedule needs model chunks v > 1; add"
                   " e.g. v: [2, 4]")
    return space


def _experts(path: Path, e: dict[str, Any], model: ModelSpec, devices: int,
             kw: dict[str, Any]) -> None:
    """``ep`` (expert-parallel degrees) and ``etp`` (expert tensor-parallel degrees, or ``tp``
    for the plan's own), for a model with MoE layers."""
    if ("ep" in e or "etp" in e or "ep_overlap" in e or "ep_dedup" in e) and model.moe is None:
        knob = next(k for k in ("ep", "etp", "ep_overlap", "ep_dedup") if k in e)
        raise fail(path, f"space.{knob}", f"expert parallelism needs a model with MoE layers,"
                   f" and {model.name} has none; leave {knob} out")
    if "ep" in e:
        kw["ep"] = degrees(path, "space.ep", e["ep"], devices)
    if "ep_overlap" in e:
        kw["ep_overlap"] = _bools(path, "space.ep_overlap", e["ep_overlap"])
    if "ep_dedup" in e:
        kw["ep_dedup"] = _bools(path, "space.ep_dedup", e["ep_dedup"])
    if "etp" in e:
        kw["etp"] = tuple(dict.fromkeys(
            None if k == "tp" else integer(path, "space.etp", k, minimum=1)
            for k in as_list(path, "space.etp", e["etp"])))


def zero_stage_of(path: Path, z: Any) -> ZeroStage:
    raise fail(path, "space.zero", f"unknown ZeRO stage {z!r}; use 0, 1, 2 or 3 (3 is FSDP)")
