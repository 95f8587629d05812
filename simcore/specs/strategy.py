"""How one training step is split over the devices (:class:`Strategy`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from simcore.specs.choices import (
    DEFAULT_PLACEMENT,
    Axis,
    Precision,
    Recompute,
    Schedule,
    ZeroStage,
    _is_placement,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Strategy:
    """How one training step is split over the devices."""

    dp: int = 1
    """Data-parallel degree. 1 means no data parallelism."""
    tp: int = 1
    """Tensor-parallel degree. 1 means disabled."""
    pp: int = 1
    """Pipeline-parallel degree (stages). 1 means disabled."""
    sp: int = 1
    """Sequence (context) parallel degree: the sequence is split over sp ranks. 1 means disabled."""
    sequence_parallel: bool = True
    """Megatron sequence parallelism inside the tp group (norms and dropout split by sequence)."""
    zero: ZeroStage = ZeroStage.NONE
    """What the data-parallel ranks shard; ZeroStage.PARAMETERS is FSDP."""
    recompute: Recompute = Recompute.NONE
    micro_batch: int = 1
    """Sequences per micro-batch per data-parallel replica."""
    schedule: Schedule = Schedule.ONE_F_ONE_B
    v: int = 1
    """Model chunks per device: the interleaved schedule's v, 2 for zbv; 1 otherwise."""
    placement: tuple[Axis, ...] = field(default=DEFAULT_PLACEMENT)
    """Axes onto the network dimensions, innermost first."""
    precision: Precision = Precision.BF16
    """The linear layers' GEMM format; FP8 needs a device with an FP8 peak."""
    first_stage_layers: int | None = None
    """Transformer layers on the first pipeline stage; None: an equal share. Megatron-LM's
    ``--decoder-first-pipeline-num-layers``: the stages without a set count split the rest
    evenly (``megatron/core/transformer/transformer_config.py``, d98e8a64, "Uneven PP")."""
    last_stage_layers: int | None = None
    """Transformer layers on the last pipeline stage; None: an equal share
    (``--decoder-last-pipeline-num-layers``)."""
    layout: tuple[int, ...] | None = None
    """Transformer layers of every virtual stage, in Megatron-LM's order (virtual stage i on
    rank i % pp as its chunk i // pp; pp * v of them, the embedding in the first, the LM head
    and loss in the last): ``--pipeline-model-parallel-layout``, :mod:`simcore.layout`. None:
    the split the other fields give."""
    ep: int = 1
    """Expert parallelism (MoE models): each MoE layer's routed experts split over ep ranks,
    carved out of the tp x sp x dp ranks of a pipeline stage as Megatron-LM's "parallel folding"
    does (``megatron/core/parallel_state.py``: the expert grid is etp x ep x edp x pp, innermost
    first). 1: every rank holds every expert."""
    etp: int | None = None
    """Expert tensor parallelism: each expert's FFN split over etp ranks
    (``--expert-tensor-parallel-size``); None: the same as tp, Megatron-LM's default."""
    ep_overlap: bool = False
    """The expert all-to-alls of one micro-batch run beside another micro-batch's compute (a
    forward beside a backward): Megatron-LM's ``--overlap-moe-expert-parallel-comm`` with
    ``--delay-wgrad-compute`` (``megatron/core/transformer/moe/README.md``, "Expert Parallel
    (EP) Communication Overlap"), what DeepSeek-V3's DualPipe does (arXiv:2412.19437 section
    3.2.1). Needs ep > 1."""
    ep_dedup: bool = False
    """The expert dispatch sends each token once to each remote node that holds any of its
    experts and forwards it there over the node's links, and the combine returns it alike:
    Megatron-LM's flex dispatcher with DeepEP or HybridEP (``--moe-token-dispatcher-type flex
    --moe-flex-dispatcher-backend deepep``; ``megatron/core/transformer/moe/README.md``: "removes
    redundant tokens during cross-node communication"), DeepSeek-V3's dispatch (arXiv:2412.19437
    section 3.2.2). False: NCCL's all-to-all, a copy per expert. Needs ep > 1."""
    shard_group: int | None = None
    """Ranks each ZeRO shard group spans (shard within, replicate across); None shards over the
    whole data-parallel group (dp * sp). A multiple of sp that divides dp * sp. With zero=3 it
    is HSDP: torchtitan shards over ``dp_shard * cp`` and replicates over ``dp_replicate``
    (``torchtitan/distributed/parallel_dims.py``, b5bcd76c). With zero=1 it is Megatron-LM's
    partial distributed optimizer (``--num-distributed-optimizer-instances`` dp * sp /
    shard_group): the optimizer state sharded within each group, the gradients
    reduce-scattered within it and all-reduced across the groups, the weights all-gathered
    within it (``megatron/core/distributed/param_and_grad_buffer.py``, d98e8a64); InternLM's
    ``zero1`` size shards the same way. Needs zero=1 or 3."""
    recompute_layers: int | None = None
    """Partial full recompute: of each model chunk's transformer layers (each pipeline stage's;
    each virtual stage's with v > 1), the first ``recompute_layers`` are recomputed and the
    rest keep all their activations, as Megatron-LM's ``--recompute-granularity full
    --recompute-method block --recompute-num-layers N`` runs (``megatron/core/recompute.py``,
    d98e8a64: layer i of a block is checkpointed when i < N, so a chunk of fewer layers
    recomputes them all). None: every layer. Needs recompute=full."""
    offload_layers: int | None = None
    """Activation offloading: the first ``offload_layers`` transformer layers copy the
    activations they keep for backward to host memory as the forward goes on and back before
    their backward, as Megatron-Core's ``--cpu-offloading --cpu-offloading-num-layers N`` runs
    (Transformer Engine's ``get_cpu_offload_context``: each layer's copy runs beside the next
    layer's compute, each reload beside the backward of the layer after it). Megatron-Core
    refuses it with pipeline parallelism or any activation recompute, and for all the layers
    (``megatron/core/transformer/transformer_config.py``, d98e8a64), so it needs pp=1,
    recompute=none and fewer than the model's layers. None: no offloading."""

    def __post_init__(self) -> None:
        # The common case in one expression (a million-plan space builds a million of these);
        # anything else goes through the checks that name what is wrong.
        if not (type(self.dp) is int and type(self.tp) is int and type(self.pp) is int
                and type(self.sp) is int and type(self.micro_batch) is int
                and type(self.v) is int and type(self.ep) is int and self.dp >= 1
                and self.tp >= 1 and self.pp >= 1 and self.sp >= 1 and self.micro_batch >= 1
                and self.v >= 1 and self.ep >= 1):
            self._check_degrees()
        if self.schedule is Schedule.ZBV:
            if self.v != 2:
                raise ValueError(f"schedule=zbv runs exactly 2 model chunks per rank; set v=2"
                                 f" (got v={self.v})")
        elif self.v != 1 and self.schedule is not Schedule.INTERLEAVED:
            raise ValueError(f"v > 1 needs schedule=interleaved, but got schedule={self.schedule}")
        if self.first_stage_layers is not None or self.last_stage_layers is not None:
            for name in ("first_stage_layers", "last_stage_layers"):
                value = getattr(self, name)
                if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                          or value < 1):
                    raise ValueError(f"`{name} >= 1` must hold, but got {name}={value!r}")
        if self.layout is not None:
            self._check_layout()
        if self.shard_group is not None:
            self._check_shard_group()
        if self.recompute_layers is not None:
            self._check_recompute_layers()
        if self.offload_layers is not None:
            self._check_offload_layers()
        if self.etp is not None or self.ep > 1:
            self._check_experts()
        if not _is_placement(self.placement):
            raise ValueError(
                "placement must name each of dp, tp, pp, sp once, but got"
                f" {', '.join(self.placement)}"
            )

    def _check_experts(self) -> None:
        etp = self.etp
        if etp is not None and (isinstance(etp, bool) or not isinstance(etp, int) or etp < 1):
            raise ValueError(f"`etp >= 1` must hold, but got etp={etp!r}")
        ranks = self.tp * self.sp * self.dp
        if ranks % (self.expert_tp * self.ep):
            raise ValueError(
                f"ep * etp = {self.ep} * {self.expert_tp} must divide tp * sp * dp = {ranks}"
                " (expert parallelism is carved out of a stage's tp, sp and dp ranks)")

    def _check_degrees(self) -> None:
        for name in ("dp", "tp", "pp", "sp", "micro_batch", "v", "ep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name} >= 1` must hold, but got {name}={value!r}")

    def _check_layout(self) -> None:
        layout = self.layout
        assert layout is not None
        if not isinstance(layout, tuple) or not all(
                type(n) is int and n >= 0 for n in layout):
            raise ValueError(f"layout must be a tuple of layer counts >= 0, but got {layout!r}")
        if len(layout) != self.pp * self.v:
            raise ValueError(
                f"layout has {len(layout)} virtual stages, but pp * v = {self.pp} * {self.v}"
                f" = {self.pp * self.v}; give pp * v stages (Megatron derives v from the layout)")
        if self.first_stage_layers is not None or self.last_stage_layers is not None:
            raise ValueError("layout cannot be combined with first_stage_layers /"
                             " last_stage_layers (Megatron refuses both); give one of them")

    def _check_offload_layers(self) -> None:
        n = self.offload_layers
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"`offload_layers >= 1` must hold, but got offload_layers={n!r}"
                             " (for no offloading leave it unset)")
        if self.pp != 1:
            raise ValueError(f"offload_layers={n} needs pp=1 (Megatron-Core offloads"
                             f" activations only without pipeline parallelism), but got"
                             f" pp={self.pp}")
        if self.recompute is not Recompute.NONE:
            raise ValueError(f"offload_layers={n} needs recompute=none (Megatron-Core does not"
                             f" offload with activation recompute), but got"
                             f" recompute={self.recompute}")

    def _check_recompute_layers(self) -> None:
        n = self.recompute_layers
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"`recompute_layers >= 1` must hold, but got recompute_layers={n!r}"
                             " (for no recompute set recompute=none)")
        if self.recompute is not Recompute.FULL:
            raise ValueError(f"recompute_layers={n} needs recompute=full (it says how many of"
                             f" each stage's layers are fully recomputed), but got"
                             f" recompute={self.recompute}")

    def _check_shard_group(self) -> None:
        g, group = self.shard_group, self.dp * self.sp
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise ValueError(f"`shard_group >= 1` must hold, but got shard_group={g!r}")
        if self.zero not in (ZeroStage.OPTIMIZER, ZeroStage.PARAMETERS):
            raise ValueError(f"shard_group={g} needs zero=1 (a distributed optimizer sharded"
                             f" within groups) or zero=3 (HSDP), but got zero={int(self.zero)}")
        if group % g or g % self.sp:
            raise ValueError(
                f"shard_group={g} must be a multiple of sp={self.sp} dividing dp*sp={group}"
                " (each shard group holds whole sp groups and the replicas tile dp)")

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp * self.sp

    @property
    def expert_tp(self) -> int:
        """Expert tensor parallelism: etp, or tp where it is not set."""
        return self.tp if self.etp is None else self.etp

    @property
    def edp(self) -> int:
        """Expert data parallelism: the ranks holding the same experts, tp * sp * dp / (etp * ep)
        (their expert gradients are reduced, and their expert optimizer state sharded, over it)."""
        return self.tp * self.sp * self.dp // (self.expert_tp * self.ep)

    @property
    def shard_ranks(self) -> int:
        """Ranks that shard ZeRO's states: the shard group (HSDP, or a partial distributed
        optimizer), else dp * sp."""
        return self.dp * self.sp if self.shard_group is None else self.shard_group

    @property
    def replicas(self) -> int:
        """Replica groups of the ZeRO shards: dp * sp / shard ranks (1 without a shard
        group)."""
        return self.dp * self.sp // self.shard_ranks

    @property
    def uneven(self) -> bool:
        """The first or last stage holds a set number of layers, or a layout sets them all."""
        return (self.first_stage_layers is not None or self.last_stage_layers is not None
                or self.layout is not None)

    def stage_layers(self, layers: int) -> tuple[int, ...]:
        """Transformer layers on each pipeline stage, first to last: Megatron-LM's rule (the
        first and last stages hold their set counts, the stages between split the rest
        evenly; ``transformer_config.py`` d98e8a64). A ValueError when the rest does not
        divide; :func:`simcore.check` says why in one line."""
        first, last, pp = self.first_stage_layers, self.last_stage_layers, self.pp
        if self.layout is not None:
            return tuple(sum(self.layout[c * pp + r] for c in range(self.v)) for r in range(pp))
        if not self.uneven:
            return (layers // pp,) * pp
        if pp == 1:
            raise ValueError("first_stage_layers / last_stage_layers need pp >= 2")
        rest = layers - (first or 0) - (last or 0)
        middle_stages = pp - (first is not None) - (last is not None)
        given = " and ".join(f"{name}={n}" for name, n in (("first_stage_layers", first),
                                                             ("last_stage_layers", last))
                             if n is not None)
        if rest < 0:
            raise ValueError(f"{given} hold {layers - rest} layers, more than the model's"
                             f" {layers}")
        if not middle_stages and rest:
            raise ValueError(f"{given} hold {layers - rest} of the model's {layers} layers, and"
                             f" pp={pp} has no other stage for the {rest} left")
        if middle_stages and (not rest or rest % middle_stages):
            others = f"the other {middle_stages} stage{'s' if middle_stages > 1 else ''}"
            raise ValueError(f"{given} leave {rest} of the model's {layers} layers for {others}"
                             f" of pp={pp}; they must split evenly")
        middle = rest // middle_stages if middle_stages else 0
        return ((middle if first is None else first,) + (middle,) * (pp - 2)
                + (middle if last is None else last,))

    def short_ends(self, layers: int) -> tuple[bool, bool] | None:
        """Whether the first / last stage is one layer short as Megatron-LM's
        ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``
        make it with v > 1: the embedding (the loss) counts as a layer, every stage holds
        ``N = (layers + ends) / pp`` slots, v divides N, and only the first virtual stage of the
        first stage (the last of the last) holds one layer fewer
        (``megatron/core/transformer/transformer_block.py`` ``get_num_layers_to_build``,
        d98e8a64). None where the stages are not split so with v > 1 (:meth:`stage_layers`'s
        counts are then each a multiple of v, or the plan is refused)."""
        if self.v == 1 or not self.uneven or self.layout is not None:
            return None
        counts = self.stage_layers(layers)
        if all(n % self.v == 0 for n in counts):
            return None  # --decoder-first/last-pipeline-num-layers
        n = counts[0] + (counts[0] % self.v != 0)  # the slots of every stage
        if (n % self.v or any(c != n for c in counts[1:-1])
                or counts[0] not in (n, n - 1) or counts[-1] not in (n, n - 1)):
            return None
        return counts[0] == n - 1, counts[-1] == n - 1

    def chunk_layers(self, layers: int, stage: int) -> tuple[int, ...]:
        """Transformer layers of each of stage ``stage``'s v model chunks: its count split
        evenly, but for the short first or last virtual stage of :meth:`short_ends`, or as the
        layout gives them."""
        if self.layout is not None:
            return tuple(self.layout[c * self.pp + stage] for c in range(self.v))
        count = self.stage_layers(layers)[stage]
        ends = self.short_ends(layers)
        if ends is None:
            return (count // self.v,) * self.v
        per_chunk = (count + (count % self.v != 0)) // self.v
        chunks = [per_chunk] * self.v
        if stage == 0 and ends[0]:
            chunks[0] -= 1
        if stage == self.pp - 1 and ends[1]:
            chunks[-1] -= 1
        return tuple(chunks)
