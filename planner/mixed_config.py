"""A study on a cluster that mixes device types (``planner mixed STUDY.yaml``)::

    description: Metis's first row
    model: metis-gpt-10l
    system: metis-a100-v100-16-16     # a system of node `groups` (systems/mixed.yaml)
    training: {global_batch: 128, seq_len: 1024}
    space:
      tp: [1, 2, 4]                   # inside a node; default powers of two up to the node
      recompute: [none, full]
      zero: [0, 1]
      schedule: 1f1b                  # or gpipe
    profile: my-cluster               # optional: measured layer costs (planner import-metis)

Each device's own HBM is the limit. Every problem is one line naming the file and the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.catalog import Catalog, load_catalog
from planner.fields import choice, fail, fields, integer
from planner.inputs import load
from planner.metis_io import profile_path, profiles_from_entry
from planner.study_space import as_list, degrees, enums, zero_stage_of
from search_spaces import powers_of_two
from search_spaces.mixed import MixedSpace, skeletons
from simcore.mixed import LayerProfiles, MixedSystemSpec
from simcore.specs import (
    CrossEntropy,
    Family,
    ModelSpec,
    Recompute,
    Schedule,
    TrainingSpec,
    ZeroStage,
)

__all__ = ["MixedStudy", "load_mixed_study"]

_FIELDS = {"model", "system", "training", "space"}
_OPTIONAL = {"name", "description", "profile"}
_SPACE = {"tp", "recompute", "zero", "schedule"}
MIXED_LOSS = CrossEntropy.MEGATRON_FUSED
"""The loss a mixed study prices: both frameworks that run a mixed plan
(:mod:`planner.exports.hetero`) run Megatron-LM's fused vocab-parallel loss as its
``--cross-entropy-loss-fusion`` runs by default, its jit-fused ``native`` implementation, 10 bytes
a logit (``cross_entropy_fusion_impl`` defaults to ``'native'`` in NVIDIA/Megatron-LM d98e8a64
``megatron/core/model_parallel_config.py``, which refuses ``te`` in ``arguments.py``;
FlagScale's config passes ``cross_entropy_loss_fusion`` on alone). Until stop 83 a mixed study
priced Transformer Engine's in-place 4 bytes, which neither runs, so its last stage could be
recommended at up to 6 bytes a logit less than it holds."""


@dataclass(frozen=True)
class MixedStudy:
    name: str
    path: Path
    description: str
    space: MixedSpace


def _system(path: Path, value: Any, catalog: Catalog) -> MixedSystemSpec:
    if not isinstance(value, str) or not value:
        raise fail(path, "system", "must be a system name from the catalog or a YAML path")
    system = catalog.any_system(value, where=(path, "system"))
    if not isinstance(system, MixedSystemSpec):
        raise fail(path, "system", f"{value!r} has one device type; plan on it with `planner"
                   " run` (a study of `planner mixed` names a system of node groups)")
    return system


def _profiles(path: Path, value: Any, model: ModelSpec) -> LayerProfiles:
    """A profile by name (``planner import-metis --name``) or by a path next to the study."""
    if not isinstance(value, str) or not value:
        raise fail(path, "profile", "must be a profile name (planner import-metis --name) or"
                   " the path of a profile YAML")
    file = Path(value) if value.endswith((".yaml", ".yml")) else profile_path(value)
    if not file.is_absolute() and value.endswith((".yaml", ".yml")):
        file = path.parent / file
    if not file.is_file():
        raise fail(path, "profile", f"{file} not found; run `planner import-metis ... --name"
                   f" {value}` first")
    data = load(file, "profile YAML")
    if not isinstance(data, dict) or len(data) != 1:
        raise fail(file, "profile", "must hold one profile (NAME: {layers, devices})")
    (name, entry), = data.items()
    profiles = profiles_from_entry(file, str(name), entry)
    if profiles.layers != model.layers:
        raise fail(path, "profile", f"{name} profiles a model of {profiles.layers} transformer"
                   f" layers but {model.name} has {model.layers}; name a model of the same"
                   " shape")
    return profiles


def _check_model(path: Path, model: ModelSpec) -> None:
    """A mixed cluster's plans are Megatron-LM's (the layer split, the stage costs and the
    exports): a transformer of the gpt or llama family without experts. A mixture-of-experts
    model priced as dense reported an MFU over 100%; an MLP or STAGE model was exported as a
    GPT."""
    if model.family not in (Family.GPT, Family.LLAMA):
        raise fail(path, "model", f"{model.name} is a {model.family.value} model; a mixed"
                   " cluster plans Megatron-LM's transformers (family gpt or llama): plan it"
                   " on one device type with `planner run`")
    if model.moe is not None:
        raise fail(path, "model", f"{model.name} is a mixture of experts, which mixed clusters"
                   " do not model yet; plan it on one device type with `planner run`")


def load_mixed_study(path: Path, *, catalog: Catalog | None = None) -> MixedStudy:
    catalog = catalog or load_catalog()
    raw = load(path, "study YAML")
    if isinstance(raw, dict) and isinstance(raw.get("system"), str) and raw["system"]:
        # a `planner run` study given here: say so before its fields (convention, space's
        # other knobs, ...) are refused one by one
        _system(path, raw["system"], catalog)
    e = fields(path, "", raw, _FIELDS, _OPTIONAL, kind="study file")
    name = e.get("name", path.stem)
    if not isinstance(name, str) or not name.strip() or any(c.isspace() for c in name):
        raise fail(path, "name", f"must be a name without spaces, but got {name!r}")
    if not isinstance(e["model"], str) or not e["model"]:
        raise fail(path, "model", "must be a model name from the catalog or a YAML path")
    model = catalog.model(e["model"], where=(path, "model"))
    _check_model(path, model)
    system = _system(path, e["system"], catalog)
    t = fields(path, "training", e["training"], {"global_batch"}, {"seq_len"})
    training = TrainingSpec(
        global_batch=integer(path, "training.global_batch", t["global_batch"], minimum=1),
        seq_len=integer(path, "training.seq_len", t.get("seq_len", model.seq_len), minimum=1),
        cross_entropy=MIXED_LOSS)
    s = fields(path, "space", e["space"] if e["space"] is not None else {}, set(), _SPACE)
    node = max(g.network.dims[0].npus for g in system.groups)
    kw: dict[str, Any] = {"tp": degrees(path, "space.tp", s["tp"], node) if "tp" in s
                          else powers_of_two(node)}
    if "recompute" in s:
        kw["recompute"] = enums(path, "space.recompute", s["recompute"], Recompute)
    if "zero" in s:
        kw["zero"] = tuple(dict.fromkeys(
            ZeroStage(z) if isinstance(z, int) and not isinstance(z, bool) and 0 <= z <= 3
            else zero_stage_of(path, z) for z in as_list(path, "space.zero", s["zero"])))
    if "schedule" in s:
        if isinstance(s["schedule"], list):  # "unknown value ['gpipe']; use one of gpipe, ..."
            raise fail(path, "space.schedule", "takes one schedule, not a list: 1f1b or gpipe")
        schedule = choice(path, "space.schedule", s["schedule"], Schedule)
        if schedule in (Schedule.INTERLEAVED, Schedule.ZBV):
            raise fail(path, "space.schedule", f"{schedule.value} is not modelled on mixed"
                       " systems; use 1f1b or gpipe")
        kw["schedule"] = schedule
    if "profile" in e:
        kw["profiles"] = _profiles(path, e["profile"], model)
    space = MixedSpace(model=model, system=system, training=training, **kw)
    if next(skeletons(space), None) is None:  # it failed on an empty table: KeyError 'fits'
        sizes = ", ".join(f"{g.name} {g.devices}" for g in system.groups)
        raise fail(path, "space.tp", f"no stage of tp {', '.join(map(str, space.tp))} fits the"
                   f" groups ({sizes} devices): tp must divide a node's GPUs and the model's"
                   " heads, KV heads and FFN width; list such degrees")
    return MixedStudy(name=name, path=path, description=str(e.get("description", "")),
                      space=space)
