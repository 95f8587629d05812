"""FSDP under PyTorch's pipeline stages (``pipeline_no_sync``, torchtitan's pipelines): every
micro-batch's backward but the last skips the gradient sync and keeps the weights it gathered
(pytorch/pytorch v2.10.0 torch/distributed/pipelining/stage.py ``backward_maybe_with_nosync``:
``set_requires_gradient_sync(False)``, ``set_reshard_after_backward(False)``). Each device holds
its stage's whole gradient and whole 16-bit weights, and reduce-scatters once a step.

Hand calculation, Llama 3 70B (Dubey et al. 2024, Table 3: 80 layers, model dimension 8,192,
FFN 28,672, 64 heads, 8 key/value heads, vocabulary 128,256) on 256 H100s at tp 4, pp 2: a
layer's q and o hold 2 x 8192^2, k and v 2 x 8192 x 1024, the SwiGLU MLP 3 x 8192 x 28672:
134.2M + 16.8M + 704.6M = 855.6M parameters (and two norms, 16K); a stage's 40 layers and
the embedding or the untied head (128,256 x 8,192 = 1.05B) over tp 4: (40 x 855.6M + 1.05B)
/ 4 = 8.82B parameters a device, 17.6 GB in 16 bits.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

import simcore
from planner.catalog import load_catalog
from search_spaces.frameworks import with_framework_defaults
from simcore.specs import Recompute, Schedule, Strategy, TrainingSpec, ZeroStage

CATALOG = load_catalog(user=False)
MODEL = CATALOG.model("llama3-70b")
SYSTEM = CATALOG.system("dgx-h100-256")
TRAINING = TrainingSpec(global_batch=512, seq_len=8192)
PIPELINED = Strategy(dp=32, tp=4, pp=2, micro_batch=1, schedule=Schedule.INTERLEAVED, v=2,
                     recompute=Recompute.SELECTIVE, zero=ZeroStage.PARAMETERS, shard_group=8)
STAGE_PARAMS = (40 * 855.6e6 + 128256 * 8192) / 4


def _estimate(strategy: Strategy, **training: object) -> simcore.Estimate:
    return simcore.estimate(MODEL, SYSTEM, replace(TRAINING, **training), strategy)


def test_the_stage_keeps_its_whole_gradient_and_weights() -> None:
    est = _estimate(PIPELINED, pipeline_no_sync=True)
    assert est.memory.gradients == pytest.approx(2 * STAGE_PARAMS, rel=0.01)  # grad_bytes 2
    assert est.memory.gathered_weights == pytest.approx(2 * STAGE_PARAMS, rel=0.01)
    synced = _estimate(PIPELINED)
    assert synced.memory.total < est.memory.total - 25e9  # sharded over 8: 2.2 + 4.4 GB
    # one reduce-scatter a step, not one a micro-batch: less of the FSDP traffic exposed
    assert est.time.fsdp < synced.time.fsdp


def test_only_under_a_pipeline_zero_3_and_accumulation() -> None:
    for strategy in (replace(PIPELINED, pp=1, dp=64, schedule=Schedule.ONE_F_ONE_B, v=1),
                     replace(PIPELINED, zero=ZeroStage.OPTIMIZER, shard_group=None),
                     replace(PIPELINED, micro_batch=16, schedule=Schedule.ONE_F_ONE_B,
                             v=1)):  # 512 / (16 x 32): one micro-batch
        assert _estimate(strategy, pipeline_no_sync=True) == _estimate(strategy)


def test_a_torchtitan_study_pipelines_so() -> None:
    assert with_framework_defaults(TRAINING, "torchtitan", True).pipeline_no_sync is True
    for framework in ("megatron", "deepspeed", "any"):
        assert not with_framework_defaults(TRAINING, framework, True).pipeline_no_sync
