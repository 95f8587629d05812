"""Measured runs on a cluster that mixes device types: a runs CSV row whose plan is in its
``stages`` cell, as ``planner mixed`` prints it (planner/runs_mixed.py, planner/mixed_label.py).

Figures from closed forms: a cluster of one group is the one-device-type cluster, so a mixed row
there is estimated as the same plan's one-device-type row; a label read back is the plan that
printed it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.catalog import load_catalog
from planner.cli import main
from planner.errors import PlannerUsageError
from planner.mixed_label import parse_mixed_plan
from planner.runs_csv import read_runs
from planner.units import GB
from simcore.mixed import MixedPlan, MixedStage, check_mixed, estimate_mixed
from simcore.specs import Recompute, Schedule, TrainingSpec, ZeroStage

DATA = Path(__file__).parent / "data" / "validation"

# dgx-a100-32's node and InfiniBand (studies/catalog/systems/dgx.yaml), as one group of 4 nodes
SYSTEMS = """\
.node: &node {topology: Switch, bandwidth_gbps: 231, latency_us: 0.58, call_latency_us: 10.8}
.ib: &ib {topology: Switch, bandwidth_gbps: 15.1, latency_us: 8.8, call_latency_us: 0.7,
  p2p_bandwidth_gbps: 24}
.scheduling: &scheduling {preferred_dataset_splits: 4, active_chunks_per_dim: 1}
one-group:
  groups:
    - {name: a100, device: a100-80gb, nodes: 4, node: {<<: *node, npus: 8}}
  inter_node: {<<: *ib}
  scheduling: *scheduling
  source: dgx-a100-32 as a system of one group
a100-v100:
  groups:
    - {name: a100, device: a100-80gb, nodes: 2, node: {<<: *node, npus: 8}}
    - {name: v100, device: v100-16gb, nodes: 2, node: {<<: *node, npus: 8}}
  inter_node: {<<: *ib}
  scheduling: *scheduling
  source: for the tests
two-groups:
  groups:
    - {name: a100, device: a100-80gb, nodes: 2, node: {<<: *node, npus: 8}}
    - {name: h100, device: h100-sxm, nodes: 2, node: {<<: *node, npus: 8}}
  inter_node: {<<: *ib}
  scheduling: *scheduling
  source: for the tests
"""
HEADER = "name,model,system,global_batch,seq_len,dp,tp,pp,micro_batch,stages,step_time_s"


def _write(tmp_path: Path, *rows: str, header: str = HEADER) -> Path:
    (tmp_path / "systems.yaml").write_text(SYSTEMS)
    path = tmp_path / "runs.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_a_label_read_back_is_the_plan_that_printed_it() -> None:
    system = load_catalog().any_system("metis-a100-v100-16-16")
    plans = [
        MixedPlan(stages=(MixedStage(0, 4, 1, 5), MixedStage(0, 4, 1, 5), MixedStage(1, 2, 2, 6)),
                  micro_batches=8, recompute=Recompute.FULL, zero=ZeroStage.OPTIMIZER),
        MixedPlan(stages=(MixedStage(1, 1, 4, 10),), micro_batches=32),
        MixedPlan(stages=(MixedStage(1, 1, 1, 3), MixedStage(0, 1, 1, 7)), micro_batches=2,
                  recompute=Recompute.SELECTIVE, schedule=Schedule.GPIPE),
    ]
    for plan in plans:
        assert parse_mixed_plan(plan.label(system), system, schedule=plan.schedule) == plan


@pytest.mark.parametrize("label, says", [
    ("a100:tp4dp1x2[5,5]", "nothing after the stages: give mM"),
    ("gpu:tp1dp1x1[10] m2", "group 'gpu' is not one of metis-a100-v100-16-16's: a100, v100"),
    ("a100:tp1dp1x2[10] m2", "lists 1 stages' layers, not 2"),
    ("a100:tp1dp1x1[10] m2 zero9", "'m2 zero9' after the stages"),
    ("a100:tp1dp1 m2", "is not a plan as `planner mixed` prints it"),
    ("a100:tp\u0661dp1x1[10] m2", "is not a plan"),  # an Arabic-Indic digit
])
def test_a_label_not_of_the_form_says_what_to_fix(label: str, says: str) -> None:
    system = load_catalog().any_system("metis-a100-v100-16-16")
    with pytest.raises(ValueError) as e:
        parse_mixed_plan(label, system)
    assert says in str(e.value)


def test_a_mixed_row_on_one_group_is_the_one_device_type_row(tmp_path: Path, capsys) -> None:
    # GPT 1.7B's 24 layers over 2 stages of 2 whole nodes (dp 2 x tp 8) at micro-batch 2 of a
    # batch of 64: 16 micro-batches. The one-group system has dgx-a100-32's links, so the mixed
    # estimate must give the catalog system's figure (simcore/mixed/estimate.py: "to the last
    # bit"; tests/test_mixed.py checks the estimate itself).
    path = _write(tmp_path,
                  "one,gpt-1.7b,dgx-a100-32,64,2048,2,8,2,2,,2.0",
                  "mixed,gpt-1.7b,systems.yaml#one-group,64,2048,,,,,"
                  "\"a100:tp8dp2x2[12,12] m16 none\",2.0")
    assert main(["validate", str(path), "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["mixed"]["predicted_step_time_s"] == rows["one"]["predicted_step_time_s"]
    assert rows["mixed"]["predicted_peak_memory_gb"] == rows["one"]["predicted_peak_memory_gb"]


def test_a_file_of_mixed_rows_needs_no_degree_columns(tmp_path: Path, capsys) -> None:
    path = _write(tmp_path,
                  "a,gpt-1.7b,systems.yaml#two-groups,64,2048,"
                  '"a100:tp8dp2x1[14] > h100:tp8dp2x1[10] m16 none",2.0',
                  "b,gpt-1.7b,systems.yaml#two-groups,64,2048,"
                  '"h100:tp8dp2x1[12] > a100:tp8dp2x1[12] m16 full",3.0',
                  header="name,model,system,global_batch,seq_len,stages,step_time_s")
    runs, skipped = read_runs(path, load_catalog())
    assert skipped == [] and [r.mixed.pp for r in runs] == [2, 2]
    assert runs[0].device is None and runs[0].strategy is None
    assert main(["validate", str(path), "--by", "device"]) == 0
    out = capsys.readouterr().out
    assert "plan choice: 1 group" in out  # two plans of one question
    assert "a100-80gb+h100-sxm" in out and "h100-sxm+a100-80gb" in out
    assert main(["validate", str(path), "--by", "nodes"]) == 0
    assert "\n  4 " in capsys.readouterr().out  # two nodes of each group


FITS_NOT = ("stages: the stages hold", "stages: the stages on group", "stages: schedule=")
"""Reasons of plans that read but do not fit (left out, not values to fix)."""


@pytest.mark.parametrize("row, says", [
    ("a,gpt-1.7b,systems.yaml#two-groups,64,2048,2,,,,\"a100:tp8dp2x2[12,12] m16\",2.0",
     "dp='2' beside stages: a row with stages takes its plan from them; empty the dp cell"),
    ("a,gpt-1.7b,dgx-a100-32,64,2048,,,,,\"a100:tp8dp2x2[12,12] m16\",2.0",
     "stages is given but system 'dgx-a100-32' has one device type"),
    ("a,gpt-1.7b,systems.yaml#two-groups,64,2048,,,,,\"a100:tp8dp2x2[12,10] m16\",2.0",
     "stages: the stages hold 22 layers but gpt-1.7b has 24"),
    ("a,gpt-1.7b,systems.yaml#two-groups,64,2048,,,,,\"a100:tp8dp2x3[8,8,8] m16\",2.0",
     "stages: the stages on group a100 use 48 devices but it has 16"),
    ("a,gpt-1.7b,systems.yaml#two-groups,64,2048,,,,,\"a100:tp8dp1x2[12,12] m16\",900",
     None),  # a well-formed row: estimated
    ("a,gpt-1.7b,systems.yaml#two-groups,64,2048,2,8,2,2,,2.0",
     "system 'systems.yaml#two-groups' mixes device types; give the plan in a stages cell"),
    ("a,gpt-1.7b,systems.yaml#two-groups,64,2048,,,,,\"a100:tp8dp1x2[12,12] m16\",2.0,zb-h1",
     "stages: schedule=zb-h1 is not modelled on mixed systems; use 1f1b or gpipe"),
    ("a,gpt-1.7b,systems.yaml#two-groups,64,2048,,,,,\"a100:tp8dp1x3[2,3,0 3] m16\",2.0",
     "stages: 'a100:tp8dp1x3[2,3,0 3] m16' is not a plan as `planner mixed` prints it"),
    # a group named twice in a span: said by name ("got groups (0, 0)" named indices)
    ("a,gpt-1.7b,systems.yaml#two-groups,64,2048,,,,,\"a100+a100:tp8dp2x1[24] m16\",2.0",
     "stages: a100+a100: a stage spans each group once; name each group once"),
])
def test_a_mixed_rows_bad_cells_are_values_to_fix(tmp_path: Path, capsys, row: str,
                                                  says: str | None) -> None:
    path = _write(tmp_path, row, "b,gpt-1.7b,dgx-a100-32,64,2048,2,8,2,2,,2.0",
                  header=HEADER + ",schedule")
    # 1: a value to fix; a plan that reads but does not fit the model, system or batch is
    # left out as a one-type row's is, exit 0 (calibrate refused a whole file for one)
    fits_not = says is not None and says.startswith(FITS_NOT)
    assert main(["validate", str(path)]) == (0 if says is None or fits_not else 1)
    out = capsys.readouterr().out
    if says is None:
        assert "left out" not in out
    else:
        assert f"{path}:2 (a): {says}" in out
        assert ("the planner cannot express" in out) == fits_not


def test_calibrate_leaves_the_mixed_rows_out_and_says_so(tmp_path: Path, capsys,
                                                         monkeypatch) -> None:
    monkeypatch.setenv("PLANNER_CATALOG", str(tmp_path / "catalog"))
    path = _write(tmp_path,
                  "one,gpt-1.7b,dgx-a100-32,64,2048,2,8,2,2,,2.0",
                  "mixed,gpt-1.7b,systems.yaml#one-group,64,2048,,,,,"
                  "\"a100:tp8dp2x2[12,12] m16 none\",2.0")
    assert main(["calibrate", str(path), "--device", "a100-80gb", "--name", "mine",
                 "--trials", "3"]) == 0
    assert "left out: 1 run on a mixed cluster" in capsys.readouterr().out


def test_amp_heterogeneous_cluster(capsys) -> None:
    """AMP's heterogeneous experiment (amp-het-check.csv; validation README "AMP's
    heterogeneous cluster"): its 43 timed plans, the T4 instance the last node, the pipeline
    axis outermost, so stage k holds ranks k x dp x tp on: a stage on ranks 0-11 runs on V100s,
    on 12-15 on T4s, across 11 and 12 on both (v100+t4). The fastest of the 43 is tp 1 x dp 2 x
    pp 8 at micro-batch 1, 1.28 s (het_cluster_results.txt; the next, 1.47 s, dp 4 x pp 4)."""
    runs, skipped = read_runs(DATA / "amp-het-check.csv", load_catalog())
    assert skipped == [] and len(runs) == 43  # of 53 trials; the 10 that wrote no time left out
    for run in runs:
        plan = run.mixed
        assert sum(st.layers for st in plan.stages) == 24
        tp, dp = plan.stages[0].tp, plan.stages[0].dp
        assert f"tp{tp} dp{dp} pp{plan.pp} " in run.name
        assert 32 // (plan.micro_batches * dp) == int(run.name.split(" mb")[1].split()[0])
        for k, st in enumerate(plan.stages):
            first, last = k * tp * dp, (k + 1) * tp * dp - 1
            on = (0,) if last < 12 else (1,) if first >= 12 else (0, 1)
            assert st.groups == on, (run.name, k)
    assert main(["validate", str(DATA / "amp-het-check.csv"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    [group] = data["groups"]
    assert group["runs"] == 43 and group["fastest"] == (
        "AMP GPT-2 24x1024 V100x12+T4x4 tp1 dp2 pp8 mb1 part0-5-9-12-15-18-21-24-30")
    assert min(r["measured_step_time_s"] for r in data["rows"]) == 1.28
    # the T4's GEMM rate from measured GEMMs (gpus.yaml) picks it; with the V100's rate the
    # same degrees at micro-batch 2 (1.54 s, 20.3% slower) came first
    assert group["picked"] == group["fastest"] and group["regret"] == 0.0


def test_a_mixed_peak_is_the_stage_holding_the_most(tmp_path: Path, capsys) -> None:
    # Two V100 stages of 4 layers, then an A100 stage of 16 at tp 1 x dp 8: the estimate's own
    # peak stage is the one nearest its part's memory (a V100 stage, 16 GB), but a report of
    # every rank's peak gives the most any rank held: the A100 stage's.
    path = _write(tmp_path, "a,gpt-1.7b,systems.yaml#a100-v100,64,2048,"
                  '"v100:tp1dp8x2[4,4] > a100:tp1dp8x1[16] m8 none zero1",30,40.0',
                  header="name,model,system,global_batch,seq_len,stages,peak_memory_gb,"
                  "step_time_s")
    [run], _ = read_runs(path, load_catalog())
    est = estimate_mixed(run.model, run.system, run.training, run.mixed)
    stages = [s.memory.total / GB for s in est.stages]
    assert stages[2] == max(stages) and est.memory.total / GB < stages[2]
    assert main(["validate", str(path), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["rows"]
    assert row["predicted_peak_memory_gb"] == stages[2]


def test_a_margin_lowers_only_the_parts_a_plan_uses(tmp_path: Path, capsys) -> None:
    # 20 GB off every part refused a plan on the A100s alone for the V100s' 16 GB it never uses.
    path = _write(tmp_path, "a,gpt-1.7b,systems.yaml#a100-v100,64,2048,"
                  '"a100:tp8dp1x2[12,12] m16 none",2.0',
                  header="name,model,system,global_batch,seq_len,stages,step_time_s")
    assert main(["validate", str(path), "--margin-gb", "20"]) == 0
    assert "keep less free" not in capsys.readouterr().out


def test_a_row_without_stages_in_a_file_without_degrees_says_so(tmp_path: Path,
                                                                capsys) -> None:
    path = _write(tmp_path, "a,gpt-1.7b,systems.yaml#two-groups,64,2048,"
                  '"a100:tp8dp1x2[12,12] m16 none",2.0',
                  "b,gpt-1.7b,dgx-a100-32,64,2048,,2.0",
                  header="name,model,system,global_batch,seq_len,stages,step_time_s")
    assert main(["validate", str(path)]) == 1
    assert (f"{path}:3 (b): stages is empty and the file has no dp column; give the plan in"
            " stages, or add the columns dp, tp, pp and micro_batch") in capsys.readouterr().out


def test_a_group_name_a_plan_cannot_print_is_refused(tmp_path: Path) -> None:
    (tmp_path / "systems.yaml").write_text(SYSTEMS.replace("name: h100", "name: H100 SXM"))
    with pytest.raises(PlannerUsageError, match=r"groups\[1\]\.name: 'H100 SXM': a plan names"):
        load_catalog(user=False).any_system(f"{tmp_path / 'systems.yaml'}#two-groups")



def test_a_stage_spanning_an_a100_and_a_v100_node_runs_at_the_v100_pace(tmp_path: Path,
                                                                       capsys) -> None:
    # The second stage's 16 ranks take the A100 group's second node and the V100 group's first:
    # every micro-batch waits for the V100 replicas, so the plan is the one whose second stage
    # is the V100 group's two nodes (the same node links, the same InfiniBand between them, the
    # same 16 GB): equal to the last bit (planner/runs_mixed.py, simcore/mixed/span.py).
    path = _write(tmp_path,
                  'span,gpt-1.7b,systems.yaml#a100-v100,64,2048,'
                  '"a100:tp8dp1x1[12] > a100+v100:tp8dp2x1[12] m16 none",2.0',
                  'v100,gpt-1.7b,systems.yaml#a100-v100,64,2048,'
                  '"a100:tp8dp1x1[12] > v100:tp8dp2x1[12] m16 none",2.0',
                  header="name,model,system,global_batch,seq_len,stages,step_time_s")
    assert main(["validate", str(path), "--json"]) == 0
    span, v100 = json.loads(capsys.readouterr().out)["rows"]
    assert span["predicted_step_time_s"] == v100["predicted_step_time_s"]
    assert span["predicted_peak_memory_gb"] == v100["predicted_peak_memory_gb"]


@pytest.mark.parametrize("label, says", [
    ("a100+v100:tp8dp1x1[24] m16",
     "stages[0] spans group v100, which has no rank left for it (the stages before it, or the"),
    ("a100:tp4dp1x1[4] > a100+v100:tp8dp2x1[20] m16",
     "stages[1] spans groups, so each part must be whole nodes of 8; its part on a100 is 12"),
    ("v100+a100:tp8dp8x1[24] m8", "stages[0] needs 64 devices but its groups have 32 left"),
    ("a100+a100:tp8dp2x1[24] m16", "a stage spans each group once"),
])
def test_a_spanning_stage_that_does_not_fit_says_why(tmp_path: Path, capsys, label: str,
                                                     says: str) -> None:
    path = _write(tmp_path, f'a,gpt-1.7b,systems.yaml#a100-v100,64,2048,"{label}",2.0',
                  header="name,model,system,global_batch,seq_len,stages,step_time_s")
    assert main(["validate", str(path)]) == 1
    assert says in capsys.readouterr().out


def test_a_block_inside_a_node_divides_it_and_between_nodes_a_switch_takes_any() -> None:
    # Three stages of 3 GPUs on nodes of 8 would straddle nodes while priced inside one (a
    # review found it); 2 of a switch's 3 nodes are a block (AMP's V100 instances hold one).
    catalog = load_catalog()
    system = catalog.any_system(str(DATA / "aws-systems.yaml") + "#amp-het-v100-t4-16")
    model = catalog.model(str(DATA / "models.yaml") + "#gpt2-345m-1024")
    training = TrainingSpec(global_batch=32, seq_len=1024)
    straddle = MixedPlan(stages=(MixedStage(0, 1, 3, 12), MixedStage(0, 1, 3, 12)),
                         micro_batches=1)
    with pytest.raises(ValueError, match="a stage of 3 devices does not fit group v100"):
        check_mixed(model, system, TrainingSpec(global_batch=3, seq_len=1024), straddle)
    two_nodes = MixedPlan(stages=(MixedStage(0, 1, 8, 12), MixedStage(1, 1, 4, 12)),
                          micro_batches=4)
    check_mixed(model, system, training, two_nodes)  # no error


def test_a_spanning_stage_is_named_by_every_device_it_runs_on(tmp_path: Path, capsys) -> None:
    path = _write(tmp_path, 'a,gpt-1.7b,systems.yaml#a100-v100,64,2048,'
                  '"a100:tp8dp1x1[12] > a100+v100:tp8dp2x1[12] m16 none",2.0',
                  header="name,model,system,global_batch,seq_len,stages,step_time_s")
    assert main(["validate", str(path), "--by", "device"]) == 0
    assert "a100-80gb+v100-16gb" in capsys.readouterr().out
    # 17 GB off every part it runs on: more than the V100s' 16.9 GB (the first group's A100s
    # alone were lowered before a review)
    assert main(["validate", str(path), "--margin-gb", "17"]) == 2
    assert "runs on v100-16gb, 16.94 GB; keep less free" in capsys.readouterr().err


def test_a_spanning_stage_counts_the_nodes_of_every_group_it_runs_on(tmp_path: Path,
                                                                     capsys) -> None:
    # A100 node 1 for stage 0; stage 1 on A100 node 2 and V100 node 1: 3 nodes, 2 + 1.
    path = _write(tmp_path, 'a,gpt-1.7b,systems.yaml#a100-v100,64,2048,'
                  '"a100:tp8dp1x1[12] > a100+v100:tp8dp2x1[12] m16 none",2.0',
                  header="name,model,system,global_batch,seq_len,stages,step_time_s")
    assert main(["validate", str(path), "--by", "nodes"]) == 0
    assert "\n  3 " in capsys.readouterr().out
