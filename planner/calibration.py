"""Fit a device's few named calibration constants to measured runs (``planner calibrate``).

The constants are the device entry's own (:data:`CONSTANTS`): the achievable fractions of peak
FLOP/s on large GEMMs and of HBM bandwidth on element-wise kernels, the flash-attention
kernels' fraction of peak (classic stacks; Transformer Engine's fused attention apart), the
per-kernel launch floor, the host's cost of issuing a collective, and the framework's memory
allowance; the compute's slowdown beside a collective (``overlap_slowdown``) and the part of the
allowance the allocator counts (``workspace_gb``, told by allocated peaks) only when asked for by
name, as the catalog takes each from a measurement of its own.
Nothing per run: every run is estimated with the same device.

The fit is an Optuna study (CMA-ES, seeded, so a fit is reproducible) over the constants the runs
can tell apart - the time constants need timed runs, the attention efficiency runs with flash
attention, the memory allowance runs with a measured peak - minimising the mean absolute log
error of step time plus that of memory, with a pull towards the device's current values that
weakens as the runs grow in number (a maximum a posteriori fit: :func:`_prior`), so that a
handful of runs cannot drive a constant to a value they do not pin (a fifth of a check file,
fit with a pull of fixed weight, sent the H100's launch floor from 13.8 to 72.6 us). The
device's current values are the first trial, so the fit is never worse than where it started on
the objective. The fit is then cross-validated and kept only if its refits predict the runs
they were not fit on better than the device did, by more than chance would (:func:`calibrate`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import optuna
from joblib import Parallel, delayed

from planner.runs_csv import MeasuredRun
from planner.units import GB
from planner.validation import RunResult, Validation, validate
from simcore.megatron import uses_flash_attention
from simcore.megatron.stack import uses_transformer_engine
from simcore.specs import DeviceSpec, Precision, SystemSpec

__all__ = ["CONSTANTS", "CV_MARGIN", "DEFAULT_TRIALS", "OFF_BY", "RANKING_WORSE", "RUN_ERROR",
           "Constant", "CrossValidation", "Fit", "at_edge", "calibrate"]

RUN_ERROR = 0.1
"""The scale of one run's absolute log error that the constants cannot remove (the Laplace
likelihood's ``b``): the stack's own habits, the run's noise and what the estimate does not
model. The shipped devices are 3-10% off per run on the check files (tests/data/validation/
README.md); a team's own cluster and stack, not yet calibrated, sits further off: 10%."""

DEFAULT_TRIALS = 300

RANKING_WORSE = 0.005
"""How much a fit may raise its own runs' plan-choice regret (mean over their groups) before
``planner calibrate`` says it ranks them worse: half a point, below which a first choice moves
between plans measured within a few tenths of a percent of one another."""

SEARCH_SPREADS = 6
"""How far from the start the fit searches, in the prior's spreads: at the window's edge the
pull is ``18 RUN_ERROR / runs``, what a mean error 1.8 / runs lower would pay for."""

LEAVE_ONE_OUT_RUNS = 10
"""Up to this many runs the cross-validation leaves one out at a time; above it, five folds."""

FEWEST_TO_CROSS_VALIDATE = 3
"""Below this many runs there is no cross-validation: a refit of one run judged on the other
judges the prior's pull at one run, not the constants (two NeMo 24.03 long runs on H100, 20% and
28% fast with the shipped device: each one-run refit missed the other, so the fit, which takes
the other seven runs from 17.8% to 4.5%, was refused). Such a fit is kept where the device is off
on them by half a run's error or more (:data:`OFF_BY`) and the fit lowers that: the prior's pull,
strong at one or two runs, keeps it from chasing their noise (:func:`calibrate`)."""

CV_MARGIN = 0.5
"""How far, in standard errors of the per-run gain, the refits must beat the starting device on
the runs they were not fit on for the fit to be taken: a small sample's cross-validation gain is
itself noisy (five of a100-check's 26 A100 80GB runs, every fifth from the third: the refits
beat the device by 4.3 -> 4.2% mean absolute log error on the runs they did not see, and the fit
took the other 21 runs from 3.3 to 4.5% MAPE). Judged on the check files' fifths
(``benchmarks/bench_calibrate_fifths.py``, 120 fits): with any gain (the rule until stop 69) 49
better on the rest and 7 worse, mean -2.37 points; at half a standard error 49 and 5, -2.39 (that
fit and mlperf-check's fourth fifth, 6.4 -> 6.7%, refused; nothing else moved). Not caught: runs
that share a bias agree with one another under any split (a100-check's fifth fifth, all five
estimated 2-8% fast: 4.6 -> 3.1% cross-validated, the rest 3.3 -> 6.9%). A whole standard error
would also refuse two of GPT-3 175B's four-run fifths, which take the rest from 11% to 4-5% (a
scratch run of stop 69)."""

OFF_BY = RUN_ERROR / 2
"""The mean absolute log error (5%) from which one or two runs are taken to say the device is
off rather than noisy. Judged on the check files (``benchmarks/bench_calibrate_fifths.py``: each
fifth fit, the other four fifths judged): of 105 fits over 21 files and devices, 30 have one or
two runs. Asking the fit to remove a whole run's error (10%, the rule before stop 59) took 11 of
them (better on the rest in 10, worse in 1) and refused NeMo 25.04's B200 pairs, whose fits take
the other runs from 7-8% to 1-3%; from half a run's error 23 are taken (better in 18, worse in
2, each a single MoE run of a file whose six runs are six models)."""


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
    """Which runs tell it apart: ``time``, ``flash`` (timed with flash attention), ``te`` (timed
    with Transformer Engine), ``mxfp8`` / ``nvfp4`` (timed in MXFP8 / NVFP4), ``comm`` (timed on
    more than one device), ``memory`` (a measured peak of the device's use) or ``allocated``
    (a measured allocated peak, ``memory_measured allocated``)."""
    spread: float
    """The prior's standard deviation (catalog units): how far a team's cluster and stack
    plausibly sit from the starting value before any run is seen."""
    by_default: bool = True
    """Fitted unless ``--fit`` says otherwise; False for a constant the catalog takes from a
    measurement of its own (fitted only when asked for by name)."""

    def value(self, device: DeviceSpec) -> float:
        raw = getattr(device, self.field)
        if raw is None and self.field == "fused_attention_efficiency":
            raw = device.attention_efficiency  # which defaults to matmul_efficiency
        if raw is None and self.field in ("mxfp8_matmul_efficiency", "nvfp4_matmul_efficiency"):
            raw = device.fused_matmul_efficiency  # the per-tensor FP8 GEMMs' rate
        if raw is None:  # attention_efficiency defaults to matmul_efficiency
            raw = device.matmul_efficiency
        return raw / self.scale

    def bounds(self, device: DeviceSpec) -> tuple[float, float]:
        """The range the fit searches from ``device``: :attr:`low` to :attr:`high`, widened to
        take the device's own value (the T4's GEMM rate, 0.284, below the 0.3 floor: gpus.yaml),
        so that a fit starts where the entry is and can stay there."""
        own = self.value(device)
        return min(self.low, own), max(self.high, own)

    def apply(self, device: DeviceSpec, value: float) -> DeviceSpec:
        out = replace(device, **{self.field: value * self.scale})
        if self.field == "memory_overhead_bytes":  # the workspaces are part of the allowance
            out = replace(out, workspace_bytes=min(out.workspace_bytes, value * self.scale))
        if self.field == "workspace_bytes":
            out = replace(out, workspace_bytes=min(value * self.scale, out.memory_overhead_bytes))
        return out


# The prior's spreads (the last number): a tenth of the peak for the efficiencies (gpus.yaml's
# fitted A100, H100 and V100 matmul efficiencies span 0.51-0.71; one part on another stack sits
# nearer than that), 10 us for the launch floors (gpus.yaml fits 4.3-15.5 us; a stack with CUDA
# graphs or a compiler halves a floor, a slower host doubles it), 50 us for the host's time per
# kernel (gpus.yaml's 150-177 us; a CPU generation apart is half or twice), 3 GB for the
# allowance.
CONSTANTS = (
    Constant("matmul_efficiency", "matmul_efficiency", 1.0, 0.3, 1.0, "time", 0.1),
    Constant("memory_efficiency", "memory_efficiency", 1.0, 0.3, 1.0, "time", 0.1),
    Constant("kernel_launch_us", "kernel_launch_s", 1e-6, 0.0, 100.0, "time", 10.0),
    Constant("host_kernel_us", "host_kernel_s", 1e-6, 0.0, 400.0, "time", 50.0),
    Constant("collective_launch_us", "collective_launch_s", 1e-6, 0.0, 200.0, "comm", 10.0),
    Constant("attention_efficiency", "attention_efficiency", 1.0, 0.2, 1.0, "flash", 0.1),
    Constant("fused_attention_efficiency", "fused_attention_efficiency", 1.0, 0.2, 1.0, "te",
             0.1),
    Constant("fused_matmul_efficiency", "fused_matmul_efficiency", 1.0, 0.3, 1.0, "te", 0.1),
    Constant("mxfp8_matmul_efficiency", "mxfp8_matmul_efficiency", 1.0, 0.3, 1.0, "mxfp8", 0.1),
    Constant("nvfp4_matmul_efficiency", "nvfp4_matmul_efficiency", 1.0, 0.1, 1.0, "nvfp4", 0.1),
    Constant("overlap_slowdown", "overlap_slowdown", 1.0, 0.0, 0.5, "comm", 0.1,
             by_default=False),
    Constant("memory_overhead_gb", "memory_overhead_bytes", GB, 0.0, 20.0, "memory", 3.0),
    Constant("workspace_gb", "workspace_bytes", GB, 0.0, 5.0, "allocated", 0.1,
             by_default=False),
)


@dataclass(frozen=True, slots=True)
class CrossValidation:
    """The fit judged on runs it was not fit on: each fold refit without it, then estimated."""

    folds: int
    before: float
    """The runs' mean absolute log error (step time plus memory) with the starting device."""
    after: float
    """The same, each fold estimated with the refit that did not see it."""
    gain_se: float = 0.0
    """The standard error of the per-run gain (the start's absolute log error on a run less its
    refit's, step time plus memory): how much of ``before - after`` chance could make."""

    @property
    def convincing(self) -> bool:
        """The refits beat the start on the runs they were not fit on by more than
        :data:`CV_MARGIN` standard errors of the gain."""
        return self.before - self.after > CV_MARGIN * self.gain_se


@dataclass(frozen=True)
class Fit:
    device: DeviceSpec
    """The calibrated device (named as asked)."""
    constants: tuple[Constant, ...]
    """The constants that were fitted (the others kept their value)."""
    runs: tuple[MeasuredRun, ...]
    before: Validation
    after: Validation
    cross_validation: CrossValidation | None = None
    """None below :data:`FEWEST_TO_CROSS_VALIDATE` runs."""
    kept: bool = False
    """The refits did not predict the runs they were not fit on better than the starting device
    (with too few runs to cross-validate: the device was off on them by less than
    :data:`OFF_BY`, or the fit did not lower that): the calibrated device keeps its values."""
    gain: float = 0.0
    """How much the fit lowers the runs' mean absolute log error (step time plus memory) below
    the starting device's."""
    off: float = 0.0
    """The starting device's mean absolute log error on the runs (step time plus memory)."""


def _identifiable(runs: Sequence[MeasuredRun]) -> tuple[Constant, ...]:
    timed = [r for r in runs if r.step_time_s is not None]
    flash = [r for r in timed if uses_flash_attention(r.model, r.system, r.training)]
    te = [r for r in flash if uses_transformer_engine(r.system, r.training, r.strategy.zero)]
    classic = [r for r in flash if r not in te]
    # the allowance shows only in the device's use, not in PyTorch's allocated peak
    memory = [r for r in runs if r.peak_memory_gb is not None and not r.memory_allocated]
    # the workspaces show only in the allocated peak (the device's use holds the whole allowance)
    allocated = [r for r in runs if r.peak_memory_gb is not None and r.memory_allocated]
    comm = [r for r in timed if r.strategy.devices > 1]
    mxfp8 = [r for r in timed if r.strategy.precision is Precision.MXFP8]
    nvfp4 = [r for r in timed if r.strategy.precision is Precision.NVFP4]
    have = {"time": bool(timed), "flash": bool(classic), "te": bool(te), "memory": bool(memory),
            "allocated": bool(allocated),
            "comm": bool(comm), "mxfp8": bool(mxfp8), "nvfp4": bool(nvfp4)}
    return tuple(c for c in CONSTANTS if have[c.needs])


def _on(device: DeviceSpec) -> Callable[[MeasuredRun], SystemSpec]:
    """Each run's system with ``device`` in it."""
    return lambda run: replace(run.system, device=device)


def _loss(runs: Sequence[MeasuredRun], device: DeviceSpec) -> float:
    """Mean absolute log error of step time, plus that of memory (where measured)."""
    return _mean_log_errors(validate(runs, system_for=_on(device)).results)


def _mean_log_errors(results: Sequence[RunResult]) -> float:
    loss = 0.0
    for errors in ([r.step_time_error for r in results], [r.memory_error for r in results]):
        logs = [abs(math.log1p(e)) for e in errors if e is not None]
        if logs:
            loss += sum(logs) / len(logs)
    return loss


def _prior(values: dict[str, float], start: dict[str, float], constants: Sequence[Constant],
           runs: int) -> float:
    """The pull towards the starting values, on the scale of the mean absolute log error: a
    Gaussian prior (each constant's :attr:`Constant.spread`) against a Laplace likelihood of
    ``runs`` runs (:data:`RUN_ERROR`), divided by ``runs / RUN_ERROR`` as the loss is a mean. So
    the runs' weight grows with their number: three runs move a constant a little, a hundred as
    far as they agree."""
    z2 = sum(((values[c.key] - start[c.key]) / c.spread) ** 2 for c in constants)
    return RUN_ERROR / (2 * runs) * z2


def calibrate(runs: Sequence[MeasuredRun], device: DeviceSpec, name: str, *,
              trials: int = DEFAULT_TRIALS, seed: int = 0, only: Sequence[str] | None = None,
              progress: Callable[[int, int], None] | None = None, jobs: int = 1) -> Fit:
    """Fit ``device``'s constants to ``runs`` (all on that device) and return the calibrated
    device, named ``name``, with the validation before and after. ``only`` (catalog keys)
    restricts the fit to those constants; the others keep the device's values.

    The fit is then cross-validated over :func:`_folds`: refit without each fold of the runs
    and judged on that fold. Unless the refits predict the runs they were not fit on
    better than ``device`` does, by more than :data:`CV_MARGIN` standard errors of the gain, the
    calibrated device keeps ``device``'s values (``Fit.kept``): runs that disagree with one
    another move constants in directions nothing else measures.
    Below :data:`FEWEST_TO_CROSS_VALIDATE` runs the fit is kept only where the device is off on
    them by :data:`OFF_BY` or more (their mean absolute log error) and the fit lowers that.

    ``jobs`` > 1 runs the fit and the refits in that many processes (each fit is seeded, so the
    device is the one a single process finds); ``progress`` then moves as each fit ends."""
    constants = _constants(runs, only)
    folds = _folds(len(runs))
    trainings = [list(runs)] + [_without(runs, fold) for fold in folds]
    fits = _fits(trainings, device, name, constants, trials, seed, progress, jobs)
    fitted, refits = fits[0], fits[1:]
    before = validate(runs, system_for=_on(device))
    off = _mean_log_errors(before.results)
    cross = None
    if folds:
        held = [runs[i] for fold in folds for i in fold]
        owner = [refit for refit, fold in zip(refits, folds) for _ in fold]
        # the folds hold every run once: the start's error on them is its error on the runs
        pooled = _on_own_devices(held, owner).results
        cross = CrossValidation(len(folds), off, _mean_log_errors(pooled),
                                _gain_se(before.results, pooled))
    gain = off - _loss(runs, fitted)
    kept = not cross.convincing if cross is not None else off < OFF_BY or gain <= 0
    if kept:
        fitted = replace(device, name=name)
    after = validate(runs, system_for=_on(fitted))
    return Fit(fitted, constants, tuple(runs), before, after, cross, kept, gain, off)


def _fits(trainings: Sequence[Sequence[MeasuredRun]], device: DeviceSpec, name: str,
          constants: tuple[Constant, ...], trials: int, seed: int,
          progress: Callable[[int, int], None] | None, jobs: int) -> list[DeviceSpec]:
    """:func:`_fit` of each set of runs, in order: in this process trial by trial, or in
    ``jobs`` processes (joblib) fit by fit."""
    total = trials * len(trainings)

    def report(done: int) -> None:
        if progress is not None:
            progress(done, total)

    out: list[DeviceSpec] = []
    if jobs > 1 and len(trainings) > 1:
        report(0)  # the processes' fits report as each ends
        pending = Parallel(n_jobs=min(jobs, len(trainings)), return_as="generator")(
            delayed(_fit)(t, device, name, constants, trials, seed, _silent) for t in trainings)
        for fitted in pending:
            out.append(fitted)
            report(trials * len(out))
        return out
    for t in trainings:
        start = trials * len(out)
        out.append(_fit(t, device, name, constants, trials, seed,
                        lambda i, _n, start=start: report(start + i)))
    return out


def _without(runs: Sequence[MeasuredRun], fold: Sequence[int]) -> list[MeasuredRun]:
    left_out = set(fold)
    return [r for i, r in enumerate(runs) if i not in left_out]


def _silent(_done: int, _total: int) -> None:
    """A worker process's fit reports nothing; its parent reports each fit as it ends."""


def _constants(runs: Sequence[MeasuredRun], only: Sequence[str] | None) -> tuple[Constant, ...]:
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
                         " attention, memory_overhead_gb peak_memory_gb of the device's use,"
                         " workspace_gb peak_memory_gb with memory_measured allocated)")
    return constants


def _folds(n: int) -> list[list[int]]:
    """Leave one out up to :data:`LEAVE_ONE_OUT_RUNS` runs, then five interleaved folds (every
    fifth run); none below :data:`FEWEST_TO_CROSS_VALIDATE` runs."""
    if n < FEWEST_TO_CROSS_VALIDATE:
        return []
    k = n if n <= LEAVE_ONE_OUT_RUNS else 5
    return [list(range(j, n, k)) for j in range(k)]


def _on_own_devices(runs: Sequence[MeasuredRun], devices: Sequence[DeviceSpec]) -> Validation:
    """The runs validated each on its own device (its fold's refit)."""
    by_run = dict(zip((id(r) for r in runs), devices))
    return validate(runs, system_for=lambda r: replace(r.system, device=by_run[id(r)]))


def _gain_se(start: Sequence[RunResult], refit: Sequence[RunResult]) -> float:
    """The standard error of the per-run gain of the refits (``refit``: each run on its fold's
    refit) over the starting device (``start``): the absolute log errors of step time plus
    memory, the start's less the refit's, paired by run."""
    start_loss = dict(zip((id(r.run) for r in start), _per_run_losses(start)))
    gains = [start_loss[id(r.run)] - loss for r, loss in zip(refit, _per_run_losses(refit))
             if id(r.run) in start_loss]
    return statistics.stdev(gains) / math.sqrt(len(gains)) if len(gains) > 1 else 0.0


def _per_run_losses(results: Sequence[RunResult]) -> list[float]:
    return [sum(abs(math.log1p(e)) for e in (r.step_time_error, r.memory_error) if e is not None)
            for r in results]


def at_edge(c: Constant, start: DeviceSpec, fitted: DeviceSpec) -> str | None:
    """Where a fitted constant stopped against what the fit may search, or None: ``floor`` or
    ``ceiling`` of its range (:attr:`Constant.low`, :attr:`Constant.high`), or ``edge`` of the
    search around its start (:func:`_window`). A constant at an edge is as far as the fit went,
    not where the runs put it: they ask for more than the estimate can give by that constant,
    and the fit may be taking up a cost it does not model (AMP's T4 runs send the GEMM rate to
    its floor, 0.3, and the host's time up: tests/data/validation/README.md, "AMP's T4
    sweep")."""
    value = c.value(fitted)
    if value == c.value(start):
        return None
    floor, ceiling = c.bounds(start)
    close = 0.005 * (ceiling - floor)  # the entry's three significant digits, and some
    if value - floor <= close:
        return "floor"
    if ceiling - value <= close:
        return "ceiling"
    low, high = _window(c, c.value(start), (floor, ceiling))
    return "edge" if value - low <= close or high - value <= close else None


def _window(c: Constant, start: float, bounds: tuple[float, float]) -> tuple[float, float]:
    """Where the fit searches ``c``: centred on the start, so that CMA-ES, which begins at the
    middle of each range with a step of a sixth of it, begins there: SEARCH_SPREADS of the
    prior's spreads either way, no further than the nearer bound. A start within one spread of
    a bound (an uncalibrated device's floor of 0 or efficiency of 1) searches SEARCH_SPREADS
    away from it instead. Over the whole range CMA-ES began mid-range, and a refit of a
    calibrated device never came back near it (the H100 of gpus.yaml on h100-fit.csv: no trial
    better than the start in 400)."""
    low, high = bounds
    near = min(start - low, high - start)
    half = SEARCH_SPREADS * c.spread if near < c.spread else min(SEARCH_SPREADS * c.spread, near)
    return max(low, start - half), min(high, start + half)


def _fit(runs: Sequence[MeasuredRun], device: DeviceSpec, name: str,
         constants: tuple[Constant, ...], trials: int, seed: int,
         progress: Callable[[int, int], None]) -> DeviceSpec:
    """One CMA-ES study: ``device`` with ``constants`` fit to ``runs`` (three significant
    digits, so that what the entry says is exactly what was evaluated)."""
    start = {c.key: c.value(device) for c in constants}  # within c.bounds(device)

    def build(values: dict[str, float]) -> DeviceSpec:
        out = replace(device, name=name)
        for c in constants:
            out = c.apply(out, values[c.key])
        return out

    window = {c.key: _window(c, start[c.key], c.bounds(device)) for c in constants}

    def objective(trial: optuna.Trial) -> float:
        values = {c.key: trial.suggest_float(c.key, *window[c.key]) for c in constants}
        return _loss(runs, build(values)) + _prior(values, start, constants, len(runs))

    # CMA-ES (Optuna's CmaEsSampler): the standard for a few continuous constants; it refines
    # where TPE only samples. The device's current values are the first trial.
    sampler = optuna.samplers.CmaEsSampler(seed=seed)
    level = optuna.logging.get_verbosity()
    # ERROR: Optuna warns of the trial Ctrl-C stops with a traceback; the command says it once
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        study = optuna.create_study(sampler=sampler)
        study.enqueue_trial(start)
        study.optimize(objective, n_trials=trials,
                       callbacks=[lambda s, t: progress(t.number + 1, trials)])
    finally:
        optuna.logging.set_verbosity(level)
    return build({k: float(f"{v:.3g}") for k, v in study.best_params.items()})
