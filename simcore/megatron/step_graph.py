"""The ``megatron`` convention's step as a per-NPU dependency graph, for Chakra traces.

Each NPU runs its pipeline stage's forwards and backwards in the schedule's order
(:func:`simcore.timeline.stage_order`), then the data-parallel gradient reduction and the
optimizer step. Compute nodes carry the estimate's own durations (the kernels with their floors,
:mod:`simcore.megatron.kernels`); communication is real collectives over the NPU's communicator
groups and real sends and receives to the neighbouring stages, so ASTRA-sim (or
``planner replay``) times them on its own network model. Per op:

- forward: receive the input (from the previous stage, or chunk c - 1 on the last stage),
  compute, then the tp collectives (2 per layer: all-reduce, or all-gather + reduce-scatter with
  sequence parallelism; the embedding's and the LM head's), then send the output on;
- backward: receive the gradient, recompute (full recompute's tp collectives after it), the
  data-gradient kernels, then the weight-gradient kernels in parallel with the layer's tp
  collectives (Megatron-LM's asynchronous tp reduction; the estimate's ``max(0, tp - wgrad)``),
  then send the gradient back;
- context parallelism's K/V all-gathers (and reduce-scatters backward) and ZeRO-3's per-layer
  weight all-gathers (and gradient reduce-scatters) run beside the op's compute; with ``cp_comm``
  all_gather the former run after it instead (forward after the tp collectives, backward at the
  tail, with the recompute's again), exposed as the estimate has them (``a2a``'s all-to-alls
  are not written: :func:`step_graphs` refuses them);
- zb-h1: each backward is its B pass (the data gradients, whose tp collectives it waits for:
  nothing is left to hide them behind) and a W pass of its own (the weight gradients) where
  :func:`simcore.timeline.stage_order` puts it, ``stage`` micro-batches later; zbv alike, in
  PyTorch's order, its transfers along the V (the last stage passes chunk 0 to its own chunk
  1 without a send);
- HSDP (a ``shard_group``): ZeRO-3's collectives over the ``dp_shard`` groups, the once-per-step
  gradient all-reduce over the ``dp_replicate`` groups (the two parts of dp, as
  :mod:`simcore.megatron.placement` lays them);
- after the stage's last backward: the gradient all-reduce (reduce-scatter + all-gather with a
  distributed optimizer / ZeRO-1/2), over dp x sp as the estimate splits it
  (:mod:`simcore.megatron.calls`, shared with the estimate); with ``overlap_grad_reduce`` in
  buckets, all but the last running beside the last backward (the estimate's
  ``max(link / buckets, link - backward)``); then the optimizer. ZeRO-2 also reduce-scatters
  every earlier micro-batch's gradients the same way after its own backward.

The estimate and this graph agree op by op where the estimate's terms are sums and maxima of the
same pieces: a replay without per-call latencies (ASTRA-sim has none) ends at the step's
timeline, except that the estimate charges a pipeline transfer to every op (also the last
stage's forwards and the first stage's backwards, which send nothing) and times context
parallelism and ZeRO-3 per layer while this graph overlaps whole ops. Durations are whole
microseconds (Chakra's ``duration_micros``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from simcore.megatron.calls import (
    Call,
    cp_kv_calls,
    embedding_calls,
    fsdp_layer_calls,
    grad_reduction_calls,
    head_calls,
    tp_pair_calls,
)
from simcore.megatron.layer_step import EXPOSED_CP, dense_layer
from simcore.megatron.parts import Stage as _StageSums
from simcore.megatron.phases import OpTime, StagePhases, stage_phases
from simcore.megatron.pipeline import head_stage
from simcore.megatron.placement import DpPart
from simcore.megatron.plan import StepPlan
from simcore.megatron.recompute import runs_core_again
from simcore.megatron.stage_memory import fp8_weight_params
from simcore.megatron.step import _ends, _optimizer_time, _stage, grad_buckets
from simcore.specs import (
    ZERO_BUBBLE,
    Axis,
    CpComm,
    ModelSpec,
    Recompute,
    Schedule,
    Strategy,
    SystemSpec,
    TrainingSpec,
    ZeroStage,
)
from simcore.stage._graph import Node, NodeKind, RankGraph
from simcore.timeline import stage_order

__all__ = ["StepGraphs", "npu_coordinates", "step_graphs"]


@dataclass(frozen=True, slots=True)
class StepGraphs:
    """One graph per NPU (``graphs[i].rank == i``); node sizes are bytes; groups are keyed by
    the axis's name (``tp``, ``sp``, ``dp``, ``pp``)."""

    graphs: tuple[RankGraph, ...]
    micro_batches: int
    replicas: int
    """NPUs per pipeline stage: a transfer's link is ``tag * replicas + replica``, where the
    tag is the same at both ends."""


def _degree(strategy: Strategy, axis: Axis) -> int:
    return int(getattr(strategy, axis.value))


def npu_coordinates(strategy: Strategy, npu: int) -> dict[Axis, int]:
    """The NPU's coordinate on each axis: ranks are numbered in the placement's order, innermost
    first (as :mod:`simcore.megatron.placement` lays the axes onto the network)."""
    out = {}
    for axis in strategy.placement:
        degree = _degree(strategy, axis)
        out[axis] = npu % degree
        npu //= degree
    return out


def _npu(strategy: Strategy, coords: dict[Axis, int]) -> int:
    rank, stride = 0, 1
    for axis in strategy.placement:
        rank += coords[axis] * stride
        stride *= _degree(strategy, axis)
    return rank


def _groups(strategy: Strategy, npu: int) -> dict[str, tuple[int, ...]]:
    """The NPU's group on every axis and, under HSDP, on both parts of dp: ``dp_shard`` the dp
    ranks of its shard group (the inner part of dp, as :mod:`simcore.megatron.placement` lays
    it), ``dp_replicate`` the ranks at its place in the other shard groups."""
    coords = npu_coordinates(strategy, npu)
    out = {axis.value: tuple(_npu(strategy, {**coords, axis: k})
                             for k in range(_degree(strategy, axis)))
           for axis in Axis}
    if strategy.replicas > 1:
        inner = strategy.shard_ranks // strategy.sp
        d = coords[Axis.DP]
        base, offset = d - d % inner, d % inner
        out[DpPart.SHARD.value] = tuple(_npu(strategy, {**coords, Axis.DP: base + k})
                                        for k in range(inner))
        out[DpPart.REPLICATE.value] = tuple(
            _npu(strategy, {**coords, Axis.DP: r * inner + offset})
            for r in range(strategy.replicas))
    return out


def _micros(seconds: float) -> int:
    return round(seconds * 1e6)


# -- the collectives of one op ----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _OpCalls:
    """The collectives of one forward or backward of one chunk."""

    after_recompute: list[Call]
    tp: list[Call]
    """After the compute (forward) or beside the weight gradients (backward)."""
    tail: list[Call]
    """After everything else (the LM head's reduce-scatter backward)."""
    beside: list[Call]
    """Context parallelism and ZeRO-3, beside the op's compute."""


def _op_calls(p: StepPlan, stage: int, chunk: int, backward: bool) -> _OpCalls:
    s = p.s
    k = p.chunk_layers[stage][chunk]  # layers of this chunk
    first = stage == 0 and chunk == 0
    last = stage == head_stage(s.schedule, s.pp) and chunk == s.v - 1
    pairs = tp_pair_calls(p) * (2 * k)
    head = head_calls(p, backward) if last else []
    beside: list[Call] = []
    exposed: list[Call] = []  # context parallelism's all-gathers or all-to-alls, after the compute
    if s.sp > 1:
        gathers, scatters = cp_kv_calls(p)
        calls = (gathers + scatters if backward else gathers) * k
        if p.training.cp_exchange in EXPOSED_CP:
            again = gathers * k if backward and runs_core_again(p, plain=False) else []
            exposed = calls + again
        else:
            beside += calls
    if s.zero is ZeroStage.PARAMETERS and p.dp_group > 1:
        gathers, scatters = fsdp_layer_calls(p)
        beside += (gathers + scatters if backward else gathers) * k
    if not backward:
        embedding = embedding_calls(p) if first else []
        return _OpCalls([], embedding + pairs + head + exposed, [], beside)
    again = pairs if s.recompute is Recompute.FULL else []
    if p.early_stop:  # the recompute stops before FC2's collective (the pair's last call)
        pair = tp_pair_calls(p)
        again = (pair + pair[:-1]) * k
    return _OpCalls(again, pairs, head + exposed, beside)


# -- building one stage's nodes -----------------------------------------------------------------
class _Nodes:
    """Appends nodes with ids in issue order."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []

    def add(self, kind: NodeKind, name: str, deps: Iterable[int], **fields: object) -> int:
        node = Node(len(self.nodes), kind, name, deps=sorted(set(deps)), **fields)
        self.nodes.append(node)
        return node.id

    def compute(self, name: str, seconds: float, deps: list[int]) -> list[int]:
        """A compute node, or nothing (the deps pass through) when it takes no time."""
        micros = _micros(seconds)
        if micros <= 0:
            return deps
        return [self.add(NodeKind.COMP, name, deps, duration_us=micros)]

    def chain(self, name: str, calls: list[Call], deps: list[int]) -> list[int]:
        """The collectives one after the other (sizes truncated to bytes, as the estimate's)."""
        for i, (axis, collective, size) in enumerate(calls):
            if int(size) > 0:
                deps = [self.add(NodeKind.COLL, f"{name} {collective.value} {i}", deps,
                                 collective=collective, axis=axis.value, size=int(size))]
        return deps


def _transfer(p: StepPlan, stage: int, chunk: int, backward: bool, sending: bool
              ) -> tuple[int, int, int] | None:
    """(other stage, the sender's virtual stage, direction) of the op's pipeline transfer, or
    None: forwards go to the next virtual stage (chunk c on the last stage feeds chunk c + 1 on
    stage 0; zbv's V: chunk 1 of stage r is virtual stage 2p-1-r, so the last stage feeds
    itself), backwards to the previous one."""
    pp, v = p.s.pp, p.s.v
    v_shape = p.s.schedule is Schedule.ZBV
    g = (2 * pp - 1 - stage if chunk else stage) if v_shape else chunk * pp + stage
    towards_end = sending != backward  # a forward's send or a backward's receive
    other = g + 1 if towards_end else g - 1
    if pp == 1 or not 0 <= other < pp * v:
        return None
    rank = (other if other < pp else 2 * pp - 1 - other) if v_shape else other % pp
    if rank == stage:
        return None
    sender = g if sending else other
    return rank, sender, int(backward)


class _Stage:
    def __init__(self, p: StepPlan, stage: int, phases: StagePhases, sums: _StageSums) -> None:
        self.p, self.stage, self.phases, self.sums = p, stage, phases, sums
        self.zero_bubble = p.s.schedule in ZERO_BUBBLE
        self.message = int(p.tokens * p.model.hidden * p.training.bytes_per_activation / p.s.tp)
        self.out = _Nodes()
        self.peers: dict[int, tuple[int, int]] = {}
        """Node id -> (peer stage, transfer key) of its sends and receives."""

    def key(self, sender: int, backward: int, micro: int) -> int:
        return (backward * self.p.s.pp * self.p.s.v + sender) * self.p.m + micro

    def _p2p(self, kind: NodeKind, chunk: int, micro: int, backward: bool,
             deps: list[int]) -> list[int]:
        found = _transfer(self.p, self.stage, chunk, backward, kind is NodeKind.SEND)
        if found is None:
            return deps
        other, sender, direction = found
        word = "send" if kind is NodeKind.SEND else "recv"
        name = f"{'bwd' if backward else 'fwd'} c{chunk} mb{micro} {word}"
        node = self.out.add(kind, name, deps, size=self.message)
        self.peers[node] = (other, self.key(sender, direction, micro))
        return [node]

    def op(self, chunk: int, micro: int, backward: bool,
           deps: list[int]) -> tuple[list[int], list[int]]:
        """One op's nodes; returns (its end, its start: what the overlapped gradient buckets
        wait for)."""
        times: OpTime = (self.phases.backward if backward else self.phases.forward)[chunk]
        calls = _op_calls(self.p, self.stage, chunk, backward)
        name = f"{'bwd' if backward else 'fwd'} c{chunk} mb{micro}"
        start = self._p2p(NodeKind.RECV, chunk, micro, backward, deps)
        n = self.out
        if not backward:
            done = n.compute(name, times.compute, start)
            beside = self.beside(name, calls, start)
            end = n.chain(f"{name} tp", calls.tp, sorted(set(done + beside)))
        else:
            k = self.p.chunk_layers[self.stage][chunk]
            # zb-h1: the W pass's share as the timeline splits it (the LM head's included)
            wgrad = times.wgrad if self.zero_bubble else k * self.p.kernels.wgrad
            cur = n.compute(f"{name} recompute", times.recompute, start)
            cur = n.chain(f"{name} recompute tp", calls.after_recompute, cur)
            beside = self.beside(name, calls, start)
            cur = n.compute(f"{name} dgrad", times.compute - wgrad, cur)
            # zb-h1: the weight gradients are a W pass of their own, later (:meth:`weights`)
            grads = cur if self.zero_bubble else n.compute(f"{name} wgrad", wgrad, cur)
            # a stack without the asynchronous tp reduction reduces after the weight gradients
            tp = n.chain(f"{name} tp", calls.tp, cur if self.p.tp_async else grads)
            end = n.chain(f"{name} tail", calls.tail, sorted(set(grads + tp + beside)))
        end = self._p2p(NodeKind.SEND, chunk, micro, backward, end)
        return end, start

    def beside(self, name: str, calls: _OpCalls, start: list[int]) -> list[int]:
        """The op's collectives beside its compute, from its start; none, nothing to wait for
        (not the op's start again: each op would then wait on every node before it by name)."""
        if not calls.beside:
            return []
        return self.out.chain(f"{name} beside", calls.beside, start)

    def weights(self, chunk: int, micro: int, deps: list[int]) -> list[int]:
        """A zero-bubble W pass of one micro-batch: the weight-gradient kernels of the chunk
        (the LM head's on the chunk that holds it), after the op before it on this stage."""
        return self.out.compute(f"wgrad c{chunk} mb{micro}", self.phases.backward[chunk].wgrad,
                                deps)

    def buckets(self) -> int:
        p = self.p
        if not p.training.overlap_grad_reduce or p.dp_group == 1:
            return 1
        return grad_buckets(p, self.sums.params)

    def reduction(self, name: str, calls: list[Call], start: list[int],
                  deps: list[int]) -> list[int]:
        """``calls`` after the backward that began at ``start`` and ends at ``deps``: in
        buckets with ``overlap_grad_reduce``, all but the last beside it (the estimate's
        ``max(link / buckets, link - backward)``), in full after it without."""
        n = self.buckets()
        if n == 1 or not calls:  # nothing to reduce (ZeRO-3's layers reduce their own)
            return self.out.chain(name, calls, deps)
        split = [(a, c, size / n) for a, c, size in calls]
        hidden = self.out.chain(f"{name} (overlapped)", split * (n - 1), start)
        return self.out.chain(name, split, sorted(set(deps + hidden)))

    def micro_batch_reduction(self, chunk: int, micro: int, reduce: list[Call],
                              start: list[int], deps: list[int]) -> list[int]:
        """ZeRO-2 keeps only its shard of the gradients, so every micro-batch but the last
        reduce-scatters the gradients its backward (its W pass under zero-bubble) made, before
        the stage's next op: the chunk's share of the stage's (by layers; the whole for v 1),
        as the estimate's (m - 1) reductions beside each backward."""
        p = self.p
        if p.s.zero is not ZeroStage.GRADIENTS or micro == p.m - 1 or not reduce:
            return deps
        layers = p.chunk_layers[self.stage]
        share = layers[chunk] / sum(layers)
        calls = [(a, c, size * share) for a, c, size in reduce]
        return self.reduction(f"dp grad reduce c{chunk} mb{micro}", calls, start, deps)

    def build(self) -> list[Node]:
        p = self.p
        order = stage_order(p.s.schedule, self.stage, p.s.pp, p.m, p.s.v)
        reduce, gather = grad_reduction_calls(p, self.sums.params,
                                              fp8_weight_params(p, self.sums))
        deps: list[int] = []
        start: list[int] = []
        for kind, chunk, micro in zip(order.kind, order.chunk, order.micro_batch):
            chunk, micro = int(chunk), int(micro)
            if kind == 2:
                start = deps
                deps = self.weights(chunk, micro, deps)
            else:
                deps, start = self.op(chunk, micro, bool(kind), deps)
            if kind == 2 or (kind == 1 and not self.zero_bubble):  # the gradients are made
                deps = self.micro_batch_reduction(chunk, micro, reduce, start, deps)
        end = self.reduction("dp grad reduce", reduce + gather, start, deps)
        self.out.compute("optimizer", _optimizer_time(p, self.sums), end)
        return self.out.nodes


def step_graph_nodes(model: ModelSpec, system: SystemSpec, training: TrainingSpec,
                     strategy: Strategy) -> int:
    """How many nodes :func:`step_graphs` writes over every NPU, from its pipeline stages'
    graphs alone (each NPU holds its stage's); raises ValueError as :func:`step_graphs` does."""
    _, nodes = _stage_nodes(model, system, training, strategy)
    return strategy.devices // strategy.pp * sum(len(n) for n in nodes)


def _stage_nodes(model: ModelSpec, system: SystemSpec, training: TrainingSpec,
                 strategy: Strategy) -> tuple[list[_Stage], list[tuple[Node, ...]]]:
    """Each pipeline stage and its nodes; raises ValueError when the plan does not divide, or
    when it holds what the graph does not write yet (MoE layers, context parallelism's
    all-to-alls)."""
    if model.moe is not None:
        raise ValueError(f"the step graph (Chakra, ASTRA-sim) does not write MoE layers yet"
                         f" ({model.name}); it offers dense GPT and Llama models")
    if strategy.sp > 1 and training.cp_comm is CpComm.A2A:
        raise ValueError("the step graph (Chakra, ASTRA-sim) does not write context"
                         " parallelism's all-to-alls (cp_comm a2a) yet: the estimate times them"
                         " as pairwise sends, ASTRA-sim as its own all-to-all; it offers cp_comm"
                         " p2p and all_gather")
    p = StepPlan(model, system, training, strategy)
    layer, ends = dense_layer(p), _ends(p)
    phases = stage_phases(model, system, training, strategy)
    stages = [_Stage(p, i, phases[i], _stage(p, layer, ends, i)) for i in range(strategy.pp)]
    return stages, [tuple(st.build()) for st in stages]


def step_graphs(model: ModelSpec, system: SystemSpec, training: TrainingSpec,
                strategy: Strategy) -> StepGraphs:
    """Every NPU's graph of one step (see the module docstring); raises ValueError when the plan
    does not divide, or when it holds what the graph does not write yet (MoE layers, context
    parallelism's all-to-alls)."""
    stages, nodes = _stage_nodes(model, system, training, strategy)
    p = stages[0].p
    npus = strategy.devices
    replicas = npus // strategy.pp
    strides = _replica_strides(strategy)
    graphs = []
    for npu in range(npus):
        coords = npu_coordinates(strategy, npu)
        st = stages[coords[Axis.PP]]
        replica = sum(coords[a] * w for a, w in strides.items())
        own = list(nodes[st.stage])
        peers = {}
        for node_id, (other, key) in st.peers.items():
            link = key * replicas + replica
            own[node_id] = replace(own[node_id], link=link)
            peers[link] = _npu(strategy, {**coords, Axis.PP: other})
        graphs.append(RankGraph(st.stage, npu, tuple(own), _groups(strategy, npu), peers))
    return StepGraphs(tuple(graphs), p.m, replicas)


def _replica_strides(strategy: Strategy) -> dict[Axis, int]:
    """Strides numbering an NPU among the NPUs of its stage (every axis but pp)."""
    out, stride = {}, 1
    for axis in strategy.placement:
        if axis is not Axis.PP:
            out[axis] = stride
            stride *= _degree(strategy, axis)
    return out
