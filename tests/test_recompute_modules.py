"""Megatron-LM's ``--recompute-modules`` (``recompute_modules``): what selective recompute runs
again, module by module (NVIDIA/Megatron-LM@d98e8a64 ``transformer_config.py``): the attention
core, multi-head latent attention's up projections (output-discarding checkpointing: the layer
keeps the compressed latents, not the heads' Q, K and V) and a dense layer's MLP."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import simcore
from planner.catalog import load_catalog
from planner.cli import main
from planner.exports import export_files
from planner.plan import make_plan
from search_spaces.frameworks import why_not
from simcore.megatron.activations import layer_activations
from simcore.megatron.layers import layer_shape
from simcore.specs import (
    Convention,
    Family,
    ModelSpec,
    Recompute,
    RecomputeModule,
    Strategy,
    TrainingSpec,
    ZeroStage,
)
from tests.study_files import one_run

CATALOG = load_catalog()
CORE, MLA, MLP = RecomputeModule.CORE_ATTN, RecomputeModule.MLA_UP_PROJ, RecomputeModule.MLP
GPT22B = ModelSpec(name="gpt-22b", family=Family.GPT, layers=48, hidden=6144, ffn_hidden=24576,
                   heads=64, vocab=51200, seq_len=2048, tied_embeddings=True)


def _kept(model: ModelSpec, modules, *, tp: int, seq: int, ffn: int | None = None) -> float:
    return layer_activations(model, layer_shape(model), micro_batch=1, seq_len=seq, tp=tp, sp=1,
                             sequence_parallel=True, recompute=Recompute.SELECTIVE, flash=True,
                             modules=frozenset(modules), ffn=ffn).stored


def test_mla_up_proj_keeps_the_latents_instead_of_q_k_and_v() -> None:
    # DeepSeek-V3 (catalog: 128 heads of mean width 160 over h 7168, so Q, K and V are each
    # 2 x 128 x 160 / 7168 s b h bytes) at tp 2, s 4096: the up projections' outputs, split by
    # tp, go; the latents (q_lora_rank 1536 + kv_lora_rank 512 + rope 64 = 2112 a token,
    # 16-bit, on every tp rank) stay: 3 x 2 x 20480 x 4096 / 2 - 2 x 2112 x 4096 bytes.
    model = CATALOG.model("deepseek-v3")
    dropped = (_kept(model, [CORE], tp=2, seq=4096)
               - _kept(model, [CORE, MLA], tp=2, seq=4096))
    assert dropped == pytest.approx(3 * 2 * 20480 * 4096 / 2 - 2 * 2112 * 4096, rel=1e-12)


def test_mlp_drops_fc1_and_gelu_outputs_of_a_dense_layer_only() -> None:
    # Korthikanti et al. 2022 section 4.1: a GPT MLP keeps fc1's output (8 s b h) and GELU's
    # (8 s b h) besides its input: 16 s b h / t with sequence parallelism at tp 8.
    s, h, t = 2048, 6144, 8
    dropped = _kept(GPT22B, [CORE], tp=t, seq=s) - _kept(GPT22B, [CORE, MLP], tp=t, seq=s)
    assert dropped == pytest.approx(16 * s * h / t, rel=1e-12)
    # an MoE layer's attention part (its FFN the shared experts', here none) keeps them all
    moe_part = _kept(GPT22B, [CORE], tp=t, seq=s, ffn=0)
    assert _kept(GPT22B, [CORE, MLP], tp=t, seq=s, ffn=0) == moe_part


def test_each_module_runs_its_forward_again() -> None:
    # HFU counts what runs again: the MLP module adds each dense layer's MLP forward,
    # 2 x s x 8 h^2 FLOP a sequence and layer (GPT: fc1 and fc2, h x 4h each).
    system = CATALOG.system("dgx-a100-8")
    training = TrainingSpec(global_batch=8, seq_len=2048)
    s = Strategy(dp=1, tp=8, micro_batch=1, recompute=Recompute.SELECTIVE)
    core = simcore.estimate(GPT22B, system, replace(training, recompute_modules=(CORE,)), s)
    both = simcore.estimate(GPT22B, system, replace(training, recompute_modules=(CORE, MLP)), s)
    mlp_flops = 48 * 2 * 2048 * 8 * 6144**2 * 8
    assert both.hardware_flops - core.hardware_flops == pytest.approx(mlp_flops, rel=1e-12)
    assert both.time.compute > core.time.compute and both.memory.total < core.memory.total
    # the attention core alone is Megatron-LM's default selective recompute
    plain = simcore.estimate(GPT22B, system, training, s)
    assert (core.step_time, core.memory.total) == (plain.step_time, plain.memory.total)


def test_an_all_moe_model_has_no_mlp_module_to_recompute() -> None:
    # Qwen3-30B-A3B: every layer MoE ("mlp: recompute the dense MLP submodule")
    model, system = CATALOG.model("qwen3-30b-a3b"), CATALOG.system("dgx-h100-16")
    training = TrainingSpec(global_batch=64, seq_len=4096)
    s = Strategy(dp=16, ep=16, zero=ZeroStage.OPTIMIZER, recompute=Recompute.SELECTIVE)
    core = simcore.estimate(model, system, replace(training, recompute_modules=(CORE,)), s)
    both = simcore.estimate(model, system, replace(training, recompute_modules=(CORE, MLP)), s)
    assert (both.step_time, both.memory.total) == (core.step_time, core.memory.total)


def test_mla_up_proj_needs_latent_attention() -> None:
    training = TrainingSpec(global_batch=8, seq_len=2048, recompute_modules=(MLA,))
    with pytest.raises(ValueError, match="mla_up_proj needs multi-head latent attention"):
        simcore.estimate(GPT22B, CATALOG.system("dgx-a100-8"), training,
                         Strategy(dp=8, recompute=Recompute.SELECTIVE))


def test_a_csv_column_a_cli_flag_and_a_bad_row(tmp_path: Path, capsys) -> None:
    run = one_run(tmp_path, {"model": "deepseek-v3", "system": "dgx-h100-1024",
                             "global_batch": 8192, "seq_len": 4096, "dp": 64, "tp": 2, "pp": 8,
                             "micro_batch": 1, "ep": 64, "recompute": "selective",
                             "recompute_modules": "mla_up_proj+mlp", "step_time_s": 25})
    assert run.training.recompute_modules == (MLA, MLP)
    bad = tmp_path / "bad"
    bad.mkdir()
    with pytest.raises(AssertionError, match="unknown recompute_modules 'moe'"):
        one_run(bad, {"model": "llama3-8b", "system": "dgx-h100-8", "global_batch": 64,
                      "seq_len": 8192, "dp": 8, "tp": 1, "pp": 1, "micro_batch": 1,
                      "recompute": "selective", "recompute_modules": "moe",
                      "step_time_s": 5})
    args = ["estimate", "--model", "llama3-8b", "--system", "dgx-h100-8", "--recompute",
            "selective", "--global-batch", "64", "--json"]
    assert main([*args, "--recompute-modules", "core_attn", "mlp"]) == 0
    both = json.loads(capsys.readouterr().out)
    api = simcore.estimate(CATALOG.model("llama3-8b"), CATALOG.system("dgx-h100-8"),
                           TrainingSpec(global_batch=64, seq_len=8192,
                                        recompute_modules=(CORE, MLP)),
                           Strategy(dp=8, recompute=Recompute.SELECTIVE))
    assert both["step_time"] == api.step_time


def test_megatron_exports_the_modules_and_the_others_refuse_them() -> None:
    c = CATALOG
    training = TrainingSpec(global_batch=64, seq_len=8192, recompute_modules=(CORE, MLP))
    strategy = Strategy(dp=8, tp=4, pp=2, zero=ZeroStage.OPTIMIZER,
                        recompute=Recompute.SELECTIVE)
    plan = make_plan(c.model("llama3-70b"), c.system("dgx-h100-64"), training, strategy,
                     Convention.MEGATRON)
    script = export_files(plan, "megatron")["megatron.sh"]
    flags = [ln.strip() for ln in script.splitlines() if ln.strip().startswith("--recompute")]
    assert flags == ["--recompute-granularity selective", "--recompute-modules core_attn mlp"]
    for framework in ("torchtitan", "deepspeed"):
        assert "Megatron-LM's --recompute-modules" in why_not(
            framework, plan.model, training, strategy)


def test_a_study_names_them_in_its_training(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("PLANNER_STORAGE", str(tmp_path / "results" / "studies.journal"))
    study = tmp_path / "s.yaml"
    study.write_text("name: s\nmodel: llama3-70b\nsystem: dgx-h100-64\n"
                     "training: {global_batch: 64, recompute_modules: [mla_up_proj]}\n"
                     "space: {tp: [8], recompute: [selective]}\n")
    assert main(["run", str(study), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "training.recompute_modules" in err and "needs multi-head latent attention" in err


def test_the_working_set_is_the_recomputed_modules_not_the_attention_scores() -> None:
    # GPT 22B without flash attention at sequence 8192: recompute_modules mlp keeps the
    # attention core's scores; the layer being recomputed adds its MLP's dropped tensors, not a
    # second copy of the scores (the stage held one layer's core more than under no recompute:
    # selective with mlp alone estimated 0.39% above none on GPT 1.7B)
    system = CATALOG.system("dgx-a100-8")
    base = TrainingSpec(global_batch=8, seq_len=8192, flash_attention=False)
    plan = Strategy(dp=1, tp=8, micro_batch=1, recompute=Recompute.SELECTIVE)
    none = simcore.estimate(GPT22B, system, base, replace(plan, recompute=Recompute.NONE))
    mlp = simcore.estimate(GPT22B, system, replace(base, recompute_modules=(MLP,)), plan)
    act = layer_activations(GPT22B, layer_shape(GPT22B), micro_batch=1, seq_len=8192, tp=8,
                            sp=1, sequence_parallel=True, recompute=Recompute.SELECTIVE,
                            flash=False, modules=frozenset({MLP}))
    assert act.full - act.stored < act.attention_core  # the MLP's drop: less than the scores
    assert mlp.memory.activations < none.memory.activations
    kept = GPT22B.layers * act.stored  # one micro-batch in flight on one stage
    assert mlp.memory.activations - kept == pytest.approx(
        none.memory.activations - GPT22B.layers * act.full + act.full - act.stored, rel=1e-9)
