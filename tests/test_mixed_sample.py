"""Mixed spaces too large to list: their size bound, the Optuna sampler and `planner mixed`'s
switch between the two."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.catalog import load_catalog
from planner.cli import main
from planner.mixed_config import load_mixed_study
from search_spaces import mixed_sample
from search_spaces.mixed import search_mixed, space_size
from search_spaces.mixed_sample import sample_mixed

MIXED = Path(__file__).resolve().parent.parent / "studies" / "mixed"


@pytest.fixture(scope="module")
def study():
    return load_mixed_study(MIXED / "metis-16-16.yaml", catalog=load_catalog(user=False))


@pytest.fixture(scope="module")
def exhaustive(study):
    return search_mixed(study.space)


def test_space_size_counts_orders_layouts_and_knobs(study, exhaustive):
    # Each group has 11 stage layouts (test_mixed.test_search_covers_the_space lists them):
    # orders 11 + 11 (each alone) + 2 * 11 * 11 (both, either way) = 264; global batch 128 has
    # 8 divisors (micro-batch counts); recompute {none, full}; ZeRO {0, 1}.
    assert space_size(study.space) == 264 * 8 * 2 * 2
    assert len(exhaustive.table) <= space_size(study.space)


def test_sampling_finds_the_exhaustive_best(study, exhaustive):
    # 100 trials of 264 group orders and layouts; multivariate TPE finds the plan the exhaustive
    # search proves best (0.517 s, A100s alone: mixing does not pay on this row).
    sampled = sample_mixed(study.space, trials=100, seed=0)
    assert sampled.trials == 100 and sampled.skeletons < 100
    assert sampled.best()["plan"] == exhaustive.best()["plan"]
    assert sampled.best()["step_time_s"] == exhaustive.best()["step_time_s"]
    # Every sampled plan is a plan of the space with the estimate the exhaustive search gave it.
    merged = sampled.table.merge(exhaustive.table, on="plan", suffixes=("", "_all"))
    assert len(merged) == len(sampled.table)
    assert (merged["step_time_s"] == merged["step_time_s_all"]).all()


def _ctrl_c_after(monkeypatch, estimates: int) -> None:
    """Ctrl-C in the plan estimate after the first ``estimates``."""
    calls = []
    real = mixed_sample.plan_row

    def interrupted(*args):
        if len(calls) == estimates:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(mixed_sample, "plan_row", interrupted)


def test_ctrl_c_keeps_the_plans_estimated_so_far(study, monkeypatch):
    _ctrl_c_after(monkeypatch, 40)
    result = sample_mixed(study.space, trials=500, seed=0)
    assert 0 < len(result.table) <= 40 and result.trials < 500
    assert result.best() is not None


def test_planner_mixed_cut_short_says_so_in_one_line_and_exits_130(monkeypatch, capfd):
    # Ctrl-C in the 41st layout's estimate: the plans of the first 40 are shown as what was
    # sampled, then one line on stderr (no Optuna traceback) and the interrupted exit code.
    _ctrl_c_after(monkeypatch, 40)
    args = ["mixed", str(MIXED / "metis-16-16.yaml"), "--max-plans", "0", "--trials", "500"]
    assert main(args) == 130
    out, err = capfd.readouterr()
    assert "Optuna TPE trials (interrupted)" in out
    assert err.strip().startswith("planner mixed: interrupted after ")
    assert err.strip().endswith("of 500 trials; the best of what was sampled is above")
    assert len(err.strip().splitlines()) == 1


def test_planner_mixed_samples_above_max_plans(capsys):
    args = ["mixed", str(MIXED / "metis-16-16.yaml"), "--max-plans", "1000", "--trials", "200"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sampled_trials"] == 200 and out["space_plans_at_most"] == 8448
    assert out["layouts"] <= 200 and out["plans"] <= 200 * 8 * 2 * 2
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "not proven best" in text and "--max-plans 8448" in text


def test_planner_mixed_lists_the_space_under_max_plans(capsys):
    assert main(["mixed", str(MIXED / "metis-16-16.yaml"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sampled_trials"] is None and out["plans"] > 1000


@pytest.mark.parametrize("flag", [["--max-plans", "-1"], ["--trials", "0"]])
def test_planner_mixed_bad_search_flags_are_one_line(flag, capsys):
    assert main(["mixed", str(MIXED / "metis-16-16.yaml"), *flag]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
