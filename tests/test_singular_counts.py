"""One trial, one file: counts that can be 1 say so in the singular (planner.outputs.counted)."""

from __future__ import annotations

from pathlib import Path

from planner.cli import main
from planner.commands._export import _listing

STUDY = """model: llama3-8b
system: kempner-h200-8
training: {global_batch: 32, seq_len: 4096}
sampler: tpe
n_trials: 1
space: {tp: [1, 2], pp: [1]}
"""


def test_a_one_trial_run_says_trial(tmp_path: Path, capsys) -> None:
    study = tmp_path / "one.yaml"
    study.write_text(STUDY)
    assert main(["run", str(study), "--storage", str(tmp_path / "one.db")]) == 0
    out = capsys.readouterr().out
    assert "; 1 trial of tpe\n" in out
    assert "\n1 trial in " in out
    assert "1 trials" not in out


def test_an_export_listing_counts_one_file_in_the_singular() -> None:
    files = {"plan.yaml": "", "traces/a.et": b"", "groups/g.json": "", "groups/h.json": ""}
    assert _listing(files) == "groups/ (2 files), traces/ (1 file), plan.yaml"
