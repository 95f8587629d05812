"""`planner import-astra`: the lab's ASTRA-sim files into the user's catalog, where studies,
`planner estimate --system` and exports find them; exporting a plan on the imported system gives
the same files back. Bad input is one line, exit code 2, and nothing written.

Every test points PLANNER_CATALOG at a temporary folder: none writes to the real home."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from planner import cli
from planner.astra_io import load_astra_system
from planner.catalog import load_catalog, user_catalog_dir
from planner.commands._import_astra import ImportAstraCommand
from planner.errors import PlannerUsageError
from planner.exports._astra import export_astra
from planner.plan import make_plan
from simcore.specs import Convention, Strategy, TrainingSpec

SYSTEMS = Path(__file__).parent / "data" / "astra_systems"
TUTORIAL = Path(__file__).parent.parent / "studies" / "astra" / "tutorial-system.json"
R4S2 = (SYSTEMS / "R4S2-system.json", SYSTEMS / "R4S2-network.yml")


@pytest.fixture(autouse=True)
def user_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "user-catalog"
    monkeypatch.setenv("PLANNER_CATALOG", str(folder))
    if not any(c.name == "import-astra" for c in cli.COMMANDS):
        monkeypatch.setattr(cli, "COMMANDS", [*cli.COMMANDS, ImportAstraCommand()])
    return folder


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def import_files(capsys, system: Path, network: Path, name: str, *extra: str
                 ) -> tuple[int, str, str]:
    return run(capsys, "import-astra", str(system), str(network), "--name", name, *extra)


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


# The lab's systems (shared reference NOTES.md section 6.1): system file, network file, NPUs.
LAB_SYSTEMS = [
    ("R4S2-system.json", "R4S2-network.yml", 8),
    ("R4S2rr-system.json", "R4S2-network.yml", 8),
    ("FC8S2-system.json", "FC8S2-network.yml", 16),
    ("R8-system.json", "R8-network.yml", 8),
]


@pytest.mark.parametrize(("system_file", "network_file", "npus"), LAB_SYSTEMS)
def test_import_then_export_gives_back_the_files(capsys, system_file: str, network_file: str,
                                                 npus: int, tmp_path: Path) -> None:
    system_json, network_yml = SYSTEMS / system_file, SYSTEMS / network_file
    code, out, err = import_files(capsys, system_json, network_yml, "imported")
    assert (code, err) == (0, "")
    assert out.startswith(f"wrote system imported ({npus} NPUs")
    c = load_catalog()
    # the lab's model of NOTES.md section 6.1 (tests/data/astra_results.csv), pure dp
    plan = make_plan(c.model("stage-1024x4"), c.system("imported"),
                     TrainingSpec(global_batch=64, seq_len=1024), Strategy(dp=npus),
                     Convention.STAGE)
    files = export_astra(plan)
    # system.json: byte for byte the lab's file
    assert files["system.json"] == system_json.read_text()
    assert json.loads(files["system.json"]) == json.loads(system_json.read_text())
    # network.yml: the same keys and values; byte for byte but for the first (comment) line
    original = network_yml.read_text()
    assert yaml.safe_load(files["network.yml"]) == yaml.safe_load(original)
    assert files["network.yml"].splitlines()[1:] == original.splitlines()[1:]
    # and what ASTRA-sim's keys say, read by the same reader
    (tmp_path / "system.json").write_text(files["system.json"])
    (tmp_path / "network.yml").write_text(files["network.yml"])
    assert load_astra_system(tmp_path / "system.json", tmp_path / "network.yml") == (
        load_astra_system(system_json, network_yml))


def test_imported_system_estimates_as_the_shipped_one(capsys) -> None:
    assert import_files(capsys, *R4S2, "my-r4s2")[0] == 0
    flags = ["--model", "stage-1024x4", "--dp", "8", "--global-batch", "64", "--json"]
    code, mine, err = run(capsys, "estimate", "--system", "my-r4s2", *flags)
    assert (code, err) == (0, "")
    code, shipped, _ = run(capsys, "estimate", "--system", "R4S2", *flags)
    assert code == 0
    # tests/data/astra_results.csv row R4S2_dp8_tp1_pp1_sp1_ws0_rc0: 4,726,894 ns
    assert round(json.loads(mine)["step_time"] * 1e9) == 4_726_894
    assert json.loads(mine)["step_time"] == json.loads(shipped)["step_time"]


def test_catalog_lists_the_imported_system(capsys, user_catalog: Path) -> None:
    assert import_files(capsys, *R4S2, "my-r4s2", "--hbm-gb", "40")[0] == 0
    code, out, _ = run(capsys, "catalog", "systems")
    assert code == 0
    line = next(x for x in out.splitlines() if x.split()[0] == "my-r4s2")
    assert str(user_catalog / "systems" / "my-r4s2.yaml") in line
    device = load_catalog().system("my-r4s2").device
    assert (device.hbm_bytes, device.peak_flops_per_s, device.hbm_bandwidth_bytes_per_s) == (
        40e9, 900e12, 3000e9)


def test_the_cache_sees_a_new_file_and_a_new_folder(capsys, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    assert "later" not in load_catalog().systems
    assert import_files(capsys, *R4S2, "later")[0] == 0
    assert "later" in load_catalog().systems
    monkeypatch.setenv("PLANNER_CATALOG", str(tmp_path / "elsewhere"))
    assert "later" not in load_catalog().systems
    assert "later" not in load_catalog(user=False).systems


def test_user_catalog_folder_from_the_environment(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    assert user_catalog_dir() == tmp_path / "user-catalog"
    monkeypatch.delenv("PLANNER_CATALOG")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert user_catalog_dir() == tmp_path / "xdg" / "parallel-planner" / "catalog"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_catalog_dir() == tmp_path / "home" / ".config" / "parallel-planner" / "catalog"


def test_force_replaces_and_nothing_else_does(capsys, user_catalog: Path) -> None:
    target = user_catalog / "systems" / "mine.yaml"
    assert import_files(capsys, *R4S2, "mine")[0] == 0
    before = target.read_text()
    code, out, err = import_files(capsys, SYSTEMS / "R8-system.json", SYSTEMS / "R8-network.yml",
                                  "mine")
    assert (code, out) == (2, "")
    assert err == (f"planner import-astra: error: {target}: already exists; pass --force to"
                   " replace it\n")
    assert target.read_text() == before
    code, _, _ = import_files(capsys, SYSTEMS / "R8-system.json", SYSTEMS / "R8-network.yml",
                              "mine", "--force")
    assert code == 0
    assert load_catalog().system("mine").devices == 8
    assert files_under(user_catalog) == ["systems", "systems/mine.yaml"]


def test_switches_the_catalog_does_not_keep_are_reported(capsys, tmp_path: Path) -> None:
    data = json.loads(R4S2[0].read_text())
    data["roofline-enabled"] = 0
    del data["trace-enabled"]
    system = tmp_path / "system.json"
    system.write_text(json.dumps(data))
    code, out, _ = import_files(capsys, system, R4S2[1], "noted")
    assert code == 0
    note = out.splitlines()[1]
    assert note.startswith(f"note: {system}: not kept")
    assert "roofline-enabled: 0" in note and "trace-enabled absent" in note


def _bad_field(tmp_path: Path) -> Path:
    data = json.loads(R4S2[0].read_text())
    data["endpoint-delay"] = "ten"
    path = tmp_path / "bad-system.json"
    path.write_text(json.dumps(data))
    return path


BAD = [
    # (system file, network file, extra args, what the one line says)
    (lambda t: t / "absent.json", lambda t: R4S2[1], [], "absent.json: no such file"),
    (_bad_field, lambda t: R4S2[1], [], "bad-system.json: endpoint-delay: must be a number"),
    (lambda t: TUTORIAL, lambda t: SYSTEMS / "R8-network.yml", [],
     "tutorial-system.json: peak-perf: missing; the import needs the NPU's peak"),
    (lambda t: SYSTEMS / "R8-system.json", lambda t: R4S2[1], [],
     "R8-system.json: all-reduce-implementation: lists 1 algorithm(s) but the network has 2"),
    (lambda t: R4S2[0], lambda t: R4S2[1], ["--hbm-gb", "0"], "--hbm-gb: must be a number of GB > 0"),
]


@pytest.mark.parametrize(("system", "network", "extra", "message"), BAD)
def test_bad_input_is_one_line_exit_2_and_nothing_written(capsys, tmp_path: Path,
                                                          user_catalog: Path, system, network,
                                                          extra: list[str], message: str) -> None:
    code, out, err = import_files(capsys, system(tmp_path), network(tmp_path), "bad", *extra)
    assert (code, out) == (2, "")
    assert err.startswith("planner import-astra: error: ") and err.count("\n") == 1
    assert message in err
    assert files_under(user_catalog) == []


@pytest.mark.parametrize("name", ["../escape", ".hidden", "a/b", "x.yaml", ""])
def test_a_name_must_be_a_plain_file_name(capsys, user_catalog: Path, name: str) -> None:
    code, _, err = import_files(capsys, *R4S2, name)
    assert code == 2 and "--name: " in err and "is not a catalog name" in err
    assert files_under(user_catalog) == []


def test_a_shipped_name_is_refused(capsys, user_catalog: Path) -> None:
    code, _, err = import_files(capsys, *R4S2, "R4S2")
    assert code == 2 and err.count("\n") == 1
    assert "--name: R4S2: a shipped system of that name is in" in err
    assert "studies/catalog/systems/astra-lab.yaml; choose another name" in err
    assert files_under(user_catalog) == []


def test_a_name_a_shipped_family_covers_is_refused(capsys, user_catalog: Path) -> None:
    """dgx-h100-64 is 8 nodes of dgx.yaml's dgx-h100-{gpus}: an import must not shadow it."""
    code, _, err = import_files(capsys, *R4S2, "dgx-h100-64")
    assert code == 2 and err.count("\n") == 1
    assert "--name: dgx-h100-64: the shipped family dgx-h100-{gpus} in" in err
    assert files_under(user_catalog) == []


def test_a_name_another_user_file_defines_is_refused(capsys, user_catalog: Path) -> None:
    other = user_catalog / "systems" / "mine.yaml"
    other.parent.mkdir(parents=True)
    other.write_text("taken:\n  device: lab-npu-fast\n  network:\n    - {topology: Ring, npus: 8,"
                     " bandwidth_astra_gbps: 50, latency_us: 0.5}\n")
    code, _, err = import_files(capsys, *R4S2, "taken")
    assert code == 2 and f"--name: taken: already defined in {other}" in err
    assert files_under(user_catalog) == ["systems", "systems/mine.yaml"]


def test_a_clash_between_catalogs_names_both_files(capsys, user_catalog: Path) -> None:
    mine = user_catalog / "systems" / "mine.yaml"
    mine.parent.mkdir(parents=True)
    mine.write_text("lab-system1:\n  device: lab-npu-fast\n  network:\n    - {topology: Ring,"
                    " npus: 8, bandwidth_astra_gbps: 50, latency_us: 0.5}\n")
    with pytest.raises(PlannerUsageError) as e:
        load_catalog()
    assert str(e.value).startswith(f"{mine}: lab-system1: system already defined in ")
    assert str(e.value).endswith("studies/catalog/systems/astra-lab.yaml; rename one")
    code, out, err = run(capsys, "catalog", "systems")
    assert (code, out) == (2, "") and err.count("\n") == 1


def test_an_unwritable_catalog_folder_is_one_line(capsys, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("PLANNER_CATALOG", str(blocker / "catalog"))
    code, out, err = import_files(capsys, *R4S2, "nowhere")
    assert (code, out) == (2, "")
    assert err.count("\n") == 1
    assert "cannot write the user catalog" in err and "set PLANNER_CATALOG" in err
    assert blocker.read_text() == "not a folder"


def test_a_failed_rename_leaves_nothing_behind(capsys, user_catalog: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(src: str, dst: str) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refuse)
    code, _, err = import_files(capsys, *R4S2, "halfway")
    assert code == 2
    assert err == (f"planner import-astra: error: {user_catalog / 'systems'}: cannot write the"
                   " user catalog: Permission denied; set PLANNER_CATALOG to a writable folder\n")
    assert files_under(user_catalog) == ["systems"]
