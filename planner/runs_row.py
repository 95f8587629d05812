"""One row of a runs CSV read into specs (:mod:`planner.runs_csv` reads the file): each cell's
value checked, the plan and the training built, and the framework's defaults applied. A cell
that cannot be read raises :class:`BadValue`, a plan the planner cannot express
:class:`RowError`; both name the field and what is allowed."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

from planner.fields import MAX_INTEGER, MAX_NUMBER, placement_axes
from search_spaces.frameworks import FRAMEWORKS, framework_training
from simcore.layout import layout_chunks, parse_layout
from simcore.specs import (
    TRAINING_CHOICES,
    Axis,
    ModelSpec,
    Precision,
    Recompute,
    RecomputeModule,
    Schedule,
    Strategy,
    SystemSpec,
    TrainingSpec,
    ZeroStage,
)

__all__ = ["BadValue", "RowError", "allocated", "as_run_by", "integer", "out_of_memory",
           "positive", "row_framework", "row_schedule", "row_strategy", "row_training"]

_TRUE = {"true", "1", "yes", "y", "on"}
_FALSE = {"false", "0", "no", "n", "off"}

_T = TypeVar("_T")


class RowError(ValueError):
    """One field of one row is unusable; the message names the field and what is allowed."""


class BadValue(RowError):
    """A cell that is not a valid value at all (a typo, an empty required cell, an unknown
    name): the row is left out and the command exits 1, where a plan the planner cannot
    express is only left out."""


_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(inf|infinity|nan)",
                      re.IGNORECASE | re.ASCII)


def _float(text: str) -> float:
    """A cell as a number written as a spreadsheet writes one: ASCII digits, a dot, an exponent
    (Python's float() also reads ``1_28`` as 128 and other scripts' digits); a ValueError
    otherwise."""
    if not _DECIMAL.fullmatch(text):
        raise ValueError(text)
    return float(text)


def integer(row: dict[str, str], key: str, default: int | None = None) -> int:
    """The cell as a whole number >= 1, or ``default`` where it is empty (a value to fix where
    there is none)."""
    text = row.get(key, "")
    if not text:
        if default is None:
            raise BadValue(f"{key} is empty; give a whole number")
        return default
    try:
        value = _float(text)
    except ValueError:
        raise BadValue(f"{key}={text!r} must be a whole number") from None
    if not value.is_integer() or not 1 <= value <= MAX_INTEGER:
        raise BadValue(f"{key}={text!r} must be a whole number from 1 to {MAX_INTEGER:,}")
    return int(value)


def _optional_integer(row: dict[str, str], key: str) -> int | None:
    """A whole number >= 1, or None where the cell is empty (uneven stages, HSDP)."""
    return integer(row, key) if row.get(key, "") else None


def _number(row: dict[str, str], key: str) -> float | None:
    """The cell as a number, or None where it is empty."""
    text = row.get(key, "")
    if not text:
        return None
    try:
        return _float(text)
    except ValueError:
        raise BadValue(f"{key}={text!r} must be a number" + _comma_hint(text)) from None


def _comma_hint(text: str) -> str:
    """What a comma in a number asks for: a thousands separator dropped (32,768), or a dot for
    a decimal comma (4,5)."""
    if re.fullmatch(r"\d{1,3}(,\d{3})+(\.\d*)?", text):
        return f"; write it without the thousands separator ({text.replace(',', '')})"
    return "; use a dot as the decimal mark" if "," in text else ""


def positive(row: dict[str, str], key: str) -> float | None:
    """The cell as a number > 0, or None where it is empty."""
    value = _number(row, key)
    if value is not None and not 0 < value <= MAX_NUMBER:
        raise BadValue(f"{key}={row[key]!r} must be a number > 0" if value <= 0 else
                       f"{key}={row[key]!r} must be a number up to {MAX_NUMBER:g}; check the"
                       " unit")
    return value


SHORTEST_STEP_S = 1e-6
"""The shortest step a runs CSV takes (a microsecond: one kernel's launch); below it a figure
is a typo or in the wrong unit, and its error would be past any float (an error of 1e300)."""
SMALLEST_PEAK_GB = 1e-3
"""The smallest peak a runs CSV takes (a megabyte; a training process's CUDA context alone is
several hundred)."""


def measured(row: dict[str, str], key: str, low: float, unit: str) -> float | None:
    """A measured figure (``step_time_s``, ``peak_memory_gb``, a throughput): a number from
    ``low`` to :data:`~planner.fields.MAX_NUMBER` in ``unit``, or None where the cell is
    empty."""
    value = _number(row, key)
    if value is not None and not low <= value <= MAX_NUMBER:
        raise BadValue(f"{key}={row[key]!r} must be a number of {unit} from {low:g} to"
                       f" {MAX_NUMBER:g}")
    return value


def _boolean(row: dict[str, str], key: str) -> bool | None:
    text = row.get(key, "").lower()
    if not text:
        return None
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise BadValue(f"{key}={row[key]!r} must be true or false")


def allocated(row: dict[str, str]) -> bool:
    """Whether ``memory_measured`` says PyTorch's allocated peak (else the device's use)."""
    text = row.get("memory_measured", "").lower()
    if text not in ("", "device", "allocated"):
        raise BadValue(f"memory_measured={row['memory_measured']!r} is not one of device,"
                        " allocated")
    return text == "allocated"


def out_of_memory(row: dict[str, str]) -> bool:
    """Whether the run ran out of memory (``out_of_memory``; empty: it ran)."""
    return bool(_boolean(row, "out_of_memory"))


MEMORY_STAGES = ("peak", "first", "last")
"""Which pipeline stage a measured peak is of (``memory_stage``): the stage the estimate finds
highest (a report of every rank's, or of the fullest one), the first or the last (a report of
one rank's: Megatron-LM's TensorBoard memory, written by the last rank, is the last stage's)."""


def memory_stage(row: dict[str, str]) -> str:
    """The ``memory_stage`` cell (empty: ``peak``)."""
    text = row.get("memory_stage", "").lower() or "peak"
    if text not in MEMORY_STAGES:
        raise BadValue(f"memory_stage={row['memory_stage']!r} is not one of"
                       f" {', '.join(MEMORY_STAGES)}")
    return text


def _enum(row: dict[str, str], key: str, enum: type, default: object) -> object:
    text = row.get(key, "")
    if not text:
        return default
    try:
        return enum(text.lower())
    except ValueError:
        allowed = ", ".join(e.value for e in enum)
        raise BadValue(f"{key}={text!r} is not one of {allowed}") from None


def _zero(row: dict[str, str]) -> ZeroStage:
    text = row.get("zero", "").lower()
    if not text:
        return ZeroStage.NONE
    if text in ("fsdp", "zero3", "zero-3"):
        return ZeroStage.PARAMETERS
    if text in ("0", "1", "2", "3"):
        return ZeroStage(int(text))
    raise BadValue(f"zero={row['zero']!r} must be 0, 1, 2, 3 or fsdp")


def _placement(row: dict[str, str]) -> dict[str, tuple[Axis, ...]]:
    text = row.get("placement", "")
    if not text:
        return {}
    names = [a.strip().lower() for a in text.replace("-", ",").replace(" ", ",").split(",")
             if a.strip()]
    axes = placement_axes(names)
    if axes is None:
        raise BadValue(f"placement={text!r} must name dp, tp, pp and sp once each, innermost"
                        " first, e.g. tp-sp-dp-pp")
    return {"placement": axes}


def _layout(row: dict[str, str]) -> tuple[int, ...] | None:
    """The ``pipeline_layout`` cell: Megatron's ``--pipeline-model-parallel-layout`` string
    (:mod:`simcore.layout`), None where empty."""
    text = (row.get("pipeline_layout") or "").strip()
    if not text:
        return None
    try:
        return parse_layout(text)
    except ValueError as e:
        raise RowError(str(e)) from None


def row_strategy(row: dict[str, str]) -> Strategy:
    """The row's plan (its degrees, schedule, stages, precision and the rest)."""
    named = _enum(row, "schedule", Schedule, None)
    layout = _layout(row)
    pp = integer(row, "pp")
    from_layout = None if layout is None else layout_chunks(layout, pp)
    v = integer(row, "v", 2 if named is Schedule.ZBV else from_layout or 1)
    default_schedule = Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B
    sequence_parallel = _boolean(row, "sequence_parallel")
    return _built(lambda: Strategy(
        dp=integer(row, "dp"), tp=integer(row, "tp"), pp=integer(row, "pp"),
        sp=integer(row, "sp", 1),
        sequence_parallel=True if sequence_parallel is None else sequence_parallel,
        zero=_zero(row), recompute=_enum(row, "recompute", Recompute, Recompute.NONE),
        micro_batch=integer(row, "micro_batch"),
        schedule=named or default_schedule, v=v, **_placement(row),
        precision=_enum(row, "precision", Precision, Precision.BF16),
        first_stage_layers=_optional_integer(row, "first_stage_layers"),
        last_stage_layers=_optional_integer(row, "last_stage_layers"),
        shard_group=_optional_integer(row, "shard_group"),
        ep=integer(row, "ep", 1), etp=_optional_integer(row, "etp"),
        ep_overlap=bool(_boolean(row, "ep_overlap")),
        ep_dedup=bool(_boolean(row, "ep_dedup")), layout=layout,
        recompute_layers=_layers_or_all(row, "recompute_layers"),
        offload_layers=_none_if_zero(row, "offload_layers"),
    ))


def _none_if_zero(row: dict[str, str], key: str) -> int | None:
    """A count of layers, or None (none) where the cell is empty or 0, as a study's
    ``space.offload_layers`` reads 0."""
    value = _number(row, key)
    return None if value is None or value == 0 else integer(row, key)


def _layers_or_all(row: dict[str, str], key: str) -> int | None:
    """Layers of each stage that recompute: a whole number, or None (all) where the cell is
    empty or 0, as a study's ``space.recompute_layers`` reads 0."""
    value = _number(row, key)
    return None if value is None or value == 0 else integer(row, key)


def _built(build: Callable[[], _T]) -> _T:
    """``build()``, a spec's ValueError turned into the row's reason (:class:`RowError`)."""
    try:
        return build()
    except RowError:
        raise
    except ValueError as e:
        raise RowError(str(e)) from None


def _modules(row: dict[str, str]) -> tuple[RecomputeModule, ...] | None:
    """``recompute_modules``: Megatron-LM's module names, separated by spaces or ``+``."""
    text = (row.get("recompute_modules") or "").replace("+", " ").split()
    try:
        return tuple(RecomputeModule(m) for m in text) or None
    except ValueError as e:  # the enum names the field and what is allowed
        raise BadValue(str(e)) from None


def row_schedule(row: dict[str, str]) -> tuple[Schedule | None, bool | None]:
    """The row's ``schedule`` and ``sequence_parallel`` cells (None where empty): what a row
    on a mixed cluster says of its plan beside its stages (:mod:`planner.runs_mixed`)."""
    return _enum(row, "schedule", Schedule, None), _boolean(row, "sequence_parallel")


def row_training(row: dict[str, str]) -> TrainingSpec:
    """The row's training (batch, sequence and the stack's options), cells left empty None."""
    overlap = _boolean(row, "overlap_grad_reduce")
    if _boolean(row, "master_weights") is False and (row.get("optimizer_bytes") or "").strip():
        # 12 is the default: given beside master_weights false, it was read as left empty
        raise BadValue(f"optimizer_bytes={row['optimizer_bytes']!r} with master_weights false,"
                       " which sets the optimizer state (Adam's two moments in the weights'"
                       " type): leave optimizer_bytes empty or master_weights true")
    return _built(lambda: TrainingSpec(
        global_batch=integer(row, "global_batch"), seq_len=integer(row, "seq_len"),
        bytes_per_param_grads=integer(row, "grad_bytes", 2),
        grad_reduce_bytes=integer(row, "grad_reduce_bytes") if row.get("grad_reduce_bytes")
        else None,
        grad_all_reduce=bool(_boolean(row, "grad_all_reduce")),
        bytes_per_param_optimizer=integer(row, "optimizer_bytes", 12),
        overlap_grad_reduce=True if overlap is None else overlap,
        flash_attention=_boolean(row, "flash_attention"),
        transformer_engine=_boolean(row, "transformer_engine"),
        recompute_early_stop=_boolean(row, "recompute_early_stop"),
        grad_copy=_boolean(row, "grad_copy"),
        main_grad_copy=_boolean(row, "main_grad_copy"),
        fp32_grad_partition=_boolean(row, "fp32_grad_partition"),
        launch_blocking=bool(_boolean(row, "launch_blocking")),
        cuda_graphs=bool(_boolean(row, "cuda_graphs")),
        tp_comm_overlap=_boolean(row, "tp_comm_overlap") is not False,
        async_tp_allreduce=_boolean(row, "async_tp_allreduce"),
        fused_norm=_boolean(row, "fused_norm") is not False,
        rope_fusion=_boolean(row, "rope_fusion") is not False,
        fp8_attention=bool(_boolean(row, "fp8_attention")),
        master_weights=_boolean(row, "master_weights") is not False,
        fsdp_no_sync=bool(_boolean(row, "fsdp_no_sync")),
        swiglu_fusion=_boolean(row, "swiglu_fusion") is not False,
        vocab_parallel_embedding=_boolean(row, "vocab_parallel_embedding") is not False,
        recompute_modules=_modules(row),
        **{k: _enum(row, k, enum, None) for k, enum in TRAINING_CHOICES.items()},
    ))


def row_framework(row: dict[str, str], default: str | None) -> str:
    """The row's ``framework`` cell, or ``default`` where it is empty ("" for none)."""
    text = row.get("framework", "").lower() or (default or "")
    if text and text not in FRAMEWORKS:
        raise BadValue(f"framework={text!r} is not one of {', '.join(FRAMEWORKS)}")
    return text


def as_run_by(framework: str, model: ModelSpec, system: SystemSpec,
               training: TrainingSpec, strategy: Strategy) -> TrainingSpec:
    """The row's training as its framework runs the plan (the defaults a study with that
    framework takes, :func:`search_spaces.frameworks.framework_training`); a framework that
    cannot run the plan as written leaves the row out with the reason."""
    if not framework:
        return training
    return _built(lambda: framework_training(framework, model, system, training, strategy))
