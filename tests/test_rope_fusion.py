"""``rope_fusion: false``: the rotary embedding run as PyTorch's element-wise ops. Sources:
``x * cos + rotate_half(x) * sin`` in Aleph-Alpha/scaling ``src/scaling/core/nn/rotary.py``,
Hugging Face's Llama and Megatron-LM's ``--no-rope-fusion`` path (NVIDIA/Megatron-LM@d98e8a64dd
``megatron/core/models/common/embeddings/rope_utils.py`` ``_rotate_half``); the complex form
of torchtitan's ``apply_rotary_emb`` (pytorch/torchtitan@0413364349
``torchtitan/models/llama/model.py``); PaddleNLP's LLaMA under FlagPerf, whose
``rope_fusion_level`` is None ("don't fuse any part of the rope embedding",
FlagOpen/FlagPerf@1b5a0303 ``training/benchmarks/llama1_7B/paddle/run_pretraining.py``) in every
NVIDIA config. Megatron-LM fuses by default. The kernel figures are hand calculations; the
measured ones are the validation files' (tests/data/validation/README.md, "Rotary embedding
as PyTorch's ops")."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner.catalog import load_catalog
from planner.cli import main
from planner.plan import make_plan
from simcore import estimate
from simcore.megatron.kernels import KernelCosts, layer_kernels
from simcore.megatron.layers import layer_shape
from simcore.specs import Convention, Strategy, TrainingSpec
from tests.runs_files import reread
from tests.training_flag_checks import (
    assert_a_study_and_a_plan_file_keep_it,
    estimates_with_and_without,
)

VALIDATION = Path(__file__).parent / "data" / "validation"
# Llama 3 8B (hidden 4096, 8 key-value heads of 128: K is 1024 wide) at sequence 4096,
# micro-batch 1, tp 1.
SEQ, H, KV = 4096, 4096, 1024
TRAINING = TrainingSpec(global_batch=8, seq_len=SEQ, flash_attention=True,
                        transformer_engine=False)
UNFUSED = replace(TRAINING, rope_fusion=False)


def _kernels(rope_fused: bool, tp: int = 1):
    c = load_catalog()
    model = c.model("llama3-8b")
    costs = KernelCosts.of(c.device("a100-80gb"))
    return costs, layer_kernels(model, layer_shape(model), costs, micro_batch=1, queries=SEQ,
                                seq_len=SEQ, tp=tp, sequence_parallel=False, flash=True,
                                act_bytes=2, rope_fused=rope_fused)


def test_the_unfused_rotary_embedding_moves_five_times_the_bytes_in_five_kernels() -> None:
    # Q and K of a micro-batch: 4096 tokens x (4096 + 1024) x 2 bytes = 41,943,040 bytes. Fused:
    # read and write them (2 units). Unfused: the negation of half (1), the concatenation (2),
    # the two products (2 each) and the sum (3): 10 units, 8 more; on an A100 80GB (2,039 GB/s
    # x 0.705) 335.5 MB more at 1.437 TB/s is 233 us a layer forward, twice that backward.
    qk = SEQ * (H + KV) * 2
    assert qk == 41_943_040
    costs, fused = _kernels(True)
    _, unfused = _kernels(False)
    assert unfused.kernels_forward == fused.kernels_forward + 4
    assert unfused.kernels_backward == fused.kernels_backward + 8
    # the host issues the five small aten ops in one inventory kernel's time
    assert (unfused.issued_forward, unfused.issued_backward) == (fused.issued_forward,
                                                                 fused.issued_backward)
    # every kernel of these moves at least 42 MB, 29 us: above the 13.8 us launch floor
    assert unfused.forward - fused.forward == pytest.approx(8 * qk / costs.byte_rate)
    assert unfused.forward - fused.forward == pytest.approx(233.4e-6, rel=2e-3)
    assert unfused.backward - fused.backward == pytest.approx(2 * 8 * qk / costs.byte_rate)
    # the recompute of the elementwise ops (per-op selective) runs them again too
    assert unfused.op_recompute - fused.op_recompute == pytest.approx(8 * qk / costs.byte_rate)
    # split over tp like the heads; at tp 4 the negation moves 10.5 MB, 7.3 us, under the
    # launch floor (13.8 us), which it takes
    costs, fused4 = _kernels(True, tp=4)
    _, unfused4 = _kernels(False, tp=4)
    unit = qk / 4 / costs.byte_rate
    assert costs.launch == pytest.approx(13.8e-6) and unit < costs.launch < 2 * unit
    assert unfused4.forward - fused4.forward == pytest.approx(8 * unit + costs.launch - unit)


def test_it_keeps_nothing_more_and_models_without_rope_are_the_same_either_way() -> None:
    c = load_catalog()
    strategy = Strategy(dp=8, micro_batch=1)
    llama = c.model("llama3-8b")
    a = estimate(llama, c.system("dgx-a100-8"), TRAINING, strategy)
    b = estimate(llama, c.system("dgx-a100-8"), UNFUSED, strategy)
    assert a.memory == b.memory and b.step_time > a.step_time
    gpt = c.model("gpt-1.7b")  # learned positions
    training = replace(TRAINING, seq_len=2048)
    a = estimate(gpt, c.system("dgx-a100-8"), training, strategy)
    b = estimate(gpt, c.system("dgx-a100-8"), replace(training, rope_fusion=False), strategy)
    assert (a.step_time, a.memory) == (b.step_time, b.memory)


def test_planner_estimate_takes_the_flag(capsys) -> None:
    args = ["estimate", "--model", "llama3-8b", "--system", "dgx-a100-8", "--dp", "8",
            "--micro-batch", "1", "--global-batch", "8", "--seq-len", "4096",
            "--no-transformer-engine"]
    fused, unfused = estimates_with_and_without(capsys, args, "--no-rope-fusion")
    assert unfused["memory"] == fused["memory"]
    # 32 layers x (233 us forward + 467 us backward) = 22.4 ms more, at least (the step's
    # other parts may hide some of it, none adds to it)
    assert 0.0 < unfused["step_time"] - fused["step_time"] <= 32 * 3 * 233.4e-6 * 1.01


STUDY = """model: llama3-8b
system: dgx-h100-8
training:
  global_batch: 16
  seq_len: 4096
  transformer_engine: false
  rope_fusion: {value}
space: {{tp: [1, 2, 4], pp: [1, 2], recompute: [none, full, selective], micro_batch: [1, 2]}}
"""


def test_a_study_and_a_plan_file_keep_it_and_the_batched_path_agrees(
        tmp_path: Path, capsys) -> None:
    assert_a_study_and_a_plan_file_keep_it(tmp_path, capsys, STUDY, "rope_fusion")


def test_the_megatron_export_asks_for_the_unfused_rope() -> None:
    # Megatron-LM fuses by default; --no-rope-fusion runs PyTorch's ops
    # (NVIDIA/Megatron-LM@d98e8a64 megatron/training/arguments.py: dest apply_rope_fusion).
    from planner.exports import export_files
    c = load_catalog()
    strategy = Strategy(dp=8, micro_batch=1)
    for model, training, expected in (("llama3-8b", TRAINING, False),
                                      ("llama3-8b", UNFUSED, True),
                                      ("gpt-1.7b", replace(UNFUSED, seq_len=2048), False)):
        plan = make_plan(c.model(model), c.system("dgx-h100-8"), training, strategy,
                         Convention.MEGATRON)
        text = "\n".join(str(v) for v in export_files(plan, "megatron").values())
        assert ("--no-rope-fusion" in text) is expected


def _errors(capsys, path: Path) -> dict[str, float]:
    assert main(["validate", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["skipped"] == []
    return {row["name"]: row["step_time_error"] for row in data["rows"]}


def _mape(errors: dict[str, float], part: str) -> float:
    picked = [abs(e) for name, e in errors.items() if part in name]
    return sum(picked) / len(picked)


@pytest.mark.parametrize(("file", "part", "unfused", "fused"), [
    # Aleph Alpha's Scaling (rotate_half or complex), all 234 runs: 10.6% -> 11.9% MAPE
    ("aleph-alpha-a100-check.csv", "AA ", (0.100, 0.108), (0.115, 0.123)),
    # PaddleNLP's LLaMA 7B and 13B, 12 runs: 11.3% -> 14.2% (measured 242.4 s for tp 2 x
    # sharding 4 on A100 40GB: estimated -28.0%, -31.3% fused)
    ("flagperf-check.csv", "paddle llama1", (0.105, 0.12), (0.135, 0.15)),
    # Hugging Face's Llama 2 7B and ChatGLM3-6B under DeepSpeed ZeRO-3 (their RMSNorm unfused
    # too): within -1.5..+2.3%; with the rope fused -4.1..-2.8% (-9.4..-13.9% with both fused)
    ("flagperf-check.csv", "flagperf deepspeed", (0.0, 0.02), (0.03, 0.05)),
    # FlagScale's 2023 Megatron-LM forks (their legacy attention calls Megatron-core's unfused
    # apply_rotary_pos_emb: FlagOpen/FlagScale@ed55532 and @26cd664 megatron/model/
    # transformer.py): Aquila2-7B's four plans -1.2..+1.0% (-2.3..-4.6% fused), Llama 2 70B's
    # three on H800s -11.1, -0.7, -1.3% (-13.1, -3.0, -3.6%)
    ("flagperf-check.csv", "flagperf aquila2-7b", (0.005, 0.01), (0.03, 0.04)),
    ("flagperf-check.csv", "flagperf llama2-70b h800", (0.04, 0.05), (0.06, 0.07)),
    # torchtitan's eager Llama 3.1 8B on 8 and 128 H100s (its RMSNorm unfused too): +1.6 and
    # -0.9%; with the rope fused -2.7 and -5.0% (-12.4 and -14.5% with both fused)
    ("h100-check.csv", "tp1 cp1 mb2 ac=selective", (0.0, 0.02), (0.03, 0.045)),
])
def test_the_runs_that_ran_it_unfused(capsys, tmp_path: Path, file: str, part: str,
                                      unfused: tuple[float, float],
                                      fused: tuple[float, float]) -> None:
    as_filed = _errors(capsys, VALIDATION / file)
    assert unfused[0] <= _mape(as_filed, part) <= unfused[1]
    reread(VALIDATION / file, tmp_path / file, rope_fusion="true")
    assert fused[0] <= _mape(_errors(capsys, tmp_path / file), part) <= fused[1]
