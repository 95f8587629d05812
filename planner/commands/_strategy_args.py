"""The plan on the command line: ``planner estimate``'s strategy flags (``--dp``, ``--tp``, ...,
``--placement``, ``--pipeline-layout``) and the training options beside them (recompute,
loss, context-parallel exchange, ...), and the strategy and step model they name."""

from __future__ import annotations

import argparse

from planner.commands._base import positive_int
from planner.errors import PlannerUsageError
from planner.fields import placement_axes
from simcore import CONVENTIONS_OF_FAMILY, convention_of
from simcore.layout import layout_chunks, parse_layout
from simcore.specs import (
    Axis,
    Convention,
    CpComm,
    CrossEntropy,
    ModelSpec,
    Precision,
    Recompute,
    RecomputeModule,
    Schedule,
    SelectiveRecompute,
    Strategy,
    ZeroStage,
)

__all__ = ["CONVENTIONS_OF_FAMILY", "DEGREE_FLAGS", "add_strategy_arguments", "check_degrees",
           "convention_for", "strategy_from_args"]


def _chunks(args: argparse.Namespace, layout: tuple[int, ...] | None = None) -> int:
    """``--v``, or its default: 2 for zbv (two chunks per rank), the layout's stages per rank,
    else 1."""
    if args.v is not None:
        return int(args.v)
    from_layout = None if layout is None else layout_chunks(layout, args.pp)
    if from_layout is not None:
        return from_layout
    return 2 if args.schedule == Schedule.ZBV.value else 1


def _layout(args: argparse.Namespace) -> tuple[int, ...] | None:
    if getattr(args, "pipeline_layout", None) is None:
        return None
    try:
        return parse_layout(args.pipeline_layout)
    except ValueError as e:
        raise PlannerUsageError(f"--pipeline-layout: {e}") from None


def _placement(text: str) -> tuple[Axis, ...]:
    problem = PlannerUsageError(
        f"--placement: {text!r} must list dp, tp, pp and sp once each, innermost first,"
        " e.g. tp,sp,dp,pp"
    )
    axes = placement_axes(text.split(","))
    if axes is None:
        raise problem
    return axes




def convention_for(model: ModelSpec, name: str | None) -> Convention:
    """``--convention`` if the model can use it, else the model family's."""
    if name is None:
        return convention_of(model)
    convention = Convention(name)
    allowed = CONVENTIONS_OF_FAMILY[model.family]
    if convention not in allowed:
        raise PlannerUsageError(
            f"--convention {name}: model {model.name} ({model.family.value} family) cannot use"
            f" it; use {' or '.join(c.value for c in allowed)}")
    return convention


def add_strategy_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("strategy")
    g.add_argument("--dp", type=int, help="data-parallel degree (default: what the others leave)")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    g.add_argument("--pp", type=int, default=1, help="pipeline stages (default 1)")
    g.add_argument("--sp", type=int, default=1, help="context (sequence) parallel degree")
    g.add_argument("--no-sequence-parallel", action="store_true",
                   help="turn Megatron sequence parallelism inside the tp group off")
    g.add_argument("--zero", type=int, choices=[z.value for z in ZeroStage], default=0,
                   help="0 none, 1 distributed optimizer / ZeRO-1, 2 ZeRO-2, 3 ZeRO-3 / FSDP")
    g.add_argument("--fsdp", action="store_true", help="same as --zero 3")
    g.add_argument("--recompute", choices=[r.value for r in Recompute], default="none")
    g.add_argument("--offload-layers", type=int, metavar="N", default=None,
                   help="the first N layers copy their activations to host memory and back"
                   " (Megatron-Core's --cpu-offloading --cpu-offloading-num-layers N; needs"
                   " --pp 1, no recompute and the device's host link; 0 or default: none)")
    g.add_argument("--recompute-layers", type=int, metavar="N", default=None,
                   help="with --recompute full: recompute only the first N layers of each"
                   " pipeline stage (of each model chunk with --v > 1), Megatron-LM's"
                   " --recompute-method block --recompute-num-layers N; the rest keep their"
                   " activations (default: every layer)")
    g.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch")
    g.add_argument("--schedule", choices=[s.value for s in Schedule], default="1f1b")
    g.add_argument("--v", type=int, default=None,
                   help="model chunks per device (interleaved; default 1, 2 for zbv)")
    g.add_argument("--placement", default="tp,sp,dp,pp",
                   help="axes onto network dimensions, innermost first (default tp,sp,dp,pp)")
    g.add_argument("--precision", choices=[p.value for p in Precision], default="bf16",
                   help="bf16 (default), fp8 (per-tensor scaling), mxfp8 (a scale per 32"
                        " elements) or nvfp4 (4-bit, a scale per 16; both Blackwell) GEMMs of the"
                        " linear layers (Transformer Engine)")
    g.add_argument("--first-stage-layers", type=int, metavar="N",
                   help="layers on the first pipeline stage (Megatron-LM's"
                   " --decoder-first-pipeline-num-layers; default: an equal share)")
    g.add_argument("--last-stage-layers", type=int, metavar="N",
                   help="layers on the last pipeline stage (default: an equal share)")
    g.add_argument("--pipeline-layout", metavar="TEXT",
                   help="every virtual stage's layers as Megatron-LM's"
                   " --pipeline-model-parallel-layout writes them, e.g."
                   " 'Et*2|(t*2|)*34,t*3|(t*2|)*3,tL' (E embedding, t layer, L loss);"
                   " --v defaults to its stages / --pp")
    g.add_argument("--ep", type=int, default=1,
                   help="expert-parallel degree of an MoE model (carved out of tp*sp*dp)")
    g.add_argument("--etp", type=int, help="expert tensor-parallel degree (default: tp)")
    g.add_argument("--ep-overlap", action="store_true",
                   help="the expert all-to-alls beside another micro-batch's compute"
                   " (Megatron-LM's --overlap-moe-expert-parallel-comm)")
    g.add_argument("--ep-dedup", action="store_true",
                   help="the expert all-to-alls send a token once per remote node that holds"
                   " its experts (DeepEP / HybridEP: Megatron-LM's flex dispatcher)")
    g.add_argument("--shard-group", type=int, metavar="N",
                   help="ranks of a ZeRO shard group, replicated across the rest of dp x sp:"
                   " HSDP with --zero 3, a distributed optimizer sharded within groups with"
                   " --zero 1 (default: shard over all of them)")
    t = parser.add_argument_group("training")
    t.add_argument("--global-batch", type=positive_int, help="sequences per step (required)")
    t.add_argument("--seq-len", type=positive_int, help="sequence length (default: the model's)")
    t.add_argument("--flash-attention", action=argparse.BooleanOptionalAction, default=None,
                   help="fused attention that never stores the s x s scores (default: on for"
                   " the llama family and on devices whose entry says so, e.g. H100)")
    t.add_argument("--transformer-engine", action=argparse.BooleanOptionalAction, default=None,
                   help="Megatron-Core with Transformer Engine: fused attention, tp"
                   " communication overlapped with the GEMMs (default: the device's; on for"
                   " H100-era parts with ZeRO 0-1, off with ZeRO 2-3: PyTorch FSDP)")
    t.add_argument("--recompute-early-stop", action=argparse.BooleanOptionalAction,
                   default=None,
                   help="full recompute stops at each layer's last saved tensor, as PyTorch's"
                   " non-reentrant checkpointing does (FC2 and the residual add not re-run;"
                   " default: on for ZeRO 2-3 plans without Transformer Engine)")
    t.add_argument("--selective-recompute", choices=[m.value for m in SelectiveRecompute],
                   default=None,
                   help="what --recompute selective recomputes: attention (Megatron-LM's:"
                   " the attention core; the default) or op (torchtitan's per-op"
                   " checkpointing: every other matmul and all the element-wise work)")
    t.add_argument("--cross-entropy", choices=[m.value for m in CrossEntropy], default=None,
                   help="how the loss holds the logits: fused (an in-place fused kernel's:"
                   " fp32 logits, 4 bytes each; the default), megatron_fused (Megatron-LM's"
                   " --cross-entropy-loss-fusion: 10 bytes each; a megatron study's default),"
                   " megatron (Megatron-LM's unfused loss, 6), pytorch (torchtitan's:"
                   " cross_entropy on an fp32 copy, 12 bytes each at its peak), chunked"
                   " (torchtitan main's: the same on an eighth of the tokens at a time),"
                   " megatron_deepspeed"
                   " (Megatron-DeepSpeed's: the 16-bit logits, an fp32 copy and a shifted one,"
                   " 10 bytes each), nanotron (fp32 logits and a shifted"
                   " copy, 8 bytes each) or replicated (the 16-bit logits gathered to every tp"
                   " rank and held by the loop, 8 bytes each of the whole vocabulary)")
    t.add_argument("--cp-comm", choices=[m.value for m in CpComm], default=None,
                   help="how context parallelism exchanges K and V (Megatron-LM's"
                   " --cp-comm-type): p2p (a ring: each chunk sent on while the one in hand is"
                   " attended to, the outputs merged step by step; the default), all_gather"
                   " (gathered whole before the attention, exposed, as the Llama 3 paper's) or"
                   " a2a (Q, K, V and the output all-to-all'd, each rank attending the whole"
                   " sequence with cp-th of the heads: DeepSpeed-Ulysses)")
    t.add_argument("--grad-bytes", type=int, default=None,
                   help="bytes per gradient (2: bf16 accumulation, the default; 4: fp32 main"
                   " gradients as Megatron-LM keeps them, and torchtitan's)")
    t.add_argument("--grad-reduce-bytes", type=int, default=None, choices=(2, 4),
                   help="bytes a gradient element sends in the data-parallel reduction (default:"
                   " --grad-bytes; 4: 16-bit gradients cast to fp32 for it, as Aleph Alpha's"
                   " Scaling does)")
    t.add_argument("--grad-all-reduce", action="store_true",
                   help="ZeRO-1 all-reduces the whole gradient, then each rank steps its shard"
                   " and the weights are all-gathered (Aleph Alpha's Scaling), not a"
                   " reduce-scatter")
    t.add_argument("--optimizer-bytes", type=positive_int, default=12,
                   help="optimizer state bytes per parameter with master weights (12: Adam's"
                   " fp32 master copy, momentum and variance, the default; 4: NeMo's Apex"
                   " DistributedFusedAdam with dtype bf16 on a bf16 model, the moments alone)")
    t.add_argument("--recompute-modules", nargs="+", metavar="MODULE", default=None,
                   choices=[m.value for m in RecomputeModule],
                   help="what --recompute selective runs again, as Megatron-LM's"
                   " --recompute-modules names it (default: the attention core)")
    t.add_argument("--grad-copy", action=argparse.BooleanOptionalAction, default=None,
                   help="each parameter's 16-bit .grad stays beside the accumulation buffer,"
                   " as DeepSpeed's BF16_Optimizer keeps it (bf16 with fp32 accumulation,"
                   " ZeRO 0-1; default: off)")
    t.add_argument("--main-grad-copy", action=argparse.BooleanOptionalAction, default=None,
                   help="the optimizer step copies 16-bit gradients to fp32 for the master"
                   " weights after the backward, as Megatron-LM's optimizers do with"
                   " --grad-bytes 2 (default: off; on with --framework megatron)")
    t.add_argument("--fp32-grad-partition", action=argparse.BooleanOptionalAction, default=None,
                   help="the optimizer keeps an fp32 copy of its shard's 16-bit gradients beside"
                   " the master weights (4 bytes a parameter of the shard), as DeepSpeed's"
                   " mixed-precision optimizers do (default: off; on with --framework deepspeed"
                   " and --grad-bytes 2)")
    t.add_argument("--fp8-attention", action="store_true",
                   help="Transformer Engine's fused attention in FP8 too, in a quantised plan"
                   " (Megatron-Core's fp8_dot_product_attention), at the device's measured"
                   " speed-up over 16-bit by sequence length")
    t.add_argument("--launch-blocking", action="store_true",
                   help="the run sets CUDA_LAUNCH_BLOCKING=1: every kernel waits for the host's"
                   " time (200 us a kernel, fit on Jean Zay's runs)")
    t.add_argument("--cuda-graphs", action="store_true",
                   help="the layers run as CUDA graphs (Megatron-LM's --cuda-graph-impl): the"
                   " host's time per kernel no longer bounds a small layer")
    t.add_argument("--no-tp-comm-overlap", dest="tp_comm_overlap", action="store_false",
                   help="Transformer Engine's tp all-gathers and reduce-scatters are not run"
                   " beside the GEMMs (Megatron-LM without --tp-comm-overlap, its default)")
    t.add_argument("--no-async-tp-allreduce", dest="async_tp_allreduce", action="store_const",
                   const=False, default=None,
                   help="the stack reduces the backward's tp gradient after the layer's GEMMs,"
                   " not beside the weight-gradient GEMM (Megatron-LM before 2021-09,"
                   " Megatron-DeepSpeed under DeepSpeed, which --framework deepspeed sets,"
                   " Aleph Alpha's Scaling)")
    t.add_argument("--no-fused-norm", dest="fused_norm", action="store_false",
                   help="each RMSNorm runs as PyTorch's element-wise ops (eight kernels), not"
                   " one fused kernel (Aleph Alpha's Scaling without the flash-attention"
                   " repository's rms_norm)")
    t.add_argument("--no-rope-fusion", dest="rope_fusion", action="store_false",
                   help="the rotary embedding runs as PyTorch's element-wise ops (five"
                   " kernels), not one fused kernel (eager torchtitan, Hugging Face,"
                   " Megatron-DeepSpeed, Megatron-LM's --no-rope-fusion)")
    t.add_argument("--no-master-weights", dest="master_weights", action="store_false",
                   help="pure 16-bit training: no fp32 master copy, Adam's moments in bf16"
                   " (4 bytes a parameter of optimizer state, not 12)")
    t.add_argument("--fsdp-no-sync", action="store_true",
                   help="ZeRO-3 accumulates the micro-batches' gradients unsharded and"
                   " reduce-scatters once a step (FSDP's no_sync)")
    t.add_argument("--no-swiglu-fusion", dest="swiglu_fusion", action="store_false",
                   help="a SwiGLU MLP runs PyTorch's separate silu and multiply (torchtitan,"
                   " nanotron, Hugging Face), keeping the SiLU's output too")
    t.add_argument("--no-vocab-parallel-embedding", dest="vocab_parallel_embedding",
                   action="store_false",
                   help="every tp rank keeps the whole token embedding (KempnerForge), not"
                   " V / tp of it")


DEGREE_FLAGS = ("dp", "tp", "pp", "sp", "micro_batch", "v", "first_stage_layers",
                "last_stage_layers", "shard_group", "ep", "etp", "recompute_layers")
"""Flags that take a degree or a count: each must be >= 1 when given."""


def check_degrees(args: argparse.Namespace) -> None:
    """One line for the first degree flag below 1, before anything divides by it; a count
    of offloaded layers below 0 (0 is none, as a study's ``space.offload_layers`` reads it)."""
    for name in DEGREE_FLAGS:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise PlannerUsageError(f"--{name.replace('_', '-')} must be >= 1, but got {value}")
    if args.offload_layers is not None and args.offload_layers < 0:
        raise PlannerUsageError(f"--offload-layers must be >= 0 (0: none), but got"
                                f" {args.offload_layers}")


def strategy_from_args(args: argparse.Namespace, devices: int) -> Strategy:
    check_degrees(args)
    dp = args.dp
    if dp is None:
        others = args.tp * args.pp * args.sp
        if others < 1 or devices % others:
            raise PlannerUsageError(
                f"--tp*--pp*--sp = {others} must divide the system's {devices} devices"
            )
        dp = devices // others
    layout = _layout(args)
    v = _chunks(args, layout)
    if args.schedule == Schedule.INTERLEAVED.value and v < 2:
        raise PlannerUsageError("--schedule interleaved needs model chunks --v > 1 a stage (e.g."
                                " --v 2); with one chunk it is 1f1b")
    try:
        return Strategy(
            dp=dp, tp=args.tp, pp=args.pp, sp=args.sp,
            sequence_parallel=not args.no_sequence_parallel,
            zero=ZeroStage.PARAMETERS if args.fsdp else ZeroStage(args.zero),
            recompute=Recompute(args.recompute), micro_batch=args.micro_batch,
            schedule=Schedule(args.schedule), v=v,
            placement=_placement(args.placement),
            precision=Precision(args.precision), first_stage_layers=args.first_stage_layers,
            last_stage_layers=args.last_stage_layers, shard_group=args.shard_group,
            ep=args.ep, etp=args.etp, ep_overlap=args.ep_overlap, ep_dedup=args.ep_dedup,
            layout=layout, recompute_layers=args.recompute_layers,
            offload_layers=args.offload_layers or None,
        )
    except ValueError as e:
        raise PlannerUsageError(f"strategy: {e}") from None
