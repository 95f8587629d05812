"""Pruning by bounds (issue 17 item 4): the bounds never exceed the estimate, and a pruned
study keeps exactly what the unpruned one keeps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna
import pytest

from planner import results_parquet as rp
from planner.cli import main
from planner.prune import can_prune
from planner.storage import open_storage
from planner.study_config import load_study_config
from planner.study_folder import study_storage
from simcore.megatron.batched import estimate_many
from simcore.megatron.bounds import lower_bounds
from simcore.megatron.layers import layer_shape

ROOT = Path(__file__).resolve().parent.parent
PRUNABLE = [p for p in sorted((ROOT / "studies").glob("*.yaml"))
            if can_prune(load_study_config(p).space)]


def test_shipped_studies_with_dense_megatron_spaces_are_prunable() -> None:
    names = {p.stem for p in PRUNABLE}
    # fp8, uneven stages (405B) and plain bf16 spaces among them; MoE and mlp are not
    assert {"gpt3-175b-h100-fp8", "llama3-405b-h100-16384", "gpt3-175b-a100-1024"} <= names
    assert not names & {"mixtral-8x7b-h100-64", "deepseek-v3-h800-2048", "distir-mlp-16"}


@pytest.mark.parametrize("path", PRUNABLE, ids=lambda p: p.stem)
def test_bounds_never_exceed_the_estimate(path: Path) -> None:
    config = load_study_config(path)
    space = config.space
    indices = space.valid_indices()
    assert indices is not None
    pick = np.random.default_rng(17).permutation(len(indices))[:3000]
    flat = np.sort(indices[pick])
    bounds = lower_bounds(config.model, config.system, config.training, space.columns_at(flat))
    result = estimate_many(config.model, config.system, config.training,
                           space.strategies_at(flat))
    assert np.all(bounds.step_time_s <= result.step_time)
    assert np.all(bounds.memory_bytes <= result.peak_memory)
    # and they are not vacuous: the memory bound is most of the peak for most plans
    assert np.median(bounds.memory_bytes / result.peak_memory) > 0.8


def test_memory_bound_is_zero3s_sixteen_bytes_over_n() -> None:
    # GPT-3 175B, tp 8, pp 8 (12 layers a stage), ZeRO-3 over dp 16: the first stage holds
    # 12 (12 h^2 + 13 h) + (V + s) h parameters / tp (Narayanan et al. 2021: a layer's
    # 12 h^2 + 13 h; the embedding's (V + s) h), at 16 bytes each (Rajbhandari et al. 2020:
    # 2 + 2 + 12) / N_d = 16 under ZeRO-3; plus the layers' kept activations and the allowance
    config = load_study_config(ROOT / "studies" / "gpt3-175b-a100-1024.yaml")
    m, s, v = config.model, config.training.seq_len, config.model.vocab
    h = m.hidden
    params = (12 * (12 * h * h + 13 * h) + (v + s) * h) / 8
    columns = {"dp": [16], "tp": [8], "pp": [8], "sp": [1], "micro_batch": [1], "v": [1],
               "zero": [3], "shard_ranks": [16], "first_stage_layers": [0],
               "recompute": [2], "schedule": [1], "sequence_parallel": [True], "fp8": [False]}
    bounds = lower_bounds(m, config.system, config.training,
                          {k: np.asarray(x) for k, x in columns.items()})
    # full recompute keeps each layer's input: s b h x 2 bytes / tp (sequence parallel)
    # (Korthikanti et al. 2022 section 4.2), for min(pp, m) = 8 micro-batches in flight
    activations = 12 * (s * h * 2 / 8) * 8
    allowance = config.system.device.memory_overhead_bytes
    assert layer_shape(m).layer_params == 12 * h * h + 13 * h
    assert bounds.memory_bytes[0] == pytest.approx(
        (16 * params / 16 + activations + allowance) * (1 - 1e-9), rel=1e-12)


def _kept(folder: Path, name: str) -> tuple[dict[str, tuple[float, ...]], dict]:
    storage = open_storage(study_storage(str(folder), name), create=False)
    study = optuna.load_study(study_name=name, storage=storage)
    return ({t.user_attrs["plan"]: tuple(t.values) for t in study.get_trials(deepcopy=False)},
            study.user_attrs[rp.RESULTS])


@pytest.mark.parametrize("study", ["gpt3-175b-h100-fp8", "llama3-405b-h100-16384"])
def test_a_pruned_study_keeps_what_the_unpruned_one_keeps(tmp_path, capsys, monkeypatch,
                                                          study) -> None:
    # a "big" study of a few thousand plans: 100 kept as trials beyond the fronts
    monkeypatch.setattr(rp, "TRIALS_KEPT", 500)
    monkeypatch.setattr(rp, "BEST_KEPT", 100)
    path = str(ROOT / "studies" / f"{study}.yaml")
    plain, pruned = tmp_path / "plain", tmp_path / "pruned"
    assert main(["run", path, "--storage", str(plain), "--quiet"]) == 0
    assert main(["run", path, "--storage", str(pruned), "--quiet", "--prune"]) == 0
    out = capsys.readouterr().out
    assert "pruned " in out and "by bounds" in out
    everything, plain_results = _kept(plain, study)
    kept, results = _kept(pruned, study)
    assert kept == everything  # the same plans with the same figures
    assert results["prune"] and "prune" not in plain_results
    assert results["pruned"] > 0
    table = rp.ResultsTable(Path(results["parquet"]))
    assert table.rows() == results["plans"] - results["pruned"]
    capsys.readouterr()
    assert main(["studies", "--storage", str(pruned)]) == 0
    assert f"front+best, {results['pruned']:,} pruned" in capsys.readouterr().out
    # a resume adds nothing and prunes the same plans
    assert main(["run", path, "--storage", str(pruned), "--quiet", "--resume"]) == 0
    assert _kept(pruned, study) == (kept, results)
    assert table.rows() == results["plans"] - results["pruned"]


def test_a_small_study_is_not_pruned(tmp_path, capsys) -> None:
    path = str(ROOT / "studies" / "lab4b-llama70b-system1-megatron.yaml")
    assert main(["run", path, "--storage", str(tmp_path / "s"), "--quiet", "--prune"]) == 0
    assert "--prune: nothing pruned" in capsys.readouterr().out
