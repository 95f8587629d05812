"""Start-up cost of the command line (issue 19: "every command, ``--help`` included, pays about
1 s of imports"): ``--help`` and the light commands never import Optuna, pandas or plotly."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("optuna", "pandas", "plotly")

ESTIMATE = ["estimate", "--model", "llama3-70b", "--system", "dgx-h100-1024", "--dp", "8",
            "--tp", "8", "--pp", "16", "--micro-batch", "1", "--global-batch", "1024"]


def heavy_modules_after(argv: list[str], tmp_path) -> tuple[int, list[str]]:
    """Run ``main(argv)`` in a fresh interpreter; its exit code and the heavy modules it loaded."""
    code = (
        "import json, sys\n"
        "from planner.cli import main\n"
        f"code = main({argv!r})\n"
        f"print(json.dumps([code, [m for m in {HEAVY!r} if m in sys.modules]]), file=sys.stderr)\n"
    )
    env = {"PLANNER_STORAGE": str(tmp_path / "s.journal"), "PLANNER_CATALOG": str(tmp_path / "c"),
           "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, check=False, timeout=120)
    exit_code, loaded = json.loads(done.stderr.strip().splitlines()[-1])
    return exit_code, loaded


@pytest.mark.parametrize("argv", [
    ["--help"],
    ["estimate", "--help"],
    ["collective", "--help"],
    ["astra-estimate", "--help"],
    ESTIMATE,
    [*ESTIMATE, "--json"],
    ["catalog", "devices"],
    ["catalog", "models"],
    ["catalog", "systems"],
], ids=lambda argv: " ".join(argv[:2] + argv[-1:]))
def test_help_and_light_commands_import_no_optuna_pandas_or_plotly(argv, tmp_path):
    exit_code, loaded = heavy_modules_after(argv, tmp_path)
    assert exit_code == 0
    assert loaded == []


def test_the_parser_is_built_without_importing_any_command_module():
    code = ("import sys\nfrom planner.cli import build_parser\nbuild_parser()\n"
            "print(sorted(m for m in sys.modules if m.startswith(('planner.commands.', 'simcore'))"
            " and m != 'planner.commands._base'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120)
    assert done.stdout.strip() == "[]"


def test_every_command_s_listed_name_and_help_are_its_own():
    # The registry names and describes each command without importing it; the class says the same
    from planner.commands import COMMANDS

    for entry in COMMANDS:
        command = entry.command  # imports the module
        assert (entry.name, entry.help) == (command.name, command.help)


def test_the_catalog_table_is_the_one_pandas_printed():
    import pandas as pd

    from planner.outputs import text_table

    rows = [{"name": "h100-sxm", "peak TFLOP/s": 989.4, "HBM GB": 80.0, "layers": 80,
             "file": "studies/catalog/devices/gpus.yaml"},
            {"name": "t4", "peak TFLOP/s": 65.0, "HBM GB": 16.0, "layers": -2, "file": "x"},
            {"name": "odd", "peak TFLOP/s": 1 / 3, "HBM GB": 0.1 + 0.2, "layers": 10**9,
             "file": "y" * 70}]
    assert text_table(rows) == pd.DataFrame(rows).to_string(index=False)
    # beyond the simple rules (scientific notation, NaN): pandas prints it
    odd = [{"a": 1e7, "b": float("nan")}, {"a": 1e-9, "b": 2.0}]
    assert text_table(odd) == pd.DataFrame(odd).to_string(index=False)


def test_outputs_and_storage_name_the_same_results_folder():
    # planner.outputs defines it so that writing a file does not import Optuna (planner.storage)
    from planner import outputs, storage

    assert outputs.RESULTS_DIR == storage.RESULTS_DIR
