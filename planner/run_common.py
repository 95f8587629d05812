"""What every way of running a study shares (``planner.runner``, ``planner.run_jobs``,
``planner.run_queue``): the sampler by name, Ctrl-C handling, the objective, and how a study is
described and checked against its YAML."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from importlib.util import find_spec
from types import FrameType
from typing import Any, Self

import optuna
from optuna.trial import FrozenTrial
from tqdm.auto import tqdm

from planner.errors import PlannerUsageError
from planner.plan import specs_dict, training_dict
from planner.progress import progress_bar
from planner.record import Evaluator, Record
from planner.storage import batched
from planner.study_config import StudyConfig
from search_spaces import LayoutEncoding
from simcore.specs import Strategy

ITEM = "planner:item"
"""System attribute: a work item's index (on queue trials, and on a sampler item's trial)."""


GP_NEEDS = "gp needs PyTorch: pip install 'parallel-planner[gp]' (or choose tpe)"
"""What a ``gp`` study says where GPSampler's own dependencies (PyTorch, SciPy) are missing."""


def sampler_problem(name: str) -> str | None:
    """Why the sampler ``name`` cannot run here, or None (checked before a study is opened, so
    that the study file is named and nothing is stored)."""
    if name == "gp" and any(find_spec(module) is None for module in ("scipy", "torch")):
        return GP_NEEDS
    return None


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    """The Optuna sampler of a study (``exhaustive`` samples nothing; its sampler is unused)."""
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name == "gp":
        try:
            import scipy  # noqa: F401 - GPSampler's own dependencies
            import torch  # noqa: F401
        except ImportError:
            raise PlannerUsageError(f"sampler {GP_NEEDS}") from None
        return optuna.samplers.GPSampler(seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)


# -- Ctrl-C ------------------------------------------------------------------------------------
class StopRequest:
    """Ctrl-C while a study runs. The first sets :attr:`requested`: the runner lets the running
    trials finish, then raises ``KeyboardInterrupt`` (and runs the hooks, e.g. to tell worker
    processes). The second sets :attr:`now`: the running trial stops at its next safe point
    (the objective's start, the next strategy of a batch) and Optuna marks it FAIL. The third
    raises ``KeyboardInterrupt`` wherever the process is. Installed only in the main thread.
    """

    def __init__(self) -> None:
        self.requested = False
        self.now = False
        self._count = 0
        self._hooks: list[Callable[[], None]] = []
        self._previous: Any = None
        self._installed = False

    def on_stop(self, hook: Callable[[], None]) -> None:
        self._hooks.append(hook)

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._count += 1
        if self._count == 1:
            self.requested = True
            print("\nstopping after the running trials (Ctrl-C again: now)", file=sys.stderr)
            for hook in self._hooks:
                hook()
        elif self._count == 2:
            self.now = True
            print("stopping now; the running trial is marked failed", file=sys.stderr)
        else:
            raise KeyboardInterrupt

    def check(self) -> None:
        """Raise ``KeyboardInterrupt`` if a stop was requested (the running work is done)."""
        if self.requested:
            raise KeyboardInterrupt

    def check_now(self) -> None:
        """Raise ``KeyboardInterrupt`` at a safe point after a second Ctrl-C."""
        if self.now:
            raise KeyboardInterrupt


@contextlib.contextmanager
def _children_ignore_sigint() -> Iterator[None]:
    """Processes forked inside inherit an ignored SIGINT, so Ctrl-C at the terminal (sent to
    the whole process group) reaches only this process, which relays it. A joblib call forks its
    workers before it returns; a Ctrl-C during that instant is ignored. (Each task also ignores
    SIGINT, for workers joblib starts later.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)



def _check_fingerprint(study: optuna.Study, config: StudyConfig) -> None:
    if study.user_attrs.get("fingerprint") != config.fingerprint():
        raise PlannerUsageError(
            f"{config.path}: the stored study {config.name!r} was made from"
            f" {_what_differs(study.user_attrs.get('config'), config.summary())}; set another"
            " name to start a new study")
    _check_entries(study, config)


def _check_entries(study: optuna.Study, config: StudyConfig) -> None:
    """The model and system the study was made from, as stored, against the catalog's entries
    of those names now: the fingerprint names them only, so a catalog entry edited since (a
    model's layers, a device `planner calibrate` refit) mixed two models' trials in one study.
    Only the fields both sides hold are compared: a study stored by an earlier version, with
    fewer of them, still resumes."""
    stored = study.user_attrs.get("specs")
    if not isinstance(stored, dict):
        return
    # as the storage holds it (JSON: tuples as lists)
    now = json.loads(json.dumps(specs_dict(config.model, config.system, config.training,
                                           config.convention)))
    for part in ("model", "system"):
        if isinstance(stored.get(part), dict):
            changes = _shared_changes(stored[part], now[part], f"{part}.")
            if changes:
                key, old, new = changes[0]
                raise PlannerUsageError(
                    f"{config.path}: the stored study {config.name!r} was made from another"
                    f" {part} entry {now[part].get('name')!r} ({key} {old!s:.40} -> {new!s:.40});"
                    " its catalog entry changed since: set another name to start a new study")


def _shared_changes(stored: dict, now: dict, prefix: str) -> list[tuple[str, object, object]]:
    """:func:`_changes` over the keys both mappings hold."""
    out: list[tuple[str, object, object]] = []
    for k in sorted(set(stored) & set(now)):
        old, new = stored[k], now[k]
        if isinstance(old, dict) and isinstance(new, dict):
            out += _shared_changes(old, new, f"{prefix}{k}.")
        elif old != new and k != "source":
            out.append((f"{prefix}{k}", old, new))
    return out


def _what_differs(stored: object, now: dict[str, object]) -> str:
    """The settings the stored study's summary and the study file's differ in (a stored study
    of an earlier version that recorded none: the generic answer)."""
    if not isinstance(stored, dict):
        return "a different model, system, limit or space"
    changes = _changes(stored, now)
    if not changes:  # the same summary, another fingerprint: what the summary does not show
        return "a different model, system, limit or space"
    shown = ", ".join(f"{k} {old!s:.40} -> {new!s:.40}" for k, old, new in changes[:3])
    more = f" and {len(changes) - 3} more" if len(changes) > 3 else ""
    return f"different settings ({shown}{more})"


def _changes(stored: dict, now: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    """The settings that differ, a mapping's by its own keys (``space.recompute``), so the
    values shown are the ones that changed."""
    out: list[tuple[str, object, object]] = []
    for k in sorted(set(stored) | set(now)):
        if not prefix and k in ("file", "n_trials", "description"):
            continue
        old, new = stored.get(k, "-"), now.get(k, "-")
        if old == new:
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            out += _changes(old, new, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", old, new))
    return out


def _describe(study: optuna.Study, config: StudyConfig) -> None:
    """What the study was made from, on the study; the fingerprint last (joiners wait for it)."""
    with warnings.catch_warnings():  # experimental since 3.2, still so marked in 5.0
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(config.metric_names)
    study.set_user_attr("config", config.summary())
    study.set_user_attr("specs", specs_dict(config.model, config.system, config.training,
                                            config.convention))
    given = config.given_training
    if given is not None and given != config.training:
        study.set_user_attr("given_training", training_dict(given))
    study.set_user_attr("fingerprint", config.fingerprint())



def _evaluate_all(evaluator: Evaluator, strategies: Sequence[Strategy],
                  stop: StopRequest | None = None) -> list[Record]:
    records = []
    for s in strategies:
        if stop is not None:
            stop.check_now()
        records.append(evaluator(s))
    return records



def _objective(config: StudyConfig, storage: optuna.storages.BaseStorage | None = None,
               stop: StopRequest | None = None) -> Callable[[optuna.Trial], Any]:
    encoding = LayoutEncoding(config.space)
    evaluator = config.evaluator()
    seen: dict[Strategy, Record] = {}

    def objective(trial: optuna.Trial) -> float | list[float]:
        if stop is not None:
            stop.check_now()  # inside Optuna's trial: it marks the trial FAIL
        strategy = encoding.suggest(trial)
        record = seen.get(strategy)
        if record is None:
            record = seen[strategy] = evaluator(strategy)
        with batched(storage):  # some 40 attributes: one journal write instead of 40
            for key, value in record.user_attrs.items():
                trial.set_user_attr(key, value)
            for key, value in record.constraints.items():
                trial.set_constraint(key, value)
        return record.values if len(record.values) > 1 else record.values[0]

    return objective



def _stop_when(stop: Callable[[], bool]) -> Callable[[optuna.Study, FrozenTrial], None]:
    def callback(study: optuna.Study, _trial: FrozenTrial) -> None:
        if stop():
            study.stop()
    return callback



def _bar(total: int | None, progress: bool, what: str) -> tqdm:
    return progress_bar(total, progress, what, "trial")

