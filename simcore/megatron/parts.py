"""The working values of one training step (:mod:`simcore.megatron.step`): a transformer layer's
seconds for one micro-batch, the ends' kernels (embedding, LM head and loss) and a pipeline
stage's sums.

They are private to the estimate and never changed after they are built; they are not frozen
because a frozen dataclass takes ~3 us to build against ~0.7 us (every field goes through
object.__setattr__), and the estimate builds one Stage per pipeline stage.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Ends", "Layer", "Stage"]


@dataclass(slots=True)
class Layer:
    """One transformer layer for one micro-batch on one device (seconds)."""

    fwd_compute: float
    bwd_compute: float
    recompute: float
    tp_fwd: float
    tp_bwd: float
    sp_fwd: float
    sp_bwd: float
    fsdp_fwd: float
    fsdp_bwd: float
    wgrad: float = 0.0
    """The backward's weight-gradient GEMMs (part of bwd_compute)."""
    ep_fwd: float = 0.0
    """An MoE layer's all-to-alls (and expert-tp collectives) forward, on the critical path."""
    ep_bwd: float = 0.0
    """Backward (and, under full recompute, the forward's again)."""
    offload_fwd: float = 0.0
    """Activation offloading's copies to host memory that outlast the next layer's forward
    (the average layer's share: :func:`simcore.megatron.layer_step.with_offload`)."""
    offload_bwd: float = 0.0
    """Its reloads that outlast the backward they run beside."""

    @property
    def compute(self) -> float:
        return self.fwd_compute + self.bwd_compute + self.recompute

    @property
    def total(self) -> float:
        return (self.compute + self.tp_fwd + self.tp_bwd + self.sp_fwd + self.sp_bwd
                + self.fsdp_fwd + self.fsdp_bwd + self.ep_fwd + self.ep_bwd
                + self.offload_fwd + self.offload_bwd)


@dataclass(slots=True)
class Ends:
    """The kernels outside the transformer layers, for one micro-batch (seconds)."""

    embedding_fwd: float
    embedding_bwd: float
    head_fwd: float
    """LM head GEMM and the loss on fp32 logits."""
    head_bwd: float
    head_wgrad: float = 0.0
    """The LM head's weight-gradient GEMM (part of head_bwd): a zero-bubble schedule's W."""


@dataclass(slots=True)
class Stage:
    index: int
    layers: int
    params: float
    """Parameters this stage's device holds (already split by tp)."""
    compute: float
    tp: float
    sp: float
    pp: float
    fsdp: float
    bwd: float
    """Backward of one micro-batch: the window the gradient reduction hides behind."""
    wgrad: float = 0.0
    """Its weight-gradient GEMMs (part of compute): the W pass of a zero-bubble schedule."""
    ep: float = 0.0
    """Its MoE layers' all-to-alls (and expert-tp collectives), forward and backward."""
    moe_layers: int = 0
    """Of its layers, those with the MoE FFN."""
    expert_params: float = 0.0
    """The routed experts' parameters this device holds (split by ep and etp; not in params:
    their states are sharded, and their gradients reduced, over the expert data-parallel
    group)."""
    offload: float = 0.0
    """Its activation offloading's exposed copies and reloads."""
    bwd_pass: float = 0.0
    """The backward's whole share of :attr:`time` for one micro-batch: :attr:`bwd` with the
    backward's exposed sp, FSDP, expert and offload exchanges, the LM head's backward and the
    backward's pipeline sends (as :func:`simcore.megatron.phases.stage_phases` splits them);
    what a zero-bubble V schedule splits into B and W, the rest of :attr:`time` being F."""

    @property
    def time(self) -> float:
        return self.compute + self.tp + self.sp + self.pp + self.fsdp + self.ep + self.offload
