"""A mixed-cluster plan read from the label ``planner mixed`` prints in its ``plan`` column::

    v100:tp1dp4x3[5,7,6] > t4:tp1dp4x1[6] m8 none

Runs of stages in pipeline order, ``>`` between them: a group of the system (or groups joined
by ``+``, a stage whose ranks continue from one group into the next: ``v100+t4:tp1dp8x1[11]``),
its stages' tp and dp, how many stages and each one's transformer layers; then the micro-batches
of a step, the recompute and, when set, ``zero1`` to ``zero3``
(:meth:`simcore.mixed.MixedPlan.label` writes it). The recompute may be left off (none). A layer
list is whole numbers and commas, no spaces.
"""

from __future__ import annotations

import re

from simcore.mixed import MixedPlan, MixedStage, MixedSystemSpec
from simcore.specs import Recompute, Schedule, ZeroStage

__all__ = ["parse_mixed_plan"]

_RUN = re.compile(r"\s*([\w.-]+(?:\+[\w.-]+)*):tp(\d+)dp(\d+)x(\d+)\[(\d+(?:,\d+)*)\]\s*",
                  re.ASCII)
_TAIL = re.compile(r"\s+m(\d+)(?:\s+(none|selective|full))?(?:\s+zero([0-3]))?\s*", re.ASCII)
_FORM = "GROUP:tpTdpDxN[L,L,...] > ... mM [none|selective|full] [zeroZ]"


def parse_mixed_plan(text: str, system: MixedSystemSpec, *,
                     schedule: Schedule = Schedule.ONE_F_ONE_B) -> MixedPlan:
    """The plan ``text`` names on ``system``; ValueError (one line, naming what to fix) if it
    is not of that form or names a group the system does not have."""
    groups = {g.name: i for i, g in enumerate(system.groups)}
    stages: list[MixedStage] = []
    rest = text.strip()
    while True:
        run = _RUN.match(rest)
        if run is None:
            raise ValueError(f"{_shown(text)} is not a plan as `planner mixed` prints it:"
                             f" {_FORM}")
        names, tp, dp, count, layers = run.groups()
        spanned = names.split("+")
        for name in spanned:
            if name not in groups:
                raise ValueError(f"group {name!r} is not one of {system.name}'s:"
                                 f" {', '.join(groups)}")
        if len(set(spanned)) != len(spanned):
            raise ValueError(f"{names}: a stage spans each group once; name each group once")
        first, *span = (groups[name] for name in spanned)
        split = [int(n) for n in layers.split(",")]
        if len(split) != int(count):
            raise ValueError(f"{names}:tp{tp}dp{dp}x{count} lists {len(split)} stages' layers,"
                             f" not {count}")
        stages += [MixedStage(group=first, tp=int(tp), dp=int(dp), layers=n, span=tuple(span))
                   for n in split]
        rest = rest[run.end():]
        if not rest.startswith(">"):
            break
        rest = rest[1:]
    tail = _TAIL.fullmatch(" " + rest)
    if tail is None:
        after = _shown(rest) if rest.strip() else "nothing"
        raise ValueError(f"{after} after the stages: give mM (the"
                         " micro-batches of a step), then [none|selective|full] [zeroZ], as"
                         " `planner mixed` prints them")
    m, recompute, zero = tail.groups()
    return MixedPlan(stages=tuple(stages), micro_batches=int(m),
                     recompute=Recompute(recompute or "none"),
                     zero=ZeroStage(int(zero)) if zero else ZeroStage.NONE, schedule=schedule)


def _shown(text: str) -> str:
    """``text`` quoted for a message, cut to 80 characters."""
    text = text.strip()
    return repr(text if len(text) <= 80 else text[:77] + "...")
