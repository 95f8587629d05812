"""`planner validate` with the plans that ran out of memory (`out_of_memory` rows): the other
half of a study's answer, that its plan fits, checked against the plans a team tried and lost.

A run that ran has a step time; a plan that ran out of memory has none, only the verdict. The
report counts the ones the estimate has fitting (a study would offer them), and for each group
of timed plans it names the **first choice**, the fastest predicted of the plans the estimate
says fit, timed or not: where that plan ran out of memory, the study's recommendation fails.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from planner.catalog import load_catalog
from planner.cli import main
from planner.runs_csv import read_runs, read_runs_files
from planner.validation import Validation, validate

DATA = Path(__file__).parent / "data" / "validation"
TIMED = DATA / "aleph-alpha-a100-check.csv"
OOM = DATA / "aleph-alpha-a100-oom-check.csv"

HEADER = ("model,system,global_batch,seq_len,dp,tp,pp,micro_batch,recompute,step_time_s,"
          "out_of_memory")
# A team's trials of Llama 3 8B on one DGX A100 80GB (batch 64 of 4,096 tokens); the step times
# are the trial's, the test is of the verdicts:
# - tp 8, full recompute, micro-batch 1 and 2: ran;
# - tp 8 without recompute: ran out of memory. By hand it fits: its weights, gradients and Adam
#   states are 16 bytes x 8.03B / 8 = 16.1 GB a GPU, and 32 layers keep s b h (10 + 24 / tp)
#   bytes each without the attention scores (flash attention; Korthikanti et al. 2022, eq. 1
#   without its 5 a s / h term) = 4,096 x 4,096 x 13 = 0.22 GB, 7.0 GB in all: far under the
#   A100's 85.9 GB. And it runs three passes of each layer where full recompute runs four, so it
#   is predicted the fastest: a study would recommend it, and it failed;
# - dp 8 without recompute: ran out of memory, and the estimate agrees: 16 bytes x 8.03B =
#   128 GB of states on each GPU.
TRIALS = """\
llama3-8b,dgx-a100-8,64,4096,1,8,1,1,full,9.1,
llama3-8b,dgx-a100-8,64,4096,1,8,1,2,full,8.7,false
llama3-8b,dgx-a100-8,64,4096,1,8,1,1,none,,true
llama3-8b,dgx-a100-8,64,4096,8,1,1,1,none,,true
"""


def _write(tmp_path: Path, body: str, header: str = HEADER) -> Path:
    path = tmp_path / "trials.csv"
    path.write_text(f"{header}\n{body}")
    return path


def _json(capsys, *args: str) -> dict:
    assert main(["validate", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_plan_that_ran_out_of_memory_is_checked_for_its_fit(tmp_path, capsys) -> None:
    data = _json(capsys, str(_write(tmp_path, TRIALS)))
    rows = data["rows"]
    assert [r["out_of_memory"] for r in rows] == [False, False, True, True]
    assert [r["fits"] for r in rows] == [True, True, True, False]
    assert rows[2]["measured_step_time_s"] is None and rows[2]["step_time_error"] is None
    assert data["step_time_runs"] == 2  # the two that ran: the others have no step to compare
    assert data["out_of_memory_runs"] == 2
    assert data["out_of_memory_estimated_fits"] == 1
    assert data["over_memory_runs"] == 0  # a plan that ran out of memory is not "a run over"
    (group,) = data["groups"]
    assert group["runs"] == 2 and group["out_of_memory_runs"] == 2
    # the first choice is the plan without recompute, which ran out of memory; the regret,
    # over the timed plans, is unchanged by it
    assert group["first_choice"] == rows[2]["name"]
    assert group["first_choice_out_of_memory"] is True
    assert group["first_choice_regret"] is None and data["first_choice_regret_mean"] is None
    assert rows[2]["predicted_step_time_s"] < min(r["predicted_step_time_s"] for r in rows[:2])
    assert data["groups_with_out_of_memory"] == 1
    assert data["first_choice_out_of_memory"] == 1


def test_the_report_says_which_verdicts_were_wrong(tmp_path, capsys) -> None:
    assert main(["validate", str(_write(tmp_path, TRIALS))]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "OOM" in lines[3] and lines[3].endswith("estimated to fit, ran out of memory")
    assert "OOM" in lines[4] and lines[4].endswith("over memory")
    assert ("out of memory: 2 plans ran out of memory; the estimate has 1 of them fitting"
            in out)
    assert "ran out of memory in 1 of 1 group with such plans" in out
    assert re.search(r"first choice 'line 4: [^']+' ran out of memory", out)


def test_a_group_whose_first_choice_ran_is_not_counted(tmp_path, capsys) -> None:
    # without the tp 8 plan that ran out of memory, the first choice is a timed plan
    lines = TRIALS.splitlines()
    data = _json(capsys, str(_write(tmp_path, "\n".join(lines[:2] + lines[3:]) + "\n")))
    (group,) = data["groups"]
    assert group["first_choice_out_of_memory"] is False
    (choice,) = [r for r in data["rows"] if r["name"] == group["first_choice"]]
    assert choice in data["rows"][:2]
    # the recommendation's regret: its measured step over the fastest measured (8.7 s), less 1
    assert group["first_choice_regret"] == pytest.approx(choice["measured_step_time_s"] / 8.7 - 1)
    assert data["first_choice_regret_mean"] == pytest.approx(group["first_choice_regret"])
    assert data["first_choice_out_of_memory"] == 0 and data["groups_with_out_of_memory"] == 1


@pytest.mark.parametrize(("cells", "said"), [
    ("9.1,true", "out_of_memory is true but the row has a measured step time"),
    (",maybe", "out_of_memory='maybe' must be true or false"),
    (",false", "out_of_memory is not true"),
])
def test_a_bad_out_of_memory_cell_is_a_value_to_fix(tmp_path, capsys, cells, said) -> None:
    path = _write(tmp_path, f"llama3-8b,dgx-a100-8,64,4096,1,8,1,1,none,{cells}\n")
    assert main(["validate", str(path), "--json"]) == 1
    (skipped,) = json.loads(capsys.readouterr().out)["skipped"]
    assert skipped["bad_value"] and said in skipped["reason"]


def test_a_file_of_plans_that_ran_out_of_memory_alone_is_read(tmp_path) -> None:
    path = _write(tmp_path, "llama3-8b,dgx-a100-8,64,4096,8,1,1,1,none,true\n",
                  header="model,system,global_batch,seq_len,dp,tp,pp,micro_batch,recompute,"
                  "out_of_memory")
    (run,), skipped = read_runs(path, load_catalog())
    assert not skipped and run.out_of_memory and run.step_time_s is None


def test_calibrate_has_nothing_to_fit_on_plans_that_ran_out_of_memory(tmp_path, capsys) -> None:
    path = _write(tmp_path, "llama3-8b,dgx-a100-8,64,4096,8,1,1,1,none,,true\n")
    code = main(["calibrate", str(path), "--device", "a100-80gb", "--name", "ours",
                 "--out", str(tmp_path / "ours.yaml")])
    assert code == 2
    assert "every run on 'a100-80gb' ran out of memory" in capsys.readouterr().err
    assert not (tmp_path / "ours.yaml").exists()


def _plans(path: Path) -> list[tuple[str, ...]]:
    keys = ("model", "system", "global_batch", "seq_len", "dp", "tp", "pp", "micro_batch",
            "recompute", "sequence_parallel", "release")
    with path.open(newline="") as f:
        return [tuple(row[k] for k in keys) for row in csv.DictReader(f)]


def test_aleph_alphas_plans_that_ran_out_of_memory_are_the_sheets() -> None:
    # Hagemann et al. 2023's spreadsheets mark each plan that did not fit "OOM Error": the file
    # holds those of the plans aleph-alpha-a100-check.csv reads (FlashAttention 2 with either
    # RMSNorm; not the 30B at pp 8 or 16), each citing its sheet and Trial ID
    with OOM.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert all(re.fullmatch(r"Aleph-Alpha/NeurIPS-WANT-submission-efficient-parallelization-"
                            r"layouts@e13c2cb data/[\w/]+\.xlsx, Trial ID \d+: OOM Error",
                            row["source"]) for row in rows)
    # one row a trial of a sheet (four Trial IDs stand in two sheets: the 30B at sequence 8192
    # and the 65B at 2048, both out of memory)
    trials = [row["source"] for row in rows]
    assert len(set(trials)) == len(trials)
    assert all(row["out_of_memory"] == "true" for row in rows)
    # a plan is either timed or out of memory in the sheets, never both
    assert not set(_plans(OOM)) & set(_plans(TIMED))
    assert not any(row["model"].endswith("30b") and row["pp"] in ("8", "16") for row in rows)


def test_aleph_alphas_first_choice_is_checked_with_the_plans_that_did_not_fit(capsys) -> None:
    runs, skipped = read_runs_files([TIMED, OOM], load_catalog())
    assert skipped == []
    both = validate(runs)
    data = both.summary()
    assert data["out_of_memory_runs"] == 305
    # every group of the timed file has plans that ran out of memory beside it
    assert data["groups_with_out_of_memory"] == data["groups_count"] == 14
    # the timed figures do not move with them (tests/test_readme_figures.py holds those)
    alone = Validation(tuple(r for r in both.results if not r.run.out_of_memory), ()).summary()
    for key in ("step_time_mape", "regret_mean", "picked_fastest", "over_memory_runs"):
        assert data[key] == alone[key]
    assert alone["groups_with_out_of_memory"] == alone["first_choice_out_of_memory"] == 0


def test_the_bloom_sweeps_plans_that_ran_out_of_memory_are_estimated_over(capsys) -> None:
    # BigScience's 02-25 sweep on 48 Jean Zay nodes marks three plans' Mem "OOM"
    # (chronicles-prequel.md lines 793, 806, 807; the 02-28 table's are issue 14's held-out
    # check). Megatron-DeepSpeed's memory is the stack the A100's allowance was fit on (its
    # nvidia-smi peaks), and the estimate has each over the part: the 181B's dp 48 x tp 8 keeps
    # every one of its 70 layers' weights, gradients and fp32 states on one stage, 181e9 / 8 x
    # (2 + 2) bytes = 90.5 GB of weights and gradients alone over the 85.9 GB
    oom = DATA / "bloom-sweeps-a100-oom-check.csv"
    with oom.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [re.search(r"md line (\d+) ", row["source"]).group(1) for row in rows] == [
        "793", "806", "807"]
    assert all("02-25" in row["source"] and row["release"] == "02-25" for row in rows)
    data = _json(capsys, str(DATA / "bloom-sweeps-a100-check.csv"), str(oom))
    assert data["out_of_memory_runs"] == 3 and data["out_of_memory_estimated_fits"] == 0
    assert data["rows"][-3]["predicted_peak_memory_gb"] > 90.5
    assert data["groups_with_out_of_memory"] == 2 and data["first_choice_out_of_memory"] == 0



def test_calibrate_fits_on_the_runs_beside_them_and_says_so(tmp_path, capsys) -> None:
    # the BLOOM sweeps' 77 timed runs with their three plans that ran out of memory: the fit is
    # on the 77, and the three are named as left out
    files = [str(DATA / f"bloom-sweeps-a100-{kind}.csv") for kind in ("check", "oom-check")]
    args = ["calibrate", *files, "--device", "a100-80gb", "--name", "ours", "--trials", "3",
            "--fit", "matmul_efficiency"]
    assert main([*args, "--out", str(tmp_path / "a.yaml"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["runs"], out["out_of_memory_left_out"]) == (77, 3)
    assert main([*args, "--out", str(tmp_path / "b.yaml")]) == 0
    assert "left out: 3 plans that ran out of memory" in capsys.readouterr().out


def test_a_margin_judges_the_fit_against_less_memory(tmp_path, capsys) -> None:
    # --margin-gb: the tp 8 plan without recompute, estimated to fit, is judged against the
    # A100's 85.9 GB less a margin just over what it leaves free; then it is over, and the first
    # choice is a plan that ran
    path = str(_write(tmp_path, TRIALS))
    plain = _json(capsys, path)
    free = 85.899 - plain["rows"][2]["predicted_peak_memory_gb"]
    data = _json(capsys, path, "--margin-gb", f"{free + 0.5:.2f}")
    assert data["rows"][2]["fits"] is False and data["out_of_memory_estimated_fits"] == 0
    (group,) = data["groups"]
    assert group["first_choice_out_of_memory"] is False
    assert main(["validate", path, "--margin-gb", "5"]) == 0
    assert "fits judged against each part's memory less 5 GB" in capsys.readouterr().out
    # the estimate itself does not move
    assert [r["predicted_step_time_s"] for r in data["rows"]] == [
        r["predicted_step_time_s"] for r in plain["rows"]]


@pytest.mark.parametrize(("margin", "said"), [
    ("-1", "--margin-gb -1: give the GB to keep free, 0 or more"),
    ("100", "--margin-gb 100: "),
])
def test_a_margin_the_part_cannot_keep_is_refused(tmp_path, capsys, margin, said) -> None:
    assert main(["validate", str(_write(tmp_path, TRIALS)), "--margin-gb", margin]) == 2
    err = capsys.readouterr().err
    assert said in err and ("85.9 GB; keep less free" in err or margin == "-1")
