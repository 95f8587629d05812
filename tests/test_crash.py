"""A study killed with SIGKILL keeps every finished trial, its journal stays a valid Optuna
journal, and ``planner run --resume`` finishes it: checked trial by trial against a run that was
never killed. Also: the journal's lock and torn last line after a killed writer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from planner.errors import PlannerUsageError
from planner.runner import run_study
from planner.storage import JournalLock, open_storage
from planner.study_config import load_study_config
from tests.study_files import lab_study

optuna.logging.set_verbosity(optuna.logging.WARNING)
ROOT = Path(__file__).resolve().parent.parent
MID = """\
name: mid
model: llama70b
system: lab-system1
training: {global_batch: 512, seq_len: 1024}
sampler: exhaustive
space:
  tp: powers_of_two
  pp: [1, 2, 4, 8]
  sp: powers_of_two
  zero: [0, 1, 3]
  recompute: [none, selective, full]
  micro_batch: [1, 2, 4]
"""
"""1,998 strategies: four add_trials batches of 512, about a second to estimate."""


def _plain(path: Path) -> JournalStorage:
    """The journal read by plain Optuna (no planner code): it must always load."""
    return JournalStorage(JournalFileBackend(str(path)))


def _trials(path: Path, name: str, *states: TrialState) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name=name, storage=_plain(path))
    return study.get_trials(states=states or None)


def _complete(path: Path, name: str) -> int:
    try:
        return len(_trials(path, name, TrialState.COMPLETE))
    except (KeyError, ValueError):  # not created yet
        return 0


def _planner(*args: str, storage: Path) -> subprocess.Popen:
    env = dict(os.environ, PLANNER_STORAGE=str(storage), PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "planner.cli", *args, "--quiet"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_when(proc: subprocess.Popen, ready, timeout: float = 60) -> None:
    """SIGKILL the process as soon as ``ready()``; fail if it ended first."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"the run ended before it was killed: {proc.communicate()}"
        assert time.monotonic() < deadline, "the run never got far enough"
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it was killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def _resume(study: Path, storage: Path) -> str:
    proc = _planner("run", str(study), "--resume", storage=storage)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, (out, err)
    return out


def test_sigkill_mid_exhaustive_then_resume_equals_an_uninterrupted_run(tmp_path):
    study = tmp_path / "mid.yaml"
    study.write_text(MID)
    killed = tmp_path / "killed.journal"
    proc = _planner("run", str(study), storage=killed)
    # killed once at least one batch is stored (the file then holds far more than the study)
    _kill_when(proc, lambda: killed.exists() and killed.stat().st_size > 100_000)
    kept = _trials(killed, "mid")
    assert 0 < len(kept) < 1998 and all(t.state == TrialState.COMPLETE for t in kept)

    _resume(study, killed)
    config = load_study_config(study)
    label = str(tmp_path / "reference.journal")
    reference = run_study(config, open_storage(label, create=True), label, progress=False)
    expected = {t.user_attrs["plan"]: t.values for t in reference.study.trials}
    got = _trials(killed, "mid")
    plans = [t.user_attrs["plan"] for t in got]
    assert len(plans) == len(set(plans)) == len(expected) == 1998  # each plan exactly once
    assert all(t.state == TrialState.COMPLETE for t in got)
    assert {t.user_attrs["plan"]: t.values for t in got} == expected  # identical values
    assert [t.number for t in got] == list(range(1998))
    # the kept trials were not touched by the resume
    assert [(t.number, t.user_attrs["plan"], t.values) for t in got[:len(kept)]] == \
        [(t.number, t.user_attrs["plan"], t.values) for t in kept]


def test_sigkill_mid_sampler_then_resume_keeps_the_first_trials(tmp_path):
    n = 40
    study = lab_study(tmp_path, sampler="tpe", n_trials=n)
    killed = tmp_path / "killed.journal"
    proc = _planner("run", str(study), storage=killed)
    _kill_when(proc, lambda: _complete(killed, "lab") >= 8)
    before = _trials(killed, "lab")
    done = [t for t in before if t.state == TrialState.COMPLETE]
    running = [t for t in before if t.state == TrialState.RUNNING]
    assert len(done) >= 8 and len(running) <= 1 and len(done) + len(running) == len(before)

    config = load_study_config(study)
    label = str(tmp_path / "reference.journal")
    reference = run_study(config, open_storage(label, create=True), label, progress=False)
    ref = reference.study.trials
    # the finished trials before the kill are the uninterrupted run's first ones
    assert [(t.params, t.values, t.user_attrs["plan"]) for t in done] == \
        [(t.params, t.values, t.user_attrs["plan"]) for t in ref[:len(done)]]

    out = _resume(study, killed)
    after = _trials(killed, "lab")
    states = [t.state for t in after]
    assert states.count(TrialState.COMPLETE) == n and TrialState.RUNNING not in states
    assert states.count(TrialState.FAIL) == len(running)
    if running:  # failed, and its parameters ran again first
        assert "1 trial(s) left RUNNING" in out
        assert after[running[0].number].state == TrialState.FAIL
        retry = after[len(before)]
        assert running[0].params.items() <= retry.params.items()
    assert [(t.params, t.values) for t in after[:len(done)]] == \
        [(t.params, t.values) for t in done]


def test_a_torn_last_line_is_cut_before_the_next_write(tmp_path):
    label = tmp_path / "s.journal"
    path = lab_study(tmp_path)
    config = load_study_config(path)
    run_study(config, open_storage(str(label), create=True), str(label), progress=False)
    good = label.read_bytes()
    with open(label, "ab") as f:  # what a writer killed mid-write leaves
        f.write(b'{"op_code":4,"worker_id":"x","study_id":0,"datetime_sta')
    assert len(_trials(label, "lab")) == 56  # Optuna ignores a torn last line...
    other = lab_study(tmp_path, "lab2")
    run_study(load_study_config(other), open_storage(str(label), create=True), str(label),
              progress=False)
    # ...and the next write cut it off instead of gluing a line onto it
    assert label.read_bytes().startswith(good)
    assert len(_trials(label, "lab")) == len(_trials(label, "lab2")) == 56


HOLDER = textwrap.dedent("""\
    import sys, time
    from planner.storage import JournalLock
    lock = JournalLock(sys.argv[1])
    lock.acquire()
    print("held", flush=True)
    time.sleep(60)
""")


def test_a_lock_left_by_a_killed_process_is_taken_at_once(tmp_path):
    label = tmp_path / "s.journal"
    label.touch()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(label)], env=env,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    lock_file = Path(str(label) + ".lock")
    assert lock_file.is_symlink()
    holder.kill()
    holder.wait()
    assert lock_file.is_symlink()  # left behind: Optuna alone would wait 30 s for it
    _taken_at_once(label, lock_file)


def _taken_at_once(label: Path, lock_file: Path) -> None:
    """The journal's lock is taken within 2 s and the dead symlink is gone."""
    start = time.monotonic()
    lock = JournalLock(str(label))
    lock.acquire()
    lock.release()
    assert time.monotonic() - start < 2
    assert not lock_file.exists()


def test_a_live_holder_is_waited_for(tmp_path):
    label = tmp_path / "s.journal"
    label.touch()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(label)], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        import threading
        got = threading.Event()

        def take() -> None:
            lock = JournalLock(str(label))
            lock.acquire()
            got.set()
            lock.release()

        threading.Thread(target=take, daemon=True).start()
        assert not got.wait(1.0)  # the live holder keeps it
        holder.kill()
        assert got.wait(5.0)  # and its death frees it at once
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("sampler", ["exhaustive", "random"])
def test_resume_after_a_finished_run_changes_nothing(tmp_path, sampler):
    path = lab_study(tmp_path, sampler=sampler, n_trials=10)
    config = load_study_config(path)
    label = str(tmp_path / "s.journal")
    first = run_study(config, open_storage(label, create=True), label, progress=False)
    again = run_study(config, open_storage(label, create=True), label, resume=True,
                      progress=False)
    assert again.added == 0 and len(again.study.trials) == len(first.study.trials)


@pytest.mark.parametrize("resume", [False, True])
def test_a_study_killed_before_it_was_described_is_taken_over(tmp_path, resume, monkeypatch):
    # Issue 20 #3: a run killed after optuna.create_study but before the study's attributes
    # (fingerprint last) were written left a study that `run` called existing and `run --resume`
    # called different. It holds nothing, so the next run of that name takes it over.
    monkeypatch.setattr("planner.runner.ORPHAN_WAIT_S", 0.2)
    path = lab_study(tmp_path)
    config = load_study_config(path)
    label = str(tmp_path / "s.journal")
    optuna.create_study(study_name=config.name, storage=open_storage(label, create=True))
    report = run_study(config, open_storage(label, create=True), label, resume=resume,
                       progress=False)
    assert report.added == len(config.space.enumerate()) == 56
    assert report.study.user_attrs["fingerprint"] == config.fingerprint()


def test_a_described_study_is_not_taken_over(tmp_path):
    # the same name with its fingerprint (a real study, even without trials yet) stays guarded
    path = lab_study(tmp_path)
    config = load_study_config(path)
    label = str(tmp_path / "s.journal")
    storage = open_storage(label, create=True)
    study = optuna.create_study(study_name=config.name, storage=storage)
    study.set_user_attr("fingerprint", "another")
    # without --resume it says what --resume would: another study of the name (it said "add
    # --resume to continue it", which then failed)
    with pytest.raises(PlannerUsageError, match="different.*set another name"):
        run_study(config, open_storage(label, create=True), label, progress=False)
    with pytest.raises(PlannerUsageError, match="different"):
        run_study(config, open_storage(label, create=True), label, resume=True, progress=False)


def test_a_lock_left_before_the_folder_was_moved_is_taken_at_once(tmp_path):
    # Issue 20 #5: a killed planner's lock is a symlink to "<old folder>/./s.journal"; after the
    # results folder moved, it no longer matched the marker made from the new path and resume
    # waited for it forever. Any "<dir>/./<journal name>" is a planner marker: while this
    # process holds the journal's kernel lock, no live planner can hold that symlink.
    label = tmp_path / "moved" / "s.journal"
    label.parent.mkdir()
    label.touch()
    lock_file = Path(str(label) + ".lock")
    os.symlink(os.path.join(str(tmp_path / "before"), ".", "s.journal"), lock_file)
    _taken_at_once(label, lock_file)


@pytest.mark.parametrize("what", ["deleted", "replaced"])
def test_a_journal_gone_during_the_run_is_a_failure_not_success(tmp_path, monkeypatch, capsys,
                                                                what):
    # Issue 20 #6: the journal deleted (or swapped for another file) mid-run gave exit 0 and
    # printed best plans, with nothing on disk
    import planner.commands._run as run_command
    from planner.cli import main

    label = tmp_path / "s.journal"
    real = run_command.run_study

    def run_then_lose_the_journal(*args, **kwargs):
        report = real(*args, **kwargs)
        label.unlink()
        if what == "replaced":
            label.write_text("")
        return report

    monkeypatch.setattr(run_command, "run_study", run_then_lose_the_journal)
    code = main(["run", str(lab_study(tmp_path)), "--storage", str(label), "--quiet"])
    captured = capsys.readouterr()
    assert code == 1
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "the journal was deleted or replaced" in err[0]
    assert "best plans" not in captured.out
