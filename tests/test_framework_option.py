"""One plan estimated as a framework runs it, outside a study: ``planner estimate --framework``
and a runs CSV's ``framework`` column (:func:`search_spaces.frameworks.framework_training`).

A study with ``framework: F`` fills what its training leaves empty with F's defaults and keeps
only the plans F runs as written (``search_spaces/frameworks.py`` cites each rule); the same
plan estimated on its own, or a measured run of that framework checked with ``planner
validate`` / ``planner calibrate``, must be read the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.catalog import load_catalog
from planner.cli import main
from planner.runs_csv import read_runs

H100_PLAN = ["estimate", "--model", "llama3-8b", "--system", "dgx-h100-8", "--dp", "8",
             "--micro-batch", "1", "--zero", "1", "--global-batch", "64"]


def _json(capsys, args: list[str]) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_estimate_takes_the_frameworks_defaults(capsys) -> None:
    # On an H100 a ZeRO-1 plan trains on Megatron-Core with Transformer Engine by default
    # (gpus.yaml: transformer_engine true); torchtitan and DeepSpeed run PyTorch's kernels,
    # torchtitan's loss on an fp32 copy of the logits, an eighth of them at a time (main's
    # ChunkedLossWrapper, torchtitan/components/loss.py).
    plain = _json(capsys, H100_PLAN)
    assert plain["transformer_engine"] is True and "framework" not in plain
    # torchtitan runs ZeRO-1 with pp > 1 only (framework_rules.torchtitan_zero): dp 4 x pp 2
    piped = [*H100_PLAN, "--dp", "4", "--pp", "2"]
    titan = _json(capsys, [*piped, "--framework", "torchtitan"])
    assert titan["transformer_engine"] is False and titan["framework"] == "torchtitan"
    assert titan["cross_entropy"] == "chunked" and "cross_entropy" not in plain
    # the classic stack's GEMM rate is lower
    assert titan["step_time"] > _json(capsys, piped)["step_time"]
    assert main([*H100_PLAN, "--framework", "deepspeed"]) == 0
    assert "classic stack as deepspeed runs it" in capsys.readouterr().out.splitlines()[0]
    # megatron on an H100 is the device's default stack: the same estimate
    assert _json(capsys, [*H100_PLAN, "--framework", "megatron"])["step_time"] == plain["step_time"]
    assert _json(capsys, [*H100_PLAN, "--framework", "any"])["step_time"] == plain["step_time"]


def test_estimate_refuses_a_plan_the_framework_cannot_run(capsys) -> None:
    # DeepSpeed has no FP8 training mode of its own (deepspeedai/DeepSpeed#6908)
    assert main([*H100_PLAN, "--precision", "fp8", "--framework", "deepspeed"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("planner estimate: error: deepspeed cannot run this plan as written:"
                          " precision fp8")
    assert len(err.splitlines()) == 1
    assert main([*H100_PLAN, "--framework", "jax"]) == 2
    assert "invalid choice: 'jax'" in capsys.readouterr().err


HEADER = "name,model,system,global_batch,seq_len,dp,tp,pp,micro_batch,zero,grad_bytes," \
         "precision,framework,step_time_s,peak_memory_gb\n"
ROW = "llama3-8b,dgx-a100-8,64,4096,8,1,1,1,1,4,{precision},{framework},10,60\n"


def _runs(tmp_path: Path, rows: list[tuple[str, str, str]]) -> Path:
    path = tmp_path / "runs.csv"
    path.write_text(HEADER + "".join(f"{name}," + ROW.format(precision=p, framework=f)
                                     for name, p, f in rows))
    return path


def test_a_runs_csv_row_is_read_as_its_framework_runs_it(tmp_path: Path, capsys) -> None:
    # DeepSpeed with fp32 gradient accumulation (grad_bytes 4) takes its BF16_Optimizer, which
    # keeps each 16-bit .grad beside the fp32 buffer (frameworks.grad_copy): 2 bytes a
    # parameter more, as many bytes as the 16-bit weights. Its loss (Megatron-DeepSpeed's own,
    # CrossEntropy.MEGATRON_DEEPSPEED) holds 10 bytes a logit where the fused one holds 4: 6
    # bytes more for each of the micro-batch's 1 x 4,096 tokens' 128,256 logits (Llama 3's
    # vocabulary, tp 1), 3,152,019,456 bytes. On an A100 (the classic stack either way) and
    # without recompute those are the rows' only differences.
    path = _runs(tmp_path, [("plain", "bf16", ""), ("any", "bf16", "any"),
                            ("deepspeed", "bf16", "deepspeed")])
    runs, skipped = read_runs(path, load_catalog())
    assert not skipped and [r.training.grad_copy for r in runs] == [None, None, True]
    out = _json(capsys, ["validate", str(path)])
    plain, anyf, ds = out["rows"]
    assert anyf["predicted_peak_memory_gb"] == plain["predicted_peak_memory_gb"]
    weights = _json(capsys, ["estimate", "--model", "llama3-8b", "--system", "dgx-a100-8",
                             "--dp", "8", "--zero", "1", "--global-batch", "64", "--seq-len",
                             "4096", "--grad-bytes", "4"])["memory"]["weights"]
    assert (ds["predicted_peak_memory_gb"] - plain["predicted_peak_memory_gb"]) * 1e9 \
        == pytest.approx(weights + 6 * 1 * 4096 * 128256)


def test_a_row_its_framework_cannot_run_is_left_out_with_the_reason(tmp_path: Path) -> None:
    path = _runs(tmp_path, [("fp8 on deepspeed", "fp8", "deepspeed"),
                            ("unknown", "bf16", "jax"), ("fine", "bf16", "megatron")])
    runs, skipped = read_runs(path, load_catalog())
    assert [r.name for r in runs] == ["fine"]
    fp8, unknown = skipped
    assert fp8.reason.startswith("deepspeed cannot run this plan as written: precision fp8:")
    assert not fp8.bad_value  # a plan the planner reads, refused by the framework's rule
    assert unknown.reason == ("framework='jax' is not one of any, megatron, deepspeed,"
                              " torchtitan")
    assert unknown.bad_value


def test_validate_and_calibrate_read_empty_cells_as_the_framework_given(tmp_path: Path,
                                                                        capsys) -> None:
    # --framework applies to the rows whose cell is empty; a cell that names one keeps it
    path = _runs(tmp_path, [("plain", "bf16", ""), ("megatron", "bf16", "megatron")])
    runs, _ = read_runs(path, load_catalog(), "deepspeed")
    assert [(r.name, r.framework, r.training.grad_copy) for r in runs] == [
        ("plain", "deepspeed", True), ("megatron", "megatron", None)]
    out = _json(capsys, ["validate", str(path), "--framework", "deepspeed", "--by", "framework"])
    assert [row["framework"] for row in out["by"]["rows"]] == ["deepspeed", "megatron"]
    plain = _json(capsys, ["validate", str(path), "--by", "framework"])
    assert [row["framework"] for row in plain["by"]["rows"]] == ["-", "megatron"]
    # the DeepSpeed row carries the 16-bit gradient copy: the 16-bit weights' bytes more
    assert (out["rows"][0]["predicted_peak_memory_gb"]
            > plain["rows"][0]["predicted_peak_memory_gb"])
    assert main(["validate", str(path), "--framework", "jax"]) == 2
    assert "invalid choice: 'jax'" in capsys.readouterr().err
    assert main(["calibrate", str(path), "--device", "a100-80gb", "--name", "ours", "--out",
                 str(tmp_path / "ours.yaml"), "--framework", "deepspeed", "--trials", "8",
                 "--fit", "matmul_efficiency", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"] == 2


def test_framework_needs_the_megatron_convention(tmp_path, capsys) -> None:
    # The stage convention (STAGE's graph on ASTRA-sim) and the mlp one are no framework's:
    # `--framework megatron` printed the stage figure "as megatron runs it"
    stage = ["estimate", "--model", "llama70b", "--system", "lab-system1", "--dp", "64",
             "--global-batch", "512", "--seq-len", "1024", "--convention", "stage"]
    assert main(stage) == 0
    capsys.readouterr()
    assert main([*stage, "--framework", "megatron"]) == 2
    err = capsys.readouterr().err
    assert "--framework megatron: the stage convention is not a training framework's" in err
    assert err.count("\n") == 1


def test_a_study_takes_only_a_convention_its_model_has(tmp_path, capsys) -> None:
    # DistIR's MLP convention prices an MLP: a Llama study in it ranked plans at 0.1% MFU
    study = tmp_path / "s.yaml"
    study.write_text("model: llama3-8b\nsystem: dgx-h100-8\nconvention: mlp\n"
                     "training: {global_batch: 64, seq_len: 4096}\nspace: {tp: [1, 2]}\n")
    assert main(["run", str(study)]) == 2
    err = capsys.readouterr().err
    assert (f"{study}: convention: model llama3-8b (llama family) cannot use mlp; use megatron"
            " or stage") in err


def test_torchtitan_reduces_the_gradients_in_float32_only(tmp_path, capsys) -> None:
    # mixed_precision_reduce is Literal["float32"] (torchtitan/config/job_config.py at
    # 73a0e697): a torchtitan plan is priced with 4-byte gradients; one naming 2 is refused
    plain = _json(capsys, [*H100_PLAN, "--zero", "3", "--framework", "torchtitan"])
    named = _json(capsys, [*H100_PLAN, "--zero", "3", "--framework", "torchtitan",
                           "--grad-bytes", "4"])
    assert plain["step_time"] == named["step_time"]
    assert main([*H100_PLAN, "--zero", "3", "--framework", "torchtitan", "--grad-bytes",
                 "2"]) == 2
    assert "--grad-bytes 2: torchtitan reduces the gradients in float32 only" in (
        capsys.readouterr().err)
    study = tmp_path / "s.yaml"
    study.write_text("model: llama3-8b\nsystem: dgx-h100-8\nframework: torchtitan\n"
                     "training: {global_batch: 64, seq_len: 4096, grad_bytes: 2}\n"
                     "space: {zero: [3]}\n")
    assert main(["run", str(study)]) == 2
    assert (f"{study}: training.grad_bytes: torchtitan reduces the gradients in float32 only"
            in capsys.readouterr().err)
