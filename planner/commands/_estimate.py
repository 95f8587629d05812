"""``planner estimate``: one plan's step time and memory, with every part."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields, replace
from pathlib import Path

from planner.catalog import load_catalog
from planner.commands._base import BaseCommand, hbm_gb
from planner.commands._strategy_args import (
    add_strategy_arguments,
    convention_for,
    strategy_from_args,
)
from planner.errors import PlannerUsageError
from planner.units import GB
from search_spaces.frameworks import ANY, FRAMEWORKS, framework_training
from simcore import estimate, host_wait
from simcore.estimate import Estimate
from simcore.layout import format_layout
from simcore.network import Congestion
from simcore.specs import (
    TRAINING_CHOICES,
    Convention,
    CpComm,
    ModelSpec,
    Precision,
    Recompute,
    RecomputeModule,
    SelectiveRecompute,
    Strategy,
    SystemSpec,
    TrainingSpec,
    ZeroStage,
)


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
    if est.memory.step_copy:
        lines.append("  (step_copy: the stage peaks at the optimizer step, whose fp32 copy of the"
                     " 16-bit gradients outweighs the backward's activations; --main-grad-copy)")
    if len(est.stages) > 1:
        lines.append("per stage: layers, micro-batches in flight, memory")
        for st in est.stages:
            lines.append(f"  stage {st.stage:<3} {st.layers:4d} layers  {st.in_flight:6.2f} in"
                         f" flight  {st.memory.total / GB:8.2f} GB")
    return "\n".join(lines)


_WITH_PLAN = {"plan", "framework", "json", "debug", "command"}
"""The options that apply to ``--plan``; the plan file sets what the others would."""


class EstimateCommand(BaseCommand):
    name = "estimate"
    help = "Step time and peak memory of one plan, with every part."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--plan", type=Path, metavar="FILE",
                            help="a plan file (`planner export --format plan`): estimate it"
                            " again (--framework and --json apply; the others, which the"
                            " file sets, are refused beside it)")
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
        self._parser = parser

    def _refuse_with_plan(self, args: argparse.Namespace) -> None:
        """An option the plan file sets, given beside ``--plan``: one line (it was ignored)."""
        for dest, value in vars(args).items():
            if dest not in _WITH_PLAN and value != self._parser.get_default(dest):
                flag = ("--no-" if value is False else "--") + dest.replace("_", "-")
                raise PlannerUsageError(f"{flag}: not used with --plan, whose file sets it; drop"
                                        f" {flag}, or edit {args.plan}")

    def run(self, args: argparse.Namespace) -> int:
        if args.plan is not None:
            self._refuse_with_plan(args)
            from planner.plan import read_plan  # Optuna and pandas: only for --plan

            plan = read_plan(args.plan)
            if args.framework != ANY and plan.convention is not Convention.MEGATRON:
                raise PlannerUsageError(
                    f"--framework {args.framework}: {args.plan} was estimated in the"
                    f" {plan.convention.value} convention, which no training framework runs;"
                    " drop --framework")
            if args.framework == ANY:
                self._print(args, plan.model, plan.system, plan.strategy, plan.estimate,
                            plan.training)
                return 0
            try:  # as the framework runs it: the training as its study wrote it, then its own
                training = framework_training(args.framework, plan.model, plan.system,
                                              plan.written_training,
                                              plan.strategy)
                est = estimate(plan.model, plan.system, training, plan.strategy,
                               plan.convention)
            except ValueError as e:
                raise PlannerUsageError(f"{args.plan}: {e}") from None
            self._print(args, plan.model, plan.system, plan.strategy, est, training)
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
        if args.framework != ANY and convention is not Convention.MEGATRON:
            raise PlannerUsageError(f"--framework {args.framework}: the {convention.value}"
                                    " convention is not a training framework's; drop"
                                    " --framework or use --convention megatron")
        if args.congestion is not None:
            from planner.study_config import with_congestion  # Optuna: only for --congestion

            system = with_congestion(system, Congestion(args.congestion), convention,
                                     lambda m: PlannerUsageError(f"--congestion: {m}"))
        strategy = strategy_from_args(args, system.devices)
        try:
            seq_len = args.seq_len if args.seq_len is not None else model.seq_len
            training = TrainingSpec(global_batch=args.global_batch, seq_len=seq_len,
                                    bytes_per_param_grads=(2 if args.grad_bytes is None
                                                           else args.grad_bytes),
                                    grad_reduce_bytes=args.grad_reduce_bytes,
                                    grad_all_reduce=args.grad_all_reduce,
                                    bytes_per_param_optimizer=args.optimizer_bytes,
                                    flash_attention=args.flash_attention,
                                    transformer_engine=args.transformer_engine,
                                    recompute_early_stop=args.recompute_early_stop,
                                    grad_copy=args.grad_copy,
                                    main_grad_copy=args.main_grad_copy,
                                    fp32_grad_partition=args.fp32_grad_partition,
                                    launch_blocking=args.launch_blocking,
                                    cuda_graphs=args.cuda_graphs,
                                    tp_comm_overlap=args.tp_comm_overlap,
                                    async_tp_allreduce=args.async_tp_allreduce,
                                    fused_norm=args.fused_norm,
                                    rope_fusion=args.rope_fusion,
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
            if args.framework == "torchtitan" and args.grad_bytes not in (None, 4):
                raise ValueError(f"--grad-bytes {args.grad_bytes}: torchtitan reduces the"
                                 " gradients in float32 only (mixed_precision_reduce); give 4"
                                 " or leave it out")
            if args.framework != ANY and (args.grad_all_reduce or args.grad_reduce_bytes):
                raise ValueError(f"--grad-all-reduce and --grad-reduce-bytes are a stack's own"
                                 f" gradient reduction (Aleph Alpha's Scaling); --framework"
                                 f" {args.framework} reduces its own way: drop one of them")
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
            uses_async_tp_allreduce,
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
            elif (est.convention == "megatron" and strategy.tp > 1
                  and not uses_async_tp_allreduce(training)):
                stack += ", backward tp reduction after the GEMMs"
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
