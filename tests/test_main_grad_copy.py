"""Megatron-LM's optimizer step copies 16-bit gradients to fp32 for the master weights
(``main_grad_copy``): ``Float16OptimizerWithFloat16Params`` sets ``main_param.grad =
model_param.main_grad.float()`` and the distributed optimizer ``shard_main_param.grad =
shard_model_grad.float()`` (NVIDIA/Megatron-LM ``megatron/core/optimizer/optimizer.py``,
``distrib_optimizer.py`` ``_copy_model_grads_to_main_grads``), 4 bytes a parameter of the
optimizer's shard, held from the step to the next ``zero_grad``, after the backward has freed
the activations. A stage's peak is then the larger of the backward's and the step's."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import simcore
from planner.catalog import load_catalog
from planner.cli import main
from search_spaces.frameworks import with_framework_defaults
from simcore.megatron.batched import estimate_many
from simcore.specs import Recompute, Schedule, Strategy, TrainingSpec, ZeroStage

CATALOG = load_catalog()
DATA = Path(__file__).parent / "data" / "validation"
V100 = CATALOG.system("jean-zay-v100-32gb-64")
GPT = CATALOG.model("gpt-39.1b")
FP16 = TrainingSpec(global_batch=64, seq_len=2048, bytes_per_param_grads=2)
PIPELINED = Strategy(dp=1, tp=4, pp=16, micro_batch=1, recompute=Recompute.FULL,
                     schedule=Schedule.ONE_F_ONE_B)


def _memory(training: TrainingSpec, strategy: Strategy = PIPELINED):  # type: ignore[no-untyped-def]
    return simcore.estimate(GPT, V100, training, strategy).memory


def test_the_step_holds_four_bytes_a_parameter_beside_the_states() -> None:
    # pp 16 with full recompute keeps little activation: the step's copy, 4 bytes a parameter
    # (twice the 16-bit weights' 2), is the peak; what it adds beyond the backward's activations
    # and buffers is the copy less them, and the stage then holds 2 + 2 + 12 + 4 = 20 bytes a
    # parameter beside the allowance (BigScience's Megatron-LM logs: "allocated" after a step is
    # exactly 20 bytes a parameter of stage 0, tests/data/validation/README.md)
    off = _memory(replace(FP16, main_grad_copy=False))
    on = _memory(replace(FP16, main_grad_copy=True))
    assert off.step_copy == 0.0
    copy = 2 * on.weights
    assert copy > on.activations + on.comm_buffers
    assert on.step_copy == pytest.approx(copy - on.activations - on.comm_buffers, rel=1e-12)
    states = on.weights + on.gradients + on.optimizer
    assert (on.total - on.overhead) / (on.weights / 2) == pytest.approx(20, rel=1e-12)
    assert on.total - off.total == pytest.approx(copy - off.activations - off.comm_buffers,
                                                 rel=1e-12)
    assert states == pytest.approx(off.weights + off.gradients + off.optimizer, rel=1e-12)


def test_a_backward_that_holds_more_is_the_peak() -> None:
    # pp 1 without recompute: the activations outweigh the copy, so the step adds nothing
    plain = Strategy(dp=16, tp=4, pp=1, micro_batch=4, recompute=Recompute.NONE)
    on = _memory(replace(FP16, main_grad_copy=True), plain)
    assert 2 * on.weights < on.activations and on.step_copy == 0.0
    assert on.total == _memory(replace(FP16, main_grad_copy=False), plain).total


def test_the_distributed_optimizer_copies_its_shard() -> None:
    # ZeRO-1 over dp 2: the copy is 4 bytes a parameter / 2, the 16-bit weights' 2 (the
    # 16-bit weights and gradients stay whole)
    system = CATALOG.system("jean-zay-v100-32gb-128")
    sharded = replace(PIPELINED, dp=2, zero=ZeroStage.OPTIMIZER)
    on = simcore.estimate(GPT, system, replace(FP16, main_grad_copy=True), sharded).memory
    copy = 4 * (on.weights / 2) / 2
    assert on.step_copy == pytest.approx(max(0.0, copy - on.activations - on.comm_buffers),
                                         rel=1e-12)
    assert on.step_copy > 0.0


@pytest.mark.parametrize("training", [
    replace(FP16, main_grad_copy=True, bytes_per_param_grads=4),  # fp32 buffer: .float() is it
    replace(FP16, main_grad_copy=True, master_weights=False),  # no fp32 master to copy for
    replace(FP16, main_grad_copy=None),  # the default: off
], ids=["fp32-gradients", "no-master-weights", "default"])
def test_no_copy_where_the_optimizer_makes_none(training: TrainingSpec) -> None:
    assert _memory(training).step_copy == 0.0


def test_zero_2_and_3_make_none() -> None:
    for zero in (ZeroStage.GRADIENTS, ZeroStage.PARAMETERS):
        strategy = replace(PIPELINED, pp=1, dp=16, zero=zero)
        assert _memory(replace(FP16, main_grad_copy=True), strategy).step_copy == 0.0


def test_a_megatron_study_copies_16_bit_gradients_only() -> None:
    def resolved(framework: str, training: TrainingSpec) -> bool | None:
        return with_framework_defaults(training, framework, False).main_grad_copy

    assert resolved("megatron", FP16) is True
    assert resolved("megatron", replace(FP16, bytes_per_param_grads=4)) is None
    assert resolved("megatron", replace(FP16, master_weights=False)) is None
    assert resolved("megatron", replace(FP16, main_grad_copy=False)) is False
    for framework in ("any", "deepspeed", "torchtitan"):
        assert resolved(framework, FP16) is None


def test_the_batched_estimate_takes_the_larger_peak_too() -> None:
    training = replace(FP16, main_grad_copy=True)
    strategies = [replace(PIPELINED, dp=16 // pp, pp=pp, micro_batch=mb, recompute=recompute)
                  for pp in (1, 4, 16) for mb in (1, 4)
                  for recompute in (Recompute.FULL, Recompute.NONE)]
    result = estimate_many(GPT, V100, training, strategies)
    for i, strategy in enumerate(strategies):
        est = simcore.estimate(GPT, V100, training, strategy)
        assert float(result.memory.step_copy[i]) == est.memory.step_copy, strategy
        assert float(result.peak_memory[i]) == est.memory.total, strategy
        assert int(result.peak_stage[i]) == est.peak_stage, strategy
    assert any(result.memory.step_copy > 0) and any(result.memory.step_copy == 0)


def test_the_csv_column_and_the_estimate_option(tmp_path: Path, capsys) -> None:
    from tests.study_files import one_run

    row = {"model": "gpt-39.1b", "system": "jean-zay-v100-32gb-64", "global_batch": 16,
           "seq_len": 2048, "dp": 1, "tp": 4, "pp": 16, "micro_batch": 1, "recompute": "full",
           "step_time_s": 3.0, "framework": "megatron"}
    assert one_run(tmp_path, row).training.main_grad_copy is True  # Megatron-LM's default
    assert one_run(tmp_path, {**row, "main_grad_copy": "false"}).training.main_grad_copy is False
    args = ["estimate", "--model", "gpt-39.1b", "--system", "jean-zay-v100-32gb-64",
            "--dp", "1", "--tp", "4", "--pp", "16", "--micro-batch", "1", "--recompute",
            "full", "--global-batch", "16", "--seq-len", "2048", "--json"]
    totals = {}
    for flag in ("--main-grad-copy", "--no-main-grad-copy"):
        assert main([*args, flag]) == 0
        totals[flag] = json.loads(capsys.readouterr().out)["memory"]["total"]
    assert totals["--main-grad-copy"] > totals["--no-main-grad-copy"]


def test_bigscience_megatron_v100_peaks(capsys) -> None:
    # BigScience's Megatron-LM runs of May 2021 on Jean Zay V100 32GB (bigscience@9e64ede
    # experiments/gpt2-meg/*.out): stage 0's max allocated 26204.6 / 22113.1 / 24762.8 /
    # 23405.1 / 22769.7 MiB for 18B-206B at tp 4 x pp 4-64, fp16. Without the step's copy they
    # were estimated -27.0, -27.5, -27.9, -28.7, -29.8%; with it -11.8..-14.8%. The rest is that
    # release's own (README, "Megatron-LM's fp32 gradient copy at the step"): its copy stayed
    # resident until the next step's, and its local DDP flattened the gradients to reduce them.
    assert main(["validate", str(DATA / "bigscience-megatron-v100-check.csv"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [row["measured_peak_memory_gb"] for row in rows] == [27.4775, 23.1872, 25.9657,
                                                                  24.542, 23.8758]
    assert all(-0.16 < row["memory_error"] < -0.10 for row in rows), rows


def test_a_megatron_study_records_the_copy(tmp_path: Path) -> None:
    # the study's stored settings say so, so a study priced before the copy was counted is not
    # resumed as the same study (its fingerprint differs: tests/test_runner.py's resume rule)
    from planner.study_config import load_study_config

    def config(framework: str):  # type: ignore[no-untyped-def]
        path = tmp_path / f"{framework}.yaml"
        path.write_text(f"model: llama3-8b\nsystem: dgx-a100-8\nframework: {framework}\n"
                        "training: {global_batch: 16, seq_len: 4096}\n"
                        "space: {tp: [1, 2], pp: [1], micro_batch: [1]}\n")
        return load_study_config(path)

    megatron, any_ = config("megatron"), config("any")
    assert megatron.training.main_grad_copy is True
    assert megatron.summary()["main_grad_copy"] is True and "main_grad_copy" not in any_.summary()
    assert megatron.fingerprint() != replace(megatron, training=replace(
        megatron.training, main_grad_copy=None)).fingerprint()


def test_planner_estimate_says_where_the_stage_peaks(capsys) -> None:
    args = ["estimate", "--model", "gpt-39.1b", "--system", "jean-zay-v100-32gb-64", "--dp", "1",
            "--tp", "4", "--pp", "16", "--micro-batch", "1", "--recompute", "full",
            "--global-batch", "16", "--seq-len", "2048"]
    assert main([*args, "--framework", "megatron"]) == 0
    assert "the stage peaks at the optimizer step" in capsys.readouterr().out
    assert main(args) == 0  # framework any: no copy counted, nothing said
    assert "optimizer step" not in capsys.readouterr().out
