"""Specs for the published runs in tests/data/published_runs.csv (see its README)."""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

from planner.catalog import load_catalog
from simcore.network import Network
from simcore.specs import (
    Family,
    ModelSpec,
    Recompute,
    Schedule,
    Strategy,
    SystemSpec,
    TrainingSpec,
    ZeroStage,
)

DATA = Path(__file__).parent / "data" / "published_runs.csv"

BLOOM_VOCAB = 250_880
"""BLOOM's padded vocabulary (bigscience/bloom config.json vocab_size); the CSV says "250k"."""


def selene(gpus: int) -> SystemSpec:
    """DGX A100 nodes (the catalog's dgx-a100 entries) resized to ``gpus``."""
    base = load_catalog().system("dgx-a100-1024")
    node, fabric = base.network.dims
    dims = (node,) if gpus <= 8 else (node, replace(fabric, npus=gpus // 8))
    network = Network(dims=dims, scheduling=base.network.scheduling)
    return replace(base, name=f"selene-{gpus}", network=network)


@dataclass(frozen=True)
class Run:
    row: int
    label: str
    model: ModelSpec
    system: SystemSpec
    training: TrainingSpec
    strategy: Strategy
    metric: str
    value: str
    notes: str


def _int(text: str, default: int = 1) -> int:
    return int(text) if text.strip() else default


def runs() -> list[Run]:
    out = []
    for x in csv.DictReader(DATA.open()):
        bloom = x["model_name"].startswith("BLOOM")
        h, layers = int(x["hidden"]), int(x["layers"])
        vocab = BLOOM_VOCAB if bloom else int(x["vocab"])
        model = ModelSpec(name=x["model_name"], family=Family.GPT, layers=layers, hidden=h,
                          ffn_hidden=4 * h, heads=int(x["heads"]), vocab=vocab,
                          seq_len=int(x["seq_len"]), tied_embeddings=True)
        tp, pp, dp = _int(x["tp"]), _int(x["pp"]), _int(x["dp"])
        micro = _int(x["micro_batch"])
        v = _int(x["interleave_v"])
        rec = x["recompute"]
        recompute = (Recompute.FULL if bloom or rec == "full" else
                     Recompute.SELECTIVE if rec.startswith("selective") else Recompute.NONE)
        sequence_parallel = x["sp_or_cp"].startswith("SP")
        zero = (ZeroStage.NONE if "stage 0" in x["zero_or_fsdp"] or x["zero_or_fsdp"] == "none"
                else ZeroStage.OPTIMIZER)
        global_batch = _int(x["global_batch"], micro * dp)
        if bloom:
            # DeepSpeed ZeRO-1 with 16-bit weights and gradients; the sharded optimizer holds
            # fp32 master weights, momentum, variance and the fp32 gradient partition (16 B).
            training = TrainingSpec(global_batch=global_batch, seq_len=int(x["seq_len"]),
                                    bytes_per_param_grads=2, fp32_grad_partition=True)
        else:
            # Megatron-LM: fp32 main gradients (18 B/param; Korthikanti Table 3 uses 18).
            # Section 6.3's dp = 8 run had no gradient all-reduce overlap.
            training = TrainingSpec(global_batch=global_batch, seq_len=int(x["seq_len"]),
                                    bytes_per_param_grads=4,
                                    overlap_grad_reduce=x["row"] != "35")
        strategy = Strategy(dp=dp, tp=tp, pp=pp, sequence_parallel=sequence_parallel,
                            recompute=recompute, micro_batch=micro, zero=zero,
                            schedule=Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B,
                            v=v)
        label = (f"row {x['row']} {x['model_name']} tp{tp} pp{pp} dp{dp} mb{micro}"
                 f" {recompute.value}{' SP' if sequence_parallel else ''}")
        out.append(Run(int(x["row"]), label, model, selene(tp * pp * dp), training, strategy,
                       x["measured_metric_name"], x["measured_value"], x["notes"]))
    return out
