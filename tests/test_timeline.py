"""The step timeline: pipeline schedules against Narayanan's closed forms and a plain event
loop, plans' timelines against their estimates, the figure, and `planner show`."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from planner.catalog import load_catalog
from planner.cli import main
from planner.plan import make_plan
from simcore import estimate, step_timeline
from simcore.megatron.phases import stage_phases
from simcore.specs import (
    Convention,
    Recompute,
    Schedule,
    Strategy,
    TrainingSpec,
    ZeroStage,
)
from simcore.timeline import PHASES, schedule_pipeline, stage_order
from tests.study_files import lab_study

CATALOG = load_catalog()
LLAMA = CATALOG.model("llama70b")
LAB = CATALOG.system("lab-system1")  # 64 devices
GPIPE, ONE_F_ONE_B, INTERLEAVED = Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED


def equal_stages(schedule: Schedule, p: int, m: int, v: int, f: float, b: float):
    """Every stage's forward f and backward b per micro-batch, f/v and b/v per chunk."""
    return schedule_pipeline(schedule, np.full((p, v), f / v), np.full((p, v), b / v), m)


# -- closed forms (Narayanan et al. 2021, arXiv:2104.04473, section 2.2) ------------------------
@pytest.mark.parametrize("schedule, v, expected", [
    # GPipe and 1F1B: (m + p - 1)(f + b) = (8 + 4 - 1)(1 + 2) = 11 * 3 = 33
    (GPIPE, 1, 33.0),
    (ONE_F_ONE_B, 1, 33.0),
    # interleaved, v = 2 (section 2.2.1): (m + (p - 1)/v)(f + b) = (8 + 3/2) * 3 = 28.5
    (INTERLEAVED, 2, 28.5),
])
def test_makespan_of_equal_stages_p4_m8_f1_b2(schedule, v, expected) -> None:
    ops = equal_stages(schedule, 4, 8, v, 1.0, 2.0)
    assert ops.makespan == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("p, m, v", [(2, 2, 2), (4, 4, 2), (4, 12, 3), (8, 16, 2), (8, 64, 4),
                                     (16, 32, 2)])
def test_interleaved_bubble_is_divided_by_v(p, m, v) -> None:
    # m a multiple of p: (m + (p - 1)/v)(f + b), with f = 1.5 and b = 2.5 (any f, b)
    ops = equal_stages(INTERLEAVED, p, m, v, 1.5, 2.5)
    assert ops.makespan == pytest.approx((m + (p - 1) / v) * 4.0, rel=1e-12)


@pytest.mark.parametrize("p, m", [(1, 5), (3, 1), (4, 2), (8, 8), (5, 17)])
def test_gpipe_and_1f1b_bubble_for_any_m(p, m) -> None:
    for schedule in (GPIPE, ONE_F_ONE_B):
        assert equal_stages(schedule, p, m, 1, 1.0, 2.0).makespan == pytest.approx(
            (m + p - 1) * 3.0)


# -- the order of ops on a stage ----------------------------------------------------------------
@pytest.mark.parametrize("p, m", [(4, 8), (4, 2), (1, 3), (8, 8)])
def test_1f1b_order_warm_up_steady_cool_down(p, m) -> None:
    for i in range(p):
        order = stage_order(ONE_F_ONE_B, i, p, m)
        w = min(p - i - 1, m)  # warm-up forwards on stage i
        assert order.warmup == w
        kinds = "".join("B" if b else "F" for b in order.backward)
        assert kinds == "F" * w + "FB" * (m - w) + "B" * w
        # micro-batches in order, forwards and backwards alike
        assert list(order.micro_batch[~order.backward]) == list(range(m))
        assert list(order.micro_batch[order.backward]) == list(range(m))


def test_gpipe_order() -> None:
    order = stage_order(GPIPE, 1, 4, 3)
    assert list(order.backward) == [False] * 3 + [True] * 3
    assert list(order.micro_batch) == [0, 1, 2, 0, 1, 2]


def test_interleaved_order_is_megatrons() -> None:
    # p = 2, m = 4, v = 2: Megatron-LM's table (groups of p micro-batches through each chunk):
    # forwards (micro-batch, chunk) 00 10 01 11 20 30 21 31; backwards the same, chunks reversed.
    # Stage 0 warms up with 2 (p - 1) + (v - 1) p = 4 forwards, stage 1 with 2.
    order = stage_order(INTERLEAVED, 0, 2, 4, 2)
    got = [("B" if b else "F") + f"{j}{c}" for b, j, c in
           zip(order.backward, order.micro_batch, order.chunk)]
    assert got == ["F00", "F10", "F01", "F11",
                   "F20", "B01", "F30", "B11", "F21", "B00", "F31", "B10",
                   "B21", "B31", "B20", "B30"]
    assert stage_order(INTERLEAVED, 1, 2, 4, 2).warmup == 2


# -- the schedule against a plain event loop ----------------------------------------------------
def _reference(schedule: Schedule, forward: np.ndarray, backward: np.ndarray, m: int) -> dict:
    """Ends by a one-op-at-a-time event loop: an op runs when its stage is free and its input
    has arrived (the definition the vectorized fixed point must reproduce)."""
    p, v = forward.shape
    orders = [stage_order(schedule, i, p, m, v) for i in range(p)]
    ends: dict[tuple[int, bool, int, int], float] = {}
    free, pos, n = [0.0] * p, [0] * p, 2 * m * v

    def needs(i: int, bwd: bool, c: int, j: int) -> tuple | None:
        if not bwd:
            return (i - 1, False, c, j) if i else ((p - 1, False, c - 1, j) if c else None)
        if i < p - 1:
            return (i + 1, True, c, j)
        return (0, True, c + 1, j) if c < v - 1 else (i, False, c, j)

    while any(k < n for k in pos):
        moved = False
        for i in range(p):
            while pos[i] < n:
                o, k = orders[i], pos[i]
                key = (i, bool(o.backward[k]), int(o.chunk[k]), int(o.micro_batch[k]))
                need = needs(*key)
                if need is not None and need not in ends:
                    break
                start = max(free[i], ends[need] if need else 0.0)
                time_ = (backward if key[1] else forward)[i, key[2]]
                ends[key] = free[i] = start + time_
                pos[i] += 1
                moved = True
        assert moved, "deadlock"
    return ends


@pytest.mark.parametrize("schedule, p, m, v", [
    (GPIPE, 4, 6, 1), (ONE_F_ONE_B, 5, 7, 1), (ONE_F_ONE_B, 4, 2, 1),
    (INTERLEAVED, 4, 8, 2), (INTERLEAVED, 3, 9, 3), (INTERLEAVED, 2, 6, 4),
])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_unequal_stages_match_an_event_loop(schedule, p, m, v, seed) -> None:
    rng = np.random.default_rng(seed)
    forward = rng.uniform(0.2, 2.0, (p, v))
    backward = rng.uniform(0.4, 4.0, (p, v))
    ops = schedule_pipeline(schedule, forward, backward, m)
    ref = _reference(schedule, forward, backward, m)
    assert len(ref) == ops.end.size == 2 * p * m * v  # every op exactly once, no deadlock
    for i in range(p):
        for k in range(ops.end.shape[1]):
            key = (i, bool(ops.backward[i, k]), int(ops.chunk[i, k]), int(ops.micro_batch[i, k]))
            assert ops.end[i, k] == pytest.approx(ref[key], rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("schedule, v", [(GPIPE, 1), (ONE_F_ONE_B, 1), (INTERLEAVED, 2)])
def test_no_overlap_on_a_stage_and_dependencies_hold(schedule, v) -> None:
    p, m, eps = 4, 8, 1e-9
    rng = np.random.default_rng(7)
    ops = schedule_pipeline(schedule, rng.uniform(0.5, 1.5, (p, v)),
                            rng.uniform(1.0, 3.0, (p, v)), m)
    assert (ops.start[:, 1:] >= ops.end[:, :-1] - eps).all()  # one op at a time per stage
    end = {(i, bool(b), int(c), int(j)): e for i in range(p)
           for b, c, j, e in zip(ops.backward[i], ops.chunk[i], ops.micro_batch[i], ops.end[i])}
    start = {(i, bool(b), int(c), int(j)): s for i in range(p)
             for b, c, j, s in zip(ops.backward[i], ops.chunk[i], ops.micro_batch[i],
                                   ops.start[i])}
    for (i, bwd, c, j), s in start.items():
        if bwd:
            assert s >= end[(i, False, c, j)] - eps  # each backward after its own forward
            if i < p - 1:
                assert s >= end[(i + 1, True, c, j)] - eps  # and the next stage's backward
        elif i > 0:
            assert s >= end[(i - 1, False, c, j)] - eps  # a forward after the previous stage's


def test_large_schedule_is_fast() -> None:
    # p = 16, m = 512, v = 2: 32,768 ops; equal stages but the last (LM head), as plans have them
    forward, backward = np.full((16, 2), 1.0), np.full((16, 2), 2.0)
    forward[-1, -1], backward[-1, -1] = 1.2, 2.4
    begin = time.perf_counter()
    ops = schedule_pipeline(INTERLEAVED, forward, backward, 512)
    assert time.perf_counter() - begin < 1.0
    assert ops.end.size == 2 * 16 * 512 * 2


# -- plans: the timeline against the estimate ---------------------------------------------------
def _timeline(gb: int, strategy: Strategy):
    training = TrainingSpec(global_batch=gb, seq_len=1024)
    est = estimate(LLAMA, LAB, training, strategy)
    return est, step_timeline(LLAMA, LAB, training, strategy, estimate=est)


PLANS = [
    Strategy(dp=8, tp=8),
    Strategy(dp=2, tp=4, pp=8),
    Strategy(dp=2, tp=4, pp=8, schedule=GPIPE, recompute=Recompute.FULL),
    Strategy(dp=2, tp=1, pp=8, sp=4, sequence_parallel=False),
    Strategy(dp=4, tp=2, pp=8, zero=ZeroStage.PARAMETERS),
    Strategy(dp=2, tp=4, pp=8, schedule=INTERLEAVED, v=2, recompute=Recompute.SELECTIVE),
]


@pytest.mark.parametrize("strategy", PLANS, ids=lambda s: f"{s.schedule}-pp{s.pp}-tp{s.tp}")
def test_stage_phases_add_up_to_the_estimate(strategy) -> None:
    training = TrainingSpec(global_batch=64, seq_len=1024)
    est = estimate(LLAMA, LAB, training, strategy)
    phases = stage_phases(LLAMA, LAB, training, strategy)
    assert len(phases) == strategy.pp
    for st, ref in zip(phases, est.stages):
        assert len(st.forward) == len(st.backward) == strategy.v
        assert st.micro_batch_time == pytest.approx(ref.micro_batch_time, rel=1e-12)
    assert max(st.dp_exposed for st in phases) == pytest.approx(est.time.dp, rel=1e-12)
    assert max(st.optimizer for st in phases) == pytest.approx(est.time.optimizer, rel=1e-12)


def test_one_stage_timeline_ends_at_the_step_time() -> None:
    # pp = 1: no bubble, m (f + b) + dp exposed + optimizer, exactly the estimate
    est, tl = _timeline(512, Strategy(dp=8, tp=8))
    assert tl.end == pytest.approx(est.step_time, rel=1e-12)
    assert tl.bubble == pytest.approx(0.0, abs=1e-9 * est.step_time)


def test_one_stage_bubble_is_zero_not_rounding() -> None:
    # Issue 19: `planner show` titled this plan "bubble -1.78e-12 ms". One stage has no bubble:
    # the schedule's end (a running sum of m = 512 / 16 = 32 micro-batches' op times) equals
    # m * t up to the last bits, so the bubble must be exactly 0 and never negative.
    from planner.plots.timeline import timeline_figure

    strategy = Strategy(dp=16, tp=4)
    _, tl = _timeline(512, strategy)
    assert tl.micro_batches == 32
    assert tl.bubble == 0.0
    assert "; bubble 0 ms" in timeline_figure(_plan(512, strategy)).layout.title.text


@pytest.mark.parametrize("strategy", PLANS[1:5], ids=lambda s: f"{s.schedule}-sp{s.sp}-z{s.zero}")
def test_gpipe_and_1f1b_timelines_end_at_the_step_time(strategy) -> None:
    # Stages are equal but the first (embedding) and the last (LM head, the slowest): the last
    # stage runs its m micro-batches back to back after the others' forwards and before their
    # backwards, sum_others (f + b) + m t_last = m max + (sum - max), the estimate's form.
    est, tl = _timeline(64, strategy)
    assert tl.end == pytest.approx(est.step_time, rel=1e-12)
    assert tl.bubble == pytest.approx(est.time.bubble, rel=1e-9)


def test_interleaved_timeline_is_within_the_stage_spread_of_the_estimate() -> None:
    # With unequal stages the interleaved closed form m max + (sum - max)/v is an approximation;
    # the schedule ends within one micro-batch's spread between the slowest and fastest stage.
    est, tl = _timeline(64, PLANS[5])
    times = [st.micro_batch_time for st in est.stages]
    assert abs(tl.end - est.step_time) <= max(times) - min(times)
    assert tl.end != est.step_time  # really scheduled, not copied from the estimate


def test_timeline_spans_tile_each_stage_and_name_their_phase() -> None:
    _, tl = _timeline(64, PLANS[1])
    m, p = tl.micro_batches, tl.pp
    phases = np.array(tl.phase_names)
    for name in ("forward", "backward"):
        assert (phases == name).sum() == m * p  # one span per micro-batch per stage
    assert set(phases) <= set(PHASES) and {"tp", "p2p", "optimizer"} <= set(phases)
    for row in range(len(tl.rows)):  # spans of one row never overlap
        mine = tl.row == row
        start, end = tl.start[mine], tl.start[mine] + tl.duration[mine]
        order = np.argsort(start)
        assert (start[order][1:] >= end[order][:-1] - 1e-12).all()
    assert tl.rows[0] == "stage 0" and tl.rows[-1] == "optimizer"


def test_mlp_timeline_has_equal_stages_and_ends_at_the_step_time() -> None:
    mlp, system = CATALOG.model("distir-mlp"), CATALOG.system("distir-16")
    training = TrainingSpec(global_batch=8192, seq_len=1)
    for schedule in (GPIPE, ONE_F_ONE_B):
        strategy = Strategy(dp=2, tp=2, pp=4, micro_batch=512, schedule=schedule)
        est = estimate(mlp, system, training, strategy)
        tl = step_timeline(mlp, system, training, strategy)
        assert tl.convention == "mlp" and tl.micro_batches == 8
        assert tl.end == pytest.approx(est.step_time, rel=1e-12)


def test_stage_timeline_is_the_estimates_two_totals() -> None:
    model, system = CATALOG.model("stage-1024x4"), CATALOG.system("R4S2")
    training, strategy = TrainingSpec(global_batch=64, seq_len=1024), Strategy(dp=4, pp=2)
    est = estimate(model, system, training, strategy)
    tl = step_timeline(model, system, training, strategy, estimate=est)
    assert tl.convention == "stage" and tl.end == pytest.approx(est.step_time)
    assert set(tl.phase_names) <= {"compute", "comm"} and "no micro-batches" in tl.note


# -- the figure ---------------------------------------------------------------------------------
def _plan(gb: int, strategy: Strategy):
    return make_plan(LLAMA, LAB, TrainingSpec(global_batch=gb, seq_len=1024), strategy,
                     Convention.MEGATRON, study="demo", trial=3)


def test_figure_draws_every_span_with_hover() -> None:
    from planner.plots.timeline import timeline_figure

    plan = _plan(32, PLANS[5])
    fig = timeline_figure(plan)
    tl = step_timeline(plan.model, plan.system, plan.training, plan.strategy,
                       estimate=plan.estimate)
    assert sum(len(trace.x) for trace in fig.data) == tl.spans
    names = {trace.name for trace in fig.data}
    assert {"forward, chunk 0", "backward, chunk 1", "tp", "optimizer"} <= names
    forward = next(t for t in fig.data if t.name == "forward, chunk 0")
    assert "micro-batch" in forward.hovertemplate and "stage" in forward.hovertemplate
    assert "demo trial 3" in fig.layout.title.text and "estimate" in fig.layout.title.text


PLOTLY_LEGEND_ROW_PX = 19
"""About the height of one plotly legend entry at its default 12 px font."""


def test_figure_of_an_interleaved_plan_has_room_for_every_legend_entry() -> None:
    from planner.plots.timeline import timeline_figure

    plan = _plan(32, Strategy(dp=4, tp=8, pp=2, schedule=INTERLEAVED, v=8))
    fig = timeline_figure(plan)
    entries = [t.name for t in fig.data if t.showlegend is not False]
    assert {f"forward, chunk {c}" for c in range(8)} <= set(entries)
    layout = fig.layout
    # A vertical legend beside the plot may be as tall as the plot area, no taller (plotly's
    # legend.maxheight); the rows alone would leave about half that room.
    assert layout.legend.orientation in (None, "v")
    plot_area = layout.height - layout.margin.t - layout.margin.b
    assert plot_area >= PLOTLY_LEGEND_ROW_PX * len(entries)


def _hover_value(trace, i: int, label: str) -> float:
    """The number the hover of bar ``i`` prints after ``label``, as plotly fills it in: a
    ``customdata[k]`` field is that column; ``x`` on a bar drawn from a ``base`` is where the
    bar ends, base + x (plotly's hover gives the bar's end, not its length)."""
    field = re.search(label + r" %\{([a-z]+)(?:\[(\d+)\])?[:}]", trace.hovertemplate)
    assert field is not None, trace.hovertemplate
    if field.group(1) == "customdata":
        return float(trace.customdata[i][int(field.group(2))])
    assert field.group(1) == "x"
    return float(trace.base[i] + trace.x[i])


def test_figure_hover_duration_is_the_spans_own_duration() -> None:
    # Issue 19: the hover printed start + duration. pp = 8: stage 1's first forward starts once
    # stage 0 has sent its activations, so it does not start at 0.
    from planner.plots.timeline import timeline_figure

    plan = _plan(64, PLANS[1])
    fig = timeline_figure(plan)
    tl = step_timeline(plan.model, plan.system, plan.training, plan.strategy,
                       estimate=plan.estimate)
    forward = next(t for t in fig.data if t.name == "forward")
    i = int(np.flatnonzero(np.asarray(forward.base) > 0)[0])
    row = int(forward.y[i])  # the row index (tick labels are tl.rows)
    span = np.flatnonzero((tl.row == row) & np.isclose(tl.start * 1e3, forward.base[i]))
    assert len(span) == 1
    expected = tl.duration[span[0]] * 1e3  # that span's own duration, in ms
    assert forward.base[i] > 0
    assert _hover_value(forward, i, "duration") == pytest.approx(expected, rel=1e-12)


def test_figure_of_a_huge_step_merges_the_steady_state(monkeypatch) -> None:
    import planner.plots.timeline as timeline_plot

    monkeypatch.setattr(timeline_plot, "MAX_BARS", 400)
    fig = timeline_plot.timeline_figure(_plan(256, PLANS[1]))
    bars = sum(len(trace.x) for trace in fig.data)
    assert bars <= 400 + 2 * 8 + 2  # the detail, and one merged bar per row
    assert "steady state (merged)" in {trace.name for trace in fig.data}
    assert "merged into one bar per row" in fig.layout.title.text


# -- planner show -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def journal(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("show")
    path = folder / "studies.journal"
    assert main(["run", str(lab_study(folder)), "--storage", str(path), "--quiet"]) == 0
    return str(path)


def test_show_writes_an_html_timeline(tmp_path, journal, capsys) -> None:
    out = tmp_path / "t.html"
    assert main(["show", "lab", "--plan", "1", "--out", str(out), "--storage", journal]) == 0
    assert "plotly" in out.read_text() and str(out) in capsys.readouterr().out


def test_show_default_output(tmp_path, journal, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["show", "lab", "--plan", "2", "--storage", journal]) == 0
    assert (tmp_path / "planner-results" / "lab-plan-2-timeline.html").is_file()
    assert "planner-results/lab-plan-2-timeline.html" in capsys.readouterr().out


@pytest.mark.parametrize("args, words", [
    (["lab", "--plan", "0"], "--plan"),
    (["lab", "--plan", "999"], "999"),
    (["nope"], "no study named 'nope'"),
    (["lab", "--out", "{tmp}/missing/t.html"], "does not exist"),
    (["lab", "--out", "{tmp}/t.svg"], "svg"),
])
def test_show_bad_input_is_one_line_exit_2_and_no_file(tmp_path, journal, capsys, args,
                                                       words) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "t.html")]
    assert main(["show", *args, "--storage", journal]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and "Traceback" not in err
    assert list(tmp_path.rglob("*")) == []
