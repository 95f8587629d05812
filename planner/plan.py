"""A plan: one strategy with the model, system and training it was made for, and its estimate.

What the exports start from. A plan comes from a stored study (:func:`plans_from_study`: its
best trials, the specs the study stored when it was created) or from a plan file
(:func:`read_plan`), which :func:`write_plan` writes as YAML or JSON::

    format: parallel-planner-plan/1
    study: lab4b-llama70b-system1      # where it came from (optional)
    trial: 3
    convention: stage
    model: {name: llama70b, family: stage, layers: 80, ...}      # catalog fields
    system: {name: lab-system1, device: {name: ..., peak_tflops: ...}, network: [...], ...}
    training: {global_batch: 512, seq_len: 1024, ...}
    given_training: {...}      # a framework study's training before its framework's defaults
    strategy: {dp: 64, tp: 1, ..., placement: [tp, sp, dp, pp]}
    estimate: {step_time: ..., time: {...}, memory: {...}, ...}    # what simcore returned

Reading a plan file estimates the strategy again: ``planner estimate --plan FILE`` gives the
numbers the file holds (a test checks it).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

import simcore
from planner.catalog import device_from_entry, model_from_entry, system_from_entry
from planner.catalog_network import spec_or_fail
from planner.catalog_write import device_entry, model_entry, system_entry
from planner.errors import PlannerUsageError
from planner.fields import choice, fail, integer, load, training_flags
from planner.fields import fields as check_fields
from planner.record import strategy_attrs
from search_spaces import strategy_label
from search_spaces.frameworks import given_disagrees
from simcore.estimate import Estimate
from simcore.layout import parse_layout
from simcore.network import Congestion
from simcore.specs import (
    Axis,
    TRAINING_CHOICES,
    Convention,
    ModelSpec,
    Precision,
    Recompute,
    RecomputeModule,
    Schedule,
    Strategy,
    SystemSpec,
    TrainingSpec,
    ZeroStage,
)

if TYPE_CHECKING:
    import optuna
    import pandas as pd

__all__ = [
    "FORMAT",
    "Plan",
    "make_plan",
    "plan_dict",
    "plans_from_study",
    "read_plan",
    "specs_dict",
    "strategy_dict",
    "strategy_from_attrs",
    "study_given_training",
    "training_from_dict",
    "write_plan",
]

FORMAT = "parallel-planner-plan/1"


@dataclass(frozen=True)
class Plan:
    model: ModelSpec
    system: SystemSpec
    training: TrainingSpec
    strategy: Strategy
    convention: Convention
    estimate: Estimate
    study: str | None = None
    trial: int | None = None
    given_training: TrainingSpec | None = None
    """The training as its study wrote it, before the study's ``framework`` filled what it left
    open (:func:`search_spaces.frameworks.with_framework_defaults`); None: ``training`` itself.
    An export for another framework fills it with that framework's instead."""

    @property
    def written_training(self) -> TrainingSpec:
        """The training as its study wrote it: :attr:`given_training`, else :attr:`training`."""
        return self.given_training or self.training

    @property
    def label(self) -> str:
        return strategy_label(self.strategy)


def make_plan(model: ModelSpec, system: SystemSpec, training: TrainingSpec, strategy: Strategy,
              convention: Convention, *, study: str | None = None,
              trial: int | None = None, given_training: TrainingSpec | None = None) -> Plan:
    est = simcore.estimate(model, system, training, strategy, convention)
    given = None if given_training == training else given_training
    return Plan(model, system, training, strategy, convention, est, study, trial, given)


# -- to and from plain data -------------------------------------------------------------------
def strategy_dict(s: Strategy) -> dict[str, Any]:
    """The strategy as a trial stores it (:func:`planner.record.strategy_attrs`), with the
    placement as a list and without the label."""
    out = strategy_attrs(s)
    del out["plan"]
    out["placement"] = [a.value for a in s.placement]
    if s.precision is not Precision.BF16:  # bf16 plan files stay as they were before fp8
        out["precision"] = s.precision.value
    return out


def training_dict(t: TrainingSpec) -> dict[str, Any]:
    """The training's fields; a choice and ``grad_reduce_bytes`` only where set (so plan files
    without them read as before)."""
    out = {f.name: getattr(t, f.name) for f in fields(t)
           if f.name not in TRAINING_CHOICES and f.name != "recompute_modules"
           and not (f.name == "grad_reduce_bytes" and t.grad_reduce_bytes is None)}
    if t.recompute_modules is not None:
        out["recompute_modules"] = [m.value for m in t.recompute_modules]
    for name in TRAINING_CHOICES:
        if getattr(t, name) is not None:
            out[name] = getattr(t, name).value
    return out


def specs_dict(model: ModelSpec, system: SystemSpec, training: TrainingSpec,
               convention: Convention) -> dict[str, Any]:
    """The specs as plain data (what a study stores, and the head of a plan file)."""
    return {
        "convention": convention.value,
        "model": {"name": model.name, **model_entry(model)},
        "system": {"name": system.name,
                   "device": {"name": system.device.name, **device_entry(system.device)},
                   **{k: v for k, v in system_entry(system).items() if k != "device"},
                   **({"congestion": system.network.congestion.value}
                      if system.network.congestion is not Congestion.UNAWARE else {})},
        "training": training_dict(training),
    }


def plan_dict(plan: Plan) -> dict[str, Any]:
    out: dict[str, Any] = {"format": FORMAT}
    if plan.study is not None:
        out["study"] = plan.study
    if plan.trial is not None:
        out["trial"] = plan.trial
    out |= specs_dict(plan.model, plan.system, plan.training, plan.convention)
    if plan.given_training is not None:
        out["given_training"] = training_dict(plan.given_training)
    out["strategy"] = strategy_dict(plan.strategy)
    out["estimate"] = plan.estimate.to_dict()
    return out


def strategy_from_attrs(a: dict[str, Any]) -> Strategy:
    """The strategy a trial stored (``planner.record.strategy_attrs``) or a plan file holds."""
    placement = a["placement"]
    if isinstance(placement, str):
        placement = placement.split(",")
    return Strategy(dp=int(a["dp"]), tp=int(a["tp"]), pp=int(a["pp"]), sp=int(a["sp"]),
                    zero=ZeroStage(int(a["zero"])), recompute=Recompute(a["recompute"]),
                    micro_batch=int(a["micro_batch"]), schedule=Schedule(a["schedule"]),
                    v=int(a["v"]), placement=tuple(Axis(p) for p in placement),
                    sequence_parallel=bool(a["sequence_parallel"]),
                    precision=Precision(_precision(a.get("precision"))),
                    first_stage_layers=_layers(a.get("first_stage_layers")),
                    last_stage_layers=_layers(a.get("last_stage_layers")),
                    shard_group=_layers(a.get("shard_group")),
                    ep=_layers(a.get("ep")) or 1, etp=_layers(a.get("etp")),
                    ep_overlap=_flag(a.get("ep_overlap")), ep_dedup=_flag(a.get("ep_dedup")),
                    layout=_layout(a.get("layout")),
                    recompute_layers=_layers(a.get("recompute_layers")),
                    offload_layers=_layers(a.get("offload_layers")))


def _layout(value: Any) -> tuple[int, ...] | None:
    """A stored Megatron layout string (:mod:`simcore.layout`); plans without one hold none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return parse_layout(str(value))


def _layers(value: Any) -> int | None:
    """A stored first/last stage's layer count, HSDP shard group, recompute_layers or
    offload_layers; plans
    without one hold none (pandas: NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(value)


def _flag(value: Any) -> bool:
    """A stored flag that is absent unless set: True from a trial, 1 from a results table,
    None or NaN where a plan has none."""
    return value is True or (isinstance(value, (int, float)) and value == 1)


def _precision(value: Any) -> str:
    """A stored precision; trials and plan files from before fp8 hold none (bf16), and a
    pandas frame of trials holds NaN where a trial has none."""
    return value if isinstance(value, str) else Precision.BF16.value


def specs_from_dict(path: Path, data: dict[str, Any]
                    ) -> tuple[ModelSpec, SystemSpec, TrainingSpec, Convention]:
    """Read back :func:`specs_dict` (errors name ``path`` and the field)."""
    convention = choice(path, "convention", data.get("convention"), Convention)
    raw_model = dict(_mapping(path, "model", data.get("model")))
    name = _name(path, "model", raw_model.pop("name", None))
    model = model_from_entry(path, "model", raw_model)
    model = replace(model, name=name)
    raw_system = dict(_mapping(path, "system", data.get("system")))
    system_name = _name(path, "system", raw_system.pop("name", None))
    raw_device = dict(_mapping(path, "system.device", raw_system.get("device")))
    device_name = _name(path, "system.device", raw_device.pop("name", None))
    device = replace(device_from_entry(path, "system.device", raw_device), name=device_name)
    raw_system["device"] = device_name
    congestion = choice(path, "system.congestion", raw_system.pop("congestion", "unaware"),
                        Congestion)
    system = system_from_entry(path, "system", raw_system, {device_name: device})
    system = replace(system, name=system_name,
                     network=replace(system.network, congestion=congestion))
    return model, system, training_from_dict(path, "training", data.get("training")), convention


def training_from_dict(path: Path, where: str, data: Any) -> TrainingSpec:
    """Read back :func:`training_dict` (errors name ``path`` and the field ``where``)."""
    t = check_fields(path, where, data, {"global_batch", "seq_len"},
                     {f.name for f in fields(TrainingSpec)})
    flags = training_flags(path, t, where)
    chosen = {k: choice(path, f"{where}.{k}", t[k], enum)
              for k, enum in TRAINING_CHOICES.items() if t.get(k) is not None}
    ints = {k: integer(path, f"{where}.{k}", v, minimum=1) for k, v in t.items()
            if k not in ("recompute_modules", *TRAINING_CHOICES, *flags)}
    modules = t.get("recompute_modules")
    if modules is not None:
        if not isinstance(modules, list) or not modules:
            raise fail(path, f"{where}.recompute_modules", "must be a list of module names")
        modules = tuple(choice(path, f"{where}.recompute_modules", m, RecomputeModule)
                        for m in modules)
    return spec_or_fail(path, where, lambda: TrainingSpec(
        **ints, **chosen, **flags, recompute_modules=modules))


def _value(value: Any) -> str:
    """A training field's value as a plan file writes it."""
    return str(getattr(value, "value", value))


def _mapping(path: Path, field: str, value: Any) -> dict:
    if not isinstance(value, dict):
        raise fail(path, field, f"must be a mapping, but got {type(value).__name__}")
    return value


def _name(path: Path, field: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise fail(path, f"{field}.name", "missing; give the name")
    return value


_STRATEGY_FIELDS = set(strategy_dict(Strategy()))
_UNEVEN = {"first_stage_layers", "last_stage_layers", "layout"}
_COUNTS = ("dp", "tp", "pp", "sp", "zero", "micro_batch", "v")
_WHOLE = _COUNTS + ("first_stage_layers", "last_stage_layers", "shard_group", "ep", "etp",
                    "recompute_layers", "offload_layers")
"""The strategy's counts (``_COUNTS`` always, the others where set): a plan file's must be whole
numbers (YAML's 4.9 or true is refused, not truncated)."""


_CHOICES = {"zero": ZeroStage, "recompute": Recompute, "schedule": Schedule}
"""The strategy's fields of a fixed set of values: a plan file's other value is named with
them (not as the enum's own error)."""


def _strategy(path: Path, data: Any) -> Strategy:
    e = check_fields(path, "strategy", data, _STRATEGY_FIELDS,
                     {"precision", "shard_group", "ep", "etp", "ep_overlap", "ep_dedup",
                      "recompute_layers", "offload_layers"} | _UNEVEN)
    if not isinstance(e["placement"], list):
        raise fail(path, "strategy.placement", "must be a list of dp, tp, pp, sp, innermost first")
    for field in _WHOLE:
        if e.get(field) is not None or field in _COUNTS:
            integer(path, f"strategy.{field}", e.get(field), minimum=0)
    for field, kind in _CHOICES.items():
        allowed = [str(c.value) for c in kind]
        if e.get(field) is not None and str(e[field]) not in allowed:
            raise fail(path, f"strategy.{field}", f"{e[field]!r} is not one of"
                       f" {', '.join(allowed)}")
    try:
        return strategy_from_attrs(e)
    except (ValueError, TypeError) as err:
        raise fail(path, "strategy", str(err)) from None


def read_plan(path: Path) -> Plan:
    """A plan file (YAML or JSON), its strategy estimated again."""
    data = _mapping(path, "top level", load(path, "plan file"))
    if data.get("format") != FORMAT:
        raise fail(path, "format", f"must be {FORMAT!r}; write plan files with `planner export"
                   " --format plan`")
    model, system, training, convention = specs_from_dict(path, data)
    given = data.get("given_training")
    given = None if given is None else training_from_dict(path, "given_training", given)
    field = None if given is None else given_disagrees(given, training)
    if field is not None:
        raise fail(path, f"given_training.{field}", f"is {_value(getattr(given, field))} where"
                   f" training.{field} is {_value(getattr(training, field))}: the study's"
                   " training as written and as its framework ran it must agree but for what"
                   " the framework filled in; edit both, or remove given_training")
    strategy = _strategy(path, data.get("strategy"))
    try:
        return make_plan(model, system, training, strategy, convention,
                         study=data.get("study"), trial=data.get("trial"), given_training=given)
    except ValueError as e:
        raise fail(path, "strategy", str(e)) from None


def plan_text(plan: Plan, suffix: str) -> str:
    data = plan_dict(plan)
    if suffix == ".json":
        return json.dumps(data, indent=2) + "\n"
    return ("# Parallel Planner plan: `planner estimate --plan THIS_FILE` estimates it again\n"
            + yaml.safe_dump(data, sort_keys=False, width=100))


def write_plan(plan: Plan, path: Path) -> None:
    path.write_text(plan_text(plan, path.suffix))


# -- from a stored study ----------------------------------------------------------------------
def study_specs(study: optuna.Study
                ) -> tuple[ModelSpec, SystemSpec, TrainingSpec, Convention]:
    """The specs a study was made from: stored on it at creation, else its YAML file again."""
    stored = study.user_attrs.get("specs")
    where = Path(f"study {study.study_name!r}")
    if isinstance(stored, dict):
        return specs_from_dict(where, stored)
    from planner.study_config import load_study_config  # studies made before specs were stored
    summary = study.user_attrs.get("config") or {}
    file = summary.get("file")
    if not file or not Path(file).is_file():
        raise PlannerUsageError(f"{where}: stores no specs and its file {file!r} is gone; run"
                                " the study again")
    hbm = summary.get("hbm_gb")
    config = load_study_config(Path(file), hbm_gb=hbm)
    return config.model, config.system, config.training, config.convention


def study_given_training(study: optuna.Study) -> TrainingSpec | None:
    """The training as a ``framework`` study wrote it (:attr:`Plan.given_training`), stored on
    it at creation; None for a study of any framework, or one stored before it was kept."""
    stored = study.user_attrs.get("given_training")
    if not isinstance(stored, dict):
        return None
    return training_from_dict(Path(f"study {study.study_name!r}"), "given_training", stored)


def plans_from_study(study: optuna.Study, top: int) -> list[Plan]:
    """The study's ``top`` best feasible plans (``planner best``'s order), estimated again."""
    from planner.tables import best_frame

    return plans_from_frame(study, best_frame(study, top))


def plans_from_frame(study: optuna.Study, best: pd.DataFrame) -> list[Plan]:
    """The plans of rows of the study's :func:`planner.tables.best_frame`, estimated again."""
    specs, given = study_specs(study), study_given_training(study)
    return [_plan(study, specs, given, row) for _, row in best.iterrows()]


def _plan(study: optuna.Study, specs: tuple[ModelSpec, SystemSpec, TrainingSpec, Convention],
          given: TrainingSpec | None, row: Any) -> Plan:
    model, system, training, convention = specs
    return make_plan(model, system, training, strategy_from_attrs(row.to_dict()), convention,
                     study=study.study_name, trial=int(row["number"]), given_training=given)


def plan_at(study: optuna.Study, rank: int, storage_option: str = "") -> Plan:
    """The ``rank``-th best plan (1 is the best), or a one-line error if there are fewer;
    ``storage_option`` (:func:`planner.storage.storage_option`) goes into its hint."""
    if rank < 1:
        raise PlannerUsageError(f"--plan must be >= 1 (1 is the best plan), but got {rank}")
    from planner.tables import best_count, best_frame

    best = best_frame(study, rank)
    if len(best) < rank:
        raise PlannerUsageError(f"--plan {rank}: study {study.study_name!r} has only"
                                f" {best_count(study, len(best))}; `planner best"
                                f" {study.study_name}{storage_option}` lists them")
    return _plan(study, study_specs(study), study_given_training(study), best.iloc[rank - 1])
