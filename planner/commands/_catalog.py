"""``planner catalog models|systems|devices``: what the catalogs name, with key figures."""

from __future__ import annotations

import argparse

from planner.catalog import CATALOG_DIR, Catalog, load_catalog, system_from_entry
from planner.catalog_families import NODES, ClusterFamily
from planner.commands._base import BaseCommand
from planner.outputs import text_table
from planner.units import GB
from simcore import precision_problem
from simcore.megatron.layers import layer_shape
from simcore.megatron.moe import moe_shape
from simcore.network import NetworkDim
from simcore.specs import Convention, DeviceSpec, Family, ModelSpec, Precision


def _params_b(m: ModelSpec) -> str:
    """Billions of parameters; an MoE model's all of them, then those a token runs through."""
    if m.family not in (Family.GPT, Family.LLAMA):
        return "-"
    shape = layer_shape(m)
    head = 0 if m.tied_embeddings else shape.head_params
    ends = shape.embedding_params + head
    if m.moe is None:
        return f"{(m.layers * shape.layer_params + ends) / 1e9:.1f}"
    ms, n_moe = moe_shape(m), m.moe_layer_count
    dense = (m.layers - n_moe) * shape.layer_params + ends
    common = shape.attention_params + shape.other_params + ms.router_params + ms.shared_params
    total = dense + n_moe * (common + ms.routed_params)
    active = dense + n_moe * (common + m.moe.top_k * ms.expert_params)
    return f"{total / 1e9:.1f} ({active / 1e9:.1f} active)"


def _where(catalog: Catalog, kind: str, name: str) -> str:
    path = catalog.sources[(kind, name)]
    try:
        return str(path.relative_to(CATALOG_DIR.parent.parent))
    except ValueError:
        return str(path)


def _dim(dim: NetworkDim, npus: object = None) -> str:
    """A network dimension in a listing: its topology and size, or, where no switch joins its
    GPUs, the links each has (``links``)."""
    size = dim.npus if npus is None else npus
    if dim.links is not None:
        return f"GPU-to-GPU {size} ({dim.links} links a GPU)"
    return f"{dim.topology.value} {size}"


def _family_row(catalog: Catalog, family: ClusterFamily) -> dict[str, object]:
    """A cluster family as a listing row: its members' node and the node count left open."""
    gpus = 2 * family.per_node
    two_nodes = family.system(family.named(gpus), gpus, catalog.devices,
                              system_from_entry)
    dims = [_dim(d) for d in two_nodes.network.dims[:-1]]
    dims.append(_dim(two_nodes.network.dims[-1], NODES))
    return {"name": family.name, "devices": f"{family.per_node} x {NODES}",
            "device": two_nodes.device.name, "network (inner -> outer)": " x ".join(dims),
            "file": _where(catalog, "system", family.name)}


class CatalogCommand(BaseCommand):
    name = "catalog"
    help = "List the catalog's models, systems or devices (studies/catalog/ and your own folder)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("kind", choices=["models", "systems", "devices"])

    def run(self, args: argparse.Namespace) -> int:
        c = load_catalog()
        if args.kind == "models":
            rows = [{"name": n, "family": m.family.value, "params B": _params_b(m),
                     "layers": m.layers, "hidden": m.hidden, "ffn": m.ffn_hidden,
                     "heads": m.heads, "kv heads": m.n_kv_heads, "vocab": m.vocab,
                     "seq": m.seq_len, "file": _where(c, "model", n)}
                    for n, m in c.models.items()]
        elif args.kind == "systems":
            rows = [{"name": n, "devices": str(s.devices), "device": s.device.name,
                     "network (inner -> outer)": " x ".join(_dim(d) for d in s.network.dims),
                     "file": _where(c, "system", n)} for n, s in c.systems.items()]
            rows += [_family_row(c, f) for f in c.families.values()]
            rows += [{"name": n, "devices": str(s.devices),
                      "device": " + ".join(f"{g.devices} {g.device.name}" for g in s.groups),
                      "network (inner -> outer)": " | ".join(
                          " x ".join(_dim(d) for d in g.network.dims)
                          for g in s.groups),
                      "file": _where(c, "system", n)} for n, s in c.mixed.items()]
        else:
            rows = [{"name": n, "peak TFLOP/s": d.peak_flops_per_s / 1e12,
                     "HBM GB": d.hbm_bytes / GB, "HBM GB/s": d.hbm_bandwidth_bytes_per_s / GB,
                     "precisions": _precisions(d),
                     "file": _where(c, "device", n)} for n, d in c.devices.items()]
        print(text_table(rows))
        return 0


def _precisions(device: DeviceSpec) -> str:
    """The precisions a megatron-convention plan may use on ``device`` (the study's
    ``space.precision`` values)."""
    return ",".join(p.value for p in Precision
                    if precision_problem(device, Convention.MEGATRON, p) is None)
