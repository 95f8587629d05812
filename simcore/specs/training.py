"""What one training step processes, and the stack it trains on (:class:`TrainingSpec`)."""

from __future__ import annotations

from dataclasses import dataclass

from simcore.specs.choices import (
    CpComm,
    CrossEntropy,
    RecomputeModule,
    SelectiveRecompute,
    _Named,
    _positive,
)

GRAD_BYTES = (2, 4)
"""A gradient's bytes: 16-bit (bf16 or fp16) or fp32; the frameworks keep one or the other."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSpec:
    """What one training step processes."""

    global_batch: int
    """Sequences per optimizer step, over all data-parallel replicas."""
    seq_len: int
    bytes_per_param_weights: int = 2
    """bf16 weights."""
    bytes_per_param_grads: int = 2
    """bf16 gradients (Megatron with fp32 main grads: 4)."""
    grad_copy: bool | None = None
    """Each parameter's 16-bit gradient (its ``.grad``, 2 bytes) stays allocated beside the
    gradient accumulation buffer of ``bytes_per_param_grads``, unsharded: DeepSpeed's
    BF16_Optimizer (bf16 with fp32 gradient accumulation under ZeRO 0-1) adds each ``.grad``
    into its own full-size fp32 buffer and zeroes it without freeing it (deepspeedai/DeepSpeed
    edaa7221 ``deepspeed/runtime/bf16_optimizer.py``: ``fp32_groups_gradients_flat`` is
    ``zeros_like`` the whole flat bf16 group, ``clear_lp_grads`` calls ``zero_``). Megatron-LM
    accumulates straight into its fp32 ``main_grad`` and PyTorch FSDP frees the unsharded
    gradient after its reduce-scatter: neither keeps it. None: off, except in a ``framework:
    deepspeed`` study that accumulates in fp32 (:func:`search_spaces.frameworks.grad_copy`).
    Counted for ZeRO 0-1 plans only (DeepSpeed runs ZeRO-2/3 with its ZeRO optimizer)."""
    grad_reduce_bytes: int | None = None
    """Bytes of each gradient element the data-parallel reduction sends: 4 where the stack casts
    16-bit gradients to fp32 for the collective and back, as Aleph Alpha's Scaling does
    (Aleph-Alpha/scaling@737f855 ``src/scaling/core/optimizer/allreduce.py``:
    ``allreduce_tensor_in_float32``). None: the gradient buffer's, ``bytes_per_param_grads``.
    It prices the collective only; the buffer's memory stays ``bytes_per_param_grads``."""
    grad_all_reduce: bool = False
    """Under ZeRO-1 the optimizer all-reduces the whole gradient, each rank then steps its shard
    of the master weights and the updated 16-bit weights are all-gathered, as Scaling's ZeRO
    does (``optimizer.py`` ``step``: ``allreduce_gradients(optimized_grads=False)`` before the
    shard's update, ``parameter_group.py`` ``step_sequel``: ``all_gather``); twice the
    gradients' traffic of the reduce-scatter that Megatron-LM's distributed optimizer and
    DeepSpeed's ZeRO-1 run. Other ZeRO stages are the same either way."""
    main_grad_copy: bool | None = None
    """At the optimizer step the fp32 master weights take an fp32 copy of their 16-bit
    gradients (4 bytes a parameter of the optimizer's shard), held from the step to the next
    step's ``zero_grad``, when the activations are freed: the step's peak is the model states
    and that copy, and a stage's peak the larger of it and the backward's
    (:attr:`simcore.estimate.MemoryParts.step_copy`). Megatron-LM's optimizers do so when the
    gradient buffer is 16-bit (``grad_bytes 2``: fp16 training, or bf16 with
    ``--grad-reduce-in-bf16``): ``Float16OptimizerWithFloat16Params`` sets ``main_param.grad =
    model_param.main_grad.float()`` and the distributed optimizer ``shard_main_param.grad =
    shard_model_grad.float()`` (``megatron/core/optimizer/optimizer.py``,
    ``distrib_optimizer.py`` ``_copy_model_grads_to_main_grads``; with an fp32 buffer
    ``.float()`` returns the buffer itself, no copy). Counted with master weights, 16-bit
    gradients and ZeRO 0-1 only. None: off, except in a ``framework: megatron`` study
    (:func:`search_spaces.frameworks.main_grad_copy`)."""
    fp32_grad_partition: bool | None = None
    """The optimizer keeps an fp32 copy of its shard's 16-bit gradients beside the master
    weights and Adam's moments, 4 bytes a parameter of its shard more optimizer state: DeepSpeed's
    mixed-precision optimizers make it at each step (``deepspeed/runtime/zero/stage_1_and_2.py``
    ``step``: the partition's 16-bit gradients flattened ``.to()`` the fp32 partition's type and
    set as its ``.grad``, dropped after ``optimizer.step()``; ZeRO-3 and the fp16 optimizer
    alike), and PyTorch's caching allocator keeps the block reserved from one step to the next,
    so a device's use holds it throughout (BigScience's pre-BLOOM sweeps on Jean Zay: their
    first-node peaks 4.2% median error with it, 6.3% without, tests/data/validation/README.md,
    "BigScience's BLOOM topology sweeps"). Counted with master weights and 16-bit gradients
    (``grad_bytes 2``); DeepSpeed's BF16_Optimizer, which accumulates in fp32, steps on its
    buffer (``grad_copy``). None: off, except in a ``framework: deepspeed`` study
    (:func:`search_spaces.frameworks.fp32_grad_partition`)."""
    bytes_per_param_optimizer: int = 12
    """Mixed-precision Adam: fp32 master weights, momentum and variance (4 + 4 + 4)."""
    master_weights: bool = True
    """The optimizer steps an fp32 master copy of the 16-bit weights (mixed precision,
    Micikevicius et al. 2018). False: the model is cast to its 16-bit type and trained in it
    ("pure" bf16), and Adam's momentum and variance take the weights' type, as
    ``torch.optim.AdamW`` makes them (``zeros_like`` the parameter): 2 + 2 bytes a parameter,
    not ``bytes_per_param_optimizer``, and PyTorch FSDP shards the 16-bit parameter, not an
    fp32 one (:func:`simcore.megatron.stack.uses_fp32_shards`). KempnerForge trains so
    (KempnerInstitute/KempnerForge@5666d0d ``scripts/train.py``: ``model.to(dtype=
    tc.param_dtype)`` before ``fully_shard``)."""
    fsdp_no_sync: bool = False
    """ZeRO-3 (FSDP) accumulates the micro-batches' gradients unsharded and reduce-scatters them
    once, in the last micro-batch's backward: FSDP1's ``no_sync()``, FSDP2's
    ``set_requires_gradient_sync(False)`` on all micro-batches but the last, as KempnerForge
    runs its gradient accumulation (KempnerInstitute/KempnerForge@5666d0d
    ``kempnerforge/training/grad.py`` ``maybe_no_sync``). Each device then keeps its layers'
    whole gradient (over tp, not over dp) through the step, in the reduction's type
    (``bytes_per_param_grads``: FSDP2 upcasts the accumulated gradient to its ``reduce_dtype``,
    ``torch/distributed/fsdp/_fully_shard/_fsdp_param.py`` ``to_accumulated_grad_if_needed``), and
    reduce-scatters a layer's gradient once a step, not once a micro-batch. The shard is not
    held beside it at the peak: the last micro-batch's backward frees each layer's whole
    gradient as it makes its shard (``_fsdp_collectives.py`` ``foreach_reduce``:
    ``unsharded_grads.clear()`` after the copy-in), and the step's ``zero_grad`` frees the
    shards before the next step's micro-batches. False: each
    micro-batch's backward reduce-scatters its gradients, as torchtitan and llm-foundry run
    FSDP. Plans with one micro-batch a step, or another ZeRO stage, are the same either way."""
    pipeline_no_sync: bool | None = None
    """Under a pipeline (pp > 1), ZeRO-3 (FSDP) runs as PyTorch's pipeline stages run FSDP2:
    every micro-batch's backward but the last skips the gradient sync and keeps the weights it
    gathered (pytorch/pytorch v2.10.0 ``torch/distributed/pipelining/stage.py``
    ``backward_maybe_with_nosync``: ``set_requires_gradient_sync(False)``,
    ``set_reshard_after_backward(False)``), so each device holds its stage's whole gradient,
    in the reduction's type, as :attr:`fsdp_no_sync` does, and its stage's whole 16-bit
    weights, and reduce-scatters once a step. torchtitan's pipelines run so (a
    ``framework: torchtitan`` study sets it); None or False: FSDP under a pipeline as at pp 1.
    """
    swiglu_fusion: bool = True
    """A SwiGLU MLP runs its gate's SiLU and the product in one fused kernel that saves only its
    input (the gate and up projections' output) for the backward, as Megatron-LM's
    ``--bias-swiglu-fusion`` (its default) does: 6 bytes an FFN element a token with FC2's
    input. False: PyTorch's separate ``silu`` and multiply (torchtitan's and Hugging Face's
    Llama, nanotron's ``GLUActivation``, Megatron-DeepSpeed's ``swiglu``), whose autograd keeps
    the SiLU's output too (8 bytes) and which run two element-wise kernels, not one. Models
    without SwiGLU are the same either way."""
    fused_norm: bool = True
    """Each RMSNorm or LayerNorm runs as one kernel (Megatron-LM's and Apex's fused layer norm,
    Transformer Engine's, the flash-attention repository's ``rms_norm``) that reads its input
    and writes its output. False: PyTorch's element-wise ops, as Aleph Alpha's Scaling writes its
    RMSNorm (Aleph-Alpha/scaling@737f855 ``src/scaling/core/nn/norm/rms_norm.py``: ``x *
    torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)``, cast through fp32 and back, times the
    weight): eight kernels that move 13 times the input's bytes, not 2 (the square, the mean,
    the epsilon and the reciprocal root, the product, the two casts, the weight), each with its
    backward, and the normalised tensor kept for the weight's gradient besides the input."""
    rope_fusion: bool = True
    """Rotary position embedding runs as one fused kernel that reads Q and K and writes them
    rotated (Transformer Engine's ``fused_apply_rotary_pos_emb``, Megatron-LM's default, which
    ``--no-rope-fusion`` turns off; the flash-attention repository's rotary kernel;
    torch.compile's generated one). False: PyTorch's element-wise ops, as eager code writes it:
    ``x * cos + rotate_half(x) * sin`` (Megatron-LM's ``--no-rope-fusion`` path
    ``_rotate_half``, Megatron-DeepSpeed, Hugging Face's Llama, Aleph Alpha's Scaling
    ``RotaryEmbedding``) or through complex numbers (``x.float()``, a complex product, the cast
    back: torchtitan's and Meta's Llama ``apply_rotary_emb``, Scaling's
    ``RotaryEmbeddingComplex``): five kernels moving 10 times Q's and K's bytes, not 2
    (:data:`simcore.megatron.kernels.UNFUSED_ROPE`), each with its backward, which the host
    issues in one inventory kernel's time (small aten ops, not a module's Python around a
    kernel). Nothing more is kept for the backward. Models without rotary embeddings are the
    same either way."""
    vocab_parallel_embedding: bool = True
    """The token embedding is split over tp, each rank holding V / tp rows, and its output
    all-reduced (reduce-scattered with sequence parallelism), as Megatron-LM's
    ``VocabParallelEmbedding``, Megatron-DeepSpeed's and torchtitan's (``RowwiseParallel``) do.
    False: each tp rank keeps the whole table (its weights, gradients and optimizer state,
    sharded only over dp) and looks its tokens up locally, with no collective, as KempnerForge
    does (KempnerInstitute/KempnerForge@5666d0d ``kempnerforge/distributed/tensor_parallel.py``:
    "Token embedding: Replicated"). Plans with tp 1 are the same either way."""
    bytes_per_activation: int = 2
    fp8_attention: bool = False
    """Transformer Engine's fused attention runs in FP8 too (``fp8_dot_product_attention`` of
    Megatron-Core's TransformerConfig, which Megatron-Bridge and NeMo recipes set and MLPerf's
    2025 NVIDIA submissions run), in plans whose linear layers are quantised (``precision``
    fp8, mxfp8 or nvfp4) and that run TE's fused attention: the kernel at the device's
    :attr:`DeviceSpec.fp8_attention_speedup` over its 16-bit time, Q, K and V kept for the
    backward in 1 byte. Plans in bf16 are the same either way. Megatron-LM's command line has
    no flag for it (its arguments leave the field out)."""
    launch_blocking: bool = False
    """The run sets ``CUDA_LAUNCH_BLOCKING=1`` (a debugging switch some clusters' scripts leave
    on): each kernel launch waits for the kernel, so the host's time per kernel adds to the
    step (:data:`simcore.megatron.kernels.BLOCKING_HOST_S`) instead of hiding under the GPU's
    work. False: the host runs ahead of the GPU."""
    cuda_graphs: bool = False
    """The layers run as captured CUDA graphs (Megatron-LM's ``--cuda-graph-impl`` /
    ``--enable-cuda-graph``, NeMo's and MLPerf's ``CUDA_GRAPH``): the host launches a layer's
    kernels as one graph, so its time per kernel (:attr:`DeviceSpec.host_kernel_s`) no longer
    bounds a layer. False: eager execution, each kernel issued by the host."""
    overlap_grad_reduce: bool = True
    """Data-parallel gradient reduction runs in buckets during the last backward (Megatron-LM's
    ``--overlap-grad-reduce``); False waits for it after the pipeline flush."""
    tp_comm_overlap: bool = True
    """With Transformer Engine and sequence parallelism, the tp all-gathers and reduce-scatters
    run beside the linear layers' GEMMs in TE's userbuffers (``--tp-comm-overlap``, which NeMo's
    and Megatron-Bridge's recipes set; :func:`simcore.megatron.stack.uses_tp_comm_overlap`).
    False: Megatron-LM's own default, the forward's collectives exposed and the backward's
    hidden only behind the weight-gradient GEMMs, as on the classic stack."""
    async_tp_allreduce: bool | None = None
    """The backward's tp collective (the input gradient's all-reduce, or with sequence
    parallelism its all-gather and reduce-scatter) runs beside the weight-gradient GEMM, as
    Megatron-LM's has since 2021-09 (``--async-tensor-model-parallel-allreduce``, f3e57f6fee;
    ``LinearWithGradAccumulationAndAsyncCommunication``) and Megatron-Core's and Transformer
    Engine's do. False: the stack reduces the gradient in the autograd function before or after
    the layer's two GEMMs (``copy_to_tensor_model_parallel_region``), waiting for the whole
    collective, as Megatron-LM before that did, Megatron-DeepSpeed does under DeepSpeed
    (deepspeedai/Megatron-DeepSpeed@4efb479d ``megatron/arguments.py``: "DeepSpeed seems to be
    incompatible with async_tensor_model_parallel_allreduce thus temporarily disabling it";
    BigScience's 2021-22 fork, ``megatron/mpu/layers.py``, had no asynchronous one) and Aleph
    Alpha's Scaling (``src/scaling/core/nn/linear/utils.py``) do. None: on, but off in a
    ``framework: deepspeed`` study (:func:`search_spaces.frameworks.async_tp_allreduce`). A run
    with ``launch_blocking`` overlaps nothing either way
    (:func:`simcore.megatron.stack.uses_async_tp_allreduce`)."""
    flash_attention: bool | None = None
    """Fused (flash) attention: the attention core is one kernel that never stores the s x s
    scores (Dao et al. 2022). None takes the default: on for the llama family and on devices
    whose entry says so (H100-era parts), off otherwise (see :func:`uses_flash_attention`)."""
    transformer_engine: bool | None = None
    """Megatron-Core with Transformer Engine, as NeMo and Megatron-Bridge train (2024 on): the
    attention core in TE's fused (cuDNN) kernel at the device's fused_attention_efficiency, and
    with sequence parallelism the tp all-gathers and reduce-scatters overlapped with the linear
    layers' GEMMs (``--tp-comm-overlap``, TE's userbuffers). None takes the device's default
    (H100-era parts: on) for plans with ZeRO 0-1 and the classic stack for ZeRO-2/3 plans
    (:func:`simcore.megatron.stack.uses_transformer_engine`); False: the classic stack the
    devices were fit on (llm-foundry's PyTorch FSDP with FlashAttention-2, Megatron-LM
    2020-23, Megatron-DeepSpeed)."""
    cp_comm: CpComm | None = None
    """How context parallelism exchanges K and V (:class:`CpComm`); None is ``p2p``,
    Megatron-LM's default (a ``framework: deepspeed`` study sets ``a2a``,
    :func:`search_spaces.frameworks.cp_comm`). Plans with cp 1 are the same either way."""
    cross_entropy: CrossEntropy | None = None
    """How the loss holds the logits (:class:`CrossEntropy`): None is Megatron-LM's fused
    cross-entropy; torchtitan studies set ``pytorch`` (``search_spaces.frameworks``)."""
    selective_recompute: SelectiveRecompute | None = None
    """What a plan's selective recompute drops (:class:`SelectiveRecompute`): None is
    Megatron-LM's attention core; torchtitan studies set ``op``, its per-op checkpointing
    (``search_spaces.frameworks``)."""
    recompute_modules: tuple[RecomputeModule, ...] | None = None
    """What a plan's selective recompute runs again, as Megatron-LM's ``--recompute-modules``
    names it (:class:`RecomputeModule`); None: ``selective_recompute``'s choice (Megatron-LM's
    default is ``core_attn``). Plans with recompute none or full ignore it."""
    recompute_early_stop: bool | None = None
    """Under full recompute, each layer's recompute stops at the last tensor its backward
    saved, as PyTorch's non-reentrant activation checkpointing does by default ("Non-reentrant
    checkpoint stops recomputation as soon as all needed intermediate activations have been
    recomputed", ``torch.utils.checkpoint``, ``set_checkpoint_early_stop``): the layer's last
    linear layer (FC2), its tp collective and the residual add are not run again. torchtitan
    (``checkpoint_wrapper``, not re-entrant) and llm-foundry (which forces
    ``activation_checkpointing_reentrant`` false) run it; Megatron-LM's and DeepSpeed's own
    checkpointing re-run the whole layer ("Reentrant checkpoint always recomputes function in
    its entirety"). None takes the stack's default: on for plans on the PyTorch FSDP stack
    (ZeRO-2/3 without Transformer Engine, as
    :func:`simcore.megatron.stack.uses_transformer_engine` reads them), off otherwise
    (:func:`simcore.megatron.stack.uses_recompute_early_stop`). An MoE layer's recompute is
    priced whole either way."""

    @property
    def cp_exchange(self) -> CpComm:
        """:attr:`cp_comm` with its default resolved (``p2p``)."""
        return self.cp_comm or CpComm.P2P

    def __post_init__(self) -> None:
        _positive("global_batch", self.global_batch)
        _positive("seq_len", self.seq_len)
        modules = self.recompute_modules
        if modules is not None:
            if (not isinstance(modules, tuple) or not modules
                    or not all(isinstance(m, RecomputeModule) for m in modules)):
                raise ValueError(f"recompute_modules must name one or more of"
                                 f" {', '.join(m.value for m in RecomputeModule)}, got {modules!r}")
            if self.selective_recompute is SelectiveRecompute.OP:
                raise ValueError("recompute_modules are Megatron-LM's selective recompute, but"
                                 " selective_recompute is op (torchtitan's); give one of them")
        for name in (
            "bytes_per_param_weights",
            "bytes_per_param_grads",
            "bytes_per_param_optimizer",
            "bytes_per_activation",
        ):
            _positive(name, getattr(self, name))
        if self.bytes_per_param_grads not in GRAD_BYTES:
            raise ValueError(f"grad_bytes must be 2 (16-bit gradients) or 4 (fp32 gradients, as"
                             f" Megatron-LM accumulates them in bf16 training), not"
                             f" {self.bytes_per_param_grads}")
        if self.grad_reduce_bytes is not None and self.grad_reduce_bytes not in GRAD_BYTES:
            raise ValueError(f"grad_reduce_bytes must be 2 (16-bit gradients on the wire) or 4"
                             f" (cast to fp32 for the reduction), not {self.grad_reduce_bytes}")
        if not self.master_weights and self.bytes_per_param_optimizer != 12:
            raise ValueError("master_weights false sets the optimizer state (Adam's two moments in"
                             " the weights' type); give optimizer_bytes or master_weights,"
                             " not both")

    @property
    def reduced_grad_bytes(self) -> int:
        """Bytes a gradient element sends in the data-parallel reduction
        (:attr:`grad_reduce_bytes`, else the buffer's)."""
        return self.grad_reduce_bytes or self.bytes_per_param_grads

    @property
    def optimizer_bytes(self) -> int:
        """Bytes of optimizer state a parameter: ``bytes_per_param_optimizer`` with master
        weights (and the fp32 gradient partition's 4, :attr:`fp32_grad_partition`), else Adam's
        two moments in the weights' type."""
        if self.master_weights:
            partition = 4 if self.fp32_grad_partition and self.bytes_per_param_grads == 2 else 0
            return self.bytes_per_param_optimizer + partition
        return 2 * self.bytes_per_param_weights


TRAINING_CHOICES: dict[str, type[_Named]] = {"selective_recompute": SelectiveRecompute,
                                             "cross_entropy": CrossEntropy,
                                             "cp_comm": CpComm}
"""The :class:`TrainingSpec` fields that name one of a few choices (None: the default)."""
