"""``planner worker STUDY --storage URL``: one of many processes, on any machines, sharing a study.

Start the same command on every machine. The first worker creates the study and its work queue
(``create_study`` is atomic: the others get ``DuplicatedStudyError`` and join once it is ready);
every worker then claims work items until none is left (``planner.runner``'s docstring says why
each plan or trial is recorded exactly once). ``STUDY`` is a study YAML, or the name of a stored
study (its configuration is rebuilt from what it stores). ``planner run --resume`` finishes a
worker study in one process once no worker runs.

A database restart is ridden out: the worker retries with backoff for ``--db-retry-s`` seconds
(default 60), then exits 1 with one line naming the server, what failed and the command that
rejoins.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

import optuna
from optuna.storages import BaseStorage

from planner.commands._base import BaseCommand, hbm_gb
from planner.commands._run import (
    HEARTBEAT_S,
    _positive_int,
    add_storage_argument,
    where_results_are,
)
from planner.errors import Interrupted, PlannerUsageError
from planner.run_queue import DB_RETRY_S, DatabaseLost, ride_out
from planner.runner import config_from_study, queue_state, run_worker
from planner.storage import (
    is_url,
    load_existing,
    open_storage,
    shown,
    storage_label,
    storage_option,
)
from planner.study_config import StudyConfig, load_study_config

MAX_RETRY_S = 86_400
"""The longest ``--db-retry-s``: a day."""


def _retry_s(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_RETRY_S:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_RETRY_S:,} s, not {value:,}")
    return value


def _rejoin(args: argparse.Namespace, label: str) -> str:
    hbm = f" --hbm-gb {args.hbm_gb:g}" if args.hbm_gb is not None else ""
    return f"planner worker {args.study}{hbm}{storage_option(label)}"


def _config(args: argparse.Namespace, storage: BaseStorage, label: str) -> StudyConfig:
    """The study YAML's configuration, or a stored study's (by name)."""
    path = Path(args.study)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return load_study_config(path, hbm_gb=args.hbm_gb)
    if args.hbm_gb is not None:
        raise PlannerUsageError(f"--hbm-gb needs the study YAML, not the stored study name"
                                f" {args.study!r}")
    return config_from_study(load_existing(storage, args.study, label))


class WorkerCommand(BaseCommand):
    name = "worker"
    help = ("Work on a study shared by processes on many machines through a database (creates"
            " it if absent).")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("study", help="the study YAML (the first worker creates the study)"
                            " or a stored study's name")
        parser.add_argument("--hbm-gb", type=hbm_gb,
                            help="HBM limit per device in GB; a study of its own, as in run")
        add_storage_argument(parser)
        parser.add_argument("--heartbeat", type=_positive_int, default=HEARTBEAT_S,
                            help="seconds between heartbeats; the item of a worker silent for"
                            f" 3 of them is done again by another (default {HEARTBEAT_S})")
        parser.add_argument("--db-retry-s", type=_retry_s, default=int(DB_RETRY_S),
                            help="seconds a worker rides out a lost database (a restart), trying"
                            " again with backoff, before it exits 1 (default"
                            f" {DB_RETRY_S:g}, at most {MAX_RETRY_S:,})")
        parser.add_argument("--quiet", action="store_true", help="no progress bar")

    def run(self, args: argparse.Namespace) -> int:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        label = storage_label(args.storage)
        if not is_url(label) or label.startswith("sqlite"):
            raise PlannerUsageError(
                f"--storage {label}: planner worker needs a PostgreSQL or MySQL URL, such as"
                " postgresql+psycopg://user:password@host/db (on one machine: planner run"
                " --jobs N)")
        storage = open_storage(label, create=True, heartbeat=args.heartbeat)
        config = _config(args, storage, label)
        print(f"worker {socket.gethostname()}:{os.getpid()}: study {config.name} in"
              f" {shown(label)}")
        start = time.perf_counter()
        try:
            report = run_worker(config, storage, label, progress=not args.quiet,
                                retry_s=args.db_retry_s)
            done, items, lost = ride_out(storage, "reading the work queue",
                                         lambda: queue_state(report.study), args.db_retry_s)
        except KeyboardInterrupt:
            raise Interrupted(where_results_are(config, storage, label, "worker", args.study,
                                                args.hbm_gb)) from None
        except DatabaseLost as e:
            print(f"worker: {e}; every item this worker finished is stored, and the one in"
                  " hand goes to another worker once it goes stale; rejoin with"
                  f" `{_rejoin(args, label)}`", file=sys.stderr)
            return 1
        what = "chunks of strategies" if config.sampler == "exhaustive" else "trials"
        print(f"{report.added:,} trials by this worker in {time.perf_counter() - start:.1f} s;"
              f" work items done: {done:,} of {items:,} ({what})")
        if lost:
            print(f"{lost:,} work items lost (a worker stopped while handing its item back);"
                  f" finish with `planner run {config.path}{storage_option(label)} --resume`"
                  " once no worker runs", file=sys.stderr)
            return 1
        if report.created:
            print("created the study and its work queue")
        print(f"the best plans: planner best {config.name}{storage_option(label)}")
        return 0
