"""``planner import-metis``: Metis's hostfile, cluster file and profiles into the user's catalog.

    planner import-metis hostfile clusterfile.json profile_data/ --name my-cluster [--force]

Writes ``<user catalog>/systems/NAME.yaml`` (a system of node groups, one per run of nodes of one
type in the hostfile) and ``<user catalog>/profiles/NAME.yaml`` (per catalog device, per tp and
micro-batch, the profiled milliseconds of a layer, the embedding and the head). A study of
``planner mixed`` names them as ``system: NAME`` and ``profile: NAME``; the formats and units
are in :mod:`planner.metis_io`. Both files are written through a temporary name and checked by
reading them back first, so a failure installs nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from planner.catalog import load_catalog, user_catalog_dir
from planner.catalog_mixed import mixed_system_from_entry
from planner.catalog_write import check_clash, check_entry_name, check_writable, write_entry
from planner.commands._base import BaseCommand
from planner.errors import PlannerUsageError
from planner.metis_io import (
    MetisCluster,
    mixed_entry,
    profile_path,
    profiles_entry,
    profiles_from_entry,
)
from simcore.mixed import MixedSystemSpec

__all__ = ["ImportMetisCommand", "import_metis"]


def _text(header: list[str], name: str, entry: dict[str, Any]) -> str:
    return "".join(f"# {h}\n" for h in header) + yaml.safe_dump({name: entry}, sort_keys=False,
                                                                 width=100)


def import_metis(hostfile: Path, clusterfile: Path, profiles: Path, name: str, *,
                 force: bool = False) -> tuple[Path, Path, MixedSystemSpec, int]:
    """Write the system and the profiles; return both files, the system and the profiled
    transformer layers."""
    check_entry_name(name)
    system_file = user_catalog_dir() / "systems" / f"{name}.yaml"
    profile_file = profile_path(name)
    check_clash(name, system_file)
    for target in (system_file, profile_file):
        if target.exists() and not force:
            raise PlannerUsageError(f"{target}: already exists; pass --force to replace it")
    sources = f"{hostfile.resolve()}, {clusterfile.resolve()}"
    cluster = MetisCluster.read(hostfile, clusterfile)
    system = mixed_entry(cluster)
    system["source"] = f"planner import-metis of {sources}"
    profile = profiles_entry(profiles, cluster)
    profile["source"] = f"planner import-metis of {profiles.resolve()}"
    header = [f"{name}: imported by `planner import-metis` (units: planner/metis_io.py)",
              "Metis bandwidths are 2^20 bytes per ms: x 1.048576 = decimal GB/s; latencies"
              " are DGX A100 / InfiniBand figures (systems/dgx.yaml), Metis has none."]
    system_text = _text(header, name, system)
    profile_text = _text([f"{name}: per device, per tp<T>_bs<B>: milliseconds of one"
                          " micro-batch, forward + backward, from Metis profiles"], name, profile)
    devices = load_catalog(user=False).devices
    spec = mixed_system_from_entry(system_file, name, yaml.safe_load(system_text)[name], devices)
    profiles_from_entry(profile_file, name, yaml.safe_load(profile_text)[name])
    for target in (system_file, profile_file):  # both writable before either is written
        check_writable(target)
    write_entry(system_file, system_text)
    write_entry(profile_file, profile_text)
    return system_file, profile_file, spec, profile["layers"]


class ImportMetisCommand(BaseCommand):
    name = "import-metis"
    help = ("Import Metis's hostfile, cluster file and profiles into your catalog: a mixed"
            " system and its layer profiles, for planner mixed.")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("hostfile", type=Path, metavar="HOSTFILE",
                            help="one `ADDRESS slots=N` line per node")
        parser.add_argument("clusterfile", type=Path, metavar="CLUSTERFILE",
                            help="Metis's clusterfile.json: per address its instance_type,"
                            " memory and bandwidths")
        parser.add_argument("profiles", type=Path, metavar="PROFILE_DIR",
                            help="a folder of DeviceType.<TYPE>_tp<T>_bs<B>.json profiles")
        parser.add_argument("--name", required=True, help="the system's (and profile's) name")
        parser.add_argument("--force", action="store_true",
                            help="replace a system or profile of the same name in your catalog")

    def run(self, args: argparse.Namespace) -> int:
        system_file, profile_file, spec, layers = import_metis(
            args.hostfile, args.clusterfile, args.profiles, args.name, force=args.force)
        groups = " + ".join(f"{g.devices} {g.device.name}" for g in spec.groups)
        print(f"wrote system {spec.name} ({groups}) to {system_file}")
        print(f"wrote its profiles ({layers} transformer layers) to {profile_file}")
        print("plan on it with `planner mixed STUDY.yaml`, the study naming:")
        print(f"  model: <a catalog model of {layers} transformer layers>")
        print(f"  system: {spec.name}\n  profile: {spec.name}")
        return 0
