"""``swiglu_fusion: false``: a SwiGLU MLP run as PyTorch's separate SiLU and multiply. Sources:
nanotron's ``GLUActivation`` (huggingface/nanotron@9055c664 ``src/nanotron/models/llama.py``:
``self.act(gate_states) * up_states``), torchtitan's Llama ``FeedForward``
(``self.w2(F.silu(self.w1(x)) * self.w3(x))``, pytorch/torchtitan@0413364349) and
Megatron-DeepSpeed's ``swiglu`` (``F.silu(x[0]) * x[1]``); Megatron-LM's default
``--bias-swiglu-fusion`` is the fused kernel. Every figure below is a hand calculation."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from planner.catalog import load_catalog
from planner.plan import make_plan
from simcore import estimate
from simcore.megatron.activations import layer_activations
from simcore.megatron.kernels import KernelCosts, layer_kernels
from simcore.megatron.layers import layer_shape
from simcore.specs import Convention, Recompute, Strategy, TrainingSpec
from tests.training_flag_checks import (
    assert_a_study_and_a_plan_file_keep_it,
    estimates_with_and_without,
)

# Llama 3 8B (hidden 4096, FFN 14336) at sequence 4096, micro-batch 1, tp 1.
SEQ, H, F = 4096, 4096, 14336
TRAINING = TrainingSpec(global_batch=8, seq_len=SEQ, flash_attention=True,
                        transformer_engine=False)
UNFUSED = replace(TRAINING, swiglu_fusion=False)


def _layer(fused: bool, tp: int = 1, sequence_parallel: bool = False):
    c = load_catalog()
    model = c.model("llama3-8b")
    return layer_activations(model, layer_shape(model), micro_batch=1, seq_len=SEQ, tp=tp, sp=1,
                             sequence_parallel=sequence_parallel, recompute=Recompute.NONE,
                             flash=True, swiglu_fused=fused)


def test_the_unfused_swiglu_keeps_the_silu_output_too() -> None:
    # Fused: the gate and up projections' output (2 x 2 bytes an FFN element) and FC2's input
    # (2): 6 bytes. Unfused: the SiLU's output as well, kept for the multiply: 8 bytes. The
    # difference is one (s, b, f) tensor in bf16: 4096 x 14336 x 2 bytes.
    extra = _layer(False).stored - _layer(True).stored
    assert extra == pytest.approx(SEQ * F * 2)
    # split over tp like the rest of the MLP
    assert (_layer(False, 4, True).stored - _layer(True, 4, True).stored) == pytest.approx(
        SEQ * F * 2 / 4)


def test_the_unfused_swiglu_runs_a_second_kernel_over_more_bytes() -> None:
    c = load_catalog()
    model = c.model("llama3-8b")
    costs = KernelCosts.of(c.device("h100-sxm"))
    kw = dict(micro_batch=1, queries=SEQ, seq_len=SEQ, tp=1, sequence_parallel=False,
              flash=True, act_bytes=2)
    fused = layer_kernels(model, layer_shape(model), costs, **kw)
    unfused = layer_kernels(model, layer_shape(model), costs, swiglu_fused=False, **kw)
    assert unfused.kernels_forward == fused.kernels_forward + 1
    # fused: read gate and up, write the product (3 x 2 bytes an element); unfused: the SiLU
    # reads the gate and writes its output (2 x 2), the product reads both and writes (3 x 2)
    silu, product = 2 * SEQ * F * 2, 3 * SEQ * F * 2
    extra = costs.elementwise(silu) + costs.elementwise(product) - costs.elementwise(product)
    assert unfused.forward - fused.forward == pytest.approx(extra)
    assert unfused.mlp_forward > fused.mlp_forward


def test_models_without_swiglu_are_the_same_either_way() -> None:
    c = load_catalog()
    strategy = Strategy(dp=8, micro_batch=1)
    training = replace(TRAINING, seq_len=2048)
    gpt = c.model("gpt-1.7b")  # GELU MLP
    a = estimate(gpt, c.system("dgx-a100-8"), training, strategy)
    b = estimate(gpt, c.system("dgx-a100-8"), replace(training, swiglu_fusion=False), strategy)
    assert (a.step_time, a.memory) == (b.step_time, b.memory)


def test_planner_estimate_takes_the_flag(capsys) -> None:
    args = ["estimate", "--model", "llama3-8b", "--system", "dgx-h100-8", "--dp", "8",
            "--micro-batch", "1", "--global-batch", "8", "--seq-len", "4096",
            "--no-transformer-engine"]
    fused, unfused = estimates_with_and_without(capsys, args, "--no-swiglu-fusion")
    # 32 layers x 4096 x 14336 x 2 bytes more activations
    assert (unfused["memory"]["activations"] - fused["memory"]["activations"]
            == pytest.approx(32 * SEQ * F * 2))
    assert unfused["step_time"] > fused["step_time"]


STUDY = """model: llama3-8b
system: dgx-h100-8
training:
  global_batch: 16
  seq_len: 4096
  transformer_engine: false
  swiglu_fusion: {value}
space: {{tp: [1, 2, 4], pp: [1, 2], recompute: [none, full], micro_batch: [1, 2]}}
"""


def test_a_study_and_a_plan_file_keep_it_and_the_batched_path_agrees(
        tmp_path: Path, capsys) -> None:
    assert_a_study_and_a_plan_file_keep_it(tmp_path, capsys, STUDY, "swiglu_fusion")


def test_the_megatron_export_asks_for_the_unfused_swiglu() -> None:
    # Megatron-LM fuses by default; --no-bias-swiglu-fusion runs the two kernels
    # (NVIDIA/Megatron-LM@d98e8a64 megatron/training/arguments.py).
    from planner.exports import export_files
    c = load_catalog()
    strategy = Strategy(dp=8, micro_batch=1)
    for training, expected in ((TRAINING, False), (UNFUSED, True)):
        plan = make_plan(c.model("llama3-8b"), c.system("dgx-h100-8"), training, strategy,
                         Convention.MEGATRON)
        text = "\n".join(str(v) for v in export_files(plan, "megatron").values())
        assert ("--no-bias-swiglu-fusion" in text) is expected
