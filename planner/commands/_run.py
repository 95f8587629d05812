"""``planner run STUDY.yaml``: run a study into the storage, then print its best plans."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

import optuna
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from planner.commands._base import BaseCommand, add_storage_argument, at_least_one, hbm_gb, jobs
from planner.errors import Interrupted, PlannerUsageError
from planner.fields import fail
from planner.outputs import counted
from planner.results_parquet import check_table_name
from planner.run_common import sampler_problem
from planner.runner import RunReport, WorkerDied, run_study
from planner.storage import (
    is_url,
    open_storage,
    shown,
    storage_label,
    storage_option,
    study_names,
)
from planner.study_config import StudyConfig, load_study_config
from planner.study_folder import is_folder, study_storage
from planner.tables import best_frame, format_best

HEARTBEAT_S = 10
"""Seconds between heartbeats of a running trial on a database (trials silent for 3 of them are
failed and retried)."""


def where_results_are(config: StudyConfig, storage: BaseStorage, label: str, command: str,
                      study_arg: str, hbm_gb: float | None = None, why: str = "interrupted"
                      ) -> str:
    """One line after Ctrl-C (or a dead worker): the trials (or table rows) kept, the storage,
    the study and the command that continues it."""
    try:
        study = optuna.load_study(study_name=config.name, storage=storage)
        count, table = _kept(study, storage)
    except Exception:  # noqa: BLE001 - the message must come out whatever the storage does
        count, table = "the finished trials", ""
    args = [command, study_arg]
    if hbm_gb is not None:
        args += ["--hbm-gb", f"{hbm_gb:g}"]
    return (f"{why}: {count} of study {config.name!r} are kept in {shown(label)}{table};"
            f" continue with: planner {shlex.join(args)}{storage_option(label)}")


def _kept(study: optuna.Study, storage: BaseStorage) -> tuple[str, str]:
    """What a stopped study keeps, and where beside its storage: its finished trials, or, a
    study whose trials are only its fronts and best plans (written once every plan is
    estimated), the plans in its results table."""
    from planner.results_parquet import ALL, RESULTS, table_rows

    results = study.user_attrs.get(RESULTS) or {}
    if results.get("trials_kept", ALL) == ALL:
        kept = storage.get_n_trials(study._study_id, TrialState.COMPLETE)
        return f"{kept:,} finished trials", ""
    rows = table_rows(study) or 0
    plans = int(results.get("plans", 0)) - int(results.get("pruned", 0))
    return f"the estimates of {rows:,} of {counted(plans, 'plan')}", " (its results table)"


def more_hint(name: str, label: str) -> str:
    """The line after a study's best plans: the commands that read more of it, on its storage."""
    where = storage_option(label)
    return (f"more: planner best {shlex.quote(name)} --top 20{where}; planner trials"
            f" {shlex.quote(name)} --csv trials.csv{where}")


_positive_int = at_least_one


class RunCommand(BaseCommand):
    name = "run"
    help = "Run a study (YAML) into the storage, then print its best plans."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("study", type=Path, help="the study YAML (see studies/)")
        parser.add_argument("--hbm-gb", type=hbm_gb,
                            help="HBM limit per device in GB; a study of its own, named"
                            " NAME-hbmXgb (default: the YAML's)")
        add_storage_argument(parser)
        parser.add_argument("--resume", action="store_true",
                            help="continue the stored study of this name")
        parser.add_argument("--jobs", type=jobs, default=1,
                            help="worker processes sharing the storage (default 1)")
        parser.add_argument("--top", type=_positive_int, default=5,
                            help="best plans to print (default 5)")
        parser.add_argument("--prune", action="store_true",
                            help="an exhaustive study of more than 20,000 plans: skip the"
                            " plans that bounds prove cannot be kept (its best plans and"
                            " fronts stay those of the whole space; the results table holds"
                            " the estimated plans)")
        parser.add_argument("--quiet", action="store_true", help="no progress bar")

    def run(self, args: argparse.Namespace) -> int:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        config = load_study_config(args.study, hbm_gb=args.hbm_gb)
        needs = sampler_problem(config.sampler)
        if needs is not None:
            raise fail(args.study, "sampler", needs)
        space = config.space
        valid = space.valid_count
        if valid == 0:
            raise PlannerUsageError(f"{args.study}: space: no valid strategy among"
                                    f" {space.size} candidates ({space.first_reason()});"
                                    " widen the lists")
        label = storage_label(args.storage)
        limit = _limit(config)
        print(f"study {config.name}: {config.model.name} on {config.system.name}"
              f" ({config.system.devices} x {config.system.device.name}), {config.convention}"
              f" convention, {limit}")
        how = ("every one" if config.sampler == "exhaustive"
               else f"{counted(config.n_trials, 'trial')} of {config.sampler}")
        print(f"{valid:,} valid strategies (of {space.size:,} candidates); {how}")
        where = study_storage(label, config.name)  # the study's own journal in a folder
        check_table_name(where, config.name)  # before its journal is made, not just its study
        storage = open_storage(where, create=True,
                               heartbeat=HEARTBEAT_S if is_url(label) else None)
        journal = _hold(where)
        if args.resume and config.name not in study_names(storage):
            # a storage path mistyped would start a long study afresh without a word
            print(f"planner run: --resume: no study {config.name!r} is stored in {shown(where)};"
                  " starting it", file=sys.stderr)
        start = time.perf_counter()
        try:
            report = run_study(config, storage, where, resume=args.resume, jobs=args.jobs,
                               progress=not args.quiet, prune=args.prune)
            kept = journal is None or _still_there(where, journal)
        except KeyboardInterrupt:
            raise Interrupted(where_results_are(config, storage, label, "run", str(args.study),
                                                args.hbm_gb) + " --resume") from None
        except WorkerDied as e:
            kept = where_results_are(config, storage, label, "run", str(args.study),
                                     args.hbm_gb, why=str(e))
            print(f"planner run: {kept} --resume", file=sys.stderr)
            return 1
        finally:
            if journal is not None:
                os.close(journal)
        elapsed = time.perf_counter() - start
        if not kept:
            print(f"planner run: {where}: the journal was deleted or replaced while the study"
                  f" ran; its {report.added:,} new trials are not stored there. Run the study"
                  " again (or give --storage)", file=sys.stderr)
            return 1
        if report.late_stop:
            print("planner run: the Ctrl-C came as the last trials were finishing: the run"
                  " finished, nothing is left to resume", file=sys.stderr)
        try:
            return _results(args, config, report, label, where, elapsed)
        except KeyboardInterrupt:  # the study is whole: only the printing stopped
            raise Interrupted("interrupted while printing the results; the study is complete;"
                              f" {more_hint(config.name, label)}") from None


def _limit(config: StudyConfig) -> str:
    return "unlimited HBM" if config.hbm_gb is None else f"HBM {config.hbm_gb:g} GB"


def _results(args: argparse.Namespace, config: StudyConfig, report: RunReport, label: str,
             where: str, elapsed: float) -> int:
    """After a run: what it did, the study's best plans and the commands that read more."""
    limit = _limit(config)
    if report.requeued:
        print(f"resumed: {report.requeued} trial(s) left RUNNING by a stopped process were"
              " failed and re-queued")
    total = len(report.study.get_trials(deepcopy=False))
    print(f"{counted(report.added, 'trial')} in {elapsed:.1f} s ({total:,} stored) in {where}")
    pruning = _pruning_line(report.study, args.prune)
    if pruning:
        print(pruning)
    best = best_frame(report.study, args.top)
    if is_folder(label):  # planner studies finds the study's row without reading it again
        from planner.study_summary import remember

        remember(Path(where), report.study, best)
    title = "Pareto front" if len(config.objectives) > 1 else "best plans"
    print(f"{title} ({limit}):")
    print(format_best(best))
    print(more_hint(config.name, label))
    return 0


def _pruning_line(study: optuna.Study, asked: bool) -> str:
    """What pruning did (planner.prune), or why it did not run; empty when not asked for."""
    from planner.results_parquet import RESULTS

    results = study.user_attrs.get(RESULTS) or {}
    if results.get("prune"):
        pruned, plans = results.get("pruned", 0), results.get("plans", 0)
        return (f"pruned {pruned:,} of {counted(plans, 'plan')} by bounds"
                f" ({results.get('seeds', 0):,} estimated first): the best plans and fronts are"
                " the whole space's; the results table holds the other plans")
    if not asked:
        return ""
    from planner.results_parquet import TRIALS_KEPT

    return (f"--prune: nothing pruned: only a new exhaustive study of more than {TRIALS_KEPT:,}"
            " plans of a dense model (no framework rule) is pruned")


def _hold(label: str) -> int | None:
    """A read-only descriptor on the journal file, held for the run so that its inode cannot be
    reused by a file put in its place; None for a database URL."""
    if is_url(label):
        return None
    try:
        return os.open(label, os.O_RDONLY)
    except OSError:
        return None


def _still_there(label: str, fd: int) -> bool:
    """Whether ``label`` is still the file ``fd`` holds."""
    try:
        held = os.fstat(fd)
        now = os.stat(label)
    except OSError:
        return False
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)
