"""Congestion-aware timing in estimates: ``congestion: aware`` in a study, ``planner estimate
--congestion aware``; without them an estimate stays congestion-unaware.

The system: one 2 x 2 Mesh2D (NPUs 0 = (0,0), 1 = (1,0), 2 = (0,1), 3 = (1,1)), links of 1 GB/s
(1 B/ns) and 100 ns, hand-off e = 10 ns, local reduction 1 GB/s, one chunk (splits 1, one
active). The model: the DistIR MLP (simcore/mlp.py) with 2 layers of width 16 and dp = 4, whose
only collective is the exposed gradient all-reduce (TimeParts.dp) of 2 * 16 * 16 params * 4 B
= 2,048 B. Ring all-reduce on 4 NPUs: 6 sends of m = 512 B, the first 3 reduced, each reduction
R = 3 * trunc(512 B / 1 B/ns) = 1,536.

- Unaware: every step pays the worst NPU's 2 hops, S = trunc(2 * 100 + 512) = 712:
  e + 6 (S + e) + 3 R = 10 + 4,332 + 4,608 = 8,950 ns.
- Aware: the ring's hops into NPUs 0..3 are h = [2, 1, 2, 1] (3 -> 0 goes 3 -> 2 -> 0, 1 -> 2
  goes 1 -> 0 -> 2; XY routing), no two flows share a link, a hop takes c = 100 + 512 = 612
  (store-and-forward). A send follows the receive of the previous step, which completes at
  max(arrival, own send), so NPU i ends at e + 6 e + 3 R + c * (the 6 hops met walking back from
  i: one lap of 6 plus h_i + h_(i-1) = 3) = 10 + 60 + 4,608 + 9 * 612 = 10,186 ns.
- The step grows by 10,186 - 8,950 = 1,236 ns.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner.catalog import load_catalog
from planner.cli import main
from planner.errors import PlannerUsageError
from planner.study_config import load_study_config
from simcore import estimate
from simcore.network import Congestion
from simcore.specs import Strategy, TrainingSpec

UNAWARE_DP_NS = 8_950
AWARE_DP_NS = 10_186

MODEL = """\
tiny-mlp:
  family: mlp
  layers: 2
  hidden: 16
  ffn_hidden: 16
  heads: 1
  vocab: 1
  seq_len: 1
"""

SYSTEM = """\
mesh-2x2:
  device: a100-80gb
  network:
    - {topology: Mesh2D, npus: 4, width: 2, bandwidth_gbps: 1, latency_us: 0.1}
  scheduling: {preferred_dataset_splits: 1, active_chunks_per_dim: 1, endpoint_delay_ns: 10,
               local_reduction_bandwidth_gbps: 1}
"""

STUDY = """\
model: {model}
system: {system}
training: {{global_batch: 4}}
space: {{dp: [4]}}
"""


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    model, system = tmp_path / "tiny-mlp.yaml", tmp_path / "mesh-2x2.yaml"
    model.write_text(MODEL)
    system.write_text(SYSTEM)
    return model, system


def study(tmp_path: Path, files: tuple[Path, Path], extra: str = "") -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(STUDY.format(model=files[0], system=files[1]) + extra)
    return path


def test_aware_estimate_on_a_mesh_by_hand(files) -> None:
    catalog = load_catalog()
    model, system = catalog.model(str(files[0])), catalog.system(str(files[1]))
    aware = replace(system, network=replace(system.network, congestion=Congestion.AWARE))
    training = TrainingSpec(global_batch=4, seq_len=1)
    before = estimate(model, system, training, Strategy(dp=4))
    after = estimate(model, aware, training, Strategy(dp=4))
    assert round(before.time.dp * 1e9) == UNAWARE_DP_NS
    assert round(after.time.dp * 1e9) == AWARE_DP_NS
    assert (after.step_time - before.step_time) * 1e9 == pytest.approx(1_236, abs=1e-3)
    assert after.time.compute == before.time.compute


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_planner_estimate_congestion_option(capsys, files) -> None:
    args = ("estimate", "--model", str(files[0]), "--system", str(files[1]), "--dp", "4",
            "--global-batch", "4", "--json")
    code, out, _ = run(capsys, *args)
    data = json.loads(out)
    assert code == 0 and "congestion" not in data
    assert round(data["time"]["dp"] * 1e9) == UNAWARE_DP_NS
    code, out, _ = run(capsys, *args, "--congestion", "aware")
    data = json.loads(out)
    assert (code, data["congestion"]) == (0, "aware")
    assert round(data["time"]["dp"] * 1e9) == AWARE_DP_NS
    code, _, err = run(capsys, *args, "--congestion", "awre")
    assert code == 2 and "invalid choice: 'awre'" in err and len(err.strip().splitlines()) == 1


def test_stage_convention_refuses_the_aware_model(capsys) -> None:
    code, _, err = run(capsys, "estimate", "--model", "stage-1024x4", "--system", "lab-system1",
                       "--global-batch", "64", "--congestion", "aware")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--congestion: the stage convention replays ASTRA-sim's congestion-unaware" in err


def test_study_congestion_field(tmp_path, files) -> None:
    config = load_study_config(study(tmp_path, files, "congestion: aware\n"))
    assert config.system.network.congestion is Congestion.AWARE
    assert config.summary()["congestion"] == "aware"
    strategy = Strategy(dp=4)
    est = estimate(config.model, config.system, config.training, strategy)
    assert round(est.time.dp * 1e9) == AWARE_DP_NS
    default = load_study_config(study(tmp_path, files))
    assert default.system.network.congestion is Congestion.UNAWARE
    assert "congestion" not in default.summary()  # existing studies keep their fingerprint
    assert default.fingerprint() != config.fingerprint()


def test_study_congestion_bad_value_is_one_line(tmp_path, files) -> None:
    path = study(tmp_path, files, "congestion: awre\n")
    with pytest.raises(PlannerUsageError) as e:
        load_study_config(path)
    assert str(e.value) == (f"{path}: congestion: unknown value 'awre'; use one of unaware,"
                            " aware")
    path = tmp_path / "stage.yaml"
    path.write_text("model: stage-1024x4\nsystem: lab-system1\ntraining: {global_batch: 64}\n"
                    "space: {dp: [64]}\ncongestion: aware\n")
    with pytest.raises(PlannerUsageError, match=r"stage.yaml: congestion: the stage convention"):
        load_study_config(path)


def test_aware_study_plans_keep_their_congestion(tmp_path, capsys, files) -> None:
    # The study stores its specs; plans re-estimated from them (best, export, report) and plan
    # files read back must stay congestion-aware: the dp part stays AWARE_DP_NS.
    storage = ("--storage", str(tmp_path / "s.db"))
    path = study(tmp_path, files, "congestion: aware\nname: aware-mesh\n")
    assert run(capsys, "run", str(path), *storage)[0] == 0
    code, out, _ = run(capsys, "export", "aware-mesh", "--format", "plan", "--out",
                       str(tmp_path / "out"), *storage)
    assert code == 0
    (plan_file,) = (tmp_path / "out").glob("*/plan.yaml")
    code, out, _ = run(capsys, "estimate", "--plan", str(plan_file), "--json")
    data = json.loads(out)
    assert (code, data["congestion"]) == (0, "aware")
    assert round(data["time"]["dp"] * 1e9) == AWARE_DP_NS
