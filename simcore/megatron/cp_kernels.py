"""The fused attention core's kernels under context parallelism, as Transformer Engine runs them.

With cp ranks each holding ``tokens`` queries of the sequence (two chunks of the load-balanced
split, the causal work shared evenly), the attention's FLOPs per rank are the same whichever way
K and V travel; the kernels around it are not (NVIDIA/TransformerEngine@v2.9
``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``):

- ``p2p`` (:class:`AttnFuncWithCPAndKVP2P`, Megatron-LM's default): cp steps, each one attention
  kernel on the K and V chunk in hand while the next chunk is sent on. Forward: K and V
  concatenated into the send buffer (one copy), the running softmax statistics corrected after
  each step but the first (``flash_attn_fwd_softmax_lse_correction``: a max, a log1p and an exp
  over an fp32 value per query and head), and each step's output merged into the running one
  (``flash_attn_fwd_out_correction``, and its ``_init`` for step 0: read the step's output and
  the running one, write it; in the attention's 16-bit type). Backward: per step one attention
  kernel, then the step's dQ added into dQ and its dK and dV into the chunk's running gradient
  (``dq.add_``, ``dk.add_``, ``dv.add_``). The ranks step together, so the rank whose every
  step is a whole chunk paces them: every merge is priced at the whole chunk.
- ``a2a`` (:class:`AttnFuncWithCPAndQKVOA2A`, DeepSpeed-Ulysses): Q, K and V all-to-all'd to
  the whole sequence for cp-th of the heads, each made contiguous before and reordered after
  (``flash_attn_a2a_communicate``: two copies a tensor), one attention kernel, and the output
  back the same way; backward the output and its gradient forward, dQ, dK and dV back.
- ``all_gather`` (:class:`AttnFuncWithCPAndKVAllGather`): K and V all-gathered whole and put in
  sequence order (``index_select``, one copy each), then two attention kernels, one per local
  query chunk over the keys before it; no merge. Backward: K and V gathered and reordered again,
  two attention kernels, the two chunks' dQ copied into place, each chunk's dK and dV made
  contiguous and added into zero-filled whole-sequence buffers, reordered, and
  reduce-scattered.

Each element-wise kernel costs its bytes at the device's memory rate with the launch floor
(:meth:`simcore.megatron.kernel_costs.KernelCosts.elementwise`); each attention kernel its share of
the FLOPs at the attention rate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simcore.specs import CpComm

if TYPE_CHECKING:
    from simcore.megatron.kernels import KernelCosts

__all__ = ["LSE_BYTES", "context_parallel_core"]

LSE_BYTES = 4
"""The softmax statistic (log-sum-exp) per query and head: fp32."""


def context_parallel_core(costs: KernelCosts, cp_comm: CpComm, *, cp: int, flops: float,
                          backward_flops: float, queries: float, keys: float, heads: float,
                          q_width: float, kv_width: float,
                          act_bytes: int) -> tuple[list[float], list[float]]:
    """Seconds of each forward and backward kernel of one layer's attention core on one of
    ``cp`` ranks: ``flops`` and ``backward_flops`` the attention's (its share of the causal
    work), ``queries`` the rank's tokens of the micro-batch and ``keys`` the whole
    micro-batch's (each times the sequences), ``heads`` and the Q and K widths this tp
    rank's."""
    a = act_bytes
    q_elems = queries * q_width
    k_elems = queries * kv_width
    if cp_comm is CpComm.ALL_GATHER:
        return _all_gather_core(costs, flops, backward_flops, q_elems, k_elems,
                                keys * kv_width, a)
    if cp_comm is CpComm.A2A:
        # each tensor made contiguous before its all-to-all and its chunks reordered after
        # (flash_attn_a2a_communicate): two copies of it, each read and written
        q_copies = [costs.elementwise(2 * a * q_elems)] * 2
        k_copies = [costs.elementwise(2 * a * k_elems)] * 2
        forward = q_copies + k_copies * 2 + [costs.attention(flops)] + q_copies  # Q, K, V; out
        backward = q_copies * 2 + [costs.attention(backward_flops)] + q_copies + k_copies * 2
        return forward, backward
    lse = 3 * LSE_BYTES * queries * heads
    forward = ([costs.elementwise(2 * a * 2 * k_elems)]  # K and V into the send buffer
               + [costs.attention(flops / cp)] * cp
               + [costs.elementwise(lse)] * (cp - 1)
               + [costs.elementwise(3 * a * q_elems)] * cp)
    step = [costs.attention(backward_flops / cp), costs.elementwise(3 * a * q_elems),
            costs.elementwise(3 * a * k_elems), costs.elementwise(3 * a * k_elems)]
    return forward, step * cp


def _all_gather_core(costs: KernelCosts, flops: float, backward_flops: float, q_elems: float,
                     k_elems: float, gathered: float, a: int) -> tuple[list[float], list[float]]:
    """:func:`context_parallel_core`'s ``all_gather`` kernels; ``gathered``: the whole
    sequence's K elements (and as many of V). Each of the two steps takes its query chunk
    (half the rank's) and the keys before it: the two steps' keys come to the whole sequence's
    (a rank's chunks are the r-th and the (2cp - r - 1)-th of 2cp), so each step's copies of K
    and V are priced at half of it."""
    half_q = a * q_elems  # read and write half the rank's queries
    half_kv = a * gathered  # read and write half the gathered keys
    gather = ([costs.elementwise(2 * a * k_elems)] * 2  # local K, V made contiguous
              + [costs.elementwise(2 * a * gathered)] * 2)  # gathered K, V put in order
    forward_step = [costs.elementwise(half_q),  # the chunk's queries contiguous
                    costs.elementwise(half_kv), costs.elementwise(half_kv),  # K, V contiguous
                    costs.attention(flops / 2),
                    costs.elementwise(half_q)]  # its output into place
    backward_step = ([costs.elementwise(half_q)] * 3  # queries, output, its gradient
                     + [costs.elementwise(half_kv)] * 2
                     + [costs.attention(backward_flops / 2),
                        costs.elementwise(half_q)]  # dQ into place
                     + [costs.elementwise(half_kv)] * 2  # dK, dV contiguous
                     + [costs.elementwise(1.5 * a * gathered)] * 2)  # added into the buffers
    scatter = ([costs.elementwise(a * gathered)] * 2  # zero-filled dK, dV buffers
               + [costs.elementwise(2 * a * gathered)] * 2  # put back in rank order
               + [costs.elementwise(2 * a * k_elems)] * 2)  # the scattered dK, dV contiguous
    return gather + forward_step * 2, gather + backward_step * 2 + scatter
