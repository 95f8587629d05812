#!/usr/bin/env bash
# Parallel Planner plan: dp8-tp8-pp4-sp4 mb1 interleaved-v2 selective zero1
# model llama3-70b on dgx-h100-1024 (1024 devices), global batch 2048 x seq 8192
# estimate: step time <STEP_TIME> s, peak memory <PEAK_MEMORY> GB (fits)
# world size = dp * tp * pp * sp = 8 * 8 * 4 * 4 = 1024
# Option names: NVIDIA/Megatron-LM d98e8a64 (2026-08-22), megatron/training/arguments.py.
# Add data, tokenizer and optimizer arguments after the script's name, e.g.
#   ./megatron.sh --data-path ... --tokenizer-type ... --train-iters ... --lr ...
set -euo pipefail

WORLD_SIZE=1024  # dp*tp*pp*sp
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NNODES=$(( WORLD_SIZE / GPUS_PER_NODE ))
# Tensor or context parallelism needs this before Blackwell.
export CUDA_DEVICE_MAX_CONNECTIONS=1
TORCHRUN_ARGS=(
  --nproc_per_node "$GPUS_PER_NODE" --nnodes "$NNODES" --node_rank "${NODE_RANK:-0}"
  --master_addr "${MASTER_ADDR:-localhost}" --master_port "${MASTER_PORT:-6000}"
)

ARGS=(
  # parallelism (data parallel = world / (tp * pp * cp), here 1024 / (8 * 4 * 4) = 8)
  --tensor-model-parallel-size 8
  --pipeline-model-parallel-size 4
  --context-parallel-size 4
  --sequence-parallel
  # tp all-gathers / reduce-scatters overlapped with the GEMMs (TE userbuffers)
  --tp-comm-overlap
  # interleaved 1F1B, v=2 model chunks per rank: layers / (pp * v) = 80 / (4 * 2)
  # (same as --num-virtual-stages-per-pipeline-rank 2; give only one of them)
  --num-layers-per-virtual-pipeline-stage 10

  # batch: 256 micro-batches per step per replica = 2048 / (1 * 8)
  --micro-batch-size 1
  --global-batch-size 2048

  # selective recompute: the attention core (Megatron's default recompute module)
  --recompute-granularity selective

  # ZeRO 1: Megatron's distributed optimizer shards the optimizer state
  # (fp32 master weights, Adam moments) over data-parallel ranks: ZeRO-1-like
  --use-distributed-optimizer
  # gradients accumulated and reduced in bf16 (2 bytes a parameter), as estimated;
  # Megatron-LM's default is fp32 main gradients (a study's grad_bytes: 4)
  --grad-reduce-in-bf16
  --overlap-grad-reduce
  --overlap-param-gather

  # model llama3-70b (vocab 128256 comes from the tokenizer)
  --num-layers 80
  --hidden-size 8192
  --ffn-hidden-size 28672
  --num-attention-heads 64
  --group-query-attention
  --num-query-groups 8
  --seq-length 8192
  --max-position-embeddings 8192
  --swiglu
  --normalization RMSNorm
  --position-embedding-type rope
  --disable-bias-linear
  --untie-embeddings-and-output-weights
  # no dropout, as estimated (no masks kept)
  --attention-dropout 0.0
  --hidden-dropout 0.0
  --bf16
  # Transformer Engine's fused (cuDNN) attention, as estimated
  --attention-backend fused

  # the fused vocab-parallel loss, priced at 4 bytes a logit (Transformer Engine's
  # in-place kernel); this Megatron-LM runs its jit-fused one, 10 bytes a logit:
  # about 0.2 GB more on the last stage (cross_entropy megatron_fused prices it)
  --cross-entropy-loss-fusion
)

torchrun "${TORCHRUN_ARGS[@]}" pretrain_gpt.py "${ARGS[@]}" "$@"
