"""Trends the sources report, and the step model's bad-input errors."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.catalog import load_catalog
from simcore import estimate
from simcore.specs import Recompute, Schedule, Strategy, TrainingSpec, ZeroStage

CATALOG = load_catalog()
GPT175 = CATALOG.model("gpt3-175b")
A100_64 = CATALOG.system("dgx-a100-64")


def _time(strategy: Strategy, global_batch: int = 64, system=A100_64, model=GPT175) -> float:
    training = TrainingSpec(global_batch=global_batch, seq_len=2048)
    return estimate(model, system, training, strategy).step_time


def test_interleaving_beats_1f1b_at_few_micro_batches() -> None:
    # Narayanan et al. 2021 section 2.2.2 / Fig. 12: the interleaved schedule's bubble is
    # (p-1)/(v m) instead of (p-1)/m, which matters most when m is small (here m = 8 = p).
    plain = Strategy(tp=8, pp=8, schedule=Schedule.ONE_F_ONE_B)
    interleaved = Strategy(tp=8, pp=8, schedule=Schedule.INTERLEAVED, v=3)
    assert _time(interleaved, 8) < 0.9 * _time(plain, 8)


def test_recompute_costs_selective_a_few_percent_full_about_a_third() -> None:
    # Korthikanti et al. 2022: selective recompute adds 2.7% FLOPs for GPT-3 (section 5) and
    # Table 4 measures +4-7% per layer; full recompute adds one forward (33% of the FLOPs, 39%
    # measured in Table 4).
    base = Strategy(tp=8, pp=8, schedule=Schedule.INTERLEAVED, v=3)
    none = _time(base)
    selective = _time(replace(base, recompute=Recompute.SELECTIVE))
    full = _time(replace(base, recompute=Recompute.FULL))
    assert 1.0 < selective / none < 1.08
    assert 1.25 < full / none < 1.45


def test_recompute_trades_memory_for_time() -> None:
    training = TrainingSpec(global_batch=64, seq_len=2048)
    mem = {r: estimate(GPT175, A100_64, training, Strategy(tp=8, pp=8, recompute=r)).memory
           .activations for r in Recompute}
    assert mem[Recompute.FULL] < mem[Recompute.SELECTIVE] < mem[Recompute.NONE]


def test_zero_stages_shrink_memory_in_order() -> None:
    training = TrainingSpec(global_batch=64, seq_len=2048)
    system = CATALOG.system("dgx-a100-512")
    totals = [estimate(GPT175, system, training,
                       Strategy(dp=8, tp=8, pp=8, zero=z)).memory.total for z in ZeroStage]
    assert totals == sorted(totals, reverse=True)


def test_pipeline_bubble_shrinks_with_more_micro_batches() -> None:
    # Narayanan Eq. 1: bubble fraction (p-1)/m.
    s = Strategy(tp=8, pp=8)
    training = lambda gb: TrainingSpec(global_batch=gb, seq_len=2048)  # noqa: E731
    small = estimate(GPT175, A100_64, training(16), s)
    large = estimate(GPT175, A100_64, training(256), s)
    assert small.time.bubble / small.step_time > large.time.bubble / large.step_time


def test_an_infeasible_plan_is_an_estimate_with_a_reason() -> None:
    training = TrainingSpec(global_batch=64, seq_len=2048)
    est = estimate(GPT175, CATALOG.system("dgx-a100-8"), training, Strategy(tp=8))
    assert not est.fits
    assert "HBM" in est.reason and "stage 0" in est.reason


@pytest.mark.parametrize(
    ("strategy", "global_batch", "message"),
    [
        (Strategy(dp=2, tp=8, pp=8), 64, "must equal the device count"),
        (Strategy(dp=64 // 3, tp=3, pp=1), 63, "device count"),
        (Strategy(tp=64), 64, "must divide heads=96"),
        (Strategy(tp=8, pp=8, v=5, schedule=Schedule.INTERLEAVED), 64, "must divide layers=96"),
        (Strategy(tp=8, pp=8, micro_batch=3), 64, "allowed micro_batch: divisors of 64"),
        # dp not dividing the batch: no micro-batch tiles it ("divisors of 7" sent users to a
        # micro-batch of 7, refused the same way)
        (Strategy(dp=8, tp=8, pp=1), 63, "dp=8 must divide global_batch=63 .*change the batch"),
        (Strategy(tp=8, pp=8, schedule=Schedule.INTERLEAVED, v=2), 12, "multiple of pp=8"),
    ],
)
def test_bad_shapes_raise_one_line_value_errors(strategy, global_batch, message) -> None:
    with pytest.raises(ValueError, match=message) as info:
        _time(strategy, global_batch)
    assert "\n" not in str(info.value)


def test_sp_must_divide_the_sequence() -> None:
    training = TrainingSpec(global_batch=64, seq_len=1000)
    with pytest.raises(ValueError, match="sp=16 must divide seq_len=1000"):
        estimate(GPT175, A100_64, training, Strategy(tp=4, sp=16))


def test_unknown_names_list_what_is_allowed() -> None:
    with pytest.raises(ValueError, match="unknown recompute 'partial'; allowed: none, selective,"
                       " full"):
        Recompute("partial")
    with pytest.raises(ValueError, match="allowed: gpipe, 1f1b, interleaved"):
        Schedule("zero-bubble")
