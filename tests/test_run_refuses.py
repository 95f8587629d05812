"""What `planner run` refuses before a study is made, where it once lost or mixed results:
two studies of one storage file whose names map to one results table (``x+1`` and ``x_1``,
each then showing the other's plans), a name too long for its table's file name, an in-memory
database, a results table given as the storage, and micro-batches in a stage-convention
space."""

from __future__ import annotations

from pathlib import Path

from planner.cli import main

STUDY = Path(__file__).resolve().parent.parent / "studies" / "distir-mlp-16.yaml"


def _study(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{len(list(tmp_path.glob('*.yaml')))}.yaml"
    path.write_text(f"name: {name}\n" + STUDY.read_text())
    return path


def test_a_name_whose_table_another_study_has_is_refused(tmp_path, capsys) -> None:
    storage = tmp_path / "s.journal"
    assert main(["run", str(_study(tmp_path, "x+1")), "--storage", str(storage), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["run", str(_study(tmp_path, "x_1")), "--storage", str(storage), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "study 'x_1': its results table would be the one of stored study" \
        " 'x+1'" in err[0]
    assert main(["studies", "--storage", str(storage)]) == 0
    assert "x_1" not in capsys.readouterr().out  # not made
    # a folder of studies gives each its own journal, so its own table: both run
    folder = f"{tmp_path / 'folder'}/"
    for name in ("x+1", "x_1"):
        assert main(["run", str(_study(tmp_path, name)), "--storage", folder, "--quiet"]) == 0


def test_a_name_too_long_for_its_table_is_refused_before_the_study_is_made(tmp_path, capsys):
    # a folder of studies: NAME.journal, its table NAME.journal.NAME.parquet, 2 x 150 + 17 = 317
    # bytes over a file name's 255: "failed: OSError: File name too long", and the study left
    # behind empty, so the rerun said it "already exists"
    folder = f"{tmp_path / 'folder'}/"
    study = _study(tmp_path, "a" * 150)
    for _ in range(2):
        assert main(["run", str(study), "--storage", folder, "--quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "its results table's file name would be 317 bytes, over the" \
            " 255 a file name holds; shorten the study's name" in err[0]
    assert not (tmp_path / "folder").exists()  # no empty journal left behind (stop 82's was)


def test_an_in_memory_database_is_refused(tmp_path, capsys, monkeypatch) -> None:
    # the run printed its best plans and "more: planner best ... --storage sqlite:///%3Amemory%3A"
    # for a study already gone, and left ./:memory:.NAME.parquet behind
    monkeypatch.chdir(tmp_path)
    for url in ("sqlite:///:memory:", "sqlite://"):
        assert main(["run", str(STUDY), "--storage", url, "--quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--storage {url}: an in-memory database" in err[0]
    assert not list(tmp_path.iterdir())


def test_a_results_table_is_not_a_storage(tmp_path, capsys) -> None:
    # --storage JOURNAL.NAME.parquet (the table's folder) was read as a folder of studies: a
    # journal was written into the table, which pandas then could not read
    storage = tmp_path / "s.journal"
    study = _study(tmp_path, "t")
    assert main(["run", str(study), "--storage", str(storage), "--quiet"]) == 0
    capsys.readouterr()
    table = tmp_path / "s.journal.t.parquet"
    table.mkdir(exist_ok=True)
    before = sorted(p.name for p in table.iterdir())
    for argv in (["run", str(study), "--quiet"], ["studies"]):
        assert main([*argv, "--storage", f"{table}/"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "a study's results table, the folder beside its journal" in err[0]
    assert sorted(p.name for p in table.iterdir()) == before


def test_a_stage_study_takes_no_micro_batches(tmp_path, capsys) -> None:
    # STAGE's graph takes the step's whole batch: micro_batch [1, 2] gave each plan twice with
    # the same figures, and micro_batch 1000000000 was ranked the best plan
    lab = Path(__file__).resolve().parent.parent / "studies" / "lab4b-llama70b-system1.yaml"
    study = tmp_path / "mb.yaml"
    study.write_text(lab.read_text().replace("space:\n", "space:\n  micro_batch: [1, 2]\n", 1))
    assert main(["run", str(study), "--storage", str(tmp_path / "s.journal"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "space.micro_batch: the stage convention runs STAGE's graph, which" \
        " has no micro-batches" in err[0]


def test_a_gp_study_without_pytorch_names_its_file_and_stores_nothing(tmp_path, capsys,
                                                                     monkeypatch) -> None:
    # GPSampler needs PyTorch and SciPy (Optuna's optional dependencies; pyproject's `gp`
    # extra): the message named no file, and only after the storage was opened
    import planner.run_common

    real = planner.run_common.find_spec
    monkeypatch.setattr(planner.run_common, "find_spec",
                        lambda name: None if name == "torch" else real(name))
    study = tmp_path / "gp.yaml"
    study.write_text(STUDY.read_text().replace("sampler: exhaustive", "sampler: gp"))
    storage = tmp_path / "s.journal"
    assert main(["run", str(study), "--storage", str(storage), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"planner run: error: {study}: sampler: gp needs PyTorch: pip install"
                   " 'parallel-planner[gp]' (or choose tpe)"]
    assert not storage.exists()
