"""What a plan must fit in, and what it holds: the parts' capacity as the driver reports it,
models that train without dropout, and PyTorch FSDP's fp32 shards.

- Capacity. A datasheet's "80GB" is 80 GiB of HBM; nvidia-smi reports an A100 80GB as 81920 MiB
  and an H100 SXM as 81559 MiB (modal-labs/modal-client#2797, which lists both and the A100
  40GB's 40960 MiB; huggingface/text-generation-inference#2572 shows the H100's 81559MiB too).
  The estimate counts decimal bytes, so the catalog's ``hbm_gb`` is that capacity in GB.
- Dropout. Korthikanti et al. 2022 (arXiv:2205.05198) section 4.1 count two 1-byte dropout
  masks of s x b x h per GPT layer outside the attention core (after attention and after the
  MLP). MPT trains without dropout (llm-foundry@8c8dd48f72 ``configuration_mpt.py``:
  ``resid_pdrop`` and ``emb_pdrop`` default to 0.0, ``attn_pdrop`` to 0.0).
- FSDP. PyTorch FSDP keeps the sharded parameter in fp32 (it is the optimizer's master copy) and
  the sharded gradient in fp32: 4 + 4 + 8 (Adam's two moments) = 16 bytes a parameter over the
  group, where a 16-bit shard beside an fp32 master (DeepSpeed's ZeRO-3) takes 2 + 4 + 12 = 18
  with fp32 gradients (Rajbhandari et al. 2020 section 5, with 4-byte gradients).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from planner.catalog import load_catalog, model_from_entry
from planner.catalog_write import model_entry
from planner.runs_csv import read_runs
from simcore import estimate
from simcore.megatron.bounds import PRECISION_CODES, RECOMPUTE_CODES, SCHEDULE_CODES, lower_bounds
from simcore.megatron.layers import layer_shape
from simcore.megatron.states import model_state_bytes
from simcore.specs import Precision, Recompute, Strategy, TrainingSpec, ZeroStage

CATALOG = load_catalog(user=False)
MIB = 2**20
GB = 1e9
MODELS = Path(__file__).parent / "data" / "validation" / "models.yaml"


@pytest.mark.parametrize(("device", "mib"), [("a100-80gb", 81920), ("a100-40gb", 40960),
                                             ("h100-sxm", 81559), ("h800", 81559)])
def test_capacity_is_what_nvidia_smi_reports(device: str, mib: int) -> None:
    assert CATALOG.devices[device].hbm_bytes == pytest.approx(mib * MIB, rel=1e-3)


def test_an_80gb_part_holds_more_than_80e9_bytes() -> None:
    # 80 GiB = 85.9e9 bytes: a plan of 84 GB fits an A100 80GB (nvidia-smi's 81920 MiB).
    assert CATALOG.devices["a100-80gb"].hbm_bytes > 84 * GB


def _mpt(dropout: bool | None):
    entry = {"family": "gpt", "layers": 24, "hidden": 2048, "ffn_hidden": 8192, "heads": 16,
             "vocab": 50368, "seq_len": 2048, "tied_embeddings": True}
    if dropout is not None:
        entry["dropout"] = dropout
    return model_from_entry(MODELS, "mpt-1b", entry)


def test_gpt_trains_with_dropout_unless_the_model_says_not() -> None:
    assert layer_shape(_mpt(None)).dropout
    assert layer_shape(_mpt(True)).dropout
    assert not layer_shape(_mpt(False)).dropout
    assert not layer_shape(CATALOG.model("llama3-8b")).dropout


def test_the_catalog_reads_and_writes_dropout() -> None:
    assert _mpt(False).dropout is False
    assert model_entry(_mpt(False))["dropout"] is False
    assert "dropout" not in model_entry(_mpt(None))
    with pytest.raises(Exception, match="dropout"):
        model_from_entry(MODELS, "mpt-1b", {**model_entry(_mpt(None)), "dropout": "no"})


def test_without_dropout_a_layer_keeps_two_masks_fewer() -> None:
    # Flash attention, tp 1, no recompute: the only difference is the two 1-byte masks of
    # s x b x h per layer (the attention core's own mask is not stored with flash attention),
    # 24 layers of 2,048 x 4 x 2,048 bytes each, and the first stage's embedding dropout mask of
    # as many (Korthikanti section 4.3).
    system = CATALOG.system("dgx-a100-8")
    training = TrainingSpec(global_batch=32, seq_len=2048, flash_attention=True)
    plan = Strategy(dp=8, micro_batch=4)
    sbh = 2048 * 4 * 2048
    kept = estimate(_mpt(True), system, training, plan).memory.activations
    dropped = estimate(_mpt(False), system, training, plan).memory.activations
    assert kept - dropped == pytest.approx(24 * 2 * sbh + sbh, rel=1e-9)


def test_without_dropout_the_layer_runs_faster() -> None:
    system = CATALOG.system("dgx-a100-8")
    training = TrainingSpec(global_batch=32, seq_len=2048, flash_attention=True)
    plan = Strategy(dp=8, micro_batch=4)
    assert (estimate(_mpt(False), system, training, plan).step_time
            < estimate(_mpt(True), system, training, plan).step_time)


def test_fp32_shards_hold_16_bytes_a_parameter() -> None:
    training = TrainingSpec(global_batch=8, seq_len=2048, bytes_per_param_grads=4)
    p, n = 1e9, 8
    assert model_state_bytes(p, training, ZeroStage.PARAMETERS, n, fp32_shards=True) == (
        0.0, 4 * p / n, 12 * p / n)
    assert sum(model_state_bytes(p, training, ZeroStage.PARAMETERS, n)) == 18 * p / n
    # bf16 gradients are reduced in bf16 but kept for the step in the parameter's fp32
    bf16 = replace(training, bytes_per_param_grads=2)
    assert sum(model_state_bytes(p, bf16, ZeroStage.PARAMETERS, n, fp32_shards=True)) == (
        16 * p / n)
    # ZeRO-2 (SHARD_GRAD_OP) keeps the bf16 parameters whole and the gradient shard in fp32
    assert model_state_bytes(p, bf16, ZeroStage.GRADIENTS, n, fp32_shards=True) == (
        2 * p, 4 * p / n, 12 * p / n)
    assert model_state_bytes(p, bf16, ZeroStage.GRADIENTS, n)[1] == 2 * p / n
    # ZeRO-1 is not touched
    assert (model_state_bytes(p, bf16, ZeroStage.OPTIMIZER, n, fp32_shards=True)
            == model_state_bytes(p, bf16, ZeroStage.OPTIMIZER, n))


def _fsdp_states(training: TrainingSpec) -> float:
    model = CATALOG.model("llama3-8b")
    m = estimate(model, CATALOG.system("dgx-h100-8"), training,
                 Strategy(dp=8, zero=ZeroStage.PARAMETERS, recompute=Recompute.FULL)).memory
    return m.weights + m.gradients + m.optimizer


def test_pytorch_fsdp_keeps_no_16_bit_shard_and_deepspeed_does() -> None:
    # Llama 3 8B on 8 GPUs with fp32 gradients: the DeepSpeed stack (its checkpointing re-runs
    # the whole layer, recompute_early_stop false) keeps 2 bytes a parameter more per GPU.
    fp32 = TrainingSpec(global_batch=8, seq_len=8192, bytes_per_param_grads=4)
    params = 8.03e9
    pytorch = _fsdp_states(fp32)
    deepspeed = _fsdp_states(replace(fp32, recompute_early_stop=False))
    assert pytorch == pytest.approx(16 * params / 8, rel=0.01)
    assert deepspeed - pytorch == pytest.approx(2 * params / 8, rel=0.01)


def _columns(plans: list[Strategy]) -> dict[str, np.ndarray]:
    return {
        "dp": np.array([s.dp for s in plans]), "tp": np.array([s.tp for s in plans]),
        "pp": np.array([s.pp for s in plans]), "sp": np.ones(len(plans), int),
        "micro_batch": np.array([s.micro_batch for s in plans]),
        "v": np.ones(len(plans), int), "zero": np.array([int(s.zero) for s in plans]),
        "shard_ranks": np.array([s.dp for s in plans]),
        "first_stage_layers": np.zeros(len(plans), int),
        "recompute": np.array([RECOMPUTE_CODES[s.recompute] for s in plans]),
        "schedule": np.full(len(plans), SCHEDULE_CODES["1f1b"]),
        "sequence_parallel": np.array([s.sequence_parallel for s in plans]),
        "precision": np.array([PRECISION_CODES[s.precision] for s in plans]),
    }


@pytest.mark.parametrize("stack", [
    {},  # an any study's ZeRO-2/3 plans: PyTorch FSDP's fp32 shards
    {"recompute_early_stop": False},  # DeepSpeed's and Megatron's 16-bit shards
    # Transformer Engine with early stopping asked for: still Megatron's shards (the FP8 copy
    # and --fp8-param-gather are counted on them: with fp32 shards the weights went negative)
    {"transformer_engine": True, "recompute_early_stop": True},
])
def test_the_bounds_stay_below_the_estimates(stack: dict) -> None:
    # lower_bounds prunes plans: a bound over its plan's estimate drops a plan that may win.
    # Llama 3 70B at 2,048 tokens, little activation memory, so the states decide; MXFP8 on
    # the part that runs it.
    model = CATALOG.model("llama3-70b")
    training = TrainingSpec(global_batch=64, seq_len=2048, bytes_per_param_grads=4, **stack)
    for system, precisions in ((CATALOG.system("dgx-h100-64"), (Precision.BF16, Precision.FP8)),
                               (CATALOG.system("dgx-gb200-64"), tuple(Precision))):
        plans = [Strategy(dp=dp, tp=8, pp=pp, zero=ZeroStage(z), recompute=r, micro_batch=1,
                          precision=precision)
                 for dp, pp in ((8, 1), (4, 2)) for z in (2, 3)
                 for r in (Recompute.NONE, Recompute.FULL) for precision in precisions]
        bounds = lower_bounds(model, system, training, _columns(plans))
        for plan, bound in zip(plans, bounds.memory_bytes):
            est = estimate(model, system, training, plan).memory
            assert est.weights >= 0
            assert bound <= est.total, plan


def test_the_bounds_drop_the_16_bit_shard_as_the_estimate_does() -> None:
    # The same ZeRO-3 plan (no recompute, so the checkpointing does not matter) on the two
    # stacks: the bound and the estimate each differ by 2 bytes a parameter over 8 GPUs.
    model, system = CATALOG.model("llama3-8b"), CATALOG.system("dgx-h100-8")
    plan = Strategy(dp=8, zero=ZeroStage.PARAMETERS, micro_batch=1)
    columns = {k: np.array([v]) for k, v in {
        "dp": 8, "tp": 1, "pp": 1, "sp": 1, "micro_batch": 1, "v": 1, "zero": 3,
        "shard_ranks": 8, "first_stage_layers": 0, "recompute": RECOMPUTE_CODES[Recompute.NONE],
        "schedule": SCHEDULE_CODES["1f1b"], "sequence_parallel": True, "fp8": False}.items()}
    pytorch = TrainingSpec(global_batch=8, seq_len=8192, bytes_per_param_grads=4)
    deepspeed = replace(pytorch, recompute_early_stop=False)
    bound_gap = (lower_bounds(model, system, deepspeed, columns).memory_bytes[0]
                 - lower_bounds(model, system, pytorch, columns).memory_bytes[0])
    estimate_gap = (estimate(model, system, deepspeed, plan).memory.total
                    - estimate(model, system, pytorch, plan).memory.total)
    # the bound counts the first stage's layers and embedding (not the LM head: a lower bound)
    shape = layer_shape(model)
    first = 32 * shape.layer_params + shape.embedding_params
    assert bound_gap == pytest.approx(2 * first / 8, rel=1e-6)  # bounds carry SAFETY
    assert estimate_gap == pytest.approx(2 * (first + shape.head_params) / 8, rel=1e-9)


@pytest.mark.parametrize("device", ["a100-40gb", "a10", "l4"])
def test_smaller_parts_take_the_allowance_scaled_by_capacity(device: str) -> None:
    # gpus.yaml's header: the A100 80GB's 9 GB (fit on BLOOM's nvidia-smi peaks) times the
    # part's capacity over the A100 80GB's, rounded to half a GB.
    big = CATALOG.devices["a100-80gb"]
    part = CATALOG.devices[device]
    scaled = big.memory_overhead_bytes * part.hbm_bytes / big.hbm_bytes
    assert part.memory_overhead_bytes == pytest.approx(scaled, abs=0.25 * GB)


def test_llm_foundry_40gb_table_fits_the_parts_it_ran_on() -> None:
    # Each of the 78 runs of llm-foundry's A100 40GB table ran; with the 80GB part's 9 GB
    # allowance 27 were estimated over the 42.95 GB they had.
    runs, _ = read_runs(Path(__file__).parent / "data" / "validation" / "a100-check.csv",
                        CATALOG)
    table = [r for r in runs if r.system.device.name == "a100-40gb"]
    assert len(table) == 78
    assert all(estimate(r.model, r.system, r.training, r.strategy).fits for r in table)
