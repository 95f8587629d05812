"""Megatron-LM's pipeline layout string (``--pipeline-model-parallel-layout``): the layers of
every virtual pipeline stage, written out.

``"Et*2|(t*2|)*34,t*3|(t*2|)*3,tL"`` (Megatron-Bridge's Llama-3-70B H100 FP8 recipe) reads: a
stage of the embedding and two transformer layers, 34 stages of two, one of three, three of two,
and one of a layer and the loss: 40 virtual stages, so pp 8 gives v 5. ``E`` is the embedding,
``t`` a transformer layer, ``L`` the loss (with the LM head), ``|`` ends a stage, ``x*n`` and
``(...)*n`` repeat, commas are cosmetic (``megatron/core/transformer/
pipeline_parallel_layer_layout.py`` ``parse_str_to_list``, d98e8a64). Virtual stage ``i`` runs on
pipeline rank ``i % pp`` as its model chunk ``i // pp``. Megatron requires the embedding first
and the loss last, each once.

The planner keeps a layout as its transformer layers per virtual stage
(:attr:`simcore.specs.Strategy.layout`); MTP layers (``m``) are not modelled.
"""

from __future__ import annotations

import re

__all__ = ["format_layout", "layout_chunks", "parse_layout"]

_GROUP = re.compile(r"\(([^)]+)\)\*(\d+)")
_REPEAT = re.compile(r"(.)\*(\d+)")


def parse_layout(text: str) -> tuple[int, ...]:
    """Transformer layers per virtual stage of a Megatron layout string; a ValueError of one
    line when it is not one the planner can run."""
    flat = _REPEAT.sub(lambda x: x.group(1) * int(x.group(2)),
                       _GROUP.sub(lambda x: x.group(1) * int(x.group(2)), text.replace(",", "")))
    stages = flat.split("|")
    bad = set(flat) - set("EtL|")
    if bad:
        raise ValueError(
            f"pipeline layout {text!r}: {''.join(sorted(bad))!r} is not a layer the planner"
            " models; use E (embedding), t (transformer layer), L (loss), | between stages")
    if flat.count("E") != 1 or flat.count("L") != 1 or not (
            stages[0].startswith("E") and stages[-1].endswith("L")):
        raise ValueError(f"pipeline layout {text!r}: the embedding E must open the first stage"
                         " and the loss L close the last, each once (Megatron's rule)")
    return tuple(stage.count("t") for stage in stages)


def layout_chunks(layout: tuple[int, ...], pp: int) -> int | None:
    """The model chunks per rank (v) a layout of ``pp`` ranks gives: its virtual stages / pp;
    None when they do not divide (the strategy's check then says so in one line)."""
    if pp >= 1 and len(layout) % pp == 0:
        return len(layout) // pp
    return None


def format_layout(counts: tuple[int, ...]) -> str:
    """The layout string of transformer layers per virtual stage, the embedding in the first
    and the loss in the last, runs of equal stages as ``(...|)*n``: ``(2, 2, 2, 3, 1)`` gives
    ``"Et*2|(t*2|)*2,t*3|tL"``."""
    def layers(n: int) -> str:
        return "" if n == 0 else "t" if n == 1 else f"t*{n}"

    stages = [layers(n) for n in counts]
    stages[0] = "E" + stages[0]
    stages[-1] = stages[-1] + "L"
    parts: list[str] = []
    i = 0
    while i < len(stages) - 1:  # every stage but the last ends with "|"
        j = i
        while j < len(stages) - 1 and stages[j] == stages[i]:
            j += 1
        parts.append(f"{stages[i]}|" if j - i == 1 else f"({stages[i]}|)*{j - i}")
        i = j
    parts.append(stages[-1])
    # a comma after each repeated group, as Megatron's examples write it (commas are cosmetic)
    return "".join(p + ("," if p.startswith("(") and k < len(parts) - 1 else "")
                   for k, p in enumerate(parts))
