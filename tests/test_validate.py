"""`planner validate`: measured runs in, per-run error, MAPE and the plan-choice regret out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from planner.catalog import load_catalog
from planner.cli import main
from planner.runs_csv import MeasuredRun, read_runs
from planner.validation import RunResult, Validation, kendall_tau, nodes_spanned, validate
from simcore.specs import Recompute, Strategy, TrainingSpec

HEADER = "name,model,system,global_batch,seq_len,dp,tp,pp,micro_batch"


def _run(name: str, measured: float, group: str = "m",
         recompute: Recompute = Recompute.NONE) -> MeasuredRun:
    catalog = load_catalog()
    return MeasuredRun(line=2, name=name, model_ref=group, system_ref="s",
                       model=catalog.model("gpt-1.7b"), system=catalog.system("dgx-a100-8"),
                       training=TrainingSpec(global_batch=8, seq_len=2048),
                       strategy=Strategy(dp=8, recompute=recompute), step_time_s=measured,
                       peak_memory_gb=None)


def _result(name: str, predicted: float, measured: float, group: str = "m",
            recompute: Recompute = Recompute.NONE) -> RunResult:
    return RunResult(_run(name, measured, group, recompute), predicted, 10.0, True)


def test_regret_and_errors_by_hand() -> None:
    # Measured 1.0, 1.2, 1.5 s; predicted 1.1, 0.9, 2.0 s. The estimate ranks b first (0.9 s),
    # measured 1.2 s against the fastest 1.0 s: regret 1.2 / 1.0 - 1 = 0.2.
    # Three plans of one question (each its own recompute).
    v = Validation((_result("a", 1.1, 1.0, recompute=Recompute.NONE),
                    _result("b", 0.9, 1.2, recompute=Recompute.SELECTIVE),
                    _result("c", 2.0, 1.5, recompute=Recompute.FULL)), ())
    (group,) = v.groups
    assert group.picked.run.name == "b" and group.fastest.run.name == "a"
    assert group.regret == pytest.approx(0.2)
    # Pairs (a,b) discordant, (a,c) and (b,c) concordant: tau = (2 - 1) / 3.
    assert group.kendall_tau == pytest.approx(1 / 3)
    # Errors +10%, -25%, +33.3%: MAPE (0.1 + 0.25 + 1/3) / 3, median 0.25.
    s = v.summary()
    assert s["step_time_mape"] == pytest.approx((0.1 + 0.25 + 1 / 3) / 3)
    assert s["step_time_median_ape"] == pytest.approx(0.25)
    assert s["regret_mean"] == pytest.approx(0.2) and s["picked_fastest"] == 0


def test_a_group_needs_two_timed_runs_of_one_question() -> None:
    v = Validation((_result("a", 1.0, 1.0, "x"), _result("b", 1.0, 1.0, "y")), ())
    assert v.groups == () and v.summary()["regret_mean"] is None


def test_one_plan_measured_twice_is_no_choice() -> None:
    """Two releases of a stack timing one plan (b200-fit.csv's Llama 3 8B rows) give no
    regret; a third, other plan makes the group."""
    same = (_result("25.09", 1.0, 4.37, recompute=Recompute.NONE),
            _result("25.11", 1.0, 4.28, recompute=Recompute.NONE))
    assert Validation(same, ()).groups == ()
    other = _result("full", 1.2, 5.0, recompute=Recompute.FULL)
    (group,) = Validation((*same, other), ()).groups
    assert len(group.runs) == 3 and group.regret == pytest.approx(4.37 / 4.28 - 1)


def test_kendall_tau_extremes() -> None:
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == 1.0
    assert kendall_tau([1, 2, 3], [30, 20, 10]) == -1.0
    assert kendall_tau([1], [5]) == 1.0
    # ties count as neither: of the 6 pairs of (1, 2, 2, 3) against (1, 3, 2, 4) five agree and
    # one (2 against 2) is tied: 5 / 6
    assert kendall_tau([1, 2, 2, 3], [1, 3, 2, 4]) == 5 / 6
    # one discordant pair of the 3: (1 + 1 - 1) / 3
    assert kendall_tau([1, 2, 3], [1, 3, 2]) == 1 / 3
    # two infinities tie, as the pairwise loop had them (the pairs (1, inf) agree: 2 of 3)
    assert kendall_tau([1, float("inf"), float("inf")], [1, 2, 3]) == 2 / 3


def _write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "runs.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_rows_read_into_specs_with_the_optional_columns(tmp_path: Path) -> None:
    path = _write(tmp_path, HEADER + ",zero,recompute,sequence_parallel,v,placement,"
                  "flash_attention,grad_bytes,step_time_s,peak_memory_gb",
                  "r1,gpt-1.7b,dgx-a100-8,16,2048,2,2,2,1,fsdp,full,false,2,dp-tp-pp-sp,true,4,"
                  "1.5,40")
    (run,), skipped = read_runs(path, load_catalog())
    assert skipped == []
    s = run.strategy
    assert (s.dp, s.tp, s.pp, s.micro_batch, s.v) == (2, 2, 2, 1, 2)
    assert s.zero == 3 and s.recompute.value == "full" and not s.sequence_parallel
    assert s.schedule.value == "interleaved"  # v > 1 without a schedule column
    assert [a.value for a in s.placement] == ["dp", "tp", "pp", "sp"]
    assert run.training.flash_attention is True and run.training.bytes_per_param_grads == 4
    assert (run.step_time_s, run.peak_memory_gb) == (1.5, 40.0)


def test_fp8_uneven_stages_and_hsdp_columns(tmp_path: Path) -> None:
    # Issue 18: runs in FP8, with uneven pipeline stages or HSDP can be validated
    path = _write(tmp_path, HEADER + ",zero,precision,first_stage_layers,last_stage_layers,"
                  "shard_group,schedule,step_time_s",
                  "r1,llama3-70b,dgx-h100-1024,1024,8192,32,8,4,1,3,fp8,19,19,16,zb-h1,9",
                  "r2,llama3-70b,dgx-h100-1024,1024,8192,32,8,4,1,1,,,,,,9")
    (hsdp, plain), skipped = read_runs(path, load_catalog())
    assert skipped == []
    s = hsdp.strategy
    assert (s.precision.value, s.first_stage_layers, s.last_stage_layers, s.shard_group,
            s.schedule.value) == ("fp8", 19, 19, 16, "zb-h1")
    p = plain.strategy
    assert (p.precision.value, p.first_stage_layers, p.shard_group) == ("bf16", None, None)


def test_an_allocated_peak_leaves_out_the_devices_allowance(tmp_path: Path) -> None:
    # memory_measured allocated (PyTorch's max_memory_allocated) is compared with the estimate
    # less the device's memory_overhead_gb (CUDA context, NCCL, allocator slack), which only
    # the device's whole use (nvidia-smi, the default) shows, but for its workspace_gb (the
    # GEMM libraries' workspaces, which the allocator counts)
    path = _write(tmp_path, HEADER + ",peak_memory_gb,memory_measured",
                  "dev,gpt-1.7b,dgx-a100-8,64,2048,8,1,1,1,20,",
                  "alloc,gpt-1.7b,dgx-a100-8,64,2048,8,1,1,1,20,allocated",
                  "bad,gpt-1.7b,dgx-a100-8,64,2048,8,1,1,1,20,reserved")
    catalog = load_catalog()
    runs, (bad,) = read_runs(path, catalog)
    assert [r.memory_allocated for r in runs] == [False, True]
    assert "memory_measured='reserved' is not one of device, allocated" in bad.reason
    device, allocated = validate(runs).results
    a100 = catalog.device("a100-80gb")
    overhead, workspace = a100.memory_overhead_bytes / 1e9, a100.workspace_bytes / 1e9
    assert (overhead, workspace) == (9, 0.1)  # gpus.yaml
    assert device.predicted_peak_memory_gb - allocated.predicted_peak_memory_gb == \
        pytest.approx(overhead - workspace, rel=1e-12)


def test_a_run_estimated_over_the_memory_it_ran_in_is_counted(tmp_path: Path, capsys) -> None:
    # Every measured run ran, so its plan fits the part it ran on: an estimate over that
    # part's memory is a plan a study would not offer. Llama 3 8B, FSDP over 8 GPUs, a local
    # batch of 16 sequences of 8,192 tokens without recompute: far over 80 GB, and under
    # hbm_gb 1000 (a part of that much memory) it fits.
    row = "r,llama3-8b,dgx-h100-8,128,8192,8,1,1,16,3,none,10,{}"
    path = _write(tmp_path, HEADER + ",zero,recompute,step_time_s,hbm_gb",
                  row.format(""), row.format(1000))
    runs, skipped = read_runs(path, load_catalog())
    assert skipped == [] and runs[1].system.device.hbm_bytes == 1000e9
    result = validate(runs)
    assert [r.fits for r in result.results] == [False, True]
    assert result.summary()["over_memory_runs"] == 1
    assert main(["validate", str(path)]) == 0
    assert "fit: 1 of 2 runs estimated over their device's memory" in capsys.readouterr().out


def test_a_shard_group_with_zero_2_is_a_skipped_row(tmp_path: Path) -> None:
    path = _write(tmp_path, HEADER + ",zero,shard_group,step_time_s",
                  "r1,llama3-70b,dgx-h100-1024,1024,8192,128,8,1,1,2,16,9")
    runs, (skip,) = read_runs(path, load_catalog())
    assert runs == [] and "needs zero=1" in skip.reason


def test_model_yaml_path_relative_to_the_csv(tmp_path: Path) -> None:
    (tmp_path / "tiny.yaml").write_text(
        "tiny: {family: gpt, layers: 4, hidden: 256, ffn_hidden: 1024, heads: 4, vocab: 1000,"
        " seq_len: 128}\n")
    path = _write(tmp_path, HEADER + ",step_time_s", "t,tiny.yaml,dgx-a100-8,8,128,8,1,1,1,0.1")
    (run,), _ = read_runs(path, load_catalog())
    assert run.model.name == "tiny" and run.model.layers == 4


def test_rows_it_cannot_express_are_reported_not_fatal(tmp_path: Path, capsys) -> None:
    path = _write(
        tmp_path, HEADER + ",step_time_s",
        "ok,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0",
        "typo,gpt-1.7c,dgx-a100-8,16,2048,8,1,1,1,1.0",
        "devices,gpt-1.7b,dgx-a100-8,16,2048,4,1,1,1,1.0",  # 4 GPUs on an 8-GPU system
        "layers,gpt-3.6b,dgx-a100-8,16,2048,1,1,8,1,1.0",  # 30 layers on 8 stages
        "empty,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,",
        "text,gpt-1.7b,dgx-a100-8,16,2048,eight,1,1,1,1.0",
    )
    # A typo, an empty measurement and text in a count are values to fix: the figures leave
    # them out and the command exits 1; plans the planner cannot express are only left out.
    assert main(["validate", str(path), "--json"]) == 1
    out = capsys.readouterr()
    data = json.loads(out.out)
    reasons = {s["name"]: s["reason"] for s in data["skipped"]}
    bad = {s["name"] for s in data["skipped"] if s["bad_value"]}
    assert [r["name"] for r in data["rows"]] == ["ok"]
    assert "unknown model 'gpt-1.7c'" in reasons["typo"]
    assert "device count" in reasons["devices"]
    assert "must divide layers=30" in reasons["layers"]
    assert "no measured" in reasons["empty"]
    assert "dp='eight' must be a whole number" in reasons["text"]
    assert bad == {"typo", "empty", "text"}
    assert out.err.strip() == ("planner validate: 3 rows with a value to fix (listed in"
                               " skipped); the figures leave them out")


def test_a_row_shifted_by_an_unquoted_comma_is_a_value_to_fix(tmp_path: Path) -> None:
    # A comma inside an unquoted cell splits it in two: every cell after it moves one column
    # right and the last spills past the header. Read by position, such a row would be priced
    # on the wrong values (or lose its last cell unseen), so it is left out as a typo; empty
    # trailing cells (a spreadsheet's) are not a shift.
    path = _write(tmp_path, HEADER + ",step_time_s,source",
                  "ok,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0,paper",
                  "trailing,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0,paper,,",
                  "shifted,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0,a table, read again")
    runs, skipped = read_runs(path, load_catalog())
    assert [r.name for r in runs] == ["ok", "trailing"]
    (row,) = skipped
    assert row.name == "shifted" and row.bad_value
    assert "1 more filled cell(s) than the header's 11 columns" in row.reason
    assert "quote that cell" in row.reason


def test_plans_of_different_releases_are_not_compared(tmp_path: Path, capsys) -> None:
    # Two releases of one stack measured the same question with two plans each: each release
    # is its own group (a release alone moves a step time by several percent, so ranking one
    # release's plan against another's says little about the plans); no release column keeps
    # every run in one group.
    rows = ("{0},gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0,{1}",
            "{0},gpt-1.7b,dgx-a100-8,16,2048,4,2,1,1,1.1,{1}")
    path = _write(tmp_path, HEADER + ",step_time_s,release",
                  rows[0].format("a", "24.09"), rows[1].format("b", "24.09"),
                  rows[0].format("c", "25.04"), rows[1].format("d", "25.04"))
    assert main(["validate", str(path), "--json"]) == 0
    groups = json.loads(capsys.readouterr().out)["groups"]
    assert [g["key"]["release"] for g in groups] == ["24.09", "25.04"]
    assert [g["runs"] for g in groups] == [2, 2]
    assert main(["validate", str(path)]) == 0
    assert "batch 16, seq 2048, release 25.04: 2 runs" in capsys.readouterr().out
    plain = _write(tmp_path, HEADER + ",step_time_s",
                   *(r.format(n, "")[:-1] for n, r in zip("ab", rows)))
    runs, _ = read_runs(plain, load_catalog())
    assert {r.release for r in runs} == {""}
    (group,) = validate(runs).groups
    assert "release" not in group.to_dict()["key"]


def test_left_out_rows_name_their_file(tmp_path: Path, capsys) -> None:
    one = _write(tmp_path, HEADER + ",step_time_s", "a,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0",
                 "b,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,-1")
    two = tmp_path / "two.csv"
    two.write_text(HEADER + ",step_time_s\n" + "c,gpt-3.6b,dgx-a100-8,16,2048,1,1,8,1,1.0\n")
    assert main(["validate", str(one), str(two)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "left out: 1 row with a value to fix" in out
    assert (f"  {one}:3 (b): step_time_s='-1' must be a number of seconds from 1e-06 to 1e+12"
            in out)
    assert "left out: 1 row the planner cannot express" in out
    assert any(line.startswith(f"  {two}:2 (c): ") for line in out)
    assert "step time: 1 run, MAPE" in "\n".join(out)


def test_one_row_left_out_and_one_run_are_singular(tmp_path: Path, capsys) -> None:
    path = _write(
        tmp_path, HEADER + ",step_time_s",
        "ok,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0",
        "devices,gpt-1.7b,dgx-a100-8,16,2048,4,1,1,1,1.0",  # 4 GPUs on an 8-GPU system
    )
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "left out: 1 row the planner cannot express" in out
    assert "step time: 1 run, MAPE" in out and "peak memory: 0 runs," in out


@pytest.mark.parametrize(("header", "message"), [
    ("model,system,global_batch,seq_len,dp,tp,pp,step_time_s", "no column 'micro_batch'"),
    (HEADER, "no measured column"),
    (HEADER + ",step_time_s,colour", "unknown column 'colour'"),
    (HEADER + ",step_time_s,step_time_s", "appears twice"),
])
def test_bad_header_is_one_line_exit_2(tmp_path: Path, capsys, header: str, message: str) -> None:
    path = _write(tmp_path, header)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_missing_file_is_exit_2(tmp_path: Path, capsys) -> None:
    assert main(["validate", str(tmp_path / "none.csv")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_calibrate_refuses_a_value_to_fix(tmp_path: Path, capsys) -> None:
    # A typo would leave its run out of the fit without a word: calibrate stops on it.
    path = _write(tmp_path, HEADER + ",step_time_s", "a,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0",
                  "b,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0s")
    assert main(["calibrate", str(path), "--device", "a100-80gb", "--name", "mine", "--out",
                 str(tmp_path / "mine.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fix the value" in err
    assert f"{path}:3 (b): step_time_s='1.0s' must be a number" in err
    assert not (tmp_path / "mine.yaml").exists()


def test_calibrate_refuses_an_unwritable_out_before_fitting(tmp_path: Path, capsys) -> None:
    # --out is checked before the runs are read and fitted (a fit takes seconds to minutes):
    # these runs are on no a100-80gb, an error that would come later, so the --out one is first.
    path = _write(tmp_path, HEADER + ",step_time_s", "a,gpt-1.7b,dgx-h100-8,16,2048,8,1,1,1,1.0")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for out, said in ((tmp_path, "is a folder; give --out a file name"),
                      (a_file / "mine.yaml", "is a file, not a folder; give --out a path")):
        assert main(["calibrate", str(path), "--device", "a100-80gb", "--name", "mine",
                     "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1


def test_calibrate_cut_short_writes_nothing_and_says_so_once(tmp_path: Path, monkeypatch,
                                                             capfd) -> None:
    # Ctrl-C in the third trial of the fit: exit 130, one line (Optuna's warning of the
    # stopped trial, with its traceback, is not printed), no device file.
    from planner import calibration

    path = _write(tmp_path, HEADER + ",step_time_s", "a,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0",
                  "b,gpt-1.7b,dgx-a100-8,32,2048,8,1,1,1,2.0")
    calls = []
    real = calibration._loss

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(calibration, "_loss", interrupted)
    out = tmp_path / "mine.yaml"
    assert main(["calibrate", str(path), "--device", "a100-80gb", "--name", "mine", "--out",
                 str(out)]) == 130
    err = capfd.readouterr().err.strip()
    assert err == f"planner calibrate: interrupted while fitting; nothing written to {out}"
    assert not out.exists()


def test_a_file_with_no_runs_a_semicolon_file_and_a_file_given_twice_are_one_line(
        tmp_path: Path, capsys) -> None:
    header_only = _write(tmp_path, HEADER + ",step_time_s", "", " , , ")
    assert main(["validate", str(header_only)]) == 2
    assert "no runs under the header; add one row per measured run" in capsys.readouterr().err
    semi = tmp_path / "semi.csv"
    semi.write_text((HEADER + ",step_time_s").replace(",", ";")
                    + "\na;gpt-1.7b;dgx-a100-8;16;2048;8;1;1;1;1.0\n")
    assert main(["validate", str(semi)]) == 2
    err = capsys.readouterr().err
    assert "the header is separated by semicolons; separate the columns with commas" in err
    runs = _write(tmp_path, HEADER + ",step_time_s", "a,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0")
    assert main(["validate", str(runs), str(tmp_path / "." / "runs.csv")]) == 2
    err = capsys.readouterr().err
    assert "given twice; give each file once" in err and err.count("\n") == 1


def test_a_rows_bad_cells_name_the_file_once_and_the_limit(tmp_path: Path, capsys) -> None:
    path = _write(tmp_path, HEADER + ",step_time_s",
                  "r1,unkmodel,dgx-a100-8,16,2048,8,1,1,1,1.0",
                  "r2,gpt-1.7b,dgx-a100-8,999999999999,2048,8,1,1,1,1.0",
                  "r3,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0")
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}:2 (r1): model: unknown model 'unkmodel'" in out and out.count(str(path)) == 2
    assert "global_batch='999999999999' must be a whole number from 1 to 1,000,000,000" in out


def test_by_nodes_counts_the_nodes_each_plan_spans(tmp_path: Path, capsys) -> None:
    # A DGX A100 node holds 8 GPUs (its first network dimension), a Jean Zay V100 node 4: 8 GPUs
    # on one DGX are 1 node, 16 on two DGX 2, 8 V100s 8 / 4 = 2 and 12 V100s 3 (hand counts).
    path = _write(tmp_path, HEADER + ",step_time_s",
                  "a,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0",
                  "b,gpt-1.7b,dgx-a100-16,16,2048,16,1,1,1,1.0",
                  "c,gpt-1.7b,jean-zay-v100-32gb-8,16,2048,8,1,1,1,1.0",
                  "d,gpt-1.7b,jean-zay-v100-32gb-12,24,2048,12,1,1,1,1.0")
    runs, skipped = read_runs(path, load_catalog())
    assert skipped == []
    assert [nodes_spanned(r) for r in runs] == [1, 2, 2, 3]
    assert main(["validate", str(path), "--by", "nodes", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["by"]["rows"]
    assert [(r["nodes"], r["step_time_runs"]) for r in rows] == [("1", 1), ("2", 2), ("3", 1)]


def test_measured_figures_out_of_any_unit_are_values_to_fix(tmp_path: Path, capsys) -> None:
    # A step of 5e-324 s made every error infinite and `--json` print Infinity, which no strict
    # JSON parser reads; a peak of 500 GB on an 85.9 GB part is another unit or another part.
    for cells, said in (
            ("1,5e-324,", "step_time_s='5e-324' must be a number of seconds from 1e-06 to 1e+12"),
            ("1,1e15,", "step_time_s='1e15' must be a number of seconds from 1e-06 to 1e+12"),
            ("1,\"4,5\",", "step_time_s='4,5' must be a number; use a dot as the decimal mark"),
            ("1,\"32,768\",", "write it without the thousands separator (32768)"),
            ("1,,1e-9", "peak_memory_gb='1e-9' must be a number of GB from 0.001 to 1e+12"),
            ("1,,500", "peak_memory_gb=500 is above the 85.9 GB its part (a100-80gb) has")):
        path = _write(tmp_path, HEADER + ",step_time_s,peak_memory_gb",
                      "a,gpt-1.7b,dgx-a100-8,16,2048,8,1,1," + cells)
        assert main(["validate", str(path), "--json"]) == 1
        out = capsys.readouterr().out
        assert said in out, out
        assert "Infinity" not in out


def test_calibrate_refuses_runs_it_cannot_estimate_and_a_bad_seed(tmp_path: Path,
                                                                  capsys) -> None:
    # A row whose plan the planner cannot express (dp x tp = 64 on 8 GPUs) is left out of a
    # validation; a calibration of it alone fitted nothing, said "fitted 8 constants" and
    # wrote a device: now one line, exit 2, no file.
    path = _write(tmp_path, HEADER + ",step_time_s", "a,gpt-1.7b,dgx-a100-8,16,2048,8,8,1,1,1.0")
    out = tmp_path / "mine.yaml"
    assert main(["calibrate", str(path), "--device", "a100-80gb", "--name", "mine", "--out",
                 str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no run on 'a100-80gb' the planner can estimate" in err
    assert not out.exists()
    ok = _write(tmp_path, HEADER + ",step_time_s", "a,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0")
    assert main(["calibrate", str(ok), "--device", "a100-80gb", "--name", "mine", "--out",
                 str(out), "--seed", "-1"]) == 2
    assert "--seed -1: give a whole number from 0 to 4294967295" in capsys.readouterr().err


def test_calibrate_out_is_a_regular_file_it_may_replace(tmp_path: Path, capsys) -> None:
    # `--out /dev/full --force` replaced the device node with a YAML file (as root), and a
    # symbolic link was replaced, leaving its file as it was: both refused before the fit. A
    # new file takes the umask's permissions, not mkstemp's owner-only 0600.
    import os
    import stat

    path = _write(tmp_path, HEADER + ",step_time_s", "a,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0")
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    target = tmp_path / "target.yaml"
    target.write_text("kept: true\n")
    link = tmp_path / "link.yaml"
    link.symlink_to(target)
    for out, said in ((fifo, "is not a regular file"), (link, "is a symbolic link")):
        assert main(["calibrate", str(path), "--device", "a100-80gb", "--name", "mine",
                     "--out", str(out), "--force", "--trials", "5"]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1
    assert stat.S_ISFIFO(fifo.stat().st_mode) and link.is_symlink()
    assert target.read_text() == "kept: true\n"
    old = os.umask(0o022)
    try:
        new = tmp_path / "new.yaml"
        assert main(["calibrate", str(path), "--device", "a100-80gb", "--name", "mine",
                     "--out", str(new), "--trials", "5"]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(new.stat().st_mode) == 0o644
    assert main(["calibrate", str(path), "--device", "a100-80gb", "--name", "x" * 201,
                 "--out", str(tmp_path / "long.yaml")]) == 2
    assert "--name: 201 characters; use at most 200" in capsys.readouterr().err


def test_calibrate_force_replaces_only_a_device_entry(tmp_path: Path, capsys) -> None:
    # `--out studies.journal --force` replaced a study journal with a device YAML (the study
    # was lost), and `--out x.txt` wrote YAML into a .txt file: both refused before the fit
    path = _write(tmp_path, HEADER + ",step_time_s", "a,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0")
    journal = tmp_path / "studies.yaml"  # a journal's lines, under a .yaml name
    journal.write_text('{"op_code": 0, "worker_id": "w", "study_name": "s", "directions": [1]}\n')
    study = tmp_path / "study.yaml"
    study.write_text("name: s\nmodel: llama3-8b\n")
    for out in (journal, study):
        before = out.read_text()
        assert main(["calibrate", str(path), "--device", "a100-80gb", "--name", "mine",
                     "--out", str(out), "--force", "--trials", "5"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "exists and is not a device entry" in err
        assert out.read_text() == before
    assert main(["calibrate", str(path), "--device", "a100-80gb", "--name", "mine",
                 "--out", str(tmp_path / "x.txt"), "--trials", "5"]) == 2
    assert "a device entry is YAML; give a .yaml file name" in capsys.readouterr().err
    assert not (tmp_path / "x.txt").exists()
    device = tmp_path / "mine.yaml"
    for force in ([], ["--force"]):  # written, then replaced: a device entry
        assert main(["calibrate", str(path), "--device", "a100-80gb", "--name", "mine",
                     "--out", str(device), "--trials", "5", *force]) == 0
    assert "mine" in yaml.safe_load(device.read_text())


def test_a_file_of_which_no_row_is_estimated_exits_1(tmp_path: Path, capsys) -> None:
    # Every row a plan the planner cannot express (dp x tp = 64 on 8 GPUs): the report has no
    # figure at all, and the exit code said success.
    path = _write(tmp_path, HEADER + ",step_time_s", "a,gpt-1.7b,dgx-a100-8,16,2048,8,8,1,1,1.0")
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert "no row could be estimated (1 row left out, listed above)" in err


def test_a_filled_cell_under_an_unnamed_column_is_a_value_to_fix(tmp_path: Path,
                                                                  capsys) -> None:
    # The header "...,micro_batch,,step_time_s" leaves column 10 unnamed: its cell was dropped
    # without a word (a header shifted by one column reads every figure under the wrong name).
    path = _write(tmp_path, HEADER + ",,step_time_s",
                  "a,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,9,1.0",
                  "b,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,,1.0")
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}:2 (a): a filled cell in column 10, which the header leaves unnamed" in out
    assert "step time: 1 run" in out


def test_by_given_twice_is_refused(tmp_path: Path, capsys) -> None:
    # `--by tp --by pp` split by pp alone, the tp asked for dropped without a word.
    path = _write(tmp_path, HEADER + ",step_time_s", "a,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0")
    assert main(["validate", str(path), "--by", "tp", "--by", "pp"]) == 2
    assert "--by given twice; give one" in capsys.readouterr().err


def test_a_row_repeated_cell_for_cell_is_a_value_to_fix(tmp_path: Path, capsys) -> None:
    # A row pasted twice counted its run twice in the MAPE and in a calibration; a plan
    # measured twice differs in its figure (or its name) and stays two runs.
    row = "a,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0"
    path = _write(tmp_path, HEADER + ",step_time_s", row, row,
                  "a,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.1")
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}:3 (a): repeats line 2 cell for cell" in out
    assert "step time: 2 runs" in out


@pytest.mark.parametrize("cell", ["1_6", "١٦", "１６", "+1_6"])
def test_numbers_are_written_in_ascii_digits(tmp_path: Path, capsys, cell: str) -> None:
    # Python's float() reads "1_6" as 16 and Arabic-Indic and full-width digits as digits: a
    # spreadsheet writes none of these.
    path = _write(tmp_path, HEADER + ",step_time_s",
                  f"a,gpt-1.7b,dgx-a100-8,{cell},2048,8,1,1,1,1.0",
                  "b,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0")
    assert main(["validate", str(path)]) == 1
    assert f"{path}:2 (a): global_batch=" in capsys.readouterr().out


def test_a_quote_never_closed_is_one_line(tmp_path: Path, capsys) -> None:
    # The reader took the rest of the file as one cell and said "pp is empty".
    path = _write(tmp_path, HEADER + ",step_time_s",
                  "\"a,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: line 2: a quote opened in this row is never closed" in err
    assert err.count("\n") == 1
    # text after a closing quote stays what Python's reader makes of it, as before
    quoted = _write(tmp_path, HEADER + ",step_time_s",
                    "\"a\" (rerun),gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0")
    assert main(["validate", str(quoted)]) == 0
    assert "a (rerun)" in capsys.readouterr().out
    # and a bare quote inside an unquoted cell (an odd count of them) is a character
    inch = _write(tmp_path, HEADER + ",step_time_s,notes",
                  "a,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0,a 5\" screen")
    assert main(["validate", str(inch)]) == 0


def test_a_quote_closed_rows_later_is_one_line(tmp_path: Path, capsys) -> None:
    # A stray opening quote closed by the next row's quoted cell took that row into its cell:
    # run b was left out of every figure without a word.
    path = _write(tmp_path, HEADER + ",step_time_s,notes",
                  "a,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0,\"table 1",
                  "b,gpt-1.7b,dgx-a100-8,16,2048,4,2,1,1,1.2,\"table 2\"",
                  "c,gpt-1.7b,dgx-a100-8,16,2048,2,4,1,1,1.4,table 3")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert (f"{path}: line 2: notes: a quote opened in this cell closes only 1 line later,"
            " taking the rows between into it") in err
    assert err.count("\n") == 1
    # closed at the start of the next row: the rest of that row spilled past the header
    path = _write(tmp_path, HEADER + ",step_time_s,notes",
                  "a,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0,\"table 1",
                  "b\",gpt-1.7b,dgx-a100-8,16,2048,4,2,1,1,1.2,table 2")
    assert main(["validate", str(path)]) == 2
    assert (f"{path}: line 2: notes: a quote opened in this cell closes only 1 line later"
            in capsys.readouterr().err)
    # a quoted note over two lines of prose, empty cells trailing past the header, is a cell
    path = _write(tmp_path, HEADER + ",step_time_s,notes",
                  "a,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0,\"two\nlines\",,",
                  "b,gpt-1.7b,dgx-a100-8,16,2048,4,2,1,1,1.2,one")
    assert main(["validate", str(path)]) == 0
    capsys.readouterr()


def test_calibrate_fit_names_ignore_case(tmp_path: Path, capsys) -> None:
    # A runs CSV's columns are read in any case; --fit's names were not.
    path = _write(tmp_path, HEADER + ",step_time_s", "a,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0")
    assert main(["calibrate", str(path), "--device", "a100-80gb", "--name", "mine", "--out",
                 str(tmp_path / "mine.yaml"), "--fit", "MATMUL_Efficiency", "--trials", "5",
                 "--json"]) == 0
    assert list(json.loads(capsys.readouterr().out)["fitted"]) == ["matmul_efficiency"]


def test_calibrate_names_the_runs_it_cannot_estimate_apart_from_out_of_memory(
        tmp_path: Path, capsys) -> None:
    # A plan the planner cannot express (dp x tp = 64 on 8 GPUs) beside one it can: left out
    # and named, not counted as a plan that ran out of memory (there is none).
    path = _write(tmp_path, HEADER + ",step_time_s", "a,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0",
                  "b,gpt-1.7b,dgx-a100-8,16,2048,8,8,1,1,1.0")
    assert main(["calibrate", str(path), "--device", "a100-80gb", "--name", "mine", "--out",
                 str(tmp_path / "mine.yaml"), "--trials", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["runs"] == 1 and out["out_of_memory_left_out"] == 0
    [left] = out["cannot_express_left_out"]
    assert left.startswith(f"{path}:3 (b): ")


def test_calibrate_names_the_rows_it_could_not_read_as_plans(tmp_path: Path, capsys) -> None:
    # Rows refused as the file is read (fp64 gradients; a framework that cannot run the plan as
    # written), beside one refused as it is estimated (a layout one layer short): each is
    # left out and named, as `planner validate` names them; two were dropped without a word.
    # With no row left on the device, the error says why rather than "the runs' devices: none".
    path = _write(tmp_path, HEADER + ",step_time_s,grad_bytes,framework,pipeline_layout",
                  "r1,gpt-1.7b,dgx-a100-8,64,2048,8,1,1,1,1.5,,,",
                  "r2,gpt-1.7b,dgx-a100-8,64,2048,4,2,1,2,1.6,,,",
                  "r3,gpt-1.7b,dgx-a100-8,64,2048,2,4,1,4,1.7,8,,",
                  "r4,gpt-1.7b,dgx-a100-8,64,2048,4,1,2,2,1.7,,deepspeed,",
                  "r5,gpt-1.7b,dgx-a100-8,64,2048,4,1,2,2,1.8,,,Et*12|t*11L")
    assert main(["calibrate", str(path), "--device", "a100-80gb", "--name", "mine", "--out",
                 str(tmp_path / "mine.yaml"), "--trials", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["runs"] == 2
    assert [left.split(" ")[0] for left in out["cannot_express_left_out"]] == [
        f"{path}:4", f"{path}:5", f"{path}:6"]
    only = _write(tmp_path, HEADER + ",step_time_s,grad_bytes",
                  "r3,gpt-1.7b,dgx-a100-8,64,2048,2,4,1,4,1.7,8")
    assert main(["calibrate", str(only), "--device", "a100-80gb", "--name", "mine", "--out",
                 str(tmp_path / "mine.yaml"), "--trials", "5", "--force"]) == 2
    err = capsys.readouterr().err
    assert "1 row the planner cannot express left out" in err and f"{only}:2 (r3)" in err
    assert err.count("\n") == 1


def test_control_characters_in_a_name_are_printed_as_escapes(tmp_path: Path, capsys) -> None:
    # A name holding ESC [ 3 1 m recoloured the terminal that printed the table, and a newline
    # in a quoted cell broke its row: each control character is written as Python's escape.
    path = _write(tmp_path, HEADER + ",step_time_s,release",
                  '"a\x1b[31mb\nc",gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0,r\x1b[32m',
                  "d,gpt-1.7b,dgx-a100-8,16,2048,4,2,1,1,1.0,r\x1b[32m")
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "a\\x1b[31mb\\nc " in out
    assert "release r\\x1b[32m:" in out
    # U+202E (right-to-left override) printed the rest of the line reversed
    path = _write(tmp_path, HEADER + ",step_time_s",
                  "a\u202eb,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0")
    assert main(["validate", str(path)]) == 0
    assert "a\\u202eb " in capsys.readouterr().out


def test_a_group_is_of_what_the_cells_name_not_how_they_are_written(tmp_path: Path,
                                                                    capsys) -> None:
    # `models.yaml#m` beside two CSVs in two folders names two models (a 24-layer GPT and a
    # 48-layer one): two plan-choice groups, not one whose regret and tau compared the two
    # models; `./models.yaml#m` and `models.yaml#m` beside one CSV name one. Where two groups
    # would print alike, each prints the file its model is in.
    model = ("m:\n  family: gpt\n  layers: {}\n  hidden: 2048\n  ffn_hidden: 8192\n"
             "  heads: 16\n  vocab: 51200\n  seq_len: 2048\n")
    header = HEADER + ",step_time_s"
    files = []
    for folder, layers, rows in (
            ("a", 24, ("small,models.yaml#m,dgx-a100-8,64,2048,8,1,1,1,1.5",
                       "small2,./models.yaml#m,dgx-a100-8,64,2048,4,2,1,1,1.7")),
            ("b", 48, ("big,models.yaml#m,dgx-a100-8,64,2048,1,8,1,1,20.0",
                       "big2,models.yaml#m,dgx-a100-8,64,2048,2,4,1,1,18.0"))):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "models.yaml").write_text(model.format(layers))
        files.append(tmp_path / folder / "runs.csv")
        files[-1].write_text("\n".join((header, *rows)) + "\n")
    assert main(["validate", *map(str, files), "--json", "--by", "model"]) == 0
    out = json.loads(capsys.readouterr().out)
    groups = [(g["key"]["model"], g["runs"]) for g in out["groups"]]
    models = [str((tmp_path / f / "models.yaml").resolve()) + "#m" for f in ("a", "b")]
    assert groups == [(models[0], 2), (models[1], 2)]
    assert [part["model"] for part in out["by"]["rows"]] == models
    # one CSV alone: its group prints the model as its first row writes it
    assert main(["validate", str(files[0]), "--json"]) == 0
    [group] = json.loads(capsys.readouterr().out)["groups"]
    assert group["key"]["model"] == "models.yaml#m" and group["runs"] == 2


def test_a_row_is_named_by_the_line_it_starts_on_and_cr_alone_ends_a_line(
        tmp_path: Path, capsys) -> None:
    # A quoted cell over three lines: its row starts on line 2 (it was named by its last,
    # line 4); a file saved with CR alone (classic Mac) was "not valid CSV" in Python's words.
    path = tmp_path / "runs.csv"
    path.write_text(HEADER + ',step_time_s,source\n'
                    'r1,gpt-1.7b,dgx-a100-8,64,2048,8,1,1,abc,1.5,"a note\nspanning\nthree lines"\n'
                    'r2,gpt-1.7b,dgx-a100-8,64,2048,4,2,1,1,1.6,\n')
    assert main(["validate", str(path)]) == 1
    assert f"{path}:2 (r1): micro_batch='abc' must be a whole number" in capsys.readouterr().out
    path.write_bytes((HEADER + ",step_time_s\rr1,gpt-1.7b,dgx-a100-8,64,2048,8,1,1,1,1.5\r"
                      "r2,gpt-1.7b,dgx-a100-8,64,2048,4,2,1,1,xx\r").encode())
    assert main(["validate", str(path)]) == 1
    assert f"{path}:3 (r2): step_time_s='xx' must be a number" in capsys.readouterr().out


def test_a_peak_far_over_any_part_says_check_the_unit_and_json_lists_in_skipped(
        tmp_path: Path, capsys) -> None:
    # hbm_gb=1e30 said "must be a number > 0" of a positive number; under --json the stderr
    # line said the rows were "listed as left out", which only the text report does
    path = _write(tmp_path, HEADER + ",step_time_s,hbm_gb",
                  "a,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0,1e30",
                  "b,gpt-1.7b,dgx-a100-8,16,2048,4,2,1,1,1.0,")
    assert main(["validate", str(path)]) == 1
    assert "hbm_gb='1e30' must be a number up to 1e+12; check the unit" in (
        capsys.readouterr().out)
    assert main(["validate", str(path), "--json"]) == 1
    assert "(listed in skipped)" in capsys.readouterr().err


def test_a_run_in_two_files_counts_once(tmp_path: Path, capsys) -> None:
    # a file copied beside itself counted every run twice (Kendall tau -1.00 -> -0.67)
    rows = ("a,gpt-1.7b,dgx-a100-8,16,2048,8,1,1,1,1.0",
            "b,gpt-1.7b,dgx-a100-8,16,2048,4,2,1,1,1.2")
    one = _write(tmp_path, HEADER + ",step_time_s", *rows)
    two = tmp_path / "copy.csv"
    two.write_text(one.read_text())
    assert main(["validate", str(one), str(two), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["step_time_runs"] == 2
    assert [s["reason"].split(" (")[0] for s in out["skipped"]] == [
        f"repeats {one}:2", f"repeats {one}:3"]
