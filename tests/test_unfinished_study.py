"""A study stopped before its end says so wherever its best is read (`best`, `export`,
`report`, `pareto`): its best is the best of the plans estimated so far."""

from __future__ import annotations

import optuna
import pytest

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


@pytest.mark.parametrize(("plans", "done", "kept"), [(10, 10, ALL), (10, 0, FRONT_BEST)])
def test_a_whole_study_or_one_keeping_its_front_has_no_note(plans, done, kept) -> None:
    # front+best studies keep their other plans in a results table, not as trials
    assert unfinished_note(_study(plans, done, kept)) is None


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
