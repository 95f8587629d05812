"""The worker processes of ``planner run --jobs N``: a small pool that never hangs or orphans.

joblib's loky pool (used before) shares one result pipe between its workers: a worker killed
while it writes a result leaves half a message in it, and the parent waits for the rest forever
(issue 20 #2); killing the parent left its workers running, still writing trials (issue 20 #4).
Here each worker has a pipe of its own, which only it and the parent hold:

- a worker that dies at any moment closes its end, so the parent reads an end of file (whole
  message or not) or sees its process sentinel, and raises :class:`WorkerDied` at once;
- a worker dies with its parent: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` on Linux, and on any
  system a thread that ends the worker once its parent is gone (``os.getppid`` changes).

Workers are started with ``spawn`` (a fresh interpreter: no lock or thread of the parent is
inherited) with SIGINT ignored: Ctrl-C is the parent's business, which tells its workers.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Self

__all__ = ["Pool", "WorkerDied"]

_PR_SET_PDEATHSIG = 1
"""From <linux/prctl.h>: the signal a process gets when its parent dies."""
_WATCH_S = 0.5
"""How often a worker checks that its parent is alive (where prctl is not available)."""
_CLOSE_S = 5.0
"""How long a finished worker may take to exit before it is killed."""


class WorkerDied(RuntimeError):
    """A worker process ended while the run needed it (killed, out of memory, ...)."""

    def __init__(self, pid: int | None, exitcode: int | None) -> None:
        how = (f"killed by signal {-exitcode}" if exitcode is not None and exitcode < 0
               else f"exit code {exitcode}" if exitcode is not None else "gone")
        super().__init__(f"worker process {pid} died ({how})")
        self.pid = pid


def _die_with_parent(parent: int) -> None:
    """Make this worker end when ``parent`` does, even by SIGKILL."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_WATCH_S)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _serve(conn: Connection, parent: int) -> None:
    """A worker: runs ``(function, args)`` tasks from its pipe until it reads None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent)
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if task is None:
            return
        function, args = task
        try:
            reply = (True, function(*args))
        except Exception as e:  # noqa: BLE001 - handed to the parent, which raises it
            reply = (False, e)
        conn.send(reply)


class _Worker:
    def __init__(self, context: Any) -> None:
        self.conn, child = context.Pipe(duplex=True)
        self.process: BaseProcess = context.Process(target=_serve, args=(child, os.getpid()),
                                                    daemon=True)
        self.process.start()
        child.close()  # the child's end lives only in the child: its death is an end of file
        self.task: int | None = None


class Pool:
    """``jobs`` worker processes; use as a context manager (leaving it ends every worker)."""

    def __init__(self, jobs: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._workers: list[_Worker] = []
        previous = _ignore_sigint()
        try:
            for _ in range(jobs):
                self._workers.append(_Worker(context))
        except BaseException:
            self.close()
            raise
        finally:
            _restore_sigint(previous)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pids(self) -> list[int | None]:
        return [w.process.pid for w in self._workers]

    def map(self, function: Callable[..., Any], tasks: Iterable[tuple[Any, ...]]
            ) -> Iterator[Any]:
        """``function(*args)`` for every task, in the workers; yields the results in the
        order of the tasks. Raises :class:`WorkerDied` as soon as a worker dies, or the
        exception a task raised."""
        todo = list(enumerate(tasks))
        todo.reverse()
        done: dict[int, Any] = {}
        pending, next_out = len(todo), 0
        while pending or next_out in done:
            while next_out in done:
                yield done.pop(next_out)
                next_out += 1
            if not pending:
                return
            for w in self._workers:
                if w.task is None and todo:
                    w.task, args = todo.pop()
                    self._send(w, (function, args))
            k, result = self._next_result()
            done[k] = result
            pending -= 1

    def _send(self, w: _Worker, task: tuple[Callable[..., Any], tuple[Any, ...]]) -> None:
        try:
            w.conn.send(task)
        except OSError:  # BrokenPipeError: the worker is dead (not the user's pipe)
            raise WorkerDied(w.process.pid, _exitcode(w.process)) from None

    def _next_result(self) -> tuple[int, Any]:
        busy = [w for w in self._workers if w.task is not None]
        by_handle: dict[Any, _Worker] = {}
        for w in busy:
            by_handle[w.conn] = w
            by_handle[w.process.sentinel] = w
        while True:
            for handle in wait(list(by_handle)):
                w = by_handle[handle]
                if handle is w.conn or w.conn.poll():
                    return self._receive(w)
                raise WorkerDied(w.process.pid, _exitcode(w.process))

    def _receive(self, w: _Worker) -> tuple[int, Any]:
        try:
            ok, result = w.conn.recv()
        except (EOFError, OSError):  # died mid-message, or before writing one
            raise WorkerDied(w.process.pid, _exitcode(w.process)) from None
        k, w.task = w.task, None
        assert k is not None
        if not ok:
            raise result
        return k, result

    def close(self, grace: float = _CLOSE_S) -> None:
        """Tell idle workers to exit, wait up to ``grace`` s, then kill what is left; a worker
        still on a task is killed at once (its result is not wanted)."""
        for w in self._workers:
            if w.task is None and w.process.is_alive():
                with contextlib.suppress(OSError):
                    w.conn.send(None)
            else:
                _kill(w.process)
        deadline = time.monotonic() + grace
        for w in self._workers:
            w.process.join(max(0.0, deadline - time.monotonic()))
            _kill(w.process)
            w.process.join()
            w.conn.close()
        self._workers = []

    def finish(self, grace: float) -> None:
        """Let the workers finish the tasks they hold (results dropped) for up to ``grace`` s,
        then close: for tasks that write to the study themselves."""
        deadline = time.monotonic() + grace
        for w in self._workers:
            while w.task is not None and time.monotonic() < deadline:
                if not w.conn.poll(max(0.0, min(0.2, deadline - time.monotonic()))):
                    if not w.process.is_alive():
                        break
                    continue
                with contextlib.suppress(Exception):
                    w.conn.recv()
                w.task = None
        self.close(grace=max(0.0, deadline - time.monotonic()))


def _exitcode(process: BaseProcess) -> int | None:
    process.join(1.0)
    return process.exitcode


def _kill(process: BaseProcess) -> None:
    if process.is_alive():
        with contextlib.suppress(OSError):
            process.kill()


def _ignore_sigint() -> Any:
    """Workers start with SIGINT ignored (a Ctrl-C during their start reaches only us)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, signal.SIG_IGN)


def _restore_sigint(previous: Any) -> None:
    if previous is not None:
        signal.signal(signal.SIGINT, previous)
