"""Activation offloading (``Strategy.offload_layers``, Megatron-Core's
``--cpu-offloading-num-layers``): Megatron's rules, the memory it frees, the copies it exposes,
the knob through the runs CSV, ``planner estimate``, a study's space and the exports, and
Megatron-Bridge's GB200 runs that offload (tests/data/validation/gb200-check.csv)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner.catalog import load_catalog
from planner.cli import main
from planner.errors import PlannerUsageError
from planner.exports import export_files
from planner.plan import make_plan
from planner.runs_csv import read_runs
from planner.study_config import load_study_config
from search_spaces.frameworks import why_not
from simcore import estimate
from simcore.megatron.batched import estimate_many
from simcore.specs import Convention, Precision, Recompute, Strategy, TrainingSpec, ZeroStage

DATA = Path(__file__).parent / "data" / "validation"
GB = 1e9


@pytest.fixture(autouse=True)
def no_user_catalog(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANNER_CATALOG", str(tmp_path / "user-catalog"))


def _fsdp(offload: int | None, **kw) -> Strategy:
    """Megatron-Bridge's Llama 3 70B plan on one GB200 rack: Megatron-FSDP, micro-batch 2."""
    return Strategy(dp=64, tp=1, pp=1, micro_batch=2, zero=ZeroStage.PARAMETERS,
                    precision=Precision.FP8, offload_layers=offload, **kw)


TRAINING = TrainingSpec(global_batch=256, seq_len=8192, transformer_engine=True)


def test_megatrons_rules() -> None:
    """megatron/core/transformer/transformer_config.py (d98e8a64): no pipeline parallelism, no
    recompute, fewer than the model's layers; and the device's host link must be known."""
    with pytest.raises(ValueError, match="needs pp=1"):
        Strategy(dp=32, pp=2, offload_layers=4)
    with pytest.raises(ValueError, match="needs recompute=none"):
        Strategy(dp=64, recompute=Recompute.FULL, offload_layers=4)
    with pytest.raises(ValueError, match="offload_layers >= 1"):
        Strategy(dp=64, offload_layers=0)
    catalog = load_catalog()
    model = catalog.model("llama3-70b")
    with pytest.raises(ValueError, match="below the model's 80 layers"):
        estimate(model, catalog.system("dgx-gb200-64"), TRAINING, _fsdp(80))
    t4 = catalog.system("dgx-gb200-64")
    t4 = replace(t4, device=replace(t4.device, host_bandwidth_bytes_per_s=None))
    with pytest.raises(ValueError, match="host_bandwidth_gbps"):
        estimate(model, t4, TRAINING, _fsdp(40))


def test_the_offloaded_layers_keep_nothing_but_the_last_until_the_head() -> None:
    """Transformer Engine's cpu_offload_v1.py (d0067d0) frees each offloaded layer's activations
    a window of layers later, the last as the last layer's forward ends; the LM head's logits
    come after. So with N of L layers offloaded, pp 1: (L - N) layers' activations plus the
    larger of one layer's and the head's. By hand from the estimate's own per-layer figure:
    without offloading the 80 layers and the head, A0 = 80 a + h."""
    catalog = load_catalog()
    model, system = catalog.model("llama3-70b"), catalog.system("dgx-gb200-64")
    a0 = estimate(model, system, TRAINING, _fsdp(None)).memory.activations
    a20 = estimate(model, system, TRAINING, _fsdp(20)).memory.activations
    a40 = estimate(model, system, TRAINING, _fsdp(40)).memory.activations
    per_layer = (a20 - a40) / 20
    head = a0 - 80 * per_layer
    assert head > per_layer  # the fp32 logits of 16,384 tokens x 128,256: 8.4 GB
    assert a40 == pytest.approx(40 * per_layer + head, rel=1e-9)


def test_copies_that_outlast_the_compute_are_exposed() -> None:
    """Each offloaded layer copies its a bytes out beside the next layer's forward and back
    beside a backward: with the copies longer than both (a slow host link of b bytes/s), the
    exposed time grows by 2 m N a (1/b1 - 1/b2) between two links, the compute cancelling
    (m = 2 micro-batches, N = 40). On GB200's NVLink-C2C (225 GB/s a way) a 70B layer's 3.6 GB
    (16 ms) hides behind its FP8 backward and nearly behind its forward."""
    catalog = load_catalog()
    model, system = catalog.model("llama3-70b"), catalog.system("dgx-gb200-64")
    a20 = estimate(model, system, TRAINING, _fsdp(20)).memory.activations
    a40 = estimate(model, system, TRAINING, _fsdp(40)).memory.activations
    per_layer = (a20 - a40) / 20
    slow = [replace(system, device=replace(system.device, host_bandwidth_bytes_per_s=b))
            for b in (4 * GB, 2 * GB)]
    t1, t2 = (estimate(model, s, TRAINING, _fsdp(40)).time.offload for s in slow)
    assert t2 - t1 == pytest.approx(2 * 2 * 40 * per_layer * (1 / (2 * GB) - 1 / (4 * GB)),
                                    rel=1e-9)
    fast = estimate(model, system, TRAINING, _fsdp(40))
    assert 0 < fast.time.offload < 0.005 * fast.step_time
    h100 = estimate(model, catalog.system("dgx-h100-64"), TRAINING, _fsdp(40))
    assert h100.time.offload > 0.05 * h100.step_time  # PCIe Gen5: 64 GB/s a way


def test_the_batched_estimate_agrees() -> None:
    catalog = load_catalog()
    model, system = catalog.model("llama3-70b"), catalog.system("dgx-h100-64")
    plans = [_fsdp(n) for n in (None, 10, 40, 79)]
    batch = estimate_many(model, system, TRAINING, plans)
    for i, s in enumerate(plans):
        one = estimate(model, system, TRAINING, s)
        assert batch.step_time[i] == pytest.approx(one.step_time, rel=1e-12)
        assert batch.peak_memory[i] == pytest.approx(one.peak_memory, rel=1e-12)
        assert batch.time.offload[i] == pytest.approx(one.time.offload, rel=1e-12, abs=1e-15)


def test_planner_estimate_and_its_plan_file(tmp_path, capsys) -> None:
    args = ["estimate", "--model", "llama3-70b", "--system", "dgx-gb200-64", "--dp", "64",
            "--micro-batch", "2", "--zero", "3", "--transformer-engine", "--precision", "fp8",
            "--global-batch", "256", "--seq-len", "8192", "--offload-layers", "40"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "40 layers offload activations" in out and "offload " in out
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["strategy"]["offload_layers"] == 40
    assert main(["estimate", "--model", "llama3-70b", "--system", "dgx-gb200-64", "--dp", "32",
                 "--pp", "2", "--offload-layers", "4", "--global-batch", "256"]) == 2
    assert "needs pp=1" in capsys.readouterr().err
    # 0 is none, as a study's space.offload_layers and a runs CSV read it (it was refused)
    zero = args[:-1] + ["0", "--json"]
    assert main(zero) == 0
    assert "offload_layers" not in json.loads(capsys.readouterr().out)["strategy"]
    assert main(args[:-1] + ["-1"]) == 2
    assert "--offload-layers must be >= 0 (0: none), but got -1" in capsys.readouterr().err


def test_a_runs_row_of_no_offloaded_layers_is_zero_or_empty(tmp_path) -> None:
    header = "name,model,system,global_batch,seq_len,dp,tp,pp,micro_batch,step_time_s"
    runs = tmp_path / "runs.csv"
    runs.write_text(f"{header},offload_layers\n"
                    "a,llama3-8b,dgx-h100-8,64,4096,8,1,1,1,3.0,0\n"
                    "b,llama3-8b,dgx-h100-8,64,4096,4,2,1,1,3.0,\n")
    read, skipped = read_runs(runs, load_catalog())
    assert not skipped and [r.strategy.offload_layers for r in read] == [None, None]


def test_a_study_searches_it_and_exports_it_for_megatron_only(tmp_path) -> None:
    study = tmp_path / "offload.yaml"
    study.write_text(
        "model: llama3-70b\nsystem: dgx-gb200-64\ntraining: {global_batch: 256, seq_len: 8192}\n"
        "space: {tp: [1, 2], pp: [1, 2], zero: [1, 3], recompute: [none, full],"
        " micro_batch: [2], precision: [fp8], offload_layers: [0, 40]}\n")
    config = load_study_config(study)
    plans = config.space.valid
    offloaded = [s for s in plans if s.offload_layers is not None]
    # offloading only with pp 1 and no recompute: tp 1-2 x zero 1/3 of the 16 plans of 0
    assert len(offloaded) == 4
    assert all(s.pp == 1 and s.recompute is Recompute.NONE for s in offloaded)
    assert config.summary()["space"]["offload_layers"] == [0, 40]
    plan = offloaded[0]
    assert why_not("torchtitan", config.model, config.training, plan) is not None
    assert why_not("deepspeed", config.model, config.training, plan) is not None
    assert why_not("megatron", config.model, config.training, plan) is None
    catalog = load_catalog()
    # at micro-batch 1: at Megatron-Bridge's 2 the last stage holds 189 GB under Megatron-LM's
    # unfused loss, its least (test_exports_frameworks.py), over the GB200's 186
    made = make_plan(catalog.model("llama3-70b"), catalog.system("dgx-gb200-64"), TRAINING,
                     replace(_fsdp(40), micro_batch=1), Convention.MEGATRON)
    script = "\n".join(export_files(made, "megatron").values())
    # model_parallel_config.py (d98e8a64): cpu_offloading_num_layers > 0 turns offloading on
    assert "--cpu-offloading-num-layers 40" in script and "--use-megatron-fsdp" in script


def test_a_device_without_a_host_link_is_refused_by_name(tmp_path) -> None:
    study = tmp_path / "t4.yaml"
    study.write_text("model: gpt-1.7b\nsystem: dgx1-v100-8\ntraining: {global_batch: 64}\n"
                     "space: {offload_layers: [0, 4]}\n")
    load_study_config(study)  # the V100 has its PCIe link in the catalog
    catalog_dir = tmp_path / "user-catalog" / "devices"
    catalog_dir.mkdir(parents=True)
    (tmp_path / "user-catalog" / "systems").mkdir()
    (catalog_dir / "nolink.yaml").write_text(
        "nolink: {peak_tflops: 100, hbm_gb: 40, hbm_bandwidth_gbps: 1000}\n")
    (tmp_path / "user-catalog" / "systems" / "nolink.yaml").write_text(
        "nolink-8:\n  device: nolink\n  network: [{npus: 8, bandwidth_gbps: 100,"
        " latency_us: 1, topology: switch}]\n")
    study.write_text("model: gpt-1.7b\nsystem: nolink-8\ntraining: {global_batch: 64}\n"
                     "space: {offload_layers: [0, 4]}\n")
    with pytest.raises(PlannerUsageError, match="space.offload_layers"):
        load_study_config(study)


def test_megatron_bridges_offloading_gb200_runs(capsys) -> None:
    """Megatron-Bridge's Llama 3 70B on 64 GB200s with Megatron-FSDP and 40 of 80 layers
    offloaded (containers 25.09-26.04.01), and its Llama 3.1 405B at tp 2 with 95 of 126
    offloaded (25.09): README, "GB200 NVL72". Without offloading the 70B plan needs 330 GB of
    its 186: every one now fits, each within 8%."""
    assert main(["validate", str(DATA / "gb200-check.csv"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = [r for r in data["rows"] if "offload" in r["name"]]
    assert len(rows) == 7 and data["over_memory_runs"] == 0
    assert all(abs(r["step_time_error"]) <= 0.08 for r in rows)  # -7.1 to +4.3%
    assert all(r["predicted_peak_memory_gb"] <= 186 for r in rows)


def test_the_rack_study_picks_megatron_bridges_offloading_plan() -> None:
    """studies/llama3-70b-gb200-64.yaml: of the space's FP8 plans, the estimate's fastest that
    fits is Megatron-Bridge's GB200 recipe (Megatron-FSDP, tp 1, micro-batch 2, 40 layers
    offloaded), measured 7.52-8.11 s a step across containers 25.11-26.04.01; its tp 2 x pp 4 x
    vp 5 plan measured 8.54-9.07 s in the same containers (gb200-fit.csv, MXFP8), 8.83 against
    7.76 s in 26.04.01 (+13.8%): the estimate puts it 8-12% slower."""
    config = load_study_config(Path(__file__).parent.parent / "studies"
                               / "llama3-70b-gb200-64.yaml")
    plans = list(config.space.valid)
    result = estimate_many(config.model, config.system, config.training, plans)
    fits = result.peak_memory <= config.system.device.hbm_bytes
    times = [t if ok else float("inf") for t, ok in zip(result.step_time.tolist(), fits)]
    best = plans[times.index(min(times))]
    assert (best.dp, best.tp, best.pp, best.zero, best.micro_batch, best.offload_layers) == (
        64, 1, 1, ZeroStage.PARAMETERS, 2, 40)
    tp2 = next(i for i, s in enumerate(plans) if (s.tp, s.pp, s.v, s.micro_batch, s.zero,
                                                   s.recompute) == (
        2, 4, 5, 1, ZeroStage.OPTIMIZER, Recompute.NONE))
    assert 1.08 <= times[tp2] / min(times) <= 1.12  # 8.61 / 7.89 s


@pytest.mark.parametrize("strategy", [
    _fsdp(40),
    # a plan file of partial recompute was refused on reading ("strategy.recompute_layers:
    # unknown field") before offloading joined the optional fields
    Strategy(dp=64, micro_batch=2, zero=ZeroStage.PARAMETERS, recompute=Recompute.FULL,
             recompute_layers=10),
])
def test_plan_files_keep_it(tmp_path, strategy: Strategy, capsys) -> None:
    catalog = load_catalog()
    plan = make_plan(catalog.model("llama3-70b"), catalog.system("dgx-gb200-64"), TRAINING,
                     strategy, Convention.MEGATRON)
    path = tmp_path / "plan.yaml"
    path.write_text(export_files(plan, "plan")["plan.yaml"])
    assert main(["estimate", "--plan", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["step_time"] == pytest.approx(plan.estimate.step_time, rel=1e-12)
    assert data["strategy"].get("offload_layers") == strategy.offload_layers
