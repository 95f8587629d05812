"""One catalog entry to its spec: a model's, a device's or a system's YAML mapping, checked field
by field (a bad field is one line naming the file, the entry's field and the fix). Units are
converted here (:mod:`planner.units`); :mod:`planner.catalog` finds the entries."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from planner.catalog_mixed import is_mixed_entry, mixed_system_from_entry
from planner.catalog_network import (
    check_network,
    collective_scheduling,
    network_dim,
    spec_or_fail,
)
from planner.fields import boolean, choice, fail, fields, integer, number
from planner.units import GB
from simcore.mixed import MixedSystemSpec
from simcore.network import Network
from simcore.specs import Activation, DeviceSpec, Family, ModelSpec, MoESpec, SystemSpec

__all__ = ["device_from_entry", "model_from_entry", "system_device", "system_from_entry"]

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
_DEVICE_OPTIONAL = {"matmul_efficiency", "memory_efficiency", "memory_overhead_gb", "workspace_gb",
                    "source", "notes", "calibration", "kernel_launch_us", "host_kernel_us",
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
    if num("workspace_gb", 0.0, strict=False) > num("memory_overhead_gb", 0.0, strict=False):
        raise fail(path, f"{name}.workspace_gb", "must be at most memory_overhead_gb: the"
                   " workspaces are part of that allowance")
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
        workspace_bytes=num("workspace_gb", 0.0, strict=False) * GB,
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
