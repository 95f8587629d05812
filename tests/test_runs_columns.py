"""The runs CSV's throughput columns, Megatron-LM's and NeMo's names for degrees, and ``gpus``:
what a team copying a published table (tokens/s/GPU, CP, VP, #GPUs) writes as it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.catalog import load_catalog
from planner.cli import main
from planner.runs_csv import read_runs
from simcore.specs import Schedule

HEADER = "name,model,system,global_batch,seq_len,dp,tp,pp,micro_batch"
PLAN = "gpt-1.7b,dgx-a100-8,16,2048,8,1,1,2"
"""16 sequences of 2,048 tokens a step on 8 GPUs: 32,768 tokens a step, 4,096 a GPU."""


def _read(tmp_path: Path, header: str, *rows: str):
    path = tmp_path / "runs.csv"
    path.write_text("\n".join((header, *rows)) + "\n")
    return read_runs(path, load_catalog())


@pytest.mark.parametrize(("column", "value"), [
    ("step_time_s", "1.0"),
    ("tokens_per_s", "32768"),          # 32,768 tokens a step / 32,768 a second = 1 s
    ("tokens_per_s_per_gpu", "4096"),   # 32,768 / (4,096 x 8 GPUs) = 1 s
])
def test_a_throughput_is_read_as_its_step_time(tmp_path: Path, column: str, value: str) -> None:
    runs, skipped = _read(tmp_path, f"{HEADER},{column}", f"a,{PLAN},{value}")
    assert not skipped
    assert runs[0].step_time_s == pytest.approx(1.0)


def test_a_step_time_and_a_throughput_must_agree(tmp_path: Path) -> None:
    # 32,500 tokens/s is a step of 1.008 s (0.8% from 1.0, within the tables' rounding);
    # 30,000 is 1.092 s (9% off): a value to fix, not a run.
    runs, skipped = _read(tmp_path, f"{HEADER},step_time_s,tokens_per_s",
                          f"a,{PLAN},1.0,32500", f"b,{PLAN},1.0,30000")
    assert [r.name for r in runs] == ["a"] and runs[0].step_time_s == 1.0
    assert skipped[0].name == "b" and skipped[0].bad_value
    assert "step_time_s and tokens_per_s disagree" in skipped[0].reason
    assert "1.092 s" in skipped[0].reason


def test_cp_and_vp_are_read_as_sp_and_v(tmp_path: Path) -> None:
    # dp 2 x pp 2 x cp 2 on 8 GPUs; gpt-1.7b's 24 layers in 2 stages of 2 chunks of 6.
    runs, skipped = _read(tmp_path, f"{HEADER},cp,vp,step_time_s",
                          "a,gpt-1.7b,dgx-a100-8,16,2048,2,1,2,1,2,2,1.0")
    assert not skipped
    strategy = runs[0].strategy
    assert (strategy.sp, strategy.v, strategy.schedule) == (2, 2, Schedule.INTERLEAVED)


def test_an_alias_beside_its_column_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    path = tmp_path / "runs.csv"
    path.write_text(f"{HEADER},cp,sp,step_time_s\na,{PLAN},1,1,1.0\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "columns 'cp' and 'sp' both give sp" in err and err.count("\n") == 1


def test_gpus_is_checked_against_the_plan_and_the_system(tmp_path: Path) -> None:
    runs, skipped = _read(
        tmp_path, f"{HEADER},gpus,step_time_s",
        f"ok,{PLAN},8,1.0",
        f"typo,{PLAN},16,1.0",                                    # dp 8 x tp 1 x pp 1 = 8
        "small,gpt-1.7b,dgx-a100-16,16,2048,8,1,1,2,8,1.0")      # 8 GPUs on a 16-GPU system
    assert [r.name for r in runs] == ["ok"]
    assert all(s.bad_value for s in skipped)  # a row that contradicts itself: a value to fix
    reasons = {s.name: s.reason for s in skipped}
    assert reasons["typo"].startswith("gpus=16 but dp*tp*pp*sp = 8")
    assert reasons["small"].startswith("gpus=8 but the system dgx-a100-16 has 16 devices")


@pytest.mark.parametrize(("header", "message"), [
    (f"{HEADER},step_time", "unknown column 'step_time'; did you mean step_time_s?"),
    (HEADER.replace("micro_batch", "micro_batch_size") + ",step_time_s",
     "no column 'micro_batch' (is 'micro_batch_size' it? rename it)"),
    (f"{HEADER},colour,step_time_s", "unknown column 'colour'; allowed: model,"),
])
def test_a_misnamed_column_names_its_likely_fix(tmp_path: Path, capsys, header: str,
                                                message: str) -> None:
    path = tmp_path / "runs.csv"
    path.write_text(header + "\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
