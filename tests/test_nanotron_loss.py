"""nanotron's vocab-parallel loss (``cross_entropy: nanotron``): the fp32 logits the model returns
and the copy the loss shifts by its maximum out of place, 4 + 4 bytes a logit of the rank's
vocabulary shard at its forward, where Megatron-LM's fused loss counts 4 (Korthikanti et al.
2022, section 4.3). Sources: huggingface/nanotron@9055c664 ``src/nanotron/models/llama.py``
(``cast_to_fp32``) and ``src/nanotron/parallel/tensor_parallel/functional.py``
(``_ShardedCrossEntropy``: ``sharded_logits - logits_max``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from planner.catalog import load_catalog
from planner.runs_csv import read_runs
from planner.study_config import load_study_config
from simcore import estimate
from simcore.specs import CrossEntropy, Recompute, Strategy, TrainingSpec

TRAINING = TrainingSpec(global_batch=16, seq_len=4096, flash_attention=True,
                        transformer_engine=False)
TP4 = Strategy(dp=2, tp=4, micro_batch=2, recompute=Recompute.NONE, sequence_parallel=True)


def _activations(cross_entropy: CrossEntropy | None) -> float:
    c = load_catalog()
    training = replace(TRAINING, cross_entropy=cross_entropy)
    return estimate(c.model("llama3-8b"), c.system("dgx-h100-8"), training,
                    TP4).memory.activations


def test_nanotron_s_loss_holds_four_bytes_a_logit_more_than_megatron_s() -> None:
    # micro-batch 2 x sequence 4096 = 8,192 tokens; Llama 3's 128,256 logits over tp 4:
    # 4 more bytes each, 4 x 8192 x 128256 / 4 = 1,050,673,152 bytes
    more = _activations(CrossEntropy.NANOTRON) - _activations(None)
    assert more == pytest.approx(1_050_673_152, rel=1e-12)


def test_a_runs_csv_names_it(tmp_path: Path) -> None:
    runs = tmp_path / "runs.csv"
    runs.write_text("model,system,global_batch,seq_len,dp,tp,pp,micro_batch,cross_entropy,"
                    "peak_memory_gb\nllama3-8b,dgx-h100-8,16,4096,2,4,1,2,nanotron,60\n")
    found, skipped = read_runs(runs, load_catalog())
    assert skipped == []
    assert found[0].training.cross_entropy is CrossEntropy.NANOTRON


STUDY = """model: llama3-8b
system: dgx-h100-8
training:
  global_batch: 16
  seq_len: 4096
{loss}space: {{tp: [4], pp: [1], micro_batch: [2]}}
"""


def test_a_study_s_fingerprint_tells_the_losses_apart(tmp_path: Path) -> None:
    # a stored study resumes only on the same question: a study that changes its loss is a new
    # one, and one that names Megatron-LM's loss (the default) keeps its old fingerprint
    fingerprints = {}
    for loss in ("", "fused", "pytorch", "replicated", "nanotron"):
        path = tmp_path / f"{loss or 'default'}.yaml"
        path.write_text(STUDY.format(loss=f"  cross_entropy: {loss}\n" if loss else ""))
        fingerprints[loss] = load_study_config(path).fingerprint()
    assert fingerprints[""] == fingerprints["fused"]
    assert len(set(fingerprints.values())) == 4
