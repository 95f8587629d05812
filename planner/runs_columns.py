"""The columns of a runs CSV (:mod:`planner.runs_csv` reads the file, :mod:`planner.runs_row`
each row): their names and what each means. A header row, any order; names as below,
case-insensitive:

- required: ``model`` and ``system`` (a catalog name or a YAML path; relative paths resolve
  against the CSV's folder), ``global_batch``, ``seq_len``, ``dp``, ``tp``, ``pp``,
  ``micro_batch``, and at least one of ``step_time_s`` and ``peak_memory_gb`` (decimal GB);
  the step time may be given as a throughput instead, as published tables print it:
  ``tokens_per_s`` (the job's) or ``tokens_per_s_per_gpu`` (one device's; NeMo's and
  torchtitan's tables), each read as ``global_batch x seq_len`` tokens a step over the plan's
  devices; where a row fills more than one, they must agree within 1%; a plan that was tried
  and ran out of memory says ``out_of_memory`` true instead, with neither filled (what a team's
  trial runs and published sweeps record of the plans that did not fit);
- optional: ``sp`` (context parallel, 1; ``cp``, Megatron-LM's name, is read as it),
  ``gpus`` (the run's device count: checked against the plan's dp x tp x pp x sp and the
  system's), ``zero`` (0-3 or ``fsdp``; 0), ``recompute`` (none,
  selective, full; none), ``recompute_layers`` (with ``recompute`` full: the layers of each
  pipeline stage, or model chunk, that recompute, Megatron-LM's ``--recompute-method block
  --recompute-num-layers``; empty or 0: all), ``offload_layers`` (with pp 1 and no recompute: the
  layers that offload their activations to host memory, Megatron-Core's
  ``--cpu-offloading-num-layers``; empty: none), ``sequence_parallel`` (true/false; true),
  ``schedule`` (1f1b, gpipe,
  interleaved, zb-h1, zbv; interleaved when ``v`` > 1, else 1f1b), ``v`` (1; 2 for zbv;
  ``vp``, NeMo's name for the virtual stages, is read as it),
  ``placement`` (axes innermost first, e.g. ``tp-sp-dp-pp``; commas need the field quoted),
  ``precision`` (bf16, fp8, mxfp8, nvfp4; bf16), ``first_stage_layers`` and
  ``last_stage_layers`` (uneven pipeline stages, as Megatron-LM's
  ``--decoder-first/last-pipeline-num-layers``; empty: an equal share), ``pipeline_layout``
  (Megatron-LM's ``--pipeline-model-parallel-layout`` string, e.g.
  ``Et*2|(t*2|)*34,t*3|(t*2|)*3,tL``; ``v`` defaults to its stages / pp),
  ``shard_group`` (ranks of a ZeRO shard group: HSDP with zero 3, a distributed optimizer
  sharded within groups with zero 1; empty: all of dp x sp),
  ``ep`` and ``etp`` (expert and expert-tensor parallelism of an MoE model; 1 and tp),
  ``ep_overlap`` and ``ep_dedup`` (true/false; false), ``flash_attention`` (true/false; the
  model's and device's default), ``transformer_engine`` (true/false: Megatron-Core with
  Transformer Engine, or the classic stack; the device's default for the plan's ZeRO stage),
  ``recompute_early_stop`` (true/false: full recompute stops at each layer's last saved
  tensor, PyTorch's non-reentrant checkpointing; the stack's default), ``selective_recompute``
  (``attention``, Megatron-LM's selective recompute of the attention core, or ``op``,
  torchtitan's per-op checkpointing; ``attention``), ``recompute_modules`` (what a selective
  recompute runs again, Megatron-LM's ``--recompute-modules`` names separated by spaces or
  ``+``: ``core_attn``, ``mla_up_proj``, ``mlp``), ``cross_entropy`` (``fused``,
  the fp32 logits, 4 bytes a logit; ``megatron``, Megatron-LM's unfused loss on an fp32 copy
  of the 16-bit logits, 6; ``megatron_fused``, its ``--cross-entropy-loss-fusion``, 10;
  ``pytorch``, torchtitan's on an fp32 copy of the logits: 12 bytes a logit at its peak;
  ``chunked``, torchtitan main's, the same on an eighth of the tokens at a time;
  ``megatron_deepspeed``, Megatron-DeepSpeed's, 10; ``replicated``, KempnerForge's on the gathered
  16-bit logits; ``nanotron``,
  nanotron's fp32 logits and their shifted copy, 8 bytes; ``fused``), ``cp_comm`` (``p2p``,
  context parallelism's ring; ``all_gather``, K and V gathered whole, exposed; ``a2a``,
  DeepSpeed-Ulysses' all-to-alls; ``p2p``),
  ``overlap_grad_reduce``
  (true), ``grad_bytes`` (2), ``grad_reduce_bytes`` (bytes a gradient element sends in the
  data-parallel reduction: 4 where 16-bit gradients are cast to fp32 for it, as Aleph Alpha's
  Scaling does; ``grad_bytes``), ``grad_all_reduce`` (true/false: ZeRO-1 all-reduces the whole
  gradient before each rank steps its shard, as Scaling does, not a reduce-scatter; false),
  ``optimizer_bytes`` (the optimizer state's bytes a parameter with
  master weights: 12, Adam's fp32 master copy, momentum and variance; NeMo's Apex
  DistributedFusedAdam keeps 10 for a bf16 model, the fp32 master's 16-bit remainders, and
  with ``dtype: bf16`` 4, the moments alone, or 6 with FP8 parameters, a bf16 copy too),
  ``grad_copy`` (true/false: the 16-bit ``.grad`` kept beside the accumulation buffer, as
  DeepSpeed's BF16_Optimizer keeps it; false), ``main_grad_copy`` (true/false: the optimizer
  step's fp32 copy of 16-bit gradients, held after the backward, as Megatron-LM's optimizers
  make it; false, true with ``framework megatron`` and ``grad_bytes 2``),
  ``fp32_grad_partition`` (true/false: the optimizer keeps an fp32 copy of its shard's 16-bit
  gradients, 4 bytes a parameter of the shard, as DeepSpeed's mixed-precision optimizers do;
  false), ``launch_blocking``
  (true/false: the run set ``CUDA_LAUNCH_BLOCKING=1``; false), ``cuda_graphs`` (true/false:
  the layers ran as CUDA graphs, Megatron-LM's ``--cuda-graph-impl``; false),
  ``tp_comm_overlap`` (true/false: false where a Transformer Engine run with sequence
  parallelism did not set ``--tp-comm-overlap``,
  Megatron-LM's default, so its tp collectives are not hidden in TE's userbuffers; true),
  ``async_tp_allreduce`` (true/false: false where the stack reduces the backward's tp
  gradient after the layer's GEMMs, not beside the weight-gradient GEMM, as Megatron-LM before
  2021-09, Megatron-DeepSpeed under DeepSpeed and Aleph Alpha's Scaling do; true, false with
  ``framework deepspeed``), ``fused_norm`` (true/false: false where each RMSNorm ran as
  PyTorch's element-wise ops, not one fused kernel; true), ``rope_fusion`` (true/false: false
  where the rotary embedding ran as PyTorch's element-wise ops, as eager torchtitan, Hugging
  Face, Megatron-DeepSpeed and Aleph Alpha's Scaling run it; true),
  ``master_weights`` (true/false: false
  for pure 16-bit training, Adam's moments in bf16 and no fp32 copy; true), ``fsdp_no_sync``
  (true/false: ZeRO-3 accumulates gradients unsharded and reduce-scatters once a step, FSDP's
  ``no_sync``; false),
  ``swiglu_fusion`` (true/false: false for PyTorch's separate SiLU and multiply, which keep
  the SiLU's output too, as torchtitan, nanotron and Hugging Face run a SwiGLU MLP; true),
  ``vocab_parallel_embedding`` (true/false: false where every tp rank keeps the whole token
  embedding, as KempnerForge does; true), ``fp8_attention`` (true/false: Transformer Engine's
  fused attention in FP8 too in a quantised plan, ``fp8_dot_product_attention``; false),
  ``hbm_gb`` (the memory of the part the run had, where it is not the catalog device's: what
  the estimate's fit is judged against), ``memory_measured`` (what ``peak_memory_gb`` counts:
  ``device``, the whole device's use as nvidia-smi shows it, or ``allocated``, PyTorch's
  ``max_memory_allocated`` as Megatron-LM's memory report prints it, which leaves out the CUDA
  context, NCCL's buffers and the caching allocator's slack: the device's ``memory_overhead_gb``
  allowance; ``device``), ``memory_stage`` (the pipeline stage ``peak_memory_gb`` is of:
  ``peak``, the stage the estimate finds highest, as a report of every rank's gives; ``first``
  or ``last``, a report of one rank's, as Megatron-LM's TensorBoard memory is the last rank's;
  ``peak``), ``framework`` (``megatron``, ``deepspeed``, ``torchtitan`` or ``any``:
  the cells left empty take what a study with that framework runs, its stack, loss, recompute
  and context parallelism, and a plan the framework cannot run as written is left out with the
  reason, :func:`search_spaces.frameworks.framework_training`; ``any``), ``release`` (the
  software release the run was measured on; plans of different releases are not compared),
  ``name``; ``source`` and ``notes`` are kept for people and not read;
- on a cluster that mixes device types: ``stages``, the plan as ``planner mixed`` prints it
  (``v100:tp1dp4x3[5,7,6] > t4:tp1dp4x1[6] m8 none``: :mod:`planner.mixed_label`), with
  ``system`` a system of node groups; the row leaves the cells of a one-device-type plan empty
  (:data:`planner.runs_mixed.PLAN_CELLS`), and a file whose every row has stages needs no
  ``dp``, ``tp``, ``pp`` or ``micro_batch`` column; its ``peak_memory_gb`` (``memory_stage``
  peak) is of the stage that holds the most, whichever part it is on.
"""

__all__ = ["AGREE", "ALIASES", "MEASURED", "OPTIONAL", "PLAN", "REQUIRED"]

REQUIRED = ("model", "system", "global_batch", "seq_len", "dp", "tp", "pp", "micro_batch")
PLAN = ("dp", "tp", "pp", "micro_batch")
"""Of the required columns, those a file of mixed-cluster rows (``stages``) goes without."""
MEASURED = ("step_time_s", "peak_memory_gb", "tokens_per_s", "tokens_per_s_per_gpu",
            "out_of_memory")
OPTIONAL = ("sp", "gpus", "zero", "recompute", "recompute_layers", "offload_layers",
            "sequence_parallel", "schedule", "v",
            "placement", "precision", "first_stage_layers", "last_stage_layers", "pipeline_layout",
            "shard_group", "ep", "etp", "ep_overlap", "ep_dedup", "flash_attention",
            "transformer_engine", "recompute_early_stop", "selective_recompute",
            "cross_entropy", "cp_comm", "recompute_modules", "overlap_grad_reduce", "grad_bytes",
            "grad_reduce_bytes", "grad_all_reduce",
            "optimizer_bytes",
            "grad_copy", "main_grad_copy", "fp32_grad_partition", "launch_blocking", "cuda_graphs",
            "tp_comm_overlap", "async_tp_allreduce", "fused_norm", "rope_fusion",
            "master_weights", "fsdp_no_sync",
            "swiglu_fusion", "vocab_parallel_embedding", "fp8_attention", "hbm_gb",
            "memory_measured", "memory_stage", "framework", "release", "name", "source",
            "notes", "stages")
"""``source`` and ``notes`` are for people (where a figure comes from); they are not read."""
ALIASES = {"cp": "sp", "vp": "v"}
"""Other names of a column, as Megatron-LM and NeMo's tables call the degree: read as it."""
AGREE = 0.01
"""How far apart a row's step time and throughputs may be (their published rounding)."""
