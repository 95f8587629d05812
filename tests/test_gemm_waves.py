"""The fixed time of each wave of a GEMM's output tiles (``gemm_wave_us``), against OpenXLA's
measured H100 bf16 GEMM table (tests/data/gemm/README.md: the source, and the fit / check split
by batch)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from planner.catalog import load_catalog
from simcore.megatron.kernels import TILE, KernelCosts
from simcore.specs import Precision

TABLE = Path(__file__).parent / "data" / "gemm" / "xla_h100_bf16.csv"

# What the table says (README there): with 1.40 us per wave, the GEMMs of four waves or more
# reach 0.876 of the peak; kernel time alone (no launch floor), operands streamed at 90% of
# the HBM's bandwidth (an A100 kernel reaches 88%, gpus.yaml's header).
TABLE_EFFICIENCY = 0.876
STREAM_EFFICIENCY = 0.9


def _h100(wave_s: float) -> KernelCosts:
    device = replace(load_catalog().device("h100-sxm"), matmul_efficiency=TABLE_EFFICIENCY,
                     memory_efficiency=STREAM_EFFICIENCY, kernel_launch_s=0.0,
                     gemm_wave_s=wave_s)
    return KernelCosts.of(device)


def _errors(costs: KernelCosts, rows: pd.DataFrame) -> pd.Series:
    measured = 2 * rows.b * rows.m * rows.n * rows.k / rows.flops_per_s
    predicted = [costs.gemm(r.m, r.n, r.k, r.b) for r in rows.itertuples()]
    return pd.Series(predicted, index=rows.index) / measured - 1


def _four_waves(sm_count: int) -> pd.DataFrame:
    table = pd.read_csv(TABLE)
    tiles = (-(-table.m // TILE)) * (-(-table.n // TILE)) * table.b
    return table[tiles >= 4 * sm_count]


def test_the_catalog_takes_the_wave_time_the_table_measures() -> None:
    assert load_catalog().device("h100-sxm").gemm_wave_s == pytest.approx(1.40e-6)


def test_a_gemm_pays_the_wave_time_once_per_wave() -> None:
    # By hand: 4096 x 4096 in 128 x 128 tiles is 1,024 tiles, 8 waves on 132 SMs (the last
    # 100/132 full); 2 x 4096^3 FLOP at 0.876 of 989.4 TFLOP/s over that fraction, plus 8 waves.
    costs = _h100(1.4e-6)
    fraction = 1024 / (8 * 132)
    compute = 2 * 4096**3 / (989.4e12 * TABLE_EFFICIENCY * fraction)
    assert costs.gemm(4096, 4096, 4096) == pytest.approx(compute + 8 * 1.4e-6)
    assert _h100(0.0).gemm(4096, 4096, 4096) == pytest.approx(compute)


def test_the_wave_time_removes_the_short_reduction_trend() -> None:
    rows = _four_waves(132)
    check = rows[rows.b == 4]  # fit on batch 1 and 2, checked on batch 4
    assert len(check) == 30
    with_waves = _errors(_h100(1.4e-6), check)
    without = _errors(_h100(0.0), check)
    assert with_waves.abs().mean() <= 0.055  # measured 4.9% (median 2.4%)
    assert with_waves.abs().median() <= 0.03
    assert without.abs().mean() >= 0.12  # 14.1%: from -31% at k 256 to +13% at k 4096
    by_k = with_waves.groupby(check.k).mean()
    assert by_k.max() - by_k.min() <= 0.10  # +8% at k 256 to 0% at k 4096
    assert without.groupby(check.k).mean().loc[256] <= -0.25


def test_fp8_gemms_and_parts_without_the_constant_are_as_before() -> None:
    # FP8 GEMMs take no wave time (the table measures bf16 only); nor does a device entry
    # without gemm_wave_us (ASTRA-sim's files, the lab's devices).
    device = load_catalog().device("h100-sxm")
    fp8 = KernelCosts.of(device, Precision.FP8)
    fp8_without = KernelCosts.of(replace(device, gemm_wave_s=0.0), Precision.FP8)
    assert fp8.linear(4096, 4096, 1024) == fp8_without.linear(4096, 4096, 1024)
    bf16 = KernelCosts.of(device)
    assert bf16.linear(4096, 4096, 1024) > KernelCosts.of(
        replace(device, gemm_wave_s=0.0)).linear(4096, 4096, 1024)
    assert KernelCosts.of(load_catalog().device("lab-npu-fast")).gemm_wave == 0.0
    assert math.isfinite(bf16.gemm(1, 1, 1))
