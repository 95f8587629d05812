"""BigScience's BLOOM topology sweeps (tests/data/validation/bloom-sweeps-a100-check.csv; README
there, "BigScience's BLOOM topology sweeps"): 77 timed plans of 177B-196B GPTs on 48 Jean Zay
nodes of 8 A100 80GB, Megatron-DeepSpeed with DeepSpeed's pipeline engine, February 2022. Nothing
is fit on them. The 02-28 rows of the same document and BLOOM's production run are issue 14's
held-out check and are in no file: a test holds that.

The figures are held as measured: the file is a known weak spot (tp 8, and one-sequence
micro-batches, estimated 10-26% fast; plan-choice regret 10.7%), so that a modelling change is
seen moving them either way."""

from __future__ import annotations

import csv
import json
import re
import statistics
from pathlib import Path

from planner.cli import main

DATA = Path(__file__).parent / "data" / "validation"
FILE = DATA / "bloom-sweeps-a100-check.csv"


def _rows() -> list[dict]:
    with FILE.open(newline="") as f:
        return list(csv.DictReader(f))


def test_no_held_out_row() -> None:
    """Issue 14 reserves BLOOM's 02-28 chronicle runs (the prequel's "Rebalancing layers" tables,
    lines 895 on) and the production run: every row cites a line before them and another date."""
    rows = _rows()
    assert len(rows) == 77
    for row in rows:
        line = int(re.search(r"chronicles-prequel\.md line (\d+)", row["source"])[1])
        assert 600 <= line < 895, row["name"]
        assert row["release"] in {"02-21", "02-23", "02-24", "02-25", "02-26", "02-27"}


def test_model_sizes_as_the_tables_print_them() -> None:
    """The tables name each model by l (12 h^2 + 13 h) + 250,880 h (the prequel's formula with
    BLOOM's padded vocabulary): 181B for 72 x 14336, 196B for 84 x 13824, 182B for 84 x 13312 and
    78 x 13824, 177B for 96 x 12288, 195B for 106 x 12288."""
    def size(layers: int, h: int) -> int:
        return round((layers * (12 * h * h + 13 * h) + 250_880 * h) / 1e9)
    assert [size(72, 14336), size(84, 13824), size(84, 13312), size(78, 13824),
            size(96, 12288), size(106, 12288)] == [181, 196, 182, 182, 177, 195]
    # every row fills the 48 nodes: dp x tp x pp = 384
    assert all(int(r["dp"]) * int(r["tp"]) * int(r["pp"]) == 384 for r in _rows())


def test_the_sweeps_as_estimated(capsys) -> None:
    """Measured: 12.2% MAPE, 11.8% median, regret 10.7% over 15 groups (the fastest picked in
    2). By tp and micro-batch (64 heads): tp 8 -24.2 / -19.3 / -10.5% at micro-batch 1 / 2 / 4,
    tp 4 -22.1 / -3.5 / -1.7%, tp 1-2 within 2%."""
    assert main(["validate", str(FILE), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["skipped"] == [] and data["step_time_runs"] == 77
    assert 0.11 <= data["step_time_mape"] <= 0.13
    assert 0.105 <= data["step_time_median_ape"] <= 0.13
    assert data["groups_count"] == 15 and 0.09 <= data["regret_mean"] <= 0.12
    errors: dict[tuple[int, int], list[float]] = {}
    for row in data["rows"]:
        name = row["name"]
        if re.search(r"-h\d+ ", name):  # the head-count variants: kernels of their own
            continue
        key = (int(re.search(r" tp(\d+)", name)[1]), int(re.search(r" mb(\d+)", name)[1]))
        errors.setdefault(key, []).append(row["step_time_error"])
    mean = {key: statistics.mean(values) for key, values in errors.items()}
    assert -0.27 <= mean[(8, 1)] <= -0.21 and -0.22 <= mean[(8, 2)] <= -0.16
    assert -0.13 <= mean[(8, 4)] <= -0.08
    assert -0.06 <= mean[(4, 2)] <= -0.01 and -0.04 <= mean[(4, 4)] <= 0.01
    tp2 = [e for (tp, _), values in errors.items() if tp <= 2 for e in values]
    assert len(tp2) == 4 and all(abs(e) <= 0.02 for e in tp2)
