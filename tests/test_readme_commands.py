"""The README's commands, top to bottom, as a newcomer on a fresh clone runs them (issue 19).

Every ``planner ...`` line of the README's code blocks (the set-up line's ``planner run`` first)
runs in order in an empty folder that sees the repository's ``studies/`` and ``tests/``, with
its own storage and catalog. A line that names a file of the reader's own (``my-runs.csv``,
``system.json``) or a placeholder (``DIR``, ``SIZE``) is left out, as is the PostgreSQL worker
and what reads its study; ``a | b`` runs each alternative and ``[--json]`` is left off.
"""

from __future__ import annotations

import glob
import re
import shlex
from pathlib import Path

import pytest

from planner.cli import main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

LEFT_OUT = ("planner worker", "best llama3-70b-h100-1024", "import-astra system.json",
            "import-metis hostfile", "my-runs.csv", "replay DIR", "workload_text.txt", " SIZE")
"""Lines that need what a fresh clone does not have (a database, the reader's own files)."""


def _code_lines(text: str) -> list[str]:
    """The lines of the README's fenced code blocks, continuation lines joined."""
    out, inside, pending = [], False, ""
    for line in text.split("\n"):
        if line.startswith("```"):
            inside = not inside
            continue
        if not inside:
            continue
        line = f"{pending} {line.strip()}" if pending else line
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        out.append(line.strip())
    return out


def readme_commands(text: str) -> list[str]:
    """The README's planner commands in order: the set-up line's, then every code block's."""
    setup = re.search(r"pip install[^\n]*", text)
    first = [p.strip() for p in setup.group(0).split("&&")] if setup else []
    lines = first + _code_lines(text)
    commands = []
    for line in lines:
        if not line.startswith("planner ") or any(s in line for s in LEFT_OUT):
            continue
        line = re.sub(r"\s+#.*$", "", line)
        line = re.sub(r"\s*\[[^\]]*\]", "", line)
        m = re.fullmatch(r"(planner \S+) (\w+(?: \| \w+)+)", line)
        if m:
            commands += [f"{m.group(1)} {alt}" for alt in m.group(2).split(" | ")]
        else:
            commands.append(line)
    return commands


def _argv(command: str, folder: Path) -> list[str]:
    args = []
    for word in shlex.split(command)[1:]:
        found = sorted(glob.glob(str(folder / word))) if "*" in word else []
        args.append(found[0] if found else word)
    return args


def test_the_readme_holds_the_commands_a_newcomer_runs() -> None:
    commands = readme_commands(README.read_text())
    assert commands[0] == "planner run studies/lab4b-llama70b-system1.yaml"
    for verb in ("best", "trials", "pareto", "show", "compare", "export", "report", "estimate",
                 "validate", "mixed", "astra-estimate", "replay", "collective"):
        assert any(c.startswith(f"planner {verb} ") for c in commands), verb


def test_every_readme_command_runs_top_to_bottom(tmp_path: Path, monkeypatch, capsys) -> None:
    for name in ("studies", "tests"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PLANNER_CATALOG", str(tmp_path / "catalog"))
    monkeypatch.delenv("PLANNER_STORAGE", raising=False)
    for command in readme_commands(README.read_text()):
        code = main(_argv(command, tmp_path))
        out = capsys.readouterr()
        assert code == 0, f"{command}: exit {code}: {out.err.strip()[-300:]}"


@pytest.mark.parametrize(("text", "expected"), [
    ("```sh\nplanner catalog models | systems\n```", ["planner catalog models",
                                                     "planner catalog systems"]),
    ("```\nplanner estimate --a 1 \\\n    --b 2 [--json]   # note\n```",
     ["planner estimate --a 1 --b 2"]),
    ("planner run outside.yaml\n```yaml\nx: 1\n```\n", []),
])
def test_the_reader_of_code_blocks(text: str, expected: list[str]) -> None:
    assert readme_commands(text) == expected
