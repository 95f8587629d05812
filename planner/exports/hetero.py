"""Plans on mixed clusters as the frameworks that can run them, and the rule that says which can.

Two frameworks run a pipeline whose stages sit on different device types:

- **FlagScale** (heterogeneous training, ``system.hetero``): consecutive stages of one shape
  form a *process mesh* ``[tp, cp, ep, dp, pp]``; meshes may differ in tp and dp; the layers of
  each pipeline stage are listed. Its checks, read in FlagOpen/FlagScale@6b238b7
  ``flagscale/train/arguments.py`` (``pre_validate_args``): meshes take ranks in order;
  ``pipeline_model_parallel_size`` is the sum of the meshes' pp and the layer split has one entry
  per stage summing to ``num_layers``; the data loader uses the first mesh's dp, and mesh ``i``
  runs ``dp_0 * micro_batch_size / dp_i`` sequences per replica, which must be whole; meshes of
  different tp need ``sequence_parallel``; tied embeddings need equal tp on the first and last
  mesh (and, with the distributed optimizer, one of their dp dividing the other, with
  ``use_partial_reduce_for_shared_embedding``); no virtual pipeline; context and expert degrees
  equal everywhere. Config layout and hostfile (``ADDRESS slots=N type=DEVICE``) as in its
  heterogeneous training guide (flagos-ai/FlagScale, examples/qwen3 ``10b_hetero.yaml``).
- **Megatron-LM** (Megatron-Core): one tp and dp for every stage, but any layers per stage through
  ``--pipeline-model-parallel-layout`` (``E`` embedding, ``t`` a transformer layer, ``L`` the
  loss, ``|`` between stages; NVIDIA/Megatron-LM@b1030e9
  ``megatron/core/transformer/pipeline_parallel_layer_layout.py``). Megatron does not know the
  device types; the node order puts each stage on its group (ranks are tp-fastest, pipeline
  stage slowest).

Both: ZeRO 0 or 1 (Megatron's distributed optimizer; ZeRO-2/3 are not in either's
heterogeneous path), 1F1B (a GPipe plan runs as 1F1B, same bubble), one attention kernel for
every stage, bf16 only if every device type has it (else fp16 with loss scaling everywhere).
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from planner.exports._megatron import gradient_args, model_args, recompute_args
from planner.exports._megatron_model import attention_backend, cudnn_attention
from search_spaces.frameworks import megatron_loss
from simcore.megatron import uses_flash_attention
from simcore.mixed import MixedPlan, MixedSystemSpec
from simcore.specs import (
    Activation,
    CrossEntropy,
    Family,
    ModelSpec,
    Recompute,
    Schedule,
    TrainingSpec,
    ZeroStage,
)

__all__ = ["FRAMEWORKS", "Mesh", "meshes", "why_not", "runs_on", "export_hetero"]

FRAMEWORKS = ("flagscale", "megatron")


@dataclass(frozen=True, slots=True)
class Mesh:
    """Consecutive stages on one group with one tp and dp: a FlagScale process mesh."""

    group: int
    tp: int
    dp: int
    layers: tuple[int, ...]

    @property
    def pp(self) -> int:
        return len(self.layers)


def meshes(plan: MixedPlan) -> list[Mesh]:
    out: list[Mesh] = []
    for st in plan.stages:
        last = out[-1] if out else None
        if last is not None and (last.group, last.tp, last.dp) == (st.group, st.tp, st.dp):
            out[-1] = Mesh(st.group, st.tp, st.dp, last.layers + (st.layers,))
        else:
            out.append(Mesh(st.group, st.tp, st.dp, (st.layers,)))
    return out


def _flash(model: ModelSpec, system: MixedSystemSpec, training: TrainingSpec,
           plan: MixedPlan) -> set[bool]:
    return {uses_flash_attention(model, system.groups[g], training)
            for g in {st.group for st in plan.stages}}


def _attention(model: ModelSpec, system: MixedSystemSpec, training: TrainingSpec,
               plan: MixedPlan) -> str:
    """Megatron-LM's ``--attention-backend`` for every stage: the one each device type was
    priced with, or, where they differ (cuDNN's on one, flash attention on another),
    Transformer Engine's own pick, ``auto`` (:func:`attention_backend`)."""
    flash = _flash(model, system, training, plan).pop()
    kinds = {attention_backend(flash, cudnn_attention(system.groups[g], training, plan.zero))
             for g in {st.group for st in plan.stages}}
    return kinds.pop() if len(kinds) == 1 else "auto"


def _bf16(system: MixedSystemSpec, plan: MixedPlan) -> bool:
    """bf16 if every device type the plan uses has it, else fp16 everywhere (V100, T4, P100)."""
    return all(system.groups[st.group].device.bf16 for st in plan.stages)


def _common(model: ModelSpec, system: MixedSystemSpec, training: TrainingSpec,
            plan: MixedPlan) -> str | None:
    if plan.zero not in (ZeroStage.NONE, ZeroStage.OPTIMIZER):
        return (f"ZeRO-{int(plan.zero)}: only ZeRO 0 or 1 (the distributed optimizer) runs with"
                " heterogeneous pipeline stages")
    if len(_flash(model, system, training, plan)) > 1:
        return ("the plan uses flash attention on some device types and not on others; one"
                " attention kernel runs everywhere (set training.flash_attention)")
    return None


def why_not(framework: str, model: ModelSpec, system: MixedSystemSpec, training: TrainingSpec,
            plan: MixedPlan) -> str | None:
    """Why ``framework`` cannot run ``plan`` as written, or None if it can."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"unknown framework {framework!r}; use one of {', '.join(FRAMEWORKS)}")
    refused = megatron_loss(training.cross_entropy)
    if refused is not None:
        return refused
    return _common(model, system, training, plan) or _specific(framework, model, training, plan,
                                                                meshes(plan))


def _specific(framework: str, model: ModelSpec, training: TrainingSpec, plan: MixedPlan,
              ms: list[Mesh]) -> str | None:
    """What ``framework`` alone refuses, given that the common rules hold."""
    if framework == "megatron":
        shapes = {(m.tp, m.dp) for m in ms}
        if len(shapes) > 1:
            return ("stages differ in tp or dp (" + ", ".join(f"tp{t} dp{d}" for t, d in
                    sorted(shapes)) + "); Megatron-LM runs one tp and dp on every stage")
        return None
    if len({m.tp for m in ms}) > 1 and not plan.sequence_parallel:
        return "meshes of different tp need sequence parallelism in FlagScale"
    first, last = ms[0], ms[-1]
    if model.tied_embeddings and len(ms) > 1:
        if first.tp != last.tp:
            return (f"tied embeddings need the same tp on the first and last mesh in FlagScale"
                    f" (here {first.tp} and {last.tp})")
        if (plan.zero is ZeroStage.OPTIMIZER and first.dp != last.dp
                and first.dp % last.dp and last.dp % first.dp):
            return (f"tied embeddings with the distributed optimizer need the first and last"
                    f" mesh's dp to divide one another in FlagScale (here {first.dp} and"
                    f" {last.dp})")
    sequences = training.global_batch // plan.micro_batches
    if any(sequences % m.dp for m in ms):  # dp_0 * micro_batch_size = sequences
        return "each mesh's replicas must take whole sequences of every micro-batch"
    return None


def runs_on(model: ModelSpec, system: MixedSystemSpec, training: TrainingSpec,
            plan: MixedPlan) -> tuple[str, ...]:
    """The frameworks that can run ``plan`` as written (the common rules checked once)."""
    if _common(model, system, training, plan) is not None:
        return ()
    ms = meshes(plan)
    return tuple(f for f in FRAMEWORKS if _specific(f, model, training, plan, ms) is None)


# -- files ------------------------------------------------------------------------------------
class _Dumper(yaml.SafeDumper):
    """Block mappings, lists on one line (``[1, 1, 1, 8, 2]``), as FlagScale's examples."""


_Dumper.add_representer(list, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v,
                                                                flow_style=True))


def _nodes(system: MixedSystemSpec, plan: MixedPlan) -> list[tuple[str, int, str]]:
    """(node name, GPUs, device) in rank order: the nodes of each group the stages use, in the
    order the pipeline first reaches them."""
    out = []
    for g in dict.fromkeys(st.group for st in plan.stages):
        group = system.groups[g]
        used = sum(st.devices for st in plan.stages if st.group == g)
        per_node = group.network.dims[0].npus
        for i in range(max(used // per_node, 1)):
            out.append((f"{group.name}-{i:03d}", min(per_node, used), group.device.name))
    return out


def _header(model: ModelSpec, system: MixedSystemSpec, training: TrainingSpec, plan: MixedPlan,
            estimate_line: str) -> list[str]:
    return [f"Parallel Planner plan: {plan.label(system)}",
            f"model {model.name} on {system.name} ({plan.devices} of {system.devices} devices),"
            f" global batch {training.global_batch} x seq {training.seq_len},"
            f" {plan.micro_batches} micro-batch{'es' if plan.micro_batches > 1 else ''}",
            f"estimate: {estimate_line}"]


def _flagscale(model: ModelSpec, system: MixedSystemSpec, training: TrainingSpec,
               plan: MixedPlan, header: list[str]) -> dict[str, str]:
    ms = meshes(plan)
    nodes = _nodes(system, plan)
    bf16 = _bf16(system, plan)
    sequences = training.global_batch // plan.micro_batches
    hetero = {
        "enable_hetero": True,
        "hetero_pipeline_layer_split": [st.layers for st in plan.stages],
        "hetero_process_meshes": [x for m in ms for x in (m.tp, 1, 1, m.dp, m.pp)],
        "hetero_device_types": [system.groups[m.group].device.name for m in ms],
        "hetero_current_device_type": system.groups[ms[0].group].device.name,
        "standalone_embedding_stage": False,
        "use_partial_reduce_for_shared_embedding": bool(model.tied_embeddings),
    }
    sys_: dict = {"tensor_model_parallel_size": ms[0].tp,
                  "pipeline_model_parallel_size": plan.pp,
                  "context_parallel_size": 1,
                  "sequence_parallel": plan.sequence_parallel and any(m.tp > 1 for m in ms),
                  "use_distributed_optimizer": plan.zero is ZeroStage.OPTIMIZER,
                  "overlap_grad_reduce": training.overlap_grad_reduce,
                  "precision": {"bf16": True} if bf16 else {"fp16": True},
                  **_gradient_keys(training.bytes_per_param_grads, bf16),
                  **{f[2:].replace("-", "_"): True for f in _stack_flags(training, plan)}}
    if plan.recompute is Recompute.FULL:
        sys_.update(recompute_granularity="full", recompute_method="uniform",
                    recompute_num_layers=1)
    elif plan.recompute is Recompute.SELECTIVE:
        sys_["recompute_granularity"] = "selective"
        if training.recompute_modules is not None:  # Megatron's recompute_modules option
            sys_["recompute_modules"] = [m.value for m in training.recompute_modules]
    sys_["hetero"] = hetero
    m: dict = {"num_layers": model.layers, "hidden_size": model.hidden,
               "ffn_hidden_size": model.ffn_hidden, "num_attention_heads": model.heads}
    if model.kv_heads is not None and model.kv_heads != model.heads:
        m.update(group_query_attention=True, num_query_groups=model.kv_heads)
    m.update(seq_length=training.seq_len, max_position_embeddings=training.seq_len)
    if model.activation is Activation.SWIGLU:
        m["swiglu"] = True
    if model.family is Family.LLAMA:
        m.update(normalization="RMSNorm", position_embedding_type="rope",
                 disable_bias_linear=True)
    if not model.trains_with_dropout:  # Megatron-LM's defaults are 0.1 each
        m.update(attention_dropout=0.0, hidden_dropout=0.0)
    m.update(untie_embeddings_and_output_weights=not model.tied_embeddings,
             attention_backend=_attention(model, system, training, plan),
             micro_batch_size=sequences // ms[0].dp,
             global_batch_size=training.global_batch)
    per_mesh = ", ".join(f"mesh {i} ({system.groups[x.group].name}): {sequences // x.dp}"
                         for i, x in enumerate(ms))
    comments = [*header,
                "FlagScale train config (the `train:` file of an experiment, e.g.",
                "examples/<model>/conf/train/<name>.yaml); add the data, tokenizer and optimizer",
                "sections. Mesh format [tp, cp, ep, dp, pp]; model.micro_batch_size is the first",
                f"mesh's, each mesh runs dp_0 * micro_batch_size / dp_i sequences: {per_mesh}.",
                "Run with the experiment's runner.hostfile set to the `hostfile` beside this file",
                "(its node order puts each mesh on its device type)."]
    text = "".join(f"# {c}\n" for c in comments)
    text += yaml.dump({"system": sys_, "model": m}, Dumper=_Dumper, sort_keys=False)
    hostfile = "".join(f"{name} slots={gpus} type={device}\n" for name, gpus, device in nodes)
    return {"flagscale_train.yaml": text, "hostfile": hostfile}


def _stack_flags(training: TrainingSpec, plan: MixedPlan) -> list[str]:
    """Megatron-LM's options for what the plan was priced with beyond its shape, as
    ``--format megatron`` writes them (:mod:`planner.exports._megatron`): the updated shards'
    all-gather beside the next forward (``--overlap-param-gather``, with the distributed
    optimizer's overlapped reduction; without it the gather runs after the step, exposed) and
    the fused loss (``--cross-entropy-loss-fusion``; Megatron-LM's default is unfused,
    d98e8a64 ``model_parallel_config.py``)."""
    flags = []
    if plan.zero is ZeroStage.OPTIMIZER and training.overlap_grad_reduce:
        flags.append("--overlap-param-gather")
    if training.cross_entropy is not CrossEntropy.MEGATRON:  # fused, either (_megatron)
        flags.append("--cross-entropy-loss-fusion")
    return flags


def _gradient_keys(grad_bytes: int, bf16: bool) -> dict[str, bool]:
    """:func:`planner.exports._megatron.gradient_args` as FlagScale's ``system`` keys, which it
    passes on as Megatron-LM's options (``--grad-reduce-in-bf16`` as ``grad_reduce_in_bf16``)."""
    flags = [a for a in gradient_args(grad_bytes, bf16) if a.startswith("--")]
    return {f[2:].replace("-", "_"): True for f in flags}


def layout(plan: MixedPlan) -> str:
    """``--pipeline-model-parallel-layout``: embedding in the first stage, loss in the last."""
    stages = [f"t*{st.layers}" if st.layers > 1 else "t" for st in plan.stages]
    stages[0] = "E," + stages[0]
    stages[-1] += ",L"
    return "|".join(stages)


def _megatron(model: ModelSpec, system: MixedSystemSpec, training: TrainingSpec,
              plan: MixedPlan, header: list[str]) -> dict[str, str]:
    st = plan.stages[0]
    nodes = _nodes(system, plan)
    bf16 = _bf16(system, plan)
    sequences = training.global_batch // plan.micro_batches
    lines = ["#!/usr/bin/env bash", *(f"# {h}" for h in header),
             "# Megatron-LM with a custom pipeline layout: every stage has the same tp and dp,",
             "# the layers per stage follow the device types. Start it once per node, in the",
             "# order of `nodes.txt` (NODE_RANK 0 first): stage k's ranks then sit on its group.",
             "# Add data, tokenizer and optimizer arguments after the script's name.",
             "set -euo pipefail", "",
             "GPUS=(" + " ".join(str(g) for _, g, _ in nodes) + ")  # per node, in rank order",
             'NODE_RANK="${NODE_RANK:-0}"',
             f"NNODES={len(nodes)}"]
    if st.tp > 1:
        lines += ["# Tensor parallelism needs this before Blackwell.",
                  "export CUDA_DEVICE_MAX_CONNECTIONS=1"]
    lines += ["TORCHRUN_ARGS=(",
              '  --nproc_per_node "${GPUS[$NODE_RANK]}" --nnodes "$NNODES"'
              ' --node_rank "$NODE_RANK"',
              '  --master_addr "${MASTER_ADDR:-localhost}" --master_port "${MASTER_PORT:-6000}"',
              ")", "", "ARGS=("]
    parallel = [f"# parallelism: {plan.pp} stages of tp {st.tp} x dp {st.dp}",
                f"--tensor-model-parallel-size {st.tp}",
                f"--pipeline-model-parallel-size {plan.pp}",
                f"--pipeline-model-parallel-layout \"{layout(plan)}\""]
    if st.tp > 1 and plan.sequence_parallel:
        parallel.append("--sequence-parallel")
    if plan.schedule is Schedule.GPIPE:
        parallel.append("# GPipe runs as Megatron's 1F1B: same bubble, less activation memory")
    per_replica = sequences // st.dp
    batch = [f"# batch: {plan.micro_batches} micro-batches of {sequences} sequences, each"
             f" {per_replica} a data-parallel replica (--micro-batch-size) x dp {st.dp}",
             f"--micro-batch-size {per_replica}",
             f"--global-batch-size {training.global_batch}"]
    dp = (["--use-distributed-optimizer"] if plan.zero is ZeroStage.OPTIMIZER else [])
    if training.overlap_grad_reduce:
        dp.append("--overlap-grad-reduce")
    dp += gradient_args(training.bytes_per_param_grads, bf16)
    if training.cross_entropy in (None, CrossEntropy.FUSED):  # as planner.exports._reprice says
        dp += ["# the fused loss, priced at 4 bytes a logit (Transformer Engine's in-place"
               " kernel);", "# this Megatron-LM runs its jit-fused one, 10 bytes a logit, on the"
               " last stage"]
    elif training.cross_entropy is CrossEntropy.MEGATRON_FUSED:
        dp.append("# the jit-fused vocab-parallel loss, as estimated (10 bytes a logit)")
    dp += _stack_flags(training, plan)
    for section in (parallel, batch,
                    recompute_args(plan.recompute, modules=training.recompute_modules), dp,
                    model_args(model, training.seq_len, _attention(model, system, training, plan),
                               bf16)):
        lines += [f"  {a}" for a in section] + [""]
    lines[-1] = ")"
    lines += ["", 'torchrun "${TORCHRUN_ARGS[@]}" pretrain_gpt.py "${ARGS[@]}" "$@"']
    order = "".join(f"{i} {name} {gpus} {device}\n" for i, (name, gpus, device) in enumerate(nodes))
    return {"megatron.sh": "\n".join(lines) + "\n",
            "nodes.txt": "# NODE_RANK node GPUs device\n" + order}


def export_hetero(framework: str, model: ModelSpec, system: MixedSystemSpec,
                  training: TrainingSpec, plan: MixedPlan, estimate_line: str) -> dict[str, str]:
    """The files that launch ``plan`` on ``framework``; ValueError if it cannot run it."""
    reason = why_not(framework, model, system, training, plan)
    if reason is not None:
        raise ValueError(f"{framework} cannot run {plan.label(system)}: {reason}")
    header = _header(model, system, training, plan, estimate_line)
    if framework == "flagscale":
        return _flagscale(model, system, training, plan, header)
    return _megatron(model, system, training, plan, header)
