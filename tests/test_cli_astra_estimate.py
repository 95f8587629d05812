"""`planner astra-estimate`: ASTRA-sim input files + a STAGE command line in, one JSON object
out; bad input is one line on stderr and exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner import cli
from planner.commands._astra_estimate import AstraEstimateCommand

SYSTEMS = Path(__file__).parent / "data" / "astra_systems"
SYSTEM = SYSTEMS / "R4S2-system.json"
NETWORK = SYSTEMS / "R4S2-network.yml"
# the lab's model of NOTES.md section 6.1, as its scripts pass it to STAGE main.py
MODEL = ["--din", "32000", "--dout", "32000", "--dmodel", "1024", "--dff", "4096", "--head",
         "16", "--seq", "1024", "--batch", "64", "--num_stacks", "4"]


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register the command for these tests if planner.commands does not list it yet."""
    if not any(c.name == "astra-estimate" for c in cli.COMMANDS):
        monkeypatch.setattr(cli, "COMMANDS", [*cli.COMMANDS, AstraEstimateCommand()])


def run(capsys, *stage_flags: str, system: Path = SYSTEM, network: Path = NETWORK
        ) -> tuple[int, str, str]:
    code = cli.main(["astra-estimate", "--system-json", str(system), "--network-yml",
                     str(network), "--", *stage_flags])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_report(capsys) -> None:
    # tests/data/astra_results.csv row R4S2_dp4_tp2_pp1_sp1_ws0_rc0, with the lab script's
    # output flags passed through and booleans in both spellings
    code, out, err = run(capsys, "--dp", "4", "--tp", "2", "--pp", "1", "--sp", "1",
                         "--weight_sharded", "0", "--activation_recompute", "False", *MODEL,
                         "--output_dir", "out", "--output_name", "w", "--comm_group_file",
                         "cg.json")
    assert (code, err) == (0, "")
    data = json.loads(out)
    assert list(data) == ["wall_time", "gpu_time", "comm_time", "exposed_comm",
                          "peak_memory_usage", "max_wall_time_all_ranks",
                          "max_peak_memory_all_ranks", "compute_bound_pct",
                          "avg_compute_util_pct", "avg_mem_util_pct", "avg_op_intensity", "et0"]
    assert list(data["et0"]) == ["n_comp", "sum_num_ops", "sum_tensor_size", "n_AR", "AR_size",
                                 "n_AG", "AG_size", "n_RS", "RS_size", "n_A2A", "A2A_size",
                                 "n_send", "send_size", "n_recv", "recv_size"]
    # measured: sys0 wall 14,925,334 ns, GPU 4,671,062 ns, peak 1,452,146,688 units; 44 AGs
    assert (data["wall_time"], data["gpu_time"], data["peak_memory_usage"]) == (
        14_925_334, 4_671_062, 1_452_146_688)
    assert data["et0"]["n_AG"] == 44
    # the lab's sys[0] metrics, measured (ASTRA-sim prints them to 3 decimals): compute bound
    # 65.283%, compute utilisation 70.210%, memory utilisation 68.372%, intensity 435.711
    got = [round(data[k], 3) for k in ("compute_bound_pct", "avg_compute_util_pct",
                                       "avg_mem_util_pct", "avg_op_intensity")]
    assert got == [65.283, 70.21, 68.372, 435.711]


def test_flag_equals_value_spelling(capsys) -> None:
    # results.csv row R8_dp8_tp1_pp1_sp1_ws1_rc0: wall 4,692,132 ns
    code, out, _ = run(capsys, "--dp=8", "--weight_sharded=True", *MODEL,
                       system=SYSTEMS / "R8-system.json", network=SYSTEMS / "R8-network.yml")
    assert code == 0
    assert json.loads(out)["wall_time"] == 4_692_132


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--dp", "4", *MODEL], "--dp * --tp * --sp * --pp must equal the 8 NPUs"),
        (["--dp", "8", "--vocab", "3", *MODEL], "--vocab: not a STAGE main.py flag"),
        (["--dp", "eight", *MODEL], "--dp: 'eight' is not a whole number"),
        (["--dp", "8", "--weight_sharded", "maybe", *MODEL], "use 0/1 or True/False"),
        # Batch/dp * Seq/sp * Dmodel/tp = 4/8 * 1 * 1 = 0.5: STAGE would write a size of 0
        (["--dp", "8", *MODEL, "--batch", "4", "--seq", "1", "--dmodel", "1"],
         "below one element per rank"),
        (["--dp", "8", *MODEL, "--num_stacks", "1"], "num_stacks >= 2"),
        (["--dp", "8", *MODEL, "--batch"], "--batch: missing its value"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, flags: list[str], message: str) -> None:
    code, out, err = run(capsys, *flags)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and message in err


def test_system_without_roofline(capsys, tmp_path: Path) -> None:
    data = json.loads(SYSTEM.read_text())
    del data["peak-perf"]
    system = tmp_path / "system.json"
    system.write_text(json.dumps(data))
    code, _, err = run(capsys, "--dp", "8", *MODEL, system=system)
    assert code == 2 and "peak-perf" in err
