"""The report's first section: which plan to run, why, how sure, and what would change it.

Read from the study's stored trials (but the host's pace): the recommended plan is the
fastest feasible one; the runner-up is the next row of the best plans; "close" is within the
estimate's stated error (:data:`ESTIMATE_ERROR`); what would change the answer is the HBM limit
when the recommended plan nearly fills it or a faster plan does not fit, the host's pace when its
layers wait for it (estimated once more without the host's time), and the largest part of its
step that is not compute.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import pandas as pd

from search_spaces.frameworks import ANY, FRAMEWORKS

__all__ = ["ESTIMATE_ERROR", "SHORT_STEP_S", "WIDE_DP", "Decision", "decide", "decision_html",
           "export_formats", "short_wide"]

ESTIMATE_ERROR = 0.065
"""The estimate's step-time error to weigh close plans against: its median absolute error over
every check file's runs, which it was not fit on (6.5% over 1,192 runs, 6.4% before the T4's
GEMM rate of stop 83; README, "How right is it"; tests/test_readme_figures.py recomputes it).
Until stop 78 the mean of the A100 and H100 check files of an earlier stop (7.5%), which
`planner validate` no longer printed."""

MEMORY_BINDS = 0.88
"""A plan using this share of the HBM limit or more is held by memory: one in ten of the
measured peaks of the validation set's check files (190 runs, tests/data/validation) used 13.4%
or more beyond its estimate, 1 / 1.134 = 0.88 (tests/test_report_decision.py recomputes it). At
0.95, the share until stop 74, one run in five used more than the 5.3% such a plan has left. On
Aleph Alpha's sweep 89 of the 305 plans that ran out of memory were estimated to fit, those a
study would have recommended at 76-98% of the part (tests/data/validation/README.md, "Plans
that ran out of memory")."""
MEMORY_SPREAD = 0.134
"""How much beyond its estimate one measured peak in ten used (:data:`MEMORY_BINDS`)."""
HOST_SAYS = 0.05
"""A recommended plan whose step waits this share of it for the host or more says so."""
TP_OVERLAP_SAYS = 0.02
"""A recommended plan whose step would grow by this share or more without Transformer Engine's
tp overlap says it counts on it (FlagPerf's Llama 3 8B at tp 8 on a DGX A800: 14%)."""
EAGER_SAYS = 0.03
"""A recommended plan whose step would shrink by this share or more with the element-wise ops
the study runs unfused (``fused_norm``, ``rope_fusion``, ``swiglu_fusion`` false) fused says so
(torchtitan's eager Llama 3.1 8B on H100: 17% of its step, measured 1.16x faster compiled)."""

SHORT_STEP_S = 1.0
"""The step time under which a plan of one micro-batch a step over a wide dp is less sure
(:data:`WIDE_DP`)."""
WIDE_DP = 64
"""A plan of one micro-batch a step over data parallelism of :data:`WIDE_DP` or more, whose step
is estimated under :data:`SHORT_STEP_S`, is where the estimate is least sure: every such run of
the validation set (tests/data/validation, 24 runs: MLPerf v5.1's Llama 3.1 8B on 512 GB200s and
GB300s and on 64-128 H100s, nanotron's plans on 16-64 nodes, llm-foundry's short FSDP steps) took
longer than estimated, by 11% at the median and up to 69%, where the 40 such plans with longer
steps are 2.7% fast at the median (tests/test_report_doubts.py). There the gradient reduction and
the step's fixed costs have the least compute to hide behind; which of them the estimate misses,
the runs do not say (tests/data/validation/README.md, "Short steps at large data
parallelism")."""

PARTS = {
    "compute": "compute",
    "tp": "tensor-parallel communication",
    "sp": "context-parallel communication",
    "dp": "data-parallel gradient reduction",
    "pp": "pipeline sends",
    "fsdp": "ZeRO-3 / FSDP gathers",
    "ep": "the experts' all-to-alls",
    "bubble": "the pipeline bubble",
    "optimizer": "the optimizer step",
    "comm": "exposed communication",
    "offload": "activation offloading's copies",
}
"""Each time part of a stored trial (``time_<part>_s``) in words."""


TRAINING_FORMATS = tuple(f for f in FRAMEWORKS if f != ANY)
"""The export formats that launch a training framework: each is named after it."""


@dataclass(frozen=True)
class Decision:
    study: str
    best: pd.Series
    runner_up: pd.Series | None
    close: pd.DataFrame
    """Other best plans within :data:`ESTIMATE_ERROR` of the recommended one."""
    hbm_gb: float | None
    faster_unfit: pd.Series | None
    """The fastest finished plan that does not fit, when it beats the recommended one."""
    exports: tuple[str, ...]
    description: str
    refused: tuple[tuple[str, str], ...] = ()
    """The frameworks whose export refuses the recommended plan, each with its one-line reason
    (:func:`decide`'s ``refused``): left out of :attr:`exports`."""
    host: tuple[float, float] = (0.0, 0.0)
    """Seconds of the recommended plan's step its devices wait for the host to issue the
    layers' kernels, and the host's time a kernel (:func:`simcore.host_wait`)."""
    tp_overlap: float = 0.0
    """Seconds the recommended plan's step would grow without Transformer Engine's tp overlap
    (``tp_comm_overlap``), when it counts on it; 0 otherwise."""
    short_wide: int = 0
    """The recommended plan's dp where it takes one micro-batch a step over dp of
    :data:`WIDE_DP` or more and its step is under :data:`SHORT_STEP_S` (:func:`short_wide`);
    0 otherwise."""
    unrunnable: bool = False
    """Every framework the study's convention could export the plan for refuses it (it needs
    more HBM than the device has, or a framework's rule forbids it): the page then says so
    instead of recommending it."""
    device: str = ""
    """The catalog name of the study's device, for the commands the page prints."""
    plain: pd.Series | None = None
    """The fastest finished plan that fits without virtual stages, when the recommended one
    interleaves (:func:`_interleaved_paced` compares them)."""
    eager: tuple[float, tuple[str, ...]] = (0.0, ())
    """Seconds the recommended plan's step would shrink with the element-wise ops its study
    runs as PyTorch's (unfused norms, rotary embedding, SwiGLU) fused, and those ops in
    words; (0, ()) when it runs none."""


def _parts(row: pd.Series) -> dict[str, float]:
    return {p: float(row[f"time_{p}_s"]) for p in PARTS
            if f"time_{p}_s" in row.index and pd.notna(row[f"time_{p}_s"])}


def export_formats(summary: dict) -> tuple[str, ...]:
    """The `planner export` formats that can run the study's plans: the framework the study
    names, or every framework of its convention."""
    convention = summary.get("convention")
    if convention == "stage":
        return ("astra-sim", "chakra", "plan")
    if convention == "mlp":
        return ("plan",)
    framework = summary.get("framework", "any")
    frameworks = TRAINING_FORMATS if framework == "any" else (framework,)
    return (*frameworks, "chakra", "plan")


def short_wide(micro_batches: int, dp: int, step_time_s: float) -> int:
    """``dp`` where a plan of ``micro_batches`` a step and this step time is in the regime
    :data:`WIDE_DP` describes (one micro-batch, dp of :data:`WIDE_DP` or more, a step under
    :data:`SHORT_STEP_S`); 0 otherwise."""
    return dp if micro_batches == 1 and dp >= WIDE_DP and step_time_s < SHORT_STEP_S else 0


def decide(study: str, frame: pd.DataFrame, best: pd.DataFrame, summary: dict,
           storage: str = "", refused: dict[str, str] | None = None,
           host: tuple[float, float] = (0.0, 0.0), tp_overlap: float = 0.0,
           wide: int = 0, device: str = "",
           eager: tuple[float, tuple[str, ...]] = (0.0, ())) -> Decision:
    """The decision from the study's :func:`~planner.tables.trials_frame` and its
    :func:`~planner.tables.best_frame` (fastest first, non-empty). ``storage`` is the
    ``--storage`` option the printed commands carry ("" for the default); ``refused``: the
    formats whose export refuses the recommended plan, with the reason (left out of the
    commands); ``host``: :attr:`Decision.host`; ``tp_overlap``: :attr:`Decision.tp_overlap`;
    ``wide``: :attr:`Decision.short_wide`; ``device``: :attr:`Decision.device`; ``eager``:
    :attr:`Decision.eager`."""
    refused = refused or {}
    top = best.iloc[0]
    runner_up = best.iloc[1] if len(best) > 1 else None
    limit = top["step_time_s"] * (1 + ESTIMATE_ERROR)
    close = best.iloc[1:][best.iloc[1:]["step_time_s"] <= limit]
    done = frame[frame["state"] == "COMPLETE"] if not frame.empty else frame
    unfit = done[~done["feasible"].astype(bool)] if "feasible" in done else done.iloc[0:0]
    unfit = unfit[unfit["step_time_s"] < top["step_time_s"]].sort_values("step_time_s")
    plain = None
    if top.get("schedule") == "interleaved":
        fits = done[done["feasible"].astype(bool) & (done["schedule"] != "interleaved")]
        plain = fits.sort_values("step_time_s").iloc[0] if len(fits) else None
    exports = tuple(f"planner export {study} --format {f}{storage}"
                    for f in export_formats(summary) if f not in refused)
    hbm = summary.get("hbm_gb")
    frameworks = [f for f in export_formats(summary) if f in TRAINING_FORMATS]
    return Decision(study, top, runner_up, close, float(hbm) if hbm else None,
                    unfit.iloc[0] if len(unfit) else None, exports,
                    str(summary.get("description") or ""), tuple(refused.items()), host,
                    tp_overlap, wide,
                    unrunnable=bool(frameworks) and all(f in refused for f in frameworks),
                    device=device, plain=plain, eager=eager)


def _why(d: Decision) -> str:
    top, other = d.best, d.runner_up
    if other is None:
        return "It is the only feasible plan the study found."
    gap = other["step_time_s"] / top["step_time_s"] - 1
    shown = f"{gap:.1%}" if gap >= 0.001 else f"{gap:.2%}"
    mine, theirs = _parts(top), _parts(other)
    deltas = sorted(((theirs.get(p, 0.0) - mine.get(p, 0.0), p) for p in PARTS
                     if p in mine or p in theirs), key=lambda x: -abs(x[0]))
    said = [f"{PARTS[p]} {'+' if dt > 0 else '-'}{_ms(abs(dt))}" for dt, p in deltas[:3]
            if abs(dt) > 1e-3 * top["step_time_s"]]
    text = (f"The runner-up, <code>{html.escape(str(other['plan']))}</code>, is {shown}"
            " slower")
    return text + (f": it spends {', '.join(said)} per step against the recommended plan."
                   if said else ", with the same parts.")


def _sureness(d: Decision) -> str:
    return _closeness(d) + (_least_sure(d.short_wide) if d.short_wide else "")


def _least_sure(dp: int) -> str:
    return (f" Less sure here: one micro-batch a step over dp {dp}, a step under"
            f" {SHORT_STEP_S:g} s. Every measured plan like it (24 in the validation set: MLPerf's"
            " Llama 3.1 8B on 64-512 GPUs, nanotron at 16-64 nodes, llm-foundry's short FSDP"
            " steps) took longer than estimated, by 11% at the median and up to 69%: the"
            " gradient reduction and the step's fixed costs have the least compute to hide"
            " behind there. Plans with more micro-batches a step (a larger global batch, or"
            " fewer data-parallel ranks) are estimated more surely; time the first steps before"
            " committing.")


def _closeness(d: Decision) -> str:
    n = len(d.close)
    if not n:
        return (f"No other plan comes within the estimate's error ({ESTIMATE_ERROR:.1%}): the"
                " choice holds if the estimate is as right as on the runs it was checked on.")
    return (f"{n} other plan{'s' if n > 1 else ''} come{'s' if n == 1 else ''} within the"
            f" estimate's error ({ESTIMATE_ERROR:.1%} on measured runs it was not fit on)"
            + (" (the first five)" if n > 5 else "") + ": <code>"
            + "</code>, <code>".join(html.escape(str(p)) for p in d.close["plan"][:5])
            + "</code>. The estimate cannot tell them apart; if the step matters, time the"
            " first steps of each on the cluster (or <code>planner calibrate</code> the device"
            " on a few measured runs).")


def _changes(d: Decision) -> list[str]:
    top, out = d.best, []
    if d.hbm_gb:
        used = top["peak_memory_gb"] / d.hbm_gb
        if used >= MEMORY_BINDS:
            out.append(f"Memory binds: the plan needs {top['peak_memory_gb']:.1f} of"
                       f" {d.hbm_gb:g} GB; one measured run in ten used"
                       f" {MEMORY_SPREAD:.0%} or more beyond its estimate, and a framework that"
                       " needs a few GB more than the estimate's allowance (memory_overhead_gb)"
                       " will not fit it. A study's <code>hbm_gb</code> below the part's asks"
                       " the same question with a margin." + _roomier(d))
    if d.faster_unfit is not None:
        f = d.faster_unfit
        gain = 1 - f["step_time_s"] / top["step_time_s"]
        out.append(f"More HBM would change the answer: <code>{html.escape(str(f['plan']))}"
                   f"</code> is {gain:.1%} faster but needs {f['peak_memory_gb']:.1f} GB.")
    waits, per_kernel = d.host
    if waits >= HOST_SAYS * top["step_time_s"]:
        out.append(f"The host paces its layers: {_ms(waits)} of its step"
                   f" ({waits / top['step_time_s']:.1%}) waits for the host to issue their"
                   f" kernels ({per_kernel * 1e6:g} us each). Captured as CUDA graphs"
                   " (<code>cuda_graphs: true</code> in the study's training; Megatron-LM's"
                   " <code>--cuda-graph-impl local</code>) they would not; run the study again"
                   " with it, as the best plan may change. The host's time a kernel is a software"
                   " release's more than a part's (Megatron-LM's own A100 tests ran the same plans"
                   " 1.2-1.5 times as long in 2025 as in 2023): time a few plans on your stack and"
                   f" fit it, <code>planner calibrate RUNS.csv --device {d.device or 'PART'}"
                   " --name OURS --fit host_kernel_us</code>.")
        out += _interleaved_paced(d)
    if d.tp_overlap >= TP_OVERLAP_SAYS * top["step_time_s"]:
        out.append(f"It counts on Transformer Engine's tp overlap (<code>--tp-comm-overlap</code>,"
                   " which the Megatron export writes): without it its tp collectives would add"
                   f" {_ms(d.tp_overlap)} ({d.tp_overlap / top['step_time_s']:.1%}) to the step."
                   " A run that cannot use it says <code>tp_comm_overlap: false</code> in the"
                   " study's training; run the study again with it, as the best plan may change.")
    out += _eager(d)
    overheads = {p: t for p, t in _parts(top).items() if p not in ("compute",) and t > 0}
    if overheads:
        part, t = max(overheads.items(), key=lambda kv: kv[1])
        out.append(f"Its largest cost besides compute is {PARTS[part]}: {_ms(t)},"
                   f" {t / top['step_time_s']:.1%} of the step.")
    return out


def _eager(d: Decision) -> list[str]:
    """The element-wise ops the study runs as PyTorch's, where fusing them would save
    :data:`EAGER_SAYS` of the step or more."""
    saved, ops = d.eager
    step = d.best["step_time_s"]
    if not ops or saved < EAGER_SAYS * step:
        return []
    names = ops[0] if len(ops) == 1 else ", ".join(ops[:-1]) + " and " + ops[-1]
    return [f"It runs {names} as PyTorch's element-wise ops, as the study's training says:"
            f" fused (torch.compile, or the fused kernels Megatron-LM runs by default) they"
            f" would take {_ms(saved)} ({saved / step:.1%}) off the step (torchtitan measured"
            " its eager Llama 3.1 8B 1.16 times faster compiled). Fused, they also keep fewer"
            " activations; run the study again with them fused, as the best plan may change."]


def _interleaved_paced(d: Decision) -> list[str]:
    """A host-paced plan that interleaves: Megatron-LM's own tests of a small GPT measured
    interleaving no faster than plain 1F1B where the host paces the layers, on one DGX A100 in
    2024 and 2025, a DGX H100 and GB200, where the estimate puts it about 25% ahead
    (tests/data/validation/README.md, "Looked at in stop 72"): the page names the fastest plan
    without virtual stages to time beside it."""
    if d.plain is None:
        return []
    gain = d.plain["step_time_s"] / d.best["step_time_s"] - 1
    return [f"It interleaves: the estimate has the fastest plan without virtual stages,"
            f" <code>{html.escape(str(d.plain['plan']))}</code>, {gain:.1%} slower; where"
            " the host paces the layers, Megatron-LM's own tests of a small GPT measured"
            " interleaving no faster than plain 1F1B (one DGX A100 in 2024 and 2025, a DGX H100,"
            " GB200), so time both."]


def _roomier(d: Decision) -> str:
    """The close plan with the most room in HBM, when it has a useful margin."""
    roomy = d.close[d.close["peak_memory_gb"] < MEMORY_BINDS * (d.hbm_gb or 0) - 5]
    if roomy.empty:
        return ""
    r = roomy.iloc[0]  # the fastest of them (best plans come fastest first)
    gap = r["step_time_s"] / d.best["step_time_s"] - 1
    return (f" Within the estimate's error and safer: <code>{html.escape(str(r['plan']))}"
            f"</code>, {gap:.2%} slower at {r['peak_memory_gb']:.1f} GB.")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms" if seconds < 1 else f"{seconds:,.3f} s"


def decision_html(d: Decision) -> str:
    top = d.best
    verb = "Fastest estimated, which no framework runs as written:" if d.unrunnable else "Run"
    head = (f"<p><b>{verb} <code>{html.escape(str(top['plan']))}</code></b>:"
            f" {_ms(top['step_time_s'])}"
            f" per step, {top['tokens_per_s']:,.0f} tokens/s, MFU {top['mfu']:.1%},"
            f" {top['peak_memory_gb']:.1f} GB peak per device"
            + (f" of {d.hbm_gb:g} GB" if d.hbm_gb else "") + ".</p>")
    parts = [head]
    if d.description:
        parts.insert(0, f"<p class='description'>{html.escape(d.description)}</p>")
    parts += [f"<p>{_why(d)}</p>", f"<p>{_sureness(d)}</p>"]
    changes = _changes(d)
    if changes:
        parts.append("<h3>What would change the answer</h3><ul>"
                     + "".join(f"<li>{c}</li>" for c in changes) + "</ul>")
    title = "Its files" if d.unrunnable else "Run it"
    parts.append(f"<h3>{title}</h3><pre>" + html.escape("\n".join(d.exports)) + "</pre>")
    if d.refused:
        by_reason: dict[str, list[str]] = {}
        for fmt, reason in d.refused:
            by_reason.setdefault(reason, []).append(fmt)
        parts.append("<p>Not for " + "; ".join(
            f"{html.escape(', '.join(fmts))} ({html.escape(reason)})"
            for reason, fmts in by_reason.items()) + ": its export refuses this plan as"
            " written.</p>")
    return "\n".join(parts)
