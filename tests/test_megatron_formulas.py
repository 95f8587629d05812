"""The megatron convention's formulas against values worked by hand from their sources."""

from __future__ import annotations

import pytest

from planner.catalog import load_catalog
from simcore.megatron.activations import layer_activations
from simcore.megatron.layers import layer_shape
from simcore.megatron.pipeline import in_flight, pipeline_time
from simcore.megatron.states import model_state_bytes
from simcore.specs import Family, ModelSpec, Recompute, Schedule, TrainingSpec, ZeroStage

GIB = 2**30


def gpt(layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(name="gpt", family=Family.GPT, layers=layers, hidden=hidden,
                     ffn_hidden=4 * hidden, heads=heads, vocab=51200, seq_len=2048,
                     tied_embeddings=True)


# Korthikanti et al. 2022 Table 3 configurations and the analytic check values listed in
# shared/reference/published/README.md section 1.2 (calculon validation.py reproduces them):
# (model, t, p, b, v, TP-baseline GiB, SP+selective GiB, params+optimizer GiB).
KORTHIKANTI = [
    (gpt(48, 6144, 64), 8, 1, 4, 1, 59.25, 9.5625, 45.5625),
    (gpt(96, 12288, 96), 8, 8, 1, 3, 66.84375, 12.3515625, 45.5625),
    (gpt(105, 20480, 128), 8, 35, 1, 3, 114.0234375, 23.076171875, 31.640625),
    (gpt(128, 25600, 160), 8, 64, 1, 1, 131.25, 26.5625, 32.958984375),
]


def _first_stage_activations(model, t, p, b, v, *, sequence_parallel, recompute) -> float:
    act = layer_activations(model, layer_shape(model), micro_batch=b, seq_len=2048, tp=t, sp=1,
                            sequence_parallel=sequence_parallel, recompute=recompute)
    schedule = Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B
    # m large enough that the first stage is full (Table 3 uses global batch >= p).
    flight = in_flight(schedule, 0, p, 10 * p, v)
    return act.stored * model.layers / p * flight


@pytest.mark.parametrize("case", KORTHIKANTI, ids=["22B", "175B", "530B", "1T"])
@pytest.mark.parametrize(
    ("sequence_parallel", "recompute", "column"),
    # TP baseline: sbh (10 + 24/t + 5as/(ht)) per layer; SP + selective: sbh (34/t) (Table 2);
    # times L layers on the first stage and the interleaving factor 1 + (p-1)/(p v) (Eq. 5,
    # section 4.2.3).
    [(False, Recompute.NONE, 5), (True, Recompute.SELECTIVE, 6)],
    ids=["tp-baseline", "sp-selective"],
)
def test_korthikanti_activations(case, sequence_parallel, recompute, column) -> None:
    model, t, p, b, v = case[:5]
    got = _first_stage_activations(model, t, p, b, v, sequence_parallel=sequence_parallel,
                                   recompute=recompute)
    assert got / GIB == pytest.approx(case[column], rel=1e-9)


@pytest.mark.parametrize("case", KORTHIKANTI, ids=["22B", "175B", "530B", "1T"])
def test_korthikanti_parameters_and_optimizer(case) -> None:
    # 18 bytes per parameter (bf16 weights, fp32 main gradients, Adam's 12) times the 12 l h^2
    # transformer parameters over t * p, no data parallelism.
    model, t, p, *_, params_gib = case
    params = layer_shape(model).matmul_params * model.layers / (t * p)
    training = TrainingSpec(global_batch=1, seq_len=2048, bytes_per_param_grads=4)
    assert sum(model_state_bytes(params, training, ZeroStage.NONE, 1)) / GIB == pytest.approx(
        params_gib, rel=1e-9)


def test_full_recompute_keeps_only_the_layer_input() -> None:
    # Korthikanti Table 2: full recompute stores sbh * 2 bytes (not divided by t without SP).
    model = gpt(48, 6144, 64)
    act = layer_activations(model, layer_shape(model), micro_batch=4, seq_len=2048, tp=8, sp=1,
                            sequence_parallel=False, recompute=Recompute.FULL)
    assert act.stored == 2 * 2048 * 4 * 6144


def test_gpt_parameters_match_narayanan_eq_2() -> None:
    # P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)) for GPT-3 175B: 174.6B (Narayanan Table 2).
    model = gpt(96, 12288, 96)
    shape = layer_shape(model)
    total = model.layers * shape.layer_params + shape.embedding_params
    l, h, V, s = 96, 12288, 51200, 2048
    assert total == 12 * l * h**2 + 13 * l * h + (V + s) * h
    assert total / 1e9 == pytest.approx(174.6, abs=0.05)


def test_bloom_176b_catalog_entry_has_bloom_s_parameters() -> None:
    # The BLOOM paper (arXiv:2211.05100, Table 3): 176B parameters. By hand from the catalog's
    # shape (Narayanan eq. 2 as above, l 70, h 14336, V 250880, s 2048; ALiBi has no position
    # table, so s h = 29.4M of it is GPT pricing): 12 l h^2 + 13 l h + (V + s) h = 176.28B.
    model = load_catalog().model("bloom-176b")
    shape = layer_shape(model)
    total = model.layers * shape.layer_params + shape.embedding_params
    l, h, V, s = 70, 14336, 250880, 2048
    assert total == 12 * l * h**2 + 13 * l * h + (V + s) * h
    assert round(total / 1e9) == 176


@pytest.mark.parametrize(
    ("zero", "expected_gb"),
    # Rajbhandari et al. 2020 section 5 worked example: 7.5B parameters, N_d = 64:
    # 16 P = 120 GB, 4 P + 12 P/64 = 31.4 GB, 2 P + 14 P/64 = 16.6 GB, 16 P/64 = 1.9 GB.
    [(ZeroStage.NONE, 120), (ZeroStage.OPTIMIZER, 31.4), (ZeroStage.GRADIENTS, 16.6),
     (ZeroStage.PARAMETERS, 1.9)],
)
def test_zero_bytes_per_parameter(zero, expected_gb) -> None:
    training = TrainingSpec(global_batch=1, seq_len=1)
    total = sum(model_state_bytes(7.5e9, training, zero, 64)) / 1e9
    assert total == pytest.approx(expected_gb, abs=0.05)


def test_megatron_distributed_optimizer_bytes() -> None:
    # Megatron-LM docs dist_optimizer.md: bf16 parameters, fp32 gradients: 18 bytes per
    # parameter without, 6 + 12/d with the distributed optimizer (d = 8: 7.5).
    training = TrainingSpec(global_batch=1, seq_len=1, bytes_per_param_grads=4)
    assert sum(model_state_bytes(1, training, ZeroStage.NONE, 8)) == 18
    assert sum(model_state_bytes(1, training, ZeroStage.OPTIMIZER, 8)) == 6 + 12 / 8


def test_pipeline_bubble_is_narayanans() -> None:
    # Equal stages of time t: (m + (p-1)/v) t, bubble fraction (p-1)/(v m) (Narayanan 2.2).
    t, p, m = 2.0, 8, 32
    assert pipeline_time([t] * p, m, 1)[0] == (m + p - 1) * t
    assert pipeline_time([t] * p, m, 4)[0] == (m + (p - 1) / 4) * t


def test_in_flight_micro_batches_per_schedule() -> None:
    # GPipe keeps m, 1F1B min(p - i, m) (Narayanan 2.2); interleaved stage 0 keeps
    # p + (p-1)/v stage-equivalents: Korthikanti's factor 1 + (p-1)/(p v) over p.
    assert in_flight(Schedule.GPIPE, 0, 4, 16, 1) == 16
    assert in_flight(Schedule.ONE_F_ONE_B, 0, 4, 16, 1) == 4
    assert in_flight(Schedule.ONE_F_ONE_B, 3, 4, 16, 1) == 1
    assert in_flight(Schedule.ONE_F_ONE_B, 0, 4, 2, 1) == 2
    assert in_flight(Schedule.INTERLEAVED, 0, 8, 64, 3) == pytest.approx(8 + 7 / 3)


def test_llama2_70b_parameters_match_the_released_checkpoint() -> None:
    # Llama-2-70b (config.json: hidden 8192, 80 layers, 64 heads, 8 KV heads, FFN 28672,
    # vocab 32000, untied) has 68,976,648,192 parameters (the Hugging Face checkpoint's count):
    # per layer 2 h^2 (Q, O) + 2 h * 1024 (K, V) + 3 h * 28672 (SwiGLU) + 2 h (RMSNorms),
    # plus the embedding and the LM head (V h each) and the final RMSNorm (h).
    model = ModelSpec(name="llama2-70b", family=Family.LLAMA, layers=80, hidden=8192,
                      ffn_hidden=28672, heads=64, kv_heads=8, vocab=32000, seq_len=4096)
    shape = layer_shape(model)
    total = model.layers * shape.layer_params + shape.embedding_params + shape.head_params
    assert total == 68_976_648_192
