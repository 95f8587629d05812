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
here and nowhere else (:mod:`planner.units`).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from planner.catalog_families import (
    ClusterFamily,
    family_from_entry,
    family_member,
    is_family_name,
)
from planner.catalog_mixed import is_mixed_entry, mixed_system_from_entry
from planner.catalog_network import (
    check_network,
    collective_scheduling,
    network_dim,
    spec_or_fail,
)
from planner.errors import PlannerUsageError
from planner.fields import boolean, choice, fail, fields, integer, number
from planner.inputs import load
from planner.units import GB
from simcore.mixed import MixedSystemSpec
from simcore.network import Network
from simcore.specs import Activation, DeviceSpec, Family, ModelSpec, MoESpec, SystemSpec

__all__ = ["CATALOG_DIR", "KINDS", "Catalog", "load_catalog", "user_catalog_dir"]

CATALOG_DIR = Path(__file__).resolve().parent.parent / "studies" / "catalog"
KINDS = ("device", "model", "system")
"""Read in this order (systems name devices); ``<root>/<kind>s/*.yaml`` holds each kind."""

_MODEL_FIELDS = {"family", "layers", "hidden", "ffn_hidden", "heads", "vocab", "seq_len"}
_MODEL_OPTIONAL = {"kv_heads", "activation", "tied_embeddings", "source", "notes", "moe",
                   "attention_head_dim", "attention_params", "mla_latent", "mla_up_params",
                   "dropout"}
_MOE_FIELDS = {"experts", "top_k", "expert_ffn"}
_MOE_OPTIONAL = {"shared_experts", "shared_ffn", "first_dense", "every", "capacity_factor"}


def _moe_entry(path: Path, name: str, entry: Any) -> MoESpec:
    """A model's ``moe:`` mapping (:class:`simcore.specs.MoESpec`)."""
    where = f"{name}.moe"
    e = fields(path, where, entry, _MOE_FIELDS, _MOE_OPTIONAL)
    ints = {k: integer(path, f"{where}.{k}", e[k], minimum=1)
            for k in ("experts", "top_k", "expert_ffn")}
    for k, low in (("shared_experts", 0), ("first_dense", 0), ("every", 1), ("shared_ffn", 1)):
        if k in e:
            ints[k] = integer(path, f"{where}.{k}", e[k], minimum=low)
    extra = {}
    if "capacity_factor" in e:
        extra["capacity_factor"] = number(path, f"{where}.capacity_factor", e["capacity_factor"],
                                          minimum=1.0, strict=False)
    return spec_or_fail(path, where, lambda: MoESpec(**ints, **extra))


def model_from_entry(path: Path, name: str, entry: Any) -> ModelSpec:
    e = fields(path, name, entry, _MODEL_FIELDS, _MODEL_OPTIONAL)
    family = choice(path, f"{name}.family", e["family"], Family)
    ints = {k: integer(path, f"{name}.{k}", e[k], minimum=1)
            for k in ("layers", "hidden", "ffn_hidden", "heads", "vocab", "seq_len")}
    kv = e.get("kv_heads")
    if kv is not None:
        kv = integer(path, f"{name}.kv_heads", kv, minimum=1)
    activation = (choice(path, f"{name}.activation", e["activation"], Activation)
                  if "activation" in e else None)  # None: the family's (ModelSpec)
    tied = e.get("tied_embeddings", family is Family.GPT)
    if not isinstance(tied, bool):
        raise fail(path, f"{name}.tied_embeddings", f"must be true or false, but got {tied!r}")
    extra: dict[str, Any] = {}
    if "dropout" in e:
        if not isinstance(e["dropout"], bool):
            raise fail(path, f"{name}.dropout", f"must be true or false, but got {e['dropout']!r}")
        extra["dropout"] = e["dropout"]
    if "moe" in e:
        extra["moe"] = _moe_entry(path, name, e["moe"])
    for k in ("attention_head_dim", "attention_params", "mla_latent", "mla_up_params"):
        if k in e:
            extra[k] = integer(path, f"{name}.{k}", e[k], minimum=1)
    return spec_or_fail(path, name, lambda: ModelSpec(
        name=name, family=family, kv_heads=kv, activation=activation, tied_embeddings=tied,
        **ints, **extra))


_DEVICE_FIELDS = {"peak_tflops", "hbm_gb", "hbm_bandwidth_gbps"}
_DEVICE_OPTIONAL = {"matmul_efficiency", "memory_efficiency", "memory_overhead_gb", "source",
                    "notes", "calibration", "kernel_launch_us", "host_kernel_us",
                    "collective_launch_us", "sm_count",
                    "gemm_wave_us",
                    "overlap_slowdown", "fp8_peak_tflops",
                    "attention_efficiency", "flash_attention", "bf16",
                    "fused_attention_efficiency", "fused_matmul_efficiency",
                    "transformer_engine", "host_bandwidth_gbps", "mxfp8_matmul_efficiency",
                    "fp4_peak_tflops", "nvfp4_matmul_efficiency", "fp8_attention_speedup"}


def _flag(path: Path, name: str, entry: dict[str, Any], key: str, default: bool) -> bool:
    return boolean(path, f"{name}.{key}", entry.get(key, default))


def _speedup_points(path: Path, name: str, value: Any) -> tuple[tuple[int, float], ...]:
    """A device's ``fp8_attention_speedup``: a mapping of sequence lengths to speed-ups."""
    where = f"{name}.fp8_attention_speedup"
    if not isinstance(value, Mapping) or not value:
        raise fail(path, where, "must map sequence lengths to speed-ups, e.g. {2048: 1.01,"
                   f" 8192: 1.14}}, but got {value!r}"[:200])
    # a JSON plan file's keys are strings: "2048"
    return tuple(sorted((integer(path, f"{where} key", int(length) if isinstance(length, str)
                                 and length.isdigit() else length, minimum=1),
                         number(path, f"{where}[{length}]", ratio, minimum=0, strict=True))
                        for length, ratio in value.items()))


def device_from_entry(path: Path, name: str, entry: Any) -> DeviceSpec:
    e = fields(path, name, entry, _DEVICE_FIELDS, _DEVICE_OPTIONAL)

    def num(key: str, default: float | None = None, *, strict: bool = True) -> float:
        value = e.get(key, default)
        return number(path, f"{name}.{key}", value, minimum=0, strict=strict)

    flash, bf16, te = (_flag(path, name, e, key, default) for key, default in (
        ("flash_attention", False), ("bf16", True), ("transformer_engine", False)))
    attention = e.get("attention_efficiency")
    fused = e.get("fused_attention_efficiency")
    fused_matmul = e.get("fused_matmul_efficiency")
    fp8 = e.get("fp8_peak_tflops")
    mxfp8 = e.get("mxfp8_matmul_efficiency")
    fp4 = e.get("fp4_peak_tflops")
    nvfp4 = e.get("nvfp4_matmul_efficiency")
    host = e.get("host_bandwidth_gbps")
    sm_count = e.get("sm_count", 0)
    return spec_or_fail(path, name, lambda: DeviceSpec(
        name=name,
        kernel_launch_s=num("kernel_launch_us", 0.0, strict=False) * 1e-6,
        host_kernel_s=num("host_kernel_us", 0.0, strict=False) * 1e-6,
        collective_launch_s=num("collective_launch_us", 0.0, strict=False) * 1e-6,
        overlap_slowdown=num("overlap_slowdown", 0.0, strict=False),
        fp8_peak_flops_per_s=None if fp8 is None else num("fp8_peak_tflops") * 1e12,
        mxfp8_matmul_efficiency=None if mxfp8 is None else num("mxfp8_matmul_efficiency"),
        fp4_peak_flops_per_s=None if fp4 is None else num("fp4_peak_tflops") * 1e12,
        nvfp4_matmul_efficiency=None if nvfp4 is None else num("nvfp4_matmul_efficiency"),
        fp8_attention_speedup=(() if "fp8_attention_speedup" not in e else
                               _speedup_points(path, name, e["fp8_attention_speedup"])),
        sm_count=integer(path, f"{name}.sm_count", sm_count, minimum=0),
        gemm_wave_s=num("gemm_wave_us", 0.0, strict=False) * 1e-6,
        attention_efficiency=None if attention is None else num("attention_efficiency"),
        flash_attention=flash,
        fused_attention_efficiency=None if fused is None else num("fused_attention_efficiency"),
        fused_matmul_efficiency=(None if fused_matmul is None
                                 else num("fused_matmul_efficiency")),
        transformer_engine=te,
        host_bandwidth_bytes_per_s=None if host is None else num("host_bandwidth_gbps") * GB,
        bf16=bf16,
        peak_flops_per_s=num("peak_tflops") * 1e12,
        hbm_bytes=num("hbm_gb") * GB,
        hbm_bandwidth_bytes_per_s=num("hbm_bandwidth_gbps") * GB,
        matmul_efficiency=num("matmul_efficiency", 1.0),
        memory_efficiency=num("memory_efficiency", 1.0),
        memory_overhead_bytes=num("memory_overhead_gb", 0.0, strict=False) * GB,
    ))


_SYSTEM_FIELDS = {"device", "network"}
_SYSTEM_OPTIONAL = {"scheduling", "source", "notes"}


def system_device(path: Path, where: str, raw_device: Any,
                  devices: Mapping[str, DeviceSpec]) -> DeviceSpec:
    """A system's ``device``: a catalog name or an inline device entry."""
    if isinstance(raw_device, str):
        device = devices.get(raw_device)
        if device is None:
            known = ", ".join(sorted(devices)) or "none"
            raise fail(path, f"{where}.device", f"unknown device {raw_device!r}; known: {known}")
        return device
    if isinstance(raw_device, list):
        raise fail(path, f"{where}.device", "one device type per system; a cluster that mixes"
                   " types is a list of node `groups` (see studies/catalog/systems/mixed.yaml)")
    return device_from_entry(path, f"{where}.device", raw_device)


def system_from_entry(path: Path, name: str, entry: Any,
                      devices: Mapping[str, DeviceSpec]) -> SystemSpec | MixedSystemSpec:
    if is_mixed_entry(entry):
        return mixed_system_from_entry(path, name, entry, devices)
    e = fields(path, name, entry, _SYSTEM_FIELDS, _SYSTEM_OPTIONAL)
    device = system_device(path, name, e["device"], devices)
    dims_raw = e["network"]
    if not isinstance(dims_raw, list) or not dims_raw:
        raise fail(path, f"{name}.network", "must be a list of dimensions, innermost first")
    dims = tuple(network_dim(path, f"{name}.network[{i}]", d) for i, d in enumerate(dims_raw))
    check_network(path, f"{name}.network", dims)
    scheduling = collective_scheduling(path, f"{name}.scheduling", e.get("scheduling"), device)
    network = spec_or_fail(path, f"{name}.network",
                           lambda: Network(dims=dims, scheduling=scheduling))
    return SystemSpec(name=name, device=device, network=network)


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
        close = _close_names(ref, [*table, *(self.families if kind == "system" else ())])
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


def _close_names(ref: str, names: list[str]) -> str:
    """The catalog names closest to a mistyped ``ref`` (up to three, best first), as one text;
    empty when none is close."""
    return ", ".join(difflib.get_close_matches(ref, names, n=3))


def _mixed_here(ref: str, where: tuple[Path, str] | None) -> PlannerUsageError:
    message = (f"system {ref!r} mixes device types; plan on it with `planner mixed STUDY.yaml`"
               " (studies/mixed/metis-*.yaml are examples)")
    if where is not None:
        return fail(*where, message)
    return PlannerUsageError(message)


def _entries(path: Path) -> dict[str, Any]:
    data = load(path, "catalog YAML")
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise fail(path, "top level", "must map names to entries")
    # Names starting with "." are YAML templates (anchors for ``<<: *name``), not entries.
    return {str(k): v for k, v in data.items() if not str(k).startswith(".")}


def _read_kind(kind: str, path: Path, devices: Mapping[str, DeviceSpec],
               entries: dict[str, Any] | None = None) -> dict[str, Any]:
    if entries is None:
        entries = _entries(path)
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
