"""Spaces enumerated as arrays (issue 17, item 2) give exactly the strategies, in exactly the
order, that checking every candidate one by one with ``simcore.check`` gives: on every shipped
study's space and on random spaces whose lists mix valid and invalid values."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from planner.catalog import load_catalog
from planner.study_config import load_study_config
from search_spaces import StrategySpace
from simcore.specs import (
    Axis,
    Convention,
    Recompute,
    Schedule,
    TrainingSpec,
    ZeroStage,
)

ROOT = Path(__file__).resolve().parent.parent
STUDIES = sorted((ROOT / "studies").glob("*.yaml"))


def one_by_one(space: StrategySpace) -> tuple:
    return tuple(s for s in space.candidates() if space.reason_invalid(s) is None)


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_every_shipped_study(path: Path) -> None:
    space = load_study_config(path).space
    if space.size > 200_000:  # the 16,384-GPU study: checked on a sub-space below
        space = replace(space, micro_batch=space.micro_batch[:1], placement=space.placement[:1])
    assert space.valid == one_by_one(space)


def _subset(rng: random.Random, values: tuple, at_least: int = 1) -> tuple:
    k = rng.randint(at_least, len(values))
    return tuple(sorted(rng.sample(values, k), key=values.index))


PLACEMENTS = ((Axis.TP, Axis.SP, Axis.DP, Axis.PP), (Axis.DP, Axis.TP, Axis.SP, Axis.PP),
              (Axis.SP, Axis.DP, Axis.TP, Axis.PP))


def _random_space(seed: int) -> StrategySpace:
    # Degrees that do and do not divide the heads (96, 64 with 8 kv heads), layers (96, 80),
    # sequences (2048, 8192) and batches (1536, 1000); micro-batches 1-16; every schedule with
    # v 2-8 (interleaved needs pp >= 2 and a micro-batch count that pp divides).
    rng = random.Random(seed)
    catalog = load_catalog()
    model, system, convention = rng.choice([
        ("gpt3-175b", "dgx-a100-1024", Convention.MEGATRON),
        ("llama3-70b", "dgx-h100-64", Convention.MEGATRON),
        ("distir-mlp", "lab-system1", Convention.MLP),
    ])
    devices = catalog.system(system).devices
    powers = tuple(2 ** k for k in range(devices.bit_length()) if 2 ** k <= devices)
    return StrategySpace(
        model=catalog.model(model), system=catalog.system(system),
        training=TrainingSpec(global_batch=rng.choice([1536, 1000, 64]),
                              seq_len=rng.choice([2048, 8192, 1000])),
        convention=convention,
        tp=_subset(rng, powers + (3, 6)), pp=_subset(rng, powers + (3, 5)),
        sp=_subset(rng, powers[:4]),
        zero=_subset(rng, tuple(ZeroStage)), recompute=_subset(rng, tuple(Recompute)),
        micro_batch=_subset(rng, tuple(range(1, 17))),
        schedule=_subset(rng, tuple(Schedule)), v=_subset(rng, tuple(range(1, 9))),
        placement=_subset(rng, PLACEMENTS), sequence_parallel=_subset(rng, (True, False)),
        recompute_layers=_subset(rng, (0, 1, 3, 9)),
    )


@pytest.mark.parametrize("seed", range(12))
def test_random_spaces(seed: int) -> None:
    space = _random_space(seed)
    assert space.valid == one_by_one(space)


def test_the_random_spaces_mix_valid_and_invalid_candidates() -> None:
    spaces = [_random_space(seed) for seed in range(12)]
    valid = sum(len(s.valid) for s in spaces)
    assert 0 < valid < sum(s.size for s in spaces)


def test_a_space_with_no_layout_is_empty() -> None:
    catalog = load_catalog()
    space = StrategySpace(model=catalog.model("gpt3-175b"), system=catalog.system("dgx-a100-1024"),
                          training=TrainingSpec(global_batch=1536, seq_len=2048),
                          convention=Convention.MEGATRON, tp=(3,))
    assert space.valid == () == one_by_one(space)


def test_sequence_parallelism_needs_tp_to_divide_the_sequence() -> None:
    # seq 1,000 / sp 1 over tp 16: 62.5 tokens per rank, so only sequence_parallel false runs
    # at tp 16 and 32 (tp 8: 125 tokens each)
    catalog = load_catalog()
    space = StrategySpace(model=catalog.model("gpt3-175b"), system=catalog.system("dgx-a100-1024"),
                          training=TrainingSpec(global_batch=1536, seq_len=1000),
                          convention=Convention.MEGATRON, tp=(8, 16, 32), pp=(8,),
                          sequence_parallel=(True, False))
    valid = space.valid
    assert valid == one_by_one(space)
    assert [(s.tp, s.sequence_parallel) for s in valid] == [(8, True), (8, False), (16, False),
                                                            (32, False)]
