"""Full recompute that stops early (``recompute_early_stop``): PyTorch's non-reentrant
activation checkpointing stops each layer's recompute at the last tensor its backward saved
(``torch.utils.checkpoint``: "Non-reentrant checkpoint stops recomputation as soon as all
needed intermediate activations have been recomputed. This feature is enabled by default"), so
the layer's FC2, its tp collective and the residual add after it are not run again. Megatron-LM's
and DeepSpeed's checkpointing re-run the whole layer."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from planner.catalog import load_catalog
from planner.cli import main
from planner.runs_csv import read_runs
from planner.study_config import load_study_config
from planner.validation import validate
from simcore.megatron.plan import StepPlan
from simcore.megatron.stack import uses_recompute_early_stop
from simcore.megatron.step import layer_time
from simcore.specs import Recompute, Strategy, TrainingSpec, ZeroStage

CATALOG = load_catalog()
A100 = CATALOG.system("dgx-a100-8")
H100 = CATALOG.system("dgx-h100-8")
GPT = CATALOG.model("gpt-1.7b")  # 24 layers, hidden 2304, FFN 9216, dropout (the GPT family)
TRAINING = TrainingSpec(global_batch=64, seq_len=2048)
FSDP_FULL = Strategy(dp=8, zero=ZeroStage.PARAMETERS, recompute=Recompute.FULL, micro_batch=2)
VALIDATION = Path(__file__).parent / "data" / "validation"
STUDIES = Path(__file__).resolve().parent.parent / "studies"


def _backward(training: TrainingSpec, strategy: Strategy = FSDP_FULL) -> float:
    return layer_time(GPT, A100, training, strategy)[1]  # backward with its recompute


def test_the_recompute_skips_fc2_and_the_residual_add() -> None:
    # One micro-batch of 2 x 2,048 = 4,096 tokens on one A100 (tp 1), worked by hand:
    # - FC2 forward, (4096 x 9216) @ (9216 x 2304): 2 x 4096 x 2304 x 9216 FLOPs over
    #   ceil(4096/128) x ceil(2304/128) = 32 x 18 = 576 output tiles, 6 waves of the 108 SMs
    #   (576 / 648 busy), plus the device's fixed time of each of the 6 waves (gemm_wave_us);
    #   its 2 x (4096 x 9216 + 9216 x 2304 + 4096 x 2304) bytes take less;
    # - the residual add: two 4096 x 2304 bf16 reads and a write, and GPT's 1-byte dropout mask.
    d = A100.device
    flops = 2 * 4096 * 2304 * 9216
    fc2 = flops / (d.peak_flops_per_s * d.matmul_efficiency * 576 / 648) + 6 * d.gemm_wave_s
    fc2_bytes = 2 * (4096 * 9216 + 9216 * 2304 + 4096 * 2304) / (
        d.hbm_bandwidth_bytes_per_s * d.memory_efficiency)
    assert fc2 > fc2_bytes
    residual = (3 * 4096 * 2304 * 2 + 4096 * 2304) / (
        d.hbm_bandwidth_bytes_per_s * d.memory_efficiency)
    assert residual > d.kernel_launch_s
    whole = _backward(replace(TRAINING, recompute_early_stop=False))
    early = _backward(replace(TRAINING, recompute_early_stop=True))
    assert whole - early == pytest.approx(fc2 + residual, rel=1e-9)


def test_with_tp_the_fc2_collective_is_not_run_again() -> None:
    # tp 2 without sequence parallelism: the forward all-reduces twice (after the attention's
    # output projection and after FC2); the early stop skips the second
    strategy = replace(FSDP_FULL, dp=4, tp=2, sequence_parallel=False)
    early = StepPlan(GPT, A100, replace(TRAINING, recompute_early_stop=True), strategy)
    whole_training = replace(TRAINING, recompute_early_stop=False)
    whole = StepPlan(GPT, A100, whole_training, strategy)
    from simcore.megatron.layer_step import dense_layer

    skipped = dense_layer(whole).tp_bwd - dense_layer(early).tp_bwd
    assert skipped == pytest.approx(dense_layer(whole).tp_fwd / 2, rel=1e-12)
    assert dense_layer(whole).recompute - dense_layer(early).recompute == pytest.approx(
        early.kernels.forward_tail, rel=1e-12)


def test_the_stack_decides_by_default_and_the_training_overrides() -> None:
    for zero in (ZeroStage.GRADIENTS, ZeroStage.PARAMETERS):  # the PyTorch FSDP stack
        assert uses_recompute_early_stop(A100, TRAINING, zero)
        assert uses_recompute_early_stop(H100, TRAINING, zero)
    for zero in (ZeroStage.NONE, ZeroStage.OPTIMIZER):  # Megatron-LM, Megatron-DeepSpeed
        assert not uses_recompute_early_stop(A100, TRAINING, zero)
    # Megatron-FSDP (ZeRO-3 with Transformer Engine) checkpoints as Megatron-LM does
    te = replace(TRAINING, transformer_engine=True)
    assert not uses_recompute_early_stop(H100, te, ZeroStage.PARAMETERS)
    assert not uses_recompute_early_stop(A100, replace(TRAINING, recompute_early_stop=False),
                                         ZeroStage.PARAMETERS)
    assert uses_recompute_early_stop(A100, replace(TRAINING, recompute_early_stop=True),
                                     ZeroStage.OPTIMIZER)
    # only full recompute re-runs the layer; selective recompute re-runs the attention core
    selective = replace(FSDP_FULL, recompute=Recompute.SELECTIVE)
    assert layer_time(GPT, A100, replace(TRAINING, recompute_early_stop=True), selective) == \
        layer_time(GPT, A100, replace(TRAINING, recompute_early_stop=False), selective)
    assert not StepPlan(GPT, A100, TRAINING, selective).early_stop


def test_framework_studies_say_what_their_checkpointing_does() -> None:
    # torchtitan's checkpoint_wrapper is given early_stop=False (b5bcd76c
    # torchtitan/distributed/activation_checkpoint.py): whole layers re-run, as Megatron-LM's
    hsdp = load_study_config(STUDIES / "llama3-70b-h100-hsdp.yaml")  # framework: torchtitan
    assert hsdp.training.recompute_early_stop is False
    megatron = load_study_config(STUDIES / "mixtral-8x7b-h100-64.yaml")  # framework: megatron
    assert megatron.training.recompute_early_stop is False
    gpt3 = load_study_config(STUDIES / "gpt3-175b-h100-fp8.yaml")  # framework: any
    assert gpt3.training.recompute_early_stop is None  # the plan's stack decides


def test_a_study_that_says_yes_as_a_string_is_one_line(tmp_path: Path, capsys) -> None:
    text = (STUDIES / "gpt3-175b-h100-fp8.yaml").read_text()
    flow = "training: {global_batch: 1536, seq_len: 2048}"
    assert flow in text
    path = tmp_path / "study.yaml"
    path.write_text(text.replace(flow, flow[:-1] + ", recompute_early_stop: 'yes'}"))
    assert main(["run", str(path), "--storage", str(tmp_path / "studies") + "/"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "training.recompute_early_stop" in err[0], err


def test_a_runs_csv_column_and_planner_estimate_flag_set_it(tmp_path: Path, capsys) -> None:
    row = "gpt-1.7b,dgx-a100-8,64,2048,8,1,1,2,3,full"
    header = "model,system,global_batch,seq_len,dp,tp,pp,micro_batch,zero,recompute"
    path = tmp_path / "runs.csv"
    path.write_text(f"{header},recompute_early_stop,step_time_s\n{row},false,1\n{row},,1\n")
    runs, skipped = read_runs(path, CATALOG)
    assert skipped == []
    assert [r.training.recompute_early_stop for r in runs] == [False, None]
    whole, early = (r.predicted_step_time_s for r in validate(runs).results)
    assert whole > early
    args = ["estimate", "--model", "gpt-1.7b", "--system", "dgx-a100-8", "--dp", "8",
            "--zero", "3", "--recompute", "full", "--micro-batch", "2", "--global-batch", "64",
            "--json"]
    assert main([*args, "--no-recompute-early-stop"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time"] == pytest.approx(whole, rel=1e-12)
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["step_time"] == pytest.approx(early, rel=1e-12)


def test_llm_foundrys_checkpointed_runs_are_no_longer_estimated_slow_as_a_group() -> None:
    # llm-foundry's A100 and H100 tables (fit and check files: 78 rows with activation
    # checkpointing, "act", 131 without, "acf"). Priced as re-running the whole layer, the
    # checkpointed rows came out 9.7 points slower than the others on average (+5.1% against
    # -4.6%); with the early stop llm-foundry's PyTorch checkpointing does, 3.6 points. (With
    # the GEMM wave time and the refit A100 and H100: 8.5 points whole, 2.4 with the early stop.)
    runs = []
    for name in ("a100-fit.csv", "a100-check.csv", "h100-fit.csv", "h100-check.csv"):
        runs += read_runs(VALIDATION / name, CATALOG)[0]
    act = [r for r in runs if " act " in r.name]
    acf = [r for r in runs if " acf " in r.name]
    assert (len(act), len(acf)) == (78, 131)

    def mean_error(rows: list, early_stop: bool | None) -> float:
        rows = [replace(r, training=replace(r.training, recompute_early_stop=early_stop))
                for r in rows]
        return statistics.mean(x.step_time_error for x in validate(rows).results)

    gap = mean_error(act, None) - mean_error(acf, None)
    assert math.fabs(gap) <= 0.04
    assert mean_error(act, False) - mean_error(acf, None) >= 0.08
