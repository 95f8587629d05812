"""One HTML page for a study: the recommended plan and why (:mod:`planner.report_decision`), its
inputs, the best plans, the Pareto front, the step-time breakdown of the best plans and the
timeline of the best one.

The page is self-contained: plotly.js is inlined once (the first figure) and every other figure
refers to it, so it opens offline and weighs about 5 MB plus the points.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import optuna
import pandas as pd
import plotly.graph_objects as go

from planner.errors import PlannerUsageError
from planner.exports import runnable_files
from planner.exports._chakra import chakra_problem
from planner.outputs import counted
from planner.plan import Plan, plans_from_frame
from planner.plots import figure_html
from planner.plots.breakdown import breakdown_figure
from planner.plots.pareto import pareto_figure
from planner.plots.timeline import timeline_figure
from planner.report_decision import (
    Decision,
    decide,
    decision_html,
    export_formats,
    short_wide,
)
from planner.results_parquet import RESULTS
from planner.study_summary import unfinished_note
from planner.tables import PLACEMENTS, best_frame, mfu_note, trials_frame
from search_spaces.frameworks import FRAMEWORKS
from simcore import estimate, host_wait
from simcore.megatron.checks import micro_batches
from simcore.megatron.stack import elementwise_fusions, uses_tp_comm_overlap
from simcore.specs import Convention

__all__ = ["Report", "build_report", "report_html"]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.9em; }
td, th { padding: 0.25em 0.7em; border-bottom: 1px solid #eee; text-align: right; }
th { background: #f5f5f5; } td:first-child, th:first-child { text-align: left; }
pre { background: #f7f7f7; padding: 1em; overflow-x: auto; }
.figure { margin: 1em 0 2em; }
.unfinished { background: #fff4e5; border-left: 4px solid #e8a317; padding: 0.6em 1em; }
"""


@dataclass(frozen=True)
class Report:
    """What the page shows, each figure already built."""

    study: str
    summary: dict
    counts: dict[str, int]
    best: pd.DataFrame
    figures: list[tuple[str, go.Figure]]
    decision: Decision
    unfinished: str | None = None
    """The warning of a study whose run stopped before its end (:func:`planner.study_summary
    .unfinished_note`): its best is the best of the plans estimated so far."""


def _refusals(plan: Plan, formats: tuple[str, ...]) -> dict[str, str]:
    """The training frameworks among ``formats`` whose exporter refuses ``plan``, each with its
    reason, found by exporting it as ``planner export`` would (nothing is written), and Chakra
    traces where they would be refused (:func:`planner.exports._chakra.chakra_problem`)."""
    refused = {}
    for fmt in formats:
        if fmt == "chakra":  # a plan whose traces it would not write (MoE, too many nodes)
            problem = chakra_problem(plan)
            if problem is not None:
                refused[fmt] = problem
            continue
        if fmt not in FRAMEWORKS:
            continue  # astra-sim and plan files: not a framework's rules
        try:
            runnable_files(plan, fmt)
        except ValueError as e:
            refused[fmt] = str(e)
    return refused


def _counts(df: pd.DataFrame, study: optuna.Study | None = None) -> dict[str, int]:
    """The trials by state; with ``study``, the plans of its space and those its bounds ruled
    out (``planner run --prune``), which are not trials."""
    complete = df[df["state"] == "COMPLETE"] if not df.empty else df
    feasible = int(complete["feasible"].astype(bool).sum()) if "feasible" in complete else 0
    counts = {"trials": len(df), "finished": len(complete), "feasible": feasible,
              "infeasible": len(complete) - feasible}
    results = (study.user_attrs.get(RESULTS) or {}) if study is not None else {}
    if results.get("plans"):
        counts = {"plans in the space": int(results["plans"]), **counts}
    if results.get("prune"):
        counts["ruled out by bounds (--prune)"] = int(results.get("pruned", 0))
    return counts


def build_report(study: optuna.Study, top: int = 10, storage: str = "") -> Report:
    """Gather the page's parts; a study with no feasible plan is a one-line error. ``storage``:
    the ``--storage`` option the page's commands carry ("" for the default storage)."""
    frame = trials_frame(study)
    best = best_frame(study, top, frame)
    if best.empty:
        counts = _counts(frame)
        if counts["finished"]:
            raise PlannerUsageError(
                f"study {study.study_name!r} has no feasible plan to report: none of its"
                f" {counted(counts['finished'], 'finished plan')} fits its HBM limit; raise the"
                " limit (hbm_gb, or --hbm-gb) or widen its space")
        raise PlannerUsageError(f"study {study.study_name!r} has no finished plan to report;"
                                " `planner run STUDY.yaml --resume` runs it")
    plans = plans_from_frame(study, best.head(1))
    figures = [
        ("Pareto front: step time against peak memory", pareto_figure(study)),
        (f"Step time of the {len(best)} best plans, by part", breakdown_figure(best, "plan")),
        (f"One step of the best plan ({plans[0].label}), as a timeline",
         timeline_figure(plans[0])),
    ]
    summary = dict(study.user_attrs.get("config") or {})
    plan = plans[0]
    waits = host_wait(plan.model, plan.system, plan.training, plan.strategy, plan.convention,
                      step_time=plan.estimate.step_time)
    decision = decide(study.study_name, frame, best, summary, storage,
                      refused=_refusals(plan, export_formats(summary)),
                      host=(waits, plan.system.device.host_kernel_s),
                      tp_overlap=_tp_overlap(plan),
                      wide=short_wide(micro_batches(plan.training, plan.strategy),
                                      plan.strategy.dp, plan.estimate.step_time),
                      device=plan.system.device.name, eager=_eager_ops(plan))
    return Report(study.study_name, summary, _counts(frame, study), best, figures, decision,
                  unfinished_note(study, storage))


def _tp_overlap(plan: Plan) -> float:
    """Seconds the plan's step would grow without Transformer Engine's tp overlap, where its
    estimate counts on it (:func:`simcore.megatron.stack.uses_tp_comm_overlap`); 0 otherwise."""
    if (plan.convention is not Convention.MEGATRON
            or not uses_tp_comm_overlap(plan.system, plan.training, plan.strategy)):
        return 0.0
    without = replace(plan.training, tp_comm_overlap=False)
    return (estimate(plan.model, plan.system, without, plan.strategy, plan.convention).step_time
            - plan.estimate.step_time)


_OPS = {"fused_norm": "norms", "rope_fusion": "rotary embedding", "swiglu_fusion": "SwiGLU"}
"""Each fusion switch's op, as the page names it."""


def _eager_ops(plan: Plan) -> tuple[float, tuple[str, ...]]:
    """Seconds the plan's step would shrink with the element-wise ops its training runs as
    PyTorch's fused, and those ops in words (:attr:`planner.report_decision.Decision.eager`)."""
    t = plan.training
    unfused = [f for f in elementwise_fusions(plan.model) if not getattr(t, f)]
    if not unfused:
        return 0.0, ()
    ops = tuple(f"its {_OPS[f]}" for f in unfused)
    fused = replace(t, **dict.fromkeys(unfused, True))
    step = estimate(plan.model, plan.system, fused, plan.strategy, plan.convention).step_time
    return max(0.0, plan.estimate.step_time - step), ops


def _inputs(report: Report) -> str:
    s = report.summary
    system = f"{s.get('system')} ({s.get('devices')} devices)"
    rows = [("model", s.get("model")), ("system", system),
            ("convention", s.get("convention")), ("global batch", s.get("global_batch")),
            ("sequence length", s.get("seq_len")),
            ("HBM limit", f"{s['hbm_gb']:g} GB" if s.get("hbm_gb") else "unlimited"),
            ("objectives", ", ".join(s.get("objectives", []))),
            ("sampler", f"{s.get('sampler')} (seed {s.get('seed')})"),
            ("study file", s.get("file"))]
    rows += [(k, f"{v:,}") for k, v in report.counts.items()]
    body = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                   for k, v in rows)
    space = "".join(
        f"<tr><th>{html.escape(knob)}</th><td>{html.escape(_values(values))}</td></tr>"
        for knob, values in (s.get("space") or {}).items())
    return f"<table>{body}</table><h3>Search space</h3><table>{space}</table>"


def _best_table(best: pd.DataFrame) -> str:
    """The best plans as an HTML table; plans equal in every figure but their placement are one
    row listing the others."""
    rows = []
    for i, (_, r) in enumerate(best.iterrows(), 1):
        others = list(r[PLACEMENTS])[1:] if PLACEMENTS in r.index else []
        same = ", ".join(others)
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
            i, r["plan"], f"{r['step_time_s']:.4g}", f"{r['tokens_per_s']:,.0f}",
            f"{r['mfu']:.1%}", f"{r['peak_memory_gb']:.1f}", same or "-", r["number"])) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("#", "plan", "step s", "tokens/s", "MFU",
                                            "peak GB", "same figures with placement", "trial"))
    note = mfu_note(best)
    caption = f"<p>{html.escape(note)}</p>" if note else ""
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>{caption}"


def _values(values: object) -> str:
    return ", ".join(map(str, values)) if isinstance(values, list) else str(values)


def report_html(report: Report) -> str:
    title = html.escape(report.study)
    head = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}: Parallel Planner"
            f" report</title><style>{_STYLE}</style></head><body>")
    made = f"<p>Made by Parallel Planner on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.</p>"
    parts = [head, f"<h1>Study {title}</h1>", made]
    if report.unfinished:  # the page outlives the terminal that said so
        note = report.unfinished.removeprefix("warning: ")
        parts.append(f"<p class='unfinished'><strong>Unfinished:</strong> {html.escape(note)}</p>")
    parts += ["<h2>Recommendation</h2>", decision_html(report.decision),
             "<h2>Inputs</h2>", _inputs(report),
             "<h2>Best plans</h2>", _best_table(report.best)]
    for i, (title, fig) in enumerate(report.figures):
        div = figure_html(fig, full_html=False, include_plotlyjs=(i == 0))
        parts += [f"<h2>{html.escape(title)}</h2>", f"<div class='figure'>{div}</div>"]
    parts.append("</body></html>")
    return "\n".join(parts)
