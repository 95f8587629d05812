"""ZeRO-2 reduces every micro-batch's gradients: it keeps only its shard of them, so each
backward reduce-scatters its own (DeepSpeed v0.12.6 ``deepspeed/runtime/engine.py``
``allreduce_gradients``: "ZeRO stage >= 2 communicates during non gradient accumulation
boundaries as well"; ZeRO-1 communicates at the boundary only). Its memory was already priced
so (a gradient shard a rank); now its time is too."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.catalog import load_catalog
from simcore import Collective, estimate
from simcore.megatron.plan import StepPlan
from simcore.specs import Axis, Recompute, Strategy, TrainingSpec, ZeroStage

CATALOG = load_catalog()
A100 = CATALOG.system("dgx-a100-8")
LLAMA2_7B = CATALOG.model("llama2-7b")
# PaddleNLP's or DeepSpeed's stack: no Transformer Engine, whole-layer recompute, no FSDP rules
TRAINING = TrainingSpec(global_batch=64, seq_len=4096, transformer_engine=False,
                        recompute_early_stop=False, overlap_grad_reduce=False,
                        bytes_per_param_grads=2)
MICRO_BATCHES = 8  # 64 sequences over dp 8 at micro-batch 1


def _plan(zero: ZeroStage) -> Strategy:
    return Strategy(dp=8, tp=1, pp=1, zero=zero, recompute=Recompute.NONE, micro_batch=1)


def _params() -> int:
    # Llama 2 7B by hand (Touvron et al. 2023, 6.7B): 32 layers of 4 x 4096^2 attention
    # projections, 3 x 4096 x 11008 SwiGLU weights and two RMSNorm vectors; the 32000 x 4096
    # embedding, the untied LM head and the final norm
    h, f, layers, vocab = 4096, 11008, 32, 32000
    params = layers * (4 * h * h + 3 * h * f + 2 * h) + 2 * vocab * h + h
    assert params == pytest.approx(6.74e9, rel=0.001)
    return params


def test_zero2_reduce_scatters_each_micro_batch() -> None:
    one, two = (estimate(LLAMA2_7B, A100, TRAINING, _plan(z))
                for z in (ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS))
    p = StepPlan(LLAMA2_7B, A100, TRAINING, _plan(ZeroStage.GRADIENTS))
    # one reduce-scatter of the whole bf16 gradient over the node's 8 GPUs
    scatter = p.comm.total([(Axis.DP, Collective.REDUCE_SCATTER, 2 * _params())])
    assert scatter > 0.05  # 13.5 GB at the node's all-reduce-fit rate (231 GB/s): tens of ms
    # without overlap every reduction waits in full: ZeRO-1 once a step, ZeRO-2 seven more times
    assert two.time.dp - one.time.dp == pytest.approx((MICRO_BATCHES - 1) * scatter, rel=1e-9)
    assert two.time.compute == one.time.compute and two.time.optimizer == one.time.optimizer


def test_zero2_reduction_hides_behind_each_backward_with_overlap() -> None:
    overlapped = replace(TRAINING, overlap_grad_reduce=True)
    one, two = (estimate(LLAMA2_7B, A100, overlapped, _plan(z))
                for z in (ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS))
    p = StepPlan(LLAMA2_7B, A100, overlapped, _plan(ZeroStage.GRADIENTS))
    scatter = p.comm.total([(Axis.DP, Collective.REDUCE_SCATTER, 2 * _params())])
    extra = two.time.dp - one.time.dp
    # each earlier micro-batch's reduce-scatter runs beside its backward (seconds long): the
    # last bucket and the compute's slowdown show, not the whole collective
    assert 0 < extra < (MICRO_BATCHES - 1) * scatter / 2


def test_zero2_with_one_micro_batch_is_zero1s_time() -> None:
    # one micro-batch a step: the one reduction is at the boundary either way
    one_micro = replace(TRAINING, global_batch=8)
    one, two = (estimate(LLAMA2_7B, A100, one_micro, _plan(z))
                for z in (ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS))
    assert two.time.dp == one.time.dp
