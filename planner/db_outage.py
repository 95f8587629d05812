"""A worker's lost database, ridden out: every call of the worker loop is tried again with
exponential backoff (:class:`Outage`) for up to ``retry_s`` seconds (``planner worker
--db-retry-s``, default :data:`DB_RETRY_S`); past that window :class:`DatabaseLost` names the
server and what failed (:mod:`planner.run_queue`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TypeVar

from optuna.storages import BaseStorage

from planner.storage_rdb import PlannerRDBStorage

__all__ = ["BACKOFF_S", "DB_RETRY_S", "DatabaseLost", "Outage", "ride_out"]

T = TypeVar("T")

DB_RETRY_S = 60.0
"""How long a worker rides out a lost database before it gives up (a PostgreSQL restart takes
3-30 s)."""
BACKOFF_S = (0.25, 5.0)
"""The first and the longest wait between two attempts while the database is away."""


class DatabaseLost(Exception):
    """The database stayed unreachable for the whole retry window."""

    def __init__(self, where: str, what: str, waited_s: float, cause: str) -> None:
        self.where, self.what, self.waited_s, self.cause = where, what, waited_s, cause
        super().__init__(f"lost the connection to the database at {where} while {what}, and it"
                         f" did not answer for {waited_s:.0f} s ({cause})")


class Outage:
    """Rides out a lost database: after a failed attempt :meth:`failed` waits (``BACKOFF_S``,
    doubling) and returns, or raises :class:`DatabaseLost` once ``retry_s`` seconds have passed
    since the first failure; :meth:`ok` after a successful attempt ends the outage."""

    def __init__(self, storage: BaseStorage, retry_s: float) -> None:
        self.storage, self.retry_s = storage, retry_s
        self.since: float | None = None
        self.attempts = 0

    def failed(self, error: BaseException, what: str) -> None:
        """Called in an ``except`` block: re-raises an error that is not a lost database."""
        if not PlannerRDBStorage.lost_connection(error):
            raise error
        where = self.storage.where if isinstance(self.storage, PlannerRDBStorage) else "?"
        cause = PlannerRDBStorage.cause(error)
        now = time.monotonic()
        if self.since is None:
            self.since = now
            print(f"worker: lost the database at {where} while {what} ({cause}); retrying for"
                  f" up to {self.retry_s:g} s", file=sys.stderr)
        waited = now - self.since
        if waited >= self.retry_s:
            raise DatabaseLost(where, what, waited, cause) from None
        pause = min(BACKOFF_S[0] * 2 ** self.attempts, BACKOFF_S[1], self.retry_s - waited)
        self.attempts += 1
        time.sleep(pause)

    def ok(self) -> None:
        if self.since is not None:
            print(f"worker: the database answers again after"
                  f" {time.monotonic() - self.since:.1f} s", file=sys.stderr)
        self.since, self.attempts = None, 0


def ride_out(storage: BaseStorage, what: str, call: Callable[[], T],
             retry_s: float = DB_RETRY_S) -> T:
    """``call()``, tried again while the database is away (:class:`Outage`)."""
    outage = Outage(storage, retry_s)
    while True:
        try:
            result = call()
        except Exception as e:  # noqa: BLE001 - failed() re-raises what is not an outage
            outage.failed(e, what)
            continue
        outage.ok()
        return result
