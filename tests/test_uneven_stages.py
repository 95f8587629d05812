"""Uneven pipeline stages: Megatron-LM's ``--decoder-first/last-pipeline-num-layers``.

Megatron-LM d98e8a64 ``megatron/core/transformer/transformer_config.py`` ("Uneven PP"): the
first and last stages hold their set counts, the stages between split the rest evenly, and with
virtual stages v divides every stage's count. The pipeline of unequal stages takes
``sum(t_i) + (m - 1) max(t_i)`` for m micro-batches (Alpa, Zheng et al. 2022, arXiv:2201.12023,
Eq. 2; DAPPLE, Fan et al. 2021, arXiv:2007.01045 section 4: the "pivot" stage paces the steady
state).

The hand calculations use Llama-3-405B-shaped models on 16,384 H100s: its 126 layers on pp 16 as
7 + 14 x 8 + 7 (Meta's split, Llama 3 paper section 3.3.2), and a 128-layer copy, which splits
evenly into 8 per stage, to compare one layer moved between stages.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import simcore
from planner.catalog import load_catalog
from planner.exports import export_files
from planner.plan import make_plan, strategy_from_attrs
from planner.record import strategy_attrs
from planner.study_config import load_study_config
from search_spaces import strategy_label
from search_spaces.frameworks import why_not
from search_spaces.space import StrategySpace, short_ends
from simcore.megatron.phases import stage_phases
from simcore.megatron.plan import StepPlan
from simcore.specs import (
    Convention,
    Recompute,
    Schedule,
    Strategy,
    TrainingSpec,
    ZeroStage,
)
from simcore.timeline import step_timeline

ROOT = Path(__file__).resolve().parent.parent
TRAINING = TrainingSpec(global_batch=2048, seq_len=8192)
META = {"dp": 128, "tp": 8, "pp": 16, "zero": ZeroStage.OPTIMIZER,
        "recompute": Recompute.SELECTIVE}
"""Meta's 405B layout (tp 8, pp 16, dp 128); m = 2048 / 128 = 16 micro-batches."""


@pytest.fixture(scope="module")
def specs():
    c = load_catalog()
    model = c.model("llama3-405b")
    return model, replace(model, layers=128), c.system("dgx-h100-16384")


def _times(est) -> list[float]:
    return [st.micro_batch_time for st in est.stages]


# -- the split ----------------------------------------------------------------------------------
def test_stage_layers_follow_megatron_rule() -> None:
    s = Strategy(pp=16, first_stage_layers=7, last_stage_layers=7)
    assert s.stage_layers(126) == (7,) + (8,) * 14 + (7,)  # 126 = 7 + 14 * 8 + 7
    # Only the first set: the other 15 stages split 126 - 6 = 120 evenly (8 each).
    assert Strategy(pp=16, first_stage_layers=6).stage_layers(126) == (6,) + (8,) * 15
    assert Strategy(pp=2, last_stage_layers=60).stage_layers(126) == (66, 60)
    assert Strategy(pp=4).stage_layers(128) == (32,) * 4
    assert short_ends(126, 16, 1) == 7 and short_ends(126, 8, 1) == 15  # 15 + 6 * 16 + 15
    assert short_ends(126, 2, 1) is None and short_ends(126, 16, 2) is None  # 130 / 16


def test_checks_refuse_bad_splits_in_one_line(specs) -> None:
    model, _, system = specs
    bad = [
        (Strategy(**META, first_stage_layers=6, last_stage_layers=7), "must split evenly"),
        (Strategy(**{**META, "pp": 1, "dp": 2048}, first_stage_layers=7), "need pp >= 2"),
        # Megatron: "number of layers at first stage: 7 must be divisible by virtual pipeline
        # parallel degree 3"; nor is 7 one short of a multiple of 3 (8).
        (Strategy(**META, schedule=Schedule.INTERLEAVED, v=3, first_stage_layers=7,
                  last_stage_layers=7), "v=3 must divide every stage's layers"),
        # 6 + 14 x 8 + 8: 6 is two short of 8, not one (no account-for-embedding split).
        (Strategy(**META, schedule=Schedule.INTERLEAVED, v=4, first_stage_layers=6,
                  last_stage_layers=8), "v=4 must divide every stage's layers"),
        # 126 - 63 - 63 = 0 layers for 14 middle stages ("Mismatch" in Megatron).
        (Strategy(**META, first_stage_layers=63, last_stage_layers=63), "must split evenly"),
        # more than the model holds: said so, not "leave -8 layers" beside a None (the
        # 126-layer model on pp 16)
        (Strategy(**META, first_stage_layers=130),
         "^first_stage_layers=130 hold 130 layers, more than the model's 126$"),
    ]
    for strategy, words in bad:
        with pytest.raises(ValueError, match=words) as e:
            simcore.check(model, system, TRAINING, strategy)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="megatron convention"):
        simcore.check(model, system, TRAINING, Strategy(**META, first_stage_layers=7,
                                                        last_stage_layers=7), Convention.STAGE)
    with pytest.raises(ValueError, match="first_stage_layers >= 1"):
        Strategy(pp=4, first_stage_layers=0)


def test_uneven_interleaved_follows_megatron(specs) -> None:
    """v = 2 divides each of 32, 32, 32, 30 (126 on pp 4): Megatron runs it interleaved."""
    model, _, system = specs
    s = Strategy(dp=512, tp=8, pp=4, schedule=Schedule.INTERLEAVED, v=2,
                 first_stage_layers=32, last_stage_layers=30)
    est = simcore.estimate(model, system, TRAINING, s)
    assert [st.layers for st in est.stages] == [32, 32, 32, 30]


# -- time ---------------------------------------------------------------------------------------
def test_each_stage_runs_its_own_layers(specs) -> None:
    """On the 128-layer copy, 7 + 14 x 8 + 9 moves one layer from the first stage to the last:
    the first stage is one layer's forward + backward shorter, the last one longer, the others
    unchanged (the embedding and the LM head stay where they were)."""
    _, model, system = specs
    even = simcore.estimate(model, system, TRAINING, Strategy(**META))
    moved = simcore.estimate(model, system, TRAINING,
                             Strategy(**META, first_stage_layers=7, last_stage_layers=9))
    fwd, bwd = simcore.megatron.step.layer_time(model, system, TRAINING, Strategy(**META))
    a, b = _times(even), _times(moved)
    assert b[0] == pytest.approx(a[0] - (fwd + bwd), rel=1e-12)
    assert b[-1] == pytest.approx(a[-1] + (fwd + bwd), rel=1e-12)
    assert b[1:-1] == pytest.approx(a[1:-1], rel=1e-12)
    assert [st.layers for st in moved.stages] == [7] + [8] * 14 + [9]


def test_pipeline_time_is_the_unequal_stages_closed_form(specs) -> None:
    """1F1B over unequal stages: sum(t_i) + (m - 1) max(t_i) (Alpa Eq. 2), m = 16."""
    model, _, system = specs
    est = simcore.estimate(model, system, TRAINING,
                           Strategy(**META, first_stage_layers=7, last_stage_layers=7))
    t = _times(est)
    m = 2048 // 128
    pipe = est.step_time - est.time.dp - est.time.optimizer
    assert pipe == pytest.approx(sum(t) + (m - 1) * max(t), rel=1e-12)
    # A middle stage (8 layers) is the slowest; the first (7 layers + embedding) is faster.
    assert max(t) == t[1] > t[0]


def test_explicit_equal_counts_are_the_even_split(specs) -> None:
    _, model, system = specs
    for pp, dp in ((4, 512), (8, 256), (16, 128)):
        knobs = {**META, "pp": pp, "dp": dp}
        even = simcore.estimate(model, system, TRAINING, Strategy(**knobs))
        n = 128 // pp
        same = simcore.estimate(model, system, TRAINING,
                                Strategy(**knobs, first_stage_layers=n, last_stage_layers=n))
        assert same.step_time == even.step_time
        assert same.memory == even.memory and same.peak_stage == even.peak_stage


# -- memory -------------------------------------------------------------------------------------
def test_first_stage_one_layer_short_holds_one_layer_less_activations(specs) -> None:
    """1F1B: stage 0 holds min(pp, m) = 16 micro-batches in flight; one layer fewer stores
    16 x one layer's stored activations fewer (Korthikanti Eq. 2 / section 4.2.3)."""
    _, model, system = specs
    knobs = {**META, "recompute": Recompute.NONE}
    even = simcore.estimate(model, system, TRAINING, Strategy(**knobs))
    short = Strategy(**knobs, first_stage_layers=7, last_stage_layers=9)
    moved = simcore.estimate(model, system, TRAINING, short)
    stored = StepPlan(model, system, TRAINING, short).act.stored
    flight = min(16, 2048 // 128)
    assert moved.stages[0].in_flight == flight
    drop = even.stages[0].memory.activations - moved.stages[0].memory.activations
    assert drop == pytest.approx(stored * flight, rel=1e-12)


# -- timeline ----------------------------------------------------------------------------------
def test_timeline_stages_match_the_estimate(specs) -> None:
    model, _, system = specs
    s = Strategy(**META, first_stage_layers=7, last_stage_layers=7)
    est = simcore.estimate(model, system, TRAINING, s)
    phases = stage_phases(model, system, TRAINING, s)
    assert [p.micro_batch_time for p in phases] == pytest.approx(_times(est), rel=1e-12)
    timeline = step_timeline(model, system, TRAINING, s, estimate=est)
    assert timeline.pp == 16 and timeline.end > 0


# -- the space ---------------------------------------------------------------------------------
def test_space_enumerates_the_knob_and_both_paths_agree(specs) -> None:
    model, _, system = specs
    space = StrategySpace(model=model, system=system, training=TRAINING,
                          convention=Convention.MEGATRON, tp=(8,), pp=(1, 2, 4, 8, 16),
                          zero=(ZeroStage.OPTIMIZER,), micro_batch=(1,),
                          schedule=(Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED), v=(2, 7),
                          uneven=(0, 1))
    fast = set(space.valid)
    slow = {s for s in space.candidates() if space.reason_invalid(s) is None}
    assert fast == slow
    assert len(space.valid) == len(fast)
    ends = {(s.pp, s.first_stage_layers, s.last_stage_layers) for s in fast}
    assert ends == {(1, None, None), (2, None, None), (4, 31, 31), (8, 15, 15), (16, 7, 7)}
    # interleaved: v 7 divides none of 31 / 32, 15 / 16, 7 / 8; v 2 divides 32, 16 and 8, the
    # ends one short of them (Megatron's account-for-embedding/loss split)
    looped = {(s.pp, s.v) for s in fast if s.uneven and s.schedule is Schedule.INTERLEAVED}
    assert looped == {(4, 2), (8, 2), (16, 2)}


def test_405b_study_holds_meta_s_split() -> None:
    config = load_study_config(ROOT / "studies" / "llama3-405b-h100-16384.yaml")
    meta = [s for s in config.space.valid
            if (s.tp, s.pp, s.first_stage_layers, s.last_stage_layers) == (8, 16, 7, 7)]
    assert meta
    assert config.summary()["space"]["uneven"] == [0, 1]


# -- records, plan files, labels ---------------------------------------------------------------
def test_records_store_the_counts_only_when_set() -> None:
    s = Strategy(**META, first_stage_layers=7, last_stage_layers=7)
    attrs = strategy_attrs(s)
    assert attrs["first_stage_layers"] == 7 and attrs["last_stage_layers"] == 7
    assert strategy_from_attrs(attrs) == s
    assert "first_stage_layers" not in strategy_attrs(Strategy(**META))
    assert strategy_from_attrs({**strategy_attrs(Strategy(**META)),
                                "first_stage_layers": np.nan}) == Strategy(**META)
    assert strategy_label(s).endswith("first7 last7")


# -- exports -----------------------------------------------------------------------------------
def _plan(specs, **knobs: object):
    model, _, system = specs
    return make_plan(model, system, TRAINING, Strategy(**{**META, **knobs}),  # type: ignore[arg-type]
                     Convention.MEGATRON)


def test_megatron_export_writes_the_first_and_last_counts(specs) -> None:
    script = export_files(_plan(specs, first_stage_layers=7, last_stage_layers=7),
                          "megatron")["megatron.sh"]
    assert isinstance(script, str)
    assert "--decoder-first-pipeline-num-layers 7" in script
    assert "--decoder-last-pipeline-num-layers 7" in script
    assert "7 + 14 x 8 + 7 = 126" in script
    even = export_files(_plan(specs, pp=2, dp=1024), "megatron")["megatron.sh"]
    assert "decoder-first" not in str(even)


def test_megatron_export_uneven_interleaved_gives_virtual_stages_per_rank(specs) -> None:
    # arguments.py: uneven stages need --num-virtual-stages-per-pipeline-rank, not
    # --num-layers-per-virtual-pipeline-stage.
    script = str(export_files(_plan(specs, pp=4, dp=512, schedule=Schedule.INTERLEAVED, v=2,
                                    first_stage_layers=32, last_stage_layers=30),
                              "megatron")["megatron.sh"])
    assert "--num-virtual-stages-per-pipeline-rank 2" in script
    assert "--num-layers-per-virtual-pipeline-stage" not in script


def test_torchtitan_export_shortens_first_and_last(specs) -> None:
    toml = str(export_files(_plan(specs, first_stage_layers=7, last_stage_layers=7),
                            "torchtitan")["torchtitan.toml"])
    # (126 + 1 + 1) / 8 = 16 stages; the first and last hold 8 - 1 = 7 layers.
    assert "pipeline_parallel_layers_per_stage = 8" in toml
    assert "pipeline_parallel_first_stage_less_layers = 1" in toml
    assert "pipeline_parallel_last_stage_less_layers = 1" in toml


def test_frameworks_that_cannot_split_unevenly_refuse(specs) -> None:
    model, _, _ = specs
    s = Strategy(**META, first_stage_layers=7, last_stage_layers=7)
    assert "partition_method" in str(why_not("deepspeed", model, TRAINING, s))
    assert why_not("megatron", model, TRAINING, s) is None
    assert why_not("torchtitan", model, TRAINING, s) is None
    looped = Strategy(**{**META, "pp": 4, "dp": 512}, schedule=Schedule.INTERLEAVED, v=2,
                      first_stage_layers=32, last_stage_layers=30)
    assert "virtual stage" in str(why_not("torchtitan", model, TRAINING, looped))
    with pytest.raises(Exception, match="STAGE cannot build it: uneven"):
        export_files(_plan(specs, first_stage_layers=7, last_stage_layers=7), "astra-sim")


# -- with v > 1: the embedding and the loss counted as layers ----------------------------------
def test_short_ends_are_megatron_s_account_for_embedding_and_loss_split(specs) -> None:
    """get_num_layers_to_build (transformer_block.py, d98e8a64) with both account flags:
    (126 + 1 + 1) / 16 = 8 slots per stage, 8 / v per virtual stage, one fewer in rank 0's first
    and rank 15's last. v = 4: 2 per chunk, rank 0 holds 1 + 2 + 2 + 2 = 7."""
    s = Strategy(**META, schedule=Schedule.INTERLEAVED, v=4, first_stage_layers=7,
                 last_stage_layers=7)
    assert s.short_ends(126) == (True, True)
    assert s.chunk_layers(126, 0) == (1, 2, 2, 2)
    assert s.chunk_layers(126, 7) == (2, 2, 2, 2)
    assert s.chunk_layers(126, 15) == (2, 2, 2, 1)
    # v = 8: one layer per virtual stage, the first holds the embedding alone
    v8 = replace(s, v=8)
    assert v8.chunk_layers(126, 0) == (0,) + (1,) * 7
    # only the embedding counted: 126 + 1 = 127 does not divide by 16; on pp 2 (126 + 1 + 1) / 2
    # = 64, 63 + 63 with v 2 is 31 + 32 and 32 + 31
    two = Strategy(dp=1024, tp=8, pp=2, schedule=Schedule.INTERLEAVED, v=2, first_stage_layers=63)
    assert two.stage_layers(126) == (63, 63) and two.short_ends(126) == (True, True)
    assert two.chunk_layers(126, 0) == (31, 32) and two.chunk_layers(126, 1) == (32, 31)
    # a split Megatron's --decoder-first/last-pipeline-num-layers already gives is not one
    even = Strategy(dp=512, tp=8, pp=4, schedule=Schedule.INTERLEAVED, v=2,
                    first_stage_layers=32, last_stage_layers=30)
    assert even.short_ends(126) is None and even.chunk_layers(126, 3) == (15, 15)


def test_short_ends_time_each_chunk_with_its_layers(specs) -> None:
    model, _, system = specs
    s = Strategy(**META, schedule=Schedule.INTERLEAVED, v=4, first_stage_layers=7,
                 last_stage_layers=7)
    est = simcore.estimate(model, system, TRAINING, s)
    assert [st.layers for st in est.stages] == [7] + [8] * 14 + [7]
    phases = stage_phases(model, system, TRAINING, s)
    assert [p.micro_batch_time for p in phases] == pytest.approx(_times(est), rel=1e-12)
    # rank 0's first chunk runs one layer and the embedding, its others two layers each
    first = phases[0].forward
    middle = phases[1].forward[0].compute / 2  # one layer's forward
    assert first[1].compute == pytest.approx(2 * middle)
    assert middle < first[0].compute < 2 * middle
    timeline = step_timeline(model, system, TRAINING, s, estimate=est)
    assert timeline.pp == 16 and 0.95 * est.step_time < timeline.end <= est.step_time


def test_short_ends_export_as_megatron_and_torchtitan_run_them(specs) -> None:
    plan = _plan(specs, schedule=Schedule.INTERLEAVED, v=4, first_stage_layers=7,
                 last_stage_layers=7)
    script = str(export_files(plan, "megatron")["megatron.sh"])
    assert "--account-for-embedding-in-pipeline-split" in script
    assert "--account-for-loss-in-pipeline-split" in script
    assert "--num-virtual-stages-per-pipeline-rank 4" in script
    assert "decoder-first" not in script and "decoder-last" not in script
    toml = str(export_files(plan, "torchtitan")["torchtitan.toml"])
    # 64 virtual stages of 8 / 4 = 2 layers, the first and the last one short
    assert "pipeline_parallel_layers_per_stage = 2" in toml
    assert "pipeline_parallel_first_stage_less_layers = 1" in toml
    assert "pipeline_parallel_last_stage_less_layers = 1" in toml
    model = specs[0]
    assert why_not("megatron", model, TRAINING, plan.strategy) is None
    assert why_not("torchtitan", model, TRAINING, plan.strategy) is None
    assert why_not("deepspeed", model, TRAINING, plan.strategy) is not None  # no interleaving
