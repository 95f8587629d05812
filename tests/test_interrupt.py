"""Ctrl-C keeps every finished trial, and --resume finishes the study; an RDB URL works as is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

from planner.cli import main
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
