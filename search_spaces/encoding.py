"""A strategy as Optuna parameters, and back.

The degrees are one categorical parameter, ``layout``, over the (dp, tp, pp, sp) layouts that
have at least one valid strategy: every sampled layout multiplies to the device count and
divides the shapes, so no trial is spent on an impossible product (``../shared/optuna-notes.md``
section 3 found this encoding best on 64 devices and, with multivariate TPE, close to fixed
per-degree ranges on 1,024). The other knobs are one categorical each, with fixed choices (Optuna
needs the same choices on every trial). A combination that breaks a rule tying a knob to the
layout (micro-batches that do not tile the batch, an interleaved schedule whose micro-batch
count is not a multiple of pp) is mapped to the valid strategy of the same layout that changes
the fewest knobs, so every trial runs a valid plan; the trial keeps what was sampled in its
parameters and what ran in its attributes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from functools import cache, cached_property
from typing import TYPE_CHECKING, Any

from search_spaces.space import Layout, PipelineChoice, StrategySpace
from simcore.layout import format_layout
from simcore.specs import Axis, Precision, Strategy

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution

__all__ = ["LayoutEncoding", "strategy_label"]


# The label's pieces, each computed once per distinct value: a million-plan study labels every
# plan (issue 17), and building a Layout, a PipelineChoice or a default Strategy per plan cost
# more than half of it.
@cache
def _placement_label(p: tuple[Axis, ...]) -> str:
    return ",".join(a.value for a in p)


@cache
def _pipeline_text(schedule: Any, v: int) -> str:
    return PipelineChoice(schedule, v).label


@cache
def _layout_text(dp: int, tp: int, pp: int, sp: int) -> str:
    return Layout(dp, tp, pp, sp).label


@cache
def _knobs_text(recompute: Any, zero: Any) -> str:
    return f"{recompute.value} zero{int(zero)}"


_DEFAULT_PLACEMENT = Strategy().placement


def _pipeline_label(s: Strategy) -> str:
    return _pipeline_text(s.schedule, s.v)


def _layout_label(s: Strategy) -> str:
    return _layout_text(s.dp, s.tp, s.pp, s.sp)


def strategy_label(s: Strategy) -> str:
    """One line naming every knob, e.g. ``dp8-tp8-pp16-sp1 mb1 interleaved-v5 selective zero1``
    (``first7 last7``: uneven pipeline stages; ``shard16``: HSDP shard group; ``ep8 etp1``:
    expert parallelism; ``full-of4``: four layers of each stage or chunk recompute;
    ``offload40``: forty layers offload their activations)."""
    parts = [_layout_text(s.dp, s.tp, s.pp, s.sp), f"mb{s.micro_batch}",
             _pipeline_text(s.schedule, s.v), _knobs_text(s.recompute, s.zero)]
    if s.recompute_layers is not None:
        parts[-1] = parts[-1].replace("full", f"full-of{s.recompute_layers}", 1)
    if s.offload_layers is not None:
        parts.append(f"offload{s.offload_layers}")
    if not s.sequence_parallel:
        parts.append("no-seqpar")
    if s.precision is not Precision.BF16:
        parts.append(s.precision.value)
    if s.first_stage_layers is not None:
        parts.append(f"first{s.first_stage_layers}")
    if s.last_stage_layers is not None:
        parts.append(f"last{s.last_stage_layers}")
    if s.layout is not None:
        parts.append("layout=" + format_layout(s.layout))
    if s.shard_group is not None:
        parts.append(f"shard{s.shard_group}")
    if s.ep > 1:
        parts.append(f"ep{s.ep}")
    if s.etp is not None:
        parts.append(f"etp{s.etp}")
    if s.ep_overlap:
        parts.append("ep-overlap")
    if s.ep_dedup:
        parts.append("ep-dedup")
    if s.placement != _DEFAULT_PLACEMENT:
        parts.append("placement=" + _placement_label(s.placement))
    return " ".join(parts)


def _shortness(s: Strategy, layers: int) -> int:
    """The space's ``uneven``: how many layers fewer the first stage holds than the next."""
    if not s.uneven:
        return 0
    counts = s.stage_layers(layers)
    return counts[1] - counts[0]


class LayoutEncoding:
    """The parameters of a :class:`StrategySpace` as Optuna categoricals."""

    def __init__(self, space: StrategySpace) -> None:
        self.space = space

    @cached_property
    def _by_layout(self) -> dict[str, list[Strategy]]:
        groups: dict[str, list[Strategy]] = defaultdict(list)
        for s in self.space.valid:
            groups[_layout_label(s)].append(s)
        return dict(groups)

    @cached_property
    def _choices(self) -> dict[str, list[Any]]:
        """Each parameter's choices; knobs with one allowed value are not parameters."""
        sp = self.space
        knobs: dict[str, list[Any]] = {
            "layout": [x.label for x in sp.valid_layouts()],
            "zero": [int(z) for z in sp.zero],
            "recompute": [r.value for r in sp.recompute],
            "micro_batch": list(sp.micro_batch),
            "pipeline": [p.label for p in sp.pipelines()],
            "placement": [_placement_label(p) for p in sp.placement],
            "sequence_parallel": list(sp.sequence_parallel),
            "precision": [p.value for p in sp.precision],
            "uneven": list(sp.uneven),
            "shard_group": list(sp.shard_group),
            "ep": list(sp.ep),
            "etp": [0 if e is None else e for e in sp.etp],
            "ep_overlap": list(sp.ep_overlap),
            "ep_dedup": list(sp.ep_dedup),
            "recompute_layers": list(sp.recompute_layers),
            "offload_layers": list(sp.offload_layers),
        }
        return {k: v for k, v in knobs.items() if len(v) > 1}

    @cached_property
    def distributions(self) -> dict[str, BaseDistribution]:
        from optuna.distributions import CategoricalDistribution

        return {k: CategoricalDistribution(v) for k, v in self._choices.items()}

    def params(self, s: Strategy) -> dict[str, Any]:
        """The parameters that name ``s`` (for trials recorded without sampling)."""
        full = {"layout": _layout_label(s), "zero": int(s.zero), "recompute": s.recompute.value,
                "micro_batch": s.micro_batch, "pipeline": _pipeline_label(s),
                "placement": _placement_label(s.placement),
                "sequence_parallel": s.sequence_parallel, "precision": s.precision.value}
        if "uneven" in self._choices:
            full["uneven"] = _shortness(s, self.space.model.layers)
        if "shard_group" in self._choices:
            full["shard_group"] = s.shard_group or 0
        if "ep" in self._choices:
            full["ep"] = s.ep
        if "etp" in self._choices:
            full["etp"] = s.etp or 0  # 0: the plan's tp
        if "ep_overlap" in self._choices:
            full["ep_overlap"] = s.ep_overlap
        if "ep_dedup" in self._choices:
            full["ep_dedup"] = s.ep_dedup
        if "recompute_layers" in self._choices:
            full["recompute_layers"] = s.recompute_layers or 0
        if "offload_layers" in self._choices:
            full["offload_layers"] = s.offload_layers or 0
        return {k: full[k] for k in self._choices}

    def suggest(self, trial: optuna.Trial) -> Strategy:
        """Sample a valid strategy: one categorical per knob, then the nearest valid plan."""
        if not self._by_layout:
            raise ValueError("the space has no valid strategy")
        picked = {k: trial.suggest_categorical(k, v) for k, v in self._choices.items()}
        return self.nearest(picked)

    def nearest(self, params: Mapping[str, Any]) -> Strategy:
        """The valid strategy of ``params['layout']`` that differs from ``params`` in the fewest
        knobs (ties: the earlier in the space's order)."""
        layout = params.get("layout", next(iter(self._by_layout)))
        group = self._by_layout[layout]
        best, best_diff = group[0], None
        for s in group:
            mine = self.params(s)
            diff = sum(mine[k] != v for k, v in params.items() if k in mine)
            if best_diff is None or diff < best_diff:
                best, best_diff = s, diff
                if diff == 0:
                    break
        return best

