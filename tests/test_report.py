"""`planner report`: one page with the inputs, best plans, Pareto front, breakdown, timeline,
opened in a real headless browser to check that the plots rendered."""

from __future__ import annotations

import pytest

from planner.cli import main
from tests.browser import chromium, plots, rendered_dom
from tests.study_files import lab_study


@pytest.fixture
def storage(tmp_path, monkeypatch):
    path = tmp_path / "results" / "studies.journal"
    monkeypatch.setenv("PLANNER_STORAGE", str(path))
    return path


@pytest.fixture
def report(tmp_path, storage, capsys):
    assert main(["run", str(lab_study(tmp_path, hbm="40")), "--quiet"]) == 0
    page = tmp_path / "report.html"
    assert main(["report", "lab", "--out", str(page), "--top", "5"]) == 0
    assert str(page) in capsys.readouterr().out
    return page


def test_report_holds_inputs_best_plans_and_three_figures(report, storage):
    text = report.read_text()
    # The export commands carry the storage the study is in ($PLANNER_STORAGE here). The best
    # plan (dp 2 x tp 32, ZeRO 0, 40.0 of 40 GB) is not offered for Megatron-LM: its optimizer
    # step copies the 16-bit gradients to fp32 (4 bytes a parameter, 2.45 B a device: 49.0 GB at
    # the step); nor for DeepSpeed, whose optimizer keeps that fp32 copy beside its states
    # (40.0 + 4 x 2.45 = 49.8 GB); nor for torchtitan, which reduces the gradients in fp32
    # only (40.0 + 2 x 2.45 = 44.9 GB); the page says so, and offers the plan file.
    assert f"planner export lab --format plan --storage {storage}" in text
    assert "; torchtitan (under torchtitan" in text and "needs 44.9 GB a device" in text
    assert "planner export lab --format torchtitan" not in text
    assert "planner export lab --format megatron" not in text
    assert "planner export lab --format deepspeed" not in text
    assert "Not for megatron" in text and "needs 49.0 GB a device" in text
    assert "needs 49.8 GB a device" in text
    for part in ("llama70b", "lab-system1", "HBM limit", "40 GB", "Best plans", "Pareto front",
                 "timeline", "Search space", "Recommendation", "The runner-up"):
        assert part in text, part
    # plotly.js inlined once (the page opens offline), three figures use it.
    assert text.count("plotly.js v") <= 2 and len(plots(text)) == 3


@pytest.mark.skipif(chromium() is None, reason="Debian's chromium is not installed (.ci/run"
                    " installs it where apt-get works)")
def test_report_plots_render_in_headless_chromium(report):
    dom = rendered_dom(report)
    assert dom, "chromium printed no DOM"
    figures = plots(dom)
    assert len(figures) == 3
    for figure in figures:
        # plotly draws each figure into <svg class="main-svg"> once its script ran.
        assert 'class="main-svg"' in figure
    # The Pareto figure draws a marker per trial: the 56 lab strategies (design.md).
    assert figures[0].count('class="point"') >= 56


def test_report_of_an_unknown_study_is_one_line(report, tmp_path, capsys):
    assert main(["report", "nope", "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert "no study named 'nope'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r.html").exists()


def test_report_out_does_not_replace_a_file_of_another_kind(report, tmp_path, capsys):
    # `report --out runs.csv` replaced a team's runs CSV with HTML without a word; a device
    # (here a pipe) would have been replaced too. A page it wrote before is replaced.
    import os

    runs = tmp_path / "runs.csv"
    runs.write_text("name,model\n")
    pipe = tmp_path / "pipe.html"
    os.mkfifo(pipe)
    # a symbolic link: the rename replaced the link, leaving its page as it was (refused, as
    # the catalog's writes refuse one)
    page = tmp_path / "page.html"
    page.write_text("kept")
    link = tmp_path / "link.html"
    link.symlink_to(page)
    capsys.readouterr()
    for out, said in ((runs, "exists and is not a .html file"),
                      (pipe, "is not a regular file"), (link, "is a symbolic link")):
        assert main(["report", "lab", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1
    assert runs.read_text() == "name,model\n"
    assert link.is_symlink() and page.read_text() == "kept"
    # a new file named for another kind: the page was written as r.png
    assert main(["report", "lab", "--out", str(tmp_path / "r.png")]) == 2
    err = capsys.readouterr().err
    assert "a report is an HTML page; give a .html path" in err and err.count("\n") == 1
    assert not (tmp_path / "r.png").exists()
    assert main(["report", "lab", "--out", str(report)]) == 0  # its own page again
    bare = tmp_path / "page"  # no suffix: the command's own HTML, written twice
    assert main(["report", "lab", "--out", str(bare)]) == 0
    assert main(["report", "lab", "--out", str(bare)]) == 0


def test_the_page_offers_chakra_traces_only_where_they_would_be_written() -> None:
    # The page listed `planner export NAME --format chakra` for MoE studies and for plans of
    # more trace nodes than the export writes, whose export then refused them; now they are
    # among its refusals with the export's reason, found without writing a trace.
    from planner.catalog import load_catalog
    from planner.exports._chakra import MAX_NODES
    from planner.plan import make_plan
    from planner.report import _refusals
    from simcore.megatron.step_graph import step_graph_nodes
    from simcore.specs import Convention, Strategy, TrainingSpec

    catalog = load_catalog(user=False)
    h100 = catalog.system("dgx-h100-8")
    moe = make_plan(catalog.model("mixtral-8x7b"), h100, TrainingSpec(global_batch=8,
                                                                     seq_len=4096),
                    Strategy(dp=8, ep=8), Convention.MEGATRON)
    assert "does not write MoE layers" in _refusals(moe, ("chakra", "plan"))["chakra"]
    dense = TrainingSpec(global_batch=8, seq_len=2048)
    small = make_plan(catalog.model("gpt-1.7b"), h100, dense, Strategy(dp=8),
                      Convention.MEGATRON)
    assert _refusals(small, ("chakra", "plan")) == {}
    # the count the refusal uses is the traces' own: every NPU's graph of the step
    from simcore.megatron.step_graph import step_graphs
    graphs = step_graphs(small.model, h100, dense, small.strategy)
    assert step_graph_nodes(small.model, h100, dense, small.strategy) == sum(
        len(g.nodes) for g in graphs.graphs)
    big = make_plan(catalog.model("llama3-405b"), catalog.system("dgx-h100-2304"),
                    TrainingSpec(global_batch=2048, seq_len=8192),
                    Strategy(dp=16, tp=8, pp=18, micro_batch=1), Convention.MEGATRON)
    assert step_graph_nodes(big.model, big.system, big.training, big.strategy) > MAX_NODES
    assert "trace nodes over 2304 NPUs" in _refusals(big, ("chakra",))["chakra"]


def test_a_study_where_no_plan_fits_says_so(tmp_path, capsys) -> None:
    # it said "run it (or raise its HBM limit)" of a study that had run
    journal = str(tmp_path / "s.journal")
    assert main(["run", str(lab_study(tmp_path, "tight", hbm="1")), "--quiet",
                 "--storage", journal]) == 0
    capsys.readouterr()
    assert main(["report", "tight", "--storage", journal, "--out",
                 str(tmp_path / "r.html")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "none of its 56 finished plans fits its HBM limit; raise the limit" in line


def test_the_inputs_say_the_plans_of_the_space_and_those_pruned() -> None:
    # a pruned study's page said "trials 49,783 finished 49,783" and nothing of its space of
    # 92,496 plans or of the 42,713 its bounds ruled out
    import optuna
    import pandas as pd

    from planner.report import _counts
    from planner.results_parquet import RESULTS

    study = optuna.create_study()
    study.set_user_attr(RESULTS, {"plans": 92_496, "prune": True, "pruned": 42_713})
    frame = pd.DataFrame({"state": ["COMPLETE"] * 3, "feasible": [True, True, False]})
    assert _counts(frame, study) == {"plans in the space": 92_496, "trials": 3, "finished": 3,
                                     "feasible": 2, "infeasible": 1,
                                     "ruled out by bounds (--prune)": 42_713}
    assert "plans in the space" not in _counts(frame)
