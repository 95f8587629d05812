"""Megatron-LM's pipeline layout (``--pipeline-model-parallel-layout``, ``simcore.layout``):
every virtual stage's layers written out, as Megatron-Bridge's Llama-3-70B H100 FP8 recipe pins
them (NVIDIA-NeMo/Megatron-Bridge@56ae11dff ``perf_recipes/llama/h100/llama3.py``, 2026-08-07:
"the default split leaves the first and last stages heavier than the middle ones. Pipeline
throughput is set by the slowest stage, so the layout is pinned")."""

from __future__ import annotations

from pathlib import Path

import pytest

import simcore
from planner.catalog import load_catalog
from planner.cli import main
from planner.exports import export_files
from planner.plan import make_plan, strategy_dict, strategy_from_attrs
from planner.runs_csv import read_runs
from search_spaces.frameworks import why_not
from simcore.layout import format_layout, parse_layout
from simcore.megatron.phases import stage_phases
from simcore.megatron.step import layer_time
from simcore.specs import (
    Convention,
    Precision,
    Schedule,
    Strategy,
    TrainingSpec,
    ZeroStage,
)

BRIDGE = "Et*2|(t*2|)*34,t*3|(t*2|)*3,tL"
"""The recipe's layout: pp 8 x v 5 = 40 virtual stages of Llama-3-70B's 80 layers."""
TRAINING = TrainingSpec(global_batch=128, seq_len=8192, bytes_per_param_grads=4)
PLAN = {"dp": 2, "tp": 4, "pp": 8, "v": 5, "schedule": Schedule.INTERLEAVED,
        "zero": ZeroStage.OPTIMIZER, "precision": Precision.FP8}
"""The recipe's plan (tp 4, pp 8, vp 5, FP8) on 64 H100s at batch 128 (dp 2, 64 micro-batches)."""


@pytest.fixture(scope="module")
def specs():
    c = load_catalog()
    return c.model("llama3-70b"), c.system("dgx-h100-64")


def test_the_layout_string_reads_as_megatron_parses_it() -> None:
    layout = parse_layout(BRIDGE)
    # 1 + 34 + 1 + 3 + 1 = 40 stages; 2 + 68 + 3 + 6 + 1 = 80 layers
    assert len(layout) == 40 and sum(layout) == 80
    assert layout[35] == 3 and layout[39] == 1 and set(layout[:35]) == {2}
    assert format_layout(layout) == BRIDGE  # written back as the recipe writes it
    s = Strategy(**PLAN, layout=layout)
    # virtual stage i on rank i % 8: rank 3 holds stage 35 (3 layers), rank 7 stage 39 (1)
    assert s.stage_layers(80) == (10, 10, 10, 11, 10, 10, 10, 9)
    assert s.chunk_layers(80, 3) == (2, 2, 2, 2, 3)
    assert s.chunk_layers(80, 7) == (2, 2, 2, 2, 1)


@pytest.mark.parametrize(("text", "words"), [
    ("Ettm|L", "'m' is not a layer the planner models"),
    ("tt|tL", "the embedding E must open the first stage"),
    ("Et|tL|t", "the loss L close the last"),
])
def test_layouts_the_planner_cannot_run_are_one_line(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words) as e:
        parse_layout(text)
    assert "\n" not in str(e.value)


def test_a_layout_must_fit_the_plan(specs) -> None:
    model, system = specs
    layout = parse_layout(BRIDGE)
    with pytest.raises(ValueError, match="pp \\* v = 8 \\* 4 = 32"):
        Strategy(**{**PLAN, "v": 4}, layout=layout)
    with pytest.raises(ValueError, match="cannot be combined"):
        Strategy(**PLAN, layout=layout, first_stage_layers=9)
    short = parse_layout("Et*2|(t*2|)*34,t*2|(t*2|)*3,tL")  # 79 layers
    with pytest.raises(ValueError, match="holds 79 transformer layers, but the model has 80"):
        simcore.check(model, system, TRAINING, Strategy(**PLAN, layout=short))


def test_each_rank_runs_the_layers_the_layout_gives_it(specs) -> None:
    model, system = specs
    even = simcore.estimate(model, system, TRAINING, Strategy(**PLAN))
    laid = simcore.estimate(model, system, TRAINING, Strategy(**PLAN, layout=parse_layout(BRIDGE)))
    fwd, bwd = layer_time(model, system, TRAINING, Strategy(**PLAN))
    one = fwd + bwd  # one layer's forward and backward with its tp communication
    times = [[st.micro_batch_time for st in e.stages] for e in (even, laid)]
    assert times[1][3] - times[0][3] == pytest.approx(one, rel=1e-6)  # rank 3: 11 layers
    assert times[0][7] - times[1][7] == pytest.approx(one, rel=1e-6)  # rank 7: 9 + the head
    assert times[1][0] == pytest.approx(times[0][0], rel=1e-12)
    # Megatron-Bridge's reason for the layout: with the even split the last rank (10 layers and
    # the LM head) paces the pipeline; the layout moves a layer off it and the step is faster
    assert max(times[0]) == times[0][7]
    assert laid.step_time < even.step_time
    phases = stage_phases(model, system, TRAINING, Strategy(**PLAN, layout=parse_layout(BRIDGE)))
    assert [p.micro_batch_time for p in phases] == pytest.approx(times[1], rel=1e-12)
    assert phases[3].forward[4].compute == pytest.approx(1.5 * phases[3].forward[0].compute)


def test_megatron_export_writes_the_layout_and_no_virtual_stage_flag(specs) -> None:
    model, system = specs
    s = Strategy(**PLAN, layout=parse_layout(BRIDGE))
    plan = make_plan(model, system, TRAINING, s, Convention.MEGATRON)
    script = str(export_files(plan, "megatron")["megatron.sh"])
    assert f"--pipeline-model-parallel-layout '{BRIDGE}'" in script
    # arguments.py (d98e8a64): no more than one of the layout and the two vp flags
    assert "--num-virtual-stages-per-pipeline-rank" not in script
    assert "--num-layers-per-virtual-pipeline-stage" not in script
    assert why_not("megatron", model, TRAINING, s) is None
    assert "layout" in str(why_not("torchtitan", model, TRAINING, s))
    assert why_not("deepspeed", model, TRAINING, s) is not None
    # a plan file keeps the layout
    assert strategy_dict(s)["layout"] == BRIDGE
    assert strategy_from_attrs({**strategy_dict(s), "plan": ""}) == s


def test_runs_csv_and_estimate_take_the_layout(tmp_path: Path, capsys, specs) -> None:
    csv = tmp_path / "runs.csv"
    csv.write_text("name,model,system,global_batch,seq_len,dp,tp,pp,micro_batch,zero,precision,"
                   "grad_bytes,pipeline_layout,step_time_s\n"
                   f"bridge,llama3-70b,dgx-h100-64,128,8192,2,4,8,1,1,fp8,4,\"{BRIDGE}\",10.2\n")
    runs, skipped = read_runs(csv, load_catalog())
    assert not skipped
    s = runs[0].strategy
    assert (s.v, s.schedule, s.layout) == (5, Schedule.INTERLEAVED, parse_layout(BRIDGE))
    args = ["estimate", "--model", "llama3-70b", "--system", "dgx-h100-64", "--global-batch",
            "128", "--seq-len", "8192", "--dp", "2", "--tp", "4", "--pp", "8", "--schedule",
            "interleaved", "--pipeline-layout"]
    assert main([*args, BRIDGE]) == 0
    assert "layers per stage 10 + 10 + 10 + 11 + 10 + 10 + 10 + 9" in capsys.readouterr().out
    assert main([*args, "Et*2|(t*2|)*34,t*3|(t*2|)*3,tt"]) == 2
    err = capsys.readouterr().err
    assert "--pipeline-layout" in err and len(err.strip().splitlines()) == 1
