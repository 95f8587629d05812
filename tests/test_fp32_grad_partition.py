"""DeepSpeed's mixed-precision optimizers keep an fp32 copy of their shard's 16-bit gradients
beside the master weights and Adam's moments (``fp32_grad_partition``): ZeRO-1/2's step flattens
the partition's 16-bit gradients, converts them to fp32 and sets them as the fp32 partition's
``.grad`` (deepspeed ``runtime/zero/stage_1_and_2.py`` ``step``), 4 bytes a parameter of the
optimizer's shard, which PyTorch's caching allocator keeps reserved from step to step."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import simcore
from planner.catalog import load_catalog
from planner.cli import main
from planner.runs_csv import read_runs
from planner.study_config import load_study_config
from search_spaces.frameworks import fp32_grad_partition, with_framework_defaults
from simcore.megatron.batched import estimate_many
from simcore.specs import Recompute, Schedule, Strategy, TrainingSpec, ZeroStage
from tests.runs_files import reread

CATALOG = load_catalog()
DATA = Path(__file__).parent / "data" / "validation"
FP16 = TrainingSpec(global_batch=64, seq_len=2048, bytes_per_param_grads=2)
GPT = CATALOG.model("gpt-39.1b")
A100 = CATALOG.system("jean-zay-a100-64")
ZERO1 = Strategy(dp=4, tp=4, pp=4, micro_batch=1, recompute=Recompute.FULL,
                 schedule=Schedule.ONE_F_ONE_B, zero=ZeroStage.OPTIMIZER)


def test_the_optimizer_state_grows_by_four_bytes_a_parameter() -> None:
    # 4 (fp32 master) + 4 + 4 (Adam's moments) + 4 (the fp32 gradient partition) = 16
    assert replace(FP16, fp32_grad_partition=True).optimizer_bytes == 16
    assert FP16.optimizer_bytes == 12  # off by default
    # BF16_Optimizer accumulates in fp32 (grad_bytes 4) and steps on that buffer: no copy
    assert replace(FP16, fp32_grad_partition=True, bytes_per_param_grads=4).optimizer_bytes == 12
    # without master weights Adam keeps its two moments in the weights' type: 2 + 2
    assert replace(FP16, fp32_grad_partition=True, master_weights=False).optimizer_bytes == 4


def test_a_stage_holds_it_sharded_as_the_states() -> None:
    """ZeRO-1 over dp 4: each stage's optimizer memory grows by 4 bytes a parameter over 4."""
    off = simcore.estimate(GPT, A100, FP16, ZERO1)
    on = simcore.estimate(GPT, A100, replace(FP16, fp32_grad_partition=True), ZERO1)
    for before, after in zip(off.stages, on.stages, strict=True):
        params = before.memory.weights / 2  # the stage's 16-bit weights, unsharded
        assert after.memory.optimizer - before.memory.optimizer == params / ZERO1.dp * 4
        assert after.memory.weights == before.memory.weights
    # the batched estimate, which searches, prices it alike
    batched = estimate_many(GPT, A100, replace(FP16, fp32_grad_partition=True), [ZERO1])
    assert float(batched.peak_memory[0]) == on.memory.total


def test_deepspeed_studies_keep_it_by_default(tmp_path: Path) -> None:
    assert fp32_grad_partition("deepspeed", FP16) is True
    assert fp32_grad_partition("deepspeed", replace(FP16, bytes_per_param_grads=4)) is None
    assert fp32_grad_partition("megatron", FP16) is None
    assert fp32_grad_partition("any", FP16) is None
    assert with_framework_defaults(FP16, "deepspeed", False).fp32_grad_partition is True
    # a study that names it keeps what it names
    named = replace(FP16, fp32_grad_partition=False)
    assert with_framework_defaults(named, "deepspeed", False).fp32_grad_partition is False
    study = tmp_path / "study.yaml"
    study.write_text("model: gpt-39.1b\nsystem: jean-zay-a100-64\nframework: deepspeed\n"
                     "training: {global_batch: 64, seq_len: 2048}\n"
                     "space: {tp: [4], pp: [4], micro_batch: [1], zero: [1]}\n")
    assert load_study_config(study).training.fp32_grad_partition is True


def test_the_runs_csv_column(tmp_path: Path) -> None:
    runs = tmp_path / "runs.csv"
    runs.write_text("model,system,global_batch,seq_len,dp,tp,pp,micro_batch,zero,recompute,"
                    "fp32_grad_partition,step_time_s\n"
                    "gpt-39.1b,jean-zay-a100-64,64,2048,4,4,4,1,1,full,true,10\n")
    (run,), _ = read_runs(runs, CATALOG)
    assert run.training.fp32_grad_partition is True


def test_planner_estimate_flag(capsys) -> None:
    args = ["estimate", "--model", "gpt-39.1b", "--system", "jean-zay-a100-64", "--dp", "4",
            "--tp", "4", "--pp", "4", "--micro-batch", "1", "--zero", "1", "--recompute",
            "full", "--global-batch", "64", "--seq-len", "2048", "--json"]
    assert main(args) == 0
    off = json.loads(capsys.readouterr().out)["memory"]["optimizer"]
    assert main([*args, "--fp32-grad-partition"]) == 0
    on = json.loads(capsys.readouterr().out)["memory"]["optimizer"]
    assert on / off == 16 / 12


def test_the_bloom_sweeps_peaks_need_it(capsys, tmp_path: Path) -> None:
    """BigScience's pre-BLOOM sweeps (DeepSpeed ZeRO-1, fp16), 31 first-node nvidia-smi peaks:
    4.2% median error with the partition held, 6.3% (-3.9% mean) without."""
    source = DATA / "bloom-sweeps-a100-check.csv"
    assert main(["validate", str(source), "--json"]) == 0
    held = json.loads(capsys.readouterr().out)
    without = tmp_path / "without.csv"
    rows = reread(source, without, fp32_grad_partition="false")
    assert all(row["fp32_grad_partition"] == "true" for row in rows)
    assert main(["validate", str(without), "--json"]) == 0
    dropped = json.loads(capsys.readouterr().out)
    assert held["memory_runs"] == dropped["memory_runs"] == 31
    assert held["memory_median_ape"] <= 0.045 < 0.06 <= dropped["memory_median_ape"]
