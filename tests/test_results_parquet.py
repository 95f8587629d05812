"""Issue 17 item 3: the exhaustive path estimates chunks at once, writes every plan to a Parquet
table beside the study, and keeps only the fronts and the best plans as Optuna trials beyond
TRIALS_KEPT plans. Checked against the per-strategy path (one ``Evaluator`` call and one
``frozen_trial`` per strategy) trial by trial, and through a SIGKILL and a resume."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
from optuna.trial import TrialState

from planner import results_parquet as rp
from planner import run_exhaustive
from planner.cli import main
from planner.record import frozen_trial
from planner.runner import run_study
from planner.storage import open_storage
from planner.study_config import load_study_config
from planner.tables import best_frame, trials_frame
from search_spaces import LayoutEncoding
from tests.test_crash import MID, _kill_when

optuna.logging.set_verbosity(optuna.logging.WARNING)
ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted(p.stem for p in (ROOT / "studies").glob("*.yaml"))
"""Every shipped study (the 405B one's FLOPs overflowed int64 in its table before it was
here)."""


def _run(tmp_path: Path, path: Path, store: str = "s.journal") -> optuna.Study:
    config = load_study_config(path)
    label = str(tmp_path / store)
    return run_study(config, open_storage(label, create=True), label, progress=False).study


def _per_strategy(path: Path) -> dict[str, tuple]:
    """What the path before issue 17 stored for each plan: one estimate, one frozen trial."""
    config = load_study_config(path)
    evaluator, encoding = config.evaluator(), LayoutEncoding(config.space)
    out = {}
    for s in config.space.valid:
        t = frozen_trial(evaluator(s), encoding.params(s), encoding.distributions)
        out[t.user_attrs["plan"]] = (t.values, t.user_attrs, t.system_attrs, t.params)
    return out


def _stored(study: optuna.Study) -> dict[str, tuple]:
    return {t.user_attrs["plan"]: (t.values, t.user_attrs, t.system_attrs, t.params)
            for t in study.get_trials(states=(TrialState.COMPLETE,))}


@pytest.mark.parametrize("name", SHIPPED)
def test_the_batched_path_stores_the_trials_of_the_per_strategy_path(tmp_path, name):
    path = ROOT / "studies" / f"{name}.yaml"
    study = _run(tmp_path, path)
    expected = _per_strategy(path)
    got = _stored(study)
    assert len(study.trials) == len(got) == len(expected)
    assert got == expected  # every value, user attribute, constraint and parameter
    assert study.user_attrs[rp.RESULTS]["trials_kept"] == rp.ALL
    # the table beside the study holds the same figures, numbered as the trials
    table = rp.ResultsTable(Path(study.user_attrs[rp.RESULTS]["parquet"])).read()
    frame = trials_frame(study)
    table = table[[c for c in frame.columns]]
    pd.testing.assert_frame_equal(table, frame, check_dtype=False)


def _mid(tmp_path: Path, objectives: str = "[step_time, peak_memory]") -> Path:
    path = tmp_path / "mid.yaml"
    path.write_text(MID + f"objectives: {objectives}\nhbm_gb: 40\n")
    return path


@pytest.fixture
def small_threshold(monkeypatch):
    """1,998 plans count as a big study: 100 plans at most as trials, the best 10 kept."""
    monkeypatch.setattr(rp, "TRIALS_KEPT", 100)
    monkeypatch.setattr(rp, "BEST_KEPT", 10)
    monkeypatch.setattr(run_exhaustive, "CHUNK", 700)


@pytest.mark.parametrize("objectives", ["[step_time]", "[step_time, peak_memory]"])
def test_a_big_study_keeps_the_fronts_and_the_best_as_trials(tmp_path, small_threshold,
                                                             monkeypatch, objectives):
    path = _mid(tmp_path, objectives)
    study = _run(tmp_path, path)
    results = study.user_attrs[rp.RESULTS]
    assert results == {"parquet": str(tmp_path / "s.journal.mid.parquet"), "plans": 1998,
                       "trials_kept": rp.FRONT_BEST}
    table = rp.ResultsTable(Path(results["parquet"])).read()
    assert len(table) == table["plan"].nunique() == 1998
    assert table["number"].tolist() == list(range(1998))
    assert len(list(Path(results["parquet"]).glob("part-*.parquet"))) == 3  # chunks of 700
    # every row equals the per-strategy estimate of its plan
    expected = _per_strategy(path)
    assert set(table["plan"]) == set(expected)
    for row in table.to_dict("records")[::37]:
        attrs = expected[row["plan"]][1]
        assert all(row[k] == v for k, v in attrs.items()), row["plan"]
    # the trials: the fronts and the best 10, once each, stored as before
    kept = table.set_index("number").loc[rp.kept_numbers(table, 10), "plan"]
    got = _stored(study)
    assert sorted(got) == sorted(kept) and len(study.trials) == len(kept) < 100
    assert all(got[p] == expected[p] for p in got)
    feasible = table[table["feasible"]]
    fastest = feasible.sort_values(["step_time_s", "peak_memory_gb"])["plan"].head(10)
    assert set(fastest) <= set(got)
    # the front and the best plans are those of a study holding every plan as a trial
    monkeypatch.setattr(rp, "TRIALS_KEPT", 10_000)
    whole = _run(tmp_path, path, store="whole.journal")
    assert len(whole.trials) == 1998
    assert [t.user_attrs["plan"] for t in study.best_trials] or objectives == "[step_time]"
    assert ({t.user_attrs["plan"] for t in study.best_trials}
            == {t.user_attrs["plan"] for t in whole.best_trials})
    columns = ["plan", "step_time_s", "peak_memory_gb", "placements"]
    mine, theirs = (best_frame(s)[columns].reset_index(drop=True) for s in (study, whole))
    pd.testing.assert_frame_equal(mine, theirs)
    pd.testing.assert_frame_equal(best_frame(study, 5)[columns].reset_index(drop=True),
                                  theirs.head(5))


def test_trials_csv_of_a_big_study_has_every_plan(tmp_path, small_threshold, monkeypatch,
                                                  capsys):
    path = _mid(tmp_path)
    study = _run(tmp_path, path)
    out = tmp_path / "t.csv"
    assert main(["trials", "mid", "--csv", str(out), "--storage",
                 str(tmp_path / "s.journal")]) == 0
    csv = pd.read_csv(out)
    assert len(csv) == csv["plan"].nunique() == 1998 > len(study.trials)
    # the columns of a study holding every plan as a trial, in the same order
    monkeypatch.setattr(rp, "TRIALS_KEPT", 10_000)
    whole = trials_frame(_run(tmp_path, path, store="whole.journal"))
    assert list(csv.columns) == list(whole.columns)
    mine = csv.sort_values("plan").reset_index(drop=True)
    theirs = whole.sort_values("plan").reset_index(drop=True)
    assert np.array_equal(mine["step_time_s"], theirs["step_time_s"])
    assert mine["reason"].fillna("").tolist() == theirs["reason"].fillna("").tolist()
    assert main(["best", "mid", "--storage", str(tmp_path / "s.journal")]) == 0
    assert "Pareto" not in capsys.readouterr().err
    # planner studies says how many plans the study holds and which are trials
    assert main(["studies", "--storage", str(tmp_path / "s.journal")]) == 0
    header, row = capsys.readouterr().out.strip().splitlines()
    cells = dict(zip(header.replace("trials kept", "trials_kept").split(),
                     row.replace("front+best", "front+best").split()))
    assert cells["plans"] == "1998" and cells["trials_kept"] == "front+best"
    assert int(cells["trials"]) == len(study.trials) < 1998


DRIVER = """\
import sys
from planner import results_parquet, run_exhaustive
results_parquet.TRIALS_KEPT, results_parquet.BEST_KEPT, run_exhaustive.CHUNK = {kept}, 10, 300
from planner.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _driver(tmp_path: Path, storage: Path, study: Path, *args: str,
            kept: int) -> subprocess.Popen:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(kept=kept))
    env = dict(os.environ, PLANNER_STORAGE=str(storage), PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, str(script), "run", str(study), *args, "--quiet"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("kept", [100, 10_000], ids=["front+best", "all"])
def test_a_resume_after_a_kill_stores_every_plan_once(tmp_path, kept):
    study = _mid(tmp_path)
    storage = tmp_path / "killed.journal"
    folder = tmp_path / "killed.journal.mid.parquet"
    proc = _driver(tmp_path, storage, study, kept=kept)
    # killed once two parts of 300 plans are written: mid-run, between or inside chunks
    _kill_when(proc, lambda: len(list(folder.glob("part-*.parquet"))) >= 2)
    proc = _driver(tmp_path, storage, study, "--resume", kept=kept)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, (out, err)

    table = rp.ResultsTable(folder).read()
    assert len(table) == table["plan"].nunique() == 1998  # every plan exactly once
    assert table["number"].tolist() == list(range(1998))
    expected = _per_strategy(study)
    reloaded = optuna.load_study(study_name="mid", storage=open_storage(str(storage),
                                                                      create=False))
    got = _stored(reloaded)
    plans = [t.user_attrs["plan"] for t in reloaded.get_trials(states=(TrialState.COMPLETE,))]
    assert len(plans) == len(set(plans))  # no plan twice
    assert all(got[p] == expected[p] for p in got)
    if kept == 100:
        assert sorted(got) == sorted(table.set_index("number")
                                     .loc[rp.kept_numbers(table, 10), "plan"])
    else:
        assert len(got) == 1998


@pytest.mark.parametrize("kept", ["big", "small"])
def test_jobs_2_builds_its_chunks_in_the_workers_and_stores_what_serial_stores(
        tmp_path, monkeypatch, kept):
    # Issue 17 item 6: a fresh parallel run ships flat indices of the space to its workers,
    # which build and estimate their own chunks (the parent never lists the strategies); the
    # table and the trials are those of a serial run, in the same order
    if kept == "big":
        monkeypatch.setattr(rp, "TRIALS_KEPT", 100)
        monkeypatch.setattr(rp, "BEST_KEPT", 10)
    monkeypatch.setattr(run_exhaustive, "PARALLEL_MIN", 0)
    monkeypatch.setattr(run_exhaustive, "CHUNK", 700)
    listed: list[int] = []
    real = run_exhaustive._Lazy.__init__

    def spy(self, config, indices):
        listed.append(len(indices))
        real(self, config, indices)

    monkeypatch.setattr(run_exhaustive._Lazy, "__init__", spy)
    path = _mid(tmp_path)
    config = load_study_config(path)
    label = str(tmp_path / "par.journal")
    parallel = run_study(config, open_storage(label, create=True), label, jobs=2,
                         progress=False).study
    assert listed and listed[0] == 1998  # the index path ran
    serial = _run(tmp_path, path)
    assert "valid" not in vars(config.space)  # never listed in this process
    tables = [rp.ResultsTable(Path(s.user_attrs[rp.RESULTS]["parquet"])).read()
              for s in (parallel, serial)]
    pd.testing.assert_frame_equal(*tables)
    assert _stored(parallel) == _stored(serial)


def test_a_step_s_flops_past_int64_are_written_as_float(tmp_path):
    # Llama-3-405B on 16,384 H100s at global batch 2,048 x 8,192 tokens: 6 x 405e9 x 16.8e6
    # = 4.1e19 FLOPs a step, over int64's 9.2e18; the shipped study's table failed to write
    flops = 6 * 405 * 10**9 * 2048 * 8192
    assert flops > np.iinfo(np.int64).max
    table = rp.ResultsTable(tmp_path / "t.parquet")
    table.append(pd.DataFrame({"plan": ["a", "b"], "model_flops": [flops, 2 * flops]}))
    back = table.read()
    assert back["model_flops"].tolist() == [float(flops), float(2 * flops)]
    assert back["plan"].tolist() == ["a", "b"] and back["number"].tolist() == [0, 1]


def test_a_moved_or_copied_storage_reads_its_own_table(tmp_path, small_threshold, capsys):
    # The study's `results` attribute stores where the table was first written (an absolute
    # path); a storage folder moved or copied whole must read the table beside its journal,
    # as `planner run --resume` writes there (fuzzing found `best` failing with a TypeError,
    # `trials --csv` writing 0 trials and a copy reading the original's table).
    import shutil

    path = _mid(tmp_path)
    (tmp_path / "a").mkdir()
    config = load_study_config(path)
    label = str(tmp_path / "a" / "s.journal")
    run_study(config, open_storage(label, create=True), label, progress=False)
    moved = tmp_path / "b"
    shutil.move(str(tmp_path / "a"), moved)
    out = tmp_path / "t.csv"
    assert main(["trials", "mid", "--csv", str(out), "--storage", str(moved / "s.journal")]) == 0
    assert len(pd.read_csv(out)) == 1998
    assert main(["best", "mid", "--storage", str(moved / "s.journal")]) == 0
    # a copy reads its own table, not the original's: emptied, the copy's has no row
    copy = tmp_path / "c"
    shutil.copytree(moved, copy)
    for part in (copy / "s.journal.mid.parquet").glob("part-*.parquet"):
        part.unlink()
    capsys.readouterr()
    assert main(["trials", "mid", "--csv", str(out), "--storage", str(copy / "s.journal")]) == 0
    assert len(pd.read_csv(out)) == 0  # its own table, emptied; the original's has 1998
    # a journal moved without its table, the table still where it was: one line naming both
    (tmp_path / "d").mkdir()
    shutil.copy(moved / "s.journal", tmp_path / "d" / "s.journal")
    study = optuna.load_study(study_name="mid",
                              storage=open_storage(str(tmp_path / "d" / "s.journal"),
                                                   create=False))
    study.set_user_attr(rp.RESULTS, {**study.user_attrs[rp.RESULTS],
                                     "parquet": str(moved / "s.journal.mid.parquet")})
    capsys.readouterr()
    assert main(["best", "mid", "--storage", str(tmp_path / "d" / "s.journal")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "missing" in err and str(moved / "s.journal.mid.parquet") in err


def test_a_sqlite_storage_spelled_two_ways_reads_its_table(tmp_path, small_threshold, capsys):
    # `run --storage sqlite:///x.db?timeout=30` writes its table as x.db?timeout=30.NAME.parquet;
    # read with sqlite:///x.db the table beside it is another name, but the stored one is the
    # same database's: read, not refused as moved.
    path = _mid(tmp_path)
    config = load_study_config(path)
    db = tmp_path / "x.db"
    label = f"sqlite:///{db}?timeout=30"
    run_study(config, open_storage(label, create=True), label, progress=False)
    out = tmp_path / "t.csv"
    assert main(["trials", "mid", "--csv", str(out), "--storage", f"sqlite:///{db}"]) == 0
    assert len(pd.read_csv(out)) == 1998
