"""Partial full recompute (``recompute_layers``): Megatron-LM's ``--recompute-method block
--recompute-num-layers N``, which checkpoints layer i of each transformer block (a pipeline
stage, or a virtual stage with v > 1) when i < N (NVIDIA/Megatron-LM@d98e8a64
``megatron/core/recompute.py``); the other layers keep every activation."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import simcore
from planner.catalog import load_catalog
from planner.cli import main
from planner.exports import export_files
from planner.plan import make_plan, strategy_from_attrs
from planner.record import strategy_attrs
from search_spaces.frameworks import why_not
from simcore.megatron.batched import estimate_many
from simcore.specs import (
    Convention,
    Family,
    ModelSpec,
    Recompute,
    Schedule,
    Strategy,
    TrainingSpec,
)
from tests.study_files import one_run

CATALOG = load_catalog()
A100 = CATALOG.system("dgx-a100-8")
# GPT-3 22B of Korthikanti et al. 2022 Table 3 (48 layers, h 6144, 64 heads), sequence 2048
GPT22B = ModelSpec(name="gpt-22b", family=Family.GPT, layers=48, hidden=6144, ffn_hidden=24576,
                   heads=64, vocab=51200, seq_len=2048, tied_embeddings=True)
TRAINING = TrainingSpec(global_batch=4, seq_len=2048)
FULL = Strategy(dp=1, tp=8, pp=1, micro_batch=4, sequence_parallel=False,
                recompute=Recompute.FULL)


def _estimate(strategy: Strategy, model: ModelSpec = GPT22B,
              training: TrainingSpec = TRAINING) -> simcore.Estimate:
    return simcore.estimate(model, A100, training, strategy)


def test_each_layer_left_out_keeps_korthikantis_activations_instead_of_its_input() -> None:
    # Korthikanti et al. 2022 Table 2, tp 8 without sequence parallelism: a layer keeps
    # s b h (10 + 24/t + 5 a s / (h t)) bytes, one under full recompute only its input, 2 s b h.
    # 12 of the 48 layers recompute, so 36 keep the former instead of the latter (pp 1: one
    # micro-batch in flight).
    s, b, h, a, t = 2048, 4, 6144, 64, 8
    kept, input_only = s * b * h * (10 + 24 / t + 5 * a * s / (h * t)), 2 * s * b * h
    partial = _estimate(replace(FULL, recompute_layers=12))
    full = _estimate(FULL)
    extra = partial.memory.activations - full.memory.activations
    assert extra == pytest.approx(36 * (kept - input_only), rel=1e-12)
    assert partial.memory.total > full.memory.total


def test_each_recomputed_layer_adds_one_forward_of_a_layer() -> None:
    # Full recompute runs each checkpointed layer's forward once more in the backward: with
    # 12 of 48 layers checkpointed the step computes a quarter of full recompute's extra forward.
    none = _estimate(replace(FULL, recompute=Recompute.NONE))
    full = _estimate(FULL)
    partial = _estimate(replace(FULL, recompute_layers=12))
    assert partial.time.compute == pytest.approx(
        none.time.compute + 12 / 48 * (full.time.compute - none.time.compute), rel=1e-12)
    assert none.step_time < partial.step_time < full.step_time
    # the hardware FLOPs count the recomputed forwards: a quarter of full recompute's extra
    assert partial.hardware_flops - none.hardware_flops == pytest.approx(
        (full.hardware_flops - none.hardware_flops) / 4, rel=1e-12)


def test_a_block_of_at_least_the_stage_recomputes_it_all() -> None:
    # recompute.py: layer i < N is checkpointed, so N >= a block's layers checkpoints them all
    for n in (48, 60):
        partial = _estimate(replace(FULL, recompute_layers=n))
        full = _estimate(FULL)
        assert (partial.step_time, partial.memory.total) == (full.step_time, full.memory.total)


def test_with_interleaving_the_count_is_per_model_chunk() -> None:
    # Megatron-Bridge docs/training/activation-recomputation.md: "When using virtual
    # pipelining, recompute_num_layers specifies the number of layers per virtual pipeline
    # stage". 48 layers on pp 4 with v 2: chunks of 6; N 3 recomputes 2 x 3 = 6 of a stage's 12,
    # half, the same share as N 6 without interleaving.
    base = replace(FULL, dp=1, tp=2, pp=4, micro_batch=1, schedule=Schedule.INTERLEAVED, v=2)
    training = TrainingSpec(global_batch=8, seq_len=2048)
    none = _estimate(replace(base, recompute=Recompute.NONE), training=training)
    full = _estimate(base, training=training)
    half = _estimate(replace(base, recompute_layers=3), training=training)
    assert half.time.compute == pytest.approx((none.time.compute + full.time.compute) / 2,
                                              rel=1e-12)
    assert _estimate(replace(base, recompute_layers=6), training=training).step_time == \
        full.step_time


def test_many_at_once_equals_one_by_one_for_every_v() -> None:
    base = replace(FULL, tp=2, pp=4, micro_batch=1)
    training = TrainingSpec(global_batch=8, seq_len=2048)
    strategies = [replace(base, recompute_layers=n, schedule=schedule, v=v)
                  for n in (None, 1, 3, 6)
                  for schedule, v in ((Schedule.ONE_F_ONE_B, 1), (Schedule.INTERLEAVED, 2),
                                      (Schedule.INTERLEAVED, 3))]
    batch = estimate_many(GPT22B, A100, training, strategies)
    for i, s in enumerate(strategies):
        one = simcore.estimate(GPT22B, A100, training, s)
        assert (batch.step_time[i], batch.peak_memory[i]) == (one.step_time, one.memory.total)


@pytest.mark.parametrize(("knobs", "message"), [
    ({"recompute_layers": 0}, "recompute_layers >= 1"),
    ({"recompute_layers": 4, "recompute": Recompute.SELECTIVE}, "needs recompute=full"),
    ({"recompute_layers": 4, "recompute": Recompute.NONE}, "needs recompute=full"),
])
def test_bad_counts_say_what_to_set(knobs, message) -> None:
    with pytest.raises(ValueError, match=message):
        replace(FULL, **knobs)


def test_the_stage_convention_refuses_it() -> None:
    with pytest.raises(ValueError, match="recompute_layers needs the megatron convention"):
        simcore.estimate(GPT22B, A100, TRAINING, replace(FULL, recompute_layers=4),
                         Convention.STAGE)


def test_a_runs_csv_column_and_a_cli_flag(tmp_path: Path, capsys) -> None:
    run = one_run(tmp_path, {"model": "llama3-8b", "system": "dgx-h100-8", "global_batch": 64,
                             "seq_len": 8192, "dp": 8, "tp": 1, "pp": 1, "micro_batch": 1,
                             "recompute": "full", "recompute_layers": 16, "step_time_s": 5.0})
    assert run.strategy.recompute_layers == 16
    # 0 is all, as a study's space.recompute_layers reads it (the CSV refused it)
    every = one_run(tmp_path, {"model": "llama3-8b", "system": "dgx-h100-8", "global_batch": 64,
                               "seq_len": 8192, "dp": 8, "tp": 1, "pp": 1, "micro_batch": 1,
                               "recompute": "full", "recompute_layers": 0, "step_time_s": 5.0})
    assert every.strategy.recompute_layers is None
    written = one_run(tmp_path, {"model": "llama3-8b", "system": "dgx-h100-8",
                                 "global_batch": 64, "seq_len": 8192, "dp": 8, "tp": 1, "pp": 1,
                                 "micro_batch": 1, "recompute": "full",
                                 "recompute_layers": "0.0", "step_time_s": 5.0})
    assert written.strategy.recompute_layers is None
    code = main(["estimate", "--model", "llama3-8b", "--system", "dgx-h100-8", "--recompute",
                 "full", "--recompute-layers", "16", "--global-batch", "64", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["strategy"]["recompute_layers"] == 16
    api = simcore.estimate(CATALOG.model("llama3-8b"), CATALOG.system("dgx-h100-8"),
                           TrainingSpec(global_batch=64, seq_len=8192),
                           Strategy(dp=8, recompute=Recompute.FULL, recompute_layers=16))
    assert data["step_time"] == api.step_time
    assert main(["estimate", "--model", "llama3-8b", "--system", "dgx-h100-8",
                 "--recompute-layers", "16", "--global-batch", "64"]) == 2
    assert "needs recompute=full" in capsys.readouterr().err


def test_stored_and_read_back() -> None:
    s = replace(FULL, recompute_layers=12)
    assert strategy_from_attrs(strategy_attrs(s)) == s
    assert "recompute_layers" not in strategy_attrs(FULL)  # older studies read as before


def _llama_plan(**knobs: object):
    c = CATALOG
    strategy = Strategy(**{"dp": 8, "tp": 4, "pp": 2, "recompute": Recompute.FULL,
                           "recompute_layers": 5, **knobs})  # type: ignore[arg-type]
    return make_plan(c.model("llama3-70b"), c.system("dgx-h100-64"),
                     TrainingSpec(global_batch=64, seq_len=8192), strategy, Convention.MEGATRON)


def test_megatron_exports_the_block_method() -> None:
    script = export_files(_llama_plan(), "megatron")["megatron.sh"]
    flags = [ln.strip() for ln in script.splitlines() if ln.strip().startswith("--recompute")]
    assert flags == ["--recompute-granularity full", "--recompute-method block",
                     "--recompute-num-layers 5"]


def test_frameworks_that_cannot_run_it_say_why() -> None:
    plan = _llama_plan()
    assert why_not("megatron", plan.model, plan.training, plan.strategy) is None
    # torchtitan's layer-wise checkpointing wraps every n-th block
    assert "torchtitan checkpoints every n-th" in why_not(
        "torchtitan", plan.model, plan.training, plan.strategy)
    # Megatron-DeepSpeed's PipelineModule checkpoints at a uniform interval with pp > 1
    assert "with pp 2" in why_not("deepspeed", plan.model, plan.training, plan.strategy)
    flat = _llama_plan(dp=16, tp=4, pp=1)
    assert why_not("deepspeed", flat.model, flat.training, flat.strategy) is None
    launch = export_files(flat, "deepspeed")["deepspeed-launch.txt"]
    assert "--recompute-method block" in launch and "--recompute-num-layers 5" in launch


def test_an_moe_model_recomputes_the_same_share_of_its_moe_layers() -> None:
    # Qwen3-30B-A3B: 48 layers on pp 2, 24 a stage; N 12 recomputes half of each stage's
    # layers, MoE ones alike (every layer is MoE), so the step is halfway in time.
    model, system = CATALOG.model("qwen3-30b-a3b"), CATALOG.system("dgx-h100-16")
    training = TrainingSpec(global_batch=64, seq_len=4096)
    base = Strategy(dp=8, tp=1, pp=2, ep=8, recompute=Recompute.FULL)
    none = simcore.estimate(model, system, training, replace(base, recompute=Recompute.NONE))
    full = simcore.estimate(model, system, training, base)
    half = simcore.estimate(model, system, training, replace(base, recompute_layers=12))
    assert half.step_time == pytest.approx((none.step_time + full.step_time) / 2, rel=1e-9)
    assert full.memory.activations < half.memory.activations < none.memory.activations


def test_megatron_refuses_expert_overlap_with_full_recompute() -> None:
    # megatron/core/transformer/transformer_config.py (d98e8a64): "disable full recomputation
    # when enabling overlap_moe_expert_parallel_comm"
    model = CATALOG.model("qwen3-30b-a3b")
    training = TrainingSpec(global_batch=64, seq_len=4096)
    overlap = Strategy(dp=8, tp=1, pp=2, ep=8, ep_overlap=True, recompute=Recompute.FULL)
    assert "refuses full recomputation" in why_not("megatron", model, training, overlap)
    # (with pp > 1 the overlap also needs an interleaved pipeline: tests/test_moe.py)
    assert why_not("megatron", model, training,
                   replace(overlap, recompute=Recompute.SELECTIVE,
                           schedule=Schedule.INTERLEAVED, v=2)) is None


def _space(**knobs: object):
    from search_spaces import StrategySpace

    c = CATALOG
    return StrategySpace(model=c.model("llama3-70b"), system=c.system("dgx-h100-64"),
                         training=TrainingSpec(global_batch=64, seq_len=8192),
                         convention=Convention.MEGATRON, tp=(4, 8), pp=(2, 4),
                         recompute=(Recompute.NONE, Recompute.FULL), micro_batch=(1,),
                         schedule=(Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED), v=(2, 5),
                         recompute_layers=(0, 2, 5, 8), **knobs)  # type: ignore[arg-type]


def test_a_space_searches_the_counts_under_full_recompute_only() -> None:
    # Llama 3 70B's 80 layers: a chunk holds 80 / (pp v) of them (pp 2: 40, 20, 8 and pp 4:
    # 20, 10, 4 layers for v 1, 2, 5). Each layout and pipeline offers no recompute, full
    # recompute, and full recompute of 2, 5 or 8 layers a chunk where the chunk holds more
    # (a count of at least the chunk is full recompute's plan again); e.g. pp 4 with v 5 only
    # the 2.
    space = _space()
    counts = {}
    for s in space.valid:
        key = (s.pp, s.v)
        counts.setdefault(key, set()).add((s.recompute, s.recompute_layers))
    chunk = {(pp, v): 80 // (pp * v) for pp, v in counts}
    for key, seen in counts.items():
        expected = {(Recompute.NONE, None), (Recompute.FULL, None)} | {
            (Recompute.FULL, k) for k in (2, 5, 8) if k < chunk[key]}
        assert seen == expected
    assert space.valid == tuple(s for s in space.candidates() if space.reason_invalid(s) is None)


def test_the_bounds_stay_below_partial_plans() -> None:
    from simcore.megatron.bounds import lower_bounds

    space = _space()
    flat = space.valid_indices()
    assert flat is not None
    bounds = lower_bounds(space.model, space.system, space.training, space.columns_at(flat))
    result = estimate_many(space.model, space.system, space.training, space.strategies_at(flat))
    assert (bounds.step_time_s <= result.step_time).all()
    assert (bounds.memory_bytes <= result.peak_memory).all()


def test_a_study_searches_it_and_stores_it(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("PLANNER_STORAGE", str(tmp_path / "results" / "studies.journal"))
    study = tmp_path / "partial.yaml"
    study.write_text(
        "name: partial\nmodel: llama3-70b\nsystem: dgx-h100-64\n"
        "training: {global_batch: 64, seq_len: 8192}\nsampler: exhaustive\n"
        "space: {tp: [8], pp: [4], recompute: [none, full], recompute_layers: [0, 5, 10, 20],"
        " micro_batch: [1]}\n")
    assert main(["run", str(study), "--quiet"]) == 0
    # none, full, and full of 5 and of 10 of each stage's 20 layers (20 is full's plan)
    assert "4 valid strategies" in capsys.readouterr().out
    table = tmp_path / "trials.csv"
    assert main(["trials", "partial", "--csv", str(table)]) == 0
    import pandas as pd

    trials = pd.read_csv(table)
    assert sorted(trials["recompute_layers"].dropna().astype(int)) == [5, 10]
    partial = trials[trials["recompute_layers"] == 5].iloc[0]
    plan = Strategy(dp=2, tp=8, pp=4, recompute=Recompute.FULL, recompute_layers=5)
    est = simcore.estimate(CATALOG.model("llama3-70b"), CATALOG.system("dgx-h100-64"),
                           TrainingSpec(global_batch=64, seq_len=8192), plan)
    assert partial["step_time_s"] == pytest.approx(est.step_time, rel=1e-9)


def test_a_count_without_full_recompute_in_the_space_is_one_line(tmp_path: Path, capsys,
                                                                  monkeypatch) -> None:
    monkeypatch.setenv("PLANNER_STORAGE", str(tmp_path / "results" / "studies.journal"))
    study = tmp_path / "bad.yaml"
    study.write_text(
        "name: bad\nmodel: llama3-70b\nsystem: dgx-h100-64\n"
        "training: {global_batch: 64}\nspace: {tp: [8], recompute: [none, selective],"
        " recompute_layers: [4]}\n")
    assert main(["run", str(study), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "space.recompute_layers" in err and "add full" in err and "Traceback" not in err
