"""ZeRO-2 reduces every micro-batch's gradients: it keeps only its shard of them, so each
backward reduce-scatters its own (DeepSpeed v0.12.6 ``deepspeed/runtime/engine.py``
``allreduce_gradients``: "ZeRO stage >= 2 communicates during non gradient accumulation
boundaries as well"; ZeRO-1 communicates at the boundary only). Its memory was already priced
so (a gradient shard a rank); now its time is too."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.catalog import load_catalog
from planner.exports import export_files
from simcore import Collective, estimate
from simcore.megatron.plan import StepPlan
from simcore.megatron.step import grad_buckets
from simcore.megatron.step_graph import step_graphs
from simcore.specs import Axis, Recompute, Schedule, Strategy, TrainingSpec, ZeroStage
from simcore.stage._graph import NodeKind
from tests.test_exports_chakra import SMALL, _compute_nodes, _megatron, _replay, _write

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


# -- the Chakra step graph writes them as the estimate times them --------------------------------
def test_zero2_step_graph_replays_to_its_estimate(tmp_path, capsys, monkeypatch) -> None:
    """One stage (pp 1): the graph's ops run one after the other, each earlier micro-batch's
    reduce-scatter after its backward (no ``overlap_grad_reduce``); replayed with no per-call
    latency (ASTRA-sim has none), the step ends where the estimate's does, within the rounding
    of compute nodes to whole microseconds (tests/test_exports_chakra.py's bound)."""
    monkeypatch.setenv("PLANNER_CATALOG", str(tmp_path / "user-catalog"))
    training = replace(SMALL, global_batch=128)
    plan = _megatron(training=training, dp=2, tp=8, zero=ZeroStage.GRADIENTS)
    folder = _write(export_files(plan, "chakra"), tmp_path)
    npus = _replay(capsys, folder)
    wall = max(r["wall_time"] for r in npus) * 1e-9
    computes = _compute_nodes(folder)
    assert abs(wall - plan.estimate.step_time) <= 0.5e-6 * computes / len(npus)
    zero1 = _megatron(training=training, dp=2, tp=8, zero=ZeroStage.OPTIMIZER)
    assert plan.estimate.time.dp > zero1.estimate.time.dp  # there is something to replay


def test_zero2_step_graph_buckets_each_reduction_beside_its_backward() -> None:
    """With ``overlap_grad_reduce`` each micro-batch's reduction goes in the estimate's buckets
    (:func:`simcore.megatron.step.grad_buckets`): all but the last start with its backward, the
    last waits for the backward's weight gradients, and the next micro-batch's forward waits
    for it. (Replayed, a bucket takes ASTRA-sim's time for its size, whose chunking is not
    linear in it, so the replay is not the estimate's ``max(link / n, link - backward)`` to the
    microsecond; no per-op check of that here.)"""
    training = replace(SMALL, global_batch=128, overlap_grad_reduce=True)
    plan = _megatron("dgx-a100-8", training, dp=8, tp=1, zero=ZeroStage.GRADIENTS)
    graph = step_graphs(plan.model, plan.system, plan.training, plan.strategy).graphs[0]
    p = StepPlan(plan.model, plan.system, plan.training, plan.strategy)
    # GPT 1.7B's 24 (12 h^2 + 13 h) + (51200 + 2048) h parameters, h = 2304 (Narayanan et al.
    # 2021's count, as tests/test_exports_chakra.py's HSDP test), all on the one stage
    h = 2304
    n = grad_buckets(p, 24 * (12 * h * h + 13 * h) + (51200 + 2048) * h)
    assert n > 1 and p.m == 16  # 128 sequences over dp 8 at micro-batch 1
    by_name: dict[str, list] = {}
    for node in graph.nodes:
        by_name.setdefault(node.name.rsplit(" ", 2)[0] if node.axis else node.name,
                           []).append(node)
    for k in range(p.m - 1):
        hidden = by_name[f"dp grad reduce c0 mb{k} (overlapped)"]
        (last,) = by_name[f"dp grad reduce c0 mb{k}"]
        (backward,) = by_name[f"bwd c0 mb{k} dgrad"]
        (wgrad,) = by_name[f"bwd c0 mb{k} wgrad"]
        (forward,) = by_name[f"fwd c0 mb{k + 1}"]
        assert len(hidden) == n - 1 and last.collective is Collective.REDUCE_SCATTER
        assert hidden[0].deps == backward.deps  # beside the backward, from its start
        assert wgrad.id in last.deps and hidden[-1].id in last.deps
        assert forward.deps == [last.id]


@pytest.mark.parametrize("knobs", [
    {"dp": 2, "tp": 8},
    {"dp": 2, "tp": 4, "pp": 2},
    {"dp": 2, "tp": 4, "pp": 2, "schedule": Schedule.ZB_H1},  # after each W pass
], ids=str)
def test_zero2_step_graph_reduce_scatters_every_micro_batch(knobs) -> None:
    """GPT 1.7B at batch 32 over dp 2, micro-batch 1: m = 16 micro-batches a step. Every NPU's
    graph reduce-scatters its stage's whole gradient 16 times over dp (ZeRO-1: once, at the
    end), each of the same size; the weights' all-gather once, as ZeRO-1's."""
    def dp_collectives(zero: ZeroStage) -> list[tuple[Collective, int]]:
        plan = _megatron(zero=zero, **knobs)
        graphs = step_graphs(plan.model, plan.system, plan.training, plan.strategy)
        return [(n.collective, n.size) for n in graphs.graphs[0].nodes
                if n.kind is NodeKind.COLL and n.axis == "dp"]

    one, two = dp_collectives(ZeroStage.OPTIMIZER), dp_collectives(ZeroStage.GRADIENTS)
    scatters = [size for c, size in two if c is Collective.REDUCE_SCATTER]
    assert len(scatters) == 16
    assert [size for c, size in one if c is Collective.REDUCE_SCATTER] == scatters[-1:]
    assert max(scatters) - min(scatters) <= 1  # sizes truncated to whole bytes
    gathers = [(c, size) for c, size in two if c is Collective.ALL_GATHER]
    assert gathers == [(c, size) for c, size in one if c is Collective.ALL_GATHER]
    assert len(gathers) == 1
