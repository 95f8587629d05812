"""search_spaces: the allowed values, the rules (simcore's own) and the layout encoding."""

from __future__ import annotations

import itertools
from math import comb

import optuna

import simcore
from planner.catalog import load_catalog
from search_spaces import LayoutEncoding, StrategySpace, divisors, powers_of_two
from simcore.specs import Convention, Recompute, Schedule, Strategy, TrainingSpec, ZeroStage

CATALOG = load_catalog()
LAB_TRAINING = TrainingSpec(global_batch=512, seq_len=1024)  # the lab's batch and sequence


def lab_space(model: str, system: str, convention: Convention) -> StrategySpace:
    return StrategySpace(model=CATALOG.model(model), system=CATALOG.system(system),
                         training=LAB_TRAINING, convention=convention,
                         tp=powers_of_two(64), sp=powers_of_two(64),
                         recompute=(Recompute.NONE, Recompute.FULL))


def test_powers_of_two_and_divisors():
    assert powers_of_two(64) == (1, 2, 4, 8, 16, 32, 64)
    assert powers_of_two(100) == (1, 2, 4, 8, 16, 32, 64)
    assert divisors(80) == (1, 2, 4, 5, 8, 10, 16, 20, 40, 80)


def test_lab_space_has_56_strategies():
    # dp * tp * sp = 64 = 2^6 with each a power of two: exponents a + b + c = 6, C(8, 2) = 28
    # layouts (stars and bars), times recompute on/off = 56 (shared design.md, "Ready studies").
    space = lab_space("llama70b", "lab-system1", Convention.MEGATRON)
    assert len(space.layouts()) == comb(8, 2) == 28
    assert space.size == 56
    assert len(space.enumerate()) == 56  # 64 heads, 28672 FFN, seq 1024: every tp divides


def test_gpt175b_loses_tp64():
    # 96 heads are not divisible by tp = 64; only the layout dp1-tp64-sp1 has tp = 64: 2 plans.
    space = lab_space("gpt175b", "lab-system2", Convention.MEGATRON)
    valid = space.enumerate()
    assert len(valid) == 54
    assert all(s.tp != 64 for s in valid)


def test_space_and_simcore_agree_on_every_candidate():
    llama = CATALOG.model("llama3-70b")  # 64 heads, 8 kv heads, 80 layers
    space = StrategySpace(
        model=llama, system=CATALOG.system("dgx-h100-64"),
        training=TrainingSpec(global_batch=64, seq_len=8192), convention=Convention.MEGATRON,
        tp=(1, 2, 4, 8, 16), pp=(1, 2, 4, 8), sp=(1, 2), micro_batch=(1, 2, 4),
        schedule=(Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED), v=(2, 5),
        zero=(ZeroStage.NONE, ZeroStage.PARAMETERS))
    valid = set(space.enumerate())
    seen = 0
    for s in space.candidates():
        seen += 1
        assert s.devices == 64
        try:
            simcore.check(space.model, space.system, space.training, s)
            ok = True
        except ValueError:
            ok = False
        assert ok == (s in valid)
    assert seen == space.size
    # tp = 16 would split 8 kv heads: never valid.
    assert all(s.tp <= 8 for s in valid)
    # interleaved needs pp >= 2 and pp * v dividing 80 layers (pp 8 with v 5 is 40: fine).
    assert all(s.pp >= 2 and 80 % (s.pp * s.v) == 0 for s in valid
               if s.schedule is Schedule.INTERLEAVED)


def test_stage_space_uses_stage_rules():
    # STAGE takes any split: 50,257 over tp and 96 heads over tp = 64 stay fractions and only
    # the numbers it writes are truncated (simcore/stage/_counts.py), so all 56 lab plans are
    # valid, where the megatron convention loses the 2 with tp = 64 (test_gpt175b_loses_tp64).
    space = lab_space("gpt175b", "lab-system2", Convention.STAGE)
    assert len(space.enumerate()) == 56
    assert space.reason_invalid(Strategy(dp=32, tp=2)) is None


def test_encoding_round_trips_every_valid_strategy():
    space = lab_space("llama70b", "lab-system1", Convention.MEGATRON)
    enc = LayoutEncoding(space)
    assert set(enc.distributions) == {"layout", "recompute"}  # single-valued knobs are fixed
    for s in space.enumerate():
        params = enc.params(s)
        assert enc.nearest(params) == s
        for name, value in params.items():
            assert value in enc.distributions[name].choices


def test_suggest_only_returns_valid_strategies():
    llama = CATALOG.model("llama3-70b")
    space = StrategySpace(
        model=llama, system=CATALOG.system("dgx-h100-64"),
        training=TrainingSpec(global_batch=16, seq_len=8192), convention=Convention.MEGATRON,
        tp=(1, 2, 4, 8), pp=(1, 2, 4), micro_batch=(1, 2, 4, 8, 16),
        schedule=(Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED), v=(2,))
    enc = LayoutEncoding(space)
    valid = set(space.enumerate())
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(300):
        trial = study.ask()
        s = enc.suggest(trial)
        assert s in valid
        # the layout sampled is the layout that runs: the degrees are never repaired
        assert f"dp{s.dp}-tp{s.tp}-pp{s.pp}-sp{s.sp}" == trial.params["layout"]
        study.tell(trial, 0.0)


def test_nearest_keeps_the_layout_and_changes_fewest_knobs():
    llama = CATALOG.model("llama3-70b")
    space = StrategySpace(
        model=llama, system=CATALOG.system("dgx-h100-64"),
        training=TrainingSpec(global_batch=16, seq_len=8192), convention=Convention.MEGATRON,
        tp=(8,), pp=(1,), micro_batch=(1, 2, 4), recompute=(Recompute.NONE, Recompute.FULL))
    enc = LayoutEncoding(space)
    # dp = 8: micro-batch 4 needs dp * 4 = 32 | 16, which fails; 1 and 2 tile the batch.
    s = enc.nearest({"layout": "dp8-tp8-pp1-sp1", "micro_batch": 4, "recompute": "full"})
    assert (s.dp, s.tp, s.recompute) == (8, 8, Recompute.FULL)
    assert s.micro_batch in (1, 2)


def test_empty_space_says_why():
    space = StrategySpace(model=CATALOG.model("llama3-70b"), system=CATALOG.system("dgx-h100-64"),
                          training=TrainingSpec(global_batch=16, seq_len=8192),
                          convention=Convention.MEGATRON, tp=(16, 32))
    assert space.enumerate() == ()
    assert "kv_heads" in space.first_reason() or "heads" in space.first_reason()


def test_a_space_whose_knobs_pair_with_no_layout_says_which():
    # shard_group 3 divides no dp x sp of 8 GPUs: the message said "()"
    space = StrategySpace(model=CATALOG.model("llama3-8b"), system=CATALOG.system("dgx-h100-8"),
                          training=TrainingSpec(global_batch=64, seq_len=4096),
                          convention=Convention.MEGATRON, tp=(1, 2),
                          zero=(ZeroStage.PARAMETERS,), shard_group=(3,))
    assert space.enumerate() == ()
    assert space.first_reason().startswith("shard_group 3 with dp x sp = 8 and zero 3: a shard"
                                           " group is a multiple of sp (1) that divides")


def test_an_empty_space_names_the_knob_not_etps_duplicate():
    # etp 2 beside etp None at tp 2 is the same plan, left out: not the reason the space is
    # empty (recompute_layers 40 is more than a stage's 16 layers)
    from search_spaces import StrategySpace as Space

    space = Space(model=CATALOG.model("mixtral-8x7b"), system=CATALOG.system("dgx-h100-8"),
                  training=TrainingSpec(global_batch=64, seq_len=4096),
                  convention=Convention.MEGATRON, tp=(2,), pp=(2,), etp=(2, None),
                  recompute=(Recompute.FULL,), recompute_layers=(40,))
    assert space.enumerate() == ()
    assert space.first_reason().startswith("recompute_layers 40: needs recompute full")


def test_dp_list_restricts_layouts():
    space = StrategySpace(model=CATALOG.model("llama70b"), system=CATALOG.system("lab-system1"),
                          training=LAB_TRAINING, convention=Convention.MEGATRON,
                          dp=(1, 2), tp=powers_of_two(64))
    assert {(lay.dp, lay.tp) for lay in space.layouts()} == {(1, 64), (2, 32)}
    assert list(itertools.chain(space.enumerate()))
