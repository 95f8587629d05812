"""The ASTRA-sim lab's own input files in studies/astra/, and the documented commands on them.

The lab (seed document 000_e13c9ab14088c0d8, "Lab4B") writes its system JSON with ``json.dump``
and its network YAML with ``yaml.dump`` from a template and five systems; the files shipped must
be exactly what that code writes. The documented ``planner astra-estimate``, ``planner replay``
and ``planner collective`` examples must run on a fresh clone from these files; the estimate's
trace inventory is checked against STAGE's own trace of the same command
(tests/data/stage_traces/, README there)."""

from __future__ import annotations

import csv
import json
import shlex
from pathlib import Path

import pytest
import yaml

from planner import cli
from planner.astra_io import load_astra_system
from planner.commands._astra_estimate import AstraEstimateCommand

ROOT = Path(__file__).resolve().parent.parent
ASTRA = ROOT / "studies" / "astra"
STAGE_TRACES = ROOT / "tests" / "data" / "stage_traces"

# seed Part 0, In [2]: system_config_template (the four implementations, local-mem-bw and
# peak-perf "to be overrided by user")
TEMPLATE = {
    "scheduling-policy": "LIFO", "endpoint-delay": 10, "active-chunks-per-dimension": 4,
    "preferred-dataset-splits": 10, "boost-mode": 0, "collective-optimization": "localBWAware",
    "track-local-mem": 1, "trace-enabled": 1, "roofline-enabled": 1,
    "all-reduce-implementation": None, "all-gather-implementation": None,
    "reduce-scatter-implementation": None, "all-to-all-implementation": None,
    "local-mem-bw": None, "peak-perf": None,
}
# (topology, npus_count, bandwidth, latency, implementation per dimension, local-mem-bw,
# peak-perf) as the seed's AstraSimConfig instances give them
SYSTEMS = {
    # Part 3, In [11]: system1_spec (fast NPU, slow interconnect)
    "lab-system1": (["Ring"] * 3, [4, 4, 4], [100] * 3, [50] * 3, ["ring"] * 3, 3000, 450),
    # Part 3, In [11]: system2_spec (slow NPU, fast interconnect)
    "lab-system2": (["Ring"] * 3, [4, 4, 4], [2000] * 3, [50] * 3, ["ring"] * 3, 300, 45),
    # Part 2.2, In [8]: dgx_2k_system
    "dgx-2k": (["FullyConnected", "Switch", "Ring", "Ring"], [8, 16, 4, 4],
               [128.5714, 100, 25, 6.25], [20, 300, 700, 1000],
               ["direct", "halvingDoubling", "ring", "ring"], 3000, 900),
    # Part 2.2, In [8]: tpu_512_system
    "tpu-512": (["Ring", "Ring", "Ring", "Switch"], [4, 4, 4, 8], [100, 100, 100, 50],
                [50, 50, 50, 2000], ["ring", "ring", "ring", "halvingDoubling"], 2765, 459),
    # Part 2.3, In [10]: test_astrasim_spec, saved as "dgx_16"
    "dgx-16": (["FullyConnected", "Switch"], [8, 2], [128.5714, 25], [20, 100],
               ["direct", "halvingDoubling"], 3000, 900),
}


def _expected(name: str) -> tuple[dict, dict]:
    topology, npus, bandwidth, latency, impl, mem_bw, peak = SYSTEMS[name]
    system = {**TEMPLATE, **{f"{c}-implementation": impl for c in
                             ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")},
              "local-mem-bw": mem_bw, "peak-perf": peak}
    network = {"topology": topology, "npus_count": npus, "bandwidth": bandwidth,
               "latency": latency}
    return system, network


@pytest.mark.parametrize("name", sorted(SYSTEMS))
def test_files_are_what_the_lab_writes(name: str) -> None:
    system, network = _expected(name)
    # generate_astrasim_config (Part 2.2, In [7]): json.dump(system_config, f),
    # yaml.dump(network_config, f)
    assert (ASTRA / f"{name}-system.json").read_text() == json.dumps(system)
    assert (ASTRA / f"{name}-network.yml").read_text() == yaml.dump(network)


def test_remote_memory_file_is_what_the_lab_writes() -> None:
    # generate_astrasim_config: f.write("{\"memory-type\": \"NO_MEMORY_EXPANSION\"}\n")
    text = (ASTRA / "lab-remote-memory.json").read_text()
    assert text == '{"memory-type": "NO_MEMORY_EXPANSION"}\n'


@pytest.mark.parametrize("name", sorted(SYSTEMS))
def test_files_load_with_the_roofline(name: str) -> None:
    _, npus, *_, mem_bw, peak = SYSTEMS[name]
    system = load_astra_system(ASTRA / f"{name}-system.json", ASTRA / f"{name}-network.yml")
    assert system.network.npus == npus[0] * npus[1] * (npus[2] if len(npus) > 2 else 1) * (
        npus[3] if len(npus) > 3 else 1)
    # ASTRA-sim's peak-perf is TFLOP/s and local-mem-bw GB/s, both decimal (README "Units")
    assert (system.peak_flops_per_s, system.local_mem_bandwidth_bytes_per_s) == (
        peak * 1e12, mem_bw * 1e9)
    assert system.roofline_enabled


# The documented examples (proposed README text), run from the repository root.
# The lab's GPT-175B (Part 3, In [11]) at the plan the lab chose under 80 GB (Part 3.3,
# "4_8_2_1_1"), on system 2, STAGE's flags as the lab's call_stage writes them:
ASTRA_ESTIMATE = (
    "planner astra-estimate --system-json studies/astra/lab-system2-system.json"
    " --network-yml studies/astra/lab-system2-network.yml --"
    " --dp 4 --tp 8 --pp 1 --sp 2 --weight_sharded 0 --activation_recompute True"
    " --din 50257 --dout 50257 --dmodel 12288 --dff 49152 --head 96 --seq 1024 --batch 512"
    " --num_stacks 96")
# The lab's pipeline test (Part 2.3, In [10]): llama_70b_1 on dgx_16, traces out, replayed
ET_OUT = (
    "planner astra-estimate --system-json studies/astra/dgx-16-system.json"
    " --network-yml studies/astra/dgx-16-network.yml --et-out traces --"
    " --dp 4 --tp 4 --pp 1 --sp 1 --weight_sharded 0 --activation_recompute True"
    " --din 32000 --dout 32000 --dmodel 8192 --dff 28672 --head 64 --seq 1024 --batch 512"
    " --num_stacks 16")
REPLAY = ("planner replay traces/workload --system-json studies/astra/dgx-16-system.json"
          " --network-yml studies/astra/dgx-16-network.yml --json")
# The ASTRA-sim tutorial's all-reduce (studies/astra/README.md; shared NOTES.md section 3)
COLLECTIVE = ("planner collective all-reduce 1MiB --system-json studies/astra/tutorial-system.json"
              " --network-yml studies/astra/tutorial-ring8.yml")


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    if not any(c.name == "astra-estimate" for c in cli.COMMANDS):
        monkeypatch.setattr(cli, "COMMANDS", [*cli.COMMANDS, AstraEstimateCommand()])


def _run(capsys, command: str, folder: Path = ROOT) -> tuple[int, str, str]:
    """``command`` as a shell would run it from ``folder`` (paths relative to it)."""
    argv = shlex.split(command)
    assert argv[0] == "planner"
    with pytest.MonkeyPatch.context() as m:
        m.chdir(folder)
        code = cli.main(argv[1:])
    out, err = capsys.readouterr()
    return code, out, err


def _stage_inventory(run: str) -> dict[str, int]:
    with (STAGE_TRACES / "inventory.csv").open() as f:
        row = next(r for r in csv.DictReader(f) if r["run"] == run and r["rank"] == "0")
    return {k: int(v) for k, v in row.items() if k not in ("run", "rank", "n_nodes")}


def test_documented_astra_estimate(capsys) -> None:
    code, out, err = _run(capsys, ASTRA_ESTIMATE)
    assert (code, err) == (0, "")
    data = json.loads(out)
    # rank 0's trace is the one STAGE writes for this command (inventory.csv, gpt175b_lab):
    # 50257 over tp = 8 is not whole, but every product STAGE writes is here
    assert data["et0"] == _stage_inventory("gpt175b_lab")
    # ASTRA-sim's own identity: exposed communication = wall - GPU time
    assert data["wall_time"] == data["gpu_time"] + data["exposed_comm"] > 0
    assert data["max_wall_time_all_ranks"] >= data["wall_time"]
    assert data["peak_memory_usage"] > 0


def test_documented_et_out_and_replay(capsys, tmp_path: Path) -> None:
    # a checkout's root, without writing traces into this one
    (tmp_path / "studies").symlink_to(ROOT / "studies")
    code, out, err = _run(capsys, ET_OUT, tmp_path)
    assert code == 0 and "wrote 16 Chakra traces" in err
    estimate = json.loads(out)
    traces = sorted(p.name for p in (tmp_path / "traces").iterdir())
    assert traces == sorted([f"workload.{i}.et" for i in range(16)] + ["comm_group.json"])
    code, out, err = _run(capsys, REPLAY, tmp_path)
    assert (code, err) == (0, "")
    sys0 = json.loads(out)[0]
    assert sys0["sys"] == 0
    fields = ("wall_time", "gpu_time", "comm_time", "exposed_comm", "peak_memory_usage")
    assert {k: sys0[k] for k in fields} == {k: estimate[k] for k in fields}


def test_documented_collective(capsys) -> None:
    # the ASTRA-sim tutorial reports 117,780 ns (shared reference NOTES.md section 3)
    assert _run(capsys, COLLECTIVE) == (0, "117780 ns\n", "")
