"""torchtitan's and DeepSpeed-MoE's exports of mixture-of-experts plans (issue 21): the fields
each framework reads, checked against its source (planner/exports/_torchtitan_moe.py,
planner/exports/_deepspeed.py name the commits), and the plans each refuses in one line."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.catalog import load_catalog
from planner.exports import export_files
from planner.plan import make_plan
from search_spaces.frameworks import why_not
from simcore.specs import Convention, CrossEntropy, Precision, Strategy, TrainingSpec, ZeroStage

CATALOG = load_catalog()
QWEN3 = CATALOG.model("qwen3-30b-a3b")
MIXTRAL = CATALOG.model("mixtral-8x7b")
TRAINING = TrainingSpec(global_batch=1024, seq_len=4096)
EP16 = Strategy(dp=16, ep=16, etp=1, zero=ZeroStage.OPTIMIZER)
"""Megatron-Bridge's Qwen3-30B-A3B layout on 16 H100s (tests/data/validation/moe-check.csv)."""
TITAN16 = replace(EP16, zero=ZeroStage.GRADIENTS)
"""The same on torchtitan, whose one stand-in for ZeRO-1/2 (FSDP without resharding) runs at
pp 1 as ZeRO-2 (search_spaces.framework_rules.torchtitan_zero)."""


def _plan(model, strategy, system="dgx-h100-16", training=TRAINING):  # type: ignore[no-untyped-def]
    return make_plan(model, CATALOG.system(system), training, strategy, Convention.MEGATRON)


def test_torchtitan_writes_qwen3_30b_a3b_with_its_expert_parallelism() -> None:
    # priced as a torchtitan study prices it: its loss holds the logits in 12 bytes, not 4
    titan = TrainingSpec(global_batch=1024, seq_len=4096, cross_entropy=CrossEntropy.PYTORCH)
    files = export_files(_plan(QWEN3, TITAN16, training=titan), "torchtitan")
    toml = files["torchtitan.toml"]
    for line in ('name = "qwen3"', 'flavor = "30B-A3B"', "data_parallel_shard_degree = 16",
                 "expert_parallel_degree = 16", "expert_tensor_parallel_degree = 1"):
        assert line in toml
    config = files["torchtitan_config.py"]
    assert "        expert_parallel_degree=16," in config
    assert "from torchtitan.models.qwen3.config_registry import qwen3_30b_a3b" in config
    compile(config, "torchtitan_config.py", "exec")  # valid Python


def test_torchtitan_writes_deepseek_v3_671b() -> None:
    dsv3 = CATALOG.model("deepseek-v3")  # 61 layers, as torchtitan's 671B (no MTP layer)
    strategy = Strategy(dp=256, ep=64, etp=1, zero=ZeroStage.GRADIENTS)
    toml = export_files(_plan(dsv3, strategy, "dgx-h100-256",
                              TrainingSpec(global_batch=2048, seq_len=4096)),
                        "torchtitan")["torchtitan.toml"]
    assert 'name = "deepseek_v3"' in toml and 'flavor = "671B"' in toml
    assert "expert_parallel_degree = 64" in toml


def test_torchtitan_refuses_what_its_mesh_cannot_hold() -> None:
    # parallel_dims.py: ep must divide dp_shard * cp * tp; ZeRO 0 replicates dp (dp_shard 1)
    replicated = Strategy(dp=16, ep=16, etp=1, zero=ZeroStage.NONE)
    assert "must divide" in why_not("torchtitan", QWEN3, TRAINING, replicated)
    assert why_not("torchtitan", QWEN3, TRAINING, TITAN16) is None
    with pytest.raises(ValueError, match="must divide"):
        export_files(_plan(QWEN3, replicated), "torchtitan")


def test_torchtitan_moe_in_fp8_is_refused_in_one_line() -> None:
    fp8 = replace(TITAN16, precision=Precision.FP8)
    with pytest.raises(ValueError, match="bf16 only"):
        export_files(_plan(QWEN3, fp8), "torchtitan")


def test_deepspeed_writes_mixtral_as_deepspeed_moe() -> None:
    # Mixtral: every layer MoE, top-2, experts of the model's FFN width: what Megatron-DeepSpeed's
    # --num-experts / --topk / --expert-interval layer holds; ep 8 divides dp 16
    strategy = Strategy(dp=16, tp=4, ep=8, etp=1, zero=ZeroStage.OPTIMIZER)
    training = TrainingSpec(global_batch=256, seq_len=4096)
    launch = export_files(_plan(MIXTRAL, strategy, "dgx-h100-64", training),
                          "deepspeed")["deepspeed-launch.txt"]
    # --create-moe-param-group: Megatron-DeepSpeed makes the MoE parameter groups of its own
    # optimizer only with it, and ZeRO-1/2 assert without them (deepspeedai/DeepSpeed
    # stage_1_and_2.py "The model has moe layers, but None of the param groups are marked as
    # MoE"); with tp > 1 the sequence-parallel flag needs CUDA_DEVICE_MAX_CONNECTIONS=1
    for option in ("--num-experts 8", "--topk 2", "--expert-interval 1",
                   "--moe-expert-parallel-size 8", "--moe-train-capacity-factor 1",
                   "--create-moe-param-group", "--sequence-parallel"):
        assert f"  {option}\n" in launch
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" in launch


def test_deepspeed_moe_pipelines_with_tp_do_not_partition_their_activations() -> None:
    # DeepSpeed's pipeline engine asserts on the MoE layers' activations that require grad
    # (the auxiliary loss) while pipe_partitioned / grad_partitioned hold, both true by
    # default with tp > 1 (deepspeed/runtime/pipe/engine.py, runtime/config.py)
    import json

    training = TrainingSpec(global_batch=256, seq_len=4096)
    piped = Strategy(dp=16, tp=2, pp=2, ep=8, etp=1, zero=ZeroStage.OPTIMIZER)
    config = json.loads(export_files(_plan(MIXTRAL, piped, "dgx-h100-64", training),
                                     "deepspeed")["ds_config.json"])
    assert config["pipeline"] == {"pipe_partitioned": False, "grad_partitioned": False}
    flat = Strategy(dp=32, tp=2, ep=8, etp=1, zero=ZeroStage.OPTIMIZER)
    config = json.loads(export_files(_plan(MIXTRAL, flat, "dgx-h100-64", training),
                                     "deepspeed")["ds_config.json"])
    assert "pipeline" not in config


def test_deepspeed_refuses_what_its_moe_layer_cannot_hold() -> None:
    assert "top-1 and top-2" in why_not("deepspeed", QWEN3, TRAINING, EP16)
    shared = CATALOG.model("deepseek-v3")
    assert "top-1 and top-2" in why_not("deepspeed", shared, TRAINING, EP16)

    assert shared.moe is not None
    top2 = replace(shared, moe=replace(shared.moe, top_k=2))
    assert "first_dense 3" in why_not("deepspeed", top2, TRAINING, EP16)
    no_dense = replace(top2, moe=replace(top2.moe, first_dense=0))
    assert "shared expert" in why_not("deepspeed", no_dense, TRAINING, EP16)


def test_export_all_of_an_moe_study_writes_what_runs(tmp_path, monkeypatch, capsys) -> None:
    # STAGE builds dense transformers only: --format all said so as an error, exit 2, and wrote
    # nothing; it is a note like a framework's refusal, and the other formats are written
    from planner.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "moe.yaml").write_text(
        "model: qwen3-30b-a3b\nsystem: dgx-h100-16\nframework: megatron\n"
        "training: {global_batch: 1024, seq_len: 4096}\nobjectives: [step_time]\n"
        "space: {tp: [1], pp: [1], ep: [16], zero: [1], recompute: [full], micro_batch: [1]}\n")
    assert main(["run", "moe.yaml", "--quiet"]) == 0
    assert main(["export", "moe", "--format", "all", "--out", "out"]) == 0
    out = capsys.readouterr().out
    assert "plan 1: no astra-sim files: STAGE cannot build it: qwen3-30b-a3b has MoE layers" in out
    (folder,) = (tmp_path / "out").iterdir()
    assert {"plan.yaml", "megatron.sh"} <= {f.name for f in folder.iterdir()}
    assert main(["export", "moe", "--format", "astra-sim", "--out", "out2"]) == 2
    assert "--format astra-sim: plan 1: STAGE cannot build it" in capsys.readouterr().err


@pytest.mark.parametrize(("model", "total", "active"), [
    ("mixtral-8x7b", 46.7, 12.9),  # Mistral AI, "Mixtral of experts" (2024): 46.7B, 12.9B
    ("deepseek-v3", 671, 37),  # arXiv:2412.19437 abstract: 671B total, 37B activated
    ("qwen3-235b-a22b", 235, 22),  # Qwen3 technical report, Table 2: 235B, 22B activated
])
def test_the_catalog_lists_an_moe_models_parameters_and_active_ones(model, total, active,
                                                                      capsys) -> None:
    # the listing counted a dense FFN per layer: Mixtral at 7.2B
    from planner.cli import main

    assert main(["catalog", "models"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.split()[0] == model)
    figures = row.split()[2:5]
    assert float(figures[0]) == pytest.approx(total, rel=0.025)
    assert figures[1].startswith("(") and figures[2] == "active)"
    assert float(figures[1][1:]) == pytest.approx(active, rel=0.03)


def test_torchtitan_moe_replication_keeps_its_toml() -> None:
    # qwen3's parallelize.py (73a0e697) checks dp_mesh.ndim itself, which a dp_replicate mesh
    # passes: llama3's DDP refusal beside tp is not its
    plan = _plan(QWEN3, Strategy(dp=8, tp=2, ep=1, etp=1, zero=ZeroStage.NONE))
    assert "torchtitan.toml" in export_files(plan, "torchtitan")
