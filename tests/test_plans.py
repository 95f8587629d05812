"""Plan files, `planner export --format plan`, `planner estimate --plan` and `planner pareto`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import optuna
import pytest
import yaml

import simcore
from planner.catalog import load_catalog, model_from_entry, system_from_entry
from planner.catalog_write import model_entry, system_entry
from planner.cli import main
from planner.plan import FORMAT, make_plan, read_plan, write_plan
from planner.plots.pareto import INFEASIBLE, log_ticks, pareto_figure
from planner.storage import open_storage
from simcore.specs import Convention, Recompute, Schedule, Strategy, TrainingSpec, ZeroStage
from tests.study_files import lab_study


@pytest.fixture
def storage(tmp_path, monkeypatch):
    path = tmp_path / "results" / "studies.journal"
    monkeypatch.setenv("PLANNER_STORAGE", str(path))
    return path


def test_catalog_entries_read_back_to_the_same_specs():
    # Writing a spec as a catalog entry and reading it back must give the very same floats:
    # a plan file or an imported system that drifted by one ulp would change its estimate.
    catalog = load_catalog()
    for name, model in catalog.models.items():
        assert model_from_entry(Path("x.yaml"), name, model_entry(model)) == model
    for name, system in catalog.systems.items():
        back = system_from_entry(Path("x.yaml"), name, system_entry(system), {})
        assert back.network == system.network
        assert back.device.peak_flops_per_s == system.device.peak_flops_per_s
        assert back.device.hbm_bandwidth_bytes_per_s == system.device.hbm_bandwidth_bytes_per_s


def test_lab_links_are_written_in_astra_units():
    # design.md, "Catalogs to ship": lab-system1 links are 100 ASTRA-sim GB/s (2^30 B/s), 50 ns.
    dim = system_entry(load_catalog().system("lab-system1"))["network"][0]
    assert dim["bandwidth_astra_gbps"] == 100 and dim["latency_us"] == 0.05


def _megatron_plan():
    c = load_catalog()
    strategy = Strategy(dp=8, tp=8, pp=4, sp=4, zero=ZeroStage.OPTIMIZER,
                        recompute=Recompute.SELECTIVE, schedule=Schedule.INTERLEAVED, v=5)
    return make_plan(c.model("llama3-70b"), c.system("dgx-h100-1024"),
                     TrainingSpec(global_batch=2048, seq_len=8192), strategy, Convention.MEGATRON)


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_plan_file_reads_back_to_the_same_plan(tmp_path, suffix):
    plan = _megatron_plan()
    path = tmp_path / f"plan{suffix}"
    write_plan(plan, path)
    back = read_plan(path)
    assert back.strategy == plan.strategy and back.training == plan.training
    assert back.model == plan.model and back.system == plan.system
    assert back.estimate == plan.estimate
    data = yaml.safe_load(path.read_text())  # JSON is YAML too
    assert data["format"] == FORMAT
    assert data["strategy"]["placement"] == ["tp", "sp", "dp", "pp"]
    # 2048 sequences of 8192 tokens per step: tokens/s = 2048 * 8192 / step time.
    assert data["estimate"]["tokens_per_s"] == pytest.approx(
        2048 * 8192 / data["estimate"]["step_time"])


def test_estimate_plan_gives_the_numbers_the_plan_file_holds(tmp_path, storage, capsys):
    assert main(["run", str(lab_study(tmp_path)), "--quiet"]) == 0
    out = tmp_path / "exports"
    assert main(["export", "lab", "--top", "3", "--format", "plan", "--out", str(out)]) == 0
    folders = sorted(p for p in out.iterdir())
    assert [p.name[:2] for p in folders] == ["1-", "2-", "3-"]
    capsys.readouterr()
    for folder in folders:
        for name in ("plan.yaml", "plan.json"):
            stored = yaml.safe_load((folder / name).read_text())
            assert main(["estimate", "--plan", str(folder / name), "--json"]) == 0
            again = json.loads(capsys.readouterr().out)
            for key in ("step_time", "time", "memory", "mfu", "tokens_per_s", "fits"):
                assert again[key] == stored["estimate"][key], (folder.name, name, key)
    # The exported best plan is the study's best: the fastest of the 56 lab strategies under
    # 80 GB, found here by a plain loop over the space (not through the study).
    best = read_plan(folders[0] / "plan.yaml")
    from planner.study_config import load_study_config
    config = load_study_config(tmp_path / "lab.yaml")
    fits = [simcore.estimate(config.model, config.system, config.training, s)
            for s in config.space.enumerate()]
    fastest = min(e.step_time for e in fits if e.peak_memory <= 80e9)
    assert best.estimate.step_time == fastest
    # an option the plan file sets, given beside --plan, was ignored without a word
    for flags, said in ((["--tp", "4"], "--tp"), (["--global-batch", "3"], "--global-batch"),
                        (["--no-fused-norm"], "--no-fused-norm")):
        assert main(["estimate", "--plan", str(folders[0] / "plan.yaml"), *flags]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{said}: not used with --plan, whose file sets it" in err


def test_export_out_may_name_the_plan_file(tmp_path, storage, capsys):
    """`--out best.yaml` writes the best plan's file there (it used to become a folder named
    best.yaml); a file name with several plans or another format is one line, nothing written."""
    assert main(["run", str(lab_study(tmp_path)), "--quiet"]) == 0
    folder = tmp_path / "folder"
    assert main(["export", "lab", "--format", "plan", "--out", str(folder)]) == 0
    (ranked,) = folder.iterdir()
    for name in ("best.yaml", "best.json"):
        assert main(["export", "lab", "--out", str(tmp_path / name)]) == 0
        assert (tmp_path / name).is_file()
        assert read_plan(tmp_path / name) == read_plan(ranked / ("plan" + Path(name).suffix))
    capsys.readouterr()
    for argv in (["--top", "2"], ["--format", "megatron"]):
        assert main(["export", "lab", *argv, "--out", str(tmp_path / "two.yaml")]) == 2
        err = capsys.readouterr().err
        assert "a file name takes one plan in --format plan" in err and err.count("\n") == 1
    # `--out plan1.txt` made a folder named plan1.txt; a folder named with a dot stays one
    assert main(["export", "lab", "--out", str(tmp_path / "plan1.txt")]) == 2
    err = capsys.readouterr().err
    assert "a plan file is .yaml, .yml or .json" in err and err.count("\n") == 1
    assert not (tmp_path / "plan1.txt").exists()
    assert main(["export", "lab", "--out", str(tmp_path / "exports.v2")]) == 0
    assert (tmp_path / "exports.v2").is_dir()
    assert not (tmp_path / "two.yaml").exists()


def test_export_keeps_what_it_did_not_write(tmp_path, storage, capsys):
    """An export replaced a plan folder whole, deleting a user's files in it, and overwrote
    any file --out named (a study YAML): both are refused, --force does them."""
    assert main(["run", str(lab_study(tmp_path)), "--quiet"]) == 0
    out = tmp_path / "exports"
    assert main(["export", "lab", "--out", str(out)]) == 0
    (folder,) = out.iterdir()
    assert main(["export", "lab", "--out", str(out)]) == 0  # the same files: replaced
    mine = folder / "my-results.csv"
    mine.write_text("mine\n")
    capsys.readouterr()
    assert main(["export", "lab", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{folder}: holds my-results.csv, which this export" in err
    assert mine.read_text() == "mine\n"
    assert main(["export", "lab", "--out", str(out), "--force"]) == 0
    assert not mine.exists() and (folder / "plan.yaml").is_file()
    # a later folder's name taken by a file: refused before the first folder is written
    shutil.rmtree(out)
    out.mkdir()
    assert main(["export", "lab", "--out", str(out), "--top", "2"]) == 0
    first, second = sorted(out.iterdir())
    shutil.rmtree(out)
    out.mkdir()
    (out / second.name).write_text("x")
    capsys.readouterr()
    assert main(["export", "lab", "--out", str(out), "--top", "2"]) == 2
    err = capsys.readouterr().err
    assert f"{out / second.name}: is a file where this plan's folder goes" in err
    assert sorted(p.name for p in out.iterdir()) == [second.name]
    # --out naming an existing file that is not a plan file
    study = tmp_path / "study.yaml"
    study.write_text("name: mine\n")
    assert main(["export", "lab", "--out", str(study)]) == 2
    assert "exists and is not a plan file" in capsys.readouterr().err
    assert study.read_text() == "name: mine\n"
    assert main(["export", "lab", "--out", str(study), "--force"]) == 0
    assert main(["export", "lab", "--out", str(study)]) == 0  # a plan file now: replaced
    assert read_plan(study).study == "lab"


def test_export_bad_input_is_one_line_and_writes_nothing(tmp_path, storage, capsys):
    assert main(["run", str(lab_study(tmp_path)), "--quiet"]) == 0
    capsys.readouterr()
    out = tmp_path / "exports"
    cases = [
        (["export", "nope", "--out", str(out)], "no study named 'nope'"),
        (["export", "lab", "--format", "word", "--out", str(out)], "unknown format"),
        (["export", "lab", "--top", "0", "--out", str(out)], "--top"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["export", "lab", "--out", str(blocker)]) == 2
    assert "not a folder" in capsys.readouterr().err
    assert blocker.read_text() == "x"


def test_estimate_plan_rejects_a_file_that_is_not_a_plan(tmp_path, capsys):
    path = tmp_path / "plan.yaml"
    path.write_text("format: something-else\n")
    assert main(["estimate", "--plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: format:" in err and len(err.strip().splitlines()) == 1
    plan = _megatron_plan()
    write_plan(plan, path)
    data = yaml.safe_load(path.read_text())
    data["strategy"]["tp"] = 7  # 7 divides neither 64 heads nor the 1024 devices
    path.write_text(yaml.safe_dump(data))
    assert main(["estimate", "--plan", str(path)]) == 2
    assert f"{path}: strategy" in capsys.readouterr().err


@pytest.mark.parametrize(("field", "value"), [("tp", 4.9), ("pp", 2.5), ("zero", True),
                                              ("micro_batch", "four"), ("dp", None)])
def test_estimate_plan_refuses_a_count_that_is_not_a_whole_number(tmp_path, capsys, field,
                                                                   value):
    # A hand-edited plan file: 4.9 must not be read as tp 4, nor YAML's true as ZeRO-1.
    path, err = _estimate_edited(tmp_path, capsys, field, value)
    assert f"{path}: strategy.{field}:" in err and len(err.strip().splitlines()) == 1


def _estimate_edited(tmp_path, capsys, field: str, value) -> tuple:
    """A plan file with its strategy's ``field`` set to ``value``, estimated: refused with exit
    2; (the file, what stderr said)."""
    path = tmp_path / "plan.yaml"
    write_plan(_megatron_plan(), path)
    data = yaml.safe_load(path.read_text())
    data["strategy"][field] = value
    path.write_text(yaml.safe_dump(data))
    assert main(["estimate", "--plan", str(path)]) == 2
    return path, capsys.readouterr().err


@pytest.mark.parametrize(("field", "value", "said"), [
    ("zero", 9, "strategy.zero: 9 is not one of 0, 1, 2, 3"),
    ("recompute", "most", "strategy.recompute: 'most' is not one of none, selective, full"),
    ("schedule", "1f2b", "strategy.schedule: '1f2b' is not one of")])
def test_estimate_plan_names_the_values_a_choice_takes(tmp_path, capsys, field, value, said):
    # ZeRO 9 was refused as "9 is not a valid ZeroStage", the enum's own words.
    _, err = _estimate_edited(tmp_path, capsys, field, value)
    assert said in err and len(err.strip().splitlines()) == 1


def test_estimate_optimizer_bytes_is_a_whole_number_from_1(capsys):
    assert main(["estimate", "--model", "llama3-8b", "--system", "dgx-h100-8",
                 "--global-batch", "128", "--optimizer-bytes", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--optimizer-bytes: must be a whole number from 1" in err
    assert "bytes_per_param_optimizer" not in err


def test_pareto_out_naming_a_folder_is_one_line(tmp_path, storage, capsys):
    assert main(["run", str(lab_study(tmp_path)), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["pareto", "lab", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path}: is a folder; give a file path" in err
    assert len(err.strip().splitlines()) == 1


def _dominated(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return b[0] <= a[0] and b[1] <= a[1] and b != a


def test_pareto_page_draws_the_front_of_feasible_trials(tmp_path, storage, capsys):
    assert main(["run", str(lab_study(tmp_path, hbm="40")), "--quiet"]) == 0
    page = tmp_path / "pareto.html"
    assert main(["pareto", "lab", "--out", str(page)]) == 0
    text = page.read_text()
    assert "plotly" in text and "HBM limit 40 GB" in text
    study = optuna.load_study(study_name="lab", storage=open_storage(str(storage), create=False))
    fig = pareto_figure(study)
    traces = {t.name: t for t in fig.data}
    # The front, by brute force over the stored trials: feasible points no other feasible point
    # dominates in (step time, peak memory).
    points = [(t.user_attrs["step_time_s"], t.user_attrs["peak_memory_gb"])
              for t in study.trials if t.user_attrs["feasible"]]
    front = {p for p in points if not any(_dominated(p, q) for q in points)}
    drawn = set(zip(traces["Pareto front"].x, traces["Pareto front"].y))
    assert drawn == front
    infeasible = [t for t in study.trials if not t.user_attrs["feasible"]]
    assert len(traces[INFEASIBLE].x) == len(infeasible) > 0
    assert all(y > 40 for y in traces[INFEASIBLE].y)
    assert "dp=" not in traces["Pareto front"].text[0] and "trial" in traces["Pareto front"].text[0]


def test_pareto_hbm_flag_adds_a_limit_and_keeps_the_studys(tmp_path, storage, capsys):
    assert main(["run", str(lab_study(tmp_path, hbm="40")), "--quiet"]) == 0
    page = tmp_path / "pareto.html"
    assert main(["pareto", "lab", "--out", str(page), "--hbm-gb", "20"]) == 0
    study = optuna.load_study(study_name="lab", storage=open_storage(str(storage), create=False))
    fig = pareto_figure(study, 20)
    lines = {t.name: set(t.y) for t in fig.data if t.mode == "lines" and "limit" in t.name}
    assert sorted(lines.values(), key=min) == [{20}, {40}]
    study_line = next(name for name, ys in lines.items() if ys == {40})
    asked_line = next(name for name, ys in lines.items() if ys == {20})
    assert "study" in study_line and "asked" in asked_line
    assert study_line in page.read_text() and asked_line in page.read_text()
    # The colours still follow the study's 40 GB: feasible points between 20 and 40 stay blue.
    traces = {t.name: t for t in fig.data}
    assert all(y > 40 for y in traces[INFEASIBLE].y)
    assert "study's" in INFEASIBLE
    same = pareto_figure(study, 40)
    assert len([t for t in same.data if t.mode == "lines" and "limit" in t.name]) == 1


def _reads_as(label: str, value: float, unit: str) -> bool:
    number, _, suffix = label.partition(" ")
    return suffix == unit and float(number) == pytest.approx(value)


def test_pareto_axis_labels_are_values_with_units(tmp_path, storage, capsys):
    assert main(["run", str(lab_study(tmp_path, hbm="40")), "--quiet"]) == 0
    study = optuna.load_study(study_name="lab", storage=open_storage(str(storage), create=False))
    fig = pareto_figure(study)
    for axis, unit in ((fig.layout.xaxis, "s"), (fig.layout.yaxis, "GB")):
        assert axis.type == "log" and axis.tickmode == "array"
        assert len(axis.tickvals) == len(axis.ticktext) >= 2
        assert all(_reads_as(t, v, unit) for v, t in zip(axis.tickvals, axis.ticktext))


@pytest.mark.parametrize(("low", "high", "expected"), [
    (0.3, 700.0, [1, 10, 100]),
    (1.5, 30.0, [2, 5, 10, 20]),
    (21.0, 48.0, [30, 40]),
    (1.1, 1.4, [1.1, 1.4]),
])
def test_log_ticks_1_2_5_then_finer_then_the_ends(low, high, expected):
    values, labels = log_ticks(low, high, "GB")
    assert values == pytest.approx(expected)
    assert labels == [f"{v:g} GB" for v in expected]


def test_pareto_errors(tmp_path, storage, capsys):
    assert main(["run", str(lab_study(tmp_path)), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["pareto", "lab", "--out", str(tmp_path / "nowhere" / "p.html")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["pareto", "lab", "--out", str(tmp_path / "p.pdf")]) == 2
    assert f"--out {tmp_path / 'p.pdf'}: unknown figure format 'pdf'" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.pdf"))
    (tmp_path / "a-file").write_text("")
    assert main(["pareto", "lab", "--out", str(tmp_path / "a-file" / "p.html")]) == 2
    assert "a-file is a file, not a folder" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("chromium") is None, reason="PNG needs Debian's chromium for"
                    " kaleido (.ci/run installs it where apt-get works)")
def test_pareto_png(tmp_path, storage, capsys):
    pytest.importorskip("kaleido")
    assert main(["run", str(lab_study(tmp_path)), "--quiet"]) == 0
    png = tmp_path / "pareto.png"
    assert main(["pareto", "lab", "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the PNG signature (RFC 2083)


def _placement_study(tmp_path: Path) -> Path:
    """The lab study with three placements: on this system some plans' figures do not depend
    on the placement, others' do."""
    path = lab_study(tmp_path)
    path.write_text(path.read_text() + "  placement: [[tp,sp,dp,pp], [sp,tp,dp,pp],"
                    " [dp,tp,sp,pp]]\n")
    return path


def test_best_groups_plans_that_differ_only_in_placement(tmp_path, storage, capsys):
    from planner.plan import plan_at
    from planner.tables import KNOBS, PLACEMENTS, best_frame, trials_frame

    assert main(["run", str(_placement_study(tmp_path)), "--quiet"]) == 0
    study = optuna.load_study(study_name="lab", storage=open_storage(str(storage), create=False))
    best = best_frame(study)
    figures = ["step_time_s", "peak_memory_gb", "tokens_per_s", "mfu"]
    figures += [c for c in best.columns if c.startswith(("time_", "memory_"))]
    others = [k for k in KNOBS if k != "placement"]
    assert not best.duplicated(subset=others + figures).any()
    # Every feasible plan is still there, under the row that stands for it.
    feasible = trials_frame(study).query("state == 'COMPLETE' and feasible")
    assert sum(len(p) for p in best[PLACEMENTS]) == feasible["plan"].nunique()
    assert all(row["placement"] == row[PLACEMENTS][0] for _, row in best.iterrows())
    grouped = best[best[PLACEMENTS].map(len) > 1]
    assert len(grouped) > 0
    capsys.readouterr()
    assert main(["best", "lab", "--top", str(len(best))]) == 0
    table = capsys.readouterr().out
    assert "same figures" in table
    n = len(grouped[PLACEMENTS].iloc[0]) - 1
    assert f"+{n} placement" in table
    # export --top K and plan_at give the plans `best` lists, in its order.
    top = 4
    out = tmp_path / "exports"
    assert main(["export", "lab", "--top", str(top), "--out", str(out)]) == 0
    folders = sorted(out.iterdir())
    assert len(folders) == top
    for rank, (folder, (_, row)) in enumerate(zip(folders, best.head(top).iterrows()), 1):
        exported = read_plan(folder / "plan.yaml")
        assert exported.trial == row["number"]
        assert plan_at(study, rank).trial == row["number"]
