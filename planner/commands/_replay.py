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
from planner.chakra.io import read_trace, trace_files
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


def replay_report(prefix: Path, system_json: Path, network_yml: Path,
                  comm_group: Path | None) -> list[dict[str, Any]]:
    """Every NPU's figures, sys[0] first."""
    system = load_astra_system(system_json, network_yml)
    paths = trace_files(prefix)
    if len(paths) != system.network.npus:
        raise PlannerUsageError(f"{prefix}: {len(paths)} trace files, but {network_yml} has"
                                f" {system.network.npus} NPUs; give one trace per NPU")
    if comm_group is None and (prefix.parent / "comm_group.json").is_file():
        comm_group = prefix.parent / "comm_group.json"
    graphs = trace_graphs(paths, [read_trace(p) for p in paths], read_comm_groups(comm_group))
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


class ReplayCommand(BaseCommand):
    name = "replay"
    help = ("Simulate Chakra execution traces (PREFIX.<npu>.et) as ASTRA-sim's analytical"
            " backend does, from its own input files.")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("prefix", type=Path, metavar="PREFIX",
                            help="the traces' prefix, as ASTRA-sim's --workload-configuration"
                            " (reads PREFIX.0.et, PREFIX.1.et, ...)")
        parser.add_argument("--system-json", type=Path, required=True,
                            help="ASTRA-sim system configuration (JSON)")
        parser.add_argument("--network-yml", type=Path, required=True,
                            help="ASTRA-sim analytical network configuration (YAML)")
        parser.add_argument("--comm-group", type=Path, metavar="FILE",
                            help="ASTRA-sim's --comm-group-configuration JSON (default: the"
                            " traces' comm_group.json when there is one)")
        parser.add_argument("--json", action="store_true",
                            help="print one JSON object per NPU in a list")

    def run(self, args: argparse.Namespace) -> int:
        npus = replay_report(args.prefix, args.system_json, args.network_yml, args.comm_group)
        print(json.dumps(npus, indent=2) if args.json else "\n".join(report_text(npus)))
        return 0
