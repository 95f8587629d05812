"""A true-or-false training option kept by a study and a plan file, agreed on by the batched
estimate, and refused in one line when its value is not true or false (shared by the tests of
each such option)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main
from planner.plan import make_plan, read_plan, write_plan
from planner.study_config import load_study_config
from simcore import estimate
from simcore.megatron.batched import estimate_many
from simcore.specs import Convention


def assert_a_study_and_a_plan_file_keep_it(tmp_path: Path, capsys, study_text: str,
                                          field: str) -> None:
    """``study_text`` (a study YAML with ``{value}`` for ``training.<field>``) set to false: the
    study reads it, every plan's batched estimate matches ``simcore.estimate``, a plan file
    keeps it; set to a word, ``planner run`` fails with one line naming the file and field."""
    study = tmp_path / "study.yaml"
    study.write_text(study_text.format(value="false"))
    config = load_study_config(study)
    assert getattr(config.training, field) is False
    plans = config.space.valid
    result = estimate_many(config.model, config.system, config.training, plans)
    for i, strategy in enumerate(plans):
        est = estimate(config.model, config.system, config.training, strategy)
        assert float(result.step_time[i]) == pytest.approx(est.step_time, rel=1e-9)
        assert float(result.peak_memory[i]) == pytest.approx(est.memory.total, rel=1e-9)
    plan = make_plan(config.model, config.system, config.training, plans[0],
                     Convention.MEGATRON)
    path = tmp_path / "plan.yaml"
    write_plan(plan, path)
    again = read_plan(path)
    assert again.training == config.training
    assert again.estimate.memory == plan.estimate.memory
    study.write_text(study_text.format(value="sometimes"))
    assert main(["run", str(study), "--storage", str(tmp_path / "b.db")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"training.{field}" in err[0] and str(study) in err[0]


def estimates_with_and_without(capsys, args: list[str], flag: str) -> tuple[dict, dict]:
    """``planner estimate ARGS --json`` as given and with ``flag`` added, each parsed."""
    assert main([*args, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*args, flag, "--json"]) == 0
    return plain, json.loads(capsys.readouterr().out)
