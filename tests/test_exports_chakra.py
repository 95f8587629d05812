"""`planner export --format chakra`: a plan's step as Chakra traces, replayed.

- ``stage`` convention: the traces are STAGE's graph; replayed, they give the estimate to the
  nanosecond (the estimate is itself ASTRA-sim's replay of that graph, checked against measured
  ASTRA-sim runs in tests/test_stage*.py).
- ``megatron`` convention: the traces are the project's own step. Replayed as ASTRA-sim would,
  they must end where the step's pipeline schedule ends when the network has no per-call
  latency (ASTRA-sim has none): the expected figure below is built independently of the graph,
  from the estimate's per-op times (:func:`simcore.megatron.phases.stage_phases`) scheduled by
  the timeline's max-plus scan (:func:`simcore.timeline.schedule_pipeline`), with the one
  documented difference (ops that send nothing are not charged a transfer), within the rounding
  of runtimes to whole microseconds (Chakra's ``duration_micros``).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from planner.catalog import load_catalog
from planner.chakra.io import read_trace
from planner.cli import main
from planner.exports import export_files, exporter
from planner.exports._chakra import export_chakra
from planner.outputs import write_files
from planner.plan import Plan, make_plan
from simcore.megatron.phases import stage_phases
from simcore.megatron.step_graph import step_graphs
from simcore.specs import (
    Convention,
    CpComm,
    Recompute,
    Schedule,
    Strategy,
    SystemSpec,
    TrainingSpec,
    ZeroStage,
)
from simcore.timeline import schedule_pipeline
from tests.test_chakra import _messages

LAB = TrainingSpec(global_batch=512, seq_len=1024)
SMALL = TrainingSpec(global_batch=32, seq_len=2048, overlap_grad_reduce=False)


@pytest.fixture(autouse=True)
def user_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "user-catalog"
    monkeypatch.setenv("PLANNER_CATALOG", str(folder))
    return folder


def _no_call_latency(system: SystemSpec) -> SystemSpec:
    """The system as ASTRA-sim can express it: no per-call latency, no send rate of its own, no
    collective launch, no compute slowdown beside a collective."""
    dims = tuple(replace(d, call_latency_s=0.0, p2p_bandwidth_bytes_per_s=None)
                 for d in system.network.dims)
    device = replace(system.device, collective_launch_s=0.0, overlap_slowdown=0.0)
    return replace(system, device=device, network=replace(system.network, dims=dims))


def _write(files: dict[str, str | bytes], folder: Path) -> Path:
    write_files(folder, files)
    return folder


def _replay(capsys, folder: Path) -> list[dict]:
    assert main(["replay", str(folder / "traces" / "workload"), "--system-json",
                 str(folder / "system.json"), "--network-yml", str(folder / "network.yml"),
                 "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _compute_nodes(folder: Path) -> int:
    """Compute nodes (COMP_NODE, type 4) over every NPU's trace: each carries a runtime rounded
    to whole microseconds, which bounds how far a replay may drift."""
    return sum(1 for path in (folder / "traces").glob("workload.*.et")
               for n in read_trace(path).nodes if n.type == 4)


def test_registered_as_chakra() -> None:
    assert exporter("chakra") is export_chakra


def test_stage_plan_replays_to_its_estimate(tmp_path, capsys) -> None:
    c = load_catalog()
    plan = make_plan(c.model("stage-1024x4"), c.system("dgx-a100-8"), LAB,
                     Strategy(dp=4, pp=2), Convention.STAGE)
    folder = _write(export_files(plan, "chakra"), tmp_path)
    assert len(list((folder / "traces").glob("workload.*.et"))) == 8
    npus = _replay(capsys, folder)
    assert max(r["wall_time"] for r in npus) == round(plan.estimate.step_time * 1e9)
    assert json.loads((folder / "system.json").read_text())["roofline-enabled"] == 1


def _megatron(system: str = "dgx-a100-16", training: TrainingSpec = SMALL,
              **knobs: object) -> Plan:
    c = load_catalog()
    return make_plan(c.model("gpt-1.7b"), _no_call_latency(c.system(system)), training,
                     Strategy(**knobs), Convention.MEGATRON)  # type: ignore[arg-type]


def _schedule_end(plan: Plan) -> float:
    """When the last stage's optimizer step ends: each stage's ops scheduled as the estimate
    times them, less the transfer of the ops that send nothing (the last virtual stage's
    forward, the first one's backward; zbv's V also passes chunk 0 to chunk 1 on the last
    stage without a send), then its own gradient reduction and optimizer."""
    s = plan.strategy
    phases = stage_phases(plan.model, plan.system, plan.training, s)
    forward = np.array([[op.total for op in st.forward] for st in phases])
    backward = np.array([[op.total for op in st.backward] for st in phases])
    p2p = phases[-1].forward[-1].p2p
    if s.schedule is Schedule.ZBV:
        forward[0, 1] -= p2p
        forward[s.pp - 1, 0] -= p2p
        backward[s.pp - 1, 1] -= p2p
    else:
        forward[s.pp - 1, s.v - 1] -= p2p
    backward[0, 0] -= phases[0].backward[0].p2p
    wgrad = np.array([[op.wgrad for op in st.backward] for st in phases])  # the W passes
    m = plan.training.global_batch // (s.dp * s.micro_batch)
    ends = schedule_pipeline(s.schedule, forward, backward, m, wgrad).end.max(axis=1)
    return max(end + st.dp_exposed + st.optimizer for end, st in zip(ends, phases))


@pytest.mark.parametrize("knobs", [
    {"dp": 2, "tp": 8},
    {"dp": 2, "tp": 8, "recompute": Recompute.FULL},
    {"dp": 2, "tp": 8, "zero": ZeroStage.OPTIMIZER},
    {"dp": 4, "tp": 2, "pp": 2},
    {"dp": 2, "tp": 4, "pp": 2, "sequence_parallel": True},
    {"dp": 4, "tp": 2, "pp": 2, "schedule": Schedule.INTERLEAVED, "v": 2},
    {"dp": 2, "tp": 4, "pp": 2, "schedule": Schedule.GPIPE, "recompute": Recompute.SELECTIVE},
    {"dp": 4, "tp": 2, "pp": 2, "schedule": Schedule.ZB_H1},
    {"dp": 2, "tp": 2, "pp": 4, "schedule": Schedule.ZB_H1, "recompute": Recompute.FULL},
    {"dp": 4, "tp": 2, "pp": 2, "schedule": Schedule.ZBV, "v": 2},
    {"dp": 2, "tp": 2, "pp": 4, "schedule": Schedule.ZBV, "v": 2, "recompute": Recompute.FULL},
    {"dp": 8, "tp": 2, "zero": ZeroStage.PARAMETERS, "shard_group": 4},
    {"dp": 8, "tp": 2, "zero": ZeroStage.OPTIMIZER, "shard_group": 4},
], ids=str)
def test_megatron_plan_replays_to_its_schedule(tmp_path, capsys, knobs) -> None:
    plan = _megatron(**knobs)
    folder = _write(export_files(plan, "chakra"), tmp_path)
    npus = _replay(capsys, folder)
    assert len(npus) == 16
    wall = max(r["wall_time"] for r in npus) * 1e-9
    computes = _compute_nodes(folder)
    rounding = 0.5e-6 * computes / 16 * plan.strategy.pp  # every compute node of one path
    assert abs(wall - _schedule_end(plan)) <= rounding
    if plan.strategy.pp == 1:  # nothing charged that is not sent: the estimate itself
        assert abs(wall - plan.estimate.step_time) <= rounding
    assert json.loads((folder / "system.json").read_text())["roofline-enabled"] == 0


@pytest.mark.parametrize("cp_comm", [None, CpComm.ALL_GATHER], ids=str)
@pytest.mark.parametrize("recompute", [Recompute.NONE, Recompute.FULL], ids=str)
def test_context_parallel_plans_replay_to_their_estimate(tmp_path, capsys, cp_comm,
                                                          recompute) -> None:
    """Context parallelism's collectives beside the attention (the ring) or after it (the
    all-gathers and reduce-scatters; the gathers again in a recompute): replayed, the step the
    estimate gives. The all-to-alls (``a2a``) are refused: the estimate times them as pairwise
    sends, ASTRA-sim as its own all-to-all."""
    training = replace(SMALL, cp_comm=cp_comm, flash_attention=True)
    plan = _megatron(training=training, dp=2, tp=2, sp=4, recompute=recompute)
    folder = _write(export_files(plan, "chakra"), tmp_path)
    npus = _replay(capsys, folder)
    wall = max(r["wall_time"] for r in npus) * 1e-9
    computes = _compute_nodes(folder)
    assert abs(wall - plan.estimate.step_time) <= 0.5e-6 * computes / 16
    ulysses = _megatron(training=replace(training, cp_comm=CpComm.A2A), dp=2, tp=2, sp=4,
                        recompute=recompute)
    with pytest.raises(ValueError, match=r"does not write context parallelism's all-to-alls"):
        export_files(ulysses, "chakra")


def test_megatron_traces_are_valid_protobuf_by_an_independent_decoder(tmp_path) -> None:
    plan = _megatron(dp=4, tp=2, pp=2)
    data = export_files(plan, "chakra")["traces/workload.0.et"]
    assert isinstance(data, bytes)
    messages = _messages(data)
    assert (1, b"0.0.4") in messages[0]  # GlobalMetadata.version
    nodes = [dict(n) for n in messages[1:]]
    assert {n[3] for n in nodes} == {4, 5, 6, 7}  # COMP, SEND, RECV, COLL
    # compute nodes carry duration_micros (field 7); m = 32 / 4 = 8 micro-batches, each with a
    # forward and a data- and weight-gradient backward node on stage 0, and the optimizer
    computes = [n for n in nodes if n[3] == 4]
    assert all(n.get(7, 0) > 0 for n in computes)
    assert len(computes) == 8 * 3 + 1
    # stage 0 of 2 sends its 8 forward outputs and receives 8 output gradients
    assert sum(1 for n in nodes if n[3] == 5) == sum(1 for n in nodes if n[3] == 6) == 8


def test_comm_groups_follow_the_placement(tmp_path) -> None:
    # placement tp, sp, dp, pp (Megatron-LM's rank order, tp fastest): with dp 4, tp 2, pp 2,
    # NPU = tp + 2 dp + 8 pp, so tp groups are {0, 1}, ..., dp groups {0, 2, 4, 6}, ...
    files = export_files(_megatron(dp=4, tp=2, pp=2), "chakra")
    groups = sorted(json.loads(files["traces/comm_group.json"]).values())
    tp = [[2 * i, 2 * i + 1] for i in range(8)]
    dp = [[base + 2 * k for k in range(4)] for base in (0, 1, 8, 9)]
    pp = [[i, i + 8] for i in range(8)]
    assert groups == sorted(tp + dp + pp)


def test_hsdp_groups_split_dp_into_shard_and_replicate(tmp_path) -> None:
    # dp 8, tp 2 on 16 NPUs: NPU = tp + 2 dp. Shard groups of 2 dp ranks (the inner part of dp,
    # as the estimate places them) are {0, 2}, {4, 6}, ...; the 4 replicas of a place in them
    # {0, 4, 8, 12}, {2, 6, 10, 14}, ...
    plan = _megatron(dp=8, tp=2, zero=ZeroStage.PARAMETERS, shard_group=2)
    files = export_files(plan, "chakra")
    groups = sorted(json.loads(files["traces/comm_group.json"]).values())
    tp = [[2 * i, 2 * i + 1] for i in range(8)]
    dp = [[r + 2 * k for k in range(8)] for r in (0, 1)]
    shard = [[base + r, base + r + 2] for base in (0, 4, 8, 12) for r in (0, 1)]
    replicate = [[r + 4 * k for k in range(4)] for r in (0, 1, 2, 3)]
    assert groups == sorted(tp + dp + shard + replicate)
    # each rank's gradient shard all-reduced across the replicas once per step: GPT 1.7B's
    # 24 (12 h^2 + 13 h) + (51200 + 2048) h parameters (h = 2304; Narayanan et al. 2021's
    # 12 l h^2 (1 + 13 / 12h + (V + s) / 12 l h)) x 2 bytes (bf16 gradients) / (tp 2 x 2 shard
    # ranks); the layer norms, which tp does not split, within 0.1%
    h = 2304
    params = 24 * (12 * h * h + 13 * h) + (51200 + 2048) * h
    trace = read_trace(_write(files, tmp_path) / "traces" / "workload.0.et")
    replicated = [n for n in trace.nodes if "dp grad reduce" in n.name]
    assert [n.type for n in replicated] == [7]  # one collective (COMM_COLL_NODE)
    (size,) = [a.int64_val for a in replicated[0].attr if a.name == "comm_size"]
    assert size == pytest.approx(params * 2 / 4, rel=1e-3)


def test_mlp_convention_is_refused_with_a_reason() -> None:
    c = load_catalog()
    plan = make_plan(c.model("distir-mlp"), c.system("lab-system1"), LAB, Strategy(dp=64),
                     Convention.MLP)
    with pytest.raises(ValueError, match="no per-op step"):
        export_chakra(plan)


def test_too_large_an_export_is_refused(monkeypatch) -> None:
    monkeypatch.setattr("planner.exports._chakra.MAX_NODES", 100)
    with pytest.raises(ValueError, match="trace nodes over 16 NPUs"):
        export_chakra(_megatron(dp=2, tp=8))


def test_export_command_writes_the_traces(tmp_path, capsys) -> None:
    study = Path(__file__).resolve().parent.parent / "studies" / "lab4b-llama70b-system1.yaml"
    storage = ["--storage", str(tmp_path / "s.db")]
    assert main(["run", str(study), *storage]) == 0
    out = tmp_path / "out"
    assert main(["export", "lab4b-llama70b-system1", "--format", "chakra", "--out", str(out),
                 *storage]) == 0
    printed = capsys.readouterr().out
    assert "traces/ (65 files)" in printed  # 64 NPUs of lab-system1 and the groups file
    (folder,) = out.iterdir()
    assert {p.name for p in folder.iterdir()} == {
        "traces", "system.json", "network.yml", "remote_memory.json", "run-astra-sim.sh",
        "README-chakra.txt"}
    script = (folder / "run-astra-sim.sh").read_text()
    assert '--workload-configuration="$HERE/traces/workload"' in script
    assert '--comm-group-configuration="$HERE/traces/comm_group.json"' in script


def test_short_first_and_last_virtual_stages_replay_to_their_schedule(tmp_path, capsys) -> None:
    # Megatron's account-for-embedding/loss split on a 22-layer copy: (22 + 2) / 2 = 12 slots per
    # stage, 6 per chunk with v 2; chunk 0 of stage 0 and chunk 1 of stage 1 hold 5 layers
    c = load_catalog()
    model = replace(c.model("gpt-1.7b"), layers=22)
    s = Strategy(dp=4, tp=2, pp=2, schedule=Schedule.INTERLEAVED, v=2, first_stage_layers=11,
                 last_stage_layers=11)
    assert s.chunk_layers(22, 0) == (5, 6) and s.chunk_layers(22, 1) == (6, 5)
    plan = make_plan(model, _no_call_latency(c.system("dgx-a100-16")), SMALL, s,
                     Convention.MEGATRON)
    folder = _write(export_files(plan, "chakra"), tmp_path)
    npus = _replay(capsys, folder)
    wall = max(r["wall_time"] for r in npus) * 1e-9
    computes = _compute_nodes(folder)
    assert abs(wall - _schedule_end(plan)) <= 0.5e-6 * computes / 16 * s.pp


def _size_said(err: str) -> tuple[int, float]:
    """(trace files, MB) from the export's notice line."""
    (line,) = [x for x in err.splitlines() if "Chakra trace files" in x]
    files = int(line.split("writing ")[1].split()[0].replace(",", ""))
    number, unit = line.rsplit("about ", 1)[1].split()
    return files, float(number) * {"kB": 1e-3, "MB": 1.0, "GB": 1e3}[unit]


ONE_PLAN = """\
name: one
model: llama70b
system: lab-system1
training: {global_batch: 16, seq_len: 1024}
sampler: exhaustive
space: {tp: [8], pp: [2], recompute: [full]}
"""


def _one_plan_study(tmp_path: Path, capsys) -> list[str]:
    """A stored study of one plan on lab-system1's 64 NPUs (14 MB of traces); its --storage."""
    study = tmp_path / "one.yaml"
    study.write_text(ONE_PLAN)
    storage = ["--storage", str(tmp_path / "s.journal")]
    assert main(["run", str(study), "--quiet", *storage]) == 0
    capsys.readouterr()
    return storage


@pytest.mark.parametrize("fmt", ["chakra", "all"])
def test_export_says_how_many_trace_files_and_how_large_first(tmp_path, capsys, fmt) -> None:
    storage = _one_plan_study(tmp_path, capsys)
    out = tmp_path / "out"
    assert main(["export", "one", "--format", fmt, "--out", str(out), *storage]) == 0
    files, mb = _size_said(capsys.readouterr().err)
    traces = list(out.glob("*/traces/*.et"))
    assert files == len(traces) == 64  # one per NPU of lab-system1
    written = sum(p.stat().st_size for p in traces) / 1e6
    assert abs(mb - written) <= 0.1 * written


def test_export_shows_a_progress_bar_over_the_trace_files(tmp_path, capsys,
                                                          monkeypatch) -> None:
    import sys

    storage = _one_plan_study(tmp_path, capsys)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # as on a terminal
    args = ["export", "one", "--format", "chakra", "--out", str(tmp_path / "out"), *storage]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert re.search(r"plan 1 traces: +\d+%\|.*\| \d+/64 ", err)  # tqdm's, as planner run's
    assert main([*args, "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "plan 1 traces" not in err and _size_said(err)[0] == 64  # the notice stays


@pytest.mark.parametrize("knobs", [{"dp": 16}, {"dp": 8, "pp": 2}, {"dp": 2, "tp": 8}],
                         ids=str)
def test_a_nodes_dependencies_do_not_grow_with_the_micro_batches(knobs) -> None:
    """Each node names the nodes it waits on directly (the op before it, its own collectives),
    not every node before it: a trace of 4x the micro-batches has no node with more deps (once
    each op named the start of the op before it too, so deps grew with the step, and traces
    with them quadratically)."""
    def widest(global_batch: int) -> int:
        plan = _megatron(training=replace(SMALL, global_batch=global_batch), **knobs)
        graphs = step_graphs(plan.model, plan.system, plan.training, plan.strategy)
        return max(len(n.deps) for g in graphs.graphs for n in g.nodes)

    assert widest(512) == widest(128) <= 4
