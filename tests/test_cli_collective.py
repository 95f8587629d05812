"""`planner collective`: ASTRA-sim's own input files in, ASTRA-sim's answer out; bad input is
one line on stderr and exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main

STUDIES = Path(__file__).resolve().parents[1] / "studies" / "astra"
SYSTEM = STUDIES / "tutorial-system.json"
NETWORK = STUDIES / "tutorial-ring8.yml"


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_tutorial_all_reduce(capsys) -> None:
    # NOTES.md 3.2: the ASTRA-sim tutorial case reports 117,780 ns
    code, out, _ = run(capsys, "collective", "all-reduce", "1MiB", "--system-json", str(SYSTEM),
                       "--network-yml", str(NETWORK))
    assert (code, out.strip()) == (0, "117780 ns")


def test_json_output_has_time_and_phases(capsys) -> None:
    # microbench.csv row tutorial_reduce_scatter_1MB_8npu_ring: 86,420 ns
    code, out, _ = run(capsys, "collective", "reduce-scatter", "1048576", "--system-json",
                       str(SYSTEM), "--network-yml", str(NETWORK), "--json")
    data = json.loads(out)
    assert code == 0
    assert data["time_ns"] == 86_420
    # 4 chunks of 262,144 B, one ring phase each: 10 + 7 * (1,110 + 10 + 1,965) = 21,605
    assert (data["chunks"], data["chunk_bytes"]) == (4, 262_144)
    assert [p["time_ns_per_chunk"] for p in data["phases"]] == [21_605]


def test_sub_group_option(capsys) -> None:
    # hand derivation in tests/test_collectives_astra.py::test_sub_group_ring_by_hand
    code, out, _ = run(capsys, "collective", "all-reduce", "1MiB", "--system-json", str(SYSTEM),
                       "--network-yml", str(NETWORK), "--group", "0,2,4,6")
    assert (code, out.strip()) == (0, "100720 ns")


def test_congestion_aware_option(capsys) -> None:
    # microbench.csv: tutorial all-to-all, Congestion_Aware, 125,480 ns (equal to unaware: one
    # chunk at a time, neighbour links only)
    code, out, _ = run(capsys, "collective", "all-to-all", "1MiB", "--system-json", str(SYSTEM),
                       "--network-yml", str(NETWORK), "--congestion", "aware")
    assert (code, out.strip()) == (0, "125480 ns")


def _write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


GOOD_NETWORK = "topology: [Ring]\nnpus_count: [8]\nbandwidth: [50]\nlatency: [500]\n"


def _system(**changes: object) -> str:
    data = json.loads(SYSTEM.read_text())
    for key, value in changes.items():
        key = key.replace("_", "-")
        if value is None:
            del data[key]
        else:
            data[key] = value
    return json.dumps(data)


BAD_INPUTS = [
    # (system json, network yml, extra args, what the one-line error must name)
    (_system(), GOOD_NETWORK.replace("Ring", "Hypercube"), [], "topology[0]"),
    (_system(all_reduce_implementation=["ringg"]), GOOD_NETWORK, [],
     "all-reduce-implementation[0]"),
    (_system(), GOOD_NETWORK, ["--group", "0,9"], "rank=9"),
    (_system(), GOOD_NETWORK, ["--group", "0,x"], "--group"),
    (_system(), "topology: [Ring, Switch]\nnpus_count: [8]\nbandwidth: [50, 50]\n"
     "latency: [500, 500]\n", [], "npus_count"),
    (_system(), GOOD_NETWORK, [], None),  # control: this one works
    (_system(endpoint_delay=None), GOOD_NETWORK, [], "endpoint-delay"),
    (_system(), "topology: [Ring]\nnpus_count: [8]\nbandwidth: [50]\n", [], "latency"),
    (_system(all_gather_implementation=["ring", "ring"]), GOOD_NETWORK, [],
     "all-gather-implementation"),
    (_system(local_mem_bw=0), GOOD_NETWORK, [], "local-mem-bw"),
    (_system(), GOOD_NETWORK.replace("[8]", "[0]"), [], "npus_count[0]"),
    (_system(), GOOD_NETWORK.replace("[50]", "['fast']"), [], "bandwidth[0]"),
    (_system(scheduling_policy="RANDOM"), GOOD_NETWORK, [], "scheduling-policy"),
    (b"\xff\xfe{", GOOD_NETWORK, [], "UTF-8"),
    ("{not json", GOOD_NETWORK, [], "not valid JSON"),
    (_system(), "topology: [Ring\n", [], "not valid YAML"),
    (_system(), "- just a list\n", [], "(top level)"),
]


@pytest.mark.parametrize(("system", "network", "extra", "names"), BAD_INPUTS)
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, system, network, extra, names
                                          ) -> None:
    sys_path = _write(tmp_path, "system.json", system)
    net_path = _write(tmp_path, "network.yml", network)
    code, out, err = run(capsys, "collective", "all-reduce", "1MiB", "--system-json",
                         str(sys_path), "--network-yml", str(net_path), *extra)
    if names is None:
        assert (code, out.strip()) == (0, "117780 ns")
        return
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert names in err


@pytest.mark.parametrize("size", ["0", "-5", "1.5", "12 parsecs"])
def test_bad_size(capsys, size) -> None:
    code, _, err = run(capsys, "collective", "all-reduce", size, "--system-json", str(SYSTEM),
                       "--network-yml", str(NETWORK))
    assert code == 2
    assert err.startswith("planner collective: error: size:")


def test_missing_file(capsys, tmp_path) -> None:
    code, _, err = run(capsys, "collective", "all-reduce", "1MiB", "--system-json",
                       str(tmp_path / "nope.json"), "--network-yml", str(NETWORK))
    assert code == 2
    assert "nope.json: no such file" in err


def test_unknown_collective_is_a_usage_error(capsys) -> None:
    code = main(["collective", "broadcast", "1MiB", "--system-json", str(SYSTEM),
                 "--network-yml", str(NETWORK)])
    assert code == 2
    err = capsys.readouterr().err
    assert "broadcast" in err and len(err.strip().splitlines()) == 1
