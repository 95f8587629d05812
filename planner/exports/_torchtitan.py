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
  ``selective_ac_option`` ("op" for per-op selective AC); ``[compile]`` ``enable`` (default
  false), ``components`` (default model and loss): on where the plan's training prices its
  norms, rotary embedding and SwiGLU fused (``planner.exports._torchtitan_fields.compiled``).
- ``torchtitan/train.py``: gradient accumulation = global_batch_size / (local_batch_size * dp).
- ``torchtitan/distributed/pipeline_parallel.py``: stages = ceil((layers + first_less + last_less)
  / layers_per_stage), stages per rank = stages / pp.
- ``torchtitan/models/llama3/infra/parallelize.py``: ``fsdp_reshard_after_forward = "default"``
  reshards only without pipeline parallelism; data parallelism by replication alone
  (``data_parallel_replicate_degree`` > 1 with no sharding, no cp) is DDP, which raises "DDP
  has not supported > 1D parallelism" beside tp or pp: such a plan gets no TOML
  (:func:`toml_refused`). Main runs it as FSDP replicated over dp (``apply_fsdp_to_decoder``
  always, shard degree 1).

``torchtitan_config.py``: the Python ``Trainer.Config`` form that replaced the TOML in
commit 9810191b (2026-02-23, #2386). Field names from pytorch/torchtitan main at commit b5bcd76c
(2026-08-22):

- ``torchtitan/trainer.py``: ``Trainer.Config`` fields ``training``, ``parallelism``,
  ``activation_checkpoint`` (``SelectiveAC.Config()``, ``FullAC.Config()`` or ``None``),
  ``compile`` (``CompileConfig(enable, components)``, ``torchtitan/config/configs.py``); its check
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
head left in bf16. TOML (v0.2.2): ``[model] converters = ["quantize.linear.float8"]``, the
name the converter registers under at 73a0e697 (``torchtitan/components/quantization/
float8.py``; ``protocols/model_converter.py`` looks it up as given: ``"float8"``, which that
tag's ``train_configs/llama3_405b.toml`` still writes, is a KeyError), with
``[quantize.linear.float8] filter_fqns = ["output"]``. Python (main):
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
from planner.exports._reprice import run_by
from planner.exports._torchtitan_fields import (
    COMPILED,
    SCHEDULES,
    compile_comment,
    compiled,
    configuration,
    data_parallel,
    llama3_flavor,
    pipeline,
    pipeline_comment,
    zero_comment,
)
from planner.exports._torchtitan_loss import torchtitan_loss_check
from planner.exports._torchtitan_moe import expert_comment, expert_fields
from planner.exports._torchtitan_python import python_config
from planner.plan import Plan
from search_spaces.frameworks import why_not
from simcore.specs import CrossEntropy, Precision, Recompute, ZeroStage

__all__ = ["SCHEDULES", "export_torchtitan", "llama3_flavor"]

TOML_SOURCE = "pytorch/torchtitan v0.2.2 (73a0e697), torchtitan/config/job_config.py"


def export_torchtitan(plan: Plan) -> dict[str, str]:
    """``torchtitan.toml`` (v0.2.2 and earlier) and ``torchtitan_config.py`` (main, 2026);
    raises ValueError if torchtitan cannot run the plan."""
    plan = run_by(plan, "torchtitan")
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
    loss = torchtitan_loss_check(plan)  # main's, the Python form's
    refused = toml_refused(plan)
    whole = None
    if refused is None:  # v0.2.2 takes the loss on all the logits at once
        try:
            whole = torchtitan_loss_check(plan, CrossEntropy.PYTORCH)
        except ValueError as error:
            refused = f"{error} (main's loss, the Python form's, takes them a slice at a time)"
    if refused is not None:  # the Python form only, saying why
        return {"torchtitan_config.py": python_config(plan, loss, f"no torchtitan.toml:"
                                                      f" {refused}")}
    toml = _toml(plan) if whole is None else f"# {whole}\n{_toml(plan)}"
    return {"torchtitan.toml": toml, "torchtitan_config.py": python_config(plan, loss)}


def toml_refused(plan: Plan) -> str | None:
    """Why torchtitan v0.2.2 cannot run the plan's TOML, or None: ZeRO 0 over dp > 1 beside tp
    or pp is its DDP, which llama3's parallelize.py refuses for meshes of more than one
    dimension (module docstring)."""
    s = plan.strategy
    if s.zero is not ZeroStage.NONE or s.dp == 1 or s.sp > 1 or s.tp * s.pp == 1:
        return None
    if plan.model.moe is not None:  # qwen3's and deepseek_v3's parallelize.py check the mesh
        return None  # themselves (dp_mesh.ndim > 1), which a dp_replicate mesh passes
    return (f"torchtitan v0.2.2 runs ZeRO 0 over dp {s.dp} as DDP, which it refuses beside tp"
            f" or pp (\"DDP has not supported > 1D parallelism\", parallelize.py at 73a0e697);"
            " torchtitan main runs it as FSDP replicated over dp (this file), or export the"
            " plan with zero 1-3")


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
    lines += _toml_activation_checkpoint(plan) + [""]
    lines += ["[compile]", f"# {compile_comment(plan)}", _kv("enable", compiled(plan)),
              _kv_list("components", list(COMPILED))]
    return "\n".join(lines) + "\n"


def _kv(key: str, value: float | str | bool) -> str:
    if isinstance(value, bool):
        return f"{key} = {'true' if value else 'false'}"
    if isinstance(value, str):
        return f"{key} = {json.dumps(value)}"
    return f"{key} = {value}"


def _toml_model(plan: Plan) -> list[str]:
    found = configuration(plan)
    if found is None:
        lines = ["[model]", (f"# no torchtitan flavor has model {plan.model.name}'s shape;"
                 " set name and flavor to yours")]
    else:
        lines = ["[model]", _kv("name", found[0]), _kv("flavor", found[1])]
    if plan.strategy.precision is Precision.FP8:
        lines += ["# fp8: torchao Float8Linear for the linear layers, the LM head in bf16",
                  'converters = ["quantize.linear.float8"]', "", "[quantize.linear.float8]",
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
            "# gradients reduced in float32, the only type torchtitan takes (grad_bytes 4)",
            _kv("mixed_precision_reduce", "float32")]


def _toml_parallelism(plan: Plan) -> list[str]:
    s = plan.strategy
    lines = ["[parallelism]", *(f"# {c}" for c in zero_comment(plan))]
    lines += [_kv(k, v) for k, v in data_parallel(plan).items()]
    lines.append(_kv("tensor_parallel_degree", s.tp))
    lines += [f"# {c}" for c in expert_comment(plan)]
    lines += [_kv(k, v) for k, v in expert_fields(plan, toml=True).items()]
    if s.tp > 1:
        if not s.sequence_parallel:
            lines.append("# v0.2.2 always applies sequence parallelism with tensor parallelism")
        lines.append(_kv("enable_async_tensor_parallel", False))
    lines.append(_kv("pipeline_parallel_degree", s.pp))
    if s.pp > 1:
        lines += [f"# {c}" for c in pipeline_comment(plan)]
        lines += [_kv(k, v) for k, v in pipeline(plan).items()]
        lines.append(f"# {micro_batches(plan)} micro-batches = local_batch_size /"
                     " pipeline_parallel_microbatch_size")
        lines.append(_kv("pipeline_parallel_microbatch_size", s.micro_batch))
    lines.append(_kv("context_parallel_degree", s.sp))
    return lines


def _toml_activation_checkpoint(plan: Plan) -> list[str]:
    r = plan.strategy.recompute
    lines = ["[activation_checkpoint]", _kv("mode", r.value)]
    if r is Recompute.SELECTIVE:  # the stack's comment says what it costs over the estimate's
        lines += ["# per-op selective checkpointing", _kv("selective_ac_option", "op")]
    return lines
