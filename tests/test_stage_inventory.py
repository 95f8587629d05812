"""The traces STAGE recomp writes: rank 0's inventory equals the measured runs' ``et0_*``
columns exactly, and the rank layout follows STAGE's enumeration."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from simcore.stage import StageArgs, build_model, inventory

DATA = Path(__file__).parent / "data"
RESULTS = DATA / "astra_results.csv"
SYSTEMS = DATA / "astra_systems"
STAGE_FLAGS = ("dp", "tp", "pp", "sp", "din", "dout", "dmodel", "dff", "head", "seq", "batch",
               "num_stacks")


def recomp_rows(backend: str | None = None) -> list[dict[str, str]]:
    """Rows of tests/data/astra_results.csv (STAGE recomp runs), optionally of one backend."""
    with RESULTS.open() as f:
        rows = [r for r in csv.DictReader(f) if r["stage_branch"] == "recomp"]
    return [r for r in rows if backend is None or r["backend"] == backend]


def stage_args(row: dict[str, str]) -> StageArgs:
    return StageArgs(
        **{k: int(row[k]) for k in STAGE_FLAGS},
        weight_sharded=row["weight_sharded"] == "1",
        activation_recompute=row["activation_recompute"] == "1",
    )


def system_files(row: dict[str, str]) -> tuple[Path, Path]:
    """The system JSON and network YAML of a row (R4S2rr shares R4S2's network)."""
    name = row["system"]
    network = "R4S2" if name == "R4S2rr" else name
    return SYSTEMS / f"{name}-system.json", SYSTEMS / f"{network}-network.yml"


INVENTORY_COLUMNS = {
    "n_comp": "et0_n_comp",
    "sum_num_ops": "et0_sum_num_ops",
    "sum_tensor_size": "et0_sum_comp_tensor_size",
    "n_AR": "et0_n_AR", "AR_size": "et0_AR_size",
    "n_AG": "et0_n_AG", "AG_size": "et0_AG_size",
    "n_RS": "et0_n_RS", "RS_size": "et0_RS_size",
    "n_A2A": "et0_n_A2A", "A2A_size": "et0_A2A_size",
    "n_send": "et0_n_send", "send_size": "et0_send_size",
    "n_recv": "et0_n_recv", "recv_size": "et0_recv_size",
}


@pytest.mark.parametrize("row", recomp_rows(), ids=lambda r: r["name"])
def test_rank0_inventory_is_exact(row: dict[str, str]) -> None:
    # every et0_* column of tests/data/astra_results.csv (all 28 recomp rows)
    model = build_model(stage_args(row))
    got = inventory(model.ranks[0])
    expected = {field: int(row[column]) for field, column in INVENTORY_COLUMNS.items()}
    assert {f: getattr(got, f) for f in INVENTORY_COLUMNS} == expected
    assert len(model.ranks[0].nodes) == int(row["et0_n_nodes"])


def test_dp8_inventory_by_hand() -> None:
    # NOTES.md 5.1/5.3, R4S2_dp8 row: 4 blocks x 33 compute nodes + 3 per embedding + 22 weight
    # updates = 160; one all-reduce per weight (2 embeddings + 5 per block = 22) of the whole
    # per-rank weight: 2 x 32000 x 1024 + 4 x (3 x 1024^2 + 2 x 1024 x 4096) = 111,673,344
    inv = inventory(build_model(StageArgs(dp=8, din=32000, dout=32000, dmodel=1024, dff=4096,
                                          head=16, seq=1024, batch=64, num_stacks=4)).ranks[0])
    assert inv.n_comp == 4 * 33 + 2 * 3 + 22 == 160
    assert (inv.n_AR, inv.AR_size) == (22, 2 * 32000 * 1024 + 4 * (3 * 1024**2 + 2 * 1024 * 4096))


def test_ranks_of_stages_follow_stage_enumeration() -> None:
    # STAGE numbers ranks dp fastest, then tp, sp, and the pipeline stages in the order their
    # first tensor appears (in_emb -> 0, out_emb -> (num_stacks + 1) mod pp, block i ->
    # (i + 1) mod pp); with pp = 3 and 4 blocks that order is 0, 2, 1, so stage 2 holds ranks
    # 4..7 (checked against the traces STAGE 0b44904 writes for these flags).
    model = build_model(StageArgs(dp=2, tp=2, pp=3, din=64, dout=64, dmodel=64, dff=128,
                                  head=4, seq=32, batch=4, num_stacks=4))
    assert [(g.stage, g.rank) for g in model.ranks] == [(0, 0), (2, 4), (1, 8)]
    assert model.ranks[2].groups == {"dp": (8, 9), "tp": (8, 10), "sp": (8,)}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"dp": 0}, "dp >= 1"),
        ({"num_stacks": 1}, "num_stacks >= 2"),
        ({"pp": 6}, "pp <= num_stacks + 1"),
    ],
)
def test_invalid_args(changes: dict[str, int], message: str) -> None:
    base = {"din": 64, "dout": 64, "dmodel": 64, "dff": 128, "head": 4, "seq": 32, "batch": 4,
            "num_stacks": 4}
    with pytest.raises(ValueError, match=re.escape(message)):
        StageArgs(**{**base, **changes})


def test_heads_that_do_not_divide_dmodel() -> None:
    # 5 heads for dmodel 64: a head is 64/5 = 12.8 wide. STAGE keeps the fraction and only
    # evaluates whole products: at batch 4, seq 32, tp 2, the scores qk (Batch, Seq, Seq/sp,
    # Head/tp) hold 4 * 32 * 32 * 5/2 = 10,240 elements, and computing them contracts a head's
    # width: 10,240 * 64/5 = 131,072 ops (= 4 * 32 * 32 * 64/2: the heads cancel)
    args = StageArgs(din=64, dout=64, dmodel=64, dff=128, head=5, seq=32, batch=4, tp=2,
                     num_stacks=2)
    qk = next(n for n in build_model(args).ranks[0].nodes if n.name == "stack_0_mha_qk@0")
    assert qk.num_ops == 131_072
    assert dict(qk.outputs) == {"stack_0_mha_qk@0": 10_240}
