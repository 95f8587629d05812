"""Property-based fuzzing of every kind of input file the planner reads (issue 7).

Hypothesis mutates the shipped files - a field deleted, given the wrong type, zero, negative or
huge, an unknown name, an unknown extra field; or the bytes broken (non-UTF-8), nested too deep,
or a recursive YAML anchor - and runs the real command line on the result. The property: never
a traceback, exit code 2 with one line on stderr (or 0 when the mutation left a valid file), and
the study already stored is unchanged. ``FUZZ_EXAMPLES`` (environment) sets the examples per
file kind; the count that ran is printed at the end (``pytest -s``).
"""

from __future__ import annotations

import copy
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cli import main
from planner.storage import open_storage

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))
CASES: dict[str, int] = {}

WRONG_VALUES: list[Any] = ["text", [1, 2], {"a": 1}, None, True, 1.5, "", "no-such-name"]
NUMBERS: list[Any] = [0, -1, -1e9, 10**30, 1e308, 0.5, 2**63]


def _paths(data: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every place in a loaded YAML/JSON document, as a tuple of keys and indices."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


def _mutate(data: Any, path: tuple, kind: str, value: Any) -> Any:
    data = copy.deepcopy(data)
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if kind == "delete":
        del parent[last]
    elif kind == "extra" and isinstance(parent[last], dict):
        parent[last]["bogus_field"] = 1
    else:
        parent[last] = value
    return data


@st.composite
def mutations(draw: st.DrawFn, text: str) -> bytes:
    """A broken version of ``text``: a structural mutation, or broken bytes."""
    kind = draw(st.sampled_from(["delete", "wrong", "number", "extra", "utf8", "deep",
                                 "recursive", "truncate"]))
    raw = text.encode()
    if kind == "utf8":
        at = draw(st.integers(0, len(raw)))
        return raw[:at] + b"\xff\xfe\xc3" + raw[at:]
    if kind == "truncate":
        return raw[:draw(st.integers(0, len(raw)))]
    data = yaml.safe_load(text)
    paths = list(_paths(data))
    path = draw(st.sampled_from(paths))
    if kind == "deep":
        return _replace(data, path, "[" * 5000 + "]" * 5000)
    if kind == "recursive":
        return _replace(data, path, "&loop [*loop, *loop]")
    value = draw(st.sampled_from(WRONG_VALUES if kind == "wrong" else NUMBERS))
    mutated = _mutate(data, path, kind, value)
    if isinstance(text, str) and text.lstrip().startswith("{"):
        import json
        return json.dumps(mutated).encode()
    return yaml.safe_dump(mutated, sort_keys=False).encode()


def _replace(data: Any, path: tuple, raw_yaml: str) -> bytes:
    marker = "__FUZZ_MARKER__"
    text = yaml.safe_dump(_mutate(data, path, "value", marker), sort_keys=False)
    return text.replace(f"'{marker}'", raw_yaml).replace(marker, raw_yaml).encode()


@contextmanager
def _time_limit(seconds: int) -> Iterator[None]:
    def stop(*_: Any) -> None:
        raise TimeoutError(f"a fuzzed input ran for over {seconds} s")
    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _run(capsys: pytest.CaptureFixture, argv: list[str], kind: str) -> None:
    CASES[kind] = CASES.get(kind, 0) + 1
    capsys.readouterr()
    with _time_limit(60):
        code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err + out, argv
    assert code in (0, 2), (code, err)
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert "failed:" not in lines[0], err


def _trials(storage: Path, name: str) -> list[tuple]:
    study = optuna.load_study(study_name=name, storage=open_storage(str(storage), create=False))
    return [(t.number, t.state, tuple(t.values or ()), tuple(sorted(t.params.items())))
            for t in study.get_trials(deepcopy=False)]


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> tuple[Path, list[tuple]]:
    """The lab study (stage convention, 56 strategies) already in a journal."""
    storage = tmp_path_factory.mktemp("fuzz") / "studies.journal"
    study = ROOT / "studies" / "lab4b-llama70b-system1.yaml"
    assert main(["run", str(study), "--storage", str(storage), "--quiet"]) == 0
    return storage, _trials(storage, "lab4b-llama70b-system1")


STUDY_TEXT = (ROOT / "studies" / "lab4b-llama70b-system1.yaml").read_text()


@SETTINGS
@given(data=st.data())
def test_fuzzed_study_files(data, stored, tmp_path_factory, capsys):
    storage, before = stored
    path = tmp_path_factory.mktemp("study") / "study.yaml"
    path.write_bytes(data.draw(mutations(STUDY_TEXT)))
    _run(capsys, ["run", str(path), "--storage", str(storage), "--resume", "--quiet"], "study")
    assert _trials(storage, "lab4b-llama70b-system1") == before


def _one_entry(kind: str, file: str, name: str) -> str:
    entries = yaml.safe_load((ROOT / "studies" / "catalog" / kind / file).read_text())
    return yaml.safe_dump({name: entries[name]}, sort_keys=False)


MODEL_TEXT = _one_entry("models", "llama.yaml", "llama3-70b")
SYSTEM_TEXT = yaml.safe_dump({"lab-system9": {
    **yaml.safe_load(_one_entry("systems", "astra-lab.yaml", "lab-system1"))["lab-system1"],
    "device": yaml.safe_load(_one_entry("devices", "astra-lab.yaml", "lab-npu-fast"))[
        "lab-npu-fast"]}}, sort_keys=False)


@SETTINGS
@given(data=st.data())
def test_fuzzed_model_files(data, tmp_path_factory, capsys):
    path = tmp_path_factory.mktemp("model") / "model.yaml"
    path.write_bytes(data.draw(mutations(MODEL_TEXT)))
    _run(capsys, ["estimate", "--model", str(path), "--system", "dgx-h100-1024", "--tp", "8",
                  "--pp", "8", "--global-batch", "1024"], "model")


@SETTINGS
@given(data=st.data())
def test_fuzzed_system_files(data, tmp_path_factory, capsys):
    path = tmp_path_factory.mktemp("system") / "system.yaml"
    path.write_bytes(data.draw(mutations(SYSTEM_TEXT)))
    _run(capsys, ["estimate", "--model", "llama70b", "--system", str(path), "--tp", "8",
                  "--global-batch", "512"], "system")


ASTRA = ROOT / "tests" / "data" / "astra_systems"


@SETTINGS
@given(data=st.data())
def test_fuzzed_astra_files(data, tmp_path_factory, capsys):
    folder = tmp_path_factory.mktemp("astra")
    system, network = folder / "system.json", folder / "network.yml"
    which = data.draw(st.sampled_from(["system", "network"]))
    system_text = (ASTRA / "R4S2-system.json").read_text()
    network_text = (ASTRA / "R4S2-network.yml").read_text()
    system.write_text(system_text)
    network.write_text(network_text)
    if which == "system":
        system.write_bytes(data.draw(mutations(system_text)))
    else:
        network.write_bytes(data.draw(mutations(network_text)))
    _run(capsys, ["collective", "all-reduce", "1MiB", "--system-json", str(system),
                  "--network-yml", str(network)], "astra")


COMPARISON_TEXT = """\
name: fuzz-compare
description: one system, one limit, the lab's 56 strategies
study: {study}
systems: [lab-system1]
hbm_gb: [40]
"""


@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> tuple[Path, str, list[tuple]]:
    """A small comparison already stored (its one cell resumes instantly when fuzzed)."""
    folder = tmp_path_factory.mktemp("compare")
    storage = folder / "studies.journal"
    text = COMPARISON_TEXT.format(study=ROOT / "studies" / "lab4b-llama70b-system1.yaml")
    path = folder / "comparison.yaml"
    path.write_text(text)
    assert main(["compare", str(path), "--storage", str(storage), "--out", str(folder),
                 "--quiet"]) == 0
    cell = "fuzz-compare--lab-system1--hbm40gb"
    return storage, text, _trials(storage, cell)


@SETTINGS
@given(data=st.data())
def test_fuzzed_comparison_files(data, compared, tmp_path_factory, capsys):
    storage, text, before = compared
    folder = tmp_path_factory.mktemp("comparison")
    path = folder / "comparison.yaml"
    path.write_bytes(data.draw(mutations(text)))
    _run(capsys, ["compare", str(path), "--storage", str(storage), "--out", str(folder),
                  "--quiet"], "comparison")
    assert _trials(storage, "fuzz-compare--lab-system1--hbm40gb") == before


def test_fuzz_cases_ran():
    total = sum(CASES.values())
    print(f"\nfuzzed inputs run through the CLI: {total} ({CASES})")
    assert total == 0 or total >= EXAMPLES
