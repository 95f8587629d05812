"""``--format astra-sim``: the STAGE command line and ASTRA-sim's input files for a plan.

The files, in the formats the ASTRA-sim lab uses (shared reference NOTES.md sections 1.3, 6.1):

- ``stage.sh``: STAGE (astra-sim/symbolic_tensor_graph, branch ``recomp``) ``main.py`` with the
  flags :func:`simcore.stage_adapter.stage_args` gives, so STAGE builds the graph the ``stage``
  convention simulates; then ASTRA-sim's analytical backend on the traces it writes.
- ``system.json``, ``network.yml``, ``remote_memory.json``: :mod:`planner.astra_io`'s writers.
- ``README-astra-sim.txt``: how to run it, the units, and what STAGE cannot express for this
  plan.

Flag names checked against the sources: STAGE recomp ``main.py`` (0b44904d, its argparse
options; ``--output_name`` without ``%d`` becomes ``NAME.%d.et``, the comm group file is written
inside ``--output_dir``); ASTRA-sim ``astra-sim/network_frontend/analytical/common/
CmdLineParser.cc`` (518bd513) and ``workload/Workload.cc`` (the workload is read from
``NAME.<rank>.et``).
"""

from __future__ import annotations

import shlex
import textwrap

from planner.astra_io import (
    network_yml_text,
    remote_memory_json_text,
    system_json_text,
)
from planner.catalog_write import short_float
from planner.outputs import counted
from planner.plan import Plan
from planner.units import GB
from simcore.specs import (
    DEFAULT_PLACEMENT,
    Activation,
    Axis,
    Convention,
    Recompute,
    Schedule,
    ZeroStage,
)
from simcore.stage import StageArgs
from simcore.stage_adapter import check_stage

__all__ = ["caveats", "export_astra", "stage_args_for", "stage_script"]

STAGE_RANK_ORDER = (Axis.DP, Axis.TP, Axis.SP, Axis.PP)
"""STAGE recomp numbers ranks dp fastest, then tp, sp, pp (NOTES.md section 5.2)."""
COMM_GROUP_FILE = "comm_group.json"
ASTRA_BINARY = "AstraSim_Analytical_Congestion_Unaware"

# Run STAGE's main.py unchanged, with ConvertChakra.with_comm_info on: track-local-mem needs the
# inputs and outputs of each node, which recomp writes only then (NOTES.md section 1.3).
_WRAPPER = """'
import runpy, sys
from symbolic_tensor_graph.graph.convert_chakra import ConvertChakra
ConvertChakra.with_comm_info = True
sys.argv[0] = "main.py"
runpy.run_path("main.py", run_name="__main__")
'"""


def stage_args_for(plan: Plan) -> StageArgs:
    """STAGE's arguments for the plan; a ValueError (the export's one line: ``planner export``
    names ``--format`` and the plan) if STAGE cannot build it, as a framework's exporter
    refuses a plan it cannot run."""
    if plan.model.moe is not None:
        raise ValueError(f"STAGE cannot build it: {plan.model.name} has MoE layers and STAGE's"
                         " transformer has dense ones only; export another format")
    if plan.strategy.uneven:
        # STAGE recomp main.py (0b44904d) takes only --pp; its graph spreads the layers over the
        # stages itself (round-robin), with no per-stage count.
        raise ValueError("STAGE cannot build it: uneven pipeline stages (first_stage_layers /"
                         " last_stage_layers); STAGE splits the layers evenly; export another"
                         " plan")
    try:
        return check_stage(plan.model, plan.system, plan.training, plan.strategy)
    except ValueError as e:
        raise ValueError(f"STAGE cannot build it: {e}; export another plan") from None


def output_name(plan: Plan, args: StageArgs) -> str:
    """The traces' name, as the lab names its runs: ``SYSTEM_dp8_tp1_pp1_sp1_ws0_rc0``."""
    return (f"{plan.system.name}_dp{args.dp}_tp{args.tp}_pp{args.pp}_sp{args.sp}"
            f"_ws{int(args.weight_sharded)}_rc{int(args.activation_recompute)}")


def _stage_flags(args: StageArgs, name: str) -> list[str]:
    """main.py's flags in groups, one shell line each: strategy, shape, output."""
    def flag(key: str, value: object) -> str:
        return f"--{key} {value}"

    shape = [flag(k, getattr(args, k)) for k in ("din", "dout", "dmodel", "dff", "head", "seq",
                                                  "batch", "num_stacks")]
    return [
        " ".join([flag("dp", args.dp), flag("tp", args.tp), flag("pp", args.pp),
                  flag("sp", args.sp), flag("weight_sharded", int(args.weight_sharded)),
                  flag("activation_recompute", int(args.activation_recompute))]),
        " ".join(shape[:4]),
        " ".join(shape[4:]),
        " ".join([flag("output_dir", '"$OUT"'), flag("comm_group_file", COMM_GROUP_FILE)]),
        flag("output_name", shlex.quote(name)),
    ]


def _continued(lines: list[str]) -> str:
    return " \\\n".join(lines) + "\n"


def stage_script(plan: Plan) -> str:
    """``stage.sh``: STAGE writes the traces, then ASTRA-sim runs them on the three files."""
    args = stage_args_for(plan)
    name = output_name(plan, args)
    workload = shlex.quote(name)
    head = f"""#!/bin/sh
# Plan {plan.label} of {plan.model.name} on {plan.system.name} ({args.npus} NPUs), written by
# `planner export --format astra-sim`: STAGE (symbolic_tensor_graph, branch recomp) writes one
# Chakra trace per NPU, then ASTRA-sim's analytical backend runs them. Set
#   STAGE      a checkout of symbolic_tensor_graph at branch recomp (required)
#   ASTRA_SIM  the {ASTRA_BINARY} binary (default: on PATH)
#   OUT        where the traces go (default: stage_out next to this file)
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${{OUT:-$HERE/stage_out}}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
ASTRA_SIM=${{ASTRA_SIM:-{ASTRA_BINARY}}}
: "${{STAGE:?set STAGE to a checkout of symbolic_tensor_graph, branch recomp}}"

# 1. STAGE main.py, unchanged, with ConvertChakra.with_comm_info on: system.json sets
#    track-local-mem, which needs each node's inputs and outputs. Without it this is
#    python3 main.py with the same flags.
cd "$STAGE"
"""
    stage = _continued([f"${{PYTHON:-python3}} -c {_WRAPPER}",
                        *(f"    {line}" for line in _stage_flags(args, name))])
    astra = _continued([
        '"$ASTRA_SIM"',
        f'    --workload-configuration="$OUT"/{workload}',
        f'    --comm-group-configuration="$OUT"/{COMM_GROUP_FILE}',
        '    --system-configuration="$HERE/system.json"',
        '    --network-configuration="$HERE/network.yml"',
        '    --remote-memory-configuration="$HERE/remote_memory.json"',
    ])
    return (head + stage + f"\n# 2. ASTRA-sim reads $OUT/{name}.<rank>.et for every rank.\n"
            + astra)


def _gbps(bytes_per_s: float) -> float | int:
    return short_float(bytes_per_s / GB, lambda x: x * GB, bytes_per_s)


def _strategy_caveats(plan: Plan) -> list[str]:
    """Settings of the strategy STAGE has no flag for."""
    s, t, other = plan.strategy, plan.training, plan.convention is not Convention.STAGE
    out = []
    per_replica = t.global_batch // s.dp
    micro = per_replica // s.micro_batch
    if s.micro_batch != 1 or (other and micro > 1):
        out.append(f"micro-batches: the plan runs {counted(micro, 'micro-batch', 'es')} of"
                   f" {counted(s.micro_batch, 'sequence')} per data-parallel replica; STAGE runs"
                   f" all {per_replica} at once.")
    if s.pp > 1 and (other or s.schedule is not Schedule.ONE_F_ONE_B or s.v != 1):
        v = f", v {s.v}" if s.v != 1 else ""
        out.append(f"pipeline schedule {s.schedule.value}{v}: STAGE has none; it puts the"
                   f" blocks on the {s.pp} stages round-robin and passes the whole batch"
                   " through them in turn.")
    if s.zero in (ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS):
        out.append(f"ZeRO-{int(s.zero)}: STAGE shards only the weights themselves (FSDP,"
                   " --weight_sharded 1) and has no optimizer state; written as"
                   " --weight_sharded 0.")
    if s.recompute is Recompute.SELECTIVE:
        out.append("selective recompute: STAGE's --activation_recompute always recomputes q,"
                   " k, v, qk and the FFN hidden activation; written as"
                   " --activation_recompute 1.")
    if s.placement != STAGE_RANK_ORDER and (other or s.placement != DEFAULT_PLACEMENT):
        out.append(f"placement {','.join(a.value for a in s.placement)}: STAGE numbers the"
                   " ranks dp fastest, then tp, sp, pp (placement dp,tp,sp,pp).")
    return out


def _model_caveats(plan: Plan) -> list[str]:
    """What a megatron-convention plan's model has that STAGE's graph does not."""
    m, s = plan.model, plan.strategy
    out = [f"convention {plan.convention.value}: the plan was estimated with another graph;"
           " STAGE builds its own (attention without output projection or softmax, an FFN of"
           " two matmuls, one-hot embeddings, a plain SGD update, one byte per element), so"
           " ASTRA-sim will not reproduce the plan's estimate."]
    if m.n_kv_heads != m.heads:
        out.append(f"grouped-query attention ({m.n_kv_heads} key/value heads): STAGE gives"
                   f" every one of the {m.heads} heads its own keys and values.")
    if m.activation is not Activation.NONE:
        out.append(f"FFN activation {m.activation.value}: STAGE's FFN is w1 then w2, with no"
                   " activation op.")
    if m.tied_embeddings:
        out.append("tied embeddings: STAGE's input and output embeddings are separate.")
    if s.sequence_parallel and s.tp > 1:
        out.append("Megatron sequence parallelism inside the tp group: STAGE has none (its --sp"
                   " splits the sequence over ranks of their own).")
    d = plan.system.device
    if d.matmul_efficiency != 1 or d.memory_efficiency != 1:
        out.append(f"device efficiencies (matmul {d.matmul_efficiency:g}, memory"
                   f" {d.memory_efficiency:g}): ASTRA-sim's roofline runs at peak-perf and"
                   " local-mem-bw.")
    if d.kernel_launch_s or d.collective_launch_s or d.sm_count:
        out.append("per-kernel and per-collective fixed costs (launch floor, wave quantisation,"
                   " collective launch): ASTRA-sim's roofline and network have none.")
    if d.overlap_slowdown:
        out.append(f"compute slowed by {d.overlap_slowdown:g} while a collective runs beside it"
                   " (overlap_slowdown): ASTRA-sim overlaps them for free.")
    if any(dim.call_latency_s for dim in plan.system.network.dims):
        out.append("per-call collective latency (call_latency_us): ASTRA-sim's network.yml has"
                   " only per-hop latency; it is not written.")
    if any(dim.p2p_bandwidth_bytes_per_s is not None for dim in plan.system.network.dims):
        out.append("a send rate of its own on a link (p2p_bandwidth_gbps): ASTRA-sim's"
                   " network.yml has one bandwidth per dimension, the collectives' one; it is"
                   " not written.")
    if any(dim.nvls is not None for dim in plan.system.network.dims):
        out.append("an all-reduce the switch reduces (nvls: NVLink SHARP): ASTRA-sim's"
                   " network.yml has no in-switch reduction; the ring at the link's bandwidth"
                   " is written.")
    if any(dim.links is not None for dim in plan.system.network.dims):
        out.append("GPUs joined link by link with no switch (links, group_links): a group's"
                   " share of the links is not written; ASTRA-sim's Switch dimension gives every"
                   " group the link's bandwidth.")
    if any(dim.per_communicator for dim in plan.system.network.dims):
        out.append("a link bound per communicator (per_communicator): ASTRA-sim's links carry"
                   " every group at one bandwidth; the link's own is written.")
    if d.host_kernel_s and not plan.training.cuda_graphs and not plan.training.launch_blocking:
        out.append("the host's time per kernel (host_kernel_us): where a layer waits for the"
                   " host to issue its kernels, its compute nodes carry the wait; ASTRA-sim's"
                   " compute nodes have no host.")
    if plan.training.launch_blocking:
        out.append("launch blocking's host time per kernel (launch_blocking): ASTRA-sim's"
                   " compute nodes have no host; it is not written.")
    if plan.training.fsdp_no_sync and plan.strategy.zero is ZeroStage.PARAMETERS:
        out.append("FSDP's no_sync accumulation (fsdp_no_sync): the graph reduce-scatters each"
                   " micro-batch's gradients, as FSDP does without it.")
    return out


def caveats(plan: Plan) -> list[str]:
    """What STAGE (or ASTRA-sim's system file) cannot express of this plan; empty if nothing."""
    out = _model_caveats(plan) if plan.convention is not Convention.STAGE else []
    out += _strategy_caveats(plan)
    device, scheduling = plan.system.device, plan.system.network.scheduling
    if scheduling.local_reduction_bandwidth_bytes_per_s != device.hbm_bandwidth_bytes_per_s:
        out.append(
            "local-mem-bw: ASTRA-sim has one figure for the roofline and for reducing received"
            f" data; written is the device's {_gbps(device.hbm_bandwidth_bytes_per_s)} GB/s, not"
            " the system's local reduction bandwidth of"
            f" {_gbps(scheduling.local_reduction_bandwidth_bytes_per_s)} GB/s.")
    return out


def _paragraph(text: str, first: str = "", rest: str = "") -> list[str]:
    return textwrap.wrap(text, width=100, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False)


def readme(plan: Plan) -> str:
    """``README-astra-sim.txt``: the files, how to run them, the units and the caveats."""
    t, system = plan.training, plan.system
    shape = " x ".join(f"{d.topology.value}({d.npus})" for d in system.network.dims)
    lines = [
        *_paragraph(f"ASTRA-sim inputs for plan {plan.label}: {plan.model.name} on {system.name}"
                    f" ({system.devices} NPUs), global batch {t.global_batch}, sequence"
                    f" {t.seq_len}, {plan.convention.value} convention."),
        "",
        "  stage.sh            STAGE (branch recomp) writes the traces, then ASTRA-sim runs them",
        "  system.json         ASTRA-sim system: scheduling, algorithms per dimension, roofline",
        f"  network.yml         analytical network: {shape}",
        "  remote_memory.json  no remote memory (NO_MEMORY_EXPANSION)",
        "",
        "Run: STAGE=/path/to/symbolic_tensor_graph sh stage.sh",
        f"     (and ASTRA_SIM=/path/to/{ASTRA_BINARY} if it is not on PATH)",
        "",
        *_paragraph(
            "Units: link bandwidth in ASTRA-sim's GB/s (2^30 bytes/s), latency and endpoint-delay"
            " in ns, local-mem-bw in decimal GB/s, peak-perf in decimal TFLOP/s (STAGE counts"
            " one multiply-accumulate as one op). STAGE counts one element as one byte and"
            " ASTRA-sim has no memory capacity: compare the peak memory it reports with the"
            f" device's {_gbps(system.device.hbm_bytes)} GB yourself."),
        "",
    ]
    notes = caveats(plan)
    if not notes:
        lines += _paragraph("STAGE builds the graph the stage convention estimated: nothing of"
                            " this plan is left out.")
    else:
        lines.append("What STAGE cannot express for this plan:")
        for note in notes:
            lines += _paragraph(note, "- ", "  ")
    return "\n".join(lines) + "\n"


def export_astra(plan: Plan) -> dict[str, str]:
    """The five files of the ASTRA-sim + STAGE export (see the module docstring)."""
    return {
        "stage.sh": stage_script(plan),
        "system.json": system_json_text(plan.system),
        "network.yml": network_yml_text(plan.system),
        "remote_memory.json": remote_memory_json_text(),
        "README-astra-sim.txt": readme(plan),
    }
