"""`planner estimate`: catalog names or YAML paths in, the breakdown out; bad input is one line
on stderr and exit code 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from planner.cli import main

ISSUE_EXAMPLE = ["estimate", "--model", "llama3-70b", "--system", "dgx-h100-1024", "--dp", "8",
                 "--tp", "8", "--pp", "16", "--micro-batch", "1", "--global-batch", "1024",
                 "--schedule", "interleaved", "--v", "5", "--recompute", "selective"]


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_issue_example_prints_every_part(capsys) -> None:
    code, out, _ = run(capsys, *ISSUE_EXAMPLE)
    assert code == 0
    for word in ("step time", "compute", "tp", "bubble", "peak memory", "activations",
                 "optimizer", "stage 15"):
        assert word in out


def test_json_has_the_parts_and_they_add_up(capsys) -> None:
    code, out, _ = run(capsys, *ISSUE_EXAMPLE, "--json")
    data = json.loads(out)
    assert code == 0
    assert data["strategy"] == {"dp": 8, "tp": 8, "pp": 16, "sp": 1, "sequence_parallel": True,
                                "zero": 0, "recompute": "selective", "micro_batch": 1,
                                "schedule": "interleaved", "v": 5,
                                "placement": ["tp", "sp", "dp", "pp"]}
    parts = ("compute", "tp", "sp", "dp", "pp", "fsdp", "bubble", "optimizer")
    assert sum(data["time"][p] for p in parts) == pytest.approx(data["step_time"])
    assert data["memory"]["total"] == pytest.approx(data["peak_memory"])
    assert len(data["stages"]) == 16
    # tokens/s = global batch * sequence / step time (8,192 tokens per Llama-3 sequence)
    assert data["tokens_per_s"] == pytest.approx(1024 * 8192 / data["step_time"])
    assert data["fits"] is True and data["reason"] == ""


def test_dp_defaults_to_what_the_other_degrees_leave(capsys) -> None:
    code, out, _ = run(capsys, "estimate", "--model", "gpt175b", "--system", "lab-system2",
                       "--tp", "4", "--global-batch", "512", "--json")
    assert code == 0
    assert json.loads(out)["strategy"]["dp"] == 16  # 64 NPUs / tp 4


def test_model_and_system_by_yaml_path(capsys, tmp_path: Path) -> None:
    model = tmp_path / "tiny.yaml"
    model.write_text("tiny: {family: gpt, layers: 4, hidden: 256, ffn_hidden: 1024, heads: 4,"
                     " vocab: 1000, seq_len: 128}\n")
    code, out, _ = run(capsys, "estimate", "--model", str(model), "--system", "dgx-a100-8",
                       "--tp", "2", "--global-batch", "8", "--json")
    assert code == 0
    assert json.loads(out)["model"] == "tiny"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "nope", "--system", "dgx-a100-8", "--global-batch", "8"],
         "unknown model 'nope'"),
        (["--model", "gpt3-175b", "--system", "nope", "--global-batch", "8"],
         "unknown system 'nope'"),
        (["--model", "gpt3-175b", "--system", "dgx-a100-8", "--tp", "3", "--global-batch", "8"],
         "must divide the system's 8 devices"),
        (["--model", "gpt3-175b", "--system", "dgx-a100-8", "--tp", "16", "--dp", "1",
          "--global-batch", "8"], "device count"),
        (["--model", "gpt3-175b", "--system", "dgx-a100-64", "--tp", "8", "--pp", "8",
          "--global-batch", "8", "--schedule", "interleaved", "--v", "5"], "must divide layers"),
        (["--model", "gpt3-175b", "--system", "dgx-a100-8", "--tp", "8", "--global-batch", "8",
          "--placement", "tp,dp"], "--placement"),
        (["--model", "gpt3-175b", "--system", "dgx-a100-8", "--tp", "8", "--global-batch", "8",
          "--hbm-gb", "0"], "--hbm-gb"),
        # interleaving one chunk a stage is 1F1B; studies refuse it too (space.v)
        (["--model", "gpt3-175b", "--system", "dgx-a100-64", "--tp", "8", "--pp", "8",
          "--global-batch", "8", "--schedule", "interleaved"], "needs model chunks --v > 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, message) -> None:
    code, out, err = run(capsys, "estimate", *args)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert out == ""


@pytest.mark.parametrize(("kind", "typo", "close"), [
    ("system", "dgx-h100-0", ["dgx-h100-8", "dgx-h100-4", "dgx-h100-2"]),
    ("model", "llama3-7b", ["llama3-70b", "llama3-8b", "llama2-7b"]),
])
def test_a_name_close_to_known_ones_is_a_short_line_suggesting_them(capsys, kind, typo,
                                                                    close) -> None:
    from planner.catalog import load_catalog

    names = {"system": {"--model": "gpt3-175b", "--system": typo},
             "model": {"--model": typo, "--system": "dgx-a100-8"}}[kind]
    code, out, err = run(capsys, "estimate", *(x for kv in names.items() for x in kv),
                         "--global-batch", "8")
    catalog = load_catalog()
    known = catalog.systems if kind == "system" else catalog.models
    assert code == 2 and out == ""
    assert err.strip() == (f"planner estimate: error: --{kind}: unknown {kind} {typo!r}; did you"
                           f" mean {', '.join(close)}? (`planner catalog {kind}s` lists them"
                           " all)")
    assert all(name in known for name in close)
    assert len(err) < 200


def test_unknown_recompute_is_an_argparse_error(capsys) -> None:
    code = main(["estimate", "--model", "gpt3-175b", "--system", "dgx-a100-8", "--global-batch",
                 "8", "--recompute", "partial"])
    assert code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'partial'" in err and len(err.strip().splitlines()) == 1


def test_bad_catalog_yaml_names_file_and_field(capsys, tmp_path: Path) -> None:
    model = tmp_path / "bad.yaml"
    model.write_text("bad: {family: gpt, layers: -4, hidden: 256, ffn_hidden: 1024, heads: 4,"
                     " vocab: 1000, seq_len: 128}\n")
    code, _, err = run(capsys, "estimate", "--model", str(model), "--system", "dgx-a100-8",
                       "--global-batch", "8")
    assert code == 2
    assert f"{model}: bad.layers: must be >= 1" in err


def test_stage_plan_that_does_not_fit_prints_one_unit(capsys) -> None:
    # Issue 19: the line mixed "G elements" with GB. tests/data/astra_results.csv row
    # R4S2_dp8_tp1_pp1_sp1_ws0_rc0: max peak 1,515,978,752 tracker units, elements of one byte
    # in STAGE, so 1,515,978,752 B = 1.52 GB (1.5 to one decimal) against 1 GB of HBM.
    code, out, _ = run(capsys, "estimate", "--model", "stage-1024x4", "--system", "R4S2",
                       "--dp", "8", "--global-batch", "64", "--hbm-gb", "1")
    assert code == 0
    line = next(line for line in out.splitlines() if line.startswith("peak memory"))
    assert line.split()[2:4] == ["1.52", "GB"]
    assert "DOES NOT FIT: the worst rank needs 1.5 GB > 1.0 GB of HBM" in line
    assert "(ASTRA-sim's memory tracker: 1,515,978,752 elements of one byte)" in line
    assert "GiB" not in line and "G elements" not in line


@pytest.mark.parametrize("system", ["dgx-h100-8", "dgx-a100-8"])
def test_the_hbm_limit_is_one_figure_on_the_peak_memory_line(capsys, system) -> None:
    # 80 GB devices hold 85.5e9 bytes in the catalog: the line said "HBM 86 GB" beside the
    # estimate's "> 85.5 GB of HBM"
    from planner.catalog import load_catalog

    code, out, _ = run(capsys, "estimate", "--model", "llama3-70b", "--system", system,
                       "--tp", "8", "--global-batch", "64", "--seq-len", "2048")
    assert code == 0
    line = next(line for line in out.splitlines() if line.startswith("peak memory"))
    limit = load_catalog().system(system).device.hbm_bytes / 1e9
    said = re.findall(r"(?:HBM |> )([\d.]+) GB", line)
    assert said == [f"{limit:.1f}"] * 2, line  # the limit, then the reason's


BASE = ["estimate", "--model", "gpt175b", "--system", "lab-system2", "--global-batch", "512"]


@pytest.mark.parametrize("flag", ["--dp", "--tp", "--pp", "--sp", "--micro-batch", "--v"])
@pytest.mark.parametrize("value", ["0", "-2"])
def test_degrees_below_one_say_so(capsys, flag, value) -> None:
    code, out, err = run(capsys, *BASE, flag, value)
    assert code == 2 and out == ""
    assert err.strip() == f"planner estimate: error: {flag} must be >= 1, but got {value}"


def test_convention_overrides_the_family(capsys) -> None:
    results = {}
    for convention in (None, "megatron", "stage"):
        extra = ["--convention", convention] if convention else []
        code, out, _ = run(capsys, *BASE, *extra, "--json")
        assert code == 0
        results[convention] = json.loads(out)
    assert results[None]["convention"] == "megatron"  # the gpt family's
    assert results[None]["step_time"] == results["megatron"]["step_time"]
    assert results["stage"]["convention"] == "stage"
    assert results["stage"]["step_time"] != results["megatron"]["step_time"]


@pytest.mark.parametrize("model, convention", [("gpt175b", "mlp"), ("distir-mlp", "megatron")])
def test_convention_the_model_cannot_use_is_one_line(capsys, model, convention) -> None:
    code, out, err = run(capsys, "estimate", "--model", model, "--system", "lab-system2",
                         "--global-batch", "512", "--convention", convention)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert f"--convention {convention}: model {model}" in err and "cannot use it" in err


def test_fp8_hsdp_and_uneven_stages_are_flags_equal_to_the_python_api(capsys) -> None:
    # Issue 18: the held-out runs that use FP8, HSDP or uneven stages must be expressible through
    # `planner estimate` as through simcore.estimate; the estimate is the API's, figure for figure
    import simcore
    from planner.catalog import load_catalog
    from simcore.specs import Precision, Strategy, TrainingSpec, ZeroStage

    catalog = load_catalog()
    args = ["estimate", "--model", "llama3-70b", "--system", "dgx-h100-1024", "--tp", "8",
            "--pp", "4", "--zero", "3", "--shard-group", "16", "--first-stage-layers", "19",
            "--last-stage-layers", "19", "--precision", "fp8", "--global-batch", "1024"]
    code, out, _ = run(capsys, *args, "--json")
    assert code == 0
    data = json.loads(out)
    assert {k: data["strategy"][k] for k in ("shard_group", "first_stage_layers",
                                             "last_stage_layers", "precision")} == {
        "shard_group": 16, "first_stage_layers": 19, "last_stage_layers": 19, "precision": "fp8"}
    s = Strategy(dp=32, tp=8, pp=4, zero=ZeroStage.PARAMETERS, shard_group=16,
                 first_stage_layers=19, last_stage_layers=19, precision=Precision.FP8)
    est = simcore.estimate(catalog.model("llama3-70b"), catalog.system("dgx-h100-1024"),
                           TrainingSpec(global_batch=1024, seq_len=8192), s)
    assert data["step_time"] == est.step_time and data["peak_memory"] == est.memory.total
    code, out, _ = run(capsys, *args)
    assert "HSDP shard group 16" in out and "first 19, last 19 layers" in out and "fp8" in out


def test_a_shard_group_with_zero_2_is_one_line(capsys) -> None:
    code, _, err = run(capsys, "estimate", "--model", "llama3-70b", "--system", "dgx-h100-1024",
                       "--tp", "8", "--zero", "2", "--shard-group", "16", "--global-batch", "1024")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "needs zero=1" in err
