"""precision: fp8 (simcore/megatron/precision.py): the linear GEMMs at the FP8 peak, their casts,
the FP8 weight copy and FP8-saved linear inputs, the devices and conventions that refuse it, the
space's knob, the exports' flags, and bf16 estimates unchanged. Hand calculations in comments.
"""

from __future__ import annotations

import tomllib
from dataclasses import replace

import pytest

import simcore
from planner.catalog import load_catalog
from planner.exports import export_files
from planner.plan import Plan, make_plan, strategy_dict, strategy_from_attrs
from search_spaces.encoding import LayoutEncoding, strategy_label
from search_spaces.frameworks import why_not
from search_spaces.space import StrategySpace
from simcore.megatron.activations import layer_activations
from simcore.megatron.calls import grad_reduction_calls
from simcore.megatron.kernels import KernelCosts
from simcore.megatron.layer_step import dense_layer
from simcore.megatron.layers import layer_shape
from simcore.megatron.plan import StepPlan
from simcore.megatron.precision import CAST_BYTES, fp8_overheads
from simcore.megatron.stage_memory import fp8_weight_params
from simcore.megatron.step import _ends, _stage
from simcore.specs import (
    Convention,
    DeviceSpec,
    Family,
    ModelSpec,
    Precision,
    Recompute,
    Schedule,
    Strategy,
    TrainingSpec,
    ZeroStage,
)

CATALOG = load_catalog()
FP8_PEAK = 1979e12
"""H100 SXM dense FP8 (NVIDIA H100 datasheet: 3,958 TFLOPS with sparsity, half of it dense)."""
H100 = replace(CATALOG.device("h100-sxm"), fp8_peak_flops_per_s=FP8_PEAK)
SYSTEM = replace(CATALOG.system("dgx-h100-1024"), device=H100)
FP8 = Precision.FP8


def _costs(precision: Precision) -> KernelCosts:
    return KernelCosts.of(H100, precision)


# -- (a) time ---------------------------------------------------------------------------------
def test_fp8_linear_gemm_is_bf16_time_times_peak_ratio() -> None:
    # 16384 tokens x 8192 x 8192 on 132 SMs: 128 x 64 = 8192 tiles in 63 waves, 2.2 TFLOP.
    # Compute-bound in both precisions (2.2e12 FLOP / 531e12 FLOP/s = 4.1 ms against 0.4 GB /
    # 2.1e12 B/s = 0.2 ms), and the wave fraction is the shape's only: the ratio is the peaks'.
    # The 16-bit GEMM also pays the device's fixed time per wave (63 waves x gemm_wave_s),
    # which the FP8 one does not (tests/test_gemm_waves.py).
    m, n, k = 16384, 8192, 8192
    bf16, fp8 = _costs(Precision.BF16).linear(m, n, k), _costs(FP8).linear(m, n, k)
    waves = 63 * H100.gemm_wave_s
    assert H100.gemm_wave_s > 0
    assert fp8 == pytest.approx((bf16 - waves) * H100.peak_flops_per_s / FP8_PEAK, rel=1e-12)
    # the 16-bit GEMMs (attention's, the LM head's) keep the bf16 rate
    assert _costs(FP8).gemm(m, n, k) == _costs(Precision.BF16).gemm(m, n, k)


def test_fp8_casts_are_memory_bound_kernels() -> None:
    # One linear (m, n, k) = (4096, 8192, 8192), 8 micro-batches a step: forward casts x
    # (4096 x 8192 x 4 B) and 1/8 of w (8192 x 8192 x 4 B), backward casts dy (4096 x 8192 x 4 B);
    # each is over the launch floor, at HBM bandwidth x memory efficiency.
    costs = _costs(FP8)
    rate = H100.hbm_bandwidth_bytes_per_s * H100.memory_efficiency
    over = fp8_overheads(costs, [(4096, 8192, 8192)], micro_batches=8)
    update = costs.elementwise(2 * 3 * 1024 * 4)  # amax histories: launch-bound
    assert update == H100.kernel_launch_s
    assert over.forward == pytest.approx(
        CAST_BYTES * 4096 * 8192 / rate + CAST_BYTES * 8192 * 8192 / rate / 8 + update)
    assert over.backward == pytest.approx(CAST_BYTES * 4096 * 8192 / rate + update)


def test_fp8_step_is_faster_on_a_gemm_bound_plan() -> None:
    model = CATALOG.model("llama3-70b")
    training = TrainingSpec(global_batch=2048, seq_len=8192)
    s = Strategy(dp=32, tp=8, pp=4, zero=ZeroStage.OPTIMIZER)
    bf16 = simcore.estimate(model, SYSTEM, training, s)
    fp8 = simcore.estimate(model, SYSTEM, training, replace(s, precision=FP8))
    # At most the linear GEMMs' share (about 2/3 of the layer's FLOPs) gets 2x faster.
    assert bf16.time.compute / 2 < fp8.time.compute < bf16.time.compute
    assert fp8.model_flops == bf16.model_flops  # the same work, against the bf16 peak (MFU)


# -- (b) memory -------------------------------------------------------------------------------
TINY = ModelSpec(name="tiny", family=Family.GPT, layers=4, hidden=512, ffn_hidden=2048,
                 heads=8, vocab=1000, seq_len=256)


def test_fp8_memory_by_hand() -> None:
    # One device (dp=tp=pp=1), ZeRO 0. Weights: + 1 byte per linear-layer parameter,
    # 4 layers x (4 h^2 + 2 h f) = 4 x (4 x 512^2 + 2 x 512 x 2048) = 12,582,912 bytes.
    # Data parallelism over the 1,024 devices changes neither (ZeRO 0, one sequence each).
    training = TrainingSpec(global_batch=1024, seq_len=256)
    s = Strategy(dp=1024, recompute=Recompute.NONE)
    bf16 = simcore.estimate(TINY, SYSTEM, training, s)
    fp8 = simcore.estimate(TINY, SYSTEM, training, replace(s, precision=FP8))
    assert fp8.memory.weights - bf16.memory.weights == 4 * (4 * 512**2 + 2 * 512 * 2048)
    # Activations: each linear's saved input takes 1 byte per element, not 2: QKV and FC1
    # inputs (s b h each), the projection input (s b h) and FC2's (s b f), per layer:
    # 256 x (3 x 512 + 2048) = 917,504 bytes saved, x 4 layers (1 micro-batch in flight).
    assert bf16.memory.activations - fp8.memory.activations == 4 * 256 * (3 * 512 + 2048)
    assert fp8.memory.gradients == bf16.memory.gradients
    assert fp8.memory.optimizer == bf16.memory.optimizer


def test_fp8_param_gather_keeps_the_linear_weights_in_fp8_only() -> None:
    # ZeRO 1 with Transformer Engine (H100's default): Megatron-LM's --fp8-param-gather, as its
    # FP8 example, NeMo 2 and Megatron-Bridge run it. The linear weights' 16-bit copy goes
    # (2 bytes each) and the FP8 one stays (1): weights fall by 1 byte per linear parameter,
    # 4 layers x (4 h^2 + 2 h f) = 12,582,912 bytes; and the distributed optimizer's all-gather
    # moves those parameters in 1 byte instead of 2.
    training = TrainingSpec(global_batch=1024, seq_len=256)
    s = Strategy(dp=1024, recompute=Recompute.NONE, zero=ZeroStage.OPTIMIZER)
    bf16 = simcore.estimate(TINY, SYSTEM, training, s)
    fp8 = simcore.estimate(TINY, SYSTEM, training, replace(s, precision=FP8))
    linear = 4 * (4 * 512**2 + 2 * 512 * 2048)
    assert bf16.memory.weights - fp8.memory.weights == linear
    plan = StepPlan(TINY, SYSTEM, training, replace(s, precision=FP8))
    stage = _stage(plan, dense_layer(plan), _ends(plan), 0)
    assert plan.fp8_params and fp8_weight_params(plan, stage) == linear
    _, (gather,) = grad_reduction_calls(plan, stage.params, linear)
    assert gather[2] == ((stage.params - linear) * 2 + linear) / 1024
    # ZeRO 0 cannot (Megatron-LM asserts the distributed optimizer or FSDP), nor the classic
    # stack: both keep the 16-bit weights beside the FP8 copy (test_fp8_memory_by_hand)
    zero0 = StepPlan(TINY, SYSTEM, training, replace(s, precision=FP8, zero=ZeroStage.NONE))
    classic = StepPlan(TINY, SYSTEM, replace(training, transformer_engine=False),
                       replace(s, precision=FP8))
    assert not zero0.fp8_params and not classic.fp8_params


def test_fp8_activations_under_tp_and_full_recompute() -> None:
    shape = layer_shape(TINY)
    kw = {"micro_batch": 2, "seq_len": 256, "tp": 2, "sp": 1, "sequence_parallel": True}
    none = layer_activations(TINY, shape, recompute=Recompute.NONE, **kw)
    fp8 = layer_activations(TINY, shape, recompute=Recompute.NONE, linear_input_bytes=1, **kw)
    sbh, sbf = 256 * 2 * 512, 256 * 2 * 2048
    assert none.stored - fp8.stored == pytest.approx((3 * sbh + sbf) / 2)  # split over tp 2
    full = layer_activations(TINY, shape, recompute=Recompute.FULL, linear_input_bytes=1, **kw)
    assert full.stored == 2 * sbh / 2  # only the layer's 16-bit input


# -- (c) refusals -----------------------------------------------------------------------------
def test_fp8_on_an_a100_is_refused_with_a_reason() -> None:
    a100 = replace(SYSTEM, device=CATALOG.device("a100-80gb"))
    s = Strategy(dp=32, tp=8, pp=4, precision=FP8)
    model, training = CATALOG.model("llama3-70b"), TrainingSpec(global_batch=2048, seq_len=8192)
    with pytest.raises(ValueError, match="precision fp8 needs FP8 tensor cores.*a100-80gb"):
        simcore.check(model, a100, training, s)
    with pytest.raises(ValueError, match="a100-80gb"):
        simcore.estimate(model, a100, training, s)
    space = StrategySpace(model=model, system=a100, training=training,
                          convention=Convention.MEGATRON, tp=(8,), pp=(4,),
                          precision=(Precision.BF16, FP8))
    assert space.valid and all(x.precision is Precision.BF16 for x in space.valid)


def test_fp8_is_megatron_convention_only() -> None:
    model = CATALOG.model("llama3-70b")
    s = Strategy(dp=32, tp=8, pp=4, precision=FP8)
    training = TrainingSpec(global_batch=2048, seq_len=8192)
    with pytest.raises(ValueError, match="megatron convention.*stage convention"):
        simcore.check(model, SYSTEM, training, s, Convention.STAGE)
    with pytest.raises(ValueError, match="megatron convention"):
        simcore.estimate(model, SYSTEM, training, s, Convention.STAGE)


# -- (d) the space ----------------------------------------------------------------------------
def test_space_enumerates_precision() -> None:
    model, training = CATALOG.model("llama3-70b"), TrainingSpec(global_batch=2048, seq_len=8192)
    kw = {"model": model, "system": SYSTEM, "training": training,
          "convention": Convention.MEGATRON, "tp": (4, 8), "pp": (2, 4),
          "zero": (ZeroStage.OPTIMIZER,)}
    bf16 = StrategySpace(**kw)  # type: ignore[arg-type]
    both = StrategySpace(**kw, precision=(Precision.BF16, FP8))  # type: ignore[arg-type]
    assert both.size == 2 * bf16.size
    assert len(both.valid) == 2 * len(bf16.valid)
    assert {s.precision for s in both.valid} == {Precision.BF16, FP8}
    # the array path and the one-by-one path agree
    assert both.valid == tuple(s for s in both.candidates() if both.reason_invalid(s) is None)
    encoding = LayoutEncoding(both)
    assert encoding.distributions["precision"].choices == ("bf16", "fp8")
    s = next(x for x in both.valid if x.precision is FP8)
    assert encoding.nearest(encoding.params(s)) == s
    assert strategy_label(s).endswith(" fp8")
    assert "precision" not in LayoutEncoding(bf16).distributions


def test_a_deepspeed_space_keeps_bf16_only() -> None:
    model, training = CATALOG.model("llama3-70b"), TrainingSpec(global_batch=2048, seq_len=8192)
    space = StrategySpace(model=model, system=SYSTEM, training=training,
                          convention=Convention.MEGATRON, tp=(8,), pp=(1,),
                          precision=(Precision.BF16, FP8), framework="deepspeed")
    assert space.valid and all(s.precision is Precision.BF16 for s in space.valid)


def test_plan_files_round_trip_precision() -> None:
    s = Strategy(dp=32, tp=8, pp=4, precision=FP8)
    assert strategy_dict(s)["precision"] == "fp8"
    assert strategy_from_attrs(strategy_dict(s)) == s
    assert "precision" not in strategy_dict(replace(s, precision=Precision.BF16))
    assert strategy_from_attrs(strategy_dict(replace(s, precision=Precision.BF16))).precision \
        is Precision.BF16


# -- (e) exports ------------------------------------------------------------------------------
def _plan(precision: Precision, model: str = "llama3-70b") -> Plan:
    s = Strategy(dp=8, tp=8, pp=4, sp=4, zero=ZeroStage.OPTIMIZER,
                 recompute=Recompute.SELECTIVE, schedule=Schedule.INTERLEAVED, v=2,
                 precision=precision)
    return make_plan(CATALOG.model(model), SYSTEM,
                     TrainingSpec(global_batch=2048, seq_len=8192), s, Convention.MEGATRON)


def test_megatron_export_sets_fp8_flags() -> None:
    script = export_files(_plan(FP8), "megatron")["megatron.sh"]
    # Megatron-Bridge's H100 FP8 presets' recipe, the one the FP8 checks ran
    for flag in ("--fp8-format hybrid", "--fp8-recipe tensorwise", "--bf16"):
        assert f"  {flag}\n" in script
    assert "  --fp8-param-gather\n" in script  # ZeRO 1 with Transformer Engine, as estimated
    assert "--fp8" not in export_files(_plan(Precision.BF16), "megatron")["megatron.sh"]


def test_torchtitan_export_sets_float8_converter() -> None:
    files = export_files(_plan(FP8), "torchtitan")
    toml = files["torchtitan.toml"]
    # the name the converter registers under at v0.2.2 (73a0e697 torchtitan/components/
    # quantization/float8.py); "float8", as that tag's llama3_405b.toml writes, is a KeyError
    assert 'converters = ["quantize.linear.float8"]' in toml
    assert "[quantize.linear.float8]" in toml and 'filter_fqns = ["output"]' in toml
    assert tomllib.loads(toml)["model"]["converters"] == ["quantize.linear.float8"]
    py = files["torchtitan_config.py"]
    compile(py, "torchtitan_config.py", "exec")
    assert "Float8LinearConverter.Config(" in py and 'filter_fqns=["lm_head"]' in py
    assert 'model_registry("70B", converters=[' in py
    bf16 = export_files(_plan(Precision.BF16), "torchtitan")
    assert "float8" not in bf16["torchtitan.toml"].lower()
    assert "Float8" not in bf16["torchtitan_config.py"]


def test_deepspeed_refuses_fp8() -> None:
    model, training = CATALOG.model("llama3-70b"), TrainingSpec(global_batch=2048, seq_len=8192)
    s = Strategy(dp=128, tp=8, zero=ZeroStage.OPTIMIZER)  # a plan DeepSpeed runs in bf16
    export_files(make_plan(model, SYSTEM, training, s, Convention.MEGATRON), "deepspeed")
    fp8 = make_plan(model, SYSTEM, training, replace(s, precision=FP8), Convention.MEGATRON)
    with pytest.raises(ValueError, match="precision fp8: DeepSpeed has no FP8"):
        export_files(fp8, "deepspeed")
    assert why_not("megatron", model, training, Strategy(dp=64, precision=FP8)) is None
    assert why_not("torchtitan", model, training, Strategy(dp=64, precision=FP8)) is None


def test_device_fp8_peak_is_validated() -> None:
    with pytest.raises(ValueError, match="fp8_peak_flops_per_s > 0"):
        DeviceSpec(name="x", peak_flops_per_s=1e12, hbm_bytes=1e9,
                   hbm_bandwidth_bytes_per_s=1e9, fp8_peak_flops_per_s=0.0)
