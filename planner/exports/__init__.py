"""Exports of a plan: the plan file, and the launch settings of the frameworks that run it.

Each exporter takes a :class:`planner.plan.Plan` and returns the files to write, as
``{relative file name: text}``; ``planner export`` writes them under one folder per plan.

- ``plan``: the plan as YAML and JSON (:mod:`planner.plan`); ``planner estimate --plan FILE``
  reads either back.
- ``megatron``: Megatron-LM's ``pretrain_gpt.py`` arguments.
- ``deepspeed``: a DeepSpeed config JSON.
- ``torchtitan``: torchtitan's TOML job file (v0.2.2 and earlier) and its Python
  ``Trainer.Config`` form.
- ``astra-sim``: the STAGE command line and ASTRA-sim's ``system.json``, ``network.yml`` and
  ``remote_memory.json``.
- ``chakra``: the step as Chakra traces (one binary ``.et`` file per NPU), ASTRA-sim's
  communicator groups and input files, and the command that runs them; no STAGE needed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from planner.errors import PlannerUsageError
from planner.plan import Plan

if TYPE_CHECKING:
    from planner.chakra.io import TraceProgress

__all__ = ["EXPORTERS", "WITH_PROGRESS", "export_files", "exporter", "runnable_files"]

Exporter = Callable[[Plan], dict[str, str | bytes]]

EXPORTERS: dict[str, str] = {
    "plan": "planner.exports._plan:export_plan",
    "megatron": "planner.exports._megatron:export_megatron",
    "deepspeed": "planner.exports._deepspeed:export_deepspeed",
    "torchtitan": "planner.exports._torchtitan:export_torchtitan",
    "astra-sim": "planner.exports._astra:export_astra",
    "chakra": "planner.exports._chakra:export_chakra",
}
"""Format name -> ``module:function``, imported when used."""
WITH_PROGRESS = frozenset({"chakra"})
"""Formats whose exporter takes a :class:`planner.chakra.io.TraceProgress` (one file per NPU:
hundreds of MB for a big plan)."""


def exporter(fmt: str) -> Exporter:
    if fmt not in EXPORTERS:
        raise PlannerUsageError(f"--format {fmt}: unknown format; use one of"
                                f" {', '.join(EXPORTERS)}")
    module, function = EXPORTERS[fmt].split(":")
    return getattr(importlib.import_module(module), function)


def export_files(plan: Plan, fmt: str, progress: TraceProgress | None = None
                 ) -> dict[str, str | bytes]:
    """The files of ``plan`` in format ``fmt``; ``progress`` hears of each trace file of a
    format that writes one per NPU (:data:`WITH_PROGRESS`). Raises ValueError, with the reason,
    when the exporter's framework cannot run the plan as written (its own rules)."""
    if fmt in WITH_PROGRESS:
        return exporter(fmt)(plan, progress)  # type: ignore[call-arg]
    return exporter(fmt)(plan)


def runnable_files(plan: Plan, fmt: str, progress: TraceProgress | None = None
                   ) -> dict[str, str | bytes]:
    """:func:`export_files` of a plan a user is handed (``planner export``, the report's
    commands): a framework format also refuses a plan estimated in another convention, or one
    over the device's HBM (:func:`planner.exports._runnable.not_runnable`)."""
    from planner.exports._runnable import not_runnable

    refused = not_runnable(plan, fmt)
    if refused is not None:
        raise ValueError(refused)
    return export_files(plan, fmt, progress)
