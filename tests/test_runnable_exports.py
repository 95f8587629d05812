"""A plan is handed to a framework only if it can run as written (planner/exports/_runnable.py):
estimated as the framework runs it (the megatron convention) and within the device's HBM,
whatever limit the study ranked by. Also Megatron-LM's rule on the sequence length under
context parallelism (search_spaces/frameworks.py ``_cp_chunks``)."""

from __future__ import annotations

from pathlib import Path

from planner.catalog import load_catalog
from planner.cli import main
from search_spaces.frameworks import why_not
from simcore.specs import Strategy, TrainingSpec

STUDIES = Path(__file__).resolve().parent.parent / "studies"


def test_a_stage_convention_plan_is_not_written_for_a_framework(tmp_path, capsys) -> None:
    # The lab study is estimated as STAGE's graph on ASTRA-sim: its plan has no Megatron-LM
    # figures behind it, so only ASTRA-sim, Chakra and plan files are written.
    storage = ("--storage", str(tmp_path / "s"))
    assert main(["run", str(STUDIES / "lab4b-llama70b-system1.yaml"), "--hbm-gb", "80",
                 "--quiet", *storage]) == 0
    name = "lab4b-llama70b-system1-hbm80gb"
    capsys.readouterr()
    for fmt in ("megatron", "deepspeed", "torchtitan"):
        out = tmp_path / fmt
        assert main(["export", name, "--format", fmt, "--out", str(out), *storage]) == 2
        err = capsys.readouterr().err.strip()
        assert "stage convention" in err and "export astra-sim, chakra or plan" in err
        assert len(err.splitlines()) == 1 and not out.exists()
    assert main(["export", name, "--format", "astra-sim,plan", "--out", str(tmp_path / "a"),
                 *storage]) == 0
    assert list((tmp_path / "a").glob("*/stage.sh")) and list((tmp_path / "a").glob("*/plan.yaml"))


def test_the_report_does_not_recommend_running_a_plan_over_the_devices_hbm(tmp_path,
                                                                            capsys) -> None:
    # The lab's Megatron study ranks by time alone (hbm_gb: unlimited); its fastest plan, dp 32
    # x tp 2 without ZeRO, keeps half the model's optimizer states on every rank (the estimate:
    # 639.5 GB a device), over the lab NPU's 80 GB.
    storage = ("--storage", str(tmp_path / "s"))
    study = "lab4b-llama70b-system1-megatron"
    assert main(["run", str(STUDIES / f"{study}.yaml"), "--quiet", *storage]) == 0
    page = tmp_path / "r.html"
    assert main(["report", study, "--out", str(page), *storage]) == 0
    text = page.read_text()
    assert "Fastest estimated, which no framework runs as written" in text
    assert "<b>Run <code>" not in text
    assert "Not for megatron, deepspeed, torchtitan (it needs" in text
    assert "over the 80 GB a lab-npu-fast has" in text
    for fmt in ("megatron", "deepspeed", "torchtitan"):
        assert f"--format {fmt}" not in text
    assert f"planner export {study} --format chakra" in text


def test_megatron_wants_a_sequence_a_multiple_of_twice_cp() -> None:
    # Megatron-LM d98e8a64 megatron/training/arguments.py: "seq-length should be a multiple of
    # 2 * context-parallel-size" (each rank takes two of 2 x cp chunks). 4,098 = 2 x 2,049 is
    # a multiple of cp 2 but not of 4; 4,096 is.
    model = load_catalog().model("llama3-8b")
    plan = Strategy(dp=2, tp=1, pp=1, sp=2)
    refused = why_not("megatron", model, TrainingSpec(global_batch=8, seq_len=4098), plan)
    assert refused is not None and "multiple of 2 x cp = 4" in refused
    assert why_not("megatron", model, TrainingSpec(global_batch=8, seq_len=4096), plan) is None
    # the rule is Megatron-LM's: DeepSpeed-Ulysses splits the sequence cp ways only
    assert "multiple of 2 x cp" not in (why_not(
        "deepspeed", model, TrainingSpec(global_batch=8, seq_len=4098), plan) or "")


def test_an_mlp_convention_plan_is_only_a_plan_file(tmp_path, capsys) -> None:
    # DistIR's MLP is no transformer a framework trains: its plan is written as a plan file only
    storage = ("--storage", str(tmp_path / "s"))
    assert main(["run", str(STUDIES / "distir-mlp-16.yaml"), "--quiet", *storage]) == 0
    capsys.readouterr()
    assert main(["export", "distir-mlp-16", "--format", "megatron", "--out",
                 str(tmp_path / "m"), *storage]) == 2
    err = capsys.readouterr().err.strip()
    assert "mlp convention" in err and err.endswith("; export plan")
    assert main(["export", "distir-mlp-16", "--format", "plan", "--out", str(tmp_path / "p"),
                 *storage]) == 0
