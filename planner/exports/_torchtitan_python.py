"""``torchtitan_config.py``: the plan as torchtitan's Python ``Trainer.Config`` (main, 2026);
sources in ``planner.exports._torchtitan``'s docstring."""

from __future__ import annotations

import json

from planner.exports._megatron import header_lines, micro_batches
from planner.exports._torchtitan_fields import (
    COMPILED,
    compile_comment,
    compiled,
    configuration,
    data_parallel,
    llama3_flavor,
    pipeline,
    pipeline_comment,
    zero_comment,
)
from planner.exports._torchtitan_moe import expert_comment, expert_fields
from planner.plan import Plan
from simcore.specs import Precision, Recompute

__all__ = ["python_config"]

PY_SOURCE = ("pytorch/torchtitan main b5bcd76c (2026-08-22), torchtitan/trainer.py and\n"
             "torchtitan/config/configs.py")
_FLOAT8_BUILTIN = {"405B"}
"""Flavors whose config_registry function (main, b5bcd76c) already converts to float8."""


def python_config(plan: Plan, loss: str | None = None, note: str | None = None) -> str:
    """The Python form; ``loss`` and ``note`` are sentences for its docstring (the loss's
    figures, why there is no TOML form)."""
    said = [f"{text[0].upper()}{text[1:]}." for text in (loss, note) if text]
    docstring = ["torchtitan Trainer.Config (Python form, torchtitan main since 2026)", "",
                 *header_lines(plan), *said, "",
                 "Field names:", f"{PY_SOURCE}.",
                 (f"Run with NGPU={plan.strategy.devices} in total, this file's folder on"
                 " PYTHONPATH:"),
                 "MODULE=torchtitan_config CONFIG=plan_config ./run_train.sh"]
    lines = ['"""' + "\n".join(docstring) + '\n"""', "", "import dataclasses", ""]
    lines += _python_imports(plan) + ["", ""]
    lines += _python_apply(plan) + ["", ""]
    lines += _python_entry(plan)
    return "\n".join(lines) + "\n"


def _py(value: int | str) -> str:
    """A Python literal, strings in double quotes."""
    return json.dumps(value) if isinstance(value, str) else str(value)


def _ac_class(plan: Plan) -> str | None:
    return {Recompute.SELECTIVE: "SelectiveAC", Recompute.FULL: "FullAC"}.get(
        plan.strategy.recompute)


def _model_spec(plan: Plan) -> list[str]:
    """``model_spec=...`` lines of ``apply_plan`` (none when the flavor's config is right)."""
    flavor = llama3_flavor(plan)
    fp8 = plan.strategy.precision is Precision.FP8
    if flavor is None:
        return (["        # fp8: add Float8LinearConverter.Config(filter_fqns=[\"lm_head\"])",
                 "        # to your model_registry(..., converters=[...])"] if fp8 else [])
    if fp8:
        return ["        # fp8: torchao Float8Linear for the linear layers, the LM head in bf16",
                f"        model_spec=model_registry({_py(flavor)}, converters=[",
                "            Float8LinearConverter.Config(",
                '                filter_fqns=["lm_head"],',
                "                model_compile_enabled=compile_config.enable,",
                "            ),",
                "        ]),"]
    if flavor in _FLOAT8_BUILTIN:
        return [(f"        # bf16: torchtitan's {flavor} config converts to float8;"
                 " this plan does not"),
                f"        model_spec=model_registry({_py(flavor)}),"]
    return []


def _python_imports(plan: Plan) -> list[str]:
    lines = []
    if plan.strategy.precision is Precision.FP8 and llama3_flavor(plan) is not None:
        lines.append("from torchtitan.components.quantization import Float8LinearConverter")
    lines.append("from torchtitan.config import CompileConfig, ParallelismConfig")
    ac = _ac_class(plan)
    if ac is not None:
        lines.append(f"from torchtitan.distributed.activation_checkpoint import {ac}")
    if _model_spec(plan) and llama3_flavor(plan) is not None:
        lines.append("from torchtitan.models.llama3 import model_registry")
    lines.append("from torchtitan.trainer import Trainer")
    return lines


def _python_apply(plan: Plan) -> list[str]:
    s, t = plan.strategy, plan.training
    lines = ["def apply_plan(config: Trainer.Config) -> Trainer.Config:",
             ('    """``config`` with the plan\'s parallelism, batch, activation'
             ' checkpointing and compile."""'),
             "    parallelism = ParallelismConfig(",
             *(f"        # {c}" for c in zero_comment(plan))]
    lines += [f"        {k}={_py(v)}," for k, v in data_parallel(plan).items()]
    lines += [f"        tensor_parallel_degree={s.tp},",
              f"        enable_sequence_parallel={s.tp > 1 and s.sequence_parallel},",
              *(f"        # {c}" for c in expert_comment(plan)),
              *(f"        {k}={v}," for k, v in expert_fields(plan, toml=False).items()),
              f"        pipeline_parallel_degree={s.pp},"]
    if s.pp > 1:
        lines += [f"        # {c}" for c in pipeline_comment(plan)]
        lines += [f"        {k}={_py(v)}," for k, v in pipeline(plan).items()]
    pp_micro = micro_batches(plan) if s.pp > 1 else 1
    lines += [f"        num_pp_microbatches={pp_micro},",
              f"        context_parallel_degree={s.sp},",
              "    )"]
    lines += ["    training = dataclasses.replace(",
              "        config.training,",
              f"        # micro_batch {s.micro_batch} * seq {t.seq_len}",
              f"        num_tokens_per_microbatch_per_dp_rank={s.micro_batch * t.seq_len},",
              f"        # global_batch {t.global_batch} * seq {t.seq_len}",
              f"        num_tokens_per_train_step={t.global_batch * t.seq_len},",
              f"        max_context_length={t.seq_len},",
              '        mixed_precision_param="bfloat16",',
              "        # gradients reduced in float32, the only type torchtitan takes",
              '        mixed_precision_reduce="float32",']
    # the plan is priced eager (torchtitan's trainer captures forward and backward as CUDA
    # graphs by default since f84224af, which pipeline parallelism and the all-to-all token
    # dispatcher of MoE models do not support either)
    lines += ["        # eager, as the plan was priced (CUDA graphs are on by default)",
              "        disable_cuda_graphs=True,"]
    ac = _ac_class(plan)
    components = ", ".join(_py(c) for c in COMPILED)
    lines += ["    )",
              f"    # {compile_comment(plan)}",
              (f"    compile_config = CompileConfig(enable={compiled(plan)},"
               f" components=[{components}])"),
              "    return dataclasses.replace(",
              "        config,",
              *_model_spec(plan),
              "        parallelism=parallelism,",
              "        training=training,",
              "        compile=compile_config,",
              f"        activation_checkpoint={'None' if ac is None else ac + '.Config()'},",
              "    )"]
    return lines


def _python_entry(plan: Plan) -> list[str]:
    found = configuration(plan)
    lines = ["def plan_config() -> Trainer.Config:"]
    if found is None:
        return lines + [(f'    """No torchtitan configuration has model {plan.model.name}\'s'
                        ' shape: call apply_plan on yours."""'),
                        f"    raise NotImplementedError({plan.model.name!r})"]
    package, flavor, name = found
    return lines + [f'    """The plan on torchtitan\'s {package} {flavor} configuration."""',
                    f"    from torchtitan.models.{package}.config_registry import {name}",
                    "",
                    f"    return apply_plan({name}())"]
