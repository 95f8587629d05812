"""Megatron-Core with Transformer Engine (``transformer_engine``): the attention core in TE's
fused kernel at the device's fused_attention_efficiency, and with sequence parallelism the tp
collectives overlapped with the linear layers' GEMMs (``--tp-comm-overlap``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from planner.catalog import load_catalog
from planner.exports import export_files
from planner.plan import make_plan
from planner.study_config import load_study_config
from simcore.megatron.calls import tp_pair_calls
from simcore.megatron.layer_step import dense_layer
from simcore.megatron.plan import StepPlan
from simcore.megatron.stack import uses_transformer_engine
from simcore.specs import Convention, Schedule, Strategy, TrainingSpec, ZeroStage

CATALOG = load_catalog()
H100 = CATALOG.system("dgx-h100-8")
A100 = CATALOG.system("dgx-a100-8")
LLAMA2_7B = CATALOG.model("llama2-7b")
TRAINING = TrainingSpec(global_batch=128, seq_len=4096)


def test_h100_era_parts_default_to_it_and_the_training_decides() -> None:
    for zero in (ZeroStage.NONE, ZeroStage.OPTIMIZER):  # Megatron's distributed optimizer
        assert uses_transformer_engine(H100, TRAINING, zero)
        assert not uses_transformer_engine(A100, TRAINING, zero)
        assert not uses_transformer_engine(H100, replace(TRAINING, transformer_engine=False),
                                           zero)
        assert uses_transformer_engine(A100, replace(TRAINING, transformer_engine=True), zero)


def test_zero_2_and_3_plans_default_to_the_pytorch_stack() -> None:
    # every ZeRO-2/3 H100 run of tests/data/validation (llm-foundry, torchtitan, NeMo AutoModel)
    # is PyTorch FSDP without Transformer Engine; the training's word still decides
    for zero in (ZeroStage.GRADIENTS, ZeroStage.PARAMETERS):
        assert not uses_transformer_engine(H100, TRAINING, zero)
        assert uses_transformer_engine(H100, replace(TRAINING, transformer_engine=True), zero)
    fsdp = StepPlan(LLAMA2_7B, H100, TRAINING, Strategy(dp=8, zero=ZeroStage.PARAMETERS))
    classic = StepPlan(LLAMA2_7B, H100, replace(TRAINING, transformer_engine=False),
                       Strategy(dp=8, zero=ZeroStage.PARAMETERS))
    assert not fsdp.te
    assert fsdp.kernels.core_forward == classic.kernels.core_forward


def test_attention_runs_at_the_fused_kernels_efficiency() -> None:
    # Llama 2 7B, one micro-batch of 4,096 tokens, tp 1: the causal attention core's forward is
    # 4 s^2 h / 2 FLOPs (QK^T and PV, half the square) = 4 x 4096^2 x 4096 / 2
    flops = 4 * 4096**2 * 4096 / 2
    device = H100.device
    strategy = Strategy(dp=8)
    te = StepPlan(LLAMA2_7B, H100, TRAINING, strategy)
    classic = StepPlan(LLAMA2_7B, H100, replace(TRAINING, transformer_engine=False), strategy)
    assert te.kernels.core_forward == pytest.approx(
        flops / (device.peak_flops_per_s * device.fused_attention_efficiency), rel=1e-12)
    assert classic.kernels.core_forward == pytest.approx(
        flops / (device.peak_flops_per_s * device.attention_efficiency), rel=1e-12)


def test_tp_collectives_hide_behind_the_gemms_only_with_sequence_parallelism() -> None:
    slowdown = H100.device.overlap_slowdown

    def hidden(comm: float, compute: float) -> float:
        return max(0.0, comm - compute) + slowdown * min(comm, compute)

    p = StepPlan(LLAMA2_7B, H100, TRAINING, Strategy(dp=1, tp=8))
    tp = 2 * p.comm.total(tp_pair_calls(p))
    layer = dense_layer(p)
    assert layer.tp_fwd == pytest.approx(hidden(tp, p.kernels.gemm_forward), rel=1e-12)
    assert layer.tp_bwd == pytest.approx(
        hidden(tp, p.kernels.gemm_dgrad + p.kernels.wgrad), rel=1e-12)
    # Megatron-LM refuses --tp-comm-overlap without --sequence-parallel (arguments.py d98e8a64)
    plain = StepPlan(LLAMA2_7B, H100, TRAINING, Strategy(dp=1, tp=8, sequence_parallel=False))
    assert dense_layer(plain).tp_fwd == 2 * plain.comm.total(tp_pair_calls(plain))


def test_megatron_export_asks_for_the_overlap_it_was_estimated_with() -> None:
    training = TrainingSpec(global_batch=64, seq_len=4096)
    on_h100 = make_plan(LLAMA2_7B, H100, training, Strategy(dp=1, tp=8), Convention.MEGATRON)
    on_a100 = make_plan(LLAMA2_7B, A100, training, Strategy(dp=1, tp=8), Convention.MEGATRON)
    assert "--tp-comm-overlap" in export_files(on_h100, "megatron")["megatron.sh"]
    assert "--tp-comm-overlap" not in export_files(on_a100, "megatron")["megatron.sh"]


# GPT-3 175B (96 heads: tp 16 divides them) on 16 DGX H100 nodes, pp 8, micro-batch 4
GPT3 = CATALOG.model("gpt3-175b")
H100_128 = CATALOG.system("dgx-h100-128")
GPT3_TRAINING = TrainingSpec(global_batch=256, seq_len=2048)


def _gpt3_strategy(tp: int) -> Strategy:
    return Strategy(dp=16 // tp, tp=tp, pp=8, micro_batch=4)


def _gpt3(tp: int, training: TrainingSpec = GPT3_TRAINING) -> StepPlan:
    return StepPlan(GPT3, H100_128, training, _gpt3_strategy(tp))


def test_tp_across_nodes_runs_its_collectives_without_the_overlap() -> None:
    """Userbuffers reach the tp ranks over NVLink only ("Tensor-parallel GPUs must be on a
    single node, and connected over NVLink/NVSwitch", TransformerEngine@d0067d0
    examples/pytorch/comm_gemm_overlap/README.md): tp 16 over two 8-GPU nodes times its
    collectives as a run without --tp-comm-overlap does, tp 8 within a node keeps it."""
    off = replace(GPT3_TRAINING, tp_comm_overlap=False)
    assert _gpt3(8).tp_overlap and not _gpt3(8, off).tp_overlap
    assert not _gpt3(16).tp_overlap
    across, asked_off = dense_layer(_gpt3(16)), dense_layer(_gpt3(16, off))
    assert (across.tp_fwd, across.tp_bwd) == (asked_off.tp_fwd, asked_off.tp_bwd)
    p = _gpt3(16)  # the forward's two tp pairs wait in full, as without sequence parallelism
    assert across.tp_fwd == 2 * p.comm.total(tp_pair_calls(p))
    # on an NVL72 rack the NVLink domain holds tp 16: the overlap stays
    rack = StepPlan(GPT3, CATALOG.system("dgx-gb200-64"), GPT3_TRAINING,
                    Strategy(dp=1, tp=16, pp=4, micro_batch=4))
    assert rack.tp_overlap


def test_megatron_export_leaves_the_overlap_out_when_tp_leaves_the_node() -> None:
    # as written, --tp-comm-overlap at tp 16 over two nodes would not start (TE's userbuffers)
    plans = {tp: make_plan(GPT3, H100_128, GPT3_TRAINING, _gpt3_strategy(tp), Convention.MEGATRON)
             for tp in (8, 16)}
    assert "--tp-comm-overlap" in export_files(plans[8], "megatron")["megatron.sh"]
    assert "--tp-comm-overlap" not in export_files(plans[16], "megatron")["megatron.sh"]


def test_torchtitan_and_deepspeed_studies_are_estimated_without_it() -> None:
    root = Path(__file__).resolve().parent.parent / "studies"
    hsdp = load_study_config(root / "llama3-70b-h100-hsdp.yaml")  # framework: torchtitan
    assert hsdp.training.transformer_engine is False
    megatron = load_study_config(root / "mixtral-8x7b-h100-64.yaml")  # framework: megatron
    assert megatron.training.transformer_engine is True  # the device's, for Megatron-FSDP too
    gpt3 = load_study_config(root / "gpt3-175b-h100-fp8.yaml")  # framework: any
    assert gpt3.training.transformer_engine is None  # the plan's ZeRO stage decides


def test_a_device_entry_flag_that_is_not_a_boolean_is_one_line(tmp_path: Path) -> None:
    from planner.catalog import device_from_entry
    from planner.errors import PlannerUsageError

    entry = {"peak_tflops": 989.4, "hbm_gb": 80, "hbm_bandwidth_gbps": 3350,
             "transformer_engine": "yes"}
    with pytest.raises(PlannerUsageError, match=r"gpus\.yaml.*mine\.transformer_engine.*true or"):
        device_from_entry(tmp_path / "gpus.yaml", "mine", entry)


def test_interleaved_pipeline_transfers_hide_behind_an_ops_compute() -> None:
    # Megatron-Core's overlap_p2p_comm with virtual stages: each send is exposed only where it
    # outlasts one op's compute (the stage's kernels per micro-batch over its 2 v ops), plus the
    # compute's slowdown beside it; 1F1B and the classic stack wait for the whole send
    from simcore.megatron.step import _ends, _stage, pp_exposed, pp_send

    system = CATALOG.system("dgx-h100-16")
    training = TrainingSpec(global_batch=64, seq_len=4096)
    slowdown = system.device.overlap_slowdown
    interleaved = Strategy(dp=2, tp=4, pp=2, schedule=Schedule.INTERLEAVED, v=4)
    p = StepPlan(LLAMA2_7B, system, training, interleaved)
    stage = _stage(p, dense_layer(p), _ends(p), 0)
    send, op = pp_send(p), stage.compute / (2 * 4)
    assert pp_exposed(p, stage.compute) == max(0.0, send - op) + slowdown * min(send, op)
    assert stage.pp == 2 * 4 * pp_exposed(p, stage.compute)
    assert pp_exposed(p, stage.compute) < send  # the send is shorter than an op here
    one_f_one_b = StepPlan(LLAMA2_7B, system, training, Strategy(dp=2, tp=4, pp=2))
    assert pp_exposed(one_f_one_b, stage.compute) == pp_send(one_f_one_b)
    classic = StepPlan(LLAMA2_7B, system, replace(training, transformer_engine=False),
                       interleaved)
    assert pp_exposed(classic, stage.compute) == pp_send(classic)


def test_planner_estimate_says_which_stack(capsys) -> None:
    import json

    from planner.cli import main

    args = ["estimate", "--model", "llama3-8b", "--system", "dgx-h100-8", "--global-batch", "64"]
    assert main(args) == 0
    assert "Megatron-Core + Transformer Engine" in capsys.readouterr().out.splitlines()[0]
    assert main([*args, "--no-transformer-engine", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["transformer_engine"] is False
    assert main([*args, "--zero", "3", "--json"]) == 0  # FSDP: the PyTorch stack by default
    assert json.loads(capsys.readouterr().out)["transformer_engine"] is False
