"""``--debug`` before or after the command shows the traceback of an unexpected failure (the
command's own flag, false by default, overrode ``planner --debug COMMAND``'s)."""

from __future__ import annotations

import pytest

from planner.cli import main


@pytest.mark.parametrize("argv", [["--debug", "studies"], ["studies", "--debug"], ["studies"]])
def test_debug_either_side_of_the_command(argv, capsys, monkeypatch, tmp_path) -> None:
    from planner.commands._results import StudiesCommand

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(StudiesCommand, "run", broken)
    assert main([*argv, "--storage", str(tmp_path / "s.journal")]) == 1
    err = capsys.readouterr().err
    debug = "--debug" in argv
    assert ("Traceback" in err) is debug and ("rerun with --debug" in err) is not debug
