"""A CSV of measured training runs, read into specs: what ``planner validate`` and ``planner
calibrate`` take.

Columns (a header row, any order; names as below, case-insensitive):

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
  --recompute-num-layers``; empty: all), ``offload_layers`` (with pp 1 and no recompute: the
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
  of the 16-bit logits, 6; ``pytorch``, torchtitan's on an fp32 copy of the logits: 12 bytes a
  logit at its peak; ``replicated``, KempnerForge's on the gathered 16-bit logits; ``nanotron``,
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
  ``name``; ``source`` and ``notes`` are kept for people and not read.

``model`` may name one entry of a YAML file of several as ``FILE.yaml#NAME``.

A row that cannot be read or estimated is kept with its reason (:class:`SkippedRun`), never an
error: one bad row does not hide the others. A missing column or an unreadable file is a
:class:`PlannerUsageError` naming the file and the fix.
"""

from __future__ import annotations

import csv
import difflib
import io
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from planner.catalog import Catalog
from planner.errors import PlannerUsageError
from planner.inputs import read_text
from planner.runs_row import (
    BadValue,
    RowError,
    allocated,
    as_run_by,
    integer,
    memory_stage,
    out_of_memory,
    positive,
    row_framework,
    row_strategy,
    row_training,
)
from planner.units import GB
from simcore.specs import ModelSpec, Strategy, SystemSpec, TrainingSpec

__all__ = ["MEASURED", "OPTIONAL", "REQUIRED", "MeasuredRun", "SkippedRun", "read_runs",
           "read_runs_files"]

REQUIRED = ("model", "system", "global_batch", "seq_len", "dp", "tp", "pp", "micro_batch")
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
            "notes")
"""``source`` and ``notes`` are for people (where a figure comes from); they are not read."""
ALIASES = {"cp": "sp", "vp": "v"}
"""Other names of a column, as Megatron-LM and NeMo's tables call the degree: read as it."""
AGREE = 0.01
"""How far apart a row's step time and throughputs may be (their published rounding)."""
MAX_ROWS = 100_000
"""More measured runs than any team has; a larger file is refused before it is read."""



GroupKey = tuple[str, str, int, int, str]
"""(model, system, global batch, sequence length, release): the runs of one plan-choice
question (:attr:`MeasuredRun.group`)."""


@dataclass(frozen=True, slots=True)
class MeasuredRun:
    """One measured run: the plan as specs and what was measured."""

    line: int
    """The CSV line (the header is line 1)."""
    name: str
    model_ref: str
    system_ref: str
    model: ModelSpec
    system: SystemSpec
    training: TrainingSpec
    strategy: Strategy
    step_time_s: float | None
    peak_memory_gb: float | None
    memory_allocated: bool = False
    """``peak_memory_gb`` is PyTorch's allocated peak, not the device's use
    (``memory_measured``)."""
    memory_stage: str = "peak"
    """The pipeline stage ``peak_memory_gb`` is of: ``peak`` (the estimate's highest), ``first``
    or ``last`` (``memory_stage``)."""
    file: str = ""
    """The CSV the run is in, as given on the command line."""
    release: str = ""
    """The software release (or stack) the run was measured on (``release``; empty: one for
    every run): plans measured on different releases are not compared for plan choice, as a
    release alone moves a step time by several percent."""
    framework: str = ""
    """The framework the run was read as (``framework``; empty: none named, the device's and
    model's defaults)."""
    out_of_memory: bool = False
    """The plan was tried and ran out of memory (``out_of_memory``): no step time, no peak; what
    it checks is the estimate's verdict that the plan fits."""

    @property
    def group(self) -> GroupKey:
        """Runs of one model on one system at one batch and sequence length, measured on one
        release: the plans a study of that question would choose between."""
        return (self.model_ref, self.system_ref, self.training.global_batch,
                self.training.seq_len, self.release)


@dataclass(frozen=True, slots=True)
class SkippedRun:
    line: int
    name: str
    reason: str
    bad_value: bool = False
    """A cell is not a valid value (a typo to fix), not a plan the planner cannot express."""
    file: str = ""
    """The CSV the row is in, as given on the command line."""

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.file else f"line {self.line}"


def _spec(find: Callable[[str], object], ref: str, kind: str, path: Path) -> object:
    if not ref:
        raise BadValue(f"{kind} is empty; give a catalog name or a YAML path")
    try:
        return find(ref)
    except PlannerUsageError as e:  # the row's place is said beside it: the file once
        raise BadValue(str(e).removeprefix(f"{path}: ")) from None


def _rows(path: Path) -> tuple[list[str], list[tuple[int, dict[str, str], int]]]:
    """The header and each non-blank row: its line, {column: cell} and how many filled cells
    it has past the last column (an unquoted comma shifted them there)."""
    text = read_text(path, "CSV of measured runs", encoding="utf-8-sig")
    reader = csv.reader(io.StringIO(text))
    try:
        header = _canonical(path, [h.strip().lower() for h in next(reader, [])])
        rows = []
        for record in reader:
            if not any(cell.strip() for cell in record):
                continue
            if len(rows) >= MAX_ROWS:
                raise PlannerUsageError(f"{path}: more than {MAX_ROWS:,} runs; split the file")
            spilled = sum(1 for v in record[len(header):] if v.strip())
            rows.append((reader.line_num, {k: v.strip() for k, v in zip(header, record)},
                         spilled))
    except csv.Error as e:
        raise PlannerUsageError(f"{path}: line {reader.line_num}: not valid CSV: {e}") from None
    return header, rows


def _canonical(path: Path, header: list[str]) -> list[str]:
    """The header with each alias (:data:`ALIASES`) under its column's name; an alias beside
    that name is one degree given twice."""
    for alias, name in ALIASES.items():
        if alias in header and name in header:
            raise PlannerUsageError(f"{path}: header: columns {alias!r} and {name!r} both give"
                                    f" {name}; keep one")
    return [ALIASES.get(h, h) for h in header]


def _measured_step(row: dict[str, str], strategy: Strategy) -> float | None:
    """The row's step time in seconds: ``step_time_s``, or the step its throughput gives
    (``global_batch x seq_len`` tokens over ``tokens_per_s``, or over ``tokens_per_s_per_gpu``
    times the plan's devices); None where none is filled. Two that disagree by more than
    :data:`AGREE` are a value to fix."""
    tokens = integer(row, "global_batch") * integer(row, "seq_len")
    given = {"step_time_s": positive(row, "step_time_s")}
    job = positive(row, "tokens_per_s")
    per_gpu = positive(row, "tokens_per_s_per_gpu")
    given["tokens_per_s"] = None if job is None else tokens / job
    given["tokens_per_s_per_gpu"] = (None if per_gpu is None
                                     else tokens / (per_gpu * strategy.devices))
    filled = {k: v for k, v in given.items() if v is not None}
    if not filled:
        return None
    (first, step), *others = filled.items()
    for key, other in others:
        if abs(other / step - 1) > AGREE:
            raise BadValue(f"{first} and {key} disagree: a step of {step:.4g} s against"
                           f" {other:.4g} s ({tokens:,} tokens a step on {strategy.devices}"
                           " devices); fix one or leave it empty")
    return step


def _check_gpus(row: dict[str, str], strategy: Strategy, system: SystemSpec) -> None:
    """A filled ``gpus`` must be the plan's and the system's device count: a row that says
    otherwise has a value to fix."""
    if not row.get("gpus"):
        return
    gpus = integer(row, "gpus")
    if gpus != strategy.devices:
        raise BadValue(f"gpus={gpus} but dp*tp*pp*sp = {strategy.devices}; fix the degrees"
                       " or the gpus cell")
    if gpus != system.devices:
        raise BadValue(f"gpus={gpus} but the system {system.name} has {system.devices}"
                       f" devices; name the system with {gpus}")


def _check_header(path: Path, header: list[str]) -> None:
    if not header:
        raise PlannerUsageError(f"{path}: empty; the first line must name the columns"
                                f" ({', '.join(REQUIRED)}, step_time_s and/or peak_memory_gb)")
    for sep, said in ((";", "semicolons"), ("\t", "tabs"), ("|", "bars")):
        if len(header) == 1 and sep in header[0]:
            raise PlannerUsageError(f"{path}: the header is separated by {said}; separate the"
                                    " columns with commas (a spreadsheet's \"CSV, comma\")")
    known = REQUIRED + MEASURED + OPTIONAL
    unknown = [c for c in header if c and c not in known]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        close = difflib.get_close_matches(missing[0], unknown, n=1)
        hint = f" (is {close[0]!r} it? rename it)" if close else ""
        raise PlannerUsageError(f"{path}: header: no column {missing[0]!r}{hint}; the columns"
                                f" {', '.join(REQUIRED)} are required")
    if unknown:
        close = difflib.get_close_matches(unknown[0], [*known, *ALIASES], n=2)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise PlannerUsageError(f"{path}: header: unknown column {unknown[0]!r}; {hint}allowed:"
                                f" {', '.join(known)}")
    if not any(c in header for c in MEASURED):
        raise PlannerUsageError(f"{path}: header: no measured column; add step_time_s (seconds"
                                " per step; or tokens_per_s, tokens_per_s_per_gpu) and/or"
                                " peak_memory_gb (GB per device), or out_of_memory (true for"
                                " a plan that ran out of memory)")
    duplicated = sorted({c for c in header if c and header.count(c) > 1})
    if duplicated:
        raise PlannerUsageError(f"{path}: header: column {duplicated[0]!r} appears twice")


def _default_name(line: int, row: dict[str, str]) -> str:
    plan = " ".join(f"{k}{row[k]}" for k in ("dp", "tp", "pp", "sp") if row.get(k))
    extra = [f"mb{row['micro_batch']}"] if row.get("micro_batch") else []
    extra += [row[k] for k in ("recompute",) if row.get(k)]
    where = f"{row.get('model', '?')} on {row.get('system', '?')}"
    return f"line {line}: {where} {plan} {' '.join(extra)}".strip()


def read_runs_files(paths: Iterable[Path], catalog: Catalog,
                    framework: str | None = None) -> tuple[list[MeasuredRun], list[SkippedRun]]:
    """:func:`read_runs` of several CSV files, read as one."""
    runs: list[MeasuredRun] = []
    skipped: list[SkippedRun] = []
    seen: set[Path] = set()
    for path in paths:
        if path.resolve() in seen:  # its runs would count twice in every figure
            raise PlannerUsageError(f"{path}: given twice; give each file once")
        seen.add(path.resolve())
        found, left_out = read_runs(path, catalog, framework)
        runs += found
        skipped += left_out
    return runs, skipped


def read_runs(path: Path, catalog: Catalog,
              framework: str | None = None) -> tuple[list[MeasuredRun], list[SkippedRun]]:
    """The CSV's runs as specs, and the rows that could not be read with their reason.
    ``framework``: what a row whose ``framework`` cell is empty is read as (``planner validate
    --framework``); None reads it with the device's and model's defaults."""
    header, rows = _rows(path)
    _check_header(path, header)
    if not rows:
        raise PlannerUsageError(f"{path}: no runs under the header; add one row per measured run")
    where = (path, "model")
    runs: list[MeasuredRun] = []
    skipped: list[SkippedRun] = []
    for line, row, spilled in rows:
        name = row.get("name") or _default_name(line, row)
        try:
            if spilled:
                raise BadValue(f"{spilled} more filled cell(s) than the header's"
                                f" {len(header)} columns: a comma in an unquoted cell shifts"
                                " every cell after it; quote that cell or remove the comma")
            strategy = row_strategy(row)
            step = _measured_step(row, strategy)
            memory = positive(row, "peak_memory_gb")
            oom = out_of_memory(row)
            if oom and (step is not None or memory is not None):
                raise BadValue("out_of_memory is true but the row has a measured"
                               f" {'step time' if step is not None else 'peak_memory_gb'}: a run"
                               " that ran out of memory has neither; empty the measured cells"
                               " or set out_of_memory false")
            if step is None and memory is None and not oom:
                raise BadValue("no measured step_time_s (or tokens_per_s, tokens_per_s_per_gpu)"
                               " or peak_memory_gb, and out_of_memory is not true; fill one in"
                               " or remove the row")
            model = _spec(lambda r: catalog.model(r, where=where), row.get("model", ""), "model",
                          path)
            system = _spec(lambda r: catalog.system(r, where=(path, "system")),
                           row.get("system", ""), "system", path)
            _check_gpus(row, strategy, system)
            hbm = positive(row, "hbm_gb")
            if hbm is not None:  # a part with more or less memory than the catalog's
                system = replace(system, device=replace(system.device, hbm_bytes=hbm * GB))
            run_framework = row_framework(row, framework)
            training = as_run_by(run_framework, model, system, row_training(row), strategy)
            runs.append(MeasuredRun(
                line=line, name=name, model_ref=row["model"], system_ref=row["system"],
                model=model, system=system, training=training, strategy=strategy,
                step_time_s=step, peak_memory_gb=memory, memory_allocated=allocated(row),
                memory_stage=memory_stage(row),
                file=str(path), release=row.get("release", ""),
                framework=run_framework, out_of_memory=oom))
        except RowError as e:
            skipped.append(SkippedRun(line, name, str(e), isinstance(e, BadValue), str(path)))
    return runs, skipped
