"""``--format chakra``: the plan's step as Chakra execution traces, ready for ASTRA-sim.

No STAGE needed: the traces are written here, one per NPU, in Chakra's protobuf format
(:mod:`planner.chakra`), with ASTRA-sim's communicator-group file, its system, network and
remote-memory files, and the command that runs them.

- ``stage`` convention: exactly the graph STAGE recomp writes (:mod:`planner.chakra.stage_et`),
  timed by ASTRA-sim's roofline (``roofline-enabled`` 1), as ``astra-estimate --et-out``.
- ``megatron`` convention: the project's own step (:mod:`simcore.megatron.step_graph`:
  micro-batches in the schedule's order, recompute, tp / sp / ZeRO collectives, pipeline sends
  and receives, the gradient reduction and the optimizer), compute nodes with their estimated
  runtimes (``roofline-enabled`` 0).
- ``mlp`` convention: not exported (its estimate has no per-op step).
"""

from __future__ import annotations

import textwrap

from planner.astra_io import (
    WRITTEN_SWITCHES,
    network_yml_text,
    remote_memory_json_text,
    system_json_text,
)
from planner.chakra.io import TraceProgress
from planner.chakra.stage_et import COMM_GROUP_FILE
from planner.plan import Plan
from simcore.network import Congestion
from simcore.specs import Convention

__all__ = ["TRACE_FOLDER", "chakra_problem", "export_chakra", "run_script"]

TRACE_FOLDER = "traces"
TRACE_NAME = "workload"
ASTRA_BINARY = "AstraSim_Analytical_Congestion_Unaware"
ASTRA_AWARE_BINARY = "AstraSim_Analytical_Congestion_Aware"
MAX_NODES = 10_000_000
"""Nodes over all NPUs above which the export refuses (about 400 MB of traces, kept in memory
until written: about 40 bytes and 3 us a node)."""


def _stage_files(plan: Plan, progress: TraceProgress | None) -> dict[str, bytes | str]:
    from planner.chakra.stage_et import stage_trace_files
    from planner.exports._astra import stage_args_for
    from simcore.stage import build_model

    args = stage_args_for(plan)
    model = build_model(args)
    _check_size(args.npus * max(len(r.nodes) for r in model.ranks), plan)
    return stage_trace_files(model, TRACE_NAME, progress)


def _step_files(plan: Plan, progress: TraceProgress | None) -> dict[str, bytes | str]:
    from planner.chakra.step_et import step_trace_files
    from simcore.megatron.step_graph import step_graph_nodes, step_graphs

    # counted from the stages' graphs before every NPU's is built: a plan of millions of nodes
    # is refused in seconds, not after it has filled the memory
    _check_size(step_graph_nodes(plan.model, plan.system, plan.training, plan.strategy), plan)
    steps = step_graphs(plan.model, plan.system, plan.training, plan.strategy)
    return step_trace_files(steps, TRACE_NAME, progress)


def chakra_problem(plan: Plan) -> str | None:
    """Why :func:`export_chakra` would refuse the plan of a megatron or mlp study, found without
    writing a trace (the stage convention's are found as it builds them: None); None when it
    would write it."""
    from simcore.megatron.step_graph import step_graph_nodes

    if plan.convention is Convention.STAGE:
        return None
    if plan.convention is not Convention.MEGATRON:
        return (f"the {plan.convention.value} convention's estimate has no per-op step to write"
                " as Chakra traces; use the megatron or stage convention")
    try:
        _check_size(step_graph_nodes(plan.model, plan.system, plan.training, plan.strategy),
                    plan)
    except ValueError as e:
        return str(e)
    return None


def _check_size(nodes: int, plan: Plan) -> None:
    if nodes > MAX_NODES:
        raise ValueError(f"{nodes:,} trace nodes over {plan.system.devices} NPUs (more than"
                         f" {MAX_NODES:,}); export a plan on fewer NPUs or fewer micro-batches")


def _system_json(plan: Plan) -> str:
    """The system file; the roofline and memory tracking off for the megatron step, whose
    compute nodes carry runtimes and no tensors."""
    if plan.convention is Convention.STAGE:
        return system_json_text(plan.system)
    off = {**WRITTEN_SWITCHES, "roofline-enabled": 0, "track-local-mem": 0}
    return system_json_text(plan.system, off)


def run_script(plan: Plan) -> str:
    """``run-astra-sim.sh``: ASTRA-sim's analytical backend on the traces, and the same replay
    with ``planner replay``."""
    prefix = f"{TRACE_FOLDER}/{TRACE_NAME}"
    aware = plan.system.network.congestion is Congestion.AWARE
    binary = ASTRA_AWARE_BINARY if aware else ASTRA_BINARY
    return f"""#!/bin/sh
# Plan {plan.label} of {plan.model.name} on {plan.system.name} ({plan.system.devices} NPUs),
# {plan.convention.value} convention, written by `planner export --format chakra`.
#   ASTRA_SIM  the {binary} binary (default: on PATH)
# Without ASTRA-sim: planner replay "$HERE/{prefix}" --system-json "$HERE/system.json" \\
#     --network-yml "$HERE/network.yml"
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
"${{ASTRA_SIM:-{binary}}}" \\
    --workload-configuration="$HERE/{prefix}" \\
    --comm-group-configuration="$HERE/{TRACE_FOLDER}/{COMM_GROUP_FILE}" \\
    --system-configuration="$HERE/system.json" \\
    --network-configuration="$HERE/network.yml" \\
    --remote-memory-configuration="$HERE/remote_memory.json"
"""


def _readme(plan: Plan) -> str:
    step = plan.estimate.step_time
    if plan.convention is Convention.STAGE:
        what = ("STAGE recomp's graph for this plan, node for node, timed by ASTRA-sim's roofline"
                " (peak-perf, local-mem-bw in system.json). ASTRA-sim's analytical congestion-"
                f"unaware backend reports the estimate's {step * 1e9:,.0f} ns as the largest"
                " finished cycles.")
    else:
        what = (
            "The project's own step: every micro-batch's forward and backward in the "
            f"{plan.strategy.schedule.value} schedule's order, compute nodes with their estimated"
            " runtimes (duration_micros; roofline-enabled 0), tp / context-parallel / ZeRO"
            " collectives on their communicator groups, pipeline sends and receives, then the"
            " gradient reduction and the optimizer. ASTRA-sim times the communication on its own"
            f" network model. The estimate is {step * 1e3:.3f} ms per step; the replay differs"
            " by the per-call collective latencies and launch costs of the catalog's links"
            " (ASTRA-sim has none), by the compute's slowdown beside a collective"
            " (the device's overlap_slowdown; ASTRA-sim overlaps for free), by a pipeline transfer the estimate charges to ops that send"
            " nothing (the last stage's forwards, the first stage's backwards), by context"
            " parallelism and ZeRO-3 overlapped per op instead of per layer, by the tp"
            " collectives and interleaved pipeline transfers Transformer Engine's stack hides"
            " behind compute (here in line), by ASTRA-sim's"
            " timing of communicator groups that span part of a network dimension, and by"
            " runtimes rounded to whole microseconds.")
    title = (f"Chakra traces for plan {plan.label}: {plan.model.name} on {plan.system.name}"
             f" ({plan.system.devices} NPUs), {plan.convention.value} convention.")
    lines = [title, ""]
    lines += [
        f"  {TRACE_FOLDER}/{TRACE_NAME}.<npu>.et   one Chakra trace per NPU (schema 0.0.4)",
        f"  {TRACE_FOLDER}/{COMM_GROUP_FILE}   communicator groups (ASTRA-sim's JSON)",
        "  system.json, network.yml, remote_memory.json   ASTRA-sim's inputs",
        "  run-astra-sim.sh   runs ASTRA-sim (ASTRA_SIM=/path/to/binary sh run-astra-sim.sh)",
        ""]
    return "\n".join(lines + textwrap.wrap(what, width=100)) + "\n"


def export_chakra(plan: Plan, progress: TraceProgress | None = None) -> dict[str, bytes | str]:
    """Traces, communicator groups, ASTRA-sim's three input files, the run script and a
    README (see the module docstring); ``progress`` hears of each trace file encoded."""
    if plan.convention is Convention.STAGE:
        traces = _stage_files(plan, progress)
    elif plan.convention is Convention.MEGATRON:
        traces = _step_files(plan, progress)
    else:
        raise ValueError(f"the {plan.convention.value} convention's estimate has no per-op step"
                         " to write as Chakra traces; use the megatron or stage convention")
    files: dict[str, bytes | str] = {f"{TRACE_FOLDER}/{k}": v for k, v in traces.items()}
    files.update({
        "system.json": _system_json(plan),
        "network.yml": network_yml_text(plan.system),
        "remote_memory.json": remote_memory_json_text(),
        "run-astra-sim.sh": run_script(plan),
        "README-chakra.txt": _readme(plan),
    })
    return files
