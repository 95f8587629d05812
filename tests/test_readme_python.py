"""The README's Python example (section "`planner estimate`") runs as written and agrees with
`planner estimate` on the same plan: the CLI and the library are one path."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

from planner.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def _example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    (block,) = [b for b in blocks if "framework_training" in b]
    return block


def test_the_readme_python_example_runs_and_matches_the_cli(capsys) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(_example(), "README.md", "exec"), {})  # noqa: S102 (the README's own code)
    step = float(out.getvalue().split(" s a step")[0])
    assert main(["estimate", "--model", "llama3-70b", "--system", "dgx-h100-1024", "--dp", "8",
                 "--tp", "8", "--pp", "16", "--micro-batch", "1", "--global-batch", "1024",
                 "--seq-len", "8192", "--schedule", "interleaved", "--v", "5", "--recompute",
                 "selective", "--framework", "megatron", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert round(cli["step_time"], 2) == step
    assert "fits: True" in out.getvalue()
