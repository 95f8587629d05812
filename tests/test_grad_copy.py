"""DeepSpeed's BF16_Optimizer keeps each parameter's bf16 ``.grad`` beside its fp32 gradient
buffer (``grad_copy``): deepspeedai/DeepSpeed@edaa7221 ``deepspeed/runtime/bf16_optimizer.py``
allocates ``fp32_groups_gradients_flat`` as ``zeros_like`` the whole flat bf16 group (unsharded)
and ``clear_lp_grads`` zeroes the bf16 ``.grad`` without freeing it; the fp32 master weights and
Adam's moments are sharded over the data-parallel ranks (``fp32_groups_flat_partition``)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import simcore
from planner.catalog import load_catalog
from planner.cli import main
from planner.exports._deepspeed import ds_config
from planner.plan import make_plan
from search_spaces.frameworks import why_not, with_framework_defaults
from simcore.megatron.states import model_state_bytes
from simcore.specs import Convention, Recompute, Strategy, TrainingSpec, ZeroStage
from tests.study_files import one_run

CATALOG = load_catalog()


def test_bf16_optimizer_bytes_per_parameter() -> None:
    # 7.5B parameters over 64 data-parallel ranks (Rajbhandari et al.'s example): bf16 weights
    # 2 + bf16 .grad 2 + fp32 gradient buffer 4 + (fp32 master 4 + Adam 8) / 64 = 8.1875 bytes a
    # parameter, 61.4 GB; without the copy (Megatron-LM's fp32 main_grad) 6.1875, 46.4 GB.
    fp32 = TrainingSpec(global_batch=1, seq_len=1, bytes_per_param_grads=4)
    with_copy = sum(model_state_bytes(7.5e9, replace(fp32, grad_copy=True),
                                      ZeroStage.OPTIMIZER, 64))
    assert with_copy / 1e9 == pytest.approx(7.5 * 8.1875, rel=1e-12)
    assert sum(model_state_bytes(7.5e9, fp32, ZeroStage.OPTIMIZER, 64)) / 1e9 == pytest.approx(
        7.5 * 6.1875, rel=1e-12)


def test_zero_2_and_3_keep_no_copy() -> None:
    # DeepSpeed runs ZeRO-2/3 with its ZeRO optimizer, not the BF16_Optimizer
    t = TrainingSpec(global_batch=1, seq_len=1, bytes_per_param_grads=4)
    for zero in (ZeroStage.GRADIENTS, ZeroStage.PARAMETERS):
        assert model_state_bytes(1e9, replace(t, grad_copy=True), zero, 8) == \
            model_state_bytes(1e9, t, zero, 8)


def test_the_estimate_adds_two_bytes_a_parameter_of_the_stage() -> None:
    model, system = CATALOG.model("llama3-8b"), CATALOG.system("dgx-a100-8")
    training = TrainingSpec(global_batch=64, seq_len=4096, bytes_per_param_grads=4)
    s = Strategy(dp=4, pp=2, zero=ZeroStage.OPTIMIZER, recompute=Recompute.FULL)
    plain = simcore.estimate(model, system, training, s)
    copy = simcore.estimate(model, system, replace(training, grad_copy=True), s)
    stage = max(plain.stages, key=lambda st: st.memory.total)
    params = stage.memory.gradients / 4  # fp32 gradients, unsharded under ZeRO-1
    assert copy.memory.gradients - plain.memory.gradients == pytest.approx(2 * params)
    # the step but its optimizer is the same; the optimizer step also zeroes the copy
    assert replace(copy.time, optimizer=0.0) == replace(plain.time, optimizer=0.0)
    assert copy.time.optimizer > plain.time.optimizer


def test_a_deepspeed_study_with_fp32_accumulation_prices_and_exports_it() -> None:
    fp32 = TrainingSpec(global_batch=64, seq_len=4096, bytes_per_param_grads=4)
    assert with_framework_defaults(fp32, "deepspeed", False).grad_copy is True
    assert with_framework_defaults(replace(fp32, bytes_per_param_grads=2), "deepspeed",
                                   False).grad_copy is None
    assert with_framework_defaults(fp32, "megatron", False).grad_copy is None
    # the export asks DeepSpeed for that accumulation (docs/_pages/config-json.md data_types)
    model, system = CATALOG.model("llama3-8b"), CATALOG.system("dgx-a100-8")
    s = Strategy(dp=4, pp=2, zero=ZeroStage.OPTIMIZER, recompute=Recompute.FULL)
    plan = make_plan(model, system, with_framework_defaults(fp32, "deepspeed", False), s,
                     Convention.MEGATRON)
    assert ds_config(plan)["data_types"] == {"grad_accum_dtype": "fp32"}
    bf16 = make_plan(model, system, replace(fp32, bytes_per_param_grads=2), s,
                     Convention.MEGATRON)
    assert "data_types" not in ds_config(bf16)
    # engine.py _do_optimizer_sanity_check: without ZeRO the mix of dtypes is refused
    assert "use zero 1" in why_not("deepspeed", model, fp32,
                                   replace(s, pp=1, dp=8, zero=ZeroStage.NONE))


def test_a_csv_column_and_a_cli_flag(tmp_path: Path, capsys) -> None:
    run = one_run(tmp_path, {"model": "llama3-8b", "system": "dgx-a100-8", "global_batch": 64,
                             "seq_len": 4096, "dp": 4, "tp": 1, "pp": 2, "micro_batch": 1,
                             "zero": 1, "grad_bytes": 4, "grad_copy": "true",
                             "peak_memory_gb": 60})
    assert run.training.grad_copy is True
    args = ["estimate", "--model", "llama3-8b", "--system", "dgx-a100-8", "--pp", "2",
            "--zero", "1", "--grad-bytes", "4", "--global-batch", "64", "--seq-len", "4096",
            "--json"]
    assert main([*args, "--grad-copy"]) == 0
    with_copy = json.loads(capsys.readouterr().out)["peak_memory"]
    assert main(args) == 0
    without = json.loads(capsys.readouterr().out)["peak_memory"]
    api = simcore.estimate(CATALOG.model("llama3-8b"), CATALOG.system("dgx-a100-8"),
                           TrainingSpec(global_batch=64, seq_len=4096, bytes_per_param_grads=4,
                                        grad_copy=True),
                           Strategy(dp=4, pp=2, zero=ZeroStage.OPTIMIZER))
    assert with_copy == api.memory.total > without
