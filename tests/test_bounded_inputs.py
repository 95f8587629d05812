"""Issue 20, items 9, 10 and 12: every input bounded and checked when it is read.

Each bad input is exit code 2 with one line naming the file and the field, never a traceback,
and no study is created (the storage file is not even made)."""

from __future__ import annotations

import argparse
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from planner.cli import main
from planner.commands._base import jobs, max_jobs
from planner.inputs import MAX_INPUT_BYTES
from simcore.topologies import MAX_NPUS, Mesh2D, Torus2D
from simcore.topologies._base import BaseTopology

ROOT = Path(__file__).resolve().parent.parent
LAB = (ROOT / "studies" / "lab4b-llama70b-system1.yaml").read_text()
ASTRA = ROOT / "tests" / "data" / "astra_systems"


@contextmanager
def _time_limit(seconds: int) -> Iterator[None]:
    def stop(*_: Any) -> None:
        raise TimeoutError(f"ran for over {seconds} s")
    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _refused(capsys: pytest.CaptureFixture, argv: list[str], *expected: str) -> str:
    """Run the command line: exit 2, one line on stderr holding every ``expected`` text."""
    capsys.readouterr()
    with _time_limit(30):
        code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (code, err)
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def _run_refused(capsys: pytest.CaptureFixture, tmp_path: Path, study: Path, *expected: str,
                 extra: tuple[str, ...] = ()) -> str:
    storage = tmp_path / "studies.journal"
    line = _refused(capsys, ["run", str(study), "--storage", str(storage), "--quiet", *extra],
                    *expected)
    assert not storage.exists(), "a study was created"
    return line


def _study(tmp_path: Path, system_yaml: str, name: str = "st") -> Path:
    (tmp_path / "system.yaml").write_text(system_yaml)
    path = tmp_path / f"{name}.yaml"
    path.write_text(LAB.replace("system: lab-system1", "system: system.yaml"))
    return path


SYSTEM = """\
sys:
  device: lab-npu-fast
  network:
    - {{topology: Ring, npus: 4, bandwidth_astra_gbps: 100, latency_us: 0.05{alg}}}
    - {{topology: Ring, npus: 16, bandwidth_astra_gbps: 100, latency_us: 0.05{alg}}}
{scheduling}"""


# Item 9: bad inputs found in the first trial left an empty study (exit 1).

@pytest.mark.parametrize("algorithm, hint", [
    ("doubleBinaryTree", "one-dimensional networks only"),
    ("oneDirect", "oneDirect (all-reduce) is not modelled"),
])
def test_an_algorithm_the_network_cannot_run_is_refused_before_the_study(
        tmp_path, capsys, algorithm, hint):
    study = _study(tmp_path, SYSTEM.format(alg=f", algorithm: {algorithm}", scheduling=""))
    _run_refused(capsys, tmp_path, study, "system.yaml: sys.network[0].algorithm", hint)


def test_a_one_algorithm_only_on_an_outer_dimension_is_refused(tmp_path, capsys):
    text = SYSTEM.format(alg="", scheduling="").replace(
        "npus: 16, bandwidth_astra_gbps: 100, latency_us: 0.05",
        "npus: 16, bandwidth_astra_gbps: 100, latency_us: 0.05, algorithm: oneRing")
    _run_refused(capsys, tmp_path, _study(tmp_path, text), "sys.network[1].algorithm",
                 "list it on dimension 0")


@pytest.mark.parametrize("field, value", [
    ("active_chunks_per_dim", 10**9), ("preferred_dataset_splits", 10**9)])
def test_huge_scheduling_counts_are_refused(tmp_path, capsys, field, value):
    text = SYSTEM.format(alg="", scheduling=f"  scheduling: {{{field}: {value}}}\n")
    _run_refused(capsys, tmp_path, _study(tmp_path, text), f"sys.scheduling.{field}",
                 "must be <=")


def test_jobs_is_bounded():
    with pytest.raises(argparse.ArgumentTypeError, match="from 1 to"):
        jobs("1" * 20)
    with pytest.raises(argparse.ArgumentTypeError, match="4 per core"):
        jobs(str(max_jobs() + 1))
    with pytest.raises(argparse.ArgumentTypeError):
        jobs("0")
    assert jobs("2") == 2


def test_compare_refuses_a_20_digit_jobs(tmp_path, capsys):
    _refused(capsys, ["compare", str(tmp_path / "c.yaml"), "--jobs", "1" * 20], "--jobs")


# Item 10: unbounded reads and loops.

def test_a_fifo_as_the_study_is_refused_not_waited_on(tmp_path, capsys):
    fifo = tmp_path / "study.yaml"
    os.mkfifo(fifo)
    _run_refused(capsys, tmp_path, fifo, "study.yaml: not a regular file (a FIFO)")


def test_a_folder_as_the_study_is_refused(tmp_path, capsys):
    # os.open reads a folder on Linux; the type check must come before Python's file object,
    # which refused it with a bare "IsADirectoryError: [Errno 21] Is a directory: 3".
    folder = tmp_path / "study.yaml"
    folder.mkdir()
    _run_refused(capsys, tmp_path, folder, "study.yaml: not a regular file (a folder)")


def test_a_device_as_the_study_is_refused(tmp_path, capsys):
    _run_refused(capsys, tmp_path, Path("/dev/zero"), "/dev/zero: not a regular file (a device)")


def test_a_device_as_a_system_file_is_refused(tmp_path, capsys):
    system = tmp_path / "zero.yaml"
    system.symlink_to("/dev/zero")
    _refused(capsys, ["estimate", "--model", "llama70b", "--system", str(system), "--tp", "8",
                      "--global-batch", "512"], "zero.yaml: not a regular file (a device)")


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path, capsys):
    study = tmp_path / "big.yaml"
    with study.open("wb") as f:
        f.truncate(MAX_INPUT_BYTES + 1)  # sparse: costs no disk
    _run_refused(capsys, tmp_path, study, "big.yaml", "over the 64 MiB limit")


def test_a_csv_over_the_size_limit_is_refused(tmp_path, capsys):
    runs = tmp_path / "runs.csv"
    with runs.open("wb") as f:
        f.truncate(MAX_INPUT_BYTES + 1)
    _refused(capsys, ["validate", str(runs)], "runs.csv", "over the 64 MiB limit")


def _astra_network(tmp_path: Path, topology: str, npus_count: str) -> list[str]:
    network = tmp_path / "network.yml"
    network.write_text(f"topology: [{topology}]\nnpus_count: [{npus_count}]\nbandwidth: [50]\n"
                       "latency: [500]\n")
    system = tmp_path / "system.json"
    text = (ASTRA / "R4S2-system.json").read_text().replace('"halvingDoubling"', '"ring"')
    system.write_text(text.replace('"ring",\n        "ring"', '"ring"'))
    return ["collective", "all-reduce", "1MiB", "--system-json", str(system),
            "--network-yml", str(network)]


def test_a_network_over_a_million_npus_is_refused(tmp_path, capsys):
    _refused(capsys, _astra_network(tmp_path, "Mesh2D", "100000x100000"),
             "network.yml: npus_count", f"over the {MAX_NPUS:,}")


def test_a_catalog_network_over_a_million_npus_is_refused(tmp_path, capsys):
    text = SYSTEM.format(alg="", scheduling="").replace("npus: 16", "npus: 1000000")
    _run_refused(capsys, tmp_path, _study(tmp_path, text), "sys.network", "4 x 1000000 NPUs")


@pytest.mark.parametrize("cls", [Mesh2D, Torus2D])
def test_mesh_offset_hops_closed_form_is_the_worst_npu(cls):
    for width in range(1, 8):
        for height in range(1, 8):
            n = width * height
            for offset in range(n):
                # the NPU-by-NPU definition, on a fresh object (no cache)
                brute = BaseTopology.offset_hops(cls(n, width), offset)
                assert cls(n, width).offset_hops(offset) == brute, (width, height, offset)


def test_a_million_npu_mesh_times_a_direct_collective_quickly():
    mesh = Mesh2D(1024 * 1024, 1024)
    with _time_limit(5):  # NPU by NPU: 10^12 steps for the 1,048,575 offsets
        assert mesh.offset_hops(1024 * 1024 - 1) == 1023 + 1023


# Item 12: numbers, names and options.

@pytest.mark.parametrize("value", ["1" * 5000, "1" + "0" * 400])
def test_a_number_too_long_for_any_field_names_its_line(tmp_path, capsys, value):
    study = tmp_path / "st.yaml"
    study.write_text(LAB.replace("global_batch: 512", f"global_batch: {value}"))
    _run_refused(capsys, tmp_path, study, "st.yaml: line", "global_batch:", "-digit number")


def test_a_number_too_long_in_a_json_file_is_refused(tmp_path, capsys):
    argv = _astra_network(tmp_path, "Ring", "8")
    system = tmp_path / "system.json"
    system.write_text(system.read_text().replace('"endpoint-delay": 10',
                                                 '"endpoint-delay": 1' + "0" * 5000))
    _refused(capsys, argv, "system.json", "-digit number")


def test_duplicate_yaml_keys_are_refused_with_the_key_and_line(tmp_path, capsys):
    study = tmp_path / "st.yaml"
    study.write_text(LAB + "sampler: tpe\n")
    line = _run_refused(capsys, tmp_path, study, "st.yaml: line", "sampler: given twice")
    assert "first on line" in line


def test_yaml_merge_keys_may_still_be_overridden(tmp_path):
    from planner.inputs import load

    path = tmp_path / "a.yaml"
    path.write_text(".base: &b {x: 1, y: 2}\nitem: {<<: *b, x: 3}\n")
    assert load(path, "catalog YAML")["item"] == {"x": 3, "y": 2}


@pytest.mark.parametrize("name", ["..", ".", "a/b", "-x", "../escape"])
def test_a_study_name_that_is_not_a_safe_file_name_is_refused(tmp_path, capsys, name):
    study = tmp_path / "st.yaml"
    study.write_text(f"name: '{name}'\n" + LAB)
    _run_refused(capsys, tmp_path, study, "st.yaml: name", "letters, digits")


def test_estimate_refuses_seq_len_0(capsys):
    _refused(capsys, ["estimate", "--model", "llama70b", "--system", "lab-system1",
                      "--global-batch", "512", "--seq-len", "0"], "--seq-len")


def test_an_empty_storage_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    study = tmp_path / "st.yaml"
    study.write_text(LAB)
    _refused(capsys, ["run", str(study), "--storage", "", "--quiet"], "--storage is empty")
    assert not (tmp_path / "planner-results").exists()
