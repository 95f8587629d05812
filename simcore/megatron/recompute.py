"""What runs again in the backward beyond the plain recompute choices: full recompute of only
some layers (``Strategy.recompute_layers``, Megatron-LM's ``--recompute-method block``),
Megatron-LM's selective ``recompute_modules``, and whether a plan's recompute runs the attention
core again (:func:`runs_core_again`: context parallelism's exposed exchanges with it).

A stage under ``recompute_layers`` is priced as the average of its layers: each term of a stage
(compute, tp, the FSDP and sp exchanges) is a sum over its layers, so ``n`` average layers sum
to the recomputed layers' terms plus the others' (:func:`blend`, its ``share``)."""

from __future__ import annotations

from dataclasses import fields
from typing import TypeVar

from simcore.megatron.kernels import LayerKernels, modules_forward, modules_kernels
from simcore.megatron.plan import StepPlan
from simcore.specs import Recompute, RecomputeModule

__all__ = ["blend", "kernels_again", "modules_again", "recomputed_fraction", "recomputed_share",
           "runs_core_again"]

_L = TypeVar("_L")


def recomputed_share(p: StepPlan, i: int, layers: float, pp: int) -> float:
    """The share of stage ``i``'s layers that run the plan's recompute: 1, or under
    ``recompute_layers`` its recomputed layers over all (:meth:`StepPlan.recomputed_layers`)."""
    if p.s.recompute_layers is None or not layers:
        return 1.0
    return p.recomputed_layers(i, layers, pp) / layers


def recomputed_fraction(p: StepPlan) -> float:
    """The share of the model's layers that run the plan's recompute (1 but under
    ``recompute_layers``), for the hardware FLOPs."""
    if p.s.recompute_layers is None:
        return 1.0
    return sum(p.recomputed_layers(i, n, p.s.pp)
               for i, n in enumerate(p.stage_layers)) / p.model.layers


def blend(plain: _L, full: _L, share: float) -> _L:
    """The layer (a dataclass of seconds) whose every field is ``plain``'s plus ``share`` of the
    way to ``full``'s."""
    return type(full)(*(getattr(plain, f.name) + share * (getattr(full, f.name)
                                                         - getattr(plain, f.name))
                        for f in fields(full)))  # type: ignore[arg-type]


def modules_again(p: StepPlan, k: LayerKernels, *, dense: bool) -> tuple[float, bool]:
    """What Megatron-LM's ``recompute_modules`` run again in a layer of these kernels: the
    seconds of their forward kernels, and whether the MLP (with its tp pair) is among them
    (``mlp``: a dense layer's only)."""
    m = p.modules
    if m is None:
        return 0.0, False
    return (modules_forward(k, m, dense=dense),
            dense and RecomputeModule.MLP in m and k.mlp_forward > 0)


def kernels_again(p: StepPlan, k: LayerKernels, *, dense: bool) -> int:
    """How many kernels the host issues again in the backward of a layer of these kernels under
    a partial recompute (``recompute_modules``, per-op checkpointing, selective): the
    recomputed kernels' own count, whatever their share of the forward's time (a faster GPU
    runs them sooner, not more of them). Full recompute issues the whole forward again
    (:func:`simcore.megatron.layer_step.layer_of`); none, nothing."""
    s = p.s
    if s.recompute is Recompute.NONE or s.recompute is Recompute.FULL:
        return 0
    if p.modules is not None:
        return modules_kernels(k, p.modules, dense=dense)
    if p.per_op:
        return k.issued_op_forward
    return k.issued_core_forward


def runs_core_again(p: StepPlan, plain: bool) -> bool:
    """The plan's recompute runs the attention core again: full recompute, Megatron-LM's
    selective recompute (or its ``recompute_modules`` with ``core_attn``); not torchtitan's
    per-op checkpointing, which keeps the attention's output."""
    s = p.s
    if plain or s.recompute is Recompute.NONE:
        return False
    if s.recompute is Recompute.FULL:
        return True
    if p.modules is not None:
        return RecomputeModule.CORE_ATTN in p.modules
    return not p.per_op
