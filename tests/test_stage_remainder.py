"""Sizes that a parallel degree does not divide, handled as STAGE recomp handles them.

STAGE keeps a dimension such as ``Din/tp`` as a fraction and truncates only the number it writes
for a whole product (``int(float(expr.evalf(...)))``; simcore/stage/_counts.py cites the lines).
Expected figures: hand calculations written below, and STAGE's own traces and sympy's own
numbers in tests/data/stage_traces/ (README there)."""

from __future__ import annotations

import csv
import re
from collections import defaultdict
from dataclasses import asdict
from fractions import Fraction
from pathlib import Path

import pytest

from planner.commands._astra_estimate import parse_stage_args
from planner.errors import PlannerUsageError
from simcore.stage import NodeKind, StageArgs, build_model, check_args
from simcore.stage._args import coordinates_of
from simcore.stage._counts import Count, Refused, stage_float
from simcore.stage._inventory import inventory
from simcore.stage._symbolic import rank0_graph

DATA = Path(__file__).parent / "data" / "stage_traces"
_BOOLS = ("--weight_sharded", "--activation_recompute")


def _runs() -> dict[str, StageArgs]:
    """tests/data/stage_traces/runs.csv: run name -> its STAGE flags as StageArgs."""
    out = {}
    with (DATA / "runs.csv").open() as f:
        for row in csv.DictReader(f):
            tokens = row["stage_flags"].split()
            flags = dict(zip(tokens[::2], tokens[1::2], strict=True))
            out[row["run"]] = StageArgs(**{
                k[2:]: (v == "1") if k in _BOOLS else int(v) for k, v in flags.items()})
    return out


RUNS = _runs()
# rem_a: --dp 2 --tp 4 --din 50257 --dout 50257 --dmodel 100 --dff 300 --head 7 --seq 10 --batch 3
REM_A = RUNS["rem_a"]


def _node(model, name: str, kind: NodeKind, rank: int = 0):
    graph = model.ranks[coordinates_of(model.args, rank)[0]]
    return next(n for n in graph.nodes if n.name == name and n.kind is kind)


def test_embedding_counts_by_hand() -> None:
    # in_emb_y = x (Batch/dp, Seq/sp, Din, the one-hot gathered over tp) @ w (Din, Dmodel/tp),
    # with rem_a's batch 3, seq 10, vocabulary 50257, dmodel 100, dp 2, tp 4 (sp 1):
    model = build_model(REM_A)
    y = _node(model, "in_emb_y@0", NodeKind.COMP)
    # ops = (3/2) * 10 * 50257 * (100/4) = 18,846,375 (whole: the product is what counts)
    assert y.num_ops == 18_846_375
    # tensor_size = y (3/2 * 10 * 100/4 = 375) + x1 (3/2 * 10 * 50257 = 753,855)
    #             + x2 (50257 * 100/4 = 1,256,425) = 2,010,655
    assert y.tensor_size == 375 + 753_855 + 1_256_425 == 2_010_655
    # the one-hot input as stored, Batch/dp, Seq/sp, Din/tp: 3 * 10 * 50257 / 8 = 188,463.75;
    # the all-gather that builds x1 sends int(188463.75) = 188,463, and the entry naming it
    # (STAGE writes "188463.75", ASTRA-sim's std::stoull reads 188463) is 188,463 too
    gather = _node(model, "in_emb_y@0", NodeKind.COLL)
    assert gather.size == 188_463
    assert dict(y.inputs)["in_emb_x@0"] == 188_463


def test_op_count_remainder_by_hand() -> None:
    # rem_b: dp 3, tp 3, sp 2, batch 5, seq 10, vocabulary 50257, dmodel 100. in_emb_y's ops =
    # (5/3) * (10/2) * 50257 * (100/3) = 125,642,500 / 9 = 13,960,277.78 -> 13,960,277
    rem_b = RUNS["rem_b"]
    y = _node(build_model(rem_b), "in_emb_y@0", NodeKind.COMP)
    assert y.num_ops == 13_960_277
    # the norm's 5 ops per element of Batch/dp, Seq/sp, Dmodel/tp:
    # 5 * (5/3) * (10/2) * (100/3) = 12,500/9 = 1,388.89 -> 1,388
    norm = _node(build_model(rem_b), "stack_0_mha_norm@0", NodeKind.COMP, rank=rem_b.npus - 1)
    assert norm.num_ops == 1_388


def test_past_two_to_the_53_by_hand() -> None:
    # big: out_emb_y's ops = 8192 * 8192 * 12289 * 50257 / 3 = 41,446,989,598,031,872 / 3
    # = 13,815,663,199,343,957 1/3. Doubles from 2^53 to 2^54 are 2 apart, so the value STAGE
    # holds is ...958 (the nearest, above the exact value) and int() keeps it; floor would
    # give ...957.
    y = _node(build_model(RUNS["big"]), "out_emb_y@0", NodeKind.COMP)
    assert 2**53 <= 13_815_663_199_343_957 < 2**54
    assert y.num_ops == 13_815_663_199_343_958


def _stoull(text: str) -> int:
    return int(re.match(r"\d+", text).group())  # type: ignore[union-attr]


_SUFFIX = re.compile(r"_(COMP|X1COMM\d*|X2_COMM\d*|Y_SEND|Y_RECV)$")
_COLL = {"AR": "ALL_REDUCE", "AG": "ALL_GATHER", "RS": "REDUCE_SCATTER", "A2A": "ALL_TO_ALL"}


def _stage_nodes() -> dict[tuple[str, int], list[tuple]]:
    """nodes.csv per (run, rank): (kind, name, num_ops, tensor_size, size, collective, input
    sizes, output sizes) in STAGE's node order, as ASTRA-sim reads them."""
    out: dict[tuple[str, int], list[tuple]] = defaultdict(list)
    with (DATA / "nodes.csv").open() as f:
        for row in csv.DictReader(f):
            comp = row["kind"] == "COMP"
            out[row["run"], int(row["rank"])].append((
                row["kind"], _SUFFIX.sub("", row["name"]),
                int(row["num_ops"]) if comp else 0, int(row["tensor_size"]) if comp else 0,
                0 if comp else int(row["comm_size"]), _COLL.get(row["comm_type"]),
                tuple(_stoull(v) for v in row["inputs"].split()),
                tuple(_stoull(v) for v in row["outputs"].split())))
    return out


def _ours(graph) -> list[tuple]:
    return [(n.kind.name, n.name, n.num_ops, n.tensor_size, n.size,
             None if n.collective is None else n.collective.name,
             tuple(s for _, s in n.inputs), tuple(s for _, s in n.outputs)) for n in graph.nodes]


STAGE_NODES = _stage_nodes()


@pytest.mark.parametrize(("run", "rank"), sorted(STAGE_NODES))
def test_graph_is_stage_trace_node_for_node(run: str, rank: int) -> None:
    args = RUNS[run]
    graph = build_model(args).ranks[coordinates_of(args, rank)[0]]
    assert _ours(graph) == STAGE_NODES[run, rank]


@pytest.mark.parametrize("run", ["rem_a", "big"])
def test_symbolic_rank0_is_stage_trace(run: str) -> None:
    # the layouts' symbolic graph (the fast path's rank 0) gives STAGE's numbers too
    assert _ours(rank0_graph(RUNS[run])) == STAGE_NODES[run, 0]


def _inventories() -> list[tuple[str, int, dict[str, int]]]:
    with (DATA / "inventory.csv").open() as f:
        return [(r.pop("run"), int(r.pop("rank")), {k: int(v) for k, v in r.items()})
                for r in csv.DictReader(f)]


@pytest.mark.parametrize(("run", "rank", "counts"), _inventories())
def test_inventory_is_stage_trace(run: str, rank: int, counts: dict[str, int]) -> None:
    args = RUNS[run]
    graph = build_model(args).ranks[coordinates_of(args, rank)[0]]
    assert {"n_nodes": len(graph.nodes), **asdict(inventory(graph))} == counts


def _evalf_rows() -> list[tuple[str, dict[str, int], float]]:
    with (DATA / "evalf.csv").open() as f:
        return [(r.pop("expression"), {k: int(v) for k, v in r.items() if k != "evalf"},
                 float(r["evalf"])) for r in csv.DictReader(f)]


def _count(expression: str) -> Count:
    """``5.0*Batch*Dmodel**2*Seq/(dp*sp*tp)`` -> Count (sympy's printing of STAGE's products)."""
    top, _, bottom = expression.partition("/")
    amp = None
    num: list[str] = []
    for factor in top.replace("**", "^").split("*"):
        if factor == "5.0":
            amp = 5
        else:
            base, _, power = factor.partition("^")
            num += [base] * int(power or 1)
    den = bottom.strip("()").split("*") if bottom else []
    return Count(tuple(sorted(num)), tuple(sorted(den)), amp)


@pytest.mark.parametrize(("expression", "values", "want"), _evalf_rows())
def test_stage_float_is_sympy_evalf(expression: str, values: dict[str, int], want: float
                                    ) -> None:
    # sympy 1.14's own result, including the 88 rows where it is not the nearest double
    assert stage_float(_count(expression), values.__getitem__) == want


def test_evalf_rows_cover_inexact_results() -> None:
    # the table is worth its name: most rows are where evalf and the nearest double differ
    rows = _evalf_rows()
    off = 0
    for expression, values, want in rows:
        c = _count(expression)
        exact = Fraction(5 if c.amp else 1)
        for s in c.num:
            exact *= values[s]
        for s in c.den:
            exact /= values[s]
        off += want != float(exact)
    assert (len(rows), off) == (22 * 6, 22 * 4)


def test_lab_vocabulary_over_every_tp_is_accepted() -> None:
    # the lab's GPT-175B (seed 000_e13c9ab14088c0d8, Part 3): vocabulary 50257, 96 heads, on
    # 64 NPUs; STAGE runs every dp * tp * sp = 64 split (96 heads over tp 64 cancel too)
    for tp in (1, 2, 4, 8, 16, 32, 64):
        check_args(StageArgs(dp=64 // tp, tp=tp, din=50257, dout=50257, dmodel=12288,
                             dff=49152, head=96, seq=1024, batch=512, num_stacks=96))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        # Batch/dp * Seq/sp * Dmodel/tp = 2 * 4 * 2 / (2 * 4 * 4) = 0.5 element per rank
        ({"batch": 2, "seq": 4, "dmodel": 2, "dp": 2, "sp": 4, "tp": 4},
         "below one element per rank"),
        # in_emb_y's ops = batch * seq * din * dmodel = 2^20 * 2^20 * 64 * 2^20 = 2^66: past
        # the int64 num_ops field (2^63)
        ({"batch": 2**20, "seq": 2**20, "dmodel": 2**20}, "int64"),
    ],
)
def test_refused_in_one_line(changes: dict[str, int], message: str) -> None:
    base = {"din": 64, "dout": 64, "dmodel": 64, "dff": 128, "head": 4, "seq": 32, "batch": 4,
            "num_stacks": 2}
    args = StageArgs(**{**base, **changes})
    for check in (check_args, build_model, rank0_graph):
        with pytest.raises(Refused, match=message) as info:
            check(args)
        assert "\n" not in str(info.value)


def test_command_line_spellings_stage_accepts() -> None:
    # STAGE main.py parses with argparse (unique prefixes name a flag) and str_to_bool
    # ("true", "t", "1", "yes", "y" in any case are True; main.py lines 14-16, 28-29)
    args = parse_stage_args(["--num", "4", "--act", "Yes", "--weight_sharded=t", "--din",
                             "50257", "--dout", "50257", "--tp", "8", "--output_d", "out"])
    assert args == StageArgs(num_stacks=4, activation_recompute=True, weight_sharded=True,
                             din=50257, dout=50257, tp=8)
    with pytest.raises(PlannerUsageError, match="--d: ambiguous, could be --dp, --din"):
        parse_stage_args(["--d", "4"])
