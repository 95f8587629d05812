"""``planner replay PREFIX``: simulate Chakra execution traces as ASTRA-sim's analytical backend
does, from ASTRA-sim's own input files.

    planner replay traces/workload --system-json S --network-yml N [--comm-group F] [--json]

Prints what ASTRA-sim prints per NPU (``sys[i] finished, N cycles``) and sys[0]'s wall, GPU,
communication and exposed time, peak memory and, with the roofline on, the lab's metrics.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from planner.astra_io import load_astra_system
from planner.chakra.graphs import read_comm_groups, trace_graphs
from planner.chakra.io import SCHEMA_VERSION, Trace, read_trace, trace_files
from planner.chakra.schema import message_class
from planner.chakra.text import read_text_workload, text_nodes
from planner.commands._base import BaseCommand
from planner.errors import PlannerUsageError
from simcore.stage import TraceTimes, replay_traces

__all__ = ["ReplayCommand", "replay_report"]


def _npu(i: int, t: TraceTimes) -> dict[str, Any]:
    r = t.times
    out: dict[str, Any] = {
        "sys": i, "finished_cycles": r.wall_time, "wall_time": r.wall_time,
        "gpu_time": r.gpu_time, "comm_time": r.comm_time, "exposed_comm": r.exposed_comm,
        "peak_memory_usage": r.peak_memory_usage,
    }
    if t.roofline is not None:
        out.update(t.roofline.metrics())
    return out


def _text_traces(path: Path, npus: int, passes: int, hoti2024: bool
                 ) -> tuple[list[Path], list[Trace]]:
    """A text workload converted in memory: every NPU the same trace."""
    nodes = text_nodes(read_text_workload(path), passes, hoti2024)
    trace = Trace(message_class("GlobalMetadata")(version=SCHEMA_VERSION), nodes)
    return [path] * npus, [trace] * npus


def replay_report(prefix: Path, system_json: Path, network_yml: Path,
                  comm_group: Path | None, passes: int = 1,
                  hoti2024: bool = False) -> list[dict[str, Any]]:
    """Every NPU's figures, sys[0] first. ``prefix`` may also be a text workload (.txt),
    converted as :mod:`planner.chakra.text` does."""
    system = load_astra_system(system_json, network_yml)
    npus = system.network.npus
    if prefix.suffix == ".txt" and prefix.is_file():
        paths, traces = _text_traces(prefix, npus, passes, hoti2024)
    else:
        if passes != 1 or hoti2024:  # options of a text workload's conversion
            flag = "--hoti2024" if hoti2024 else f"--passes {passes}"
            raise PlannerUsageError(f"{flag}: converts a text workload (.txt); {prefix} names"
                                    " Chakra traces, which run as written; drop it")
        paths = trace_files(prefix)
        if len(paths) != npus:
            raise PlannerUsageError(f"{prefix}: {len(paths)} trace files, but {network_yml} has"
                                    f" {npus} NPUs; give one trace per NPU")
        traces = [read_trace(p) for p in paths]
    if comm_group is None and (prefix.parent / "comm_group.json").is_file():
        comm_group = prefix.parent / "comm_group.json"
    graphs = trace_graphs(paths, traces, read_comm_groups(comm_group))
    peak = system.peak_flops_per_s if system.roofline_enabled else None
    if system.roofline_enabled and peak is None:
        raise PlannerUsageError(f"{system_json}: roofline-enabled is 1 but peak-perf is"
                                " missing; give peak-perf (TFLOP/s)")
    try:
        times = replay_traces(graphs, system.network, peak_ops_per_s=peak,
                              local_mem_bytes_per_s=system.local_mem_bandwidth_bytes_per_s)
    except ValueError as e:
        raise PlannerUsageError(f"{prefix}: {e}") from None
    return [_npu(i, t) for i, t in enumerate(times)]


def report_text(npus: list[dict[str, Any]]) -> list[str]:
    lines = [f"sys[{r['sys']}] finished, {r['finished_cycles']} cycles" for r in npus]
    first = npus[0]
    lines.append(f"sys[0]: wall {first['wall_time']:,} ns, GPU {first['gpu_time']:,} ns, comm"
                 f" {first['comm_time']:,} ns, exposed {first['exposed_comm']:,} ns, peak"
                 f" memory {first['peak_memory_usage']:,} (trace units)")
    if "compute_bound_pct" in first:
        lines.append(f"sys[0]: compute bound {first['compute_bound_pct']:.3f}%, compute"
                     f" utilisation {first['avg_compute_util_pct']:.3f}%, memory utilisation"
                     f" {first['avg_mem_util_pct']:.3f}%, operation intensity"
                     f" {first['avg_op_intensity']:.3f}")
    return lines


def add_text_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a text workload's conversion."""
    parser.add_argument("--passes", type=int, default=1, metavar="N",
                        help="text workloads: training passes (default 1)")
    parser.add_argument("--hoti2024", action="store_true",
                        help="text workloads: convert as the HOTI 2024 tutorial's Chakra did (no"
                        " comm_size: collectives take no time, as in its demo 2)")


class ReplayCommand(BaseCommand):
    name = "replay"
    help = ("Simulate Chakra execution traces (PREFIX.<npu>.et) as ASTRA-sim's analytical"
            " backend does, from its own input files.")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("prefix", type=Path, metavar="PREFIX",
                            help="the traces' prefix, as ASTRA-sim's --workload-configuration"
                            " (reads PREFIX.0.et, PREFIX.1.et, ...), or an ASTRA-sim 1.0 text"
                            " workload (.txt)")
        parser.add_argument("--system-json", type=Path, required=True,
                            help="ASTRA-sim system configuration (JSON)")
        parser.add_argument("--network-yml", type=Path, required=True,
                            help="ASTRA-sim analytical network configuration (YAML)")
        parser.add_argument("--comm-group", type=Path, metavar="FILE",
                            help="ASTRA-sim's --comm-group-configuration JSON (default: the"
                            " traces' comm_group.json when there is one)")
        parser.add_argument("--json", action="store_true",
                            help="print one JSON object per NPU in a list")
        add_text_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        if args.passes < 1:
            raise PlannerUsageError(f"--passes must be >= 1, not {args.passes}")
        npus = replay_report(args.prefix, args.system_json, args.network_yml, args.comm_group,
                             args.passes, args.hoti2024)
        print(json.dumps(npus, indent=2) if args.json else "\n".join(report_text(npus)))
        return 0
