"""Clusters that mix device types: the estimate, the layer split, the search and `planner mixed`.

Figures come from closed forms: a cluster of one type must give the one-type estimate exactly;
a device with every rate doubled runs a layer in half the time; the best layer split is checked
against every split by brute force.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from planner.catalog import load_catalog
from planner.cli import main
from planner.errors import PlannerUsageError
from planner.mixed_config import load_mixed_study
from search_spaces.mixed import (
    MixedSpace,
    balanced_split,
    group_layouts,
    search_mixed,
    skeletons,
)
from simcore import Strategy, TrainingSpec, estimate
from simcore.mixed import MixedPlan, MixedStage, MixedSystemSpec, check_mixed, estimate_mixed
from simcore.specs import Family, ModelSpec, Recompute, ZeroStage

ROOT = Path(__file__).resolve().parent.parent
MIXED = ROOT / "studies" / "mixed"


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(user=False)


def _one_group(system):
    return MixedSystemSpec(name="one", groups=(system,), link=system.network.dims[-1])


@pytest.mark.parametrize("dp, tp, micro, recompute, zero", [
    (2, 8, 2, Recompute.NONE, ZeroStage.NONE),
    (1, 8, 4, Recompute.FULL, ZeroStage.OPTIMIZER),
    (8, 1, 1, Recompute.SELECTIVE, ZeroStage.NONE),
])
def test_one_device_type_is_the_one_type_estimate_exactly(catalog, dp, tp, micro, recompute,
                                                          zero):
    # GPT 1.7B (24 layers) on 4 DGX A100 nodes; pp = 2 stages of whole nodes (dp*tp = 8 or 16).
    model, system = catalog.model("gpt-1.7b"), catalog.system("dgx-a100-32")
    pp = 32 // (dp * tp)
    training = TrainingSpec(global_batch=64, seq_len=2048)
    one = estimate(model, system, training, Strategy(dp=dp, tp=tp, pp=pp, micro_batch=micro,
                                                     recompute=recompute, zero=zero))
    plan = MixedPlan(stages=tuple(MixedStage(0, tp, dp, model.layers // pp) for _ in range(pp)),
                     micro_batches=64 // (dp * micro), recompute=recompute, zero=zero)
    mixed = estimate_mixed(model, _one_group(system), training, plan)
    assert mixed.step_time == one.step_time
    assert mixed.time == one.time
    assert mixed.memory == one.memory
    assert mixed.mfu == one.mfu
    assert [s.device for s in mixed.stages] == ["a100-80gb"] * pp


def _twice_as_fast(system):
    """The same node with every rate of the device doubled and no fixed costs: each kernel, so
    each layer, takes exactly half the time."""
    d = replace(system.device, kernel_launch_s=0.0, collective_launch_s=0.0)
    fast = replace(d, name="fast", peak_flops_per_s=2 * d.peak_flops_per_s,
                   hbm_bandwidth_bytes_per_s=2 * d.hbm_bandwidth_bytes_per_s)
    return replace(system, name="slow", device=d), replace(system, name="fast", device=fast)


def test_balanced_split_gives_the_faster_stage_twice_the_layers(catalog):
    # One GPU per group: no tp or dp collective, so a layer on "fast" takes exactly half.
    slow, fast = _twice_as_fast(catalog.system("dgx-a100-1"))
    system = MixedSystemSpec(name="pair", groups=(slow, fast), link=slow.network.dims[0])
    model = ModelSpec(name="gpt-48", family=Family.GPT, layers=48, hidden=2048,
                      ffn_hidden=8192, heads=16, vocab=50304, seq_len=2048, tied_embeddings=True)
    space = MixedSpace(model, system, TrainingSpec(global_batch=64, seq_len=2048), tp=(1,),
                       recompute=(Recompute.FULL,))
    result = search_mixed(space)
    plan = result.plans[result.best("slow+fast")["plan"]]
    slow_layers, fast_layers = (st.layers for st in plan.stages)
    # 48 layers at speed 1 : 2 is 16 : 32; the embedding and LM head move it by a layer or two.
    assert abs(fast_layers - 32) <= 2 and slow_layers + fast_layers == 48
    assert fast_layers > slow_layers


def _brute(lines, caps, layers, m):
    best = None
    for split in itertools.product(*(range(1, c + 1) for c in caps)):
        if sum(split) != layers:
            continue
        times = [a + n * t for (a, t), n in zip(lines, split)]
        cost = (m - 1) * max(times) + sum(times)
        best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("lines, caps, layers, m", [
    ([(1.0, 1.0), (0.0, 2.0), (0.5, 0.5)], [9, 9, 9], 9, 4),
    ([(3.0, 1.0), (0.0, 1.0)], [10, 10], 10, 2),
    ([(0.0, 1.0), (0.0, 3.0), (2.0, 0.25)], [12, 12, 3], 12, 8),
    ([(0.2, 1.0), (0.1, 1.1), (0.0, 0.9), (0.3, 2.0)], [6, 6, 6, 6], 14, 3),
    ([(0.0, 1.0), (0.0, 1.0)], [10, 10], 10, 1),
])
def test_balanced_split_is_the_best_split(lines, caps, layers, m):
    split = balanced_split(lines, caps, layers, m)
    assert sum(split) == layers and all(1 <= n <= c for n, c in zip(split, caps))
    times = [a + n * t for (a, t), n in zip(lines, split)]
    assert (m - 1) * max(times) + sum(times) == pytest.approx(_brute(lines, caps, layers, m))


@pytest.mark.parametrize("seed", range(40))
def test_balanced_split_is_the_best_split_on_random_stages(seed):
    rng = random.Random(seed)
    stages = rng.randint(1, 4)
    lines = [(rng.choice([0.0, rng.uniform(0, 3)]), rng.uniform(0.1, 3)) for _ in range(stages)]
    layers = rng.randint(stages, 12)
    caps = [rng.randint(1, layers) for _ in range(stages)]
    m = rng.randint(1, 16)
    split = balanced_split(lines, caps, layers, m)
    best = _brute(lines, caps, layers, m)
    if best is None:
        assert split is None
        return
    times = [a + n * t for (a, t), n in zip(lines, split)]
    assert (m - 1) * max(times) + sum(times) == pytest.approx(best)


def test_balanced_split_none_when_the_stages_cannot_hold_the_layers():
    assert balanced_split([(0.0, 1.0), (0.0, 1.0)], [3, 3], 7, 4) is None
    assert balanced_split([(0.0, 1.0), (0.0, 1.0)], [0, 9], 7, 4) is None


def test_search_covers_the_space(catalog):
    # 16 + 16 GPUs in nodes of 4, 8 layers, tp in {1, 2, 4}: stage sizes 2, 4, 8, 16 (1 would
    # make 16 stages > 8 layers); tp <= size: 2 + 3 + 3 + 3 = 11 layouts per group. Orders: each
    # group alone (11 + 11) and both ways (2 * 11 * 11 minus the pairs with more than 8 stages:
    # size 2 (8 stages) with anything, and size 4 (4 stages) with size 4 or 2).
    study = load_mixed_study(MIXED / "metis-16-16.yaml", catalog=catalog)
    layouts = group_layouts(study.space, 0)
    assert sorted((lay.stages, lay.tp) for lay in layouts) == sorted(
        [(8, 1), (8, 2), (4, 1), (4, 2), (4, 4), (2, 1), (2, 2), (2, 4), (1, 1), (1, 2), (1, 4)])
    stages = {lay: lay.stages for lay in layouts}
    pairs = sum(1 for a, b in itertools.product(stages.values(), repeat=2) if a + b <= 8)
    assert sum(1 for _ in skeletons(study.space)) == 2 * 11 + 2 * pairs


def test_search_best_matches_every_split_of_the_best_layout(catalog):
    # Within the best plan's layout, no other layer split is faster (every split estimated).
    study = load_mixed_study(MIXED / "metis-16-16.yaml", catalog=catalog)
    space = replace(study.space, recompute=(Recompute.NONE,), zero=(ZeroStage.OPTIMIZER,))
    result = search_mixed(space)
    row = result.best("v100+a100")
    plan = result.plans[row["plan"]]
    n = plan.pp
    times = []
    for split in itertools.product(range(1, 9), repeat=n):
        if sum(split) != 8:
            continue
        stages = tuple(replace(st, layers=k) for st, k in zip(plan.stages, split))
        est = estimate_mixed(space.model, space.system, space.training,
                             replace(plan, stages=stages))
        if est.fits:
            times.append(est.step_time)
    assert row["step_time_s"] <= min(times) * (1 + 1e-3)


def test_check_mixed_names_the_problem(catalog):
    system = catalog.any_system("metis-a100-v100-16-16")
    model = catalog.model("metis-gpt-10l")
    training = TrainingSpec(global_batch=128, seq_len=1024)
    with pytest.raises(ValueError, match="hold 7 layers"):
        check_mixed(model, system, training, MixedPlan(
            stages=(MixedStage(0, 4, 4, 7),), micro_batches=8))
    with pytest.raises(ValueError, match="does not fit group a100"):
        check_mixed(model, system, training, MixedPlan(
            stages=(MixedStage(0, 2, 3, 8),), micro_batches=8))
    with pytest.raises(ValueError, match="use 20 devices but it has 16"):
        check_mixed(model, system, training, MixedPlan(
            stages=(MixedStage(0, 4, 4, 4), MixedStage(0, 4, 1, 4)), micro_batches=8))


def test_catalog_refuses_a_list_of_devices(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("x:\n  device: [a100-80gb, v100-32gb]\n  network:\n"
                    "    - {topology: Switch, npus: 8, bandwidth_gbps: 100, latency_us: 1}\n")
    with pytest.raises(PlannerUsageError, match=r"x\.device.*groups"):
        load_catalog(user=False).system(str(path))


def test_a_mixed_system_in_planner_run_says_what_to_use(catalog):
    with pytest.raises(PlannerUsageError, match="planner mixed"):
        catalog.system("metis-a100-v100-16-16")


def test_planner_mixed_reports_the_best_and_each_group_alone(capsys):
    assert main(["mixed", str(MIXED / "metis-16-16.yaml"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    best, alone = out["best"], out["alone"]
    assert set(alone) == {"a100", "v100"}
    fastest = min(r["step_time_s"] for r in [*alone.values(), out["best_mixed"]] if r)
    assert best["step_time_s"] == fastest
    assert out["plans"] > 1000 and out["top"][0] == best


def test_planner_mixed_says_when_only_mixing_fits(tmp_path, capsys):
    # A Llama-3-70B-shaped model of 100 layers: 855.6 M parameters a layer (q and o 8192^2
    # each, k and v 8192 x 1024, three MLP matrices 8192 x 28672) and 2 x 128,256 x 8192 of
    # embedding and head, 87.7 B; 16 bytes each (16-bit weights and gradients, fp32 Adam
    # state, dp 1) is 1.40 TB: more than 16 A100-80GB hold (16 x 85.9 GB = 1.37 TB) or 16
    # V100-16GB, within the 1.65 TB of both (the old line: "mixing does not pay (0.0% slower")
    (tmp_path / "models.yaml").write_text(
        "big: {family: llama, layers: 100, hidden: 8192, ffn_hidden: 28672, heads: 64,"
        " kv_heads: 8, vocab: 128256, seq_len: 1024, source: test}\n")
    study = tmp_path / "big.yaml"
    study.write_text("model: models.yaml#big\nsystem: metis-a100-v100-16-16\n"
                     "training: {global_batch: 32, seq_len: 1024}\n"
                     "space: {tp: [4, 8], recompute: [full], zero: [1]}\n")
    assert main(["mixed", str(study), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["alone"] == {"a100": None, "v100": None} and out["mixing_speedup"] is None
    assert main(["mixed", str(study)]) == 0
    lines = capsys.readouterr().out.splitlines()
    mixed = next(line for line in lines if line.startswith("  mixed: "))
    assert mixed.endswith(": only mixing fits (no group alone has the memory)")


def test_planner_mixed_writes_every_plan(tmp_path, capsys):
    out = tmp_path / "plans.csv"
    assert main(["mixed", str(MIXED / "metis-16-16.yaml"), "--top", "3",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "a100 alone" in text and "v100 alone" in text and str(out) in text
    assert len(out.read_text().splitlines()) > 1000


def test_planner_mixed_bad_input_is_one_line(tmp_path, capsys):
    study = tmp_path / "s.yaml"
    study.write_text("model: metis-gpt-10l\nsystem: dgx-a100-8\n"
                     "training: {global_batch: 128}\nspace: {tp: [1]}\n")
    assert main(["mixed", str(study)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "system" in err[0] and "planner run" in err[0]
    # a whole `planner run` study (its convention, its space's other knobs): the same line,
    # not "convention: unknown field"
    assert main(["mixed", str(ROOT / "studies" / "lab4b-llama70b-system1.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has one device type; plan on it with `planner run`" in err[0]


@pytest.mark.parametrize("path", sorted(MIXED.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_mixed_study_loads(path, catalog):
    study = load_mixed_study(path, catalog=catalog)
    assert len(study.space.system.groups) == 2
    assert next(skeletons(study.space), None) is not None


@pytest.mark.parametrize("option, name, said", [
    # it searched the whole space, then failed with pandas' own words
    ("--out", "plans.csv", "{path}: the folder {folder} does not exist; create it"),
    # it searched the whole space first, then failed on the figure's path
    ("--timeline", "t.html", "--timeline {path}: the folder {folder} does not exist"),
])
def test_mixed_output_into_a_missing_folder_is_refused_before_the_search(
        tmp_path, capsys, monkeypatch, option, name, said):
    import planner.commands._mixed as command

    def no_search(*args, **kwargs):
        raise AssertionError("searched before the output path was checked")

    monkeypatch.setattr(command, "search_mixed", no_search)
    monkeypatch.setattr(command, "sample_mixed", no_search)
    path = tmp_path / "none" / name
    assert main(["mixed", str(MIXED / "metis-16-16.yaml"), option, str(path)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert said.format(path=path, folder=path.parent) in line


@pytest.mark.parametrize("change, said", [
    # a mixture of experts priced as dense: "MFU 107.6%", 81 GB where its weights are 93 GB
    (("model: metis-gpt-10l", "model: mixtral-8x7b"),
     "model: mixtral-8x7b is a mixture of experts, which mixed clusters do not model yet"),
    # an MLP exported as a GPT of 64 layers and one attention head
    (("model: metis-gpt-10l", "model: distir-mlp"), "model: distir-mlp is a mlp model"),
    # no stage of tp 3: "failed: KeyError: 'fits'", exit 1
    (("tp: [1, 2, 4]", "tp: [3]"), "space.tp: no stage of tp 3 fits the groups (a100 16, v100"),
    # "unknown value ['gpipe']; use one of gpipe, ...": the value suggested was the one given
    (("zero: [0, 1]", "zero: [0, 1]\n  schedule: [gpipe]"),
     "space.schedule: takes one schedule, not a list: 1f1b or gpipe"),
])
def test_a_mixed_study_it_cannot_plan_is_one_line(tmp_path, capsys, change, said):
    text = (MIXED / "metis-16-16.yaml").read_text()
    assert change[0] in text
    study = tmp_path / "s.yaml"
    study.write_text(text.replace(*change))
    assert main(["mixed", str(study)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert said in line


def test_mixed_seed_is_numpys_range(capsys):
    # --seed -1 failed after the set-up: "failed: ValueError: Seed must be between 0 and 2**32 - 1"
    for bad in ("-1", str(2**32)):
        assert main(["mixed", str(MIXED / "metis-16-16.yaml"), "--seed", bad]) == 2
        assert "--seed: give a whole number from 0 to 4294967295" in capsys.readouterr().err
