"""Catalogs of models, devices and systems: YAML files that map names to specs.

``studies/catalog/{models,devices,systems}/*.yaml`` ship with the project. A user's own catalog
is a folder of the same shape, read after the shipped one (:func:`user_catalog_dir`:
``$PLANNER_CATALOG``, else ``$XDG_CONFIG_HOME/parallel-planner/catalog``, else
``~/.config/parallel-planner/catalog``; ``planner import-astra`` writes there); a name defined
twice is an error naming both files. A YAML file anywhere can also be named by its path. Each
file maps names to entries::

    llama3-70b:            # a model
      family: llama
      layers: 80
      ...
      source: "where the figures come from"

Units in the files are the ones people quote: TFLOP/s, decimal GB and GB/s, microseconds;
ASTRA-sim's network "GB/s" (2^30 bytes/s) is written ``bandwidth_astra_gbps``. They are converted
when an entry is read (:mod:`planner.catalog_entries`, :mod:`planner.units`) and nowhere else.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from planner.catalog_entries import (
    device_from_entry,
    model_from_entry,
    system_device,
    system_from_entry,
)
from planner.catalog_families import (
    ClusterFamily,
    family_from_entry,
    family_member,
    is_family_name,
)
from planner.errors import PlannerUsageError
from planner.fields import fail
from planner.inputs import load
from simcore.mixed import MixedSystemSpec
from simcore.specs import DeviceSpec, ModelSpec, SystemSpec

__all__ = ["CATALOG_DIR", "KINDS", "Catalog", "device_from_entry", "load_catalog",
           "model_from_entry", "system_device", "system_from_entry", "user_catalog_dir"]

CATALOG_DIR = Path(__file__).resolve().parent.parent / "studies" / "catalog"
KINDS = ("device", "model", "system")
"""Read in this order (systems name devices); ``<root>/<kind>s/*.yaml`` holds each kind."""

@dataclass(frozen=True)
class Catalog:
    """Every model, device and system found, by name, with the file each came from."""

    models: dict[str, ModelSpec] = field(default_factory=dict)
    devices: dict[str, DeviceSpec] = field(default_factory=dict)
    systems: dict[str, SystemSpec] = field(default_factory=dict)
    mixed: dict[str, MixedSystemSpec] = field(default_factory=dict)
    """Systems that mix device types (node ``groups``), by name."""
    sources: dict[tuple[str, str], Path] = field(default_factory=dict)
    entries: dict[tuple[str, str], dict] = field(default_factory=dict)
    """The raw YAML entry of each (kind, name), for listings and exports."""
    families: dict[str, ClusterFamily] = field(default_factory=dict)
    """Cluster families by their ``{gpus}`` name (:mod:`planner.catalog_families`)."""
    scaled: dict[str, SystemSpec] = field(default_factory=dict)
    """The family members named so far, by name (each built once)."""

    def model(self, ref: str, *, where: tuple[Path, str] | None = None) -> ModelSpec:
        return self._find("model", self.models, ref, where)

    def system(self, ref: str, *, where: tuple[Path, str] | None = None) -> SystemSpec:
        if ref in self.mixed:
            raise _mixed_here(ref, where)
        member = self._member(ref, where)
        if member is not None:
            return member
        found = self._find("system", self.systems, ref, where)
        if isinstance(found, MixedSystemSpec):
            raise _mixed_here(ref, where)
        return found

    def any_system(self, ref: str, *,
                   where: tuple[Path, str] | None = None) -> SystemSpec | MixedSystemSpec:
        """A system of one device type or one that mixes them."""
        if ref in self.mixed:
            return self.mixed[ref]
        return self._member(ref, where) or self._find("system", self.systems | self.mixed, ref,
                                                      where)

    def has_system(self, ref: str) -> bool:
        """Whether ``ref`` is a system's catalog name (an entry's or a family member's), as
        opposed to a path."""
        return (ref in self.systems or ref in self.mixed
                or any(f.gpus(ref) is not None for f in self.families.values()))

    def _member(self, ref: str, where: tuple[Path, str] | None) -> SystemSpec | None:
        """The system ``ref`` names as a member of a cluster family (``dgx-h100-6144``), or
        None when it names an entry of its own or no family."""
        if ref in self.systems:
            return None

        def refuse(message: str) -> PlannerUsageError:
            return fail(*where, message) if where is not None else PlannerUsageError(
                f"--system: {message}")

        return family_member(self.families, self.scaled, ref, self.devices, system_from_entry,
                             refuse)

    def device(self, ref: str, *, where: tuple[Path, str] | None = None) -> DeviceSpec:
        return self._find("device", self.devices, ref, where)

    def _find(self, kind: str, table: dict, ref: str, where: tuple[Path, str] | None) -> Any:
        """A catalog name, a YAML path (a file of one entry) or ``FILE.yaml#NAME`` (one entry of
        a file of several). ``where`` (a file and field naming ``ref``) resolves relative paths
        against that file's folder and names it in the error."""
        if ref in table:
            return table[ref]
        file, _, entry = ref.partition("#")
        path = Path(file)
        if path.suffix in (".yaml", ".yml"):
            if where is not None and not path.is_absolute():
                path = where[0].parent / path
            if where is not None and not path.exists():  # said beside the file naming it
                found = "" if str(path) == file else f" ({path})"
                raise fail(*where, f"{file}: no such file{found}; give a catalog name or the"
                           f" path of a {kind} YAML, relative to the file naming it")
            read = _read_kind(kind, path, self.devices)
            families = {n: f for n, f in read.items() if isinstance(f, ClusterFamily)}
            found = {n: spec for n, spec in read.items() if n not in families}
            names = ", ".join([*found, *families]) or "none"
            if entry:
                if entry in found:
                    return found[entry]
                member = family_member(families, {}, entry, self.devices, system_from_entry,
                                       lambda message: PlannerUsageError(f"{path}: {message}"))
                if member is None:
                    raise PlannerUsageError(f"{path}: no {kind} {entry!r}; it holds {names}")
                return member
            if len(found) != 1 or families:
                raise PlannerUsageError(f"{path}: holds {len(read)} {kind}s; name one as"
                                        f" {file}#NAME ({names}; a family's with the GPU count"
                                        " in place of {gpus}) or keep one per file")
            return next(iter(found.values()))
        families = self.families if kind == "system" else {}
        close = _close_names(ref, [*table, *families], families)
        if close:
            message = (f"unknown {kind} {ref!r}; did you mean {close}? (`planner catalog"
                       f" {kind}s` lists them all)")
            raise fail(*where, message) if where is not None else PlannerUsageError(
                f"--{kind}: {message}")
        known = ", ".join(sorted(table))
        if kind == "system" and self.families:
            known += (f"; or {', '.join(sorted(self.families))} with the GPU count in place of"
                      " {gpus}")
        if where is not None:
            raise fail(*where, f"unknown {kind} {ref!r}; use one of {known}, or the path of a"
                       f" YAML file (`planner catalog {kind}s` lists them)")
        raise PlannerUsageError(f"--{kind}: unknown {kind} {ref!r}; use a catalog name ({known})"
                                " or the path of a YAML file")


def _close_names(ref: str, names: list[str],
                 families: Mapping[str, ClusterFamily] | None = None) -> str:
    """The catalog names closest to a mistyped ``ref`` (up to three, best first), as one text;
    empty when none is close. A ref ending in a GPU count is matched against the ``families``'
    members of that count too, where a family takes it (``dgx-h1OO-256``: ``dgx-h100-256``)."""
    count = re.search(r"-(\d+)$", ref)
    members = []
    if count:
        members = [m for f in (families or {}).values()
                   if (m := f.name.replace("{gpus}", count[1])) != ref and f.member(m)]
    found = difflib.get_close_matches(ref, [*names, *members], n=3)
    return ", ".join(dict.fromkeys(found))


def _mixed_here(ref: str, where: tuple[Path, str] | None) -> PlannerUsageError:
    message = (f"system {ref!r} mixes device types; plan on it with `planner mixed STUDY.yaml`"
               " (studies/mixed/metis-*.yaml are examples)")
    if where is not None:
        return fail(*where, message)
    return PlannerUsageError(message)


def _entries(path: Path, data: Any = None) -> dict[str, Any]:
    """The file's entries (``data``: the file as loaded already, else it is read)."""
    if data is None:
        data = load(path, "catalog YAML")
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise fail(path, "top level", "must map names to entries")
    # Names starting with "." are YAML templates (anchors for ``<<: *name``), not entries.
    entries = {str(k): v for k, v in data.items() if not str(k).startswith(".")}
    if len(entries) < sum(1 for k in data if not str(k).startswith(".")):
        # `1:` and `"1":` are two keys to YAML and one name here: the first was dropped
        names = [str(k) for k in data]
        twice = next(n for n in names if names.count(n) > 1)
        raise fail(path, twice, "given twice (once as a number, once as text); name each"
                   " entry once")
    return entries


_KIND_KEYS = {"model": {"layers", "hidden", "heads", "vocab"},
              "system": {"device", "network", "groups"},
              "device": {"peak_tflops", "hbm_gb", "hbm_bandwidth_gbps"}}
"""Fields that tell an entry's kind, to name a file of another kind given for this one."""
_STUDY_KEYS = {"model", "system", "training"}


def _check_kind(kind: str, path: Path, data: Any) -> None:
    """A one-line error for a study file, or a file of other entries (models for a system),
    named where a ``kind`` YAML is wanted: said as such, not as the first field that does not
    fit."""
    if not isinstance(data, Mapping):
        return
    if _STUDY_KEYS <= set(map(str, data)):
        raise fail(path, "top level", f"is a study file, not a {kind} YAML; name the study's"
                   f" {kind} (its `{kind}:` value) or a {kind} YAML")
    for name, entry in data.items():
        if str(name).startswith(".") or not isinstance(entry, Mapping):
            continue
        keys = set(map(str, entry))
        other = max(_KIND_KEYS, key=lambda k: len(keys & _KIND_KEYS[k]))
        if other != kind and len(keys & _KIND_KEYS[other]) >= 2 and not keys & _KIND_KEYS[kind]:
            raise fail(path, str(name), f"is a {other} entry, not a {kind}; name a {kind}"
                       f" YAML here (this file holds {other}s)")


def _read_kind(kind: str, path: Path, devices: Mapping[str, DeviceSpec],
               entries: dict[str, Any] | None = None) -> dict[str, Any]:
    if entries is None:
        data = load(path, "catalog YAML")  # read once: its kind checked, then its entries
        _check_kind(kind, path, data)
        entries = _entries(path, data)
    if kind == "model":
        return {n: model_from_entry(path, n, e) for n, e in entries.items()}
    if kind == "device":
        return {n: device_from_entry(path, n, e) for n, e in entries.items()}
    return {n: (family_from_entry(path, n, e, devices, system_from_entry) if is_family_name(n)
                else system_from_entry(path, n, e, devices)) for n, e in entries.items()}


def user_catalog_dir() -> Path:
    """The user's catalog folder: ``$PLANNER_CATALOG`` if set, else
    ``$XDG_CONFIG_HOME/parallel-planner/catalog`` (``~/.config`` when XDG_CONFIG_HOME is unset).

    Read from the environment at each call, so a test or a shell can point it elsewhere."""
    explicit = os.environ.get("PLANNER_CATALOG")
    if explicit:
        return Path(explicit).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config).expanduser() / "parallel-planner" / "catalog"


def load_catalog(root: Path = CATALOG_DIR, *, user: Path | bool = True) -> Catalog:
    """Read ``root/{devices,models,systems}/*.yaml`` (devices first, as systems name them), then
    the same folders of the user's catalog: :func:`user_catalog_dir` when ``user`` is True, the
    folder ``user`` names, or none when False.

    Cached per folder and per state of the user's files (name, inode, size, mtime), so a file
    written or replaced since the last call is read again."""
    roots = [root.resolve()]
    if user is not False:
        folder = (user_catalog_dir() if user is True else user).resolve()
        if folder != roots[0]:
            roots.append(folder)
    return _load_catalog(tuple(roots), _state(roots[1:]))


def _catalog_files(root: Path, kind: str) -> list[Path]:
    return sorted((root / f"{kind}s").glob("*.y*ml"))


def _state(roots: list[Path]) -> tuple[tuple[str, int, int, int], ...]:
    """What identifies the current content of the user's catalog files, for the cache key."""
    state = []
    for root in roots:
        for kind in KINDS:
            for path in _catalog_files(root, kind):
                try:
                    st = path.stat()
                except OSError:
                    continue
                state.append((str(path), st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(state)


@cache
def _load_catalog(roots: tuple[Path, ...], state: tuple) -> Catalog:
    """``state`` is only part of the cache key (see :func:`_state`)."""
    catalog = Catalog()
    for root in roots:
        _read_root(catalog, root)
    return catalog


def _read_root(catalog: Catalog, root: Path) -> None:
    tables = {"device": catalog.devices, "model": catalog.models, "system": catalog.systems}
    for kind in KINDS:
        for path in _catalog_files(root, kind):
            raw = _entries(path)
            found = _read_kind(kind, path, catalog.devices, raw)
            for name, spec in found.items():
                if name in tables[kind] or (kind == "system" and (name in catalog.mixed
                                                                  or name in catalog.families)):
                    first = catalog.sources[(kind, name)]
                    raise fail(path, name, f"{kind} already defined in {first}; rename one")
                if kind == "system":
                    _check_no_member_clash(catalog, path, name, spec)
                if isinstance(spec, ClusterFamily):
                    table: dict = catalog.families
                else:
                    table = catalog.mixed if isinstance(spec, MixedSystemSpec) else tables[kind]
                table[name] = spec
                catalog.sources[(kind, name)] = path
                catalog.entries[(kind, name)] = raw[name]


def _check_no_member_clash(catalog: Catalog, path: Path, name: str, spec: object) -> None:
    """Refuse a system entry that a family already names (``dgx-h100-64`` beside
    ``dgx-h100-{gpus}``), and a family that names an entry already read: one name, one system.
    Entries for part of a node (``dgx-h100-8``) are no family's members."""
    if isinstance(spec, ClusterFamily):
        clashes = [(n, catalog.sources[("system", n)]) for n in catalog.systems
                   if spec.member(n)]
        if clashes:
            other, where = clashes[0]
            raise fail(path, name, f"names {other}, already defined in {where}; rename one")
        return
    for family in catalog.families.values():
        if family.member(name):
            raise fail(path, name, f"already named by the family {family.name} in"
                       f" {family.path}; rename it")
