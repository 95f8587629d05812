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
    training_flags,
)
from planner.inputs import load
from planner.record import Evaluator
from planner.study_space import as_list, enums, space_from_entry
from planner.units import GB
from search_spaces import StrategySpace
from search_spaces.frameworks import (
    ANY,
    FRAMEWORKS,
    TORCHTITAN_GRAD_BYTES,
    with_framework_defaults,
)
from simcore import CONVENTIONS_OF_FAMILY, convention_of
from simcore.megatron.checks import recompute_modules_problem
from simcore.megatron.precision import fp8_attention_problem
from simcore.network import Congestion
from simcore.specs import (
    TRAINING_CHOICES,
    Convention,
    CpComm,
    CrossEntropy,
    ModelSpec,
    Precision,
    RecomputeModule,
    SelectiveRecompute,
    SystemSpec,
    TrainingSpec,
)

__all__ = ["OBJECTIVES", "SAMPLERS", "StudyConfig", "load_study_config", "with_congestion"]

SAMPLERS = ("exhaustive", "tpe", "nsga2", "gp", "random")
OBJECTIVES = ("step_time", "peak_memory")
METRIC_NAMES = {"step_time": "step_time_s", "peak_memory": "peak_memory_gb"}

_FIELDS = {"model", "system", "training", "space"}
_OPTIONAL = {"name", "description", "convention", "hbm_gb", "objectives", "sampler", "n_trials",
             "seed", "vocab_multiple", "congestion", "framework"}
_TRAINING = {"global_batch"}
_TRAINING_OPTIONAL = {"seq_len", "grad_bytes", "grad_reduce_bytes", "optimizer_bytes",
                      "recompute_modules",
                      *TRAINING_FLAGS, *TRAINING_CHOICES}
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
    given_training: TrainingSpec | None = None
    """The training as the file wrote it, before its ``framework``'s defaults (None: as
    ``training``): :attr:`planner.plan.Plan.given_training`."""

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
            **({"main_grad_copy": True} if self.training.main_grad_copy else {}),
            **({"fp32_grad_partition": True} if self.training.fp32_grad_partition else {}),
            **({"async_tp_allreduce": False} if self.training.async_tp_allreduce is False else {}),
            **({"pipeline_no_sync": True} if self.training.pipeline_no_sync else {}),
            **({"fused_norm": False} if not self.training.fused_norm else {}),
            **({"rope_fusion": False} if not self.training.rope_fusion else {}),
            **({"grad_all_reduce": True} if self.training.grad_all_reduce else {}),
            **({"grad_reduce_bytes": self.training.grad_reduce_bytes}
               if self.training.grad_reduce_bytes is not None else {}),
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
        given = ("" if "name" in e else
                 "; with no name: field the file's name is the study's, so add one")
        raise fail(path, "name", f"must be a name of up to 200 letters, digits, '.', '_', '+'"
                   f" or '-' that starts with a letter or digit (it names export folders), but"
                   f" got {_short(name)}{given}")
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
    allowed = CONVENTIONS_OF_FAMILY[model.family]
    if convention not in allowed:
        raise fail(path, "convention", f"model {model.name} ({model.family.value} family) cannot"
                   f" use {convention.value}; use {' or '.join(c.value for c in allowed)}")
    if "congestion" in e:
        system = with_congestion(system, choice(path, "congestion", e["congestion"], Congestion),
                                 convention, lambda m: fail(path, "congestion", m))
    t = fields(path, "training", e["training"], _TRAINING, _TRAINING_OPTIONAL)
    flags = training_flags(path, t)
    chosen = {k: choice(path, f"training.{k}", t[k], enum)
              for k, enum in TRAINING_CHOICES.items() if t.get(k) is not None}
    modules = (None if t.get("recompute_modules") is None else  # a list of names, or one
               enums(path, "training.recompute_modules", t["recompute_modules"],
                      RecomputeModule))
    batch = integer(path, "training.global_batch", t["global_batch"], minimum=1)
    seq_len = integer(path, "training.seq_len", t.get("seq_len", model.seq_len), minimum=1)
    grad_bytes = integer(path, "training.grad_bytes", t.get("grad_bytes", 2), minimum=1)
    if e.get("framework") == "torchtitan" and grad_bytes != TORCHTITAN_GRAD_BYTES and (
            "grad_bytes" in t):
        raise fail(path, "training.grad_bytes", f"torchtitan reduces the gradients in float32"
                   f" only (mixed_precision_reduce): {TORCHTITAN_GRAD_BYTES}, or leave it out")
    optimizer_bytes = integer(path, "training.optimizer_bytes", t.get("optimizer_bytes", 12),
                              minimum=1)
    if t.get("optimizer_bytes") is not None and t.get("master_weights") is False:
        # 12 is the default: given beside master_weights false, it was read as left out
        raise fail(path, "training.optimizer_bytes", "master_weights false sets the optimizer"
                   " state (Adam's two moments in the weights' type); leave optimizer_bytes out"
                   " or set master_weights true")
    reduce_bytes = (None if t.get("grad_reduce_bytes") is None else
                    integer(path, "training.grad_reduce_bytes", t["grad_reduce_bytes"], minimum=1))
    training = spec_or_fail(path, "training", lambda: TrainingSpec(
        **chosen, **flags, recompute_modules=modules, global_batch=batch, seq_len=seq_len,
        bytes_per_param_grads=grad_bytes, bytes_per_param_optimizer=optimizer_bytes,
        grad_reduce_bytes=reduce_bytes))
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
    objectives = tuple(as_list(path, "objectives", e.get("objectives", ["step_time"])))
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
    if framework != ANY and (training.grad_all_reduce or training.grad_reduce_bytes):
        key = "grad_all_reduce" if training.grad_all_reduce else "grad_reduce_bytes"
        raise fail(path, f"training.{key}", f"is a stack's own data-parallel reduction (Aleph"
                   f" Alpha's Scaling); framework {framework} reduces its own way: remove it or"
                   f" the study's framework")
    given, training = training, with_framework_defaults(training, framework,
                                                        system.device.transformer_engine)
    space = space_from_entry(path, e["space"], model, system, training, convention, framework)
    if training.fp8_attention and any(q.quantized for q in space.precision):
        problem = fp8_attention_problem(system.device)
        if problem is not None:
            raise fail(path, "training.fp8_attention", problem)
    description = e.get("description", "")
    return StudyConfig(name=name, path=path, model=model, system=system, training=training,
                       convention=convention, hbm_gb=limit, objectives=objectives,
                       sampler=sampler, n_trials=n_trials, seed=seed, space=space,
                       description=str(description), hbm_override=hbm_gb,
                       given_training=given)


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
