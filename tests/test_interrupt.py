"""Ctrl-C keeps every finished trial, and --resume finishes the study; an RDB URL works as is."""

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
from planner.runner import StopRequest, _objective
from planner.study_config import load_study_config
from tests.study_files import lab_study

ROOT = Path(__file__).resolve().parent.parent
BIG = """\
name: big
model: llama70b
system: lab-system1
training: {global_batch: 512, seq_len: 1024}
sampler: exhaustive
space:
  tp: powers_of_two
  pp: [1, 2, 4, 8, 16]
  sp: powers_of_two
  zero: [0, 1, 3]
  recompute: [none, selective, full]
  micro_batch: [1, 2, 4, 8]
  schedule: [1f1b, interleaved]
  v: [2, 5]
  placement: ["tp,sp,dp,pp", "tp,sp,pp,dp"]
"""


def _complete(storage: Path, name: str) -> int:
    st = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(storage)))
    study = optuna.load_study(study_name=name, storage=st)
    return len(study.get_trials(states=(TrialState.COMPLETE,)))


def test_ctrl_c_keeps_finished_trials_and_resume_finishes(tmp_path, capsys):
    # 12,816 strategies in batches of 512: interrupted after the first batch is stored.
    study = tmp_path / "big.yaml"
    study.write_text(BIG)
    storage = tmp_path / "s.journal"
    env = dict(os.environ, PLANNER_STORAGE=str(storage), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "planner.cli", "run", str(study), "--quiet"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    # wait until the first batch is stored (the file holds more than the study's creation)
    while time.monotonic() < deadline and (not storage.exists() or storage.stat().st_size < 50_000):
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert "interrupted" in err and "--resume" in err and "Traceback" not in err
    # where the results are: the storage, the study and the command that continues it
    assert f"of study 'big' are kept in {storage}" in err
    assert f"planner run {study} --storage {storage} --resume" in err
    kept = _complete(storage, "big")
    assert kept > 0
    os.environ["PLANNER_STORAGE"] = str(storage)
    try:
        assert main(["run", str(study), "--resume", "--quiet"]) == 0
    finally:
        del os.environ["PLANNER_STORAGE"]
    total = _complete(storage, "big")
    out = capsys.readouterr().out
    valid = int(out.split(" valid strategies")[0].split()[-1].replace(",", ""))
    assert total == valid > kept  # every valid strategy exactly once


def test_an_rdb_url_works_unchanged(tmp_path, capsys):
    path = lab_study(tmp_path)
    path.write_text(path.read_text().replace("recompute: [none, full]", "recompute: [none]"))
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    assert main(["run", str(path), "--storage", url, "--quiet"]) == 0
    assert "28 valid strategies" in capsys.readouterr().out  # C(8, 2) layouts, recompute off
    assert main(["best", "lab", "--storage", url, "--top", "1"]) == 0
    assert "dp" in capsys.readouterr().out


def _start(args: list[str], storage: Path, **kw) -> subprocess.Popen:
    env = dict(os.environ, PLANNER_STORAGE=str(storage), PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "planner.cli", *args, "--quiet"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _wait_for(storage: Path, name: str, n: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            if _complete(storage, name) >= n:
                return
        except (KeyError, ValueError, FileNotFoundError):
            pass
        time.sleep(0.05)
    raise AssertionError("no progress")


def _states(storage: Path, name: str) -> list[TrialState]:
    st = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(storage)))
    return [t.state for t in optuna.load_study(study_name=name, storage=st).trials]


@pytest.mark.parametrize("jobs", [1, 2])
def test_ctrl_c_lets_running_sampler_trials_finish(tmp_path, jobs):
    """Ctrl-C at the terminal (SIGINT to the whole process group, joblib workers included):
    the running trials finish, none is left RUNNING, exit 130; --resume reaches n_trials."""
    path = lab_study(tmp_path, sampler="tpe", n_trials=3000)
    storage = tmp_path / "s.journal"
    proc = _start(["run", str(path), "--jobs", str(jobs)], storage, start_new_session=True)
    _wait_for(storage, "lab", 10, proc)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and f"of study 'lab' are kept in {storage}" in err
    assert f"planner run {path} --storage {storage} --resume" in err
    states = _states(storage, "lab")
    assert TrialState.RUNNING not in states and TrialState.WAITING not in states
    assert states.count(TrialState.COMPLETE) >= 10
    path.write_text(path.read_text().replace("n_trials: 3000", f"n_trials: {len(states) + 5}"))
    resumed = _start(["run", str(path), "--resume"], storage)
    out, err = resumed.communicate(timeout=60)
    assert resumed.returncode == 0, (out, err)
    assert _states(storage, "lab").count(TrialState.COMPLETE) == len(states) + 5


def test_ctrl_c_twice_stops_at_the_next_safe_point_three_times_at_once(tmp_path):
    """The first Ctrl-C lets the running work finish; the second stops at the next safe point
    (a sampler trial's start, the next strategy of a batch: Optuna marks the trial FAIL); the
    third raises wherever the process is."""
    hooked = []
    with StopRequest() as stop:
        stop.on_stop(lambda: hooked.append(1))
        stop.check_now()
        signal.raise_signal(signal.SIGINT)
        assert stop.requested and not stop.now and hooked == [1]
        with pytest.raises(KeyboardInterrupt):
            stop.check()
        signal.raise_signal(signal.SIGINT)
        assert stop.now
        config = load_study_config(lab_study(tmp_path, sampler="random"))
        study = optuna.create_study()
        with pytest.raises(KeyboardInterrupt):
            study.optimize(_objective(config, None, stop), n_trials=1)
        assert [t.state for t in study.trials] == [TrialState.FAIL]
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# -- what `planner run` says after a Ctrl-C: one line, true to what is kept -------------------
def _ctrl_c() -> None:
    """Ctrl-C as the terminal sends it: the StopRequest handler runs, as it would."""
    signal.raise_signal(signal.SIGINT)


def _ctrl_c_in_trial(monkeypatch, number: int) -> None:
    """Ctrl-C while the sampler's trial ``number`` runs."""
    import planner.runner as runner

    objective = runner._objective

    def stopped(config, storage=None, stop=None):
        inner = objective(config, storage, stop)

        def run(trial):
            if trial.number == number:
                _ctrl_c()
            return inner(trial)
        return run

    monkeypatch.setattr(runner, "_objective", stopped)


def _finished(studies_out: str) -> str:
    """The ``finished`` cell of ``planner studies``' one row."""
    header, row = studies_out.strip().splitlines()
    return dict(zip(header.replace("trials kept", "kept").split(), row.split()))["finished"]


def _interrupted_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "interrupted" in line]


def test_ctrl_c_mid_study_is_one_line_with_the_trials_kept(tmp_path, capsys, monkeypatch):
    path = lab_study(tmp_path, sampler="tpe", n_trials=12)
    _ctrl_c_in_trial(monkeypatch, 3)
    storage = tmp_path / "s.journal"
    assert main(["run", str(path), "--storage", str(storage), "--quiet"]) == 130
    err = capsys.readouterr().err
    assert _interrupted_lines(err) == [
        f"planner run: interrupted: 4 finished trials of study 'lab' are kept in {storage};"
        f" continue with: planner run {path} --storage {storage} --resume"]
    assert _complete(storage, "lab") == 4
    # what reads it says it is unfinished, and how to finish it
    assert main(["best", "lab", "--storage", str(storage)]) == 0
    assert ("warning: study 'lab' is unfinished: 4 of its 12 tpe trials finished, so its best is"
            f" the best of those; `planner run STUDY.yaml --resume --storage {storage}` finishes"
            " it" in capsys.readouterr().err)
    assert main(["studies", "--storage", str(storage)]) == 0
    assert _finished(capsys.readouterr().out) == "no"
    monkeypatch.undo()
    assert main(["run", str(path), "--storage", str(storage), "--quiet", "--resume"]) == 0
    capsys.readouterr()
    assert main(["best", "lab", "--storage", str(storage)]) == 0
    assert "unfinished" not in capsys.readouterr().err
    assert main(["studies", "--storage", str(storage)]) == 0
    assert _finished(capsys.readouterr().out) == "yes"


def test_ctrl_c_in_the_last_sampler_trial_finishes_and_says_so(tmp_path, capsys, monkeypatch):
    path = lab_study(tmp_path, sampler="tpe", n_trials=5)
    _ctrl_c_in_trial(monkeypatch, 4)  # the last one
    storage = tmp_path / "s.journal"
    assert main(["run", str(path), "--storage", str(storage), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "the run finished, nothing is left to resume" in err
    assert not _interrupted_lines(err) and "best plans" in out
    assert _complete(storage, "lab") == 5


def _results_table_study(tmp_path: Path, monkeypatch) -> Path:
    """The lab's 56 plans as a study that keeps only its fronts and best plans as trials (as
    one of more than TRIALS_KEPT plans does), the rest in its results table."""
    from planner import results_parquet

    monkeypatch.setattr(results_parquet, "TRIALS_KEPT", 10)
    monkeypatch.setattr(results_parquet, "BEST_KEPT", 3)
    return lab_study(tmp_path)


def test_ctrl_c_of_a_results_table_study_counts_its_table(tmp_path, capsys, monkeypatch):
    import planner.run_exhaustive as run_exhaustive

    path = _results_table_study(tmp_path, monkeypatch)
    chunk = run_exhaustive._Recorder.chunk

    def stopped_in_the_chunk(self, *args):
        _ctrl_c()
        return chunk(self, *args)

    monkeypatch.setattr(run_exhaustive._Recorder, "chunk", stopped_in_the_chunk)
    storage = tmp_path / "s.journal"
    assert main(["run", str(path), "--storage", str(storage), "--quiet"]) == 130
    err = capsys.readouterr().err
    assert _interrupted_lines(err) == [
        f"planner run: interrupted: the estimates of 56 of 56 plans of study 'lab' are kept in"
        f" {storage} (its results table); continue with: planner run {path} --storage"
        f" {storage} --resume"]
    monkeypatch.setattr(run_exhaustive._Recorder, "chunk", chunk)
    assert main(["run", str(path), "--storage", str(storage), "--quiet", "--resume"]) == 0
    assert 3 <= _complete(storage, "lab") < 56  # the kept trials, written by the resume


def test_ctrl_c_while_the_kept_trials_are_written_says_the_run_finished(tmp_path, capsys,
                                                                        monkeypatch):
    import planner.run_exhaustive as run_exhaustive

    path = _results_table_study(tmp_path, monkeypatch)
    keep = run_exhaustive._Recorder.keep

    def stopped_in_keep(self):
        _ctrl_c()
        keep(self)

    monkeypatch.setattr(run_exhaustive._Recorder, "keep", stopped_in_keep)
    storage = tmp_path / "s.journal"
    assert main(["run", str(path), "--storage", str(storage), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "the run finished, nothing is left to resume" in err
    assert _complete(storage, "lab") >= 3


def test_ctrl_c_while_printing_the_best_plans_says_the_study_is_complete(tmp_path, capsys,
                                                                          monkeypatch):
    import planner.commands._run as run_command

    def interrupted(*_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_command, "format_best", interrupted)
    path = lab_study(tmp_path)
    storage = tmp_path / "s.journal"
    assert main(["run", str(path), "--storage", str(storage), "--quiet"]) == 130
    lines = _interrupted_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "the study is complete; more: planner best lab" in lines[0]
    assert _complete(storage, "lab") == 56


def test_an_unfinished_comparison_cell_is_finished_by_its_comparison(tmp_path, capsys,
                                                                     monkeypatch):
    # a compare cell stopped by Ctrl-C was said to be finished by `planner run STUDY.yaml
    # --resume`, but a cell has no study YAML of its own: its comparison, run again, ends it
    lab_study(tmp_path, sampler="tpe", n_trials=12)
    comparison = tmp_path / "c.yaml"
    comparison.write_text("name: cmp\nstudy: lab.yaml\nsystems: [lab-system1]\nhbm_gb: [80]\n")
    _ctrl_c_in_trial(monkeypatch, 3)
    storage = tmp_path / "cells"
    assert main(["compare", str(comparison), "--storage", f"{storage}/", "--quiet",
                 "--out", str(tmp_path / "out")]) == 130
    capsys.readouterr()
    assert main(["best", "cmp--lab-system1--hbm80gb", "--storage", f"{storage}/"]) == 0
    err = capsys.readouterr().err
    assert "warning: study 'cmp--lab-system1--hbm80gb' is unfinished: 4 of its 12 tpe" in err
    assert f"`planner compare COMPARISON.yaml --storage {storage}/` runs it to the end" in err
