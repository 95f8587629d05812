"""The batched estimate (simcore.megatron.batched.estimate_many) equals simcore.estimate on every
strategy, figure by figure, on samples of every shipped study's valid strategies."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

import simcore
from planner.study_config import load_study_config
from simcore.estimate import MemoryParts, TimeParts
from simcore.megatron.batched import estimate_many
from simcore.megatron.batched_result import MEMORY_PARTS, TIME_PARTS, MemoryColumns, TimeColumns
from simcore.specs import Schedule

ROOT = Path(__file__).resolve().parent.parent
STUDIES = sorted((ROOT / "studies").glob("*.yaml"))
CALCULON = ROOT / "benchmarks" / "studies" / "gpt3-175b-calculon-1024.yaml"
SAMPLE = 250
"""Random strategies per study (seeded)."""
BLOCK = 400
"""Consecutive strategies per study: runs of plans that differ only in schedule and v, the
groups the batched estimate shares its work over."""
TOLERANCE = 1e-9
"""Relative; the batched path adds in the scalar order, so the figures are in fact identical."""

SCALARS = ("step_time", "model_flops", "hardware_flops", "mfu", "hfu", "tokens_per_s",
           "hbm_bytes")


def _valid(path: Path):  # type: ignore[no-untyped-def]
    config = load_study_config(path)
    space = config.space
    if path == CALCULON:  # 1.1 million valid plans; 3 of its 16 micro-batch sizes suffice
        space = replace(space, micro_batch=(1, 3, 16))
    return config, space.valid


def _assert_same(result, index: int, est) -> None:  # type: ignore[no-untyped-def]
    def same(name: str, got: float, want: float) -> None:
        assert got == pytest.approx(want, rel=TOLERANCE, abs=0.0), (name, index)

    for name in SCALARS:
        same(name, float(getattr(result, name)[index]), getattr(est, name))
    for name in TIME_PARTS:
        same(f"time.{name}", float(getattr(result.time, name)[index]), getattr(est.time, name))
    for name in MEMORY_PARTS:
        same(f"memory.{name}", float(getattr(result.memory, name)[index]),
             getattr(est.memory, name))
    same("peak_memory", float(result.peak_memory[index]), est.memory.total)
    assert int(result.peak_stage[index]) == est.peak_stage, ("peak_stage", index)
    assert bool(result.fits[index]) == est.fits, ("fits", index)


@pytest.mark.parametrize("path", [*STUDIES, CALCULON], ids=lambda p: p.stem)
def test_equals_estimate_on_every_shipped_study(path: Path) -> None:
    config, valid = _valid(path)
    rng = random.Random(17)
    sample = rng.sample(valid, min(SAMPLE, len(valid)))
    start = rng.randrange(max(1, len(valid) - BLOCK))
    sample += valid[start:start + BLOCK]
    model, system, training = config.model, config.system, config.training
    result = estimate_many(model, system, training, sample, config.convention)
    assert len(result) == len(sample)
    for i, strategy in enumerate(sample):
        est = simcore.estimate(model, system, training, strategy, config.convention)
        _assert_same(result, i, est)


def test_groups_share_work_and_keep_the_order() -> None:
    """Plans that differ only in schedule and v, interleaved with others, in any order."""
    config, valid = _valid(ROOT / "studies" / "gpt3-175b-a100-1024.yaml")
    model, system, training = config.model, config.system, config.training
    interleaved = next(s for s in valid if s.pp == 8 and s.schedule is Schedule.INTERLEAVED)
    base = replace(interleaved, schedule=Schedule.ONE_F_ONE_B, v=1)
    schedules = [replace(base, schedule=Schedule.GPIPE), interleaved,
                 replace(base, schedule=Schedule.INTERLEAVED, v=4), base]
    other = next(s for s in valid if s.pp == 1)
    plans = [schedules[0], other, *schedules[1:], replace(other, schedule=Schedule.GPIPE)]
    for plan in plans:
        simcore.check(model, system, training, plan)
    result = estimate_many(model, system, training, plans)
    for i, plan in enumerate(plans):
        _assert_same(result, i, simcore.estimate(model, system, training, plan))


def test_an_invalid_strategy_raises_what_estimate_raises() -> None:
    config, valid = _valid(ROOT / "studies" / "gpt3-175b-a100-1024.yaml")
    model, system, training = config.model, config.system, config.training
    base = next(s for s in valid if s.pp == 8 and s.schedule is Schedule.ONE_F_ONE_B)
    for bad in (replace(base, tp=base.tp * 2),  # the device count no longer matches
                replace(base, schedule=Schedule.INTERLEAVED, v=7)):  # 8 * 7 does not divide 96
        with pytest.raises(ValueError) as scalar:
            simcore.estimate(model, system, training, bad)
        with pytest.raises(ValueError) as batched:
            estimate_many(model, system, training, [base, bad])
        assert str(batched.value) == str(scalar.value)


def test_no_strategies_gives_empty_arrays() -> None:
    config, _ = _valid(ROOT / "studies" / "gpt3-175b-a100-1024.yaml")
    result = estimate_many(config.model, config.system, config.training, [])
    assert len(result) == 0 and result.fits.dtype == bool


def test_columns_name_every_part() -> None:
    assert [f for f in TimeColumns.__dataclass_fields__] == list(TIME_PARTS)
    assert [f for f in MemoryColumns.__dataclass_fields__] == list(MEMORY_PARTS)
    assert TIME_PARTS == tuple(TimeParts.__dataclass_fields__)
    assert MEMORY_PARTS == tuple(MemoryParts.__dataclass_fields__)


def test_totals_add_every_part() -> None:
    # each part a distinct power of two: the total is their sum exactly (2^11 - 1 for the eleven
    # time parts, 2^9 - 1 for the nine memory parts), so a part left out of a total shows
    time = TimeParts(**{name: float(2**i) for i, name in enumerate(TIME_PARTS)})
    memory = MemoryParts(**{name: float(2**i) for i, name in enumerate(MEMORY_PARTS)})
    assert (len(TIME_PARTS), time.total) == (11, 2.0**11 - 1)
    assert (len(MEMORY_PARTS), memory.total) == (9, 2.0**9 - 1)


def test_a_layout_whose_middle_stages_differ_is_the_scalar_estimate() -> None:
    # The groups time the first, one middle and the last stage: Llama 3 8B laid out 7 / 7 / 11
    # / 7 on four stages was estimated 2.71 s where simcore.estimate says 3.85 s (its third
    # stage the slowest); such a batch is estimated one by one.
    from planner.catalog import load_catalog
    from simcore.specs import Strategy, TrainingSpec

    catalog = load_catalog(user=False)
    model, system = catalog.model("llama3-8b"), catalog.system("dgx-h100-32")
    training = TrainingSpec(global_batch=64, seq_len=4096)
    plans = [Strategy(tp=8, pp=4, layout=(7, 7, 11, 7)), Strategy(tp=8, pp=4)]
    batch = estimate_many(model, system, training, plans)
    for i, plan in enumerate(plans):
        one = simcore.estimate(model, system, training, plan)
        assert batch.step_time[i] == one.step_time
        assert batch.peak_memory[i] == one.memory.total
