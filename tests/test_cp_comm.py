"""Context parallelism's attention kernels and how K and V travel (``cp_comm``).

Transformer Engine's two context-parallel attentions (NVIDIA/TransformerEngine@v2.9
``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``), as
``simcore.megatron.cp_kernels`` counts them:

- ``p2p`` (``AttnFuncWithCPAndKVP2P``, Megatron-LM's default): forward, K and V concatenated
  into the send buffer, cp attention kernels, cp - 1 corrections of the fp32 softmax statistics
  (``flash_attn_fwd_softmax_lse_correction``) and cp merges of each step's output into the
  running one (``flash_attn_fwd_out_correction`` and its ``_init``); backward, per step one
  attention kernel and the adds of its dQ, dK and dV (``dq.add_``, ``dk.add_``, ``dv.add_``).
  The K and V chunks travel behind the steps' kernels.
- ``all_gather`` (``AttnFuncWithCPAndKVAllGather``, "KV all-gather between CP ranks is
  exposed"): two attention kernels a pass, the gathered K and V reordered, no merge; the
  all-gathers and reduce-scatters on the critical path.
- ``a2a`` (``AttnFuncWithCPAndQKVOA2A``, DeepSpeed-Ulysses): Q, K, V and the output
  all-to-all'd (``flash_attn_a2a_communicate``), one attention kernel over the whole sequence
  for cp-th of the heads; the all-to-alls on the critical path.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner.catalog import load_catalog
from planner.cli import main
from planner.exports import export_files
from planner.plan import make_plan, read_plan
from planner.runs_csv import read_runs_files
from planner.validation import validate
from search_spaces.frameworks import why_not, with_framework_defaults
from simcore.megatron.calls import cp_kv_calls
from simcore.megatron.checks import check_plan, valid_plans
from simcore.megatron.cp_kernels import context_parallel_core
from simcore.megatron.kernels import KernelCosts
from simcore.megatron.layer_step import dense_layer, hidden_cost
from simcore.megatron.plan import StepPlan
from simcore.network import Collective
from simcore.specs import Axis, Convention, CpComm, Recompute, Strategy, TrainingSpec

COSTS = KernelCosts(flop_rate=1e14, byte_rate=1e12, attention_rate=1e14, launch=0.0,
                    sm_count=0)
"""Round rates, no launch floor: each kernel is its FLOPs at 100 TFLOPS or its bytes at 1 TB/s."""

# one rank's share: 1,024 queries (a micro-batch of one sequence of 4,096 split over cp 4),
# 4 local heads of 128 (Q 512 wide), one K/V head (128 wide), 16-bit activations
SHAPE = dict(queries=1024, keys=4096, heads=4, q_width=512, kv_width=128, act_bytes=2)
FLOPS = 1e12
"""The rank's forward attention FLOPs (its share of the causal work); backward 2.5x."""


def _core(cp_comm: CpComm, costs: KernelCosts = COSTS) -> tuple[list[float], list[float]]:
    return context_parallel_core(costs, cp_comm, cp=4, flops=FLOPS, backward_flops=2.5 * FLOPS,
                                 **SHAPE)


def test_the_ring_by_hand() -> None:
    forward, backward = _core(CpComm.P2P)
    attention = FLOPS / 1e14  # 10 ms over the 4 steps
    q, k = 1024 * 512, 1024 * 128  # the rank's Q and K elements
    by_hand_forward = (attention
                       + 2 * 2 * 2 * k / 1e12          # K and V read, the buffer written
                       + 3 * (3 * 4 * 1024 * 4) / 1e12  # 3 statistic corrections (fp32 x 4 heads)
                       + 4 * (3 * 2 * q) / 1e12)       # 4 merges: read step and running, write
    by_hand_backward = 2.5 * attention + 4 * (3 * 2 * q + 2 * 3 * 2 * k) / 1e12
    assert sum(forward) == pytest.approx(by_hand_forward, rel=1e-12)
    assert sum(backward) == pytest.approx(by_hand_backward, rel=1e-12)


def test_the_all_gather_by_hand() -> None:
    forward, backward = _core(CpComm.ALL_GATHER)
    attention = FLOPS / 1e14
    a, q, k, gathered = 2, 1024 * 512, 1024 * 128, 4096 * 128
    gather = 2 * (2 * a * k) + 2 * (2 * a * gathered)  # local K, V contiguous; gathered reordered
    # each of the two query chunks (half the rank's queries, over the keys before it: half the
    # gathered ones on average) copies its queries, K and V contiguous and its output into
    # place, each read and written
    chunk = 2 * a * q / 2 + 2 * (2 * a * gathered / 2) + 2 * a * q / 2
    assert sum(forward) == pytest.approx(attention + (gather + 2 * chunk) / 1e12, rel=1e-12)
    # backward: the chunk's queries, output and output gradient contiguous, K and V contiguous,
    # its dQ into place, its dK and dV contiguous and added (read two, write one) into the
    # zero-filled whole-sequence buffers; then dK and dV reordered and their scattered shares
    # made contiguous
    chunk = (3 * (2 * a * q / 2) + 2 * (2 * a * gathered / 2) + 2 * a * q / 2
             + 2 * (2 * a * gathered / 2) + 2 * (3 * a * gathered / 2))
    scatter = 2 * (a * gathered) + 2 * (2 * a * gathered) + 2 * (2 * a * k)
    assert sum(backward) == pytest.approx(
        2.5 * attention + (gather + 2 * chunk + scatter) / 1e12, rel=1e-12)


def test_kernel_counts_meet_the_launch_floor() -> None:
    """With every kernel at its launch floor the core costs its kernel count: the ring 3 cp
    forward (1 copy, cp attention, cp - 1 corrections, cp merges) and 4 cp backward; the
    all-gather 14 forward (4 copies around the gather, 5 kernels a query chunk) and 32
    backward (4, 11 a chunk, 6 around the reduce-scatter), whatever cp."""
    floor = KernelCosts(flop_rate=1e30, byte_rate=1e30, attention_rate=1e30, launch=1e-5,
                        sm_count=0)
    forward, backward = _core(CpComm.P2P, floor)
    assert (len(forward), len(backward)) == (12, 16)
    assert sum(forward) == pytest.approx(12e-5) and sum(backward) == pytest.approx(16e-5)
    forward, backward = _core(CpComm.ALL_GATHER, floor)
    assert (len(forward), len(backward)) == (14, 32)


LLAMA = load_catalog(user=False).model("llama3-8b")
SYSTEM = load_catalog(user=False).system("dgx-h100-64")
CP4 = Strategy(dp=8, tp=2, sp=4)


def _layer(cp_comm: CpComm | None, strategy: Strategy = CP4):
    training = TrainingSpec(global_batch=64, seq_len=65536, cp_comm=cp_comm)
    p = StepPlan(LLAMA, SYSTEM, training, strategy)
    return p, dense_layer(p)


def test_the_all_gather_is_exposed_and_the_ring_hides() -> None:
    ring_plan, ring = _layer(None)
    gathered_plan, gathered = _layer(CpComm.ALL_GATHER)
    gathers, scatters = cp_kv_calls(gathered_plan)
    gather = gathered_plan.comm.total(gathers)
    scatter = gathered_plan.comm.total(scatters)
    # the same bytes either way; exposed whole when all-gathered
    assert (gathered.sp_fwd, gathered.sp_bwd) == pytest.approx((gather, gather + scatter))
    core = ring_plan.kernels.core_forward
    assert (ring.sp_fwd, ring.sp_bwd) == pytest.approx(
        (hidden_cost(ring_plan, gather, core), hidden_cost(ring_plan, gather + scatter, 2 * core)))


def test_cp_1_is_the_same_either_way() -> None:
    plain = Strategy(dp=32, tp=2)
    _, ring = _layer(None, plain)
    _, gathered = _layer(CpComm.ALL_GATHER, plain)
    assert ring == gathered


def test_spellings_and_bad_values() -> None:
    assert CpComm("allgather") is CpComm.ALL_GATHER  # Megatron-LM's --cp-comm-type spelling
    with pytest.raises(ValueError, match="unknown cp_comm 'ring'; allowed: p2p, all_gather, a2a"):
        CpComm("ring")


def test_estimate_cli(capsys) -> None:
    args = ["estimate", "--model", "llama3-8b", "--system", "dgx-h100-64", "--dp", "8", "--tp",
            "2", "--sp", "4", "--micro-batch", "1", "--global-batch", "64", "--seq-len", "65536"]
    assert main([*args, "--cp-comm", "all_gather"]) == 0
    assert "K and V all-gathered" in capsys.readouterr().out.splitlines()[0]
    assert main([*args, "--json"]) == 0
    assert "cp_comm" not in json.loads(capsys.readouterr().out)  # the default, p2p
    assert main([*args, "--cp-comm", "all_gather", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cp_comm"] == "all_gather"
    assert main([*args, "--cp-comm", "ring"]) == 2
    assert "invalid choice: 'ring'" in capsys.readouterr().err


def _plan(cp_comm: CpComm | None):
    training = TrainingSpec(global_batch=64, seq_len=65536, cp_comm=cp_comm)
    return make_plan(LLAMA, SYSTEM, training, CP4, Convention.MEGATRON)


def test_exports(tmp_path: Path) -> None:
    gathered = _plan(CpComm.ALL_GATHER)
    files = export_files(gathered, "megatron")
    script = next(text for name, text in files.items() if name.endswith(".sh"))
    assert "--cp-comm-type allgather" in script
    ring = export_files(_plan(None), "megatron")
    assert not any("--cp-comm-type" in text for text in ring.values())  # p2p: the default
    refused = why_not("torchtitan", LLAMA, gathered.training, CP4)
    assert refused is not None and refused.startswith("cp_comm all_gather: torchtitan's")
    assert why_not("torchtitan", LLAMA, _plan(None).training, CP4) is None
    assert why_not("megatron", LLAMA, gathered.training, CP4) is None
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(export_files(gathered, "plan")["plan.yaml"])
    assert "cp_comm: all_gather" in plan_file.read_text()
    assert read_plan(plan_file).training.cp_comm is CpComm.ALL_GATHER


def test_study_and_runs_csv(tmp_path: Path, capsys) -> None:
    study = tmp_path / "cp.yaml"
    study.write_text("name: cp\nmodel: llama3-8b\nsystem: dgx-h100-64\nframework: megatron\n"
                     "training: {global_batch: 64, seq_len: 65536, cp_comm: all_gather}\n"
                     "space: {tp: [2], sp: [1, 4], pp: [1], micro_batch: [1],"
                     " recompute: [none]}\n")
    assert main(["run", str(study), "--storage", str(tmp_path / "s.db"), "--quiet"]) == 0
    capsys.readouterr()
    study.write_text(study.read_text().replace("all_gather", "ring"))
    assert main(["run", str(study), "--storage", str(tmp_path / "s.db")]) == 2
    assert ("training.cp_comm: unknown value 'ring'; use one of p2p, all_gather, a2a"
            in capsys.readouterr().err)
    runs = tmp_path / "runs.csv"
    runs.write_text("model,system,global_batch,seq_len,dp,tp,pp,sp,micro_batch,cp_comm,"
                    "step_time_s\n"
                    "llama3-8b,dgx-h100-64,64,65536,8,2,1,4,1,p2p,15\n"
                    "llama3-8b,dgx-h100-64,64,65536,8,2,1,4,1,allgather,15\n")
    assert main(["validate", str(runs), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    # each row estimated as its column says (Megatron-LM's spelling allgather read too)
    for row, cp_comm in zip(rows, (CpComm.P2P, CpComm.ALL_GATHER), strict=True):
        assert row["predicted_step_time_s"] == pytest.approx(_plan(cp_comm).estimate.step_time)
    assert rows[0]["predicted_step_time_s"] != rows[1]["predicted_step_time_s"]


def test_the_check_runs_at_cp_2_and_more() -> None:
    """Every check run with context parallelism (Megatron-Core / NeMo / Megatron-Bridge and
    MLPerf's NeMo runs, all on TE's default ring): 118 runs at cp 2-32. Without the ring's
    merges they were estimated fast by 4.6% on average (the 11 at cp 4-32 by 22.6%); with
    them by 2.3% (19.3%); with the host's time per kernel by 2.0% (19.3%). Megatron-LM's
    functional tests of its small GPT (megatron-ci-h100-check.csv and megatron-ci-gb200-check.csv,
    11 and 10 runs at cp 2) are left out: their layers run at the host's pace, not the ring's."""
    data = Path(__file__).parent / "data" / "validation"
    files = [p for p in sorted(data.glob("*-check.csv"))  # amp-het: on a mixed cluster, cp 1
             if not p.name.startswith(("megatron-ci-h100", "megatron-ci-gb200", "amp-het"))]
    result = validate(*read_runs_files(files, load_catalog()))
    errors = [(r.run.strategy.sp, r.step_time_error) for r in result.results
              if r.step_time_error is not None and r.run.strategy.sp > 1]
    assert len(errors) == 118
    assert -0.03 <= sum(e for _, e in errors) / len(errors) <= 0.0
    wide = [e for c, e in errors if c >= 4]
    assert len(wide) == 11 and -0.21 <= sum(wide) / len(wide) <= -0.17


def test_the_all_to_all_by_hand() -> None:
    """DeepSpeed-Ulysses (``a2a``): each of Q, K, V made contiguous before its all-to-all and
    reordered after (two copies, each read and written), one attention kernel over the whole
    sequence for a quarter of the heads (the same FLOPs as the rank's share), the output back
    the same way; backward the output and its gradient forward, dQ, dK and dV back."""
    forward, backward = _core(CpComm.A2A)
    attention = FLOPS / 1e14
    a, q, k = 2, 1024 * 512, 1024 * 128
    copies = 2 * (2 * a)  # two copies, each read and written
    assert (len(forward), len(backward)) == (9, 11)
    assert sum(forward) == pytest.approx(attention + copies * (q + 2 * k + q) / 1e12, rel=1e-12)
    assert sum(backward) == pytest.approx(
        2.5 * attention + copies * (2 * q + q + 2 * k) / 1e12, rel=1e-12)


def test_the_all_to_alls_and_their_sizes() -> None:
    p = StepPlan(LLAMA, SYSTEM, TrainingSpec(global_batch=64, seq_len=65536,
                                             cp_comm=CpComm.A2A), CP4)
    forward, more = cp_kv_calls(p)
    # a rank's 16,384 tokens of one sequence: Q 4,096 wide and K, V 1,024 wide (Llama 3 8B's
    # 32 and 8 heads of 128) over tp 2, in bf16; each all-to-all's size is the rank's input
    q, k = 16384 * 4096 * 2 / 2, 16384 * 1024 * 2 / 2
    assert forward == [(Axis.SP, Collective.ALL_TO_ALL, size) for size in (q, k, k, q)]
    assert more == [(Axis.SP, Collective.ALL_TO_ALL, q)]  # the output's gradient
    layer = dense_layer(p)
    assert (layer.sp_fwd, layer.sp_bwd) == pytest.approx(
        (p.comm.total(forward), p.comm.total(forward + more)))
    full = StepPlan(LLAMA, SYSTEM, TrainingSpec(global_batch=64, seq_len=65536,
                                                cp_comm=CpComm.A2A),
                    replace(CP4, recompute=Recompute.FULL))
    # full recompute runs the attention's all-to-alls again
    assert dense_layer(full).sp_bwd == pytest.approx(p.comm.total(forward * 2 + more))


def test_the_all_to_all_needs_the_heads_to_divide() -> None:
    # Llama 3 8B: 8 K/V heads, 4 a rank at tp 2: cp 8 cannot split them
    training = TrainingSpec(global_batch=64, seq_len=65536, cp_comm=CpComm.A2A)
    with pytest.raises(ValueError, match=r"sp=8 must divide kv_heads/tp=4 \(cp_comm a2a gives"
                                         r" each rank cp-th of a tp rank's heads\); allowed sp:"
                                         r" 1, 2, 4"):
        check_plan(LLAMA, SYSTEM, training, Strategy(dp=4, tp=2, sp=8))
    check_plan(LLAMA, SYSTEM, replace(training, cp_comm=None), Strategy(dp=4, tp=2, sp=8))
    columns = {"dp": [4, 8], "tp": [2, 2], "pp": [1, 1], "sp": [8, 4], "micro_batch": [1, 1],
               "v": [1, 1], "interleaved": [False, False], "sequence_parallel": [True, True]}
    assert valid_plans(LLAMA, SYSTEM, training, columns).tolist() == [False, True]


def test_deepspeed_runs_ulysses() -> None:
    written = TrainingSpec(global_batch=64, seq_len=65536)
    ds = with_framework_defaults(written, "deepspeed", True)
    assert ds.cp_comm is CpComm.A2A
    ulysses = Strategy(dp=16, sp=4)  # DeepSpeed-Ulysses runs with tp 1 and pp 1
    assert why_not("deepspeed", LLAMA, ds, ulysses) is None
    assert why_not("deepspeed", LLAMA, replace(ds, cp_comm=None), ulysses) == (
        "cp_comm p2p: deepspeed's context parallelism is DeepSpeed-Ulysses' all-to-all; use"
        " cp_comm a2a, or framework megatron")
    assert why_not("torchtitan", LLAMA, ds, ulysses).startswith("cp_comm a2a: torchtitan's")
    # as a deepspeed study holds it: the training it wrote kept, so that Megatron-LM's export
    # fills in its own loss, not Megatron-DeepSpeed's (which it cannot run)
    plan = make_plan(LLAMA, SYSTEM, ds, ulysses, Convention.MEGATRON,
                     given_training=replace(written, cp_comm=CpComm.A2A))
    script = next(text for name, text in export_files(plan, "megatron").items()
                  if name.endswith(".sh"))
    assert "--cp-comm-type a2a" in script
    assert export_files(plan, "deepspeed")


def test_validate_by_a_knob_of_the_plans(capsys) -> None:
    """`planner validate --by cp` splits the runs by context parallelism, counts in order: the
    long-context file's 17 runs are 5 without cp, 3 at cp 2, 4 at cp 4, 2 each at 8 and 16 and
    one at 32 (its tp / pp / cp columns), and every cp > 1 part estimated fast as a body."""
    assert main(["validate", str(Path(__file__).parent / "data" / "validation"
                                 / "long-context-check.csv"), "--by", "cp", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["by"]["rows"]
    assert [(r["cp"], r["step_time_runs"]) for r in rows] == [
        ("1", 5), ("2", 3), ("4", 4), ("8", 2), ("16", 2), ("32", 1)]
    assert all(r["step_time_mean_error"] < 0 for r in rows if r["cp"] != "1")
    assert main(["validate", str(Path(__file__).parent / "data" / "validation"
                                 / "long-context-check.csv"), "--by", "micro_batches"]) == 0
    assert "by micro_batches:" in capsys.readouterr().out
