"""Issue 20 #1, #2, #4, #7, #11: one live writer per study, `--jobs` workers that neither hang the
run when killed nor outlive it, and a `--storage` that never overwrites a user's file.

The runs are real `planner run` processes on a journal in tmp_path. A ``sitecustomize`` put on
their PYTHONPATH slows every estimate by ``PLANNER_TEST_SLOW_S`` seconds (in the workers too), so
that a run is reliably still going when the test acts on it, and has ``--jobs N`` estimate even a
small exhaustive study in its workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from planner.cli import main
from tests.study_files import lab_study
from tests.test_crash import MID, _complete, _trials

ROOT = Path(__file__).resolve().parent.parent
SLOW = """\
import os
if os.environ.get("PLANNER_TEST_SLOW_S"):
    import time
    import planner.record
    _delay = float(os.environ["PLANNER_TEST_SLOW_S"])
    _call = planner.record.Evaluator.__call__
    def _slow(self, strategy):
        time.sleep(_delay)
        return _call(self, strategy)
    planner.record.Evaluator.__call__ = _slow
    _frame = planner.record.Evaluator.frame
    def _slow_frame(self, strategies):
        time.sleep(_delay * len(strategies))
        return _frame(self, strategies)
    planner.record.Evaluator.frame = _slow_frame
    import planner.run_exhaustive
    planner.run_exhaustive.PARALLEL_MIN = 0  # --jobs N uses its workers on a small study too,
    planner.run_exhaustive.CHUNK = 250        # several chunks each
"""
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _start(tmp_path: Path, *args: str, storage: Path, slow: float = 0.0) -> subprocess.Popen:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SLOW)
    env = dict(os.environ, PLANNER_STORAGE=str(storage), PYTHONPATH=f"{site}{os.pathsep}{ROOT}",
               PLANNER_TEST_SLOW_S=str(slow) if slow else "")
    return subprocess.Popen([sys.executable, "-m", "planner.cli", *args, "--quiet"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait(ready, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"the run ended too early: {proc.communicate()}"
        assert time.monotonic() < deadline, "the run never got far enough"
        time.sleep(0.02)


def _described(storage: Path, name: str) -> bool:
    try:
        return "fingerprint" in _study(storage, name).user_attrs
    except (KeyError, ValueError, FileNotFoundError):
        return False


def _study(storage: Path, name: str) -> optuna.Study:
    backend = optuna.storages.journal.JournalFileBackend(str(storage))
    return optuna.load_study(study_name=name, storage=optuna.storages.JournalStorage(backend))


def _workers(pid: int) -> list[int]:
    """The worker processes of a `planner run` (its children but a resource tracker)."""
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(k) for k in (task / "children").read_text().split()]
    return [k for k in kids if b"resource_tracker" not in _cmdline(k)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=30)


def _refused(tmp_path: Path, study: Path, storage: Path, live: subprocess.Popen) -> None:
    """A `--resume` of the live study: exit 2 at once, one line naming the live process."""
    second = _start(tmp_path, "run", str(study), "--resume", storage=storage)
    out, err = second.communicate(timeout=60)
    assert second.returncode == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"being written by planner run (pid {live.pid})" in lines[0], err


def test_a_resume_of_a_live_exhaustive_study_is_refused_and_stores_nothing_twice(tmp_path):
    # Issue 20 #1: a resume during a live exhaustive run estimated what the study lacked and
    # stored it too: every plan twice
    study = lab_study(tmp_path)
    storage = tmp_path / "s.journal"
    live = _start(tmp_path, "run", str(study), storage=storage, slow=0.1)  # 56 plans, ~6 s
    try:
        _wait(lambda: _described(storage, "lab"), live)
        _refused(tmp_path, study, storage, live)
        out, err = live.communicate(timeout=120)
        assert live.returncode == 0, (out, err)
    finally:
        _stop(live)
    plans = [t.user_attrs["plan"] for t in _trials(storage, "lab")]
    assert len(plans) == len(set(plans)) == 56


def test_a_resume_of_a_live_tpe_study_is_refused_and_the_live_run_finishes(tmp_path):
    # Issue 20 #7: a resume failed the live run's RUNNING trial, and the live run crashed
    study = lab_study(tmp_path, sampler="tpe", n_trials=40)
    storage = tmp_path / "s.journal"
    live = _start(tmp_path, "run", str(study), storage=storage, slow=0.1)
    try:
        _wait(lambda: _complete(storage, "lab") >= 3, live)
        _refused(tmp_path, study, storage, live)
        out, err = live.communicate(timeout=120)
        assert live.returncode == 0, (out, err)
    finally:
        _stop(live)
    states = [t.state for t in _trials(storage, "lab")]
    assert states == [TrialState.COMPLETE] * 40


def test_a_resume_after_the_live_run_was_killed_proceeds(tmp_path):
    # the lock dies with its holder: a killed run does not block its study
    study = lab_study(tmp_path, sampler="tpe", n_trials=40)
    storage = tmp_path / "s.journal"
    live = _start(tmp_path, "run", str(study), storage=storage, slow=0.1)
    _wait(lambda: _complete(storage, "lab") >= 3, live)
    live.kill()
    live.communicate(timeout=30)
    resumed = _start(tmp_path, "run", str(study), "--resume", storage=storage)
    out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, (out, err)
    assert _complete(storage, "lab") == 40


def test_a_worker_killed_while_it_sends_its_result_ends_the_run_not_hangs(tmp_path):
    # Issue 20 #2: a worker killed in the middle of writing its result to the shared pipe left
    # half a message there, and `planner run --jobs N` waited for the rest forever
    study = tmp_path / "mid.yaml"
    study.write_text(MID)  # 1,998 plans: 8 chunks of 250, some 500 kB of records each
    storage = tmp_path / "s.journal"
    live = _start(tmp_path, "run", str(study), "--jobs", "2", storage=storage, slow=0.002)
    try:
        _wait(lambda: storage.exists() and storage.stat().st_size > 100_000, live)
        live.send_signal(signal.SIGSTOP)  # the parent reads nothing: the workers' results
        time.sleep(3)                     # fill their pipes, and they block writing them
        workers = _workers(live.pid)
        assert workers
        os.kill(workers[0], signal.SIGKILL)
        time.sleep(0.5)
        live.send_signal(signal.SIGCONT)
        out, err = live.communicate(timeout=60)
    finally:
        live.send_signal(signal.SIGCONT)
        _stop(live)
    assert live.returncode == 1, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "died" in lines[0] and "--resume" in lines[0], err
    assert "Traceback" not in err
    resumed = _start(tmp_path, "run", str(study), "--resume", storage=storage)
    out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, (out, err)
    plans = [t.user_attrs["plan"] for t in _trials(storage, "mid")]
    assert len(plans) == len(set(plans)) == 1998


def test_the_workers_of_a_killed_run_die_with_it(tmp_path):
    # Issue 20 #4: killing `planner run --jobs 2` left its workers alive, adding trials
    study = lab_study(tmp_path, sampler="tpe", n_trials=3000)
    storage = tmp_path / "s.journal"
    live = _start(tmp_path, "run", str(study), "--jobs", "2", storage=storage, slow=0.01)
    try:
        _wait(lambda: _complete(storage, "lab") >= 10, live)
        workers = _workers(live.pid)
        assert len(workers) == 2
        live.kill()
        live.communicate(timeout=30)
        deadline = time.monotonic() + 10
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        alive = [w for w in workers if _alive(w)]
    finally:
        for w in _workers(live.pid) if live.poll() is None else []:
            os.kill(w, signal.SIGKILL)
        _stop(live)
    for w in alive:  # leave no orphan behind, even when the test fails
        os.kill(w, signal.SIGKILL)
    assert alive == []
    size = storage.stat().st_size
    time.sleep(1)
    assert storage.stat().st_size == size  # nobody writes any more


def _answer(x: int) -> int:
    return x + 1


def _big() -> bytes:
    return bytes(50_000_000)


def test_a_worker_killed_mid_message_is_an_error_not_a_hang():
    # the exact moment of issue 20 #2: the worker blocked writing a result larger than the
    # pipe holds, killed there; the parent then reads half a message and must not wait for more
    import threading

    from planner.run_pool import Pool, WorkerDied

    with Pool(2) as pool:
        worker = pool._workers[0]
        worker.task = 0
        pool._send(worker, (_big, ()))
        time.sleep(3)  # built and blocked in its write: nobody reads yet
        os.kill(worker.process.pid, signal.SIGKILL)
        raised: list[BaseException] = []

        def receive() -> None:
            try:
                pool._next_result()
            except BaseException as e:  # noqa: BLE001 - checked below
                raised.append(e)

        reader = threading.Thread(target=receive, daemon=True)
        reader.start()
        reader.join(20)
        assert not reader.is_alive(), "the parent hangs on the half message"
        assert raised and isinstance(raised[0], WorkerDied)


def test_the_pool_raises_when_a_worker_dies_and_leaves_no_worker():
    from planner.run_pool import Pool, WorkerDied

    with Pool(2) as pool:
        assert list(pool.map(_answer, [(1,), (2,), (3,)])) == [2, 3, 4]
        pids = pool.pids
        os.kill(pids[0], signal.SIGKILL)
        with pytest.raises(WorkerDied, match=f"worker process {pids[0]} died"):
            list(pool.map(time.sleep, [(0.5,), (0.5,)]))
    assert not any(_alive(p) for p in pids if p is not None)


@pytest.mark.parametrize("content", ['{"model": "llama70b"}', "notes\n", "\x00\x01"])
def test_storage_refuses_a_file_that_is_not_a_journal(tmp_path, capsys, content):
    # Issue 20 #11: a one-line file without its final newline was erased (its "torn last line"
    # cut) and a journal written into it
    user_file = tmp_path / "config.json"
    user_file.write_text(content)
    code = main(["run", str(lab_study(tmp_path)), "--storage", str(user_file), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and str(user_file) in err[0] and "not an Optuna journal" in err[0]
    assert user_file.read_text() == content


@pytest.mark.parametrize("content", ["", None])
def test_storage_takes_an_empty_or_new_file_and_a_journal(tmp_path, capsys, content):
    label = tmp_path / "s.journal"
    if content is not None:
        label.write_text(content)
    assert main(["run", str(lab_study(tmp_path)), "--storage", str(label), "--quiet"]) == 0
    assert main(["run", str(lab_study(tmp_path, "lab2")), "--storage", str(label),
                 "--quiet"]) == 0  # a journal: taken
    assert len(_study(label, "lab2").trials) == 56
