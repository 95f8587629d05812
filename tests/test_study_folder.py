"""Issue 19 item 1: the default storage is a folder of studies, one journal each, so a command on
one study reads only that study; `planner studies` keeps each row while its journal is
unchanged; an earlier version's single journal stays the default where the folder is absent."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from planner import study_summary
from planner.cli import main
from planner.storage import DEFAULT_STORAGE, LEGACY_STORAGE, storage_label
from planner.study_folder import folder_studies, is_folder, study_storage
from tests.study_files import lab_study


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A fresh working folder with the default storage (no $PLANNER_STORAGE)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PLANNER_STORAGE", raising=False)
    return tmp_path


def _journal_studies(path: Path) -> list[str]:
    backend = optuna.storages.journal.JournalFileBackend(str(path))
    return optuna.get_all_study_names(optuna.storages.JournalStorage(backend))


def test_each_study_has_its_own_journal_in_the_default_folder(here, capsys):
    for name in ("alpha", "beta"):
        assert main(["run", str(lab_study(here, name)), "--quiet"]) == 0
    folder = here / DEFAULT_STORAGE
    assert sorted(p.name for p in folder.glob("*.journal")) == ["alpha.journal", "beta.journal"]
    assert _journal_studies(folder / "alpha.journal") == ["alpha"]
    assert _journal_studies(folder / "beta.journal") == ["beta"]
    capsys.readouterr()
    assert main(["best", "beta", "--top", "2"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 3  # header and two plans
    assert main(["best", "gamma"]) == 2
    err = capsys.readouterr().err
    assert "no study named 'gamma'" in err and "alpha, beta" in err


def test_a_command_on_one_study_never_reads_another_journal(here, capsys):
    for name in ("alpha", "beta"):
        assert main(["run", str(lab_study(here, name)), "--quiet"]) == 0
    alpha = here / DEFAULT_STORAGE / "alpha.journal"
    lines = alpha.read_text().splitlines(keepends=True)
    alpha.write_text(lines[0] + "not a journal entry\n" + "".join(lines[1:]))  # unreadable
    assert main(["best", "alpha"]) == 2 and "planner repair" in capsys.readouterr().err
    for argv in (["best", "beta"], ["trials", "beta"],
                 ["show", "beta", "--plan", "1", "--out", str(here / "t.html")]):
        assert main(argv) == 0, (argv, capsys.readouterr().err)


def test_planner_studies_lists_the_healthy_studies_beside_a_damaged_one(here, capsys):
    for name in ("alpha", "beta"):
        assert main(["run", str(lab_study(here, name)), "--quiet"]) == 0
    (here / DEFAULT_STORAGE / ".summaries.json").unlink()  # every row read anew
    alpha = here / DEFAULT_STORAGE / "alpha.journal"
    lines = alpha.read_text().splitlines(keepends=True)
    alpha.write_text(lines[0] + "not a journal entry\n" + "".join(lines[1:]))
    capsys.readouterr()
    assert main(["studies"]) == 1  # a study to repair: a failure, the rest still listed
    out, err = capsys.readouterr()
    assert "beta" in out and "alpha" not in out
    assert err.startswith("planner studies: study 'alpha': ") and "planner repair" in err
    assert len(err.strip().splitlines()) == 1


def test_planner_studies_caches_each_row_while_its_journal_is_unchanged(here, capsys,
                                                                         monkeypatch):
    for name in ("alpha", "beta"):
        assert main(["run", str(lab_study(here, name)), "--quiet"]) == 0
    # each run left its study's row in the cache: planner studies reads no journal
    cache = json.loads((here / DEFAULT_STORAGE / study_summary.CACHE).read_text())
    assert sorted(cache["journals"]) == ["alpha.journal", "beta.journal"]
    read: list[str] = []
    real = study_summary.study_row
    monkeypatch.setattr(study_summary, "study_row",
                        lambda study: read.append(study.study_name) or real(study))
    capsys.readouterr()
    assert main(["studies"]) == 0
    first = capsys.readouterr().out
    assert "alpha" in first and "beta" in first and " 56 " in first and read == []
    (here / DEFAULT_STORAGE / study_summary.CACHE).unlink()  # without it, every journal is read
    assert main(["studies"]) == 0
    assert capsys.readouterr().out == first and sorted(read) == ["alpha", "beta"]
    read.clear()
    assert main(["studies"]) == 0  # the cache is back
    assert capsys.readouterr().out == first and read == []
    # a journal that changed is read again (and only it)
    (here / DEFAULT_STORAGE / "beta.journal").touch()  # as a run writing to it would
    capsys.readouterr()
    assert main(["studies"]) == 0
    assert read == ["beta"]


def test_a_name_unsafe_as_a_file_name_gets_a_file_of_its_own(tmp_path):
    folder = str(tmp_path) + "/"
    assert is_folder(folder)
    odd, plain = study_storage(folder, "a/b: c"), study_storage(folder, "a_b__c")
    assert odd != plain and Path(odd).parent == tmp_path and "/" not in Path(odd).name
    for name, where in (("a/b: c", odd), ("a_b__c", plain)):
        optuna.create_study(study_name=name, storage=optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(where)))
    assert {n: p.name for n, p in folder_studies(folder).items()} == {
        "a/b: c": Path(odd).name, "a_b__c": Path(plain).name}


def test_an_earlier_versions_journal_stays_the_default(here, capsys):
    legacy = here / LEGACY_STORAGE
    legacy.parent.mkdir(parents=True)
    assert main(["run", str(lab_study(here, "old")), "--quiet", "--storage", str(legacy)]) == 0
    assert storage_label(None) == str(LEGACY_STORAGE)
    assert main(["run", str(lab_study(here, "new")), "--quiet"]) == 0
    assert sorted(_journal_studies(legacy)) == ["new", "old"]
    assert not (here / DEFAULT_STORAGE).exists()
    capsys.readouterr()
    assert main(["studies"]) == 0
    out = capsys.readouterr().out
    assert "old" in out and "new" in out


def test_a_file_storage_still_holds_several_studies(tmp_path, capsys):
    journal = tmp_path / "s.journal"
    for name in ("alpha", "beta"):
        assert main(["run", str(lab_study(tmp_path, name)), "--quiet", "--storage",
                     str(journal)]) == 0
    assert sorted(_journal_studies(journal)) == ["alpha", "beta"]
    capsys.readouterr()
    assert main(["studies", "--storage", str(journal)]) == 0
    assert "alpha" in capsys.readouterr().out


def test_planner_studies_from_cached_rows_imports_no_optuna_or_pandas(here, tmp_path):
    # Issue 19: the rows a run left in the cache are printed without Optuna or pandas (both
    # about a second of imports); the test of the command line's start-up does the counting
    from tests.test_cli_startup import heavy_modules_after

    for name in ("alpha", "beta"):
        assert main(["run", str(lab_study(here, name)), "--quiet"]) == 0
    folder = str(here / DEFAULT_STORAGE) + "/"
    code, loaded = heavy_modules_after(["studies", "--storage", folder], tmp_path)
    assert code == 0 and loaded == []
