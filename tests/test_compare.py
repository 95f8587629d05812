"""`planner compare`: one model on several systems under several HBM limits, end to end."""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import pandas as pd
import pytest

import simcore
from planner.catalog import load_catalog
from planner.cli import main
from planner.compare import COLUMNS, load_comparison
from planner.plots.breakdown import breakdown_figure
from planner.plots.compare import comparison_figure
from planner.study_config import load_study_config
from planner.units import GB
from search_spaces import StrategySpace, powers_of_two, strategy_label
from simcore.specs import Convention, Recompute, TrainingSpec
from tests.study_files import lab_study

SYSTEMS = ["lab-system1", "lab-system2"]
LIMITS = [1, 40, 80, "unlimited"]
"""1 GB leaves no feasible plan; the base study's own limit (80) is one of them."""

COMPARISON = """\
name: {name}
description: a test comparison
study: {study}
systems: {systems}
hbm_gb: {limits}
"""


def write_comparison(folder: Path, study: str, *, name: str = "cmp",
                     systems: object = None, limits: object = None) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(COMPARISON.format(name=name, study=study,
                                      systems=systems if systems is not None else SYSTEMS,
                                      limits=limits if limits is not None else LIMITS))
    return path


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> dict:
    """The comparison run once through the command line; its outputs read back."""
    tmp = tmp_path_factory.mktemp("compare")
    lab_study(tmp, "base", hbm="80")
    path = write_comparison(tmp, "base.yaml")
    storage, out = tmp / "s.journal", tmp / "out"
    argv = ["compare", str(path), "--storage", str(storage), "--out", str(out), "--quiet"]
    assert main(argv) == 0
    table = pd.read_csv(out / "cmp.csv")
    return {"tmp": tmp, "path": path, "argv": argv, "storage": storage, "out": out,
            "table": table, "html": (out / "cmp.html").read_text()}


def _limit(value: object) -> float:
    return math.inf if value == "unlimited" else float(value)  # type: ignore[arg-type]


def direct_best(system_name: str, limit: float) -> tuple[float, set[str]]:
    """The fastest plan that fits, by enumerating the lab space and calling simcore.estimate:
    (step time, the plans that tie on it); (inf, set()) when none fits."""
    catalog = load_catalog()
    model, system = catalog.model("llama70b"), catalog.system(system_name)
    training = TrainingSpec(global_batch=512, seq_len=1024)
    space = StrategySpace(model=model, system=system, training=training,
                          convention=Convention.MEGATRON, tp=powers_of_two(64),
                          sp=powers_of_two(64), recompute=(Recompute.NONE, Recompute.FULL))
    fits = []
    for s in space.enumerate():
        est = simcore.estimate(model, system, training, s, Convention.MEGATRON)
        if est.memory.total / GB <= limit:
            fits.append((est.step_time, strategy_label(s)))
    if not fits:
        return math.inf, set()
    best = min(t for t, _ in fits)
    return best, {p for t, p in fits if math.isclose(t, best, rel_tol=1e-12)}


def test_one_row_per_cell_with_the_columns(ran):
    table = ran["table"]
    assert list(table.columns) == COLUMNS
    assert len(table) == len(SYSTEMS) * len(LIMITS)
    cells = set(zip(table["system"], table["hbm_gb"].astype(str)))
    assert cells == {(s, str(h)) for s in SYSTEMS for h in LIMITS}
    assert set(table["study"]) == {f"cmp--{s}--{'unlimited' if h == 'unlimited' else f'hbm{h}gb'}"
                                   for s in SYSTEMS for h in LIMITS}
    assert (table["devices"] == 64).all() and (table["trials"] == 56).all()


def test_best_per_cell_is_the_fastest_plan_that_fits(ran):
    for _, row in ran["table"].iterrows():
        best, plans = direct_best(row["system"], _limit(row["hbm_gb"]))
        if not plans:
            assert row["plan"] == "no feasible plan" and math.isnan(row["step_time_s"])
            assert row["feasible_plans"] == 0
            continue
        assert row["step_time_s"] == pytest.approx(best, rel=1e-9)
        assert row["plan"] in plans
        assert row["peak_memory_gb"] <= _limit(row["hbm_gb"])


def test_unlimited_cell_keeps_every_plan_and_one_gb_keeps_none(ran):
    table = ran["table"]
    unlimited = table[table["hbm_gb"] == "unlimited"]
    assert (unlimited["feasible_plans"] == unlimited["trials"]).all()
    tiny = table[table["hbm_gb"] == "1"]
    assert (tiny["plan"] == "no feasible plan").all() and tiny["step_time_s"].isna().all()


def test_a_tighter_limit_is_never_faster(ran):
    table = ran["table"]
    for system in SYSTEMS:
        rows = table[table["system"] == system].copy()
        rows["limit"] = rows["hbm_gb"].map(_limit)
        times = rows.sort_values("limit")["step_time_s"].fillna(math.inf).tolist()
        assert all(a >= b for a, b in itertools.pairwise(times)), (system, times)


def test_the_parts_sum_to_the_step_time(ran):
    table = ran["table"]
    feasible = table.dropna(subset=["step_time_s"])
    parts = [c for c in COLUMNS if c.startswith("time_")]
    assert feasible[parts].sum(axis=1).to_numpy() == pytest.approx(
        feasible["step_time_s"].to_numpy(), rel=1e-9)
    cells = table.assign(cell=table["system"] + " / " + table["hbm_gb"].astype(str))
    fig = breakdown_figure(cells, "cell", detail="plan")
    bars = [t for t in fig.data if t.type == "bar"]
    for i, (_, row) in enumerate(cells.iterrows()):
        stacked = sum(0.0 if math.isnan(b.x[i]) else b.x[i] for b in bars)
        if math.isnan(row["step_time_s"]):
            assert all(math.isnan(b.x[i]) for b in bars)
        else:
            assert stacked == pytest.approx(row["step_time_s"], rel=1e-9)


def test_the_page_holds_two_figures_and_plotly_once(ran):
    page = ran["html"]
    assert page.count("Plotly.newPlot") == 2
    assert len(re.findall(r"plotly\.js v\d", page)) == 1
    assert "no feasible" in page and "a test comparison" in page


def test_each_bar_shows_its_winning_plan_and_keeps_the_hover(ran):
    table = ran["table"]
    fig = comparison_figure(table, "t")
    bars = [t for t in fig.data if t.type == "bar"]
    shown = 0
    for bar in bars:
        assert "%{text}" in bar.texttemplate and "%{y" in bar.texttemplate
        for system, text, hover in zip(bar.x, bar.text, bar.hovertext):
            limit = bar.name.removeprefix("HBM ")
            row = table[(table["system"] == system)
                        & (table["hbm_gb"].map(lambda v: f"{v:g} GB" if not isinstance(v, str)
                                               else v) == limit)].iloc[0]
            if pd.notna(row["step_time_s"]):
                assert text.replace("<br>", " ") == row["plan"] and row["plan"] in hover
                shown += 1
            else:
                assert text == ""
    winners = table.loc[table["step_time_s"].notna(), "plan"]
    assert shown == len(winners) > 0


def test_a_second_run_resumes_every_cell(ran, capsys):
    capsys.readouterr()
    assert main(ran["argv"]) == 0
    out = capsys.readouterr().out
    assert out.count(": 0 new trials") == len(SYSTEMS) * len(LIMITS)
    again = pd.read_csv(ran["out"] / "cmp.csv")
    pd.testing.assert_frame_equal(again, ran["table"])


def test_a_changed_base_study_is_refused(ran, capsys):
    tmp = ran["tmp"]
    other = tmp / "other"
    other.mkdir(exist_ok=True)
    study = other / "base.yaml"
    study.write_text((tmp / "base.yaml").read_text().replace("[none, full]", "[none]"))
    path = write_comparison(other, "base.yaml")  # the same name, cmp
    argv = ["compare", str(path), "--storage", str(ran["storage"]), "--out", str(other / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and "name" in err
    assert not (other / "o").exists()


def _expect_usage_error(capsys, tmp: Path, path: Path, *needles: str) -> None:
    storage, out = tmp / "s.journal", tmp / "out"
    assert main(["compare", str(path), "--storage", str(storage), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    assert not storage.exists() and not out.exists()


@pytest.mark.parametrize("kw, field", [
    ({"systems": "[lab-system1, no-such-system]"}, "systems[1]"),
    ({"systems": "[lab-system1, lab-system1]"}, "systems[1]"),
    ({"systems": "[]"}, "systems"),
    ({"limits": "[40, lots]"}, "hbm_gb[1]"),
    ({"limits": "[0]"}, "hbm_gb[0]"),
    ({"limits": "[true]"}, "hbm_gb[0]"),
    ({"limits": "[80, 80]"}, "hbm_gb[1]"),
    # limits that print alike were one cell's: the second failed after the first had run,
    # blaming the base study ("the stored study ... was made from different settings")
    ({"limits": "[80, 80.0000001]"}, "hbm_gb[1]"),
    ({"study": "missing.yaml"}, "study"),
    ({"name": "two words"}, "name"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, kw, field):
    lab_study(tmp_path, "base")
    study = kw.get("study", "base.yaml")
    name = kw.get("name", "cmp")
    path = tmp_path / "c.yaml"
    path.write_text(COMPARISON.format(name=name, study=study,
                                      systems=kw.get("systems", SYSTEMS),
                                      limits=kw.get("limits", LIMITS)))
    _expect_usage_error(capsys, tmp_path, path, str(path), f": {field}:")


def test_limits_that_name_one_cell_are_said_so(tmp_path, capsys):
    lab_study(tmp_path, "base")
    path = tmp_path / "c.yaml"
    path.write_text(COMPARISON.format(name="cmp", study="base.yaml", systems=SYSTEMS,
                                      limits="[80, 80.0000001]"))
    _expect_usage_error(capsys, tmp_path, path, "hbm_gb[1]: 80.0000001 and hbm_gb[0]'s 80.0"
                        " both name the cell of 80 GB; list each limit once")


def test_a_study_that_is_a_folder_is_said_so(tmp_path, capsys):
    # "/tmp/x does not exist" of a folder that does
    (tmp_path / "studies").mkdir()
    path = tmp_path / "c.yaml"
    path.write_text(COMPARISON.format(name="cmp", study="studies", systems=SYSTEMS,
                                      limits=LIMITS))
    _expect_usage_error(capsys, tmp_path, path, f"study: {tmp_path / 'studies'} is a folder;"
                        " give the base study YAML's path")


def test_unknown_field_and_missing_file(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("study: base.yaml\nsystems: [lab-system1]\nhbm_gb: [80]\nlimit: 3\n")
    _expect_usage_error(capsys, tmp_path, path, str(path), "limit", "unknown field")
    _expect_usage_error(capsys, tmp_path, tmp_path / "nope.yaml", "nope.yaml", "no such file")


def test_a_space_without_a_strategy_on_a_system(tmp_path, capsys):
    study = tmp_path / "fixed.yaml"
    study.write_text("model: llama70b\nsystem: lab-system1\ntraining: {global_batch: 512}\n"
                     "space: {dp: [64], tp: [1]}\n")
    path = write_comparison(tmp_path, "fixed.yaml", systems="[lab-system1, dgx-a100-16]",
                            limits="[80]")
    _expect_usage_error(capsys, tmp_path, path, str(path), "systems[1]", "dgx-a100-16",
                        "16 devices", "widen")


def test_system_override_names_its_own_study(tmp_path):
    base = lab_study(tmp_path, "lab")
    config = load_study_config(base, system="lab-system2", hbm_gb=40)
    assert config.name == "lab-lab-system2-hbm40gb" and config.system.name == "lab-system2"
    assert config.space.system.name == "lab-system2" and config.hbm_gb == 40
    same = load_study_config(base, system="lab-system1")
    assert same.name == "lab" and same.fingerprint() == load_study_config(base).fingerprint()


def test_a_sampler_base_runs_its_cells_side_by_side(tmp_path, capsys):
    """A sampler's cells with --jobs 2 run in worker processes; a system given as a YAML path
    is read relative to the comparison file."""
    lab_study(tmp_path, "base", sampler="random", n_trials=8)
    (tmp_path / "systems").mkdir()
    (tmp_path / "systems" / "mine.yaml").write_text(
        "my-system:\n  device: lab-npu-slow\n  network:\n"
        "    - {topology: Ring, npus: 8, bandwidth_gbps: 500, latency_us: 0.05}\n"
        "    - {topology: Ring, npus: 8, bandwidth_gbps: 500, latency_us: 0.05}\n")
    path = write_comparison(tmp_path, "base.yaml", systems="[lab-system1, systems/mine.yaml]",
                            limits="[80]")
    out = tmp_path / "out"
    assert main(["compare", str(path), "--storage", str(tmp_path / "s.journal"), "--out",
                 str(out), "--jobs", "2", "--quiet"]) == 0
    table = pd.read_csv(out / "cmp.csv")
    assert table["system"].tolist() == ["lab-system1", "my-system"]
    assert (table["trials"] == 8).all()
    assert load_comparison(path).cells[1].config.system.devices == 64


def test_breakdown_figure_is_general():
    df = pd.DataFrame({
        "plan": ["a", "a", "b"], "step_time_s": [3.0, 2.0, math.nan],
        "time_compute_s": [2.0, 1.5, math.nan], "time_comm_s": [1.0, 0.5, math.nan],
        "time_tp_s": [0.0, 0.0, math.nan], "time_custom_s": [0.0, 0.0, math.nan],
    })
    fig = breakdown_figure(df, "plan", title="t", orientation="v")
    bars = [t for t in fig.data if t.type == "bar"]
    assert [b.name for b in bars] == ["compute", "comm (exposed, all kinds)"]  # zero parts go
    assert list(bars[0].x) == ["a", "a #2", "b"]  # one bar per row, even for a repeated label
    text = next(t for t in fig.data if t.type == "scatter").text
    assert "no feasible plan" in text[2] and "3 s" in text[0]
    with pytest.raises(ValueError, match="nope"):
        breakdown_figure(df, "nope")


def test_ctrl_c_says_where_the_trials_are_once(tmp_path: Path, capsys, monkeypatch) -> None:
    path = write_comparison(tmp_path, str(lab_study(tmp_path)))

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("planner.commands._compare.run_comparison", stopped)
    assert main(["compare", str(path), "--storage", str(tmp_path / "s.journal")]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("planner compare: interrupted: finished trials")
    assert "again to continue" in err[0]


def test_a_ctrl_c_as_a_cell_finishes_stops_before_the_next(tmp_path: Path, capsys,
                                                         monkeypatch) -> None:
    # A Ctrl-C that came as a cell's last trials were finishing let that cell's run end as
    # finished (RunReport.late_stop), and the comparison ran every other cell and exited 0.
    from planner import compare
    from planner.runner import RunReport

    path = write_comparison(tmp_path, str(lab_study(tmp_path)))
    real = compare.run_study
    ran: list[str] = []

    def late(config, *args, **kwargs) -> RunReport:
        report = real(config, *args, **kwargs)
        ran.append(config.name)
        return RunReport(report.study, report.added, report.requeued, late_stop=True)

    monkeypatch.setattr(compare, "run_study", late)
    assert main(["compare", str(path), "--storage", str(tmp_path / "s.journal"),
                 "--quiet"]) == 130
    assert len(ran) == 1
    assert "planner compare: interrupted: finished trials" in capsys.readouterr().err


def test_a_ctrl_c_in_the_first_cell_leaves_no_journal_of_the_others(tmp_path: Path, capsys,
                                                                     monkeypatch) -> None:
    # In a folder of studies each cell has its own journal: checking the stored cells made
    # every one, so a compare stopped in its first cell left empty journals of the cells it
    # never began (`planner studies` listed none of them; a resume found them empty).
    from planner import compare

    path = write_comparison(tmp_path, str(lab_study(tmp_path)))
    begun: list[str] = []

    def stopped(config, *args, **kwargs):
        begun.append(config.name)
        raise KeyboardInterrupt

    monkeypatch.setattr(compare, "run_study", stopped)
    folder = tmp_path / "studies"
    assert main(["compare", str(path), "--storage", f"{folder}/", "--quiet"]) == 130
    capsys.readouterr()
    assert len(begun) == 1
    assert sorted(p.name for p in folder.iterdir()) == [f"{begun[0]}.journal"]
