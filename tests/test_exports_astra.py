"""`--format astra-sim`: the STAGE command line and ASTRA-sim's input files of a plan, against
hand-written files in the lab's formats, read back by ASTRA-sim's keys, and run through stub
STAGE / ASTRA-sim programs that record what they are given."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from planner.astra_io import load_astra_system
from planner.catalog import load_catalog
from planner.commands._astra_estimate import parse_stage_args
from planner.errors import PlannerUsageError
from planner.exports import export_files, exporter
from planner.exports._astra import export_astra
from planner.plan import Plan, make_plan
from simcore.network import NetworkDim, Topology
from simcore.specs import Convention, Recompute, Schedule, Strategy, TrainingSpec, ZeroStage
from simcore.stage_adapter import stage_args

EXPECTED = Path(__file__).parent / "data" / "exports" / "astra"
FILES = ("stage.sh", "system.json", "network.yml", "remote_memory.json", "README-astra-sim.txt")
LAB = TrainingSpec(global_batch=512, seq_len=1024)


@pytest.fixture(autouse=True)
def user_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test reads or writes the real user catalog."""
    folder = tmp_path / "user-catalog"
    monkeypatch.setenv("PLANNER_CATALOG", str(folder))
    return folder


def lab_plan(strategy: Strategy, convention: Convention = Convention.STAGE) -> Plan:
    c = load_catalog()
    return make_plan(c.model("llama70b"), c.system("lab-system1"), LAB, strategy, convention)


KNOWN = Strategy(dp=8, tp=4, sp=2, recompute=Recompute.FULL)


def test_known_plan_gives_the_hand_written_files() -> None:
    # lab-system1 (shared design.md, "Catalogs to ship"): Ring x Ring x Ring, 4x4x4, 100 GB/s
    # and 50 ns each, ring each, local-mem-bw 3000, peak-perf 450; template LIFO, endpoint-delay
    # 10, 4 active chunks, 10 splits, localBWAware. tests/data/exports/astra/README.md says how
    # the expected files were written.
    files = export_astra(lab_plan(KNOWN))
    assert list(files) == list(FILES)
    folder = EXPECTED / "llama70b-lab-system1-dp8-tp4-sp2-full"
    for name in FILES:
        assert files[name] == (folder / name).read_text(), name


def test_registered_as_astra_sim() -> None:
    assert exporter("astra-sim") is export_astra
    assert set(export_files(lab_plan(KNOWN), "astra-sim")) == set(FILES)


def test_files_read_back_as_the_plans_system(tmp_path: Path) -> None:
    plan = lab_plan(KNOWN)
    for name, text in export_astra(plan).items():
        (tmp_path / name).write_text(text)
    astra = load_astra_system(tmp_path / "system.json", tmp_path / "network.yml")
    assert astra.peak_flops_per_s == plan.system.device.peak_flops_per_s
    assert astra.local_mem_bandwidth_bytes_per_s == plan.system.device.hbm_bandwidth_bytes_per_s
    assert astra.roofline_enabled
    assert astra.network.scheduling == plan.system.network.scheduling
    for got, want in zip(astra.network.dims, plan.system.network.dims, strict=True):
        # the catalog writes 0.05 us; 50 ns / 1e9 may differ from 0.05 * 1e-6 in the last bit
        assert replace(got, latency_s=want.latency_s) == want
        assert got.latency_s == pytest.approx(want.latency_s, rel=1e-12)
    remote = json.loads((tmp_path / "remote_memory.json").read_text())
    assert remote == {"memory-type": "NO_MEMORY_EXPANSION"}


def _stage_tokens(script: str) -> list[str]:
    """The flags given to STAGE's main.py in stage.sh (after the python -c wrapper)."""
    joined = script.replace("\\\n", " ")
    line = next(x for x in joined.splitlines() if "--dp " in x)
    return shlex.split(line[line.index("--dp "):])


def test_stage_flags_are_what_the_stage_convention_simulates() -> None:
    for strategy in (KNOWN, Strategy(dp=16, tp=2, pp=2, zero=ZeroStage.PARAMETERS)):
        plan = lab_plan(strategy)
        tokens = _stage_tokens(export_astra(plan)["stage.sh"])
        flags = tokens[::2]
        assert flags == ["--dp", "--tp", "--pp", "--sp", "--weight_sharded",
                         "--activation_recompute", "--din", "--dout", "--dmodel", "--dff",
                         "--head", "--seq", "--batch", "--num_stacks", "--output_dir",
                         "--comm_group_file", "--output_name"]
        # `planner astra-estimate` reads a STAGE command line: the same arguments come back
        assert parse_stage_args(tokens) == stage_args(plan.model, plan.training, plan.strategy)


def test_fsdp_plan_names_its_traces_as_the_lab_does() -> None:
    script = export_astra(lab_plan(Strategy(dp=16, tp=2, pp=2, zero=ZeroStage.PARAMETERS)))
    assert "--weight_sharded 1 --activation_recompute 0" in script["stage.sh"]
    assert "--output_name lab-system1_dp16_tp2_pp2_sp1_ws1_rc0" in script["stage.sh"]


STUB_CONVERT = "class ConvertChakra:\n    with_comm_info = False\n"
STUB_MAIN = """import json, os, sys
from symbolic_tensor_graph.graph.convert_chakra import ConvertChakra
args = sys.argv[1:]
out = args[args.index("--output_dir") + 1]
name = args[args.index("--output_name") + 1]
record = {"argv0": sys.argv[0], "args": args, "with_comm_info": ConvertChakra.with_comm_info,
          "cwd": os.getcwd()}
with open(os.path.join(out, "stage-call.json"), "w") as f:
    json.dump(record, f)
for rank in range(64):
    open(os.path.join(out, f"{name}.{rank}.et"), "w").close()
open(os.path.join(out, args[args.index("--comm_group_file") + 1]), "w").close()
"""
STUB_ASTRA = """#!/bin/sh
for a in "$@"; do echo "$a"; done > "$ASTRA_RECORD"
"""


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX sh")
def test_stage_sh_runs_stage_then_astra_sim(tmp_path: Path) -> None:
    # Stub programs stand in for STAGE's main.py and the ASTRA-sim binary; they record what
    # stage.sh gives them.
    stage = tmp_path / "stg"
    (stage / "symbolic_tensor_graph" / "graph").mkdir(parents=True)
    (stage / "symbolic_tensor_graph" / "graph" / "convert_chakra.py").write_text(STUB_CONVERT)
    (stage / "main.py").write_text(STUB_MAIN)
    astra = tmp_path / "astra-sim"
    astra.write_text(STUB_ASTRA)
    astra.chmod(astra.stat().st_mode | stat.S_IXUSR)
    export = tmp_path / "export"
    export.mkdir()
    for name, text in export_astra(lab_plan(KNOWN)).items():
        (export / name).write_text(text)
    env = {**os.environ, "STAGE": str(stage), "ASTRA_SIM": str(astra),
           "PYTHON": sys.executable, "ASTRA_RECORD": str(tmp_path / "astra-call.txt")}
    env.pop("OUT", None)
    done = subprocess.run(["sh", str(export / "stage.sh")], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    out = export / "stage_out"
    call = json.loads((out / "stage-call.json").read_text())
    assert call["argv0"] == "main.py" and call["with_comm_info"] is True
    assert Path(call["cwd"]) == stage.resolve()
    assert call["args"][call["args"].index("--output_dir") + 1] == str(out.resolve())
    trace = out.resolve() / "lab-system1_dp8_tp4_pp1_sp2_ws0_rc1"
    assert (tmp_path / "astra-call.txt").read_text().splitlines() == [
        f"--workload-configuration={trace}",
        f"--comm-group-configuration={out.resolve() / 'comm_group.json'}",
        f"--system-configuration={export.resolve() / 'system.json'}",
        f"--network-configuration={export.resolve() / 'network.yml'}",
        f"--remote-memory-configuration={export.resolve() / 'remote_memory.json'}",
    ]


def test_megatron_plan_lists_what_stage_cannot_express() -> None:
    strategy = Strategy(dp=4, tp=4, pp=4, zero=ZeroStage.OPTIMIZER, micro_batch=2,
                        recompute=Recompute.SELECTIVE, schedule=Schedule.ONE_F_ONE_B)
    files = export_astra(lab_plan(strategy, Convention.MEGATRON))
    text = " ".join(files["README-astra-sim.txt"].split())
    assert "What STAGE cannot express for this plan:" in text
    for phrase in ("convention megatron: the plan was estimated with another graph",
                   "FFN activation swiglu",
                   "micro-batches: the plan runs 64 micro-batches of 2 sequences per"
                   " data-parallel replica; STAGE runs all 128 at once.",
                   "pipeline schedule 1f1b: STAGE has none",
                   "ZeRO-1: STAGE shards only the weights themselves",
                   "written as --weight_sharded 0",
                   "selective recompute", "written as --activation_recompute 1",
                   "placement tp,sp,dp,pp: STAGE numbers the ranks dp fastest"):
        assert phrase in text, phrase
    assert ("--dp 4 --tp 4 --pp 4 --sp 1 --weight_sharded 0 --activation_recompute 1"
            in files["stage.sh"])
    assert all(len(line) <= 100 for line in files["README-astra-sim.txt"].splitlines())


def test_stage_plan_with_settings_stage_ignores() -> None:
    plan = lab_plan(Strategy(dp=8, tp=4, sp=2, zero=ZeroStage.GRADIENTS, micro_batch=4))
    text = " ".join(export_astra(plan)["README-astra-sim.txt"].split())
    assert "ZeRO-2" in text and "micro-batches: the plan runs 16 micro-batches of 4" in text
    assert "convention" not in text.split("What STAGE cannot express")[1]


@pytest.mark.parametrize("topology", [Topology.MESH_2D, Topology.TORUS_2D])
def test_topologies_astra_sim_cannot_run_are_refused(topology: Topology) -> None:
    plan = lab_plan(KNOWN)
    dims = list(plan.system.network.dims)
    dims[1] = NetworkDim(topology=topology, npus=4, width=2,
                         bandwidth_bytes_per_s=dims[1].bandwidth_bytes_per_s,
                         latency_s=dims[1].latency_s)
    network = replace(plan.system.network, dims=tuple(dims))
    bad = replace(plan, system=replace(plan.system, network=network))
    with pytest.raises(PlannerUsageError) as e:
        export_astra(bad)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"system lab-system1: network[1].topology: {topology.value} is not"
                              " an ASTRA-sim topology")
    assert "Ring, FullyConnected, Switch" in message


def test_plan_stage_cannot_build_is_the_exports_refusal() -> None:
    # a ValueError, as a framework refuses a plan: `export --format all` notes it and writes
    # the other formats; `--format astra-sim` says it in one line naming the format and plan
    plan = lab_plan(KNOWN)
    bad = replace(plan, strategy=Strategy(dp=4, tp=4, sp=2, recompute=Recompute.FULL))
    with pytest.raises(ValueError, match="STAGE cannot build it: dp\\*tp\\*pp\\*sp must equal"
                       " the device count"):
        export_astra(bad)
