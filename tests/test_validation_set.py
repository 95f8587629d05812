"""The project's validation set (tests/data/validation, README there) through `planner validate`
and `planner calibrate`: the devices were fit on the *-fit files, these figures are checked on
the *-check files (never the same rows)."""

from __future__ import annotations

import csv
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from planner.calibration import calibrate
from planner.catalog import load_catalog
from planner.cli import main
from planner.runs_csv import read_runs
from planner.validation import validate
from simcore.specs import Precision

DATA = Path(__file__).parent / "data" / "validation"

# Issue 14's targets on runs not fit on: median step-time error <= 8% and plan-choice regret
# <= 3% where a source measured several plans. What this set reaches (README's table) is held
# here with a small margin, so a modelling change that loses accuracy fails.
# measured 4.8% (4.7% with two Lucie rows at micro-batch 2, not their table's 4; 4.4% with MPT's
# dropout; 5.9% before the early stop)
A100_CHECK_MEDIAN = 0.05
# measured 7.0% (6.6% with MPT's dropout kernels, 6.8% before per-op selective recompute, 7.1%
# before the early stop, 8.9% with assumed links)
A100_CHECK_MAPE = 0.075
A100_CHECK_REGRET = 0.03  # measured 0.9% (7.0% with the assumed Omni-Path)
# measured 2.8% over 28 runs (the 2020 rows alone 3.0%; 27.8% with the A100 fit on llm-foundry
# alone)
A100_MEGATRON_CHECK_MAPE = 0.04
SC21_TABLE_1_MAX_ERROR = 0.08  # measured -6.3% at worst (GPT 76.1B), +1.0% the other way
ZB_PAPER_MEMORY_MEDIAN = 0.05  # measured 1.8%; the memory allowance is not fit on these
ZB_CHECK_MEDIAN = 0.04  # measured 2.5% (the paper's Tables 6-7 at pp 16-32, not fit on)
ZB_CHECK_MEMORY_MEDIAN = 0.03  # measured 1.7%
H100_CHECK_MEDIAN = 0.035  # measured 2.6% (2.5% with MPT's dropout; 6.6% before the early stop)
V100_CHECK_REGRET = 0.03  # measured 2.0%
# Below issue 14's targets, held so that they do not get worse (README there: Megatron-Core with
# Transformer Engine in FP8 on H100 runs faster than the llm-foundry-fit H100 says).
H100_MEGATRON_FIT_MEDIAN = 0.045  # measured 3.3% (fit on these rows: fused_attention_efficiency)
H100_MEGATRON_CHECK_MEDIAN = 0.07  # measured 6.2% over 12 runs (6.4% over the 4 before them;
# Llama 3 70B +5 to +8%, all slow; Llama 3.1 405B -5 to -13%, all fast)
MOE_CHECK_MEDIAN = 0.095  # measured 8.9% (9.6% before Qwen3-30B-A3B's pp 2 run was read with its
# recipe's overlapped DeepEP dispatch; 8.2% before Megatron-Bridge's DeepSeek-V3 row, -24.2%)
MOE_CHECK_MAPE = 0.155  # measured 14.7%: DeepSeek-V3's report +42%, Megatron-Bridge's -26%
ONE_NODE_REGRET = 0.01
# B200 (h100-sxm's constants, MAMF-scaled matmul; not calibrated): refitting it on b200-fit.csv
# (4.0 -> 1.1%) moves b200-check.csv from 11.4 to 12.5% MAPE, so the device keeps its constants.
B200_FIT_MEDIAN = 0.055  # measured 4.0% (Llama 3 8B: +2.9%, +5.1%)
B200_CHECK_MEDIAN = 0.11  # measured 9.9% (Llama 3.1 405B -9.5%, -9.9%; Qwen3-30B-A3B +14.9%)
# GB200 (the b200 entry's constants but the TE GEMM rate, fit on Megatron-Bridge's 21 runs; README,
# "GB200 NVL72"): the fit file measured 3.9% MAPE (7.2% before the fit); the check's six 405B runs
# at tp 4 x pp 8 x cp 2 BF16 -1 to -3% (-2 to -4% before the context-parallel ring's merges,
# -10 to -11% before the fit), FP8 -13 to -14% (-14 to -16%; -20 to -21%).
GB200_FIT_MAPE = 0.045
GB200_CHECK_MEDIAN = 0.045  # measured 3.6% (8.9% over dgxc's six alone; 15.6% before the fit)
# GPT-3 175B on 128-2,048 H100s (README, "GPT-3 175B on H100"): FP8 estimated 10-24% fast.
GPT3_CHECK_MAPE = 0.05  # measured 4.7% (10.9% before TE's attention cost the host the unfused
# core's kernels, stop 71; 9.4% before the TE GEMM rate's refit to 0.666)
# NeMo's long-context tables (4K-1M tokens): the attention constant is of a newer stack than
# NeMo 24.03's (README there), so the long H100 rows come out fast.
# up to 8K on H100, 16K on B200: measured -2.2, -5.5, -0.7, -0.6% (-0.5, -4.1 on H100 before the
# TE GEMM rate's refit to 0.666; +3.0, -1.0 before the TE stack's GEMM rate,
# fused_matmul_efficiency: gpus.yaml's header)
LONG_CONTEXT_SHORT_ERROR = 0.06
FLASH_ATTENTION_CHECK_MAPE = 0.05  # measured 4.2%
LONG_CONTEXT_MEDIAN = 0.125  # measured 11.7% (12.6% before the context-parallel ring's merges)
# Every *-check file together: the issue's targets are stated on the runs gathered and not fit
# on, as one set.
ALL_CHECKS_RUNS = 1192  # 1149 before amp-het-check.csv's 43, 1102 before amp-t4-check.csv's
# 47, 1095 before
# dlperf-v100-check.csv's 7, 1082 before
# megatron-ci-2024-a100-check.csv's 13, 848 before
# aleph-alpha-a100-check.csv's 234, 771 before
# bloom-sweeps-a100-check.csv's 77, 768 before
# mlperf-check.csv's three AMD Instinct runs, 731 before megatron-ci-gb200-check.csv's 37,
# 726 before bigscience-megatron-v100-check.csv's 5, 721 before
# flash-attention-a100-check.csv's 5, 711 before
# libai-v100-check.csv's 10, 529 before nvfp4-check.csv's 9 and qwen3-blackwell-check.csv's 11,
# 549 before mlperf-check.csv's 42, 591 before internlm-check.csv's 32, 623 before
# megatron-ci-h100-check.csv's 41, 664 before flagperf-check.csv's 20, 684 before its 27
# PaddleNLP, DeepSpeed and MoE runs
# measured 4.8% (5.4% before the SC21 paper's Table 1 and NeMo Megatron's 2022 A100 runs
# joined; 5.3% with AutoModel's 70B read with no recompute, 5.1% with MPT's dropout kernels, 5.2%
# before per-op recompute, 4.7% before long-context-check, 4.4% before b200-check)
# 6.2% when Jean Zay's 2024 sequence-4096 runs joined (38 runs, 19.8%); 4.6% with Omni-Path's
# communicators adding up and launch blocking's host time (6.6% on them): README, "Jean Zay's
# 2024 runs"
# 4.8% with KempnerForge's H200 runs (14 runs, 8.9%); 5.3% with nanotron's H100 runs (26 runs,
# 15.0%: README, "nanotron's H100 runs"); the files before them 4.8%
# 5.5% with dgxc-benchmarking's 70 H100 check runs (6.0% on them: README, "NVIDIA's DGX Cloud
# benchmarks"), 5.3% before them; 4.8% with the TE stack's GEMM rate fit on the benchmarks'
# first release (fused_matmul_efficiency: 3.1% on them); 5.3% with 27 GB200 runs (Megatron-Bridge's
# and dgxc's: 8.1% on them) and Megatron-Bridge's 8 later H100 runs (6.2% on h100-megatron-check);
# 4.6% with Nemotron-4's 79 runs (2.7% on them: README, "Nemotron-4"); 4.4% with Megatron-Bridge's
# 21 GB200 runs moved to gb200-fit.csv and the GB200's GEMM rate fit on them; 4.5% with GPT-3 175B's
# 20 H100 runs (9.0% on them: README, "GPT-3 175B on H100"), and with Megatron-Bridge's 7 GB200
# runs that offload activations (README, "Activation offloading"), and with 11 GB300 runs;
# 4.5% with NVFP4's 9 check runs (11.3% on them: README, "NVFP4"), 4.6% with Qwen3-30B-A3B's 11
# Blackwell MXFP8 runs (7.4% on them); 4.8% with MLPerf's 42 runs (6.9% on them: README,
# "MLPerf Training"); 5.3% with InternLM's 32 A100 runs (10.5% on them: README, "InternLM's A100
# runs"), the files before them 4.8%; 5.1% with the context-parallel ring's merges
# (tests/test_cp_comm.py: the 118 check runs at cp 2 or more, mean error -4.6% -> -2.3%);
# 5.09% with the host's time per kernel (gpus.yaml's host_kernel_us; 5.12% before), 5.7% with
# Megatron-LM's 41 functional tests of its small GPT on H100 (31% on them, 82% before the host's
# time: README, "The host's pace"), 5.75% with FlagPerf's 20 runs (10.4% on them: README,
# "FlagPerf's Megatron-LM runs"), 5.89% with its other 27 (9.8% on them: README, "FlagPerf's
# other stacks"), 5.89% with LiBai's 10 V100 runs (6.3% on them: README, "LiBai's Megatron-LM
# runs"), 5.87% with FlashAttention's 5 single-node A100 runs (4.9% on them: README,
# "FlashAttention's A100 runs"), 5.35% with the H100-era NVLink's ring and NVLS rates apart and
# the TE GEMM rate refit (README, "The H100-era NVLink's two rates"), 5.28% with a group's own
# links on nodes without an NVSwitch (README, "NVLink without a switch"), 5.30% with BigScience's
# five Megatron-LM V100 runs, 5.62% with Megatron-LM's 37 functional tests of its small GPT on
# GB200 (18.8% on them, estimated fast: README, "Megatron-LM's small GPT on GB200"), 5.40% with
# BigScience's 77 BLOOM topology sweeps (4.9% on them: README, "BigScience's BLOOM topology
# sweeps"), 5.32% with Megatron-DeepSpeed's synchronous tp all-reduce (async_tp_allreduce),
# 6.53% with Aleph Alpha's 234 layout-sweep runs (11.3% on them, estimated fast: README, "Aleph
# Alpha's layout sweep"; 6.09% with the 130 of them on a fused norm alone); 6.17% with
# Megatron-LM's 13 functional tests of 2024 on A100 (23.3% on them, estimated slow: README,
# "Megatron-LM's 2024 A100 tests"), 6.13% before; 6.14% with AMP's 47 T4 runs (53.3% on them:
# the T4 is not calibrated; README, "AMP's T4 sweep"), 5.75% before; 6.45% with AMP's 43 runs on
# a cluster of V100s and T4s (45.5% on them: README, "AMP's heterogeneous cluster"); 6.48% with
# the T4's GEMM rate scaled from measured GEMMs (stop 83: 39.3 and 36.4% on AMP's two files)
ALL_CHECKS_MEDIAN = 0.07
# measured 2.1% over 18 runs: the zero-bubble paper's 14 check peaks (1.7%), torchtitan's two H100
# FSDP runs (-1.8%, -0.2%; +0.5%, +0.0% before FSDP's fp32 shards) and Megatron-LM's functional
# tests' two (-9.0%, -10.6%; the 16 before them: 1.4%); 4.1% over 32 since KempnerForge's 14
# H200 runs joined (10.4% on them: README, "KempnerForge's H200 runs"); 6.6% over 58 since
# nanotron's 26 H100 runs joined (11.8% on them): over the issue's 5%, which the files before
# them (4.1% over 32) still met
ALL_CHECKS_MEMORY_MEDIAN = 0.045  # measured 2.47% over 188 runs (MAPE 4.7%) with the BLOOM
# sweeps' 31 first-node peaks (4.2% on them), 2.18% over 157 before; 2.48% over 123 runs (MAPE
# 5.4%) since Megatron-LM's
# small-GPT H100 peaks (38), Megatron-LM's loss and the devices' workspace_gb (README, "Allocated
# peaks"); 4.27% over 83 runs since BigScience's five Megatron-LM
# V100 peaks (12.3% on them: README, "Megatron-LM's fp32 gradient copy at the step"); 4.10% over
# 78 once megatron-ci-check's rows said grad_bytes 4 (4.11% before); 4.08% over the 58 before
# PaddleNLP's 20 peaks (6.5% on them: README, "FlagPerf's other stacks"), 6.6% before
# KempnerForge's rows were read as its code runs (FSDP over one rank, no_sync, the whole
# embedding, the held logits), 4.10% before nanotron's own loss
EARLIER_CHECKS_MEMORY_MEDIAN = 0.03  # measured 2.3% (4.1% before KempnerForge's reading)
# Runs estimated over the memory they ran in (`fit:` in planner validate), held so that it does
# not grow: measured 0 of 246. It was 54: the parts' capacity as
# the driver reports it (80 GiB, not 80e9 bytes) took it to 39, MPT without dropout to 29, the
# A100 40GB's allowance scaled by capacity (4.5 GB, not 9) to 2, NeMo AutoModel's Llama 3 70B read
# with its committed configuration (full recompute, not none) to 1, Megatron-Bridge's DeepSeek-V3
# with its recompute_modules (mla_up_proj and mlp: 95.5 -> 78.1 GB on 85.5) to 0. The fit files'
# 29 went 11, 9, then 0 with PyTorch FSDP's fp32 shards. 1 of 1082 (1095 now) since Aleph
# Alpha's layout sweep: its Llama 65B at tp 8 x pp 4, micro-batch 4, without recompute on 64
# A100s, estimated at 88.9 GB of 85.9 (README, "Aleph Alpha's layout sweep").
ALL_CHECKS_OVER_MEMORY = 1
# measured 0.63% over 50 groups (0.67% over 47 before the GB200 tests' three; 0.75% over 42 before
# PaddleNLP's five and 0.85% over 37 before FlagPerf's first five, where the fastest plan is
# picked in each; 0.8% over 34 before Megatron-LM's functional tests on H100, their three groups
# 1.4%; 1.0% over 26 before InternLM's eight; the issue's target: 3%; 28 before moe-check's rows
# named their releases, which keeps Qwen3-30B-A3B's two containers apart, 27 before
# h100-megatron-check's did, which keeps Megatron-Bridge's 70B from NeMo AutoModel's on 64 H100s).
# It was 3.4% when Jean Zay's 2024 sequence-4096 runs joined (their six groups 12.5%: a
# micro-batch-1 plan picked in each), 2.6% on them since launch blocking's host time; the files
# before them 0.7% over 20 groups. 0.95% over 65 since BigScience's BLOOM topology sweeps (their
# 15 groups 2.0%, read with their launch blocking; 10.7% read without it: README, "BigScience's
# BLOOM topology sweeps"); the files before them 0.63% over 50. 0.87% over 65 with
# Megatron-DeepSpeed's synchronous tp all-reduce (the BLOOM groups 1.7%), 1.02% over 79 with
# Aleph Alpha's layout sweep (its 14 groups 1.7%, the fastest picked in 11; 0.84% over 74 with
# its 9 fused-norm groups alone); 0.99% over 84 with AMP's mixed-cluster plans (20.3% on them:
# README, "AMP's heterogeneous cluster"), 0.75% over the 83 before.
ALL_CHECKS_REGRET = 0.015
EARLIER_CHECKS_REGRET = 0.015
# Jean Zay's 2024 runs (README, "Jean Zay's 2024 runs"): what the estimate reaches on them,
# held so that it does not grow.
JEAN_ZAY_FIT_MAPE = 0.085  # measured 7.9% (28.6% before the two constants fit on it)
JEAN_ZAY_FIT_REGRET = 0.005  # measured 0.0% over 6 groups, the fastest picked in each
JEAN_ZAY_CHECK_MEDIAN = 0.07  # measured 6.6% (19.8% before)
JEAN_ZAY_CHECK_REGRET = 0.03  # measured 2.6% over 6 groups (12.5% before)
# KempnerForge's H200 runs (README, "KempnerForge's H200 runs"): the h200 entry is h100-sxm's
# constants, not fit on any H200 run; held so that it does not get worse.
KEMPNER_MEDIAN = 0.085  # measured 7.8% (plans without tp +6..+41%, with tp +2..-24%; 8.3% while a
# tp 2 group had the board's whole NVLink rate)
KEMPNER_MEMORY_MEDIAN = 0.03  # measured 2.9% (2.7% before workspace_gb; 29.7% read as
# torchtitan's FSDP stack, 10.4% with pure bf16, no_sync and the gathered loss; README:
# "KempnerForge's memory, read as its code runs")
# nanotron's H100 runs (README, "nanotron's H100 runs"): nothing is fit on them; held so that
# they do not get worse.
NANOTRON_MEDIAN = 0.16  # measured 15.0% (14.1% with the fused SwiGLU)
NANOTRON_MEMORY_MEDIAN = 0.115  # measured 11.1% (11.8% with Megatron-LM's loss, 19.1% with the
# fused SwiGLU)


def _validate(capsys, name: str) -> dict:
    assert main(["validate", str(DATA / name), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_row_is_expressed(capsys) -> None:
    for name in ("a100-fit.csv", "a100-check.csv", "a100-megatron-fit.csv",
                 "a100-megatron-check.csv", "h100-fit.csv", "h100-check.csv",
                 "v100-fit.csv", "v100-check.csv", "h100-megatron-fit.csv",
                 "h100-megatron-check.csv", "moe-check.csv", "a100-zb-check.csv",
                 "b200-fit.csv", "b200-check.csv", "long-context-check.csv",
                 "jean-zay-fit.csv", "jean-zay-check.csv", "megatron-ci-check.csv",
                 "kempner-h200-check.csv", "nanotron-h100-check.csv", "dgxc-h100-check.csv",
                 "gb200-fit.csv", "gb200-check.csv", "nemotron-check.csv",
                 "gpt3-h100-check.csv", "gb300-fit.csv", "gb300-check.csv",
                 "libai-v100-check.csv", "flash-attention-a100-check.csv",
                 "bigscience-megatron-v100-check.csv", "megatron-ci-gb200-check.csv",
                 "aleph-alpha-a100-check.csv", "dlperf-v100-check.csv", "amp-t4-check.csv",
                 "amp-het-check.csv"):
        assert _validate(capsys, name)["skipped"] == [], name


def test_every_check_together_meets_the_issue_targets(capsys) -> None:
    # Issue 14: "on the runs you gather (not fit on): median step-time error <= 8%, memory
    # <= 5%, and the plan-choice regret mean <= 3%". Every check file joins (a new one too).
    checks = sorted(str(path) for path in DATA.glob("*-check.csv"))
    assert len(checks) == 36  # 31 before aleph-alpha- and bloom-sweeps-a100-oom-check.csv
    # (plans that ran out of memory: no timed run), 33 before dlperf-v100-check.csv, 34 before
    # amp-t4-check.csv, 35 before amp-het-check.csv
    assert main(["validate", *checks, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["skipped"] == []
    assert data["out_of_memory_runs"] == 308  # Aleph Alpha's 305 plans that did not fit, and
    # three of BigScience's BLOOM sweeps
    assert data["step_time_runs"] == ALL_CHECKS_RUNS
    assert data["groups_count"] == 84  # 83 before AMP's mixed-cluster plans (regret 20.3%:
    # README there), 82 before AMP's T4 plans, 81 before DLPerf's 4-node
    # V100 plans, 79 before the
    # 2024 A100 tests' two, 65 before Aleph
    # Alpha's 14, 50 before the BLOOM sweeps'
    # 15, 47 before the GB200
    # tests' three, 42 before PaddleNLP's
    assert data["step_time_median_ape"] <= ALL_CHECKS_MEDIAN <= 0.08
    assert data["memory_median_ape"] <= ALL_CHECKS_MEMORY_MEDIAN <= 0.05
    assert data["regret_mean"] <= ALL_CHECKS_REGRET
    assert data["over_memory_runs"] <= ALL_CHECKS_OVER_MEMORY
    earlier = [path for path in checks if "jean-zay" not in path and "bloom-sweeps" not in path]
    assert main(["validate", *earlier, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["regret_mean"] <= EARLIER_CHECKS_REGRET <= 0.03
    # nanotron's runs miss the memory target on their own (README, "nanotron's H100 runs"); the
    # files before them meet it by more (dgxc-h100-check, which joined after them, has no peaks:
    # its step times are held in tests/test_dgxc_runs.py, gb200-check's in
    # test_gb200_fit_and_check_error, nemotron-check's in tests/test_nemotron.py, gpt3-h100-check's
    # in test_gpt3_h100_check, gb300-check's in tests/test_gb300.py, mlperf-check's in
    # tests/test_mlperf_runs.py, internlm-check's in tests/test_internlm_runs.py, flagperf-check's
    # in tests/test_flagperf_runs.py)
    later = ("nanotron", "dgxc", "gb200", "nemotron", "gpt3", "gb300", "mlperf", "internlm",
             "megatron-ci-h100", "flagperf", "libai", "flash-attention", "bigscience-megatron",
             "megatron-ci-gb200", "bloom-sweeps", "aleph-alpha", "amp-t4", "amp-het")
    before = [path for path in checks if not any(name in path for name in later)]
    assert main(["validate", *before, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["memory_median_ape"] <= EARLIER_CHECKS_MEMORY_MEDIAN <= 0.05
    # measured 5.1% over 310 runs (under 5% before h100-megatron-check's 8 later Megatron-Bridge
    # runs joined: its 70B rows are estimated 5-8% slow)
    assert data["step_time_median_ape"] <= 0.055


def test_flash_attention_check_error(capsys) -> None:
    # FlashAttention's own GPT-3 125M-2.7B on one node of 8 A100 80GB, data parallel (README,
    # "FlashAttention's A100 runs"): measured 4.2% MAPE (+5.4, +4.9, -6.6, +2.1, -2.0%), not fit on
    data = _validate(capsys, "flash-attention-a100-check.csv")
    assert data["step_time_runs"] == 5
    assert data["step_time_mape"] <= FLASH_ATTENTION_CHECK_MAPE


def test_a100_check_error(capsys) -> None:
    data = _validate(capsys, "a100-check.csv")
    assert data["step_time_runs"] == 104
    assert data["step_time_median_ape"] <= A100_CHECK_MEDIAN
    assert data["step_time_mape"] <= A100_CHECK_MAPE


def test_a100_check_ranking(capsys) -> None:
    # Lucie-7B's plans on one and two Jean Zay nodes (5 groups of 5 plans with llama2-13b's
    # two on 64 A100): the plan the estimate picks is measured within 3% of the fastest. With
    # the Omni-Path links assumed from the line rate (3.8 GB/s per GPU, not 0.494 as measured
    # on that cluster) it picked data parallelism across both nodes, 31% slower at batch 192.
    data = _validate(capsys, "a100-check.csv")
    assert data["groups_count"] == 5
    assert data["regret_mean"] <= A100_CHECK_REGRET
    two_nodes = [g for g in data["groups"]
                 if g["key"]["system"] == "jean-zay-a100-16"]
    assert len(two_nodes) == 2 and two_nodes[0]["picked"] == two_nodes[0]["fastest"]


def test_megatron_2020_table_error(capsys) -> None:
    # Megatron-LM's 2020 DGX-A100 weak scaling (tp 1-8 on one node, and x 128 data parallel),
    # not fit on: the single-node small-GPT regime with full recompute; and the SC21 paper's
    # Table 1 (GPT 1.7B-1T on 32-3,072 A100s, the plans of Megatron-LM's examples/sc21); and
    # NeMo Megatron's 2022 strong scaling (GPT-3 5B on 1-20 nodes, 175B on 16-128)
    data = _validate(capsys, "a100-megatron-check.csv")
    assert data["step_time_runs"] == 28
    assert data["step_time_mape"] <= A100_MEGATRON_CHECK_MAPE


def test_sc21_weak_scaling_from_32_to_3072_gpus(capsys) -> None:
    # Narayanan et al. 2021 Table 1: tp 1-8, pp 1-64, interleaved v 2-3, 32 to 3,072 A100s.
    # Every size within 8% of its measured step, and the estimate's step time grows with the
    # model as the measured one does (3.5 s at 1.7B to 103 s at 1T; each row's measured time
    # is the paper's TFLOP/s per GPU read back through its Eq. 3, the CSV's source column).
    rows = [r for r in _validate(capsys, "a100-megatron-check.csv")["rows"]
            if r["name"].startswith("Megatron-LM SC21")]
    assert len(rows) == 10
    assert all(abs(r["step_time_error"]) <= SC21_TABLE_1_MAX_ERROR for r in rows), rows
    measured = sorted(rows, key=lambda r: r["measured_step_time_s"])
    predicted = [r["predicted_step_time_s"] for r in measured]
    assert predicted[0] < predicted[4] < predicted[-1]


def test_nemo_megatron_strong_scaling_speed_up(capsys) -> None:
    # NeMo-Framework-Launcher@d4317ddd README 7.1.2: GPT-3 5B at batch 1440 on 1 -> 20 DGX A100
    # nodes, 39,543 -> 731,791 tokens/s, "18.51x" (not the 20x of perfect scaling: the
    # data-parallel all-reduce stays as the micro-batches per GPU fall from 180 to 9); 175B on
    # 16 -> 128 nodes, 20,642 -> 141,306 tokens/s, "6.85x" of 8x.
    rows = {r["name"]: r for r in _validate(capsys, "a100-megatron-check.csv")["rows"]}
    five = [rows[f"NeMo Megatron 2022 GPT-3 5B x{g}"]["predicted_step_time_s"] for g in (8, 160)]
    big = [rows[f"NeMo Megatron 2022 GPT-3 175B x{g}"]["predicted_step_time_s"]
           for g in (128, 1024)]
    assert five[0] / five[1] == pytest.approx(731_791 / 39_543, rel=0.05)  # measured 18.51x
    assert five[0] / five[1] < 20
    assert big[0] / big[1] == pytest.approx(141_306 / 20_642, rel=0.05)  # measured 6.85x
    assert big[0] / big[1] < 8


def test_zero_bubble_paper_memory_and_schedule_choice(capsys) -> None:
    # The zero-bubble paper's measured peaks (PyTorch's allocated memory) and its 29 pairs of
    # 1F1B and a zero-bubble schedule of one question: ZB-1p (ZB-H1's memory limit; its
    # bubble equals ZB-H1's in the paper's Table 5) and ZB-2p with m <= p ("essentially the
    # same", appendix H) measured faster in every pair, and the estimate picks it every time.
    data = _validate(capsys, "a100-megatron-fit.csv")
    assert data["memory_runs"] == 62
    assert data["memory_median_ape"] <= ZB_PAPER_MEMORY_MEDIAN
    assert data["groups_count"] == 29
    assert all(g["picked"] == g["fastest"] and "ZB" in g["picked"] for g in data["groups"])


def test_zero_bubble_paper_check_at_16_to_32_stages(capsys) -> None:
    # The same paper's Tables 6 and 7 (1F1B against ZB-1p, 16-32 GPUs, pp = GPUs), without the
    # settings the fit file holds (Tables 4 and 11 measured 28.3B at mb 2 with m 96 and 256 and
    # at mb 1 with m 128 too): step time, the allocated peaks of Table 6, and the faster
    # schedule picked in each of the 9 pairs.
    data = _validate(capsys, "a100-zb-check.csv")
    assert (data["step_time_runs"], data["memory_runs"], data["groups_count"]) == (18, 14, 9)
    assert data["step_time_median_ape"] <= ZB_CHECK_MEDIAN
    assert data["memory_median_ape"] <= ZB_CHECK_MEMORY_MEDIAN
    assert data["regret_mean"] == 0.0


def test_one_node_plans_ranked_as_measured(capsys) -> None:
    # Lucie-7B on one node of 8 A100 (5 plans each at batch 192 and 512) and DLPerf's GPT
    # 1536x16 on one DGX-1 (dp 8, dp 2 x tp 4, dp 4 x tp 2, tp 8): the planner's first choice
    # is the measured fastest (the DLPerf group holds one plan measured twice: 0.2% apart).
    groups = _validate(capsys, "a100-check.csv")["groups"]
    groups += _validate(capsys, "v100-fit.csv")["groups"]
    one_node = [g for g in groups
                if g["key"]["system"] in ("jean-zay-a100-8", "dgx1-v100-8")]
    assert len(one_node) == 3
    assert all(g["regret"] <= ONE_NODE_REGRET for g in one_node), one_node


def test_lucie_runs_fit_in_the_memory_they_ran_in(capsys) -> None:
    # Lucie-Training's chronicles/parallelism/parallelism.md: each plan ran at "the maximum
    # Micro Batch Size (MBS) that does not cause OOM" on A100 80GB, so each fits. DeepSpeed
    # 0.12.6 (its requirements.txt) trains bf16 "ZeRO stage 0" with the BF16_Optimizer, which
    # shards the fp32 master weights and Adam states (the rows say zero 1, fp32 gradients):
    # as ZeRO-0 seven of these runs were estimated at 86-92 GB.
    rows = [r for r in _validate(capsys, "a100-check.csv")["rows"]
            if r["name"].startswith("Lucie")]
    assert len(rows) == 20
    assert all(r["fits"] and r["predicted_peak_memory_gb"] <= 80 for r in rows), rows


def test_h100_check_error(capsys) -> None:
    data = _validate(capsys, "h100-check.csv")
    assert data["step_time_median_ape"] <= H100_CHECK_MEDIAN


def test_megatron_ci_2024_a100_ranks_as_measured(capsys) -> None:
    """Megatron-LM's nightly tests of May 2024 of its small GPT on one DGX A100 (README there,
    "Megatron-LM's 2024 A100 tests"): a year before the tests the A100's host time is fit on, the
    plans of each stack are ranked as measured; the legacy models, whose Python is lighter than
    Megatron-Core's (0.85-0.89 of its measured time on the same plans), come out slower against
    their measure than Megatron-Core's on every plan both ran."""
    data = _validate(capsys, "megatron-ci-2024-a100-check.csv")
    assert data["skipped"] == []
    assert data["groups_count"] == 2 and data["regret_mean"] == 0.0
    assert data["kendall_tau_mean"] >= 0.9  # measured 0.94 (0.89 and 1.00)
    assert data["step_time_mape"] <= 0.25  # measured 23.0%
    rows = {r["name"].removeprefix("Megatron-LM CI A100 2024 "): r for r in data["rows"]}
    for plan in ("tp1_pp2", "tp1_pp4", "tp4_pp1"):
        legacy, core = rows[plan], rows[f"mcore_{plan}"]
        assert legacy["step_time_error"] > core["step_time_error"] + 0.1, plan


def test_megatron_ci_7b_peaks(capsys) -> None:
    # Megatron-LM's 7B functional tests (NVIDIA/Megatron-LM@6e091e1b68 and @adc69dba2d,
    # gpt3_7b_tp{1_pp4,4_pp1}_memory_speed): mem-max-allocated-bytes 60.72 / 60.49 GB (pp 4, the
    # last rank's: the last stage, memory_stage last) and 57.14 / 58.19 GB (tp 4), H100 / A100.
    # They train --bf16 without --grad-reduce-in-bf16 (grad_bytes 4: fp32 main gradients; read
    # with 2 the tp 4 peaks were -9.0% and -10.6%) and with Megatron-LM's unfused loss, whose
    # fp32 copy of the bf16 logits makes 6 bytes a logit (cross_entropy megatron: -3.1 / -4.8%
    # with 4), and the allocator counts the GEMM libraries' 0.1 GB of workspaces (workspace_gb).
    data = _validate(capsys, "megatron-ci-check.csv")
    peaks = [row for row in data["rows"] if row["measured_peak_memory_gb"] is not None]
    assert [row["measured_peak_memory_gb"] for row in peaks] == [60.72, 60.49, 57.14, 58.19]
    assert all(-0.035 < row["memory_error"] < 0 for row in peaks), peaks  # -0.6..-2.8%


def test_h100_megatron_fit_and_check_error(capsys) -> None:
    fit = _validate(capsys, "h100-megatron-fit.csv")
    assert fit["step_time_runs"] == 9
    assert fit["step_time_median_ape"] <= H100_MEGATRON_FIT_MEDIAN
    check = _validate(capsys, "h100-megatron-check.csv")
    assert check["step_time_runs"] == 12 and check["groups"] == []  # a release each
    assert check["step_time_median_ape"] <= H100_MEGATRON_CHECK_MEDIAN
    seventy = [row for row in check["rows"] if "llama3-70b" in row["name"]]
    assert len(seventy) == 6 and all(row["step_time_error"] > 0 for row in seventy)  # slow
    big = [row for row in check["rows"] if "405b" in row["name"]]
    assert len(big) == 5 and all(row["step_time_error"] < 0 for row in big)  # fast


def test_b200_fit_and_check_error(capsys) -> None:
    """Megatron-Bridge's DGX-B200 rows (tests/data/validation/README.md): the single-node
    Llama 3 8B comes out slow and the 128-GPU Llama 3.1 405B fast, as the H100's do
    (h100-megatron-check.csv)."""
    fit = _validate(capsys, "b200-fit.csv")
    assert fit["step_time_runs"] == 2 and fit["groups"] == []  # one plan, two releases
    assert fit["step_time_median_ape"] <= B200_FIT_MEDIAN
    assert all(row["step_time_error"] > 0 for row in fit["rows"])
    check = _validate(capsys, "b200-check.csv")
    assert check["step_time_runs"] == 3
    assert check["step_time_median_ape"] <= B200_CHECK_MEDIAN
    big = [row for row in check["rows"] if "405b" in row["name"]]
    assert len(big) == 2 and all(row["step_time_error"] < 0 for row in big)


def test_gb200_fit_and_check_error(capsys) -> None:
    """DGX-GB200 runs (README, "GB200 NVL72"): the device is the b200 entry's but for the TE
    stack's GEMM rate, fit on Megatron-Bridge's 21 runs (FP8 and MXFP8: Llama 3 8B on one NVLink
    domain, 70B on one rack, 3.1 405B on two and four racks); checked on dgxc-benchmarking's six
    405B runs (BF16 and FP8 on 128-512 GPUs), nearer than with the B200's rate, still fast, and
    Megatron-Bridge's 7 runs that offload activations (tests/test_offload.py)."""
    fit = _validate(capsys, "gb200-fit.csv")
    assert fit["step_time_runs"] == 21 and fit["skipped"] == [] and fit["groups"] == []
    assert fit["step_time_mape"] <= GB200_FIT_MAPE
    data = _validate(capsys, "gb200-check.csv")
    assert data["step_time_runs"] == 13 and data["skipped"] == [] and data["groups"] == []
    assert data["step_time_median_ape"] <= GB200_CHECK_MEDIAN
    errors = {row["name"]: row["step_time_error"] for row in data["rows"]}
    bf16 = [e for name, e in errors.items() if name.endswith("bf16")]
    fp8 = [e for name, e in errors.items() if name.endswith("fp8")]
    assert len(bf16) == 3 and all(-0.06 <= e <= 0.0 for e in bf16)  # -0.5 to -2.1%
    # -6.1 to -7.6% since FP8's casts and scale updates are host work (stop 71); -11.9 to -13.3%
    # before; -14.2 to -15.5%, BF16 -2.1 to -3.6%, before the NVLink's ring / NVLS split
    # (systems/dgx.yaml)
    assert len(fp8) == 3 and all(-0.10 <= e <= -0.04 for e in fp8)


def test_gb200_gemm_rate_is_the_fit_on_its_fit_file() -> None:
    """`planner calibrate tests/data/validation/gb200-fit.csv --device gb200 --fit
    fused_matmul_efficiency` (README, "Reproducing the calibration") from the device as it was
    (no TE GEMM rate of its own: the classic stack's 0.585, the B200's), its MXFP8 runs priced
    as FP8 as they were then, lands on the catalog's constant, rounded to three digits, and
    passes its cross-validation. With the MXFP8 runs at their own rate (README, "MXFP8") the
    same fit would move it to 0.567 (fit 3.7 -> 3.0% MAPE), which makes the checks worse
    (gb200-check.csv 6.0 -> 8.8%, every check 7.4 -> 7.5%): not taken."""
    catalog = load_catalog()
    device = catalog.device("gb200")
    runs, skipped = read_runs(DATA / "gb200-fit.csv", catalog)
    assert len(runs) == 21 and skipped == []
    as_fp8 = [replace(r, strategy=replace(r.strategy, precision=Precision.FP8)) for r in runs]
    start = replace(device, fused_matmul_efficiency=None)
    fit = calibrate(as_fp8, start, "gb200-refit", only=("fused_matmul_efficiency",))
    assert not fit.kept
    assert fit.device.fused_matmul_efficiency == pytest.approx(device.fused_matmul_efficiency,
                                                               abs=0.002)


def test_gpt3_h100_check(capsys) -> None:
    """dgxc-benchmarking's GPT-3 175B (README, "GPT-3 175B on H100"), nothing fit on it: BF16 of
    release 25.02 1.7-2.5% fast, its FP8 -1.5..+3.0% (measured FP8 speed-up 1.48x at 128 GPUs,
    the estimate's 1.41x): its FP8 layers, one a virtual stage at micro-batch 1, are shorter than
    the host's time to issue them, and Transformer Engine's attention costs the host the unfused
    core's kernels (stop 71; until then FP8 12-15% fast, the estimate's speed-up 1.66x; within
    1% and 10.5-14.2% before the TE GEMM rate's refit, 0.645 -> 0.666)."""
    data = _validate(capsys, "gpt3-h100-check.csv")
    assert data["step_time_runs"] == 20 and data["skipped"] == [] and data["groups"] == []
    assert data["step_time_mape"] <= GPT3_CHECK_MAPE
    errors = {row["name"]: row["step_time_error"] for row in data["rows"]}
    assert all(-0.03 <= e <= -0.01 for name, e in errors.items()
               if "25.02" in name and "bf16" in name)
    fp8 = [e for name, e in errors.items() if "25.02" in name and "fp8" in name]
    # -1.5 to +3.0% (-0.0 to +4.6% while FP8's casts were not host work and the H100's host
    # time was 150 us)
    assert len(fp8) == 5 and all(-0.025 <= e <= 0.04 for e in fp8)
    rows = {row["name"]: row for row in data["rows"]}
    speedup = (rows["dgxc 25.02 gpt3-175b bf16 x128"]["predicted_step_time_s"]
               / rows["dgxc 25.02 gpt3-175b fp8 x128"]["predicted_step_time_s"])
    assert 1.35 <= speedup < 8.309 / 5.626  # measured 1.48x, estimated 1.41x


def test_long_context_check(capsys) -> None:
    """NeMo's long-context tables: right while attention is a small part of the step, fast as
    it takes over (NeMo 24.03's fused attention ran at about a third of the H100's bf16 peak,
    the catalog's constant is of a newer release), and on B200 fast at every CP degree."""
    data = _validate(capsys, "long-context-check.csv")
    assert data["step_time_runs"] == 17 and data["skipped"] == []
    assert data["step_time_median_ape"] <= LONG_CONTEXT_MEDIAN
    rows = {row["name"].split(" (")[0].removeprefix("nemo "): row["step_time_error"]
            for row in data["rows"]}
    short = ["llama2-7b seq4k x4 tp1 pp1 cp1", "llama2-7b seq8k x8 tp1 pp2 cp1",
             "llama3-8b seq8k x2 tp1 pp1 cp1", "llama3-8b seq16k x4 tp1 pp1 cp1"]
    assert all(abs(rows[name]) <= LONG_CONTEXT_SHORT_ERROR for name in short)
    long_h100 = [e for name, e in rows.items() if name.startswith("llama2-7b")
                 and int(name.split("seq")[1].split("k")[0]) >= 32]
    # -18 to -27% (-20 to -29% before the context-parallel ring's merges, tests/test_cp_comm.py)
    assert len(long_h100) == 6 and all(-0.29 <= e <= -0.15 for e in long_h100)
    cp_b200 = [e for name, e in rows.items() if name.startswith("llama3-8b")
               and not name.endswith("cp1")]
    # -6 to -12% (-8 to -13% before the ring's merges)
    assert len(cp_b200) == 6 and all(-0.13 <= e <= -0.05 for e in cp_b200)


def test_classic_rows_are_estimated_without_transformer_engine(capsys) -> None:
    # llm-foundry's and torchtitan's H100 runs say transformer_engine false: the same step
    # time as an H100 without the stack (the fit those constants came from)
    catalog = load_catalog()
    runs, _ = read_runs(DATA / "h100-check.csv", catalog)
    assert runs and all(r.training.transformer_engine is False for r in runs)
    plain = replace(catalog.device("h100-sxm"), transformer_engine=False,
                    fused_attention_efficiency=None)
    on_plain = validate(runs, system_for=lambda r: replace(r.system, device=plain))
    as_given = validate(runs)
    assert [r.predicted_step_time_s for r in on_plain.results] == \
        [r.predicted_step_time_s for r in as_given.results]


def test_zero_2_and_3_h100_runs_take_the_classic_stack_by_default() -> None:
    # Every ZeRO-2/3 H100 run here is PyTorch FSDP without Transformer Engine: a user who
    # leaves the column out gets the step times of the stack they ran (the default follows
    # the plan's ZeRO stage: simcore.megatron.stack.uses_transformer_engine)
    catalog = load_catalog()
    for name in ("h100-fit.csv", "h100-check.csv"):
        runs, _ = read_runs(DATA / name, catalog)
        assert runs and all(r.strategy.zero >= 2 for r in runs), name
        unsaid = [replace(r, training=replace(r.training, transformer_engine=None))
                  for r in runs]
        assert [r.predicted_step_time_s for r in validate(unsaid).results] == \
            [r.predicted_step_time_s for r in validate(runs).results], name


def test_moe_check_error(capsys) -> None:
    data = _validate(capsys, "moe-check.csv")
    assert data["step_time_runs"] == 6
    assert data["step_time_median_ape"] <= MOE_CHECK_MEDIAN
    assert data["step_time_mape"] <= MOE_CHECK_MAPE
    # Qwen3-30B-A3B's two layouts on 16 H100s (two releases) measured 1% apart: ep 16 (-9.2%)
    # and pp 2 x vp 12 x ep 8 with Megatron-Bridge v0.3.0's overlapped DeepEP dispatch (+1.9%;
    # +10.1% read without the overlap its recipe sets)
    errors = {row["name"].split(" (")[0]: row["step_time_error"] for row in data["rows"]}
    assert -0.11 <= errors["Qwen3-30B-A3B x16 ep16"] <= -0.07
    assert 0.0 <= errors["Qwen3-30B-A3B x16 pp2 vp12 ep8"] <= 0.04


def test_v100_check_ranking(capsys) -> None:
    data = _validate(capsys, "v100-check.csv")
    assert data["groups_count"] == 4
    assert data["regret_mean"] <= V100_CHECK_REGRET


def test_dgx1_links_between_nodes(capsys) -> None:
    """The DGX-1s' InfiniBand all-reduce bandwidth (0.55 GB/s per GPU, systems/v100.yaml) is fit
    on DLPerf's two 16-GPU Megatron-LM runs whose collectives cross it (+7.1%, -5.2%; the
    derived 0.95 put them at -8.2% and -38.5%; since stop 75 the tp 16 run reads as Megatron-LM
    8aa4619 ran it, its backward's tp all-reduce synchronous: -3.2%, 0.55 still the best in
    steps of 0.05) and checked on DLPerf's DeepSpeed runs on the same
    two nodes (-29.9% and -34.4% since DeepSpeed's fp32 gradient partition, -30.5% and -34.4%
    before; -34.3% and -38.1% once, -44.4% and -47.8% with 0.95: the single-node runs are
    30-34% fast too, DeepSpeed's own overheads)."""
    fit = {r["name"]: r["step_time_error"] for r in _validate(capsys, "v100-fit.csv")["rows"]}
    assert all(abs(fit[f"DLPerf Megatron {case}"]) < 0.08
               for case in ("DP_16x1x1_32_1536x16", "MP_1x16x1_16_3072x16"))
    check = _validate(capsys, "v100-check.csv")["rows"]
    sixteen = [r["step_time_error"] for r in check if "x16" in r["name"]]
    assert len(sixteen) == 2 and all(-0.40 < e < -0.29 for e in sixteen)


def test_dlperf_four_nodes(capsys) -> None:
    """DLPerf's Megatron-LM 8aa4619 on four DGX-1 (dlperf-v100-check.csv, README "DLPerf's
    4-node Megatron-LM runs"), nothing fit on them. Issue 14's symptom was tp across nodes
    estimated about 2x fast; tp 32 over the four nodes' InfiniBand measured 13,037.85 ms a step
    and is estimated 12.0% slow. The three pipelines at a batch of 512 measured 15,331.23
    (2 x 4 x 4), 16,281.51 (2 x 8 x 2) and 22,166.85 ms (1 x 8 x 4): ranked so (tau 1.00)."""
    data = _validate(capsys, "dlperf-v100-check.csv")
    assert data["step_time_runs"] == 7  # each row expressed: test_every_row_is_expressed
    errors = {r["name"]: r["step_time_error"] for r in data["rows"]}
    assert 0 < errors["DLPerf Megatron MP_1x32x1_16_3072x32"] < 0.15
    [group] = data["groups"]
    assert group["runs"] == 3 and group["regret"] == 0.0 and group["kendall_tau"] == 1.0
    assert data["step_time_median_ape"] <= 0.09  # measured 8.5%


def test_amp_t4_sweep(capsys) -> None:
    """AMP's homogeneous experiment (amp-t4-check.csv, README "AMP's T4 sweep"): 47 timed plans
    of one GPT-2 on 16 T4s, nothing fit on them, the T4 uncalibrated. The measured fastest is
    tp 1 x dp 4 x pp 4 at micro-batch 1, 1.20 s a step (the next, 1.23 s, is dp 2 x pp 8), and
    the estimate ranks it first though it prices every plan fast."""
    data = _validate(capsys, "amp-t4-check.csv")
    assert data["step_time_runs"] == 47  # of 52 trials; the five that wrote no time left out
    [group] = data["groups"]
    assert group["runs"] == 47 and group["regret"] == 0.0
    assert group["fastest"] == group["picked"] == (
        "AMP GPT-2 24x1024 T4 x16 tp1 dp4 pp4 mb1 part0-9-15-21-30")
    assert group["kendall_tau"] > 0.5  # measured 0.61 (0.59 with the V100's GEMM rate)
    # the V100's constants but the GEMM rate: all fast, -20.5..-54.0%, 39.8% MAPE (with the
    # V100's GEMM rate, 0.511 for the T4's 0.284: -24..-62%, 50.3%)
    assert all(r["step_time_error"] < 0 for r in data["rows"])
    assert data["step_time_mape"] < 0.42


def test_amp_partitions_are_its_stages_layers() -> None:
    # GPT2ModelPipe's 30 items: embedding, transpose, the 24 layers (items 2-25), transpose,
    # norm, LM head, fp32 cast. AMP's partition [0, 9, 15, 21, 30] gives stage 0 items 0-8
    # (layers 0-6: 7), stage 1 items 9-14 (6), stage 2 items 15-20 (6), stage 3 items 21-29
    # (layers 19-23: 5); [0, 15, 30] gives 13 and 11.
    runs, skipped = read_runs(DATA / "amp-t4-check.csv", load_catalog())
    assert skipped == []
    layouts = {r.name.rsplit(" part", 1)[1]: r.strategy.layout for r in runs}
    assert layouts["0-9-15-21-30"] == (7, 6, 6, 5)
    assert layouts["0-15-30"] == (13, 11)
    assert all(sum(layout or (24,)) == 24 for layout in layouts.values())


def test_dlperf_megatron_rows_reduce_tp_synchronously() -> None:
    # Megatron-LM 8aa4619 (2021-03-22), which DLPerf ran: ColumnParallelLinear all-reduces its
    # input gradient after the layer's GEMMs (copy_to_tensor_model_parallel_region); the
    # asynchronous all-reduce came in f3e57f6fee (2021-09-06). Every DLPerf Megatron-LM row
    # says so, fit and check alike.
    catalog = load_catalog()
    for name in ("v100-fit.csv", "dlperf-v100-check.csv"):
        runs, skipped = read_runs(DATA / name, catalog)
        assert skipped == [] and runs
        assert all(r.training.async_tp_allreduce is False for r in runs), name


def test_calibrating_on_a_fifth_improves_the_other_four_fifths() -> None:
    # The issue's check of `planner calibrate`: fit the uncalibrated A100 on every fifth run of
    # the A100 check set, then compare the other runs before and after. Measured 3.73 -> 3.59%
    # MAPE until Megatron-DeepSpeed's synchronous tp all-reduce (`async_tp_allreduce`), then
    # 3.99 -> 4.14%; since stop 69 the refits' gain on the runs they did not see (3.03 -> 3.02%
    # mean absolute log error) is under half its standard error (0.36 points; CV_MARGIN), so
    # the device is kept and the rest stays at 3.99%. Of the shipped device's five fifths
    # (bench_calibrate_fifths.py) the one from the fifth run (offset 4) still takes the rest
    # 3.3 -> 6.9%: README, "planner calibrate on a fifth".
    catalog = load_catalog()
    runs, _ = read_runs(DATA / "a100-check.csv", catalog)
    runs = [r for r in runs if r.system.device.name == "a100-80gb"]
    fifth = runs[::5]
    rest = [r for i, r in enumerate(runs) if i % 5]
    start = catalog.device(str(DATA / "uncalibrated.yaml") + "#a100-80gb")
    fit = calibrate(fifth, start, "a100-fifth")
    before = validate(rest, system_for=lambda r: replace(r.system, device=start)).summary()
    after = validate(rest, system_for=lambda r: replace(r.system, device=fit.device)).summary()
    assert after["step_time_mape"] <= before["step_time_mape"]
    assert fit.after.summary()["step_time_mape"] <= fit.before.summary()["step_time_mape"]


def test_calibrate_writes_a_device_a_system_can_name(tmp_path: Path, capsys,
                                                      monkeypatch) -> None:
    monkeypatch.setenv("PLANNER_CATALOG", str(tmp_path / "catalog"))
    code = main(["calibrate", str(DATA / "v100-fit.csv"), "--device",
                 str(DATA / "uncalibrated.yaml") + "#v100-16gb", "--name", "my-v100",
                 "--trials", "80", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["after"]["step_time_mape"] < report["before"]["step_time_mape"]
    written = tmp_path / "catalog" / "devices" / "my-v100.yaml"
    entry = yaml.safe_load(written.read_text())["my-v100"]
    assert entry["calibration"]["runs"] == 11
    assert set(entry["calibration"]["fitted"]) == {"matmul_efficiency", "memory_efficiency",
                                                   "kernel_launch_us", "host_kernel_us",
                                                   "collective_launch_us"}
    system = tmp_path / "mine.yaml"
    system.write_text("mine: {device: my-v100, network: [{topology: Switch, npus: 8,"
                      " bandwidth_gbps: 115, latency_us: 0.58}]}\n")
    assert main(["estimate", "--model", "gpt-1.7b", "--system", str(system), "--global-batch",
                 "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time"] > 0
    # A second run without --force refuses to replace it.
    assert main(["calibrate", str(DATA / "v100-fit.csv"), "--device", "v100-16gb", "--name",
                 "my-v100", "--trials", "5"]) == 2
    assert "already exists" in capsys.readouterr().err


def test_several_files_are_read_as_one(tmp_path: Path, capsys, monkeypatch) -> None:
    # validate: the two files' rows and groups together; calibrate: fit on both (the A100's
    # shipped constants come from a100-fit.csv and a100-megatron-fit.csv together)
    both = [str(DATA / "v100-fit.csv"), str(DATA / "v100-check.csv")]
    assert main(["validate", *both, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["step_time_runs"] == 11 + 27
    assert data["groups_count"] == 1 + 4
    monkeypatch.setenv("PLANNER_CATALOG", str(tmp_path / "catalog"))
    assert main(["calibrate", *both, "--device", str(DATA / "uncalibrated.yaml") + "#v100-16gb",
                 "--name", "v100-both", "--trials", "10", "--json"]) == 0
    # v100-fit's 11 runs on v100-16gb, and v100-check's DLPerf DeepSpeed rows on the same part
    entry = yaml.safe_load((tmp_path / "catalog" / "devices" / "v100-both.yaml").read_text())
    files = entry["v100-both"]["calibration"]["runs_csv"]
    assert "v100-fit.csv" in files and "v100-check.csv" in files
    assert json.loads(capsys.readouterr().out)["runs"] > 11


@pytest.mark.parametrize(("args", "message"), [
    (["--device", "h100-sxm", "--name", "x"], "no run is on device 'h100-sxm'"),
    (["--device", "v100-16gb", "--name", "x", "--fit", "colour"], "unknown constant 'colour'"),
    (["--device", "v100-16gb", "--name", "x", "--fit", "attention_efficiency"],
     "no constant to fit"),
    (["--device", "nope", "--name", "x"], "unknown device 'nope'"),
    (["--device", "v100-16gb", "--name", "bad name"], "not a catalog name"),
])
def test_calibrate_bad_input_is_one_line(tmp_path: Path, capsys, monkeypatch, args: list[str],
                                         message: str) -> None:
    monkeypatch.setenv("PLANNER_CATALOG", str(tmp_path))
    assert main(["calibrate", str(DATA / "v100-fit.csv"), "--trials", "3", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "devices").exists()


def test_every_fit_run_fits_the_part_it_ran_on(capsys) -> None:
    # Each run ran; with the driver's capacity, MPT without dropout and FSDP's fp32 shards none
    # of the fit files' 271 runs is estimated over its part's memory (29 were before; 182 runs
    # before Jean Zay's 26, 208 before dgxc-benchmarking's 34, 242 before Megatron-Bridge's 21
    # GB200 runs, 263 before its 8 GB300 runs, 279 before Megatron-LM's 63 functional tests on
    # A100).
    fits = sorted(str(path) for path in DATA.glob("*-fit.csv"))
    assert main(["validate", *fits, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["step_time_runs"] == 342
    assert data["over_memory_runs"] == 0


def test_jean_zay_2024_runs(capsys) -> None:
    """Lucie-7B's 2024 runs on Jean Zay at 8-256 A100s (README, "Jean Zay's 2024 runs"): each
    ran, so each fits its 80 GB. Across Omni-Path, concurrent communicators add up
    (``per_communicator``): at 128 GPUs with ZeRO-1, tp 2 x dp 64 measured 6.14 s and tp 1 x
    dp 128 8.34 s although each node reduces the same bytes. Under launch blocking each kernel
    pays the host's time, so a micro-batch of one sequence is measured slower than one of two at
    the same plan in each of the check file's six pairs (+10% to +19%)."""
    fit = _validate(capsys, "jean-zay-fit.csv")
    assert fit["step_time_runs"] == 26 and fit["skipped"] == []
    assert fit["step_time_mape"] <= JEAN_ZAY_FIT_MAPE
    assert len(fit["groups"]) == 6 and fit["regret_mean"] <= JEAN_ZAY_FIT_REGRET
    assert all(r["fits"] and r["predicted_peak_memory_gb"] <= 80 for r in fit["rows"])
    by_name = {r["name"]: r for r in fit["rows"]}
    tp2 = by_name["Lucie-7B x128 gbs512 dp64 tp2 pp1 mb4 zero1"]
    tp1 = by_name["Lucie-7B x128 gbs512 dp128 tp1 pp1 mb2 zero1"]
    assert (tp2["measured_step_time_s"], tp1["measured_step_time_s"]) == (6.1386, 8.3424)
    assert tp2["predicted_step_time_s"] < 0.85 * tp1["predicted_step_time_s"]
    check = _validate(capsys, "jean-zay-check.csv")
    assert check["step_time_runs"] == 38 and check["skipped"] == []
    assert check["step_time_median_ape"] <= JEAN_ZAY_CHECK_MEDIAN
    assert len(check["groups"]) == 6 and check["regret_mean"] <= JEAN_ZAY_CHECK_REGRET
    assert all(r["fits"] and r["predicted_peak_memory_gb"] <= 80 for r in check["rows"])
    plans: dict[str, dict[int, dict]] = {}
    for r in check["rows"]:
        micro_batch = int(re.search(r" mb(\d+)", r["name"])[1])
        plans.setdefault(re.sub(r" mb\d+| job\d+", "", r["name"]), {})[micro_batch] = r
    pairs = [(p[1], p[2]) for p in plans.values() if 1 in p and 2 in p]
    assert len(pairs) == 6
    for one, two in pairs:
        assert one["measured_step_time_s"] > 1.03 * two["measured_step_time_s"]
        assert one["predicted_step_time_s"] > two["predicted_step_time_s"], one["name"]
    one_node = [r["step_time_error"] for r in check["rows"] if " x8 " in r["name"]]
    assert len(one_node) == 4 and all(-0.11 <= e <= -0.02 for e in one_node)  # -2.7 to -10.1%


def test_kempnerforge_h200_runs(capsys) -> None:
    data = _validate(capsys, "kempner-h200-check.csv")
    assert data["step_time_runs"] == data["memory_runs"] == 14
    assert data["step_time_median_ape"] <= KEMPNER_MEDIAN
    assert data["memory_median_ape"] <= KEMPNER_MEMORY_MEDIAN
    errors = {row["name"]: row["step_time_error"] for row in data["rows"]}
    # What is left (README): the one-GPU run, measured at about three quarters of the H200's peak
    # with its recompute, is estimated 41% slower; the tp runs come out faster than measured.
    assert errors["KempnerForge 7B x1"] > 0.4
    assert all(error < 0.07 for name, error in errors.items() if "TP" in name)
    # peak memory: every run within +0.8..+6.2% (README), none under what it measured
    memory = [row["memory_error"] for row in data["rows"]]
    assert all(0.0 < error < 0.07 for error in memory)


def test_nanotron_h100_runs(capsys) -> None:
    data = _validate(capsys, "nanotron-h100-check.csv")
    assert data["step_time_runs"] == data["memory_runs"] == 26
    assert data["step_time_median_ape"] <= NANOTRON_MEDIAN
    assert data["memory_median_ape"] <= NANOTRON_MEMORY_MEDIAN
    errors = {row["name"]: row for row in data["rows"]}
    # What is left (README): the 64-node runs with one micro-batch a step are measured two to
    # three times the estimate (their network is not known); the one-node runs are estimated
    # slow; the plans with tp keep more memory than estimated.
    assert errors["nanotron 1.34B x512 dp128 tp2 pp2 mb2 zero1"]["step_time_error"] < -0.6
    assert all(row["step_time_error"] > 0 for name, row in errors.items() if " x8 " in name)
    assert all(row["memory_error"] < -0.1 for name, row in errors.items()
               if " pp1 " in name and (" tp4 " in name or " tp8 " in name) and " x512 " not in name)


def test_validate_splits_the_figures_by_a_column(capsys) -> None:
    """`planner validate --by device`: nemotron-check's 73 H100 runs and 6 GB200 runs apart, the
    GB200 ones estimated fast as a body (BF16 -6.3 to -8.2%, FP8 -14.4 to -18.4%, README
    "Nemotron-4": their recipe captures the layers as CUDA graphs); the parts' runs and absolute
    errors add up to the whole file's."""
    assert main(["validate", str(DATA / "nemotron-check.csv"), "--by", "device",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {r["device"]: r for r in data["by"]["rows"]}
    assert data["by"]["field"] == "device" and list(rows) == ["h100-sxm", "gb200"]
    assert (rows["h100-sxm"]["step_time_runs"], rows["gb200"]["step_time_runs"]) == (73, 6)
    assert -0.15 <= rows["gb200"]["step_time_mean_error"] <= -0.08
    total = sum(r["step_time_mape"] * r["step_time_runs"] for r in rows.values())
    assert total == pytest.approx(data["step_time_mape"] * data["step_time_runs"], rel=1e-12)
    assert main(["validate", str(DATA / "nemotron-check.csv"), "--by", "release"]) == 0
    text = capsys.readouterr().out
    assert "by release:" in text and "nemotron-4 report" in text
    assert main(["validate", str(DATA / "nemotron-check.csv"), "--by", "color"]) == 2
    assert "invalid choice: 'color'" in capsys.readouterr().err


def test_every_run_of_a_named_framework_passes_its_rules() -> None:
    """The validation set's ``framework`` column (README there): 675 measured runs of Megatron-LM
    and the Megatron-Core stacks, Megatron-DeepSpeed / DeepSpeedExamples and torchtitan, each
    read as a study with its framework reads it. They trained, so none may be refused by
    ``search_spaces/frameworks.py``'s rules (a rule that refused one would keep that plan out
    of every study of its framework)."""
    catalog = load_catalog()
    by_framework: dict[str, int] = {}
    for path in sorted(DATA.glob("*.csv")):
        runs, skipped = read_runs(path, catalog)
        assert skipped == [], path.name
        for row in csv.DictReader(path.open()):
            # the plans that ran out of memory were launched too (the BLOOM sweeps' three under
            # deepspeed): the rules may not refuse them either, but they did not train
            if row.get("framework") and row.get("out_of_memory") != "true":
                by_framework[row["framework"]] = by_framework.get(row["framework"], 0) + 1
    # megatron: 412 before Megatron-LM's 104 functional tests of its small GPT, 516 before
    # FlagPerf's 20 runs (Megatron-LM core_v0.6.0 and FlagScale), 536 before its two MoE runs;
    # deepspeed: 111 before FlagPerf's five DeepSpeed and Megatron-DeepSpeed runs; megatron: 538
    # before LiBai's ten Megatron-LM runs on V100, 548 before BigScience's five on V100, 553
    # before Megatron-LM's 37 functional tests on GB200, 590 before MLPerf's three AMD runs, 593
    # before Megatron-LM's 13 functional tests of 2024 on A100, 606 before DLPerf's seven
    # 4-node runs of Megatron-LM on V100;
    # deepspeed: 116 before the BLOOM sweeps' 65 (their 12 uneven pipelines name no framework)
    assert by_framework == {"megatron": 613, "deepspeed": 181, "torchtitan": 11}
