"""Hand-written expected torchtitan Trainer.Config for the test plan.

Compared with the exporter's file as an AST with docstrings dropped (comments are not compared).
Numbers: num_tokens_per_microbatch_per_dp_rank = micro_batch 1 * seq 8192 = 8192;
num_tokens_per_train_step = 2048 * 8192 = 16777216; num_pp_microbatches = 2048 / (1 * 8) = 256,
so gradient accumulation = 16777216 / (8192 * 256 * 8) = 1.
"""

import dataclasses

from torchtitan.config import CompileConfig, ParallelismConfig
from torchtitan.distributed.activation_checkpoint import SelectiveAC
from torchtitan.trainer import Trainer


def apply_plan(config: Trainer.Config) -> Trainer.Config:
    """Docstring (not compared)."""
    parallelism = ParallelismConfig(
        data_parallel_replicate_degree=1,
        data_parallel_shard_degree=8,
        fsdp_reshard_after_forward="never",
        tensor_parallel_degree=8,
        enable_sequence_parallel=True,
        pipeline_parallel_degree=4,
        pipeline_parallel_schedule="Interleaved1F1B",
        pipeline_parallel_layers_per_stage=10,
        pipeline_parallel_first_stage_less_layers=0,
        pipeline_parallel_last_stage_less_layers=0,
        num_pp_microbatches=256,
        context_parallel_degree=4,
    )
    training = dataclasses.replace(
        config.training,
        num_tokens_per_microbatch_per_dp_rank=8192,
        num_tokens_per_train_step=16777216,
        max_context_length=8192,
        mixed_precision_param="bfloat16",
        mixed_precision_reduce="float32",
        disable_cuda_graphs=True,
    )
    # configs.py CompileConfig(enable=False, components=["model", "loss"]) by default; the
    # plan's training prices its norms, rotary embedding and SwiGLU fused
    compile_config = CompileConfig(enable=True, components=["model", "loss"])
    return dataclasses.replace(
        config,
        parallelism=parallelism,
        training=training,
        compile=compile_config,
        activation_checkpoint=SelectiveAC.Config(),
    )


def plan_config() -> Trainer.Config:
    """Docstring (not compared)."""
    from torchtitan.models.llama3.config_registry import llama3_70b

    return apply_plan(llama3_70b())
