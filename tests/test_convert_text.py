"""``planner convert-text``: traces that would not fit on the disk are refused before any is
written, and an interrupted or failed conversion leaves no partial set behind (a partial set
replays as a smaller cluster)."""

from __future__ import annotations

import shutil
from pathlib import Path

from planner.cli import EXIT_INTERRUPTED, main

WORKLOAD = "DATA\n1\nl -1 10 NONE 0 10 NONE 0 10 ALLREDUCE 1024 1\n"


def _workload(tmp_path: Path) -> Path:
    path = tmp_path / "w.txt"
    path.write_text(WORKLOAD)
    return path


def test_traces_that_do_not_fit_on_the_disk_are_refused_first(tmp_path, capsys, monkeypatch):
    # 1,000,000 traces of a few hundred bytes each: several hundred MB, where 1 MB is free
    free = shutil.disk_usage(tmp_path)._replace(free=1_000_000)
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: free)
    out = tmp_path / "traces" / "w"
    assert main(["convert-text", str(_workload(tmp_path)), "--num-npus", "1000000",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--num-npus 1,000,000: 1,000,000 traces of" in err[0]
    assert "and --out's disk has 0.0 GB free" in err[0]
    assert not list(out.parent.iterdir())


def test_an_interrupted_conversion_leaves_no_traces(tmp_path, capsys, monkeypatch):
    written = []
    real = Path.write_bytes

    def write_then_interrupt(self: Path, data: bytes) -> int:
        if len(written) == 3:
            raise KeyboardInterrupt
        written.append(self)
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", write_then_interrupt)
    assert main(["convert-text", str(_workload(tmp_path)), "--num-npus", "8",
                 "--out", str(tmp_path / "w")]) == EXIT_INTERRUPTED
    assert len(written) == 3 and not list(tmp_path.glob("w.*.et"))
    monkeypatch.setattr(Path, "write_bytes", real)
    assert main(["convert-text", str(_workload(tmp_path)), "--num-npus", "8",
                 "--out", str(tmp_path / "w")]) == 0
    assert len(list(tmp_path.glob("w.*.et"))) == 8
