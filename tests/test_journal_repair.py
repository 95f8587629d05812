"""A damaged journal (issue 20 #12): a garbage last line is cut before the next write, and
`planner repair` keeps every valid entry when garbage sits between entries."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from planner.cli import main
from tests.study_files import lab_study


def _trials(journal: Path) -> dict[str, int]:
    storage = JournalStorage(JournalFileBackend(str(journal)))
    return {name: len(optuna.load_study(study_name=name, storage=storage).trials)
            for name in optuna.get_all_study_names(storage)}


def _run(tmp_path: Path, journal: Path, name: str) -> int:
    path = lab_study(tmp_path)
    path.write_text(path.read_text().replace("name: lab", f"name: {name}"))
    return main(["run", str(path), "--storage", str(journal), "--quiet"])


def test_a_garbage_last_line_is_cut_before_the_next_write(tmp_path, capsys) -> None:
    journal = tmp_path / "s.journal"
    assert _run(tmp_path, journal, "first") == 0
    with open(journal, "ab") as f:
        f.write(b"{not json ZQX\n")  # Optuna skips a bad last line when it reads ...
    assert _run(tmp_path, journal, "second") == 0  # ... and the planner cuts it before writing
    capsys.readouterr()
    assert b"ZQX" not in journal.read_bytes()
    assert _trials(journal) == {"first": 56, "second": 56}


def test_repair_keeps_every_entry_around_garbage(tmp_path, capsys) -> None:
    journal = tmp_path / "s.journal"
    assert _run(tmp_path, journal, "first") == 0
    lines = journal.read_bytes().splitlines(keepends=True)
    damaged = b"".join(lines[:30] + [b"\x00\x00 not an entry\n"] + lines[30:])
    journal.write_bytes(damaged)
    capsys.readouterr()
    assert main(["studies", "--storage", str(journal)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"planner repair {journal}" in err[0]
    assert main(["repair", str(journal)]) == 0
    out = capsys.readouterr().out
    assert f"kept {len(lines):,} entries, dropped 1 line(s)" in out and "line 31" in out
    assert journal.with_name("s.journal.bak").read_bytes() == damaged
    assert journal.read_bytes() == b"".join(lines)
    assert _trials(journal) == {"first": 56}
    assert main(["repair", str(journal)]) == 0
    assert "nothing to repair" in capsys.readouterr().out


def test_json_that_is_not_an_entry_is_named_and_repaired(tmp_path, capsys) -> None:
    # Optuna's replay reads each operation's keys by name (JournalStorageReplayResult): a line
    # of valid JSON without them stopped every reader with a KeyError, wherever it sat.
    journal = tmp_path / "s.journal"
    assert _run(tmp_path, journal, "first") == 0
    lines = journal.read_bytes().splitlines(keepends=True)
    bad = [b'{"x": 1}\n', b'{"op_code": 11, "worker_id": "w"}\n',
           b'{"op_code": 4, "worker_id": "w", "datetime_start": null}\n',  # no study_id
           b'{"op_code": 2, "worker_id": "w", "study_id": "0", "user_attr": {}}\n']
    for line, where in [(b, i) for b in bad for i in (10, len(lines))]:
        journal.write_bytes(b"".join(lines[:where] + [line] + lines[where:]))
        capsys.readouterr()
        assert main(["studies", "--storage", str(journal)]) == 2, line
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"planner repair {journal}" in err[0], err
        assert main(["repair", str(journal)]) == 0
        assert f"line {where + 1}" in capsys.readouterr().out
        assert journal.read_bytes() == b"".join(lines)
    assert _trials(journal) == {"first": 56}


def test_a_second_repair_keeps_the_first_ones_copy(tmp_path, capsys) -> None:
    # JOURNAL.bak is the only copy of the lines a repair dropped: a later repair writes
    # JOURNAL.bak.1 beside it (it replaced JOURNAL.bak before)
    journal = tmp_path / "s.journal"
    assert _run(tmp_path, journal, "first") == 0
    lines = journal.read_bytes().splitlines(keepends=True)
    first = b"".join(lines[:5] + [b"first damage\n"] + lines[5:])
    second = b"".join(lines[:7] + [b"second damage\n"] + lines[7:])
    for damaged in (first, second):
        journal.write_bytes(damaged)
        assert main(["repair", str(journal)]) == 0
    out = capsys.readouterr().out
    assert f"the file as it was is {journal}.bak.1" in out
    assert journal.with_name("s.journal.bak").read_bytes() == first
    assert journal.with_name("s.journal.bak.1").read_bytes() == second
    assert journal.read_bytes() == b"".join(lines)
