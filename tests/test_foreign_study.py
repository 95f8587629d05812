"""A study another Optuna program made, in a storage planner reads: `planner studies` marks it,
and the commands that read a study's plans say it is not planner's (they printed "no feasible
plan" with exit 0, "none of its 3 finished plans fits", "stores no specs and its file None is
gone")."""

from __future__ import annotations

import optuna
import pytest

from planner.cli import main


@pytest.fixture
def storage(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'foreign.db'}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="foreign", storage=url)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    return url


def test_studies_marks_it(storage, capsys) -> None:
    assert main(["studies", "--storage", storage]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if "foreign" in line]
    assert row.split()[:3] == ["foreign", "(not", "planner's)"]


@pytest.mark.parametrize("argv", [["best"], ["export"], ["report", "--out", "r.html"],
                                  ["show"]])
def test_reading_its_plans_is_one_line(storage, capsys, tmp_path, monkeypatch, argv) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([argv[0], "foreign", *argv[1:], "--storage", storage]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "study 'foreign': not a planner study" in err[0]
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "planner-results").exists()
