"""A runs CSV row measured on a cluster that mixes device types: its plan in the ``stages``
cell, as ``planner mixed`` prints it (:mod:`planner.mixed_label`), on a system of node groups.

Such a row names its plan there alone: the cells of a one-device-type plan (``dp``, ``tp``,
``pp``, ``micro_batch`` and the rest of :data:`PLAN_CELLS`) stay empty. The schedule (1f1b or
gpipe), ``sequence_parallel`` and the training's cells (batch, sequence, the stack's options)
are read as on any row. The estimate is :func:`simcore.mixed.estimate.estimate_mixed`.
"""

from __future__ import annotations

from dataclasses import replace

from planner.mixed_label import parse_mixed_plan
from planner.runs_row import BadValue, RowError, row_schedule
from simcore.mixed import MixedPlan, MixedSystemSpec
from simcore.mixed.estimate import check_mixed
from simcore.specs import DeviceSpec, ModelSpec, Schedule, SystemSpec, TrainingSpec

__all__ = ["PLAN_CELLS", "largest_part", "mixed_plan"]

PLAN_CELLS = ("dp", "tp", "pp", "micro_batch", "sp", "gpus", "zero", "recompute",
              "recompute_layers", "offload_layers", "v", "placement", "precision",
              "first_stage_layers", "last_stage_layers", "pipeline_layout", "shard_group", "ep",
              "etp", "ep_overlap", "ep_dedup", "hbm_gb", "framework")
"""Cells of a one-device-type plan, which a row with ``stages`` leaves empty: its stages say
the degrees, the layers, the micro-batches, the recompute and ZeRO; each group's device its
memory; and no framework rule is written for mixed clusters."""


def mixed_plan(row: dict[str, str], model: ModelSpec, system: SystemSpec | MixedSystemSpec,
               training: TrainingSpec) -> MixedPlan:
    """The row's plan from its ``stages`` cell, checked against the system and the model:
    :class:`BadValue` naming the cell to fix where it does not read, :class:`RowError` (a
    plan the planner cannot express here) where it does not fit."""
    if not isinstance(system, MixedSystemSpec):
        raise BadValue(f"stages is given but system {system.name!r} has one device type; name"
                       " a system of node groups (studies/catalog/systems/mixed.yaml), or give"
                       " the plan in dp, tp, pp and micro_batch instead")
    filled = [c for c in PLAN_CELLS if row.get(c)]
    if filled:
        raise BadValue(f"{filled[0]}={row[filled[0]]!r} beside stages: a row with stages takes"
                       f" its plan from them; empty the {filled[0]} cell")
    schedule, sequence_parallel = row_schedule(row)
    try:  # a label that does not read, or names a group the system lacks: a value to fix
        plan = parse_mixed_plan(row["stages"], system, schedule=Schedule.ONE_F_ONE_B)
    except ValueError as e:
        raise BadValue(f"stages: {e}") from None
    if sequence_parallel is not None:
        plan = replace(plan, sequence_parallel=sequence_parallel)
    try:  # a plan that reads but does not fit the model, system or batch, or a schedule not
        # modelled here: left out, as a one-type row's plan is (RowError), not a typo
        if schedule is not None:
            plan = replace(plan, schedule=schedule)
        check_mixed(model, system, training, plan)
    except ValueError as e:
        raise RowError(f"stages: {e}") from None
    return plan


def largest_part(system: MixedSystemSpec, plan: MixedPlan) -> DeviceSpec:
    """The device with the most memory among those the plan's stages run on."""
    return max((system.groups[g].device for g in plan.groups_used), key=lambda d: d.hbm_bytes)
