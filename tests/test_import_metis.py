"""`planner import-metis`: Metis's hostfile, cluster file and profiles as a mixed system and
layer profiles, and `planner mixed` pricing stages with them.

The files are written by the tests in Metis's formats (livingshade/Metis@900445f:
``gen_hostfile.py``, ``clusterfile.json``, ``DeviceType.<TYPE>_tp<T>_bs<B>.json``) with figures
chosen here, not copied: a layer takes 10 ms per sequence on one A100 and 25 ms on one V100,
tp 2 takes 0.6 of that, the embedding 0.5 ms and the head 2 ms per sequence. Every test points
PLANNER_CATALOG at a temporary folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main
from planner.metis_io import METIS_GBPS
from planner.mixed_config import load_mixed_study
from search_spaces.mixed import search_mixed
from simcore.mixed.estimate import StageCosts, stage_lines
from simcore.specs import Recompute

LAYER_MS = {"A100": 10.0, "V100": 25.0}  # one sequence, tp 1
TP_FACTOR = {1: 1.0, 2: 0.6}
BATCHES = (1, 2, 4, 8)


@pytest.fixture()
def catalog_dir(tmp_path, monkeypatch):
    folder = tmp_path / "catalog"
    monkeypatch.setenv("PLANNER_CATALOG", str(folder))
    return folder


def _metis_inputs(root: Path, layers: int = 8) -> tuple[Path, Path, Path]:
    hostfile = root / "hostfile"
    hostfile.write_text("10.0.0.4 slots=4\n" * 2 + "10.0.0.1 slots=4\n" * 2)
    clusterfile = root / "clusterfile.json"
    clusterfile.write_text(json.dumps({
        "10.0.0.1": {"instance_type": "V100", "inter_bandwidth": 10, "intra_bandwidth": 50,
                     "memory": 16},
        "10.0.0.4": {"instance_type": "A100", "inter_bandwidth": 10, "intra_bandwidth": 46,
                     "memory": 80}}))
    profiles = root / "profiles"
    profiles.mkdir()
    for kind, ms in LAYER_MS.items():
        for tp, factor in TP_FACTOR.items():
            for bs in BATCHES:
                times = [0.5 * bs] + [ms * bs * factor] * layers + [2.0 * bs]
                (profiles / f"DeviceType.{kind}_tp{tp}_bs{bs}.json").write_text(json.dumps(
                    {"model": {"model_name": "GPT3", "num_layers": layers + 2},
                     "execution_time": {"layer_compute_total_ms": times}}))
    return hostfile, clusterfile, profiles


def _study(root: Path, name: str = "lab", model: str = "metis-gpt-10l") -> Path:
    study = root / "study.yaml"
    study.write_text(f"model: {model}\nsystem: {name}\nprofile: {name}\n"
                     "training: {global_batch: 32}\nspace: {tp: [1, 2], recompute: [none]}\n")
    return study


def test_import_builds_the_groups_and_links(tmp_path, catalog_dir, capsys):
    files = _metis_inputs(tmp_path)
    assert main(["import-metis", *map(str, files), "--name", "lab"]) == 0
    assert "8 transformer layers" in capsys.readouterr().out
    from planner.catalog import load_catalog

    system = load_catalog().mixed["lab"]
    assert [(g.name, g.device.name, g.devices) for g in system.groups] == [
        ("a100", "a100-80gb", 8), ("v100", "v100-16gb", 8)]
    node = system.groups[0].network.dims[0]
    # Metis's 46 "GB/s" is 46 * 2^20 bytes per ms
    assert node.npus == 4
    assert node.bandwidth_bytes_per_s == pytest.approx(46 * 2**20 * 1000)
    assert METIS_GBPS == pytest.approx(1.048576)
    assert system.link.bandwidth_bytes_per_s == pytest.approx(10 * 2**20 * 1000)


def test_a_profiled_stage_takes_the_profiled_layer_time(tmp_path, catalog_dir):
    assert main(["import-metis", *map(str, _metis_inputs(tmp_path)), "--name", "lab"]) == 0
    study = load_mixed_study(_study(tmp_path))
    space = study.space
    costs = StageCosts(space.model, space.system, space.training, space.profiles)
    result = search_mixed(space)
    assert not result.table.empty
    for label in result.table["plan"]:
        plan = result.plans[label]
        lines = stage_lines(costs, plan)
        for st, (_, per_layer, _, _) in zip(plan.stages, lines):
            kind = space.system.groups[st.group].name.upper()
            micro = space.training.global_batch // (plan.micro_batches * st.dp)
            # the per-layer slope is the profile's layer: ms/sequence x sequences x tp factor
            assert micro in BATCHES and st.tp in TP_FACTOR
            expected = LAYER_MS[kind] * micro * TP_FACTOR[st.tp] / 1e3
            assert per_layer == pytest.approx(expected, rel=1e-12)


def test_full_recompute_adds_a_forward_third(tmp_path, catalog_dir):
    assert main(["import-metis", *map(str, _metis_inputs(tmp_path)), "--name", "lab"]) == 0
    space = load_mixed_study(_study(tmp_path)).space
    costs = StageCosts(space.model, space.system, space.training, space.profiles)
    from simcore.mixed import MixedPlan, MixedStage

    plan = MixedPlan(stages=(MixedStage(0, 1, 8, 8),), micro_batches=4,
                     recompute=Recompute.FULL)
    (_, per_layer, _, _), = stage_lines(costs, plan)
    # 32 / (4 * 8) = 1 sequence per replica: 10 ms x 4/3
    assert per_layer == pytest.approx(10e-3 * 4 / 3, rel=1e-12)


def test_profile_of_another_depth_is_one_line(tmp_path, catalog_dir, capsys):
    assert main(["import-metis", *map(str, _metis_inputs(tmp_path)), "--name", "lab"]) == 0
    capsys.readouterr()
    assert main(["mixed", str(_study(tmp_path, model="metis-gpt-20l"))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "8 transformer layers" in err[0] and "profile" in err[0]


def test_planner_mixed_runs_on_the_imported_cluster(tmp_path, catalog_dir, capsys):
    assert main(["import-metis", *map(str, _metis_inputs(tmp_path)), "--name", "lab"]) == 0
    assert main(["mixed", str(_study(tmp_path)), "--json"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out[out.index("{"):])
    assert summary["best"] is not None and summary["system"] == "lab"


@pytest.mark.parametrize("line, field", [("10.0.0.4 slots=four", "line 1"),
                                          ("10.0.0.9 slots=4", "not in")])
def test_bad_hostfile_is_one_line(tmp_path, catalog_dir, capsys, line, field):
    hostfile, clusterfile, profiles = _metis_inputs(tmp_path)
    hostfile.write_text(line + "\n")
    assert main(["import-metis", str(hostfile), str(clusterfile), str(profiles),
                 "--name", "lab"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0]
    assert not (catalog_dir / "systems" / "lab.yaml").exists()


def test_missing_device_profile_is_one_line(tmp_path, catalog_dir, capsys):
    hostfile, clusterfile, profiles = _metis_inputs(tmp_path)
    for f in profiles.glob("DeviceType.V100_*"):
        f.unlink()
    assert main(["import-metis", str(hostfile), str(clusterfile), str(profiles),
                 "--name", "lab"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no profile of V100" in err and "\n" not in err


@pytest.mark.parametrize("times", [
    "[0.5, 0, 0, 2.0]",  # a transformer layer of no time: every plan's step 0 ms a layer
    "[0.5, NaN, 1.0, 2.0]", "[0.5, Infinity, 1.0, 2.0]",  # Python's json reads both
    "[0.5, true, 1.0, 2.0]", "[-0.5, 1.0, 1.0, 2.0]",
])
def test_a_profile_without_a_time_for_each_layer_is_one_line(tmp_path, catalog_dir, capsys,
                                                             times):
    hostfile, clusterfile, profiles = _metis_inputs(tmp_path, layers=2)
    bad = sorted(profiles.glob("DeviceType.A100_*"))[0]
    bad.write_text('{"execution_time": {"layer_compute_total_ms": ' + times + "}}")
    assert main(["import-metis", str(hostfile), str(clusterfile), str(profiles),
                 "--name", "lab"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and bad.name in err
    assert "must list each layer's milliseconds (> 0; the embedding's and the head's >= 0)" in err
    assert not (catalog_dir / "systems" / "lab.yaml").exists()
