"""The values both of torchtitan's config forms share (``planner.exports._torchtitan`` writes
the TOML form, ``planner.exports._torchtitan_python`` the Python one): the plan's flavor, data
parallel degrees and FSDP reshard policy, pipeline fields and the comments that explain them.
Sources in ``planner.exports._torchtitan``'s docstring."""

from __future__ import annotations

from planner.exports._torchtitan_moe import moe_flavor
from planner.plan import Plan
from simcore.specs import Family, Schedule, ZeroStage

__all__ = ["COMPILED", "SCHEDULES", "compile_comment", "compiled", "configuration",
           "data_parallel", "llama3_flavor", "pipeline", "pipeline_comment", "zero_comment"]

SCHEDULES = {Schedule.GPIPE: "GPipe", Schedule.ONE_F_ONE_B: "1F1B",
             Schedule.INTERLEAVED: "Interleaved1F1B", Schedule.ZBV: "ZBVZeroBubble"}
"""The plan's schedule -> torch.distributed.pipelining's schedule name."""

_LLAMA3 = {(32, 4096, 14336, 32, 8): "8B", (80, 8192, 28672, 64, 8): "70B",
           (126, 16384, 53248, 128, 8): "405B"}
"""torchtitan's llama3 flavors by (layers, dim, ffn, heads, kv_heads); vocab 128256."""

COMPILED = ("model", "loss")
"""What torch.compile compiles when the plan is compiled (torchtitan's ``components`` default)."""

_RESHARD = {ZeroStage.OPTIMIZER: "never", ZeroStage.GRADIENTS: "never",
            ZeroStage.PARAMETERS: "always"}


def llama3_flavor(plan: Plan) -> str | None:
    """torchtitan's llama3 flavor with exactly the plan's model shape, if there is one."""
    m = plan.model
    if m.family is not Family.LLAMA or m.vocab != 128256:
        return None
    return _LLAMA3.get((m.layers, m.hidden, m.ffn_hidden, m.heads, m.n_kv_heads))


def compiled(plan: Plan) -> bool:
    """Whether the plan runs under torch.compile: its training prices the norms, the rotary
    embedding and the SwiGLU as fused kernels (the estimate's default), which eager torchtitan
    runs as PyTorch's ops (its Llama's ``RMSNorm``, complex ``apply_rotary_emb`` and
    ``F.silu(w1(x)) * w3(x)``) and torch.compile fuses. torchtitan's configs leave compile off
    (``CompileConfig.enable`` False at b5bcd76c; ``[compile] enable=false`` in v0.2.2's
    ``llama3_8b.toml``), so the exports say which."""
    t = plan.training
    return t.fused_norm and t.rope_fusion and t.swiglu_fusion


def compile_comment(plan: Plan) -> str:
    if compiled(plan):
        return ("torch.compile fuses the norms, the rotary embedding and the SwiGLU, as the"
                " estimate prices them")
    return ("eager, as the plan's training says: its norms, rotary embedding or SwiGLU run as"
            " PyTorch's ops")


def configuration(plan: Plan) -> tuple[str, str, str] | None:
    """torchtitan's (model package, flavor, config_registry function) of the plan's model."""
    moe = moe_flavor(plan)
    if moe is not None:
        return moe
    flavor = llama3_flavor(plan)
    return None if flavor is None else ("llama3", flavor, f"llama3_{flavor.lower()}")


def data_parallel(plan: Plan) -> dict[str, int | str]:
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


def zero_comment(plan: Plan) -> list[str]:
    s = plan.strategy
    if s.dp == 1:
        lines = ["dp=1: no data parallelism"]
    elif s.zero is ZeroStage.NONE:
        lines = ["ZeRO 0: data parallel by replication (DDP in v0.2.2; FSDP of shard degree 1",
                 "replicated over dp on main)"]
    elif s.zero is ZeroStage.PARAMETERS and s.replicas > 1:
        lines = [f"HSDP: FSDP within shard groups of {s.shard_ranks} ranks (dp_shard * cp),",
                 f"replicated {s.replicas} times (dp_replicate): gradients all-reduced across"]
    elif s.zero is ZeroStage.PARAMETERS:
        lines = ["ZeRO 3: FSDP over the dp ranks, parameters resharded after forward"]
    else:
        lines = [f"ZeRO {int(s.zero)}: torchtitan has no ZeRO-1/2; FSDP that keeps the",
                 "parameters gathered from forward to backward (reshard never) shards",
                 "gradients and optimizer state, reduce-scattering them every micro-batch at",
                 "pp 1 (ZeRO-2) and on the last micro-batch under a pipeline (ZeRO-1)"]
        if s.replicas > 1:
            lines.append(f"sharded within groups of {s.shard_ranks} ranks (dp_shard * cp),"
                         f" replicated {s.replicas} times (dp_replicate)")
    if s.sp > 1:
        lines.append(f"torchtitan's FSDP also shards weights over the cp={s.sp} ranks")
    return lines


def pipeline(plan: Plan) -> dict[str, int | str]:
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


def pipeline_comment(plan: Plan) -> list[str]:
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
