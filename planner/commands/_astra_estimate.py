"""``planner astra-estimate``: what STAGE recomp + ASTRA-sim would report, without running them.

    planner astra-estimate --system-json S --network-yml N -- --dp 4 --tp 2 ... (STAGE's flags)

The STAGE flags are ``main.py``'s own (branch recomp), so a lab script can pass its whole STAGE
command line; ``--output_dir``, ``--output_name`` and ``--comm_group_file`` are accepted and
ignored.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

from planner.astra_io import load_astra_system
from planner.commands._base import BaseCommand
from planner.errors import PlannerUsageError
from simcore.stage import StageArgs, astra_estimate, build_model

_INT_FLAGS = ("dp", "tp", "pp", "sp", "din", "dout", "dmodel", "dff", "head", "seq", "batch",
              "num_stacks")
_BOOL_FLAGS = ("weight_sharded", "activation_recompute")
_IGNORED_FLAGS = ("output_dir", "output_name", "comm_group_file", "chakra_schema_version")
_TRUE = ("true", "t", "1", "yes", "y")  # STAGE main.py str_to_bool, lowercased (main.py line 16)
_FALSE = ("false", "f", "0", "no", "n")  # STAGE reads any other text as False too: refused here
_ALL_FLAGS = (*_INT_FLAGS, *_BOOL_FLAGS, *_IGNORED_FLAGS)


def _flag_name(name: str) -> str:
    """A flag's full name; like main.py's argparse, a unique prefix (``--num 4``) names it."""
    if name in _ALL_FLAGS:
        return name
    matches = [f for f in _ALL_FLAGS if name and f.startswith(name)]
    if len(matches) == 1:
        return matches[0]
    known = ", ".join(f"--{f}" for f in _ALL_FLAGS)
    if matches:
        raise PlannerUsageError(f"--{name}: ambiguous, could be " + ", ".join(
            f"--{f}" for f in matches))
    raise PlannerUsageError(f"--{name}: not a STAGE main.py flag; known: {known}")


def parse_stage_args(tokens: Sequence[str]) -> StageArgs:
    """STAGE ``main.py`` flags (``--flag value`` or ``--flag=value``) -> :class:`StageArgs`;
    unset flags take main.py's defaults. Sizes that a degree does not divide are accepted as
    STAGE accepts them (:mod:`simcore.stage._counts`)."""
    values: dict[str, object] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--") or token == "--":
            raise PlannerUsageError(
                f"STAGE arguments: expected a flag, but got {token!r}; write e.g. --dp 4")
        name, eq, value = token[2:].partition("=")
        if not eq:
            if i + 1 >= len(tokens):
                raise PlannerUsageError(f"--{name}: missing its value")
            value = tokens[i + 1]
            i += 1
        i += 1
        name = _flag_name(name)
        if name in _IGNORED_FLAGS:
            continue
        if name in _BOOL_FLAGS:
            if value.lower() not in (*_TRUE, *_FALSE):
                raise PlannerUsageError(f"--{name}: {value!r} is not a boolean; use 0/1 or"
                                        " True/False (STAGE would read it as False)")
            values[name] = value.lower() in _TRUE
        elif name in _INT_FLAGS:
            try:
                number = int(value)
            except ValueError:
                raise PlannerUsageError(f"--{name}: {value!r} is not a whole number; give a"
                                        " positive integer") from None
            if number < 1:
                raise PlannerUsageError(f"--{name}: must be >= 1, but got {number}")
            values[name] = number
    try:
        return StageArgs(**values)  # type: ignore[arg-type]
    except ValueError as e:
        raise PlannerUsageError(f"STAGE arguments: {e}") from None


class AstraEstimateCommand(BaseCommand):
    name = "astra-estimate"
    help = ("Report what STAGE (recomp) + ASTRA-sim (analytical) would for a STAGE command"
            " line, from ASTRA-sim's own input files.")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--system-json", type=Path, required=True,
                            help="ASTRA-sim system configuration (JSON, with peak-perf and"
                            " roofline-enabled: 1)")
        parser.add_argument("--network-yml", type=Path, required=True,
                            help="ASTRA-sim analytical network configuration (YAML)")
        parser.add_argument("--et-out", type=Path, metavar="DIR",
                            help="also write the traces as Chakra files, DIR/workload.<npu>.et"
                            " and DIR/comm_group.json, for ASTRA-sim or planner replay")
        parser.add_argument("stage_args", nargs="*", metavar="-- STAGE_FLAGS",
                            help="STAGE main.py flags after --: " + " ".join(
                                f"--{f.name}" for f in fields(StageArgs)))

    def run(self, args: argparse.Namespace) -> int:
        stage = parse_stage_args(args.stage_args)
        system = load_astra_system(args.system_json, args.network_yml)
        if system.peak_flops_per_s is None or not system.roofline_enabled:
            raise PlannerUsageError(
                f"{args.system_json}: peak-perf / roofline-enabled: STAGE traces are timed by"
                " ASTRA-sim's roofline; give peak-perf and set roofline-enabled to 1")
        npus = system.network.npus
        if stage.npus != npus:
            raise PlannerUsageError(
                f"--dp * --tp * --sp * --pp must equal the {npus} NPUs of {args.network_yml},"
                f" but got {stage.dp} * {stage.tp} * {stage.sp} * {stage.pp} = {stage.npus}")
        try:
            result = astra_estimate(
                stage, system.network, peak_ops_per_s=system.peak_flops_per_s,
                local_mem_bytes_per_s=system.local_mem_bandwidth_bytes_per_s,
            )
        except ValueError as e:
            raise PlannerUsageError(f"STAGE arguments: {e}") from None
        print(json.dumps(result.to_dict(), indent=2))
        if args.et_out is not None:
            written = _write_traces(stage, args.et_out)
            print(f"wrote {len(written) - 1} Chakra traces and comm_group.json to {args.et_out};"
                  f" replay: planner replay {args.et_out / ET_NAME} --system-json"
                  f" {args.system_json} --network-yml {args.network_yml}", file=sys.stderr)
        return 0


ET_NAME = "workload"


def _write_traces(stage: StageArgs, folder: Path) -> list[Path]:
    from planner.chakra.stage_et import write_stage_traces

    try:
        return write_stage_traces(build_model(stage), folder, ET_NAME)
    except OSError as e:
        raise PlannerUsageError(f"--et-out {folder}: cannot write ({e.strerror or e})") from None
