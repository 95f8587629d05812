"""``planner sweep``: points are simcore's estimates, a re-optimised point is the best listed plan,
the figure has a line per ``--lines`` value and a panel per ``--panels`` value, and bad input is
one line (exit 2)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

import simcore
from planner.cli import main
from planner.plots.sweep import sweep_figure, sweep_info
from planner.study_config import load_study_config
from planner.sweep import SweepRequest, run_sweep
from simcore.specs import Strategy

STUDIES = Path(__file__).resolve().parent.parent / "studies"
GRID = STUDIES / "distir-mlp-16.yaml"
SCALING = STUDIES / "distir-mlp-scaling.yaml"
LAB = STUDIES / "lab4b-llama70b-system1.yaml"
TOLERANCE = 0.01
"""The closed form below ignores ASTRA-sim's nanosecond truncations and hand-off delays."""


@pytest.fixture(scope="module")
def grid():
    config = load_study_config(GRID)
    return config, run_sweep(config, SweepRequest(x="tp", lines="micro_batches", panels="dp"))


def test_points_are_simcore_estimates_of_their_plans(grid):
    config, sweep = grid
    by_key = {(p.panel, p.line, p.x): p for p in sweep.points}
    # dp4 x tp2 leaves pp 2; 4 micro-batches of 8192 / (4 * 4) = 512 samples each
    for dp, m, tp in [(4, 4, 2), (1, 1, 16), (2, 8, 1)]:
        point = by_key[(dp, m, tp)]
        pp = 16 // (dp * tp)
        s = point.strategy
        assert (s.dp, s.tp, s.pp, s.micro_batch) == (dp, tp, pp, 8192 // (dp * m))
        est = simcore.estimate(config.model, config.system, config.training,
                               Strategy(dp=dp, tp=tp, pp=pp, micro_batch=8192 // (dp * m),
                                        schedule=s.schedule))
        assert point.estimate.step_time == est.step_time
        assert point.throughput == est.tokens_per_s == 8192 / est.step_time


def test_a_re_optimised_point_is_the_best_listed_plan():
    config = load_study_config(GRID)
    sweep = run_sweep(config, SweepRequest(x="tp"))
    assert [p.x for p in sweep.points] == [1, 2, 4, 8, 16]
    for point in sweep.points:
        listed = [s for s in config.space.valid if s.tp == point.x]
        best = max(simcore.estimate(config.model, config.system, config.training, s).tokens_per_s
                   for s in listed)
        assert point.candidates == len(listed)
        assert point.throughput == best


def test_where_fixes_a_knob():
    config = load_study_config(GRID)
    sweep = run_sweep(config, SweepRequest(x="tp", where={"dp": ("2",), "schedule": ("1f1b",)}))
    assert {(p.strategy.dp, p.strategy.schedule.value) for p in sweep.points} == {(2, "1f1b")}


def test_the_figure_has_a_line_per_value_and_a_panel_per_value(grid):
    _, sweep = grid
    info = sweep_info(sweep)
    assert info.panel_values == [1, 2, 4, 8, 16]
    # counts 8192 / (dp * micro_batch) over dp 1..16 and micro-batches 64..8192: 1 to 128
    assert info.line_values == [1, 2, 4, 8, 16, 32, 64, 128]
    assert info.x_log and info.x_values == [1, 2, 4, 8, 16]
    fig = sweep_figure(info)
    legend = [t.name for t in fig.data if t.showlegend]
    assert legend == [f"micro-batches = {m}" for m in info.line_values]
    assert {t.name for t in fig.data} == set(legend)
    titles = [a.text for a in fig.layout.annotations if a.text.startswith("dp = ")]
    assert titles == [f"dp = {dp}" for dp in info.panel_values]  # one title per panel
    columns = {t.xaxis for t in fig.data}
    assert len(columns) == 2 * 5  # throughput and step time, per panel
    assert len(fig.data) == 2 * len(info.series)


def test_pure_dp_on_all_to_all_links_follows_the_closed_form():
    # DistIR's data-parallel scaling: 64 layers of width w = 8192, batch B = 1024, pure dp on N
    # fully connected devices (direct all-reduce, 200 GB/s links, no latency). Per step:
    #   compute   = 3 L (2 b w^2 / F + 2 b w 4 / M), b = B / N (forward + 2x backward)
    #   all-reduce (direct, ASTRA-sim AllToAll) = 2 (S / N) / bw + 3 (S / N) / R, S = L w^2 4
    #   optimizer = 3 L w^2 4 / M (SGD: read weight and gradient, write weight)
    # so step(N) = a / N + c and throughput B / step grows with N towards B / c.
    config = load_study_config(SCALING)
    devices = (2, 4, 8, 16)
    sweep = run_sweep(config, SweepRequest(
        x="devices", devices=devices, global_batches=(1024,),
        where={"tp": ("1",), "pp": ("1",), "micro_batches": ("1",)}))
    d, layers, w, batch = config.system.device, 64, 8192, 1024
    flops = d.peak_flops_per_s * d.matmul_efficiency
    hbm = d.hbm_bandwidth_bytes_per_s * d.memory_efficiency
    reduction = config.system.network.scheduling.local_reduction_bandwidth_bytes_per_s
    weights = layers * w * w * 4
    link = config.system.network.dims[0].bandwidth_bytes_per_s
    expected = []
    for n in devices:
        b = batch / n
        compute = 3 * layers * (2 * b * w * w / flops + 2 * b * w * 4 / hbm)
        all_reduce = 2 * weights / n / link + 3 * weights / n / reduction
        expected.append(batch / (compute + all_reduce + 3 * weights / hbm))
    got = [p.throughput for p in sweep.points]
    assert [p.x for p in sweep.points] == list(devices)
    assert got == pytest.approx(expected, rel=TOLERANCE)
    assert got == sorted(got)


def test_a_device_sweep_re_expands_powers_of_two():
    config = load_study_config(SCALING)
    sweep = run_sweep(config, SweepRequest(x="devices", devices=(32,), where={"dp": ("1",),
                                                                             "pp": ("1",)}))
    assert [p.strategy.tp for p in sweep.points] == [32]  # tp: powers_of_two grew to 32


def test_the_cli_writes_the_figure_and_the_points(tmp_path, capsys):
    out, points = tmp_path / "grid.html", tmp_path / "grid.csv"
    code = main(["sweep", str(GRID), "--x", "hp", "--lines", "micro_batches", "--panels", "dp",
                 "--where", "micro_batches=1,2,4", "--out", str(out), "--csv", str(points)])
    assert code == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and f"wrote {points}" in printed
    assert out.read_text().count("plotly") > 10  # plotly.js inlined: the page works offline
    rows = list(csv.DictReader(points.open()))
    assert {r["micro_batches"] for r in rows} == {"1", "2", "4"}
    assert {"dp", "tp", "throughput_samples_per_s", "step_time_s", "plan"} <= set(rows[0])


@pytest.mark.parametrize(("argv", "message"), [
    (["--x", "tpp"], "--x tpp: unknown knob; did you mean tp"),
    (["--x", "tp", "--lines", "tp"], "--lines tp: already the knob of --x"),
    (["--x", "tp", "--where", "tp=3"], "no valid plan of the study has tp=3; it lists tp 1, 2,"),
    (["--x", "tp", "--where", "tp=two"], "--where tp=two: tp takes whole numbers"),
    (["--x", "tp", "--where", "tp"], "must be KNOB=VALUE"),
    (["--x", "tp", "--where", "dp=16", "--where", "tp=2"], "no valid plan of the study has all"),
    (["--devices", "2,0"], "must be whole numbers >= 1"),
    (["--x", "hp", "--where", "tp=1", "--where", "tp=2"],  # the second replaced the first
     "--where tp: tp is given twice; list its values once (--where tp=A,B)"),
    (["--x", "tp", "--global-batch", "512,1024", "--lines", "dp"],
     "--global-batch gives 2 values; draw them with --x, --lines or --panels global_batch"),
    ([], "--x: missing"),
    # no dp x micro-batch divides 100: "lists no valid plan" said neither why nor what to change
    (["--x", "tp", "--global-batch", "100"],
     "no valid plan to sweep (dp*micro_batch=1024 must divide global_batch=100)"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path):
    code = main(["sweep", str(GRID), *argv, "--out", str(tmp_path / "f.html")])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "f.html").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["--devices", "32,64"], "--devices: system lab-system1 has a 3-dimensional network (4x4x4"),
    (["--x", "tp", "--width", "1024"], "--width: model llama70b is a"),
])
def test_what_a_study_cannot_resize_is_one_line(argv, message, capsys, tmp_path):
    code = main(["sweep", str(LAB), *argv, "--out", str(tmp_path / "f.html")])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1


def test_a_sweep_where_no_plan_fits_is_one_line(capsys, tmp_path):
    # Llama 2 70B's 16-bit weights alone are 140 GB: over 64 devices, at least 2.2 GB a device,
    # so nothing fits in 1 GB (a raw plotly error about subplots before)
    code = main(["sweep", str(LAB), "--x", "tp", "--hbm-gb", "1",
                 "--out", str(tmp_path / "f.html")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "plans swept fits in 1 GB a device (hbm_gb); raise --hbm-gb" in err
    assert not (tmp_path / "f.html").exists()


def test_csv_is_checked_before_anything_is_written(tmp_path, capsys):
    # --csv keep.yaml replaced a study with CSV; --csv equal to --out replaced the figure; a
    # --csv naming a folder failed after the figure was written
    keep = tmp_path / "keep.yaml"
    keep.write_text("name: mine\n")
    figure = tmp_path / "f.html"
    for csv_path, said in ((keep, "exists and is not a .csv file"),
                           (figure, "the same file as --out"),
                           (tmp_path, "is a folder")):
        code = main(["sweep", str(GRID), "--x", "tp", "--out", str(figure),
                     "--csv", str(csv_path)])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and said in err, err
        assert not figure.exists()
    assert keep.read_text() == "name: mine\n"
