"""The README's quotes of the ready studies are what the studies give today.

The README quotes each ready study's best plan, and some of the plans it is compared with
(section "Studies", paragraph "Ready studies"; the MoE paragraph of "`planner estimate`"). Stop 71
found several of those quotes drifted since earlier stops' modelling changes: each quoted figure
is recomputed here from the study's own plans, as `planner run` estimates and ranks them (the
study's HBM limit, the fastest that fits first), so a change that moves one fails this test until
the README says the new figure.

A quote names its README passage by the text it starts with and the text it ends before, and
each figure by the plans it is read from (the fastest that fits of those whose columns match)
and its format string over that plan's row of :meth:`planner.record.Evaluator.frame`, with its
``rank`` among the plans that fit (1 the fastest; ``rank_word`` "first" to "fifth").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from itertools import groupby
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from planner.mixed_config import load_mixed_study
from planner.prune import prune
from planner.study_config import load_study_config
from search_spaces.mixed import search_mixed
from simcore.mixed.specs import MixedPlan, MixedSystemSpec

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _flat(text: str) -> str:
    """``text`` with every run of whitespace one space (the README wraps its lines)."""
    return " ".join(text.split())


README_FLAT = _flat(README)


@dataclass(frozen=True)
class Figure:
    """One quoted figure: ``text`` formatted over the row of the fastest plan that fits among
    those whose columns equal ``where`` (every plan that fits if empty; None: the column is
    empty, as ``shard_group`` is for sharding over every data-parallel rank and ``ep_overlap``
    and ``ep_dedup`` are when off, 1 when on); ``fits=False`` reads the fastest of them whether
    it fits or not."""

    text: str
    where: dict[str, Any] = field(default_factory=dict)
    fits: bool = True


@dataclass(frozen=True)
class Quote:
    study: str
    start: str
    """The README passage begins with this text (its first occurrence)."""
    end: str
    """... and ends before the first occurrence of this text after ``start``."""
    figures: tuple[Figure, ...]
    counts: tuple[str, ...] = ()
    """Format strings over ``valid`` (the study's valid plans) and ``fitting``."""


QUOTES = (
    Quote("gpt3-175b-h100-fp8", "(`gpt3-175b-h100-fp8`", "NeMo's own FP8 runs", (
        Figure("dp{dp}-tp{tp}-pp{pp} {schedule} v{v}"),
        Figure("{step_time_s:.2f} s per step, MFU {mfu:.1%}"),
        Figure("at {peak_memory_gb:.1f} GB of the part's"),
    )),
    Quote("llama3-405b-h100-16384", "Llama-3-405B on 16,384 H100s", "; GPT-3 175B", (
        Figure("dp {dp} at {mfu:.1%} MFU"),
        Figure("the best 1F1B plan, cp {sp}, dp {dp}, {mfu:.1%}", {"schedule": "1f1b"}),
    ), counts=("{valid:,} strategies",)),
    Quote("llama3-70b-h100-hsdp", "(`llama3-70b-h100-hsdp`", "; the DistIR MLP grid", (
        Figure("best\ndp {dp} x tp {tp} with FSDP shard groups of {shard_group:.0f}"),
        Figure("micro-batch {micro_batch}, {step_time_s:.1f} s per step, MFU {mfu:.1%}"),
        Figure("against {step_time_s:.1f} s and {mfu:.1%} sharding over all 64",
               {"dp": 64, "tp": 4, "shard_group": None}),
        Figure("({peak_memory_gb:.1f} GB sharding over all 64", {
            "dp": 64, "tp": 4, "shard_group": None, "micro_batch": 2,
            "recompute": "selective"}, fits=False),
    ), counts=("{valid} valid plans",)),
    Quote("llama3-405b-gb200-256", "(`llama3-405b-gb200-256`", "Llama 3 70B on one GB200 rack", (
        Figure("best dp {dp}, tp {tp}, pp {pp} interleaved v {v}"),
        Figure("FP8, {step_time_s:.1f} s per step", {"precision": "fp8"}),
        Figure("against {step_time_s:.1f} s estimated for Megatron-Bridge's recipe plan",
               {"dp": 4, "tp": 4, "pp": 16, "sp": 1, "schedule": "interleaved", "v": 4,
                "precision": "fp8", "first_stage_layers": 7, "recompute": "none",
                "micro_batch": 1}),
    ), counts=("{valid:,} valid plans",)),
    Quote("llama3-70b-gb200-64", "(`llama3-70b-gb200-64`", "Llama-3.1-405B on\n256 GB300s", (
        Figure("micro-batch {micro_batch}, {offload_layers} layers offloaded, {step_time_s:.2f} s"
               " a\nstep at {peak_memory_gb:.1f} GB"),
        Figure("ranks {rank}th at {step_time_s:.2f} s", {"tp": 2, "pp": 4, "v": 5}),
    ), counts=("{valid} plans",)),
    Quote("llama3-405b-gb300-256", "(`llama3-405b-gb300-256`", "Llama 3.1 8B", (
        Figure("best NVFP4 at tp {tp} x cp {sp} x pp {pp} x v {v}, {step_time_s:.1f} s a step",
               {"precision": "nvfp4"}),
    ), counts=("{valid} plans",)),
    Quote("llama31-8b-b300-8", "(`llama31-8b-b300-8`", "Llama 2 7B", (
        Figure("best NVFP4 at dp {dp} x micro-batch {micro_batch}, {step_time_s:.3f} s a step",
               {"precision": "nvfp4"}),
        Figure("is estimated {step_time_s:.3f} s",
               {"precision": "fp8", "dp": 8, "micro_batch": 2}),
    ), counts=("{valid} plans",)),
    Quote("llama2-7b-a100-roce-1024", "(`llama2-7b-a100-roce-1024`", "Llama 3 8B on one", (
        Figure("best dp {dp:,} with the distributed optimizer sharded within each node,"
               " `shard_group: {shard_group}`, {step_time_s:.2f} s"),
        Figure("against {step_time_s:.2f} s sharded over all 1,024 ranks", {"shard_group": None}),
    ), counts=("{valid} plans",)),
    Quote("llama3-8b-a800-8", "(`llama3-8b-a800-8`", "Start-up:", (
        Figure("best dp {dp} x tp {tp} at micro-batch {micro_batch},\n{step_time_s:.1f} s a step"),
        Figure("pp 2 x dp 4 at\nmicro-batch 1, 141.7 s, is {rank_word} at {step_time_s:.1f} s",
               {"pp": 2, "dp": 4, "micro_batch": 1}),
    ), counts=("{valid} plans",)),
    Quote("mixtral-8x7b-h100-64", "`mixtral-8x7b-h100-64` (best", "`deepseek-v3-h800-2048`", (
        Figure("best: dp {dp}, tp {tp}, micro-batch {micro_batch}, ep {ep}, overlapped"
               " all-to-alls, {step_time_s:.2f} s\nper step, MFU {mfu:.1%} at"
               " {peak_memory_gb:.1f} GB"),
        Figure("dp 32, tp 2, micro-batch 2 at {step_time_s:.2f} s",
               {"dp": 32, "tp": 2, "micro_batch": 2}),
        Figure("dp 32, pp 2 interleaved v8 at {step_time_s:.2f} s",
               {"dp": 32, "pp": 2, "schedule": "interleaved", "v": 8}),
        Figure("tp 1, pp 4, ep 8, v8\nis {step_time_s:.2f} s",
               {"tp": 1, "pp": 4, "ep": 8, "v": 8, "ep_overlap": None}, fits=False),
        Figure("{step_time_s:.2f} s with the all-to-alls overlapped",
               {"tp": 1, "pp": 4, "ep": 8, "v": 8, "ep_overlap": 1}, fits=False),
    )),
    Quote("deepseek-v3-h800-2048", "`deepseek-v3-h800-2048` (with", "`qwen3-235b-a22b-h100-256`", (
        Figure("best ep {ep} in FP8 with overlap and full\nrecompute, {step_time_s:.1f} s,"
               " MFU {mfu:.1%}"),
        Figure("ep 8 inside a node {step_time_s:.1f} s", {"ep": 8}),
        Figure("its own ep 64, {step_time_s:.1f} s, comes {rank_word}", {"ep": 64}),
    )),
    Quote("qwen3-235b-a22b-h100-256", "`qwen3-235b-a22b-h100-256` (", "DeepSeek-V3's estimate", (
        Figure("tp 2, pp 8 x vp 4, ep 32 with NCCL's all-to-all overlapped, is"
               " {step_time_s:.1f} s",
               {"tp": 2, "pp": 8, "v": 4, "ep": 32, "ep_overlap": 1, "ep_dedup": None}),
        Figure("the same layout at\nep {ep}, {step_time_s:.1f} s",
               {"tp": 2, "pp": 8, "v": 4, "ep_dedup": None}),
        Figure("the recipe's plan takes {step_time_s:.1f} s",
               {"tp": 2, "pp": 8, "v": 4, "ep": 32, "ep_overlap": 1, "ep_dedup": 1}),
        Figure("the best, tp {tp} x pp {pp} x vp {v} at ep {ep},\n{step_time_s:.1f} s"),
    ), counts=("{valid} plans, {fitting} of them fitting",)),
)


@cache
def _frame(study: str) -> pd.DataFrame:
    """Every valid plan of the study as `planner run` records it, fastest first."""
    config = load_study_config(ROOT / "studies" / f"{study}.yaml")
    frame = config.evaluator().frame(config.space.valid)
    return frame.sort_values("step_time_s", kind="stable")


def _passage(quote: Quote) -> str:
    begin = README.find(quote.start)
    assert begin >= 0, f"README no longer has {quote.start!r}"
    end = README.find(quote.end, begin + len(quote.start))
    assert end > begin, f"README has no {quote.end!r} after {quote.start!r}"
    return README[begin:end]


RANK_WORDS = ("first", "second", "third", "fourth", "fifth")


def _row(frame: pd.DataFrame, figure: Figure) -> dict[str, Any]:
    fitting = frame[frame["feasible"]]
    rows = fitting if figure.fits else frame
    for column, value in figure.where.items():
        rows = rows[rows[column].isna() if value is None else rows[column] == value]
    assert len(rows), f"no plan with {figure.where}"
    row = rows.iloc[0].to_dict()
    rank = 1 + int((fitting["step_time_s"] < row["step_time_s"]).sum())
    words = RANK_WORDS[rank - 1] if rank <= len(RANK_WORDS) else f"{rank}th"
    return row | {"rank": rank, "rank_word": words}


@pytest.mark.parametrize("quote", QUOTES, ids=lambda q: q.study)
def test_the_readme_quotes_what_the_study_gives(quote: Quote) -> None:
    frame = _frame(quote.study)
    passage = _flat(_passage(quote))
    said = [figure.text.format(**_row(frame, figure)) for figure in quote.figures]
    said += [count.format(valid=len(frame), fitting=int(frame["feasible"].sum()))
             for count in quote.counts]
    missing = [text for text in map(_flat, said) if text not in passage]
    assert not missing, (f"README.md's quote of studies/{quote.study}.yaml is stale: it should"
                         f" say {missing} (passage: {passage!r})")


PRUNED = (("gpt3-175b-calculon-1024", "Calculon's space: {pruned:,} of {valid:,} plans skipped"),
          ("gpt3-175b-92k-1024", "the {valid:,}-plan study {pruned:,} skipped"))
"""The README's counts of the plans `planner run --prune` skips (section "Scale"), of the
studies in benchmarks/studies/."""


@pytest.mark.parametrize(("study", "text"), PRUNED, ids=[p[0] for p in PRUNED])
def test_the_readme_quotes_what_pruning_skips(study: str, text: str) -> None:
    config = load_study_config(ROOT / "benchmarks" / "studies" / f"{study}.yaml")
    valid = config.space.valid_indices()
    assert valid is not None
    pruning = prune(config.evaluator(), config.space, valid)
    said = text.format(pruned=pruning.pruned, valid=len(valid))
    assert said in README_FLAT, f"README.md should say {said!r}"


METIS = ("metis-16-16", "metis-32-32", "metis-64-64", "metis-128-128")
"""Metis's rows (README, "Clusters that mix device types"): each row's plans, best plan and,
where the best uses both types, the A100s alone."""


def _mixed_plan(plan: MixedPlan, system: MixedSystemSpec) -> str:
    """A mixed plan as the README's table words it: A100 stages then a V100 stage is "4 A100
    stages then 1 V100 stage, m 8"; one group at one stage is "A100 alone, dp 16, ZeRO-1"."""
    runs = [(system.groups[group].name.upper(), len(list(stages)))
            for group, stages in groupby(s.group for s in plan.stages)]
    if len(plan.stages) == 1:
        return f"{runs[0][0]} alone, dp {plan.stages[0].dp}, ZeRO-{plan.zero.value}"
    words = [f"{n} {name} stage{'s' if n > 1 else ''}" for name, n in runs]
    return f"{' then '.join(words)}, m {plan.micro_batches}"


@pytest.mark.parametrize("study", METIS)
def test_the_readme_quotes_what_the_mixed_study_gives(study: str) -> None:
    space = load_mixed_study(ROOT / "studies" / "mixed" / f"{study}.yaml").space
    result = search_mixed(space)
    best, alone = result.best(), result.best("a100")
    assert best is not None and alone is not None
    row = next(line for line in README.splitlines() if line.startswith(f"| `{study}` |"))
    words = _mixed_plan(result.plans[best["plan"]], space.system)
    said = [f"| {len(result.table):,} |", f"{words}: {best['step_time_s']:.3f} s"]
    if best["groups"] != "a100":
        said.append(f"(A100 alone {alone['step_time_s']:.3f} s)")
    missing = [text for text in said if text not in row]
    assert not missing, f"README.md's row of {study} should say {missing}: {row!r}"
