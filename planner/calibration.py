"""Fit a device's few named calibration constants to measured runs (``planner calibrate``).

The constants are the device entry's own (:data:`CONSTANTS`): the achievable fractions of peak
FLOP/s on large GEMMs and of HBM bandwidth on element-wise kernels, the flash-attention
kernels' fraction of peak (classic stacks; Transformer Engine's fused attention apart), the
per-kernel launch floor, the host's cost of issuing a collective, and the framework's memory
allowance; the compute's slowdown beside a collective
(``overlap_slowdown``) only when asked for by name, as the catalog takes it from a measurement.
Nothing per run: every run is estimated with the same device.

The fit is an Optuna study (CMA-ES, seeded, so a fit is reproducible) over the constants the runs
can tell apart - the time constants need timed runs, the attention efficiency runs with flash
attention, the memory allowance runs with a measured peak - minimising the mean absolute log
error of step time plus that of memory, with a mild pull towards the device's current values
(:data:`PRIOR_WEIGHT`) so that a handful of runs cannot drive a constant to a bound it is not
measured at. The device's current values are the first trial, so the fit is never worse than
where it started on the objective.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import optuna

from planner.runs_csv import MeasuredRun
from planner.units import GB
from planner.validation import Validation, validate
from simcore.megatron import uses_flash_attention
from simcore.megatron.plan import uses_transformer_engine
from simcore.specs import DeviceSpec, SystemSpec

__all__ = ["Constant", "CONSTANTS", "Fit", "calibrate", "PRIOR_WEIGHT", "DEFAULT_TRIALS"]

PRIOR_WEIGHT = 0.02
"""Weight of the squared distance from the starting values (in units of each constant's range)
against the mean absolute log error; small enough that ten consistent runs move a constant
across most of its range."""

DEFAULT_TRIALS = 300


@dataclass(frozen=True, slots=True)
class Constant:
    """One calibration constant: its catalog key, field, unit and range."""

    key: str
    """The key in a device entry (catalog units)."""
    field: str
    """The DeviceSpec field."""
    scale: float
    """Catalog unit in SI units (kernel_launch_us: 1e-6 s)."""
    low: float
    high: float
    needs: str
    """Which runs tell it apart: ``time``, ``flash`` (timed with flash attention), ``comm`` (timed
    on more than one device) or ``memory``."""
    by_default: bool = True
    """Fitted unless ``--fit`` says otherwise; False for a constant the catalog takes from a
    measurement of its own (fitted only when asked for by name)."""

    def value(self, device: DeviceSpec) -> float:
        raw = getattr(device, self.field)
        if raw is None and self.field == "fused_attention_efficiency":
            raw = device.attention_efficiency  # which defaults to matmul_efficiency
        if raw is None:  # attention_efficiency defaults to matmul_efficiency
            raw = device.matmul_efficiency
        return raw / self.scale

    def apply(self, device: DeviceSpec, value: float) -> DeviceSpec:
        return replace(device, **{self.field: value * self.scale})


CONSTANTS = (
    Constant("matmul_efficiency", "matmul_efficiency", 1.0, 0.3, 1.0, "time"),
    Constant("memory_efficiency", "memory_efficiency", 1.0, 0.3, 1.0, "time"),
    Constant("kernel_launch_us", "kernel_launch_s", 1e-6, 0.0, 100.0, "time"),
    Constant("collective_launch_us", "collective_launch_s", 1e-6, 0.0, 200.0, "comm"),
    Constant("attention_efficiency", "attention_efficiency", 1.0, 0.2, 1.0, "flash"),
    Constant("fused_attention_efficiency", "fused_attention_efficiency", 1.0, 0.2, 1.0, "te"),
    Constant("overlap_slowdown", "overlap_slowdown", 1.0, 0.0, 0.5, "comm", by_default=False),
    Constant("memory_overhead_gb", "memory_overhead_bytes", GB, 0.0, 20.0, "memory"),
)


@dataclass(frozen=True)
class Fit:
    device: DeviceSpec
    """The calibrated device (named as asked)."""
    constants: tuple[Constant, ...]
    """The constants that were fitted (the others kept their value)."""
    runs: tuple[MeasuredRun, ...]
    before: Validation
    after: Validation


def _identifiable(runs: Sequence[MeasuredRun]) -> tuple[Constant, ...]:
    timed = [r for r in runs if r.step_time_s is not None]
    flash = [r for r in timed if uses_flash_attention(r.model, r.system, r.training)]
    te = [r for r in flash if uses_transformer_engine(r.system, r.training, r.strategy.zero)]
    classic = [r for r in flash if r not in te]
    # the allowance shows only in the device's use, not in PyTorch's allocated peak
    memory = [r for r in runs if r.peak_memory_gb is not None and not r.memory_allocated]
    comm = [r for r in timed if r.strategy.devices > 1]
    have = {"time": bool(timed), "flash": bool(classic), "te": bool(te), "memory": bool(memory),
            "comm": bool(comm)}
    return tuple(c for c in CONSTANTS if have[c.needs])


def _on(device: DeviceSpec) -> Callable[[MeasuredRun], SystemSpec]:
    """Each run's system with ``device`` in it."""
    return lambda run: replace(run.system, device=device)


def _loss(runs: Sequence[MeasuredRun], device: DeviceSpec) -> float:
    """Mean absolute log error of step time, plus that of memory (where measured)."""
    results = validate(runs, system_for=_on(device)).results
    loss = 0.0
    for errors in ([r.step_time_error for r in results], [r.memory_error for r in results]):
        logs = [abs(math.log1p(e)) for e in errors if e is not None]
        if logs:
            loss += sum(logs) / len(logs)
    return loss


def calibrate(runs: Sequence[MeasuredRun], device: DeviceSpec, name: str, *,
              trials: int = DEFAULT_TRIALS, seed: int = 0, only: Sequence[str] | None = None,
              progress: Callable[[int, int], None] | None = None) -> Fit:
    """Fit ``device``'s constants to ``runs`` (all on that device) and return the calibrated
    device, named ``name``, with the validation before and after. ``only`` (catalog keys)
    restricts the fit to those constants; the others keep the device's values."""
    constants = _identifiable(runs)
    if only is not None:
        unknown = sorted(set(only) - {c.key for c in CONSTANTS})
        if unknown:
            raise ValueError(f"unknown constant {unknown[0]!r}; the constants are"
                             f" {', '.join(c.key for c in CONSTANTS)}")
        constants = tuple(c for c in constants if c.key in only)
    else:
        constants = tuple(c for c in constants if c.by_default)
    if not constants:
        raise ValueError("no constant to fit: the runs measure none of those asked for (time"
                         " constants need step_time_s, attention_efficiency runs with flash"
                         " attention, memory_overhead_gb peak_memory_gb)")
    start = {c.key: min(max(c.value(device), c.low), c.high) for c in constants}

    def build(values: dict[str, float]) -> DeviceSpec:
        out = replace(device, name=name)
        for c in constants:
            out = c.apply(out, values[c.key])
        return out

    def objective(trial: optuna.Trial) -> float:
        values = {c.key: trial.suggest_float(c.key, c.low, c.high) for c in constants}
        prior = sum(((values[c.key] - start[c.key]) / (c.high - c.low)) ** 2 for c in constants)
        return _loss(runs, build(values)) + PRIOR_WEIGHT * prior

    # CMA-ES (Optuna's CmaEsSampler): the standard for a few continuous constants; it refines
    # where TPE only samples. The device's current values are the first trial.
    sampler = optuna.samplers.CmaEsSampler(seed=seed)
    callbacks = []
    if progress is not None:
        callbacks.append(lambda s, t: progress(t.number + 1, trials))
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(sampler=sampler)
        study.enqueue_trial(start)
        study.optimize(objective, n_trials=trials, callbacks=callbacks)
    finally:
        optuna.logging.set_verbosity(level)
    # Three significant digits: what the entry says is exactly what was evaluated.
    fitted = build({k: float(f"{v:.3g}") for k, v in study.best_params.items()})
    before = validate(runs, system_for=_on(device))
    after = validate(runs, system_for=_on(fitted))
    return Fit(fitted, constants, tuple(runs), before, after)
