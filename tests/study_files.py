"""Small study YAMLs for the tests, written into a temporary folder."""

from __future__ import annotations

from pathlib import Path

LAB_MEGATRON = """\
name: {name}
model: llama70b
system: lab-system1
training: {{global_batch: 512, seq_len: 1024}}
hbm_gb: {hbm}
objectives: {objectives}
sampler: {sampler}
n_trials: {n_trials}
seed: 3
space:
  tp: powers_of_two
  sp: powers_of_two
  recompute: [none, full]
"""


def lab_study(tmp: Path, name: str = "lab", *, sampler: str = "exhaustive", hbm: str = "80",
              objectives: str = "[step_time]", n_trials: int = 20) -> Path:
    """The lab's 56 strategies for Llama-70B on lab-system1, megatron convention (fast)."""
    path = tmp / f"{name}.yaml"
    path.write_text(LAB_MEGATRON.format(name=name, sampler=sampler, hbm=hbm,
                                        objectives=objectives, n_trials=n_trials))
    return path


def one_run(tmp: Path, columns: dict[str, object]):
    """The one measured run of a CSV with these columns (header, then one row), read with the
    default catalog; asserts it was not skipped."""
    from planner.catalog import load_catalog
    from planner.runs_csv import read_runs

    path = tmp / "runs.csv"
    path.write_text(",".join(columns) + "\n" + ",".join(map(str, columns.values())) + "\n")
    runs, skipped = read_runs(path, load_catalog())
    assert not skipped, skipped
    return runs[0]
