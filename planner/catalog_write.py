"""Specs back into catalog entries: the inverse of :mod:`planner.catalog`'s readers.

``model_entry``, ``device_entry`` and ``system_entry`` give the mapping that
``model_from_entry`` / ``device_from_entry`` / ``system_from_entry`` read back into an equal
spec. Numbers are written in the catalog's units (TFLOP/s, decimal GB and GB/s, microseconds,
ASTRA-sim's 2^30 "GB/s" for links that are whole in it) with the fewest digits that still read
back to the same float, so a written file is short and exact.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from planner.errors import PlannerUsageError
from planner.outputs import new_file_mode, refuse_special
from planner.units import GB, GIB
from simcore.network import Collective, CollectiveScheduling, NetworkDim
from simcore.specs import DeviceSpec, ModelSpec, SystemSpec

__all__ = ["model_entry", "device_entry", "system_entry", "short_float", "check_entry_name",
           "write_entry"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def check_entry_name(name: str) -> str:
    """A name for a new catalog entry (``--name``), or a one-line error."""
    if not _NAME.match(name) or name.endswith((".yaml", ".yml")):
        raise PlannerUsageError(f"--name: {name!r} is not a catalog name; use letters, digits,"
                                " '.', '_' and '-', starting with a letter or digit")
    if len(name) > NAME_MAX:  # the entry's file is NAME.yaml: most file systems take 255 bytes
        raise PlannerUsageError(f"--name: {len(name)} characters; use at most {NAME_MAX}")
    return name


NAME_MAX = 200
"""The longest catalog name ``--name`` takes (a study's ``name`` takes as many)."""


def write_entry(target: Path, text: str, what: str = "the user catalog") -> None:
    """``text`` into ``target`` through a temporary file in the same folder and os.replace, so
    a failure leaves nothing half-written. ``what``: what the file is, for the error."""
    if target.is_symlink() or (target.exists() and not target.is_file()):
        check_writable(target, what)  # says why in one line
    tmp: str | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _mode(target))  # mkstemp's file is its owner's alone
        os.replace(tmp, target)
        tmp = None
    except OSError as e:
        raise _cannot_write(target, what, e) from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def _mode(target: Path) -> int:
    """The new file's permissions: those of the file it replaces, else what the user's umask
    gives a new file (a team's catalog stays readable to the team)."""
    try:
        return target.stat().st_mode & 0o777
    except OSError:
        return new_file_mode()


def check_writable(target: Path, what: str = "the user catalog") -> None:
    """Refuse, before any long work, a ``target`` that :func:`write_entry` could not write, or
    should not replace: a folder, a device, pipe or socket, a symbolic link (replacing it would
    leave its file as it was), or under a file or a folder that takes no new file (nothing is
    created)."""
    if target.is_dir():
        raise PlannerUsageError(f"{target}: is a folder; give {what} a file name such as"
                                f" {target / 'NAME.yaml'}")
    if target.is_symlink():
        raise PlannerUsageError(f"{target}: is a symbolic link (to {os.readlink(target)});"
                                f" give {what} the file's own path")
    refuse_special(target, f"give {what} a .yaml file path")
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise PlannerUsageError(f"{folder}: is a file, not a folder; give {what} a path in a"
                                " folder")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise _cannot_write(target, what, e) from None


def _cannot_write(target: Path, what: str, e: OSError) -> PlannerUsageError:
    reason = e.strerror or str(e)
    fix = ("set PLANNER_CATALOG to a writable folder" if what == "the user catalog"
           else "give a writable path")
    return PlannerUsageError(f"{target.parent}: cannot write {what}: {reason}; {fix}")


def short_float(value: float, back: Callable[[float], float], target: float) -> float | int:
    """The shortest decimal ``x`` with ``back(x) == target`` (``value`` itself if none is)."""
    for digits in (6, 9, 12, 15, 17):
        x = float(f"{value:.{digits}g}")
        if back(x) == target:
            return int(x) if x.is_integer() and abs(x) < 2**53 else x
    return value


def _scaled(target: float, unit: float) -> float | int:
    """``target`` in ``unit`` s, as the catalog reader multiplies it back."""
    return short_float(target / unit, lambda x: x * unit, target)


def model_entry(model: ModelSpec) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "family": model.family.value, "layers": model.layers, "hidden": model.hidden,
        "ffn_hidden": model.ffn_hidden, "heads": model.heads, "vocab": model.vocab,
        "seq_len": model.seq_len,
    }
    if model.kv_heads is not None:
        entry["kv_heads"] = model.kv_heads
    entry["activation"] = model.activation.value
    entry["tied_embeddings"] = model.tied_embeddings
    if model.dropout is not None:
        entry["dropout"] = model.dropout
    for name in ("attention_head_dim", "attention_params", "mla_latent",
                 "mla_up_params"):  # only where set (MLA)
        if getattr(model, name) is not None:
            entry[name] = getattr(model, name)
    if model.moe is not None:
        moe = model.moe
        entry["moe"] = {"experts": moe.experts, "top_k": moe.top_k,
                        "expert_ffn": moe.expert_ffn, "shared_experts": moe.shared_experts,
                        **({"shared_ffn": moe.shared_ffn} if moe.shared_ffn is not None else {}),
                        "first_dense": moe.first_dense, "every": moe.every,
                        "capacity_factor": moe.capacity_factor}
    return entry


def device_entry(device: DeviceSpec) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "peak_tflops": _scaled(device.peak_flops_per_s, 1e12),
        "hbm_gb": _scaled(device.hbm_bytes, GB),
        "hbm_bandwidth_gbps": _scaled(device.hbm_bandwidth_bytes_per_s, GB),
        "matmul_efficiency": device.matmul_efficiency,
        "memory_efficiency": device.memory_efficiency,
        "memory_overhead_gb": _scaled(device.memory_overhead_bytes, GB),
    }
    # The fixed-cost constants only where set, so entries without them read as before.
    if device.workspace_bytes:
        entry["workspace_gb"] = _scaled(device.workspace_bytes, GB)
    if device.kernel_launch_s:
        entry["kernel_launch_us"] = _scaled(device.kernel_launch_s, 1e-6)
    if device.host_kernel_s:
        entry["host_kernel_us"] = _scaled(device.host_kernel_s, 1e-6)
    if device.collective_launch_s:
        entry["collective_launch_us"] = _scaled(device.collective_launch_s, 1e-6)
    if device.overlap_slowdown:
        entry["overlap_slowdown"] = device.overlap_slowdown
    if device.fp8_peak_flops_per_s is not None:
        entry["fp8_peak_tflops"] = _scaled(device.fp8_peak_flops_per_s, 1e12)
    if device.mxfp8_matmul_efficiency is not None:
        entry["mxfp8_matmul_efficiency"] = device.mxfp8_matmul_efficiency
    if device.fp4_peak_flops_per_s is not None:
        entry["fp4_peak_tflops"] = _scaled(device.fp4_peak_flops_per_s, 1e12)
    if device.nvfp4_matmul_efficiency is not None:
        entry["nvfp4_matmul_efficiency"] = device.nvfp4_matmul_efficiency
    if device.fp8_attention_speedup:
        entry["fp8_attention_speedup"] = dict(device.fp8_attention_speedup)
    if device.sm_count:
        entry["sm_count"] = device.sm_count
    if device.gemm_wave_s:
        entry["gemm_wave_us"] = _scaled(device.gemm_wave_s, 1e-6)
    if device.attention_efficiency is not None:
        entry["attention_efficiency"] = device.attention_efficiency
    if device.flash_attention:
        entry["flash_attention"] = True
    if device.fused_attention_efficiency is not None:
        entry["fused_attention_efficiency"] = device.fused_attention_efficiency
    if device.fused_matmul_efficiency is not None:
        entry["fused_matmul_efficiency"] = device.fused_matmul_efficiency
    if device.transformer_engine:
        entry["transformer_engine"] = True
    if device.host_bandwidth_bytes_per_s is not None:
        entry["host_bandwidth_gbps"] = _scaled(device.host_bandwidth_bytes_per_s, GB)
    if not device.bf16:
        entry["bf16"] = False
    return entry


def _bandwidth(bytes_per_s: float) -> dict[str, float | int]:
    """ASTRA-sim's 2^30 unit when the figure is short in it (the lab's systems), else decimal."""
    astra = _scaled(bytes_per_s, GIB)
    decimal = _scaled(bytes_per_s, GB)
    if len(repr(astra)) <= len(repr(decimal)):
        return {"bandwidth_astra_gbps": astra}
    return {"bandwidth_gbps": decimal}


def _dim_entry(dim: NetworkDim) -> dict[str, Any]:
    entry: dict[str, Any] = {"topology": dim.topology.value, "npus": dim.npus}
    if dim.width is not None:
        entry["width"] = dim.width
    entry.update(_bandwidth(dim.bandwidth_bytes_per_s))
    entry["latency_us"] = _scaled(dim.latency_s, 1e-6)
    if dim.call_latency_s:
        entry["call_latency_us"] = _scaled(dim.call_latency_s, 1e-6)
    if dim.p2p_bandwidth_bytes_per_s is not None:
        entry["p2p_bandwidth_gbps"] = _scaled(dim.p2p_bandwidth_bytes_per_s, GB)
    if dim.per_communicator:
        entry["per_communicator"] = True
    if dim.links is not None:
        entry["links"] = dim.links
        entry["group_links"] = dict(dim.group_links)
    if dim.nvls is not None:
        entry["nvls"] = {"bandwidth_gbps": _scaled(dim.nvls.bandwidth_bytes_per_s, GB),
                         "latency_us": _scaled(dim.nvls.latency_s, 1e-6),
                         "min_npus": dim.nvls.min_npus}
    common = dim.algorithms[Collective.ALL_REDUCE]
    entry["algorithm"] = str(common)
    others = {c.value: str(a) for c, a in dim.algorithms.items() if a != common}
    if others:
        entry["algorithms"] = others
    return entry


def _scheduling_entry(s: CollectiveScheduling) -> dict[str, Any]:
    return {
        "policy": s.policy.value, "optimization": s.optimization.value,
        "endpoint_delay_ns": _scaled(s.endpoint_delay_s, 1e-9),
        "active_chunks_per_dim": s.active_chunks_per_dim,
        "preferred_dataset_splits": s.preferred_dataset_splits,
        "local_reduction_bandwidth_gbps": _scaled(s.local_reduction_bandwidth_bytes_per_s, GB),
    }


def system_entry(system: SystemSpec, *, device: str | None = None) -> dict[str, Any]:
    """The system with its device inline, or named (``device``) when the catalog holds it."""
    return {
        "device": device if device is not None else device_entry(system.device),
        "network": [_dim_entry(d) for d in system.network.dims],
        "scheduling": _scheduling_entry(system.network.scheduling),
    }


def check_clash(name: str, target: Path) -> None:
    """Refuse a system name the shipped catalog or another file of the user's catalog (in the
    folder of ``target``) defines."""
    from planner.catalog import load_catalog
    from planner.inputs import load

    shipped = load_catalog(user=False)
    if name in shipped.systems or name in shipped.mixed:
        raise PlannerUsageError(
            f"--name: {name}: a shipped system of that name is in"
            f" {shipped.sources[('system', name)]}; choose another name")
    for family in shipped.families.values():
        if family.gpus(name) is not None:
            raise PlannerUsageError(
                f"--name: {name}: the shipped family {family.name} in {family.path} names it;"
                " choose another name")
    for path in sorted(target.parent.glob("*.y*ml")) if target.parent.is_dir() else []:
        data = load(path, "catalog YAML")
        if path.resolve() != target.resolve() and isinstance(data, dict) and name in data:
            raise PlannerUsageError(f"--name: {name}: already defined in {path}; choose another"
                                    " name or edit that file")
