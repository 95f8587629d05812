"""A study YAML file, checked field by field and turned into typed specs and a search space.

::

    name: lab4b-llama70b-system1     # default: the file's name without .yaml
    model: llama70b                  # a catalog name or a YAML path
    system: lab-system1
    convention: stage                # default: the model family's (megatron for gpt / llama)
    congestion: unaware              # or aware: flows that share a link queue on it
    framework: any                   # or megatron, deepspeed, torchtitan: plans it can run
    training: {global_batch: 512}    # seq_len defaults to the model's
    hbm_gb: unlimited                # default: the device's HBM
    objectives: [step_time]          # or [step_time, peak_memory]
    sampler: exhaustive              # tpe, nsga2, gp, random, exhaustive
    n_trials: 200                    # for the samplers
    seed: 0
    space:
      tp: powers_of_two              # or a list; dp defaults to what the others leave
      sp: powers_of_two
      recompute: [none, full]

Every problem is one line naming the file, the field and the fix (PlannerUsageError).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import reprlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from planner.catalog import Catalog, load_catalog
from planner.catalog_network import spec_or_fail
from planner.errors import PlannerUsageError
from planner.fields import (
    MAX_NUMBER,
    TRAINING_FLAGS,
    choice,
    fail,
    fields,
    integer,
    number,
    placement_axes,
    training_flags,
)
from planner.inputs import load
from planner.record import Evaluator
from planner.units import GB
from search_spaces import StrategySpace, powers_of_two
from search_spaces.frameworks import ANY, FRAMEWORKS, with_framework_defaults
from simcore.megatron.checks import recompute_modules_problem
from simcore.megatron.precision import fp8_attention_problem
from simcore import convention_of
from simcore.network import Congestion
from simcore.specs import (
    TRAINING_CHOICES,
    Axis,
    Convention,
    CpComm,
    CrossEntropy,
    ModelSpec,
    Precision,
    Recompute,
    RecomputeModule,
    Schedule,
    SelectiveRecompute,
    SystemSpec,
    TrainingSpec,
    ZeroStage,
)

__all__ = ["OBJECTIVES", "SAMPLERS", "StudyConfig", "load_study_config", "with_congestion"]

SAMPLERS = ("exhaustive", "tpe", "nsga2", "gp", "random")
OBJECTIVES = ("step_time", "peak_memory")
METRIC_NAMES = {"step_time": "step_time_s", "peak_memory": "peak_memory_gb"}

_FIELDS = {"model", "system", "training", "space"}
_OPTIONAL = {"name", "description", "convention", "hbm_gb", "objectives", "sampler", "n_trials",
             "seed", "vocab_multiple", "congestion", "framework"}
_TRAINING = {"global_batch"}
_TRAINING_OPTIONAL = {"seq_len", "grad_bytes", "optimizer_bytes", "recompute_modules",
                      *TRAINING_FLAGS, *TRAINING_CHOICES}
_SPACE_KNOBS = {"dp", "tp", "pp", "sp", "zero", "fsdp", "recompute", "micro_batch", "schedule",
                "v", "placement", "sequence_parallel", "precision", "uneven", "shard_group",
                "ep", "etp", "ep_overlap", "ep_dedup", "recompute_layers", "offload_layers"}
_POWERS = ("powers_of_two", "powers of two")
DEFAULT_N_TRIALS = 200
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")
"""A study name is a safe file name: exports go to ``planner-results/exports/NAME``, so ``..``
or a slash would write outside it."""


@dataclass(frozen=True)
class StudyConfig:
    """Everything a study needs, resolved: specs, the space, objectives and sampler."""

    name: str
    path: Path
    model: ModelSpec
    system: SystemSpec
    training: TrainingSpec
    convention: Convention
    hbm_gb: float | None
    """The HBM limit per device in GB (decimal); None is unlimited."""
    objectives: tuple[str, ...]
    sampler: str
    n_trials: int
    seed: int
    space: StrategySpace
    description: str = ""
    hbm_override: float | None = None
    """The command line's --hbm-gb, if given (workers re-read the file with it)."""

    def evaluator(self) -> Evaluator:
        return Evaluator(self.model, self.system, self.training, self.convention, self.hbm_gb,
                         len(self.objectives) == 2)

    @property
    def metric_names(self) -> list[str]:
        return [METRIC_NAMES[o] for o in self.objectives]

    def summary(self) -> dict[str, Any]:
        """What the study was made from, stored on it (JSON-safe)."""
        sp = self.space
        return {
            "file": str(self.path), "model": self.model.name, "system": self.system.name,
            "devices": self.system.devices, "convention": self.convention.value,
            "global_batch": self.training.global_batch, "seq_len": self.training.seq_len,
            **({"flash_attention": self.training.flash_attention}
               if self.training.flash_attention is not None else {}),
            **({"transformer_engine": self.training.transformer_engine}
               if self.training.transformer_engine is not None else {}),
            **({"recompute_early_stop": self.training.recompute_early_stop}
               if self.training.recompute_early_stop is not None else {}),
            **({"grad_copy": True} if self.training.grad_copy else {}),
            **({"grad_bytes": self.training.bytes_per_param_grads}
               if self.training.bytes_per_param_grads != 2 else {}),
            **({"optimizer_bytes": self.training.bytes_per_param_optimizer}
               if self.training.bytes_per_param_optimizer != 12 else {}),
            **({"master_weights": False} if not self.training.master_weights else {}),
            **({"fsdp_no_sync": True} if self.training.fsdp_no_sync else {}),
            **({"swiglu_fusion": False} if not self.training.swiglu_fusion else {}),
            **({"fp8_attention": True} if self.training.fp8_attention else {}),
            **({"vocab_parallel_embedding": False}
               if not self.training.vocab_parallel_embedding else {}),
            **({"recompute_modules": [m.value for m in self.training.recompute_modules]}
               if self.training.recompute_modules is not None else {}),
            # any recompute and loss but Megatron-LM's, which a megatron or deepspeed study names
            # and which estimate as before, so those studies keep their fingerprints
            **({"selective_recompute": SelectiveRecompute.OP.value}
               if self.training.selective_recompute is SelectiveRecompute.OP else {}),
            **({"cross_entropy": self.training.cross_entropy.value}
               if self.training.cross_entropy not in (None, CrossEntropy.FUSED) else {}),
            # where the space has context parallelism (so that studies without it, a
            # deepspeed study's among them, keep their fingerprints)
            **({"cp_comm": self.training.cp_comm.value}
               if self.training.cp_exchange is not CpComm.P2P and max(sp.sp) > 1 else {}),
            **({"congestion": self.system.network.congestion.value}
               if self.system.network.congestion is not Congestion.UNAWARE else {}),
            **({"framework": sp.framework} if sp.framework != ANY else {}),
            "hbm_gb": self.hbm_gb, "objectives": list(self.objectives), "sampler": self.sampler,
            "n_trials": self.n_trials, "seed": self.seed, "vocab": self.model.vocab,
            "space": {
                "dp": list(sp.dp) if sp.dp is not None else "auto", "tp": list(sp.tp),
                "pp": list(sp.pp), "sp": list(sp.sp), "zero": [int(z) for z in sp.zero],
                "recompute": [r.value for r in sp.recompute],
                "micro_batch": list(sp.micro_batch), "schedule": [s.value for s in sp.schedule],
                "v": list(sp.v), "placement": [",".join(p) for p in sp.placement],
                "sequence_parallel": list(sp.sequence_parallel),
                **({"precision": [p.value for p in sp.precision]}
                   if sp.precision != (Precision.BF16,) else {}),
                **({"uneven": list(sp.uneven)} if sp.uneven != (0,) else {}),
                **({"shard_group": list(sp.shard_group)} if sp.shard_group != (0,) else {}),
                **({"recompute_layers": list(sp.recompute_layers)}
                   if sp.recompute_layers != (0,) else {}),
                **({"offload_layers": list(sp.offload_layers)}
                   if sp.offload_layers != (0,) else {}),
                **({"ep": list(sp.ep)} if sp.ep != (1,) else {}),
                **({"etp": ["tp" if e is None else e for e in sp.etp]}
                   if sp.etp != (None,) else {}),
                **({"ep_overlap": list(sp.ep_overlap)} if sp.ep_overlap != (False,) else {}),
                **({"ep_dedup": list(sp.ep_dedup)} if sp.ep_dedup != (False,) else {}),
            },
            **({"description": self.description} if self.description else {}),
        }

    def fingerprint(self) -> str:
        """A hash of what decides the trials' results (not the sampler's budget)."""
        keep = {k: v for k, v in self.summary().items()
                if k not in ("file", "n_trials", "description")}
        return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


def _short(value: Any) -> str:
    return reprlib.repr(value)


def _ref(path: Path, field: str, value: Any, kind: str, catalog: Catalog) -> Any:
    if not isinstance(value, str) or not value:
        raise fail(path, field, f"must be a {kind} name from the catalog or a YAML path")
    return getattr(catalog, kind)(value, where=(path, field))


def _list(path: Path, field: str, value: Any) -> list:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise fail(path, field, "is empty; list at least one value")
    return items


def _degrees(path: Path, field: str, value: Any, limit: int) -> tuple[int, ...]:
    if isinstance(value, str) and value.strip().lower() in _POWERS:
        return powers_of_two(limit)
    out = []
    for i, item in enumerate(_list(path, field, value)):
        out.append(integer(path, f"{field}[{i}]" if isinstance(value, list) else field, item,
                           minimum=1))
    return tuple(dict.fromkeys(out))


def _enums(path: Path, field: str, value: Any, enum: type) -> tuple:
    return tuple(dict.fromkeys(choice(path, field, item, enum)
                               for item in _list(path, field, value)))


def _bools(path: Path, field: str, value: Any) -> tuple[bool, ...]:
    out = []
    for item in _list(path, field, value):
        if not isinstance(item, bool):
            raise fail(path, field, f"must be true or false (or a list of them), but got {item!r}")
        out.append(item)
    return tuple(dict.fromkeys(out))


def _placements(path: Path, field: str, value: Any) -> tuple[tuple[Axis, ...], ...]:
    items = _list(path, field, value)
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


def _space(path: Path, raw: Any, model: ModelSpec, system: SystemSpec, training: TrainingSpec,
           convention: Convention, framework: str) -> StrategySpace:
    e = fields(path, "space", raw, set(), _SPACE_KNOBS)
    n = system.devices
    if "zero" in e and "fsdp" in e:
        raise fail(path, "space.fsdp", "give zero or fsdp, not both (fsdp: true is zero: 3)")
    kw: dict[str, Any] = {}
    dp = e.get("dp", "auto")
    kw["dp"] = None if dp == "auto" else _degrees(path, "space.dp", dp, n)
    for knob in ("tp", "pp", "sp"):
        if knob in e:
            kw[knob] = _degrees(path, f"space.{knob}", e[knob], n)
    if "zero" in e:
        kw["zero"] = tuple(ZeroStage(integer(path, "space.zero", z, minimum=0)) if
                           isinstance(z, int) and 0 <= z <= 3 else
                           _bad_zero(path, z) for z in _list(path, "space.zero", e["zero"]))
    if "fsdp" in e:
        kw["zero"] = tuple(ZeroStage.PARAMETERS if f else ZeroStage.NONE
                           for f in _bools(path, "space.fsdp", e["fsdp"]))
    if "recompute" in e:
        kw["recompute"] = _enums(path, "space.recompute", e["recompute"], Recompute)
    if "micro_batch" in e:
        kw["micro_batch"] = _degrees(path, "space.micro_batch", e["micro_batch"],
                                     training.global_batch)
    if "schedule" in e:
        kw["schedule"] = _enums(path, "space.schedule", e["schedule"], Schedule)
    if "v" in e:
        kw["v"] = _degrees(path, "space.v", e["v"], model.layers)
    if "placement" in e:
        kw["placement"] = _placements(path, "space.placement", e["placement"])
    if "sequence_parallel" in e:
        kw["sequence_parallel"] = _bools(path, "space.sequence_parallel", e["sequence_parallel"])
    if "precision" in e:
        kw["precision"] = _enums(path, "space.precision", e["precision"], Precision)
    if "uneven" in e:  # layers fewer on the first and last stage (search_spaces.space.short_ends)
        kw["uneven"] = tuple(dict.fromkeys(integer(path, "space.uneven", k, minimum=0)
                                           for k in _list(path, "space.uneven", e["uneven"])))
    if "shard_group" in e:  # shard groups for ZeRO-1 and ZeRO-3; 0: the whole dp * sp group
        kw["shard_group"] = tuple(dict.fromkeys(
            integer(path, "space.shard_group", k, minimum=0)
            for k in _list(path, "space.shard_group", e["shard_group"])))
    if "recompute_layers" in e:  # layers of each chunk that full recompute runs; 0: all
        kw["recompute_layers"] = tuple(dict.fromkeys(
            integer(path, "space.recompute_layers", k, minimum=0)
            for k in _list(path, "space.recompute_layers", e["recompute_layers"])))
        if (any(kw["recompute_layers"])
                and Recompute.FULL not in kw.get("recompute", (Recompute.NONE,))):
            raise fail(path, "space.recompute_layers", "it applies to full recompute; add full"
                       " to space.recompute, e.g. recompute: [none, full]")
    if "offload_layers" in e:  # layers that offload their activations to host memory; 0: none
        kw["offload_layers"] = tuple(dict.fromkeys(
            integer(path, "space.offload_layers", k, minimum=0)
            for k in _list(path, "space.offload_layers", e["offload_layers"])))
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
        kw["ep"] = _degrees(path, "space.ep", e["ep"], devices)
    if "ep_overlap" in e:
        kw["ep_overlap"] = _bools(path, "space.ep_overlap", e["ep_overlap"])
    if "ep_dedup" in e:
        kw["ep_dedup"] = _bools(path, "space.ep_dedup", e["ep_dedup"])
    if "etp" in e:
        kw["etp"] = tuple(dict.fromkeys(
            None if k == "tp" else integer(path, "space.etp", k, minimum=1)
            for k in _list(path, "space.etp", e["etp"])))


def _bad_zero(path: Path, z: Any) -> ZeroStage:
    raise fail(path, "space.zero", f"unknown ZeRO stage {z!r}; use 0, 1, 2 or 3 (3 is FSDP)")


def load_study_config(path: Path, *, hbm_gb: float | None = None, system: str | None = None,
                      catalog: Catalog | None = None) -> StudyConfig:
    """Read and check a study YAML; ``hbm_gb`` (the command line's --hbm-gb) overrides its
    limit, ``system`` (a catalog name or a YAML path) its system: either makes a study of its
    own, the name suffixed ``-<system>`` and ``-hbm<X>gb``."""
    catalog = catalog or load_catalog()
    raw = load(path, "study YAML")
    e = fields(path, "", raw, _FIELDS, _OPTIONAL, kind="study file")
    name = e.get("name", path.stem)
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name):
        raise fail(path, "name", f"must be a name of letters, digits, '.', '_', '+' or '-' that"
                   f" starts with a letter or digit (it names export folders), but got"
                   f" {_short(name)}")
    model = _ref(path, "model", e["model"], "model", catalog)
    override, system = system, _ref(path, "system", e["system"], "system", catalog)
    if override is not None:  # the same question on another system, a study of its own
        other = catalog.system(override)
        if other.name != system.name:
            name = f"{name}-{other.name}"
        system = other
    if "vocab_multiple" in e:
        k = integer(path, "vocab_multiple", e["vocab_multiple"], minimum=1)
        model = replace(model, vocab=math.ceil(model.vocab / k) * k)
    convention = (choice(path, "convention", e["convention"], Convention)
                  if "convention" in e else convention_of(model))
    if "congestion" in e:
        system = with_congestion(system, choice(path, "congestion", e["congestion"], Congestion),
                                 convention, lambda m: fail(path, "congestion", m))
    t = fields(path, "training", e["training"], _TRAINING, _TRAINING_OPTIONAL)
    flags = training_flags(path, t)
    chosen = {k: choice(path, f"training.{k}", t[k], enum)
              for k, enum in TRAINING_CHOICES.items() if t.get(k) is not None}
    modules = (None if t.get("recompute_modules") is None else  # a list of names, or one
               _enums(path, "training.recompute_modules", t["recompute_modules"],
                      RecomputeModule))
    batch = integer(path, "training.global_batch", t["global_batch"], minimum=1)
    seq_len = integer(path, "training.seq_len", t.get("seq_len", model.seq_len), minimum=1)
    grad_bytes = integer(path, "training.grad_bytes", t.get("grad_bytes", 2), minimum=1)
    optimizer_bytes = integer(path, "training.optimizer_bytes", t.get("optimizer_bytes", 12),
                              minimum=1)
    training = spec_or_fail(path, "training", lambda: TrainingSpec(
        **chosen, **flags, recompute_modules=modules, global_batch=batch, seq_len=seq_len,
        bytes_per_param_grads=grad_bytes, bytes_per_param_optimizer=optimizer_bytes))
    refused = recompute_modules_problem(model, training)
    if refused is not None:
        raise fail(path, "training.recompute_modules", refused)
    limit = _hbm(path, e.get("hbm_gb"), system)
    if hbm_gb is not None:  # --hbm-gb: the same question under another limit, a study of its own
        if not (0 < hbm_gb <= MAX_NUMBER):
            raise PlannerUsageError(f"--hbm-gb must be a number > 0 (GB per device), but got"
                                    f" {hbm_gb:g}")
        if hbm_gb != limit:
            name = f"{name}-hbm{hbm_gb:g}gb"
        limit = hbm_gb
    if limit is not None:
        system = replace(system, device=replace(system.device, hbm_bytes=limit * GB))
    objectives = tuple(_list(path, "objectives", e.get("objectives", ["step_time"])))
    if objectives not in (("step_time",), ("step_time", "peak_memory")):
        raise fail(path, "objectives", f"must be [step_time] or [step_time, peak_memory], but"
                   f" got {list(objectives)!r}")
    sampler = e.get("sampler", "exhaustive")
    if sampler not in SAMPLERS:
        raise fail(path, "sampler", f"unknown sampler {sampler!r}; use one of"
                   f" {', '.join(SAMPLERS)}")
    n_trials = integer(path, "n_trials", e.get("n_trials", DEFAULT_N_TRIALS), minimum=1)
    seed = integer(path, "seed", e.get("seed", 0), minimum=0)
    framework = e.get("framework", ANY)
    if framework not in FRAMEWORKS:
        raise fail(path, "framework", f"unknown framework {framework!r}; use one of"
                   f" {', '.join(FRAMEWORKS)}")
    training = with_framework_defaults(training, framework, system.device.transformer_engine)
    space = _space(path, e["space"], model, system, training, convention, framework)
    if training.fp8_attention and any(q.quantized for q in space.precision):
        problem = fp8_attention_problem(system.device)
        if problem is not None:
            raise fail(path, "training.fp8_attention", problem)
    description = e.get("description", "")
    return StudyConfig(name=name, path=path, model=model, system=system, training=training,
                       convention=convention, hbm_gb=limit, objectives=objectives,
                       sampler=sampler, n_trials=n_trials, seed=seed, space=space,
                       description=str(description), hbm_override=hbm_gb)


def with_congestion(system: SystemSpec, congestion: Congestion, convention: Convention,
                    problem: Callable[[str], PlannerUsageError]) -> SystemSpec:
    """The system with its collectives timed by ``congestion``; the stage convention replays
    ASTRA-sim's congestion-unaware runs, so it refuses the aware model."""
    if congestion is Congestion.AWARE and convention is Convention.STAGE:
        raise problem("the stage convention replays ASTRA-sim's congestion-unaware backend;"
                      " use congestion: unaware, or convention: megatron")
    return replace(system, network=replace(system.network, congestion=congestion))


def _hbm(path: Path, value: Any, system: SystemSpec) -> float | None:
    if value is None:
        return system.device.hbm_bytes / GB
    if isinstance(value, str) and value.strip().lower() == "unlimited":
        return None
    return number(path, "hbm_gb", value, minimum=0, strict=True)
