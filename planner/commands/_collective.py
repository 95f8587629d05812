from __future__ import annotations

import argparse
import json
from pathlib import Path

from planner.astra_io import load_astra_system
from planner.commands._base import BaseCommand
from planner.errors import PlannerUsageError
from planner.units import parse_size, s_to_ns
from simcore.collectives import Congestion, collective_time
from simcore.network import Collective


def _parse_group(text: str) -> tuple[int, ...]:
    try:
        ranks = tuple(int(r) for r in text.split(","))
    except ValueError:
        raise PlannerUsageError(
            f"--group: {text!r} is not a comma-separated list of ranks; write e.g. 0,2,4,6"
        ) from None
    return ranks


class CollectiveCommand(BaseCommand):
    name = "collective"
    help = "Time one collective as ASTRA-sim's analytical backend would, from its own input files."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("collective", choices=[c.value for c in Collective],
                            help="the collective")
        parser.add_argument("size", help="bytes per NPU: an integer or e.g. 64KiB, 1MiB, 1GiB")
        parser.add_argument("--system-json", type=Path, required=True,
                            help="ASTRA-sim system configuration (JSON)")
        parser.add_argument("--network-yml", type=Path, required=True,
                            help="ASTRA-sim analytical network configuration (YAML)")
        parser.add_argument("--group", help="ranks of a sub-group, e.g. 0,2,4,6 (default: all)")
        parser.add_argument("--congestion", choices=[c.value for c in Congestion],
                            default=Congestion.UNAWARE.value,
                            help="network model: ASTRA-sim's congestion-unaware backend"
                            " (default) or its congestion-aware one (flows that share a link"
                            " queue on it; Mesh2D/Torus2D routed XY, several dimensions and"
                            " --group too)")
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def run(self, args: argparse.Namespace) -> int:
        try:
            size = parse_size(args.size)
        except ValueError as e:
            raise PlannerUsageError(f"size: {e}") from None
        system = load_astra_system(args.system_json, args.network_yml)
        group = _parse_group(args.group) if args.group else None
        try:
            timing = collective_time(
                system.network, Collective(args.collective), size, group=group,
                congestion=Congestion(args.congestion),
            )
        except ValueError as e:
            raise PlannerUsageError(f"--group: {e}" if group else str(e)) from None
        if args.json:
            print(json.dumps(timing.to_dict(), indent=2))
        else:
            print(f"{round(s_to_ns(timing.time_s))} ns")
        return 0
