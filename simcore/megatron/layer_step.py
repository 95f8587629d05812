"""One transformer layer's time for one micro-batch on one device: its kernels
(:mod:`simcore.megatron.kernels`), what the plan's recompute runs again, and the exposed part of
each collective beside them (tp behind the weight-gradient GEMMs, or with Transformer Engine's
userbuffers behind every GEMM; cp's K and V behind the attention core on a ring, exposed when
all-gathered or all-to-all'd (:class:`simcore.specs.CpComm`); ZeRO-3's gathers behind
the layer; an MoE layer's all-to-alls). The step sums these per stage
(:mod:`simcore.megatron.step`).

Hiding is not free: while a collective runs beside compute the two share the SMs and HBM, and
the compute slows by the device's ``overlap_slowdown`` (:func:`hidden_cost`).
"""

from __future__ import annotations

from dataclasses import replace

from simcore.megatron.calls import cp_kv_calls, fsdp_layer_calls, tp_pair_calls
from simcore.megatron.moe import expert_comm
from simcore.megatron.parts import Layer
from simcore.megatron.plan import StepPlan
from simcore.megatron.recompute import kernels_again, modules_again, runs_core_again
from simcore.specs import ZERO_BUBBLE, CpComm, Recompute, ZeroStage

__all__ = ["EXPOSED_CP", "dense_layer", "hidden_cost", "host_wait", "layer_of", "moe_layer",
           "tp_layer_comm", "with_offload"]


def hidden_cost(p: StepPlan, comm: float, compute: float) -> float:
    """Exposed time of ``comm`` run beside ``compute``: what it outlasts it by, plus the compute's
    slowdown while both run."""
    return max(0.0, comm - compute) + p.system.device.overlap_slowdown * min(comm, compute)


def tp_layer_comm(p: StepPlan) -> float:
    """Two all-reduces (or all-gather + reduce-scatter pairs) of a (b, s, h) activation."""
    return 2 * p.comm.total(tp_pair_calls(p))


def dense_layer(p: StepPlan, plain: bool = False) -> Layer:
    """A dense transformer layer (``plain``: without the plan's recompute)."""
    kernels = p.kernels
    # FC2's tp collective is the pair's last call (its all-reduce, or its reduce-scatter)
    tail_comm = p.comm.total(tp_pair_calls(p)[-1:]) if p.early_stop else 0.0
    layer = layer_of(p, kernels.forward, kernels.backward, kernels.wgrad, kernels.core_forward,
                     tp_layer_comm(p), kernels.gemm_forward, kernels.gemm_dgrad,
                     tail=kernels.forward_tail, tail_comm=tail_comm,
                     per_op=kernels.op_recompute, plain=plain,
                     modules=modules_again(p, kernels, dense=True),
                     launches=(kernels.issued_forward, kernels.issued_backward, 2,
                               kernels_again(p, kernels, dense=True)))
    return with_offload(p, layer, p.act.stored) if p.s.offload_layers else layer


def moe_layer(p: StepPlan, plain: bool = False) -> Layer:
    """An MoE layer (:mod:`simcore.megatron.moe`): the attention and shared experts' kernels
    and tp pairs (one pair for the attention, one more with shared experts: the routed experts'
    tokens stay split over tp and go through the all-to-all instead), the router and routed
    experts, and their all-to-alls on the critical path, run again under full recompute; with
    ``ep_overlap`` beside another micro-batch's compute of the layer, exposed only where they
    outlast it (and the compute's slowdown beside them, :func:`hidden_cost`). ``plain``: without
    the plan's recompute."""
    k, x = p.moe_kernels, p.experts
    assert p.moe is not None
    pairs = 2 if p.moe.shared_experts else 1
    tp = pairs * p.comm.total(tp_pair_calls(p))
    ep = expert_comm(p.comm, p.model, p.s, p.expert_tokens, p.training.bytes_per_activation)
    again = ep if p.s.recompute is Recompute.FULL and not plain else 0.0
    # the all-to-alls on the critical path keep the GPU busy while the host issues the pass
    beside = (0.0, 0.0) if p.s.ep_overlap else (ep, ep + again)
    layer = layer_of(p, k.forward + x.forward, k.backward + x.backward, k.wgrad + x.wgrad,
                     k.core_forward, tp, k.gemm_forward, k.gemm_dgrad, per_op=k.op_recompute,
                     plain=plain, modules=modules_again(p, k, dense=False),
                     launches=(k.issued_forward + x.issued_forward,
                               k.issued_backward + x.issued_backward, pairs,
                               kernels_again(p, k, dense=False)), beside=beside)
    if p.s.ep_overlap:  # beside another micro-batch's forward and backward of the layer
        hidden = hidden_cost(p, 2 * ep + again, layer.compute)
        layer = replace(layer, ep_fwd=0.0, ep_bwd=hidden)
    else:
        layer = replace(layer, ep_fwd=ep, ep_bwd=ep + again)
    if p.s.offload_layers:
        return with_offload(p, layer, p.moe_act.stored + p.expert_act)
    return layer


def with_offload(p: StepPlan, layer: Layer, stored: float) -> Layer:
    """``layer`` as the average layer of a model whose first ``offload_layers`` copy the
    ``stored`` bytes they keep for backward to host memory and back
    (:attr:`simcore.specs.Strategy.offload_layers`). Each copy runs on a copy engine over the
    device's host link, beside the next layer's forward; each reload beside the backward of the
    layer after it (Transformer Engine's ``cpu_offload``: one layer prefetched). What outlasts
    that compute is exposed; the copy engines take no SMs, so nothing slows beside them."""
    bandwidth = p.system.device.host_bandwidth_bytes_per_s
    n = p.s.offload_layers
    assert bandwidth is not None and n is not None  # checks.check_plan
    copy = stored / bandwidth
    share = n / p.model.layers
    # no recompute beside offloading (Strategy.offload_layers): the backward is bwd_compute
    return replace(layer, offload_fwd=share * max(0.0, copy - layer.fwd_compute),
                   offload_bwd=share * max(0.0, copy - layer.bwd_compute))


EXPOSED_CP = (CpComm.ALL_GATHER, CpComm.A2A)
"""The ways of context parallelism whose collectives do not run beside the attention."""


def layer_of(p: StepPlan, fwd: float, bwd: float, wgrad: float, core: float,
             tp: float, gemm_fwd: float = 0.0, gemm_dgrad: float = 0.0, *,
             tail: float = 0.0, tail_comm: float = 0.0, per_op: float = 0.0,
             plain: bool = False, modules: tuple[float, bool] = (0.0, False),
             launches: tuple[int, int, int, int] = (0, 0, 0, 0),
             beside: tuple[float, float] = (0.0, 0.0)) -> Layer:
    """A layer of these kernels (seconds of its forward, backward, weight-gradient GEMMs and
    attention core; its linear layers' forward and input-gradient GEMMs) and tp communication,
    with the plan's sp, recompute and ZeRO-3. ``tail`` and ``tail_comm``: the forward's kernels
    and tp collective after its last saved tensor, which a full recompute that stops early
    (:attr:`StepPlan.early_stop`) does not run again (an MoE layer passes none: priced whole).
    ``per_op``: what per-op selective checkpointing runs again (:attr:`StepPlan.per_op`), with
    the tp collectives whose outputs it does not keep. ``plain``: the layer without recompute
    (a layer ``recompute_layers`` leaves out). ``modules``: what Megatron-LM's
    ``recompute_modules`` run again (:func:`simcore.megatron.recompute.modules_again`): their
    seconds, and whether the MLP's tp pair runs again with it. ``launches``: what the host
    issues (:func:`host_wait`): the layer's kernels forward and backward, and how many times
    each pass runs :func:`simcore.megatron.calls.tp_pair_calls` (a dense layer twice, after
    its attention and its MLP), and the kernels a partial recompute issues again
    (:func:`simcore.megatron.recompute.kernels_again`); ``beside``: the seconds of the
    forward and backward passes that the GPU spends on work priced apart (an MoE layer's
    exposed all-to-alls), which the host's issuing runs beside."""
    s = p.s
    zero_bubble = s.schedule in ZERO_BUBBLE
    if p.tp_overlap:
        # Transformer Engine's userbuffers (--tp-comm-overlap) split each tp all-gather and
        # reduce-scatter into chunks run beside the GEMMs that consume or produce them: the
        # forward's behind the forward GEMMs, the backward's behind the input- and
        # weight-gradient GEMMs (only the former in a zero-bubble B pass).
        tp_fwd = hidden_cost(p, tp, gemm_fwd)
        tp_bwd = hidden_cost(p, tp, gemm_dgrad + (0.0 if zero_bubble else wgrad))
    else:
        # Backward hides its tp communication behind the weight-gradient GEMMs (Megatron-LM's
        # asynchronous tensor-parallel all-reduce / all-gather; Korthikanti section 5). A
        # zero-bubble schedule defers those GEMMs to its W pass, so its B pass waits for the
        # whole collective, as a stack without the asynchronous reduction always does.
        tp_fwd = tp
        tp_bwd = tp if zero_bubble or not p.tp_async else hidden_cost(p, tp, wgrad)

    sp_fwd = sp_bwd = 0.0
    if s.sp > 1:
        gathers, scatters = cp_kv_calls(p)
        gather, scatter = p.comm.total(gathers), p.comm.total(scatters)
        if p.training.cp_exchange in EXPOSED_CP:
            # the collectives before the attention and after it, exposed
            sp_fwd, sp_bwd = gather, gather + scatter
        else:  # the ring sends each chunk on while the chunk in hand is attended to
            sp_fwd = hidden_cost(p, gather, core)
            sp_bwd = hidden_cost(p, gather + scatter, 2 * core)

    if plain:
        recompute = tp_recompute = 0.0
    elif s.recompute is Recompute.FULL and p.early_stop:
        # PyTorch's non-reentrant checkpointing stops at FC2's input: FC2, its tp collective
        # and the residual add are not re-run
        recompute = fwd - tail
        tp_recompute = tp_fwd - min(tail_comm, tp_fwd / 2)
    elif s.recompute is Recompute.FULL:
        recompute = fwd
        tp_recompute = tp_fwd
    elif p.modules is not None:
        recompute = modules[0]
        tp_recompute = tp_fwd / 2 if modules[1] else 0.0  # the MLP's pair of the layer's two
    elif p.per_op:
        recompute = per_op
        # the reduce-scatters' outputs are kept, the all-gathers before the column-parallel
        # matmuls are not (half of each pair); without sequence parallelism no all-reduce is
        tp_recompute = tp_fwd / 2 if s.sequence_parallel else tp_fwd
    elif s.recompute is Recompute.SELECTIVE:
        recompute = core
        tp_recompute = 0.0
    else:
        recompute = tp_recompute = 0.0

    if s.sp > 1 and p.training.cp_exchange in EXPOSED_CP and runs_core_again(p, plain):
        sp_bwd += sp_fwd  # the recompute's attention exchanges K and V (and Q) again

    fsdp_fwd = fsdp_bwd = 0.0
    if s.zero is ZeroStage.PARAMETERS and p.shard_ranks > 1:
        gathers, scatters = fsdp_layer_calls(p)
        gather, scatter = p.comm.total(gathers), p.comm.total(scatters)
        if p.no_sync:  # one reduce-scatter a step, in the last micro-batch: its share of each
            scatter /= p.m
        fsdp_fwd = hidden_cost(p, gather, fwd)
        fsdp_bwd = hidden_cost(p, gather + scatter, bwd + recompute)
    kernels_fwd, kernels_bwd, pairs, again = launches
    calls = pairs * len(tp_pair_calls(p))  # the tp collectives of one pass
    calls_bwd = calls
    if recompute and s.recompute is Recompute.FULL:
        kernels_bwd += kernels_fwd  # the forward's kernels and collectives again
        calls_bwd += calls
    elif recompute:  # a partial recompute (the attention core, some modules, per-op)
        kernels_bwd += again
    fwd += host_wait(p, kernels_fwd, calls, fwd + tp_fwd + sp_fwd + fsdp_fwd + beside[0])
    bwd += host_wait(p, kernels_bwd, calls_bwd, bwd + recompute + tp_bwd + tp_recompute + sp_bwd
                     + fsdp_bwd + beside[1])
    return Layer(fwd, bwd, recompute, tp_fwd, tp_bwd + tp_recompute, sp_fwd, sp_bwd,
                 fsdp_fwd, fsdp_bwd, wgrad)


def host_wait(p: StepPlan, kernels: int, calls: int, gpu: float) -> float:
    """What the GPU waits for the host in one pass of a layer: the host's time to issue the
    pass's ``kernels`` (:attr:`simcore.specs.DeviceSpec.host_kernel_s` each: one of the
    inventory's kernels stands for it and the small operations around it) and its ``calls``
    tp collectives, beyond the ``gpu`` seconds they run for. A collective issued as a
    torch.distributed call costs the host :attr:`simcore.specs.DeviceSpec.collective_launch_s`;
    one Transformer Engine runs in its userbuffers costs a kernel's host time, as the module
    fills the buffer and runs the GEMM in chunks around it (TransformerEngine@d0067d0
    ``module/linear.py``: ``fill_userbuffers_buffer_for_all_gather``, ``general_gemm(...,
    ub=...)``). The host runs ahead of the GPU through the launch queue, so only a pass whose
    kernels are on average shorter than the host's time per kernel waits (a small layer, high
    tp, a short micro-batch), and the identical layers of a stage all wait alike. None under
    CUDA graphs (one launch a graph) or launch blocking, whose host time is in every kernel
    already (:attr:`simcore.megatron.kernel_costs.KernelCosts.host`)."""
    device = p.system.device
    if not device.host_kernel_s or p.training.cuda_graphs or p.training.launch_blocking:
        return 0.0
    per_call = device.host_kernel_s if p.tp_overlap else device.collective_launch_s
    return max(0.0, kernels * device.host_kernel_s + calls * per_call - gpu)
