"""``planner convert-text FILE --num-npus N --out PREFIX``: an ASTRA-sim 1.0 text workload as
Chakra traces (PREFIX.<npu>.et), as Chakra's text converter writes them."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from tqdm.auto import tqdm

from planner.chakra.io import trace_bytes
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
        data = trace_bytes(nodes, {"input_file": args.workload.name})  # every NPU's is the same
        try:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            _check_room(args, len(data))
            _write_all(args.out, data, args.num_npus)
        except OSError as e:
            raise PlannerUsageError(f"--out {args.out}: cannot write ({e.strerror or e})") from None
        print(f"wrote {args.out}.0.et ... {args.out}.{args.num_npus - 1}.et ({len(nodes)} nodes"
              " each)")
        return 0


def _check_room(args: argparse.Namespace, trace_size: int) -> None:
    """Refuse, before writing, traces that would not fit on ``--out``'s disk."""
    need, free = trace_size * args.num_npus, shutil.disk_usage(args.out.parent).free
    if need > free:
        raise PlannerUsageError(f"--num-npus {args.num_npus:,}: {args.num_npus:,} traces of"
                                f" {trace_size:,} bytes need {need / 1e9:,.1f} GB, and --out's"
                                f" disk has {free / 1e9:,.1f} GB free; use fewer NPUs or another"
                                " --out")


def _write_all(out: Path, data: bytes, npus: int) -> None:
    """``out.<npu>.et`` for each NPU; on an error or Ctrl-C, none of them is left behind (a
    partial set would replay as a smaller cluster)."""
    paths = [out.parent / f"{out.name}.{npu}.et" for npu in range(npus)]
    written: list[Path] = []
    try:
        for path in tqdm(paths, desc="writing traces", unit="trace", disable=npus < 1000,
                         leave=False):
            written.append(path)
            path.write_bytes(data)
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise
