"""The true-or-false training options, read alike from a study's and a plan file's ``training``
(``planner.fields.training_flags``): each one the file sets reaches the TrainingSpec, each one
it leaves out takes TrainingSpec's default, and a bad value is one line naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.cli import main
from planner.fields import TRAINING_FLAGS
from planner.plan import make_plan, read_plan, write_plan
from planner.study_config import load_study_config
from simcore.specs import Convention

# The options as simcore/specs/training.py's TrainingSpec declares them: nine switches with a
# default, five left to the device or the stack (None) unless a file says.
SWITCHES = {"overlap_grad_reduce": True, "tp_comm_overlap": True, "launch_blocking": False,
            "cuda_graphs": False, "master_weights": True,
            "fsdp_no_sync": False, "swiglu_fusion": True, "vocab_parallel_embedding": True,
            "fp8_attention": False, "fused_norm": True, "grad_all_reduce": False,
            "rope_fusion": True}
STACK_CHOICES = ("flash_attention", "transformer_engine", "recompute_early_stop", "grad_copy",
                 "main_grad_copy", "fp32_grad_partition", "async_tp_allreduce",
                 "pipeline_no_sync")

STUDY = """model: llama3-8b
system: dgx-h100-8
training:
  global_batch: 16
  seq_len: 4096
{flags}
space: {{tp: [1, 2], pp: [1], micro_batch: [1]}}
"""


def _study(tmp_path: Path, flags: dict[str, object]) -> Path:
    path = tmp_path / "study.yaml"
    lines = "\n".join(f"  {k}: {'null' if v is None else str(v).lower()}"
                      for k, v in flags.items())
    path.write_text(STUDY.format(flags=lines))
    return path


def test_the_flags_are_trainingspecs_true_or_false_options() -> None:
    assert TRAINING_FLAGS == {**SWITCHES, **dict.fromkeys(STACK_CHOICES)}


def test_every_flag_a_study_sets_reaches_the_plan_file_and_back(tmp_path: Path) -> None:
    # each switch the other way round from its default, each stack choice set
    flipped = {**{k: not v for k, v in SWITCHES.items()},
               "flash_attention": True, "transformer_engine": False,
               "recompute_early_stop": True, "grad_copy": False, "main_grad_copy": True,
               "fp32_grad_partition": True, "pipeline_no_sync": True}
    config = load_study_config(_study(tmp_path, flipped))
    for key, value in flipped.items():
        assert getattr(config.training, key) is value, key
    plan = make_plan(config.model, config.system, config.training, config.space.valid[0],
                     Convention.MEGATRON)
    write_plan(plan, tmp_path / "plan.yaml")
    assert read_plan(tmp_path / "plan.yaml").training == config.training


def test_flags_left_out_take_the_defaults(tmp_path: Path) -> None:
    config = load_study_config(_study(tmp_path, {"grad_copy": None}))
    for key, value in {**SWITCHES, **dict.fromkeys(STACK_CHOICES)}.items():
        assert getattr(config.training, key) is value, key


@pytest.mark.parametrize(("key", "also"), [("master_weights", False),
                                           ("transformer_engine", True)])
def test_a_bad_value_is_one_line_naming_the_field(tmp_path: Path, capsys, key: str,
                                                  also: bool) -> None:
    study = _study(tmp_path, {key: "sometimes"})
    assert main(["run", str(study), "--storage", str(tmp_path / "a.db")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"training.{key}" in err[0] and "true or false" in err[0]
    assert ("null for the default" in err[0]) is also


def test_a_plan_file_with_a_bad_flag_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    config = load_study_config(_study(tmp_path, {}))
    plan = make_plan(config.model, config.system, config.training, config.space.valid[0],
                     Convention.MEGATRON)
    path = tmp_path / "plan.yaml"
    write_plan(plan, path)
    text = path.read_text()
    assert "fsdp_no_sync: false" in text
    path.write_text(text.replace("fsdp_no_sync: false", "fsdp_no_sync: 3"))
    assert main(["estimate", "--plan", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "training.fsdp_no_sync" in err[0]
