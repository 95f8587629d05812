"""``fused_matmul_efficiency``: the GEMM rate of a Transformer Engine stack (16-bit and FP8),
apart from the PyTorch FSDP stack's ``matmul_efficiency`` (studies/catalog/devices/gpus.yaml,
header: fit on h100-megatron-fit.csv and dgxc-h100-fit.csv, 0.605 -> 0.645, refit 0.666 once the
H100 node's ring and NVLink SHARP rates were split)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from planner.calibration import CONSTANTS, _identifiable
from planner.catalog import load_catalog
from planner.catalog_write import device_entry
from planner.runs_csv import read_runs
from simcore.megatron.kernels import KernelCosts
from simcore.specs import Precision

H100 = load_catalog().device("h100-sxm")
DATA = Path(__file__).parent / "data" / "validation"


def test_the_te_stack_runs_its_gemms_at_its_own_rate() -> None:
    # 989.4 TFLOPS dense BF16 x 0.666 = 658.9 TFLOPS; the classic stack's 989.4 x 0.605 = 598.6;
    # FP8 1979 x 0.666 = 1318.0 TFLOPS
    te = KernelCosts.of(H100, Precision.FP8, transformer_engine=True)
    classic = KernelCosts.of(H100, Precision.FP8, transformer_engine=False)
    assert te.flop_rate == pytest.approx(658.9404e12)
    assert classic.flop_rate == pytest.approx(598.587e12)
    assert te.fp8_rate == pytest.approx(1318.014e12)
    assert classic.fp8_rate == pytest.approx(1197.295e12)
    # a 16384 x 8192 x 8192 GEMM (2.2e12 FLOPs, 128 x 64 waves of whole tiles) is 0.605 / 0.666
    # of the classic stack's time, less their shared fixed costs
    m, n, k = 16384, 8192, 8192
    bf16_te = KernelCosts.of(H100, transformer_engine=True).gemm(m, n, k)
    bf16 = KernelCosts.of(H100).gemm(m, n, k)
    assert bf16_te < bf16
    assert bf16_te / bf16 == pytest.approx(0.605 / 0.666, rel=0.02)


def test_a_device_without_it_runs_te_gemms_at_matmul_efficiency() -> None:
    plain = replace(H100, fused_matmul_efficiency=None)
    assert KernelCosts.of(plain, transformer_engine=True).flop_rate == pytest.approx(598.587e12)
    assert load_catalog().device("b200").fused_matmul_efficiency is None


def test_the_catalog_and_a_written_entry_carry_it() -> None:
    assert H100.fused_matmul_efficiency == 0.666
    assert load_catalog().device("h200").fused_matmul_efficiency == 0.666
    assert device_entry(H100)["fused_matmul_efficiency"] == 0.666
    assert "fused_matmul_efficiency" not in device_entry(replace(H100,
                                                               fused_matmul_efficiency=None))


def test_a_fraction_of_peak_or_a_clear_error() -> None:
    with pytest.raises(ValueError, match="fused_matmul_efficiency"):
        replace(H100, fused_matmul_efficiency=1.5)


def test_calibrate_fits_it_only_on_runs_of_the_te_stack() -> None:
    # llm-foundry's H100 runs (PyTorch FSDP, no TE) cannot tell it; NeMo's FP8 runs can
    catalog = load_catalog()
    classic, _ = read_runs(DATA / "h100-fit.csv", catalog)
    te, _ = read_runs(DATA / "h100-megatron-fit.csv", catalog)
    assert "fused_matmul_efficiency" in [c.key for c in CONSTANTS]
    assert "fused_matmul_efficiency" not in [c.key for c in _identifiable(classic)]
    assert "fused_matmul_efficiency" in [c.key for c in _identifiable(te)]
