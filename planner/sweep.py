"""A sweep: throughput and step time against one knob, the rest fixed or re-optimised.

A sweep is a figure, not a stored study: it lists the study's valid strategies
(:attr:`search_spaces.StrategySpace.valid`), keeps those ``where`` allows, estimates each with
:func:`simcore.estimate` and, for every (panel, line, x) value, keeps the feasible plan of the
highest throughput. A knob not on the x axis, the lines or the panels is thus re-optimised per
point over what the study lists; ``where`` with one value fixes it.

Knobs are the strategy's (``dp``, ``tp``, ... as the study's ``space`` names them) plus four
derived ones: ``micro_batches`` (the micro-batch count per step, DistIR's knob: global batch /
(dp * micro_batch)), and ``devices``, ``global_batch`` and ``width`` (the MLP's width, DistIR's
input dim), which the sweep varies by re-making the study for each value: the system resized
(a one-dimensional network only: the same dimension with N NPUs), the batch or the model
changed, and the space's ``powers_of_two`` lists re-expanded to the new limits.

Knows specs, the space and simcore; nothing of plots or the command line.
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import simcore
from planner.errors import PlannerUsageError
from planner.fields import load
from planner.study_config import StudyConfig
from planner.units import GB
from search_spaces import StrategySpace, powers_of_two, strategy_label
from simcore.estimate import Estimate
from simcore.specs import Family, Strategy, SystemSpec

__all__ = [
    "KNOBS",
    "Case",
    "Knob",
    "Sweep",
    "SweepPoint",
    "SweepRequest",
    "knob_name",
    "run_sweep",
    "sweep_rows",
]

Value = int | str | bool


@dataclass(frozen=True, slots=True)
class Knob:
    """One thing a sweep can put on an axis, the lines or the panels."""

    label: str
    """How an axis names it."""
    short: str
    """How a line or a panel names it: ``<short> = <value>``."""
    kind: type
    """``int`` (drawn on a log axis), ``str`` or ``bool`` (categories)."""


KNOBS: dict[str, Knob] = {
    "dp": Knob("data-parallel degree (dp)", "dp", int),
    "tp": Knob("tensor-parallel degree (tp, DistIR's hp)", "tp", int),
    "pp": Knob("pipeline stages (pp)", "pp", int),
    "sp": Knob("context-parallel degree (sp)", "sp", int),
    "zero": Knob("ZeRO stage", "ZeRO", int),
    "recompute": Knob("recompute", "recompute", str),
    "micro_batch": Knob("micro-batch size", "micro-batch", int),
    "micro_batches": Knob("micro-batches per step", "micro-batches", int),
    "schedule": Knob("pipeline schedule", "schedule", str),
    "v": Knob("model chunks per device (v)", "v", int),
    "placement": Knob("placement", "placement", str),
    "sequence_parallel": Knob("sequence parallel", "sequence parallel", bool),
    "precision": Knob("precision", "precision", str),
    "devices": Knob("devices", "devices", int),
    "global_batch": Knob("global batch", "batch", int),
    "width": Knob("MLP width", "width", int),
}
"""Every knob a sweep knows, in the order errors list them."""

ALIASES = {"hp": "tp", "num_microbatches": "micro_batches", "microbatches": "micro_batches"}
"""DistIR's names for our knobs."""

_POWERS = ("powers_of_two", "powers of two")
_DEGREE_LIMITS = {"dp": "devices", "tp": "devices", "pp": "devices", "sp": "devices",
                  "micro_batch": "global_batch", "v": "layers"}
"""Which limit a ``powers_of_two`` list of each knob runs up to."""


def knob_name(option: str, name: str) -> str:
    """The knob ``name`` stands for; a one-line error naming the option and the closest knobs."""
    name = ALIASES.get(name, name)
    if name in KNOBS:
        return name
    close = difflib.get_close_matches(name, list(KNOBS) + list(ALIASES), n=2)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise PlannerUsageError(f"{option} {name}: unknown knob; {hint}use one of"
                            f" {', '.join(KNOBS)}")


@dataclass(frozen=True)
class SweepRequest:
    """What to vary and how to draw it (knob names already checked by :func:`knob_name`)."""

    x: str
    lines: str | None = None
    panels: str | None = None
    where: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Knob -> the values a plan may take (as typed); one value fixes the knob."""
    devices: tuple[int, ...] = ()
    """Device counts to re-make the study for; empty: the study's system only."""
    global_batches: tuple[int, ...] = ()
    widths: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        shown = [(o, k) for o, k in (("--x", self.x), ("--lines", self.lines),
                                     ("--panels", self.panels)) if k is not None]
        for (o1, k1), (o2, k2) in itertools.combinations(shown, 2):
            if k1 == k2:
                raise PlannerUsageError(f"{o2} {k2}: already the knob of {o1}; give each of"
                                        " --x, --lines and --panels its own knob")


@dataclass(frozen=True)
class Case:
    """The study re-made for one device count, global batch and width."""

    devices: int
    global_batch: int
    width: int
    space: StrategySpace


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """The best feasible plan at one (panel, line, x)."""

    x: Value
    line: Value | None
    panel: Value | None
    strategy: Strategy
    estimate: Estimate
    case: Case
    candidates: int
    """How many listed plans (feasible or not) share these values: 1 means nothing was
    re-optimised."""

    @property
    def throughput(self) -> float:
        """Tokens/s (samples/s when a sequence is one token, as for the DistIR MLP)."""
        return self.estimate.tokens_per_s


@dataclass(frozen=True)
class Sweep:
    study: str
    request: SweepRequest
    throughput_unit: str
    """``tokens/s``, or ``samples/s`` when the sequence length is 1."""
    points: tuple[SweepPoint, ...]
    estimated: int
    """Plans estimated in all."""

    def values(self, role: str) -> list[Value]:
        """The x, line or panel values that have a point, in ascending order."""
        found = {getattr(p, role) for p in self.points}
        return sorted(found, key=_order) if None not in found else [None]


def _order(value: Value) -> tuple[int, Any]:
    return (0, value) if isinstance(value, int) and not isinstance(value, bool) else (1, str(value))


# -- the cases: the study re-made per device count, batch and width -------------------------------
def _powers_knobs(config: StudyConfig) -> set[str]:
    """The space's knobs the study file writes as ``powers_of_two`` (they grow with the limits)."""
    raw = load(config.path, "study YAML")
    space = raw.get("space") if isinstance(raw, dict) else None
    if not isinstance(space, dict):
        return set()
    return {k for k, v in space.items()
            if k in _DEGREE_LIMITS and isinstance(v, str) and v.strip().lower() in _POWERS}


def resized(system: SystemSpec, devices: int) -> SystemSpec:
    """The system with ``devices`` NPUs on its one network dimension."""
    dims = system.network.dims
    if len(dims) != 1 or dims[0].width is not None:
        shape = "x".join(str(d.npus) for d in dims)
        raise PlannerUsageError(
            f"--devices: system {system.name} has a {len(dims)}-dimensional network ({shape},"
            f" {', '.join(d.topology.value for d in dims)}); a sweep resizes only a one-"
            "dimensional network without a width: use a study on such a system (e.g. distir-16)")
    network = replace(system.network, dims=(replace(dims[0], npus=devices),))
    return replace(system, network=network)


def cases(config: StudyConfig, request: SweepRequest) -> list[Case]:
    """The study for every (devices, global batch, width) the request names."""
    if request.widths and config.model.family is not Family.MLP:
        raise PlannerUsageError(f"--width: model {config.model.name} is a {config.model.family}"
                                " model; --width sets the MLP's width (the mlp family) only")
    grow = _powers_knobs(config) if request.devices or request.global_batches else set()
    out = []
    for n, batch, width in itertools.product(
            request.devices or (config.system.devices,),
            request.global_batches or (config.training.global_batch,),
            request.widths or (config.model.hidden,)):
        system = config.system if n == config.system.devices else resized(config.system, n)
        model = (config.model if width == config.model.hidden
                 else replace(config.model, hidden=width, ffn_hidden=width))
        training = replace(config.training, global_batch=batch)
        limits = {"devices": n, "global_batch": batch, "layers": model.layers}
        lists = {k: powers_of_two(limits[_DEGREE_LIMITS[k]]) for k in grow}
        space = replace(config.space, model=model, system=system, training=training, **lists)
        out.append(Case(n, batch, width, space))
    return out


# -- knob values ----------------------------------------------------------------------------------
def knob_value(knob: str, s: Strategy, case: Case) -> Value:
    """The value ``knob`` takes in plan ``s`` of ``case``."""
    if knob == "micro_batches":
        return case.global_batch // (s.dp * s.micro_batch)
    if knob in ("devices", "global_batch", "width"):
        return int(getattr(case, knob))
    value = getattr(s, knob)
    if knob == "placement":
        return ",".join(a.value for a in value)
    if knob == "zero":
        return int(value)
    if isinstance(value, bool | int):
        return value
    return str(value.value)


def _parse(knob: str, text: str) -> Value:
    kind = KNOBS[knob].kind
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise PlannerUsageError(f"--where {knob}={text}: {knob} is true or false")
        return text.lower() == "true"
    if kind is int:
        try:
            return int(text)
        except ValueError:
            raise PlannerUsageError(f"--where {knob}={text}: {knob} takes whole numbers, e.g."
                                    f" --where {knob}=1,2,4") from None
    return text


def _allowed(request: SweepRequest, listed: Mapping[str, set[Value]]) -> dict[str, set[Value]]:
    """``where`` as typed values, each checked against what the study lists."""
    allowed = {}
    for knob, texts in request.where.items():
        values = {_parse(knob, t) for t in texts}
        missing = sorted(values - listed[knob], key=_order)
        if missing:
            have = ", ".join(str(v) for v in sorted(listed[knob], key=_order))
            raise PlannerUsageError(f"--where {knob}={','.join(texts)}: no valid plan of the study"
                                    f" has {knob}={missing[0]}; it lists {knob} {have}")
        allowed[knob] = values
    return allowed


def _listed(plans: Iterable[tuple[Case, Strategy]], knobs: Iterable[str]) -> dict[str, set[Value]]:
    out: dict[str, set[Value]] = {k: set() for k in knobs}
    for case, s in plans:
        for k, seen in out.items():
            seen.add(knob_value(k, s, case))
    return out


# -- the sweep ------------------------------------------------------------------------------------
def _feasible(config: StudyConfig, est: Estimate) -> bool:
    """Under the study's HBM limit (none: every plan), as the study's trials count it."""
    return config.hbm_gb is None or est.memory.total / GB <= config.hbm_gb


def _check_knobs(request: SweepRequest) -> None:
    varied = {"devices": request.devices, "global_batch": request.global_batches,
              "width": request.widths}
    shown = {request.x, request.lines, request.panels}
    for knob, values in varied.items():
        if len(values) > 1 and knob not in shown:
            raise PlannerUsageError(f"--{knob.replace('_', '-')} gives {len(values)} values; draw"
                                    f" them with --x, --lines or --panels {knob}")


def run_sweep(config: StudyConfig, request: SweepRequest) -> Sweep:
    """Every point of the sweep: the best feasible plan per (panel, line, x) value."""
    _check_knobs(request)
    swept = cases(config, request)
    plans = [(case, s) for case in swept for s in case.space.valid]
    if not plans:  # why the first case has none: a --global-batch no dp divides, say
        why = swept[0].space.first_reason() if swept else "no case"
        raise PlannerUsageError(f"{config.path}: the study lists no valid plan to sweep"
                                f" ({why})")
    roles = [k for k in (request.x, request.lines, request.panels) if k is not None]
    listed = _listed(plans, set(request.where) | set(roles))
    allowed = _allowed(request, listed)
    kept = [(c, s) for c, s in plans
            if all(knob_value(k, s, c) in v for k, v in allowed.items())]
    if not kept:
        shown = " ".join(f"--where {k}={','.join(v)}" for k, v in request.where.items())
        raise PlannerUsageError(f"{shown}: no valid plan of the study has all of these values;"
                                " drop or widen one")
    groups: dict[tuple[Value | None, ...], list[tuple[Case, Strategy]]] = {}
    for c, s in kept:
        key = tuple(knob_value(k, s, c) if k is not None else None
                    for k in (request.panels, request.lines, request.x))
        groups.setdefault(key, []).append((c, s))
    points = [p for key, group in sorted(groups.items(), key=lambda kg: [_order(v) for v in kg[0]])
              if (p := _best(config, key, group)) is not None]
    if not points:
        raise PlannerUsageError(f"{config.path}: none of the {len(kept):,} plans swept fits in"
                                f" {config.hbm_gb:g} GB a device (hbm_gb); raise --hbm-gb, or"
                                " widen the study's space (tp, pp, zero, recompute)")
    unit = "samples/s" if config.training.seq_len == 1 else "tokens/s"
    return Sweep(config.name, request, unit, tuple(points), len(kept))


def _best(config: StudyConfig, key: Sequence[Value | None],
          group: Sequence[tuple[Case, Strategy]]) -> SweepPoint | None:
    """The feasible plan of the highest throughput (the first listed among equals)."""
    best: tuple[Case, Strategy, Estimate] | None = None
    for case, s in group:
        sp = case.space
        est = simcore.estimate(sp.model, sp.system, sp.training, s, sp.convention)
        if _feasible(config, est) and (best is None or est.tokens_per_s > best[2].tokens_per_s):
            best = (case, s, est)
    if best is None:
        return None
    panel, line, x = key
    assert x is not None  # every plan has a value of the x knob
    return SweepPoint(x=x, line=line, panel=panel, strategy=best[1], estimate=best[2],
                      case=best[0], candidates=len(group))


def sweep_rows(sweep: Sweep) -> list[dict[str, Any]]:
    """One row per point: its knob values, figures and plan (for ``--csv``)."""
    r = sweep.request
    rows = []
    for p in sweep.points:
        est = p.estimate
        rows.append({
            **({r.panels: p.panel} if r.panels else {}), **({r.lines: p.line} if r.lines else {}),
            r.x: p.x, f"throughput_{sweep.throughput_unit.replace('/', '_per_')}": p.throughput,
            "step_time_s": est.step_time, "peak_memory_gb": est.memory.total / GB,
            "mfu": est.mfu, "devices": p.case.devices, "global_batch": p.case.global_batch,
            "plan": strategy_label(p.strategy), "candidates": p.candidates,
        })
    return rows
