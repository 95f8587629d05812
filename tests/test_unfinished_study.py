"""A study stopped before its end says so wherever its best is read (`best`, `export`,
`report`, `pareto`): its best is the best of the plans estimated so far."""

from __future__ import annotations

import optuna
import pyarrow as pa
import pyarrow.parquet as pq

from planner.cli import main
from planner.results_parquet import ALL, FRONT_BEST, RESULTS
from planner.storage import open_storage
from planner.study_summary import unfinished_note
from tests.study_files import lab_study


def _study(plans: int, done: int, kept: str = ALL) -> optuna.Study:
    study = optuna.create_study()
    study.set_user_attr(RESULTS, {"plans": plans, "trials_kept": kept})
    for _ in range(done):
        study.add_trial(optuna.trial.create_trial(value=1.0))
    return study


def test_a_study_with_fewer_trials_than_plans_is_unfinished() -> None:
    note = unfinished_note(_study(plans=10, done=4))
    assert note is not None and "4 of its 10 plans" in note and "--resume" in note


def test_a_whole_study_has_no_note() -> None:
    assert unfinished_note(_study(plans=10, done=10)) is None


def test_a_one_plan_study_says_plan() -> None:
    note = unfinished_note(_study(plans=1, done=0))
    assert note is not None and "0 of its 1 plan estimated" in note


def _front_best(tmp_path, plans: int, rows: int, pruned: int = 0) -> optuna.Study:
    # A study keeping its front and best as trials holds every plan it estimated as a row of
    # its results table (planner/results_parquet.py), and the plans its bounds ruled out in
    # ``pruned``.
    table = tmp_path / "s.lab.parquet"
    table.mkdir(exist_ok=True)
    pq.write_table(pa.table({"plan": [f"p{i}" for i in range(rows)]}),
                   table / "part-00000.parquet")
    study = _study(plans, done=2, kept=FRONT_BEST)
    study.set_user_attr(RESULTS, {"plans": plans, "trials_kept": FRONT_BEST,
                                  "parquet": str(table), "prune": pruned > 0, "pruned": pruned})
    return study


def test_a_study_keeping_its_front_counts_its_table(tmp_path) -> None:
    note = unfinished_note(_front_best(tmp_path, plans=10, rows=4))
    assert note is not None and "4 of its 10 plans" in note
    assert unfinished_note(_front_best(tmp_path, plans=10, rows=10)) is None
    # 6 estimated and 4 ruled out by bounds: whole
    assert unfinished_note(_front_best(tmp_path, plans=10, rows=6, pruned=4)) is None
    assert "5 of its 10 plans" in unfinished_note(_front_best(tmp_path, plans=10, rows=3,
                                                               pruned=2))


def test_a_study_whose_table_is_gone_has_no_note(tmp_path) -> None:
    study = _front_best(tmp_path, plans=10, rows=4)
    for part in (tmp_path / "s.lab.parquet").iterdir():
        part.unlink()
    (tmp_path / "s.lab.parquet").rmdir()
    assert unfinished_note(study) is None


def test_best_of_an_unfinished_study_warns(tmp_path, monkeypatch, capsys) -> None:
    journal = tmp_path / "studies.journal"
    monkeypatch.setenv("PLANNER_STORAGE", str(journal))
    assert main(["run", str(lab_study(tmp_path)), "--quiet"]) == 0
    study = optuna.load_study(study_name="lab", storage=open_storage(str(journal), create=False))
    trials = len(study.trials)
    # as a run stopped by Ctrl-C leaves it: more plans than finished trials
    study.set_user_attr(RESULTS, {"plans": trials + 5, "trials_kept": ALL})
    capsys.readouterr()
    assert main(["best", "lab", "--top", "1"]) == 0
    err = capsys.readouterr().err
    assert f"study 'lab' is unfinished: {trials} of its {trials + 5} plans" in err


def test_the_report_page_of_an_unfinished_study_says_so(tmp_path, capsys) -> None:
    # The page outlives the terminal: a report of a run stopped early recommended the best of
    # the plans estimated so far, and only stderr said the study was unfinished. The note's
    # command carries the --storage given, as every command the planner suggests does.
    journal = tmp_path / "studies.journal"
    assert main(["run", str(lab_study(tmp_path)), "--quiet", "--storage", str(journal)]) == 0
    study = optuna.load_study(study_name="lab", storage=open_storage(str(journal), create=False))
    trials = len(study.trials)
    study.set_user_attr(RESULTS, {"plans": trials + 5, "trials_kept": ALL})
    page = tmp_path / "r.html"
    capsys.readouterr()
    assert main(["report", "lab", "--storage", str(journal), "--out", str(page)]) == 0
    said = f"--resume --storage {journal}` finishes it"
    assert said in capsys.readouterr().err
    text = page.read_text()
    assert "<strong>Unfinished:</strong>" in text and said in text
    assert f"{trials} of its {trials + 5} plans estimated" in text
    study.set_user_attr(RESULTS, {"plans": trials, "trials_kept": ALL})  # whole: no note
    assert main(["report", "lab", "--storage", str(journal), "--out", str(page)]) == 0
    assert "Unfinished" not in page.read_text()
