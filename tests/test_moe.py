"""Issue 21: mixture-of-experts models, expert parallelism and its all-to-all.

Figures: parameter counts as the models' publishers give them (Mixtral paper and Mistral's
posts, DeepSeek-V3's report, Qwen3's model card); FLOPs, all-to-all time and memory sharding by
hand from the formulas in :mod:`simcore.megatron.moe` and Megatron-LM's parallel folding.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import simcore
from planner.catalog import load_catalog
from planner.exports import export_files
from planner.plan import make_plan, strategy_dict, strategy_from_attrs
from search_spaces.frameworks import why_not
from search_spaces.space import StrategySpace
from simcore.megatron.kernels import KernelCosts
from simcore.megatron.layers import layer_shape
from simcore.megatron.moe import expert_kernels, moe_shape
from simcore.megatron.placement import pairwise_all_to_all
from simcore.megatron.plan import StepPlan
from simcore.megatron.step import _model_flops
from simcore.network import Network
from simcore.specs import (
    Axis,
    Convention,
    DeviceSpec,
    Recompute,
    Schedule,
    Strategy,
    TrainingSpec,
    ZeroStage,
)
from simcore.timeline import step_timeline

CATALOG = load_catalog()
MIXTRAL = CATALOG.model("mixtral-8x7b")
DSV3 = CATALOG.model("deepseek-v3")
H100_64 = CATALOG.system("dgx-h100-64")
H800 = CATALOG.system("dgx-h800-2048")
TRAINING = TrainingSpec(global_batch=256, seq_len=4096)
PLAN = Strategy(dp=16, tp=1, pp=4, ep=8, zero=ZeroStage.OPTIMIZER, schedule=Schedule.INTERLEAVED,
                v=8)
"""Megatron-Core's reference mapping for Mixtral 8x7B on 64 H100s: TP1 EP8 PP4 VP8 MBS1
(megatron/core/transformer/moe/README.md @b97184db)."""


def _params(name: str) -> tuple[float, float]:
    """(total, activated) parameters from the catalog shapes, in billions."""
    m = CATALOG.model(name)
    sh, ms = layer_shape(m), moe_shape(m)
    n_moe = m.moe_layer_count
    moe_layer = sh.attention_params + sh.other_params + ms.router_params + ms.shared_params
    ends = sh.embedding_params + sh.head_params
    dense = (m.layers - n_moe) * sh.layer_params + ends
    assert m.moe is not None
    return ((dense + n_moe * (moe_layer + ms.routed_params)) / 1e9,
            (dense + n_moe * (moe_layer + m.moe.top_k * ms.expert_params)) / 1e9)


@pytest.mark.parametrize(("name", "total", "active"), [
    ("mixtral-8x7b", 46.7, 12.9),     # Mistral, "Mixtral of experts" (12/2023)
    ("mixtral-8x22b", 141, 39),      # Mistral, "Cheaper, Better, Faster, Stronger" (04/2024)
    ("deepseek-v3", 671, 37),        # arXiv:2412.19437 abstract: 671B total, 37B activated
    ("qwen3-30b-a3b", 30.5, 3.3),    # Qwen3-30B-A3B model card: 30.5B total, 3.3B activated
    ("qwen3-235b-a22b", 235, 22),    # Qwen3-235B-A22B model card: 235B total, 22B activated
])
def test_catalog_shapes_give_the_published_parameter_counts(name, total, active) -> None:
    got_total, got_active = _params(name)
    assert got_total == pytest.approx(total, rel=0.01)
    assert got_active == pytest.approx(active, rel=0.03)


def test_model_flops_count_the_activated_experts_only() -> None:
    # By hand, Mixtral per sequence forward: 32 x (2 s (attention + router + 2 experts) +
    # 4 s^2 h) + 2 s h V; a step is 3 x that x the global batch (Megatron-LM's
    # num_floating_point_operations counts the top-k experts the same way)
    s, h, f, kv = 4096, 4096, 14336, 1024
    attention = 2 * h * h + 2 * h * kv
    expert = 3 * h * f
    per_sequence = (32 * (2 * s * (attention + 8 * h + 2 * expert) + 4 * s * s * h)
                    + 2 * s * h * 32000)
    assert _model_flops(MIXTRAL, layer_shape(MIXTRAL), TRAINING) == 3 * per_sequence * 256


def test_expert_gemm_flops_per_rank_do_not_depend_on_ep_or_etp() -> None:
    # Module docstring: each rank's experts do 2 T k c (3 h f_e) GEMM FLOPs forward (SwiGLU);
    # with every floor off and rate 1 FLOP/s the forward's GEMM seconds are those FLOPs
    costs = KernelCosts(flop_rate=1.0, byte_rate=float("inf"), attention_rate=1.0, launch=0.0,
                        sm_count=0)
    tokens, h, e = 4096, 4096, 8
    router = 2 * tokens * h * e
    expected = 2 * tokens * 2 * 3 * h * 14336 + router
    for ep, etp in ((1, 1), (8, 1), (4, 2), (2, 4)):
        k = expert_kernels(MIXTRAL, costs, tokens=tokens, ep=ep, etp=etp, act_bytes=2)
        assert k.forward == pytest.approx(expected, rel=1e-12)
        assert k.wgrad == pytest.approx(expected, rel=1e-12)


def test_all_to_all_is_pairwise_sends_over_the_slowest_dimension() -> None:
    # ep 64 on DeepSeek-V3's cluster: 8 GPUs of a node (160 GB/s) x 8 nodes (50 GB/s). Each rank
    # sends size/64 to each of 63 others: 7 inside the node, 56 across. By hand, 470 MB:
    # across 470e6 * 56/64 / 50e9 + 8.8 us = 8.2338 ms; inside 470e6 * 7/64 / 160e9 + 0.33 us.
    node, ib = H800.network.dims
    net = Network(dims=(node, replace(ib, npus=8)), scheduling=H800.network.scheduling)
    size = 470_000_000
    assert pairwise_all_to_all(net, size) == pytest.approx(size * 56 / 64 / 50e9 + 8.8e-6)
    inside = Network(dims=(node,), scheduling=H800.network.scheduling)
    assert pairwise_all_to_all(inside, size) == pytest.approx(size * 7 / 8 / 160e9 + 0.33e-6)


def test_the_estimate_times_each_moe_layer_s_four_all_to_alls() -> None:
    # Forward: dispatch and combine over ep; backward the same again. Each rank's buffer is its
    # T k rows of h bf16 values, T = 4096 tokens (mb 1, tp 1): 4096 * 2 * 4096 * 2 bytes. The
    # ep 8 group is one node of H100s: pairwise, (7/8) size / 392 GB/s + 0.33 us, plus NCCL's
    # call (11 us) and the host's collective launch (the H100's collective_launch_us, 5.07 us),
    # per all-to-all.
    size = 4096 * 2 * 4096 * 2
    assert H100_64.device.collective_launch_s == pytest.approx(5.07e-6)
    one = size * 7 / 8 / 392e9 + 0.33e-6 + 11e-6 + 5.07e-6
    est = simcore.estimate(MIXTRAL, H100_64, TRAINING, PLAN)
    m = TRAINING.global_batch // PLAN.dp
    layers = MIXTRAL.layers // PLAN.pp
    assert est.time.ep == pytest.approx(m * layers * 4 * one, rel=1e-9)


def test_expert_states_are_sharded_over_expert_data_parallelism() -> None:
    # ZeRO-1 with ep 8 on 64 GPUs, pp 4: edp = tp*sp*dp / (etp*ep) = 16 / 8 = 2. A stage's
    # routed experts: 8 layers x 8/8 experts x 3 h f_e; their optimizer state (12 bytes) is
    # sharded over edp = 2, their weights and gradients (2 + 2 bytes) are whole.
    est = simcore.estimate(MIXTRAL, H100_64, TRAINING, PLAN)
    p = StepPlan(MIXTRAL, H100_64, TRAINING, PLAN)
    experts = 8 * 1 * 3 * 4096 * 14336
    sh, ms = layer_shape(MIXTRAL), moe_shape(MIXTRAL)
    dense = 8 * (sh.attention_params + sh.other_params + ms.router_params)
    stage = est.stages[1]  # a middle stage: no embedding or head
    assert PLAN.edp == 2 and p.stage_moe_layers == (8, 8, 8, 8)
    assert stage.memory.optimizer == pytest.approx(12 * (dense / 16 + experts / 2), rel=1e-12)
    assert stage.memory.weights == pytest.approx(2 * (dense + experts), rel=1e-12)
    # the same plan without expert parallelism holds all 8 experts per layer
    flat = simcore.estimate(MIXTRAL, H100_64, TRAINING, replace(PLAN, ep=1))
    assert flat.stages[1].memory.weights == pytest.approx(2 * (dense + 8 * experts), rel=1e-12)


def test_first_dense_layers_are_dense() -> None:
    moe = DSV3.moe
    assert moe is not None and DSV3.moe_layer_count == 58
    assert [moe.is_moe(i) for i in range(5)] == [False, False, False, True, True]
    p = StepPlan(DSV3, H800, TrainingSpec(global_batch=15360, seq_len=4096),
                 Strategy(dp=128, pp=16, ep=64, etp=1, zero=ZeroStage.OPTIMIZER,
                          recompute=Recompute.FULL, first_stage_layers=1, last_stage_layers=4))
    assert p.stage_layers[0] == 1 and p.stage_moe_layers[0] == 0
    assert p.stage_moe_layers[1] == 2  # layers 1-4: 3 and 4 are MoE
    assert sum(p.stage_moe_layers) == 58


@pytest.mark.parametrize(("strategy", "match"), [
    (replace(PLAN, ep=16), "ep=16 must divide experts=8"),
    (Strategy(dp=8, tp=2, pp=4, ep=8, sequence_parallel=False), "sequence parallelism"),
    (replace(PLAN, zero=ZeroStage.PARAMETERS), "zero=3"),
    (replace(PLAN, placement=(Axis.TP, Axis.PP, Axis.DP, Axis.SP)), "pp outermost"),
])
def test_expert_rules(strategy, match) -> None:
    with pytest.raises(ValueError, match=match):
        simcore.check(MIXTRAL, H100_64, TRAINING, strategy)


def test_expert_parallelism_needs_an_moe_model() -> None:
    dense = CATALOG.model("llama3-8b")
    with pytest.raises(ValueError, match="needs a model with MoE layers"):
        simcore.check(dense, H100_64, TRAINING, Strategy(dp=64, ep=8))


def test_space_searches_ep_and_etp_without_duplicates() -> None:
    space = StrategySpace(model=MIXTRAL, system=H100_64, training=TRAINING,
                          convention=Convention.MEGATRON, tp=(1, 2), pp=(4,), ep=(1, 8),
                          etp=(None, 1), zero=(ZeroStage.OPTIMIZER,))
    valid = space.valid
    labels = [p for p in map(lambda s: (s.tp, s.ep, s.expert_tp), valid)]
    assert len(labels) == len(set(labels))  # etp 1 at tp 1 is the tp default, listed once
    assert {(s.tp, s.ep, s.etp) for s in valid} == {
        (1, 1, None), (1, 8, None), (2, 1, None), (2, 1, 1), (2, 8, None), (2, 8, 1)}
    assert space.valid_count == len(valid)


def test_frameworks_rules_and_exports() -> None:
    dsv3 = Strategy(dp=128, pp=16, ep=64, etp=1, zero=ZeroStage.OPTIMIZER,
                    first_stage_layers=1, last_stage_layers=4)
    assert "top-1 and top-2" in why_not("deepspeed", DSV3, TRAINING, dsv3)
    assert "no expert tensor parallelism" in why_not(
        "torchtitan", MIXTRAL, TRAINING, Strategy(dp=32, tp=2, ep=8, etp=2))
    assert why_not("megatron", MIXTRAL, TRAINING, PLAN) is None
    plan = make_plan(MIXTRAL, H100_64, TRAINING, PLAN, Convention.MEGATRON)
    script = export_files(plan, "megatron")["megatron.sh"]
    for option in ("--num-experts 8", "--moe-router-topk 2", "--moe-ffn-hidden-size 14336",
                   "--expert-model-parallel-size 8", "--moe-token-dispatcher-type alltoall"):
        assert option in script
    titan = export_files(plan, "torchtitan")["torchtitan.toml"]
    assert "expert_parallel_degree = 8" in titan  # borrowed from dp_shard 16 (ZeRO 1: FSDP)
    assert "no torchtitan flavor has model mixtral-8x7b's shape" in titan
    assert strategy_from_attrs(strategy_dict(PLAN) | {"placement": "tp,sp,dp,pp"}) == PLAN


def test_timeline_ends_at_the_estimate_with_the_all_to_alls_drawn() -> None:
    one_stage = Strategy(dp=32, tp=2, ep=8, etp=1, micro_batch=2, zero=ZeroStage.OPTIMIZER)
    est = simcore.estimate(MIXTRAL, H100_64, TRAINING, one_stage)
    tl = step_timeline(MIXTRAL, H100_64, TRAINING, one_stage, estimate=est)
    assert tl.end == pytest.approx(est.step_time, rel=1e-9)
    ep = np.array(tl.phase_names) == "ep"
    assert tl.duration[ep].sum() == pytest.approx(est.time.ep, rel=1e-9)
    # dispatch and combine on a row of their own under each stage
    assert tl.rows[:3] == ("stage 0", "stage 0 comm", "stage 0 all-to-all")
    assert set(np.array(tl.rows)[tl.row[ep]]) == {"stage 0 all-to-all"}


def test_the_fp8_weight_copy_covers_the_experts() -> None:
    h100 = DeviceSpec(name="x", peak_flops_per_s=1e15, hbm_bytes=80e9,
                      hbm_bandwidth_bytes_per_s=3e12, fp8_peak_flops_per_s=2e15)
    system = replace(H100_64, device=h100)
    from simcore.specs import Precision
    bf16 = simcore.estimate(MIXTRAL, system, TRAINING, PLAN).stages[1].memory.weights
    fp8 = simcore.estimate(MIXTRAL, system, TRAINING,
                           replace(PLAN, precision=Precision.FP8)).stages[1].memory.weights
    sh = layer_shape(MIXTRAL)
    linears = 8 * (sh.attention_params + 3 * 4096 * 14336)  # attention and the local expert
    assert fp8 - bf16 == pytest.approx(linears, rel=1e-12)  # 1 byte each


@pytest.mark.parametrize("first_dense", [0, 1, 3])
@pytest.mark.parametrize("every", [1, 2, 3])
def test_moe_layer_counts_in_closed_form_match_the_layer_by_layer_rule(first_dense, every):
    from simcore.specs import MoESpec

    moe = MoESpec(experts=8, top_k=2, expert_ffn=8, first_dense=first_dense, every=every)
    for start in range(12):
        for stop in range(start, 14):
            assert moe.moe_layers(start, stop) == sum(moe.is_moe(i) for i in range(start, stop))


def test_ep_overlap_hides_the_all_to_alls_behind_another_micro_batch() -> None:
    # With --overlap-moe-expert-parallel-comm a layer's four all-to-alls run beside another
    # micro-batch's forward and backward of the layer: exposed max(0, a2a - compute) plus the
    # compute's slowdown (0.189 of the overlap) - the same rule as every hidden collective
    p = StepPlan(MIXTRAL, H100_64, TRAINING, PLAN)
    from simcore.megatron.layer_step import moe_layer
    plain = moe_layer(p)
    a2a = plain.ep_fwd + plain.ep_bwd
    overlapped = simcore.estimate(MIXTRAL, H100_64, TRAINING, replace(PLAN, ep_overlap=True))
    m, layers = TRAINING.global_batch // PLAN.dp, MIXTRAL.layers // PLAN.pp
    hidden = max(0.0, a2a - plain.compute) + 0.189 * min(a2a, plain.compute)
    assert overlapped.time.ep == pytest.approx(m * layers * hidden, rel=1e-9)
    assert overlapped.step_time < simcore.estimate(MIXTRAL, H100_64, TRAINING, PLAN).step_time
    with pytest.raises(ValueError, match="ep > 1"):
        simcore.check(MIXTRAL, H100_64, TRAINING, replace(PLAN, ep=1, ep_overlap=True))
    assert "--overlap-moe-expert-parallel-comm" in export_files(
        make_plan(MIXTRAL, H100_64, TRAINING, replace(PLAN, ep_overlap=True),
                  Convention.MEGATRON), "megatron")["megatron.sh"]
    assert "ep_overlap" in why_not("torchtitan", MIXTRAL, TRAINING, replace(PLAN, ep_overlap=True))


def test_ep_overlap_reads_back_from_trials_and_from_a_results_table() -> None:
    # a trial stores True; the Parquet table 1 (a nullable integer column), NaN / None if unset
    attrs = strategy_dict(replace(PLAN, ep_overlap=True)) | {"placement": "tp,sp,dp,pp"}
    for stored, expected in ((True, True), (1, True), (float("nan"), False), (None, False)):
        assert strategy_from_attrs(attrs | {"ep_overlap": stored}).ep_overlap is expected


def test_fp8_keeps_the_expert_gemms_inputs_in_one_byte() -> None:
    # Transformer Engine's grouped linear layer saves its inputs quantised, as its dense linear
    # layers do. By hand, Mixtral at micro-batch 1, seq 4096, tp 1: T = 4096 tokens, k = 2,
    # so 8,192 routed rows; FC1's input is h = 4,096 wide and FC2's the expert FFN, 14,336:
    # FP8 saves 1 byte of each, 8192 x (4096 + 14336) bytes a layer.
    from simcore.specs import Precision
    h100 = DeviceSpec(name="x", peak_flops_per_s=1e15, hbm_bytes=80e9,
                      hbm_bandwidth_bytes_per_s=3e12, fp8_peak_flops_per_s=2e15)
    system = replace(H100_64, device=h100)
    training = TrainingSpec(global_batch=256, seq_len=4096, transformer_engine=True)
    plan = replace(PLAN, recompute=Recompute.NONE)
    bf16 = StepPlan(MIXTRAL, system, training, plan)
    fp8 = StepPlan(MIXTRAL, system, training, replace(plan, precision=Precision.FP8))
    assert bf16.expert_act - fp8.expert_act == pytest.approx(8192 * (4096 + 14336), rel=1e-12)
    assert bf16.expert_act_full - fp8.expert_act_full == pytest.approx(8192 * (4096 + 14336))


@pytest.mark.parametrize(("model", "ep", "dedup", "forward", "backward"), [
    # Counted in the sources at NVIDIA/Megatron-LM@d7288711 (Megatron-Bridge v0.4.0's) and
    # Transformer Engine 2.14 for Megatron-Bridge's H100 FP8 (current scaling) presets, one
    # micro-batch on one rank, collectives apart:
    # Qwen3-30B-A3B ep 16 on HybridEP, 8 local experts: router GEMM 1 + 6 small (8 in the
    # benchmarks, whose forced balance draws random logits), dispatch and combine 15, FC1 and
    # FC2 a GEMM each per expert (16), SwiGLU 1, two inputs quantised per expert in 4 kernels
    # (64): 103 forward; backward router 2 GEMMs + 8, 10, 32 GEMMs, SwiGLU's 2, 64
    # quantisations of the output gradients: 118.
    ("qwen3-30b-a3b", 16, True, 103, 118),
    # Qwen3-235B-A22B ep 32 on the all-to-all dispatcher, 4 local experts: 1 + 6 + 19 + 8 + 1 +
    # 32 = 67 forward; 2 + 8 + 7 + 16 + 2 + 32 = 67 backward.
    ("qwen3-235b-a22b", 32, False, 67, 67),
])
def test_expert_kernel_inventory_counts_megatron_s_launches(model, ep, dedup, forward,
                                                            backward) -> None:
    # With every rate infinite each kernel costs the launch floor: 1 s, so seconds = kernels.
    inf = float("inf")
    costs = KernelCosts(flop_rate=inf, byte_rate=inf, attention_rate=inf, launch=1.0,
                        sm_count=0, fp8_rate=inf)
    k = expert_kernels(CATALOG.model(model), costs, tokens=4096, ep=ep, etp=1, act_bytes=2,
                       dedup=dedup)
    assert (k.kernels_forward, k.kernels_backward) == (forward, backward)
    assert (k.forward, k.backward) == (forward, backward)


def test_other_stacks_run_the_experts_as_one_grouped_gemm() -> None:
    # Without Transformer Engine FC1 and FC2 are one grouped kernel each and every FP8 input
    # one cast over all local experts: Qwen3-30B-A3B ep 16 forward 1 + 6 + 19 + 2 + 1 + 2 = 31
    inf = float("inf")
    costs = KernelCosts(flop_rate=inf, byte_rate=inf, attention_rate=inf, launch=1.0,
                        sm_count=0, fp8_rate=inf)
    k = expert_kernels(CATALOG.model("qwen3-30b-a3b"), costs, tokens=4096, ep=16, etp=1,
                       act_bytes=2, transformer_engine=False)
    assert (k.kernels_forward, k.forward) == (31, 31)
    assert (k.kernels_backward, k.backward) == (2 + 8 + 7 + 4 + 2 + 2, 25)


def test_expert_kernels_move_their_bytes_once_each() -> None:
    # With launches free, GEMMs instant and 1 byte/s, Qwen3-30B-A3B ep 16 (T = 4096 tokens,
    # 128 experts, top-8: 32,768 rows, h 2048, expert FFN 768) forward moves, by hand: the
    # router's fp32 scores read and written 2 x 4 T E; the permute and unpermute 2 x 2 bytes x
    # rows x h each; SwiGLU reads gate and up, writes one: 3 x 2 x rows x 768; FP8 quantises
    # FC1's and FC2's inputs: amax reads 2 bytes, the cast reads 2 and writes 1 twice (6 bytes
    # an element in all), rows x (2048 + 768); and every GEMM its operands (KernelCosts.gemm /
    # .linear: the router's 16-bit, each of the 8 experts' FC1 and FC2 1-byte inputs and
    # weights, 16-bit outputs, on 4,096 rows each)
    inf = float("inf")
    costs = KernelCosts(flop_rate=inf, byte_rate=1.0, attention_rate=inf, launch=0.0,
                        sm_count=0, fp8_rate=inf)
    k = expert_kernels(CATALOG.model("qwen3-30b-a3b"), costs, tokens=4096, ep=16, etp=1,
                       act_bytes=2)
    rows = 4096 * 8
    expected = (2 * 4 * 4096 * 128 + 2 * (2 * 2 * rows * 2048) + 3 * 2 * rows * 768
                + 6 * rows * (2048 + 768)
                + 2 * (4096 * 2048 + 2048 * 128 + 4096 * 128)
                + 8 * ((4096 * 2048 + 2048 * 1536) + 2 * 4096 * 1536)
                + 8 * ((4096 * 768 + 768 * 2048) + 2 * 4096 * 2048))
    assert k.forward == pytest.approx(expected, rel=1e-12)


def test_megatron_overlaps_the_all_to_alls_of_a_pipeline_only_interleaved() -> None:
    # megatron/core/transformer/transformer_config.py (d98e8a64): "If enabling EP A2A
    # overlap, virtual_pipeline_model_parallel_size must be specified when
    # pipeline_model_parallel_size > 1": such a plan was offered and exported, and its
    # megatron.sh stopped at the assert
    plan = replace(PLAN, ep_overlap=True, schedule=Schedule.ONE_F_ONE_B, v=1)
    said = why_not("megatron", MIXTRAL, TRAINING, plan)
    assert said is not None and "needs an interleaved pipeline" in said
    assert why_not("megatron", MIXTRAL, TRAINING, replace(PLAN, ep_overlap=True)) is None
