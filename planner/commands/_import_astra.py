"""``planner import-astra``: an ASTRA-sim system (system JSON + network YAML) into the user's
catalog, as a system that studies, ``planner estimate --system`` and exports can name.

    planner import-astra system.json network.yml --name my-system [--hbm-gb 80] [--force]

The system is written to ``<user catalog>/systems/NAME.yaml`` (:func:`planner.catalog.
user_catalog_dir`) with its NPU inline: ``peak-perf`` becomes ``peak_tflops``, ``local-mem-bw``
``hbm_bandwidth_gbps`` (and the local reduction bandwidth), ``--hbm-gb`` the HBM capacity, which
ASTRA-sim has no key for. The file is written to a temporary name, read back and checked, then
renamed over the target, so a failure leaves nothing half-written. ``planner export --format
astra-sim`` of a plan on the imported system gives back the two files.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from planner.astra_io import WRITTEN_SWITCHES, AstraSystem, load_astra_system
from planner.catalog import system_from_entry, user_catalog_dir
from planner.catalog_write import check_clash, check_entry_name, system_entry, write_entry
from planner.commands._base import BaseCommand, hbm_gb
from planner.errors import PlannerUsageError
from planner.inputs import load
from planner.units import GB
from simcore.specs import DeviceSpec, SystemSpec

__all__ = ["ImportAstraCommand", "astra_system_spec", "import_astra"]

DEFAULT_HBM_GB = 80.0
"""The lab gives no HBM capacity; 80 GB is the limit of its question (design.md)."""


def astra_system_spec(astra: AstraSystem, system_json: Path, name: str,
                      hbm_gb: float) -> SystemSpec:
    """The catalog system the two files describe; its NPU is named ``NAME.device``, as the
    catalog names an inline device."""
    if astra.peak_flops_per_s is None:
        raise PlannerUsageError(
            f"{system_json}: peak-perf: missing; the import needs the NPU's peak (decimal"
            ' TFLOP/s, e.g. "peak-perf": 900)')
    device = DeviceSpec(name=f"{name}.device", peak_flops_per_s=astra.peak_flops_per_s,
                        hbm_bytes=hbm_gb * GB,
                        hbm_bandwidth_bytes_per_s=astra.local_mem_bandwidth_bytes_per_s)
    return SystemSpec(name=name, device=device, network=astra.network)


def _entry_text(system: SystemSpec, system_json: Path, network_yml: Path) -> str:
    entry: dict[str, Any] = system_entry(system)
    entry["source"] = f"ASTRA-sim files {system_json.name} + {network_yml.name}"
    header = (f"# {system.name}: imported by `planner import-astra` from\n#   {system_json}\n"
              f"#   {network_yml}\n# ASTRA-sim's peak-perf = peak_tflops; local-mem-bw ="
              " hbm_bandwidth_gbps = local_reduction_bandwidth_gbps;\n# link GB/s ="
              " bandwidth_astra_gbps (2^30 bytes/s); latency ns = latency_us * 1000.\n")
    return header + yaml.safe_dump({system.name: entry}, sort_keys=False, width=100)


def _read_back(path: Path, name: str, text: str, expected: SystemSpec) -> None:
    """What was written reads back to the same system (else a bug: nothing is installed)."""
    found = system_from_entry(path, name, yaml.safe_load(text)[name], {})
    if (found.network, found.device.peak_flops_per_s, found.device.hbm_bytes,
            found.device.hbm_bandwidth_bytes_per_s) != (
            expected.network, expected.device.peak_flops_per_s, expected.device.hbm_bytes,
            expected.device.hbm_bandwidth_bytes_per_s):
        raise RuntimeError(f"{path}: the written entry does not read back to the same system")


def _not_kept(system_json: Path) -> list[str]:
    """Keys of the system JSON the catalog does not keep, set otherwise than exports write them
    (:data:`WRITTEN_SWITCHES`, the lab's values), or absent where exports write one."""
    data = load(system_json, "system JSON")
    kept = {"scheduling-policy", "endpoint-delay", "active-chunks-per-dimension",
            "preferred-dataset-splits", "all-reduce-implementation", "all-gather-implementation",
            "reduce-scatter-implementation", "all-to-all-implementation",
            "collective-optimization", "local-mem-bw", "peak-perf"}
    out = [f"{k}: {json.dumps(v)}" for k, v in data.items()
           if k not in kept and WRITTEN_SWITCHES.get(k) != v]
    return out + [f"{k} absent" for k in WRITTEN_SWITCHES if k not in data]


def import_astra(system_json: Path, network_yml: Path, name: str, *,
                 hbm_gb: float = DEFAULT_HBM_GB, force: bool = False) -> tuple[Path, SystemSpec]:
    """Write the system into the user's catalog; return the file and the system."""
    check_entry_name(name)
    if not hbm_gb > 0:
        raise PlannerUsageError(f"--hbm-gb: must be > 0, but got {hbm_gb:g}")
    astra = load_astra_system(system_json, network_yml)
    system = astra_system_spec(astra, system_json, name, hbm_gb)
    target = user_catalog_dir() / "systems" / f"{name}.yaml"
    check_clash(name, target)
    if target.exists() and not force:
        raise PlannerUsageError(f"{target}: already exists; pass --force to replace it")
    text = _entry_text(system, system_json.resolve(), network_yml.resolve())
    _read_back(target, name, text, system)
    write_entry(target, text)
    return target, system


class ImportAstraCommand(BaseCommand):
    name = "import-astra"
    help = ("Import an ASTRA-sim system (system JSON + network YAML) into your catalog, as a"
            " system --system can name.")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("system_json", type=Path, metavar="SYSTEM_JSON",
                            help="ASTRA-sim system configuration (needs peak-perf)")
        parser.add_argument("network_yml", type=Path, metavar="NETWORK_YML",
                            help="ASTRA-sim analytical network configuration")
        parser.add_argument("--name", required=True, help="the system's catalog name")
        parser.add_argument("--hbm-gb", type=hbm_gb, default=DEFAULT_HBM_GB,
                            help="HBM per NPU in decimal GB, which ASTRA-sim has no key for"
                            f" (default {DEFAULT_HBM_GB:g})")
        parser.add_argument("--force", action="store_true",
                            help="replace a system of the same name in your catalog")

    def run(self, args: argparse.Namespace) -> int:
        target, system = import_astra(args.system_json, args.network_yml, args.name,
                                      hbm_gb=args.hbm_gb, force=args.force)
        dims = " x ".join(f"{d.topology.value} {d.npus}" for d in system.network.dims)
        device = system.device
        print(f"wrote system {system.name} ({system.devices} NPUs: {dims};"
              f" {device.peak_flops_per_s / 1e12:g} TFLOP/s, {device.hbm_bytes / GB:g} GB HBM)"
              f" to {target}; name it with --system {system.name}")
        dropped = _not_kept(args.system_json)
        if dropped:
            print(f"note: {args.system_json}: not kept (exports write"
                  f" {json.dumps(WRITTEN_SWITCHES)[1:-1]}): {'; '.join(dropped)}")
        return 0
