"""``--format torchtitan``: the plan in both of torchtitan's config forms.

``torchtitan.toml``: the TOML job file of torchtitan v0.2.2 and earlier. Field names from
pytorch/torchtitan tag v0.2.2 (commit 73a0e697, 2026-02-20):

- ``torchtitan/config/job_config.py``: ``[training]`` ``local_batch_size`` (per data-parallel
  rank), ``global_batch_size``, ``seq_len``, ``mixed_precision_param``,
  ``mixed_precision_reduce``; ``[parallelism]`` ``data_parallel_replicate_degree``,
  ``data_parallel_shard_degree``, ``fsdp_reshard_after_forward`` (default/always/never),
  ``tensor_parallel_degree``, ``enable_async_tensor_parallel``, ``pipeline_parallel_degree``,
  ``pipeline_parallel_schedule``, ``pipeline_parallel_microbatch_size`` (a size: micro-batches =
  local_batch_size / it), ``pipeline_parallel_layers_per_stage``,
  ``pipeline_parallel_first_stage_less_layers``, ``pipeline_parallel_last_stage_less_layers``,
  ``context_parallel_degree``; ``[activation_checkpoint]`` ``mode`` (selective/full/none),
  ``selective_ac_option`` ("op" for per-op selective AC).
- ``torchtitan/train.py``: gradient accumulation = global_batch_size / (local_batch_size * dp).
- ``torchtitan/distributed/pipeline_parallel.py``: stages = ceil((layers + first_less + last_less)
  / layers_per_stage), stages per rank = stages / pp.
- ``torchtitan/models/llama3/infra/parallelize.py``: ``fsdp_reshard_after_forward = "default"``
  reshards only without pipeline parallelism.

``torchtitan_config.py``: the Python ``Trainer.Config`` form that replaced the TOML in
commit 9810191b (2026-02-23, #2386). Field names from pytorch/torchtitan main at commit b5bcd76c
(2026-08-22):

- ``torchtitan/trainer.py``: ``Trainer.Config`` fields ``training``, ``parallelism``,
  ``activation_checkpoint`` (``SelectiveAC.Config()``, ``FullAC.Config()`` or ``None``); its check
  that CUDA graphs (on unless ``training.disable_cuda_graphs``) do not support pipeline
  parallelism; gradient accumulation = num_tokens_per_train_step /
  (num_tokens_per_microbatch_per_dp_rank * num_pp_microbatches * dp).
- ``torchtitan/config/configs.py``: ``TrainingConfig`` (``num_tokens_per_microbatch_per_dp_rank``,
  ``num_tokens_per_train_step``, ``max_context_length``, ``disable_cuda_graphs``,
  ``mixed_precision_*``), ``ParallelismConfig`` (as in v0.2.2 plus ``enable_sequence_parallel``,
  with ``num_pp_microbatches``, a count, instead of ``pipeline_parallel_microbatch_size``);
  ``enable_async_tensor_parallel`` moved to ``CompileConfig``. The renames are listed in commit
  73aed7f6 (2026-08-20, "fold batch dim", #4121): local_batch_size ->
  num_tokens_per_microbatch_per_dp_rank, global_batch_size -> num_tokens_per_train_step,
  seq_len -> max_context_length, pipeline_parallel_microbatch_size -> num_pp_microbatches.
- ``torchtitan/distributed/activation_checkpoint.py``: ``SelectiveAC``, ``FullAC``.
- ``torchtitan/models/llama3/config_registry.py``: ``llama3_8b``, ``llama3_70b``, ``llama3_405b``.

fp8: torchao's ``Float8Linear`` swapped in for the linear layers by a model converter, the LM
head left in bf16. TOML (v0.2.2): ``[model] converters = ["float8"]`` with
``[quantize.linear.float8] filter_fqns = ["output"]``, as
``torchtitan/models/llama3/train_configs/llama3_405b.toml`` at 73a0e697 does. Python (main):
``model_registry(flavor, converters=[Float8LinearConverter.Config(filter_fqns=["lm_head"],
model_compile_enabled=...)])`` as ``llama3_405b`` in ``torchtitan/models/llama3/config_registry.py``
at b5bcd76c does (``torchtitan/components/quantization/float8.md``: torch.compile fuses the
casts). That config already runs float8, so a bf16 plan on the 405B flavor is given
``model_registry("405B")`` without converters. torchao scales dynamically (tensorwise or
rowwise); the estimate models Transformer Engine's delayed scaling, with the same GEMMs in FP8.

Schedule names: ``get_schedule_class`` in pytorch/pytorch (commit 00722e64)
``torch/distributed/pipelining/schedules.py`` maps "GPipe", "1F1B" and "Interleaved1F1B".
"""

from __future__ import annotations

import json

from planner.exports._megatron import header_lines, micro_batches
from planner.exports._torchtitan_loss import torchtitan_loss_check
from planner.exports._torchtitan_moe import expert_comment, expert_fields, moe_flavor
from planner.plan import Plan
from search_spaces.frameworks import why_not
from simcore.specs import Family, Precision, Recompute, Schedule, SelectiveRecompute, ZeroStage

__all__ = ["SCHEDULES", "export_torchtitan", "llama3_flavor"]

TOML_SOURCE = "pytorch/torchtitan v0.2.2 (73a0e697), torchtitan/config/job_config.py"
PY_SOURCE = ("pytorch/torchtitan main b5bcd76c (2026-08-22), torchtitan/trainer.py and\n"
             "torchtitan/config/configs.py")

SCHEDULES = {Schedule.GPIPE: "GPipe", Schedule.ONE_F_ONE_B: "1F1B",
             Schedule.INTERLEAVED: "Interleaved1F1B", Schedule.ZBV: "ZBVZeroBubble"}
"""The plan's schedule -> torch.distributed.pipelining's schedule name."""

_LLAMA3 = {(32, 4096, 14336, 32, 8): "8B", (80, 8192, 28672, 64, 8): "70B",
           (126, 16384, 53248, 128, 8): "405B"}
"""torchtitan's llama3 flavors by (layers, dim, ffn, heads, kv_heads); vocab 128256."""

_FLOAT8_BUILTIN = {"405B"}
"""Flavors whose config_registry function (main, b5bcd76c) already converts to float8."""

_RESHARD = {ZeroStage.OPTIMIZER: "never", ZeroStage.GRADIENTS: "never",
            ZeroStage.PARAMETERS: "always"}


def export_torchtitan(plan: Plan) -> dict[str, str]:
    """``torchtitan.toml`` (v0.2.2 and earlier) and ``torchtitan_config.py`` (main, 2026);
    raises ValueError if torchtitan cannot run the plan."""
    refused = why_not("torchtitan", plan.model, plan.training, plan.strategy)
    if refused is not None:
        raise ValueError(refused)
    if plan.model.moe is not None and plan.strategy.precision is Precision.FP8:
        raise ValueError(f"{plan.model.name} in fp8: this export writes torchtitan's MoE"
                         " models in bf16 only (their float8 grouped GEMMs are not written);"
                         " export the bf16 plan, or for megatron")
    if not plan.system.device.bf16:
        raise ValueError(f"torchtitan trains in bfloat16 (FSDP2 mixed precision, no loss"
                         f" scaling) and {plan.system.device.name} has no bf16 tensor cores;"
                         " export for megatron or deepspeed, which train in fp16")
    loss = torchtitan_loss_check(plan)
    toml = _toml(plan) if loss is None else f"# {loss}\n{_toml(plan)}"
    return {"torchtitan.toml": toml, "torchtitan_config.py": _python(plan, loss)}


def llama3_flavor(plan: Plan) -> str | None:
    """torchtitan's llama3 flavor with exactly the plan's model shape, if there is one."""
    m = plan.model
    if m.family is not Family.LLAMA or m.vocab != 128256:
        return None
    return _LLAMA3.get((m.layers, m.hidden, m.ffn_hidden, m.heads, m.n_kv_heads))


# -- values shared by both forms --------------------------------------------------------------
def _data_parallel(plan: Plan) -> dict[str, int | str]:
    """Replicate/shard degrees and the FSDP reshard policy for the plan's ZeRO stage."""
    s = plan.strategy
    if s.zero is ZeroStage.NONE or s.dp == 1:
        return {"data_parallel_replicate_degree": s.dp, "data_parallel_shard_degree": 1}
    # HSDP: torchtitan shards over dp_shard * cp and replicates over dp_replicate
    # (torchtitan/distributed/parallel_dims.py, b5bcd76c), so dp_shard = shard_group / sp.
    replicate = s.replicas
    return {"data_parallel_replicate_degree": replicate,
            "data_parallel_shard_degree": s.dp // replicate,
            "fsdp_reshard_after_forward": _RESHARD[s.zero]}


def _zero_comment(plan: Plan) -> list[str]:
    s = plan.strategy
    if s.dp == 1:
        lines = ["dp=1: no data parallelism"]
    elif s.zero is ZeroStage.NONE:
        lines = ["ZeRO 0: data parallel by replication (DDP)"]
    elif s.zero is ZeroStage.PARAMETERS and s.replicas > 1:
        lines = [f"HSDP: FSDP within shard groups of {s.shard_ranks} ranks (dp_shard * cp),",
                 f"replicated {s.replicas} times (dp_replicate): gradients all-reduced across"]
    elif s.zero is ZeroStage.PARAMETERS:
        lines = ["ZeRO 3: FSDP over the dp ranks, parameters resharded after forward"]
    else:
        lines = [f"ZeRO {int(s.zero)}: torchtitan has no ZeRO-1/2; FSDP that keeps the",
                 "parameters gathered from forward to backward (reshard never) shards",
                 "gradients and optimizer state: ZeRO-2-like"]
        if s.replicas > 1:
            lines.append(f"sharded within groups of {s.shard_ranks} ranks (dp_shard * cp),"
                         f" replicated {s.replicas} times (dp_replicate)")
    if s.sp > 1:
        lines.append(f"torchtitan's FSDP also shards weights over the cp={s.sp} ranks")
    return lines


def _pipeline(plan: Plan) -> dict[str, int | str]:
    """Pipeline fields both forms share (empty without pipeline parallelism)."""
    s = plan.strategy
    if s.pp == 1:
        return {}
    chunks = s.v  # interleaved's v, zbv's 2, else 1
    ends = s.short_ends(plan.model.layers)
    if ends is not None:  # v > 1: the first / last virtual stage one layer short
        per_chunk = max(s.chunk_layers(plan.model.layers, 0))
        return {"pipeline_parallel_schedule": SCHEDULES[s.schedule],
                "pipeline_parallel_layers_per_stage": per_chunk,
                "pipeline_parallel_first_stage_less_layers": int(ends[0]),
                "pipeline_parallel_last_stage_less_layers": int(ends[1])}
    if s.uneven:  # v = 1 (search_spaces.frameworks refuses the rest)
        counts = s.stage_layers(plan.model.layers)
        middle = counts[1]
        return {"pipeline_parallel_schedule": SCHEDULES[s.schedule],
                "pipeline_parallel_layers_per_stage": middle,
                "pipeline_parallel_first_stage_less_layers": middle - counts[0],
                "pipeline_parallel_last_stage_less_layers": middle - counts[-1]}
    return {"pipeline_parallel_schedule": SCHEDULES[s.schedule],
            "pipeline_parallel_layers_per_stage": plan.model.layers // (s.pp * chunks),
            "pipeline_parallel_first_stage_less_layers": 0,
            "pipeline_parallel_last_stage_less_layers": 0}


def _pipeline_comment(plan: Plan) -> list[str]:
    s = plan.strategy
    if s.pp == 1:
        return []
    if s.uneven:
        counts = s.stage_layers(plan.model.layers)
        if s.v > 1:
            return [(f"uneven stages {counts[0]}, {counts[1]} x {s.pp - 2}, {counts[-1]} over"
                     f" {s.v} stages per rank: the first and last of the {s.pp * s.v} stages hold"
                     " layers_per_stage - less_layers"),
                    ("(_generate_llm_fqn_per_model_part, torchtitan/distributed/"
                     "pipeline_parallel.py b5bcd76c); Megatron-LM's"
                     " --account-for-embedding/loss-in-pipeline-split")]
        return [(f"uneven stages {counts[0]}, {counts[1]} x {s.pp - 2}, {counts[-1]}:"
                 " first and last stage hold layers_per_stage - less_layers"),
                ("(_generate_llm_fqn_per_model_part, torchtitan/distributed/pipeline_parallel.py"
                 " b5bcd76c); embedding and output count as no layers, as in the estimate")]
    chunks = s.v  # interleaved's v, zbv's 2, else 1
    lines = [(f"{chunks} stage(s) per rank: layers per stage = layers / (pp * v)"
              f" = {plan.model.layers} / ({s.pp} * {chunks});"),
             "embedding and output count as no layers, as in the plan's estimate"]
    if s.schedule is Schedule.ZBV:
        lines.append(f"ZBVZeroBubble lays the {2 * s.pp} stages out in a V: rank r holds stages"
                     f" r and {2 * s.pp - 1} - r, so rank 0 holds the embedding and the output")
    return lines


# -- torchtitan.toml (v0.2.2) -----------------------------------------------------------------
def _toml(plan: Plan) -> str:
    lines = ["# torchtitan job file (TOML form, torchtitan v0.2.2 and earlier)",
             *(f"# {h}" for h in header_lines(plan)),
             f"# Field names: {TOML_SOURCE}.",
             (f"# Run with NGPU={plan.strategy.devices} in total, e.g. CONFIG_FILE=torchtitan.toml"
             " ./run_train.sh on each node."), ""]
    lines += ["[job]", _kv("description", f"Parallel Planner: {plan.label}"), ""]
    lines += _toml_model(plan) + [""]
    lines += _toml_training(plan) + [""]
    lines += _toml_parallelism(plan) + [""]
    lines += _toml_activation_checkpoint(plan)
    return "\n".join(lines) + "\n"


def _kv(key: str, value: float | str | bool) -> str:
    if isinstance(value, bool):
        return f"{key} = {'true' if value else 'false'}"
    if isinstance(value, str):
        return f"{key} = {json.dumps(value)}"
    return f"{key} = {value}"


def _configuration(plan: Plan) -> tuple[str, str, str] | None:
    """torchtitan's (model package, flavor, config_registry function) of the plan's model."""
    moe = moe_flavor(plan)
    if moe is not None:
        return moe
    flavor = llama3_flavor(plan)
    return None if flavor is None else ("llama3", flavor, f"llama3_{flavor.lower()}")


def _toml_model(plan: Plan) -> list[str]:
    found = _configuration(plan)
    if found is None:
        lines = ["[model]", (f"# no torchtitan flavor has model {plan.model.name}'s shape;"
                 " set name and flavor to yours")]
    else:
        lines = ["[model]", _kv("name", found[0]), _kv("flavor", found[1])]
    if plan.strategy.precision is Precision.FP8:
        lines += ["# fp8: torchao Float8Linear for the linear layers, the LM head in bf16",
                  'converters = ["float8"]', "", "[quantize.linear.float8]",
                  _kv_list("filter_fqns", ["output"])]
    return lines


def _kv_list(key: str, values: list[str]) -> str:
    return f"{key} = [{', '.join(json.dumps(v) for v in values)}]"


def _toml_training(plan: Plan) -> list[str]:
    s, t = plan.strategy, plan.training
    m = micro_batches(plan)
    local = s.micro_batch * m if s.pp > 1 else s.micro_batch
    accumulation = t.global_batch // (local * s.dp)
    return ["[training]",
            "# local_batch_size: per data-parallel rank per gradient-accumulation step;",
            (f"# gradient accumulation = global / (local * dp)"
            f" = {t.global_batch} / ({local} * {s.dp}) = {accumulation}"),
            _kv("local_batch_size", local),
            _kv("global_batch_size", t.global_batch),
            _kv("seq_len", t.seq_len),
            _kv("mixed_precision_param", "bfloat16"),
            _kv("mixed_precision_reduce", "float32")]


def _toml_parallelism(plan: Plan) -> list[str]:
    s = plan.strategy
    lines = ["[parallelism]", *(f"# {c}" for c in _zero_comment(plan))]
    lines += [_kv(k, v) for k, v in _data_parallel(plan).items()]
    lines.append(_kv("tensor_parallel_degree", s.tp))
    lines += [f"# {c}" for c in expert_comment(plan)]
    lines += [_kv(k, v) for k, v in expert_fields(plan, toml=True).items()]
    if s.tp > 1:
        if not s.sequence_parallel:
            lines.append("# v0.2.2 always applies sequence parallelism with tensor parallelism")
        lines.append(_kv("enable_async_tensor_parallel", False))
    lines.append(_kv("pipeline_parallel_degree", s.pp))
    if s.pp > 1:
        lines += [f"# {c}" for c in _pipeline_comment(plan)]
        lines += [_kv(k, v) for k, v in _pipeline(plan).items()]
        lines.append(f"# {micro_batches(plan)} micro-batches = local_batch_size /"
                     " pipeline_parallel_microbatch_size")
        lines.append(_kv("pipeline_parallel_microbatch_size", s.micro_batch))
    lines.append(_kv("context_parallel_degree", s.sp))
    return lines


def _toml_activation_checkpoint(plan: Plan) -> list[str]:
    r = plan.strategy.recompute
    lines = ["[activation_checkpoint]", _kv("mode", r.value)]
    if r is Recompute.SELECTIVE:
        priced = ("" if plan.training.selective_recompute is SelectiveRecompute.OP else
                  " (the estimate priced Megatron-LM's attention-core recompute; a torchtitan"
                  " study prices this)")
        lines += [f"# per-op selective checkpointing{priced}", _kv("selective_ac_option", "op")]
    return lines


# -- torchtitan_config.py (Trainer.Config, main) ----------------------------------------------
def _python(plan: Plan, loss: str | None = None) -> str:
    docstring = ["torchtitan Trainer.Config (Python form, torchtitan main since 2026)", "",
                 *header_lines(plan), *([f"{loss[0].upper()}{loss[1:]}."] if loss else []), "",
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
                "                model_compile_enabled=(",
                '                    config.compile.enable and "model" in config.compile.components',
                "                ),",
                "            ),",
                "        ]),"]
    if flavor in _FLOAT8_BUILTIN:
        return [f"        # bf16: torchtitan's {flavor} config converts to float8; this plan does not",
                f"        model_spec=model_registry({_py(flavor)}),"]
    return []


def _python_imports(plan: Plan) -> list[str]:
    lines = []
    if plan.strategy.precision is Precision.FP8 and llama3_flavor(plan) is not None:
        lines.append("from torchtitan.components.quantization import Float8LinearConverter")
    lines.append("from torchtitan.config import ParallelismConfig")
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
             ('    """``config`` with the plan\'s parallelism, batch and activation'
             ' checkpointing."""'),
             "    parallelism = ParallelismConfig(",
             *(f"        # {c}" for c in _zero_comment(plan))]
    lines += [f"        {k}={_py(v)}," for k, v in _data_parallel(plan).items()]
    lines += [f"        tensor_parallel_degree={s.tp},",
              f"        enable_sequence_parallel={s.tp > 1 and s.sequence_parallel},",
              *(f"        # {c}" for c in expert_comment(plan)),
              *(f"        {k}={v}," for k, v in expert_fields(plan, toml=False).items()),
              f"        pipeline_parallel_degree={s.pp},"]
    if s.pp > 1:
        lines += [f"        # {c}" for c in _pipeline_comment(plan)]
        lines += [f"        {k}={_py(v)}," for k, v in _pipeline(plan).items()]
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
              '        mixed_precision_reduce="float32",']
    if s.pp > 1:
        lines += ["        # CUDA graphs do not support pipeline parallelism yet",
                  "        disable_cuda_graphs=True,"]
    ac = _ac_class(plan)
    lines += ["    )",
              "    return dataclasses.replace(",
              "        config,",
              *_model_spec(plan),
              "        parallelism=parallelism,",
              "        training=training,",
              f"        activation_checkpoint={'None' if ac is None else ac + '.Config()'},",
              "    )"]
    return lines


def _python_entry(plan: Plan) -> list[str]:
    found = _configuration(plan)
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
