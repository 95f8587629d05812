"""``planner convert-text FILE --num-npus N --out PREFIX``: an ASTRA-sim 1.0 text workload as
Chakra traces (PREFIX.<npu>.et), as Chakra's text converter writes them."""

from __future__ import annotations

import argparse
from pathlib import Path

from planner.chakra.io import write_trace
from planner.chakra.text import read_text_workload, text_nodes
from planner.commands._base import BaseCommand
from planner.commands._replay import add_text_arguments
from planner.errors import PlannerUsageError


class ConvertTextCommand(BaseCommand):
    name = "convert-text"
    help = "Convert an ASTRA-sim 1.0 text workload to Chakra traces, one per NPU."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("workload", type=Path, metavar="FILE", help="the text workload")
        parser.add_argument("--num-npus", type=int, required=True, metavar="N",
                            help="NPUs (one trace each)")
        parser.add_argument("--out", type=Path, required=True, metavar="PREFIX",
                            help="write PREFIX.0.et ... PREFIX.<N-1>.et")
        add_text_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        if args.num_npus < 1 or args.passes < 1:
            raise PlannerUsageError("--num-npus and --passes must be >= 1")
        nodes = text_nodes(read_text_workload(args.workload), args.passes, args.hoti2024)
        try:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            for npu in range(args.num_npus):
                write_trace(args.out.parent / f"{args.out.name}.{npu}.et", nodes,
                            {"input_file": args.workload.name})
        except OSError as e:
            raise PlannerUsageError(f"--out {args.out}: cannot write ({e.strerror or e})") from None
        print(f"wrote {args.out}.0.et ... {args.out}.{args.num_npus - 1}.et ({len(nodes)} nodes"
              " each)")
        return 0
