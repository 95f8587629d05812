"""Measured per-layer costs (a profile) in place of the roofline, as Metis prices a stage.

A profile gives, per (device, tp, micro-batch), the seconds one micro-batch spends in a
transformer layer, in the embedding and in the LM head, forward and backward, tp communication
included (what a profiler measures on one replica). Where a plan's stage has a profile, its layer
and ends take those times (forward one third, backward two thirds, as a layer's FLOPs split;
full recompute adds the forward again, selective the roofline's share scaled to the profile);
everything else (the sends between stages, the gradient reduction, the optimizer, memory) stays
modelled. A stage shape without a profile is refused (ValueError), so a search covers the
profiled shapes only, as Metis does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from simcore.megatron.parts import Ends, Layer
from simcore.specs import Recompute

__all__ = ["ProfiledLayer", "LayerProfiles", "profiled_layer", "profiled_ends"]


@dataclass(frozen=True, slots=True)
class ProfiledLayer:
    """Seconds of one micro-batch, forward + backward, on one replica of tp devices."""

    layer_s: float
    embedding_s: float
    head_s: float

    def __post_init__(self) -> None:
        for name in ("layer_s", "embedding_s", "head_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"`{name} >= 0` must hold, but got {getattr(self, name)!r}")


@dataclass(frozen=True)
class LayerProfiles:
    """Profiles of one model's layers, by (device name, tp, micro-batch)."""

    name: str
    layers: int
    """Transformer layers of the profiled model (the embedding and head not counted)."""
    entries: Mapping[tuple[str, int, int], ProfiledLayer]

    def get(self, device: str, tp: int, micro_batch: int) -> ProfiledLayer:
        found = self.entries.get((device, tp, micro_batch))
        if found is None:
            have = sorted(f"tp{t} micro-batch {b}" for d, t, b in self.entries if d == device)
            raise ValueError(f"profile {self.name} has no {device} tp{tp} micro-batch"
                             f" {micro_batch}; it has {', '.join(have) or 'nothing for it'}")
        return found


def profiled_layer(roofline: Layer, p: ProfiledLayer, recompute: Recompute) -> Layer:
    fwd, bwd = p.layer_s / 3, 2 * p.layer_s / 3
    if recompute is Recompute.FULL:
        again = fwd
    elif recompute is Recompute.SELECTIVE and roofline.fwd_compute + roofline.bwd_compute > 0:
        again = roofline.recompute * p.layer_s / (roofline.fwd_compute + roofline.bwd_compute)
    else:
        again = 0.0
    return replace(roofline, fwd_compute=fwd, bwd_compute=bwd, recompute=again, tp_fwd=0.0,
                   tp_bwd=0.0)


def profiled_ends(p: ProfiledLayer) -> Ends:
    return Ends(embedding_fwd=p.embedding_s / 3, embedding_bwd=2 * p.embedding_s / 3,
                head_fwd=p.head_s / 3, head_bwd=2 * p.head_s / 3)
