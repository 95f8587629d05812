"""``planner estimate``: one plan's step time and memory, with every part."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields, replace
from pathlib import Path

from planner.catalog import load_catalog
from planner.commands._base import BaseCommand, hbm_gb, positive_int
from planner.errors import PlannerUsageError
from planner.fields import placement_axes
from planner.units import GB
from search_spaces.frameworks import ANY, FRAMEWORKS, framework_training
from simcore import convention_of, estimate, host_wait
from simcore.estimate import Estimate
from simcore.layout import format_layout, layout_chunks, parse_layout
from simcore.network import Congestion
from simcore.specs import (
    TRAINING_CHOICES,
    Axis,
    Convention,
    CpComm,
    CrossEntropy,
    Family,
    ModelSpec,
    Precision,
    Recompute,
    RecomputeModule,
    Schedule,
    SelectiveRecompute,
    Strategy,
    SystemSpec,
    TrainingSpec,
    ZeroStage,
)


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


_TRANSFORMER = (Convention.MEGATRON, Convention.STAGE)
CONVENTIONS_OF_FAMILY = {Family.GPT: _TRANSFORMER, Family.LLAMA: _TRANSFORMER,
                         Family.STAGE: _TRANSFORMER, Family.MLP: (Convention.MLP,)}
"""The conventions each model family can be estimated with: a transformer as Megatron-LM or
STAGE builds it, the DistIR MLP only as itself."""


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
                   " --pp 1, no recompute and the device's host link; default: none)")
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
                   help="how the loss holds the logits: fused (Megatron-LM's: fp32 logits, 4"
                   " bytes each; the default), pytorch (torchtitan's: cross_entropy on an fp32"
                   " copy, 12 bytes each at its peak), nanotron (fp32 logits and a shifted"
                   " copy, 8 bytes each) or replicated (the 16-bit logits gathered to every tp"
                   " rank and held by the loop, 8 bytes each of the whole vocabulary)")
    t.add_argument("--cp-comm", choices=[m.value for m in CpComm], default=None,
                   help="how context parallelism exchanges K and V (Megatron-LM's"
                   " --cp-comm-type): p2p (a ring: each chunk sent on while the one in hand is"
                   " attended to, the outputs merged step by step; the default), all_gather"
                   " (gathered whole before the attention, exposed, as the Llama 3 paper's) or"
                   " a2a (Q, K, V and the output all-to-all'd, each rank attending the whole"
                   " sequence with cp-th of the heads: DeepSpeed-Ulysses)")
    t.add_argument("--grad-bytes", type=int, default=2,
                   help="bytes per gradient (2: bf16 accumulation, the default; 4: fp32 main"
                   " gradients as Megatron-LM keeps them)")
    t.add_argument("--optimizer-bytes", type=int, default=12,
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
                "last_stage_layers", "shard_group", "ep", "etp", "recompute_layers",
                "offload_layers")
"""Flags that take a degree or a count: each must be >= 1 when given."""


def check_degrees(args: argparse.Namespace) -> None:
    """One line for the first degree flag below 1, before anything divides by it."""
    for name in DEGREE_FLAGS:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise PlannerUsageError(f"--{name.replace('_', '-')} must be >= 1, but got {value}")


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
    try:
        return Strategy(
            dp=dp, tp=args.tp, pp=args.pp, sp=args.sp,
            sequence_parallel=not args.no_sequence_parallel,
            zero=ZeroStage.PARAMETERS if args.fsdp else ZeroStage(args.zero),
            recompute=Recompute(args.recompute), micro_batch=args.micro_batch,
            schedule=Schedule(args.schedule), v=_chunks(args, layout),
            placement=_placement(args.placement),
            precision=Precision(args.precision), first_stage_layers=args.first_stage_layers,
            last_stage_layers=args.last_stage_layers, shard_group=args.shard_group,
            ep=args.ep, etp=args.etp, ep_overlap=args.ep_overlap, ep_dedup=args.ep_dedup,
            layout=layout, recompute_layers=args.recompute_layers,
            offload_layers=args.offload_layers,
        )
    except ValueError as e:
        raise PlannerUsageError(f"strategy: {e}") from None


def _table(est: Estimate, quantized: bool = False, host: tuple[float, float] = (0.0, 0.0)) -> str:
    """``quantized``: the GEMMs ran below 16 bits, so MFU (against the bf16 peak, as
    Megatron-LM and Megatron-Bridge report it) may pass 100%; the line says so. ``host``: the
    seconds of compute spent waiting for the host and its time a kernel, said under the parts
    when there are any."""
    of = " of the bf16 peak" if quantized else ""
    lines = [(f"step time      {est.step_time:10.4f} s   ({est.tokens_per_s:,.0f} tokens/s,"
              f" MFU {est.mfu:.1%}, HFU {est.hfu:.1%}{of})")]
    for f in fields(est.time):
        value = getattr(est.time, f.name)
        if value:
            lines.append(f"  {f.name:<12} {value:10.4f} s  {value / est.step_time:6.1%}")
    waits, per_kernel = host
    if waits:
        lines.append(f"  (compute includes {waits:.4f} s waiting for the host: layers whose"
                     f" kernels run shorter than its {per_kernel * 1e6:g} us to issue each;"
                     " --cuda-graphs takes it out)")
    fit = "fits" if est.fits else f"DOES NOT FIT: {est.reason}"
    lines.append(f"peak memory    {est.memory.total / GB:10.2f} GB  on stage {est.peak_stage}"
                 f" of {len(est.stages)}  (HBM {est.hbm_bytes / GB:.1f} GB: {fit})")
    for f in fields(est.memory):
        value = getattr(est.memory, f.name)
        if value:
            lines.append(f"  {f.name:<16} {value / GB:8.2f} GB")
    if len(est.stages) > 1:
        lines.append("per stage: layers, micro-batches in flight, memory")
        for st in est.stages:
            lines.append(f"  stage {st.stage:<3} {st.layers:4d} layers  {st.in_flight:6.2f} in"
                         f" flight  {st.memory.total / GB:8.2f} GB")
    return "\n".join(lines)


class EstimateCommand(BaseCommand):
    name = "estimate"
    help = "Step time and peak memory of one plan, with every part."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--plan", type=Path, metavar="FILE",
                            help="a plan file (`planner export --format plan`): estimate it"
                            " again; the other options are then not used")
        parser.add_argument("--model", help="catalog name or YAML path (required without --plan)")
        parser.add_argument("--system", help="catalog name (a family's with its GPU count:"
                            " dgx-h100-6144), or YAML path (required without --plan)")
        parser.add_argument("--hbm-gb", type=hbm_gb,
                            help="HBM per device in decimal GB (default: the device's, as the"
                                 " driver reports it: 85.9 on an \"80GB\" A100, 80 GiB)")
        parser.add_argument("--congestion", choices=[c.value for c in Congestion],
                            help="time collectives as ASTRA-sim's congestion-unaware backend"
                            " (the default) or its congestion-aware one: flows that share a"
                            " link queue on it")
        parser.add_argument("--convention", choices=[c.value for c in Convention],
                            help="the step model: megatron (Megatron-LM's transformer), stage"
                            " (STAGE's graph on ASTRA-sim) or mlp (default: the model family's,"
                            " as in studies)")
        add_strategy_arguments(parser)
        parser.add_argument("--framework", choices=FRAMEWORKS, default=ANY,
                            help="estimate the plan as this framework runs it: the options not"
                            " given take a study's defaults for it (its stack, loss, recompute,"
                            " context parallelism), and a plan it cannot run as written is"
                            " refused with the reason (default: any)")
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def run(self, args: argparse.Namespace) -> int:
        if args.plan is not None:
            from planner.plan import read_plan  # Optuna and pandas: only for --plan

            plan = read_plan(args.plan)
            self._print(args, plan.model, plan.system, plan.strategy, plan.estimate,
                        plan.training)
            return 0
        for flag in ("model", "system", "global_batch"):
            if getattr(args, flag) is None:
                raise PlannerUsageError(f"--{flag.replace('_', '-')} is required (or give"
                                        " --plan FILE)")
        catalog = load_catalog()
        model = catalog.model(args.model)
        system = catalog.system(args.system)
        if args.hbm_gb is not None:
            if not args.hbm_gb > 0:
                raise PlannerUsageError(f"--hbm-gb must be > 0, but got {args.hbm_gb}")
            system = replace(system, device=replace(system.device, hbm_bytes=args.hbm_gb * GB))
        convention = convention_for(model, args.convention)
        if args.congestion is not None:
            from planner.study_config import with_congestion  # Optuna: only for --congestion

            system = with_congestion(system, Congestion(args.congestion), convention,
                                     lambda m: PlannerUsageError(f"--congestion: {m}"))
        strategy = strategy_from_args(args, system.devices)
        try:
            seq_len = args.seq_len if args.seq_len is not None else model.seq_len
            training = TrainingSpec(global_batch=args.global_batch, seq_len=seq_len,
                                    bytes_per_param_grads=args.grad_bytes,
                                    bytes_per_param_optimizer=args.optimizer_bytes,
                                    flash_attention=args.flash_attention,
                                    transformer_engine=args.transformer_engine,
                                    recompute_early_stop=args.recompute_early_stop,
                                    grad_copy=args.grad_copy,
                                    launch_blocking=args.launch_blocking,
                                    cuda_graphs=args.cuda_graphs,
                                    tp_comm_overlap=args.tp_comm_overlap,
                                    fp8_attention=args.fp8_attention,
                                    master_weights=args.master_weights,
                                    fsdp_no_sync=args.fsdp_no_sync,
                                    swiglu_fusion=args.swiglu_fusion,
                                    vocab_parallel_embedding=args.vocab_parallel_embedding,
                                    recompute_modules=None if args.recompute_modules is None
                                    else tuple(map(RecomputeModule, args.recompute_modules)),
                                    **{k: enum(getattr(args, k))
                                       for k, enum in TRAINING_CHOICES.items()
                                       if getattr(args, k) is not None})
            training = framework_training(args.framework, model, system, training, strategy)
            est = estimate(model, system, training, strategy, convention)
        except ValueError as e:
            raise PlannerUsageError(str(e)) from None
        self._print(args, model, system, strategy, est, training)
        return 0

    @staticmethod
    def _print(args: argparse.Namespace, model: ModelSpec, system: SystemSpec,
               strategy: Strategy, est: Estimate, training: TrainingSpec) -> None:
        from simcore.megatron.stack import (
            uses_flash_attention,
            uses_fp8_attention,
            uses_fp32_shards,
            uses_recompute_early_stop,
            uses_tp_comm_overlap,
            uses_transformer_engine,
        )

        te = uses_transformer_engine(system, training, strategy.zero)
        waits = host_wait(model, system, training, strategy, Convention(est.convention),
                          step_time=est.step_time)
        early = (est.convention == "megatron" and strategy.recompute is Recompute.FULL
                 and uses_recompute_early_stop(system, training, strategy.zero))
        fp32 = est.convention == "megatron" and uses_fp32_shards(system, training, strategy.zero)
        if args.json:
            from planner.plan import strategy_dict  # Optuna and pandas: only for --json

            aware = system.network.congestion is Congestion.AWARE
            out = {"model": model.name, "system": system.name,
                   **({"congestion": Congestion.AWARE.value} if aware else {}),
                   "transformer_engine": te, "recompute_early_stop": early,
                   "fp32_shards": fp32,
                   **({"framework": args.framework} if args.framework != ANY else {}),
                   **{k: getattr(training, k).value for k in TRAINING_CHOICES
                      if getattr(training, k) is not None},
                   "strategy": strategy_dict(strategy), **est.to_dict(),
                   "host_wait_s": waits}
            print(json.dumps(out, indent=2))
        else:
            aware = system.network.congestion is Congestion.AWARE
            stack = "Megatron-Core + Transformer Engine" if te else "classic stack"
            if args.framework != ANY:
                stack += f" as {args.framework} runs it"
            if (est.convention == "megatron" and te and strategy.tp > 1
                    and strategy.sequence_parallel):
                stack += (", tp collectives beside the GEMMs" if uses_tp_comm_overlap(
                    system, training, strategy) else ", tp collectives not overlapped")
            if early:
                stack += ", recompute stops at each layer's last saved tensor"
            if fp32:
                stack += ", PyTorch FSDP's fp32 shards"
            if uses_fp8_attention(training, strategy.precision, te,
                                  uses_flash_attention(model, system, training)):
                stack += ", attention in FP8"
            if (est.convention == "megatron" and strategy.recompute is Recompute.SELECTIVE
                    and training.selective_recompute is SelectiveRecompute.OP):
                stack += ", per-op selective recompute"
            if est.convention == "megatron" and strategy.sp > 1:
                stack += {CpComm.P2P: ", K and V on a ring",
                          CpComm.ALL_GATHER: ", K and V all-gathered",
                          CpComm.A2A: ", Q, K and V all-to-all'd"}[training.cp_exchange]
            print(f"{model.name} on {system.name} ({system.devices} x {system.device.name}"
                  f"{', congestion-aware' if aware else ''}, {stack}):"
                  f" {_describe(strategy, model.layers)}")
            print(_table(est, strategy.precision.quantized,
                         (waits, system.device.host_kernel_s)))


def _describe(s: Strategy, layers: int) -> str:
    parts = [f"dp={s.dp} tp={s.tp} pp={s.pp} sp={s.sp}", f"micro-batch {s.micro_batch}",
             f"{s.schedule.value}" + (f" v={s.v}" if s.v > 1 else ""),
             f"recompute {s.recompute.value}"
             + ("" if s.recompute_layers is None else
                f" ({s.recompute_layers} layers a {'chunk' if s.v > 1 else 'stage'})")]
    if s.offload_layers is not None:
        parts.append(f"{s.offload_layers} layers offload activations")
    if s.zero:
        parts.append("FSDP" if s.zero is ZeroStage.PARAMETERS else f"ZeRO-{int(s.zero)}")
    if s.shard_group is not None:
        parts.append(f"HSDP shard group {s.shard_group}" if s.zero is ZeroStage.PARAMETERS
                     else f"optimizer sharded within {s.shard_group} ranks")
    if s.ep > 1 or s.etp is not None:
        parts.append(f"ep={s.ep} etp={s.expert_tp}" + (" overlapped" if s.ep_overlap else "")
                     + (" deduplicated" if s.ep_dedup else ""))
    if s.layout is not None:
        parts.append("layers per stage " + " + ".join(map(str, s.stage_layers(layers)))
                     + f" (layout {format_layout(s.layout)})")
    elif s.uneven:
        parts.append(f"stages: first {s.first_stage_layers or 'even'},"
                     f" last {s.last_stage_layers or 'even'} layers")
    if s.precision is not Precision.BF16:
        parts.append(s.precision.value)
    return ", ".join(parts)
