"""The three blocks STAGE recomp assembles a transformer from, restated op by op.

Source: STAGE (astra-sim/symbolic_tensor_graph) branch ``recomp`` commit 0b44904,
``sharding_spreadsheets/module/{fullset,fully_sharded_fullset,*_recomp}/`` and NOTES.md
section 5. Each row is one tensor: a leaf (input, weight or incoming gradient), an einsum
(``M``), an add (``A``), an element-wise op (``E``, ``amp`` ops per element), a reshape (``R``)
or an identity (``I``). Shapes are the per-rank layouts each op *reads* (``x1_shape``,
``x2_shape``); an op's output layout follows from them. ``grad_of`` marks a weight's gradient,
``after`` a control dependency (the recomputed ops wait for backward to reach the block).

Quirks kept on purpose: no attention output projection, no softmax, no FFN activation; with
weight sharding + recompute ``qk_recomp`` reads the forward q and k, not the recomputed ones.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Row", "attention", "embedding", "feed_forward"]


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    op: str
    """``T`` leaf, ``M`` einsum, ``A`` add, ``E`` element-wise, ``R`` reshape, ``I`` identity."""
    x1: str | None = None
    x2: str | None = None
    x1_shape: str = ""
    x2_shape: str = ""
    """For ``R`` the target shape; for ``M`` the second operand's layout."""
    spec: str = ""
    """Einsum spec for ``M``."""
    amp: int = 0
    """Ops per element for ``E``."""
    weight: bool = False
    grad_of: str | None = None
    after: str | None = None


ACT = "Batch/dp, Seq/sp, Dmodel/tp"
"""A hidden-split activation, as STAGE stores every activation between ops."""
ACT_FULL = "Batch/dp, Seq/sp, Dmodel"
HEADS = "Batch/dp, Seq/sp, Dmodel/Head, Head/tp"
HEADS_FULL_SEQ = "Batch/dp, Seq, Dmodel/Head, Head/tp"
SCORES = "Batch/dp, Seq, Seq/sp, Head/tp"
ATT_W = "Dmodel, Dmodel/Head, Head/tp"
"""What an attention einsum reads of wq/wk/wv."""


def _leaf(name: str, shape: str, *, weight: bool = False, grad_of: str | None = None) -> Row:
    return Row(name, "T", x1_shape=shape, weight=weight, grad_of=grad_of)


def _mm(name: str, x1: str, x2: str, spec: str, s1: str, s2: str, *,
        grad_of: str | None = None, after: str | None = None) -> Row:
    return Row(name, "M", x1, x2, s1, s2, spec=spec, grad_of=grad_of, after=after)


def _add(name: str, x1: str, x2: str, *, grad_of: str | None = None) -> Row:
    return Row(name, "A", x1, x2, ACT, ACT, grad_of=grad_of)


def _norm(name: str, x1: str, *, grad_of: str | None = None) -> Row:
    return Row(name, "E", x1, x1_shape=ACT, amp=5, grad_of=grad_of)


def _same(name: str, x1: str, *, grad_of: str | None = None) -> Row:
    return Row(name, "I", x1, x1_shape=ACT, grad_of=grad_of)


def attention(*, weight_sharded: bool, recompute: bool) -> list[Row]:
    """Multi-head attention: q, k, v projections, scores, weighted sum, residual, norm."""
    stored = "Dmodel/dp, Dmodel/(Head*sp), Head/tp" if weight_sharded else ATT_W
    proj = "bsm,mnh->bsnh"
    rows = [
        _leaf("x", ACT),
        _leaf("wq", stored, weight=True),
        _leaf("wk", stored, weight=True),
        _leaf("wv", stored, weight=True),
        _mm("q", "x", "wq", proj, ACT_FULL, ATT_W),
        _mm("k", "x", "wk", proj, ACT_FULL, ATT_W),
        _mm("v", "x", "wv", proj, ACT_FULL, ATT_W),
        _mm("qk", "q", "k", "bsnh,bwnh->bswh", HEADS_FULL_SEQ, HEADS),
        _mm("qkv", "qk", "v", "bswh,bwnh->bsnh", SCORES, HEADS),
        Row("qkv_reshape", "R", "qkv", x1_shape=HEADS, x2_shape=ACT),
        _add("res", "qkv_reshape", "x"),
        _norm("norm", "res"),
    ]
    q, k, v, qk = "q", "k", "v", "qk"
    if recompute:
        q, k, v, qk = "q_recomp", "k_recomp", "v_recomp", "qk_recomp"
        qk_inputs = ("q", "k") if weight_sharded else ("q_recomp", "k_recomp")
        rows += [
            _mm("q_recomp", "x", "wq", proj, ACT_FULL, ATT_W, after="d_res"),
            _mm("k_recomp", "x", "wk", proj, ACT_FULL, ATT_W, after="d_res"),
            _mm("v_recomp", "x", "wv", proj, ACT_FULL, ATT_W, after="d_res"),
            _mm("qk_recomp", *qk_inputs, "bsnh,bwnh->bswh", HEADS_FULL_SEQ, HEADS,
                after="d_res"),
        ]
    d_w = "bsnh,bsm->mnh"
    d_x = "bsnh,mnh->bsm"
    rows += [
        _leaf("d_norm", ACT, grad_of="norm"),
        _norm("d_res", "d_norm", grad_of="res"),
        _same("d_qkv_reshape", "d_res", grad_of="qkv_reshape"),
        Row("d_qkv", "R", "d_qkv_reshape", x1_shape=ACT, x2_shape=HEADS, grad_of="qkv"),
        _mm("d_qk", "d_qkv", v, "bsnh,bwnh->bswh", HEADS_FULL_SEQ, HEADS, grad_of="qk"),
        _mm("d_v", "d_qkv", qk, "bsnh,bswh->bwnh", HEADS_FULL_SEQ, SCORES, grad_of="v"),
        _mm("d_q", "d_qk", k, "bswh,bwnh->bsnh", SCORES, HEADS, grad_of="q"),
        _mm("d_k", "d_qk", q, "bswh,bsnh->bwnh", SCORES, HEADS_FULL_SEQ, grad_of="k"),
        _mm("d_wq", "d_q", "x", d_w, HEADS, ACT_FULL, grad_of="wq"),
        _mm("d_wk", "d_k", "x", d_w, HEADS, ACT_FULL, grad_of="wk"),
        _mm("d_wv", "d_v", "x", d_w, HEADS, ACT_FULL, grad_of="wv"),
        _mm("d_x1", "d_q", "wq", d_x, HEADS, ATT_W),
        _mm("d_x2", "d_k", "wk", d_x, HEADS, ATT_W),
        _mm("d_x3", "d_v", "wv", d_x, HEADS, ATT_W),
        _same("d_x4", "d_res"),
        _add("d_x12", "d_x1", "d_x2"),
        _add("d_x34", "d_x3", "d_x4"),
        _add("d_x", "d_x12", "d_x34", grad_of="x"),
    ]
    return rows


def feed_forward(*, weight_sharded: bool, recompute: bool) -> list[Row]:
    """Two matrices (no activation op), residual, norm."""
    w1 = "Dmodel/(dp*sp), Dff/tp" if weight_sharded else "Dmodel, Dff/tp"
    w2 = "Dff/tp, Dmodel/(dp*sp)" if weight_sharded else "Dff/tp, Dmodel"
    hid = "Batch/dp, Seq/sp, Dff/tp"
    rows = [
        _leaf("x0", ACT),
        _leaf("w1", w1, weight=True),
        _mm("x1", "x0", "w1", "bsm,mn->bsn", ACT_FULL, "Dmodel, Dff/tp"),
        _leaf("w2", w2, weight=True),
        _mm("x2", "x1", "w2", "bsm,mn->bsn", hid, "Dff/tp, Dmodel"),
        _add("res", "x2", "x0"),
        _norm("norm", "res"),
    ]
    x1 = "x1"
    if recompute:
        x1 = "x1_recomp"
        rows.append(_mm("x1_recomp", "x0", "w1", "bsm,mn->bsn", ACT_FULL, "Dmodel, Dff/tp",
                        after="dres"))
    rows += [
        _leaf("dnorm", ACT, grad_of="norm"),
        _norm("dres", "dnorm", grad_of="res"),
        _same("dx2", "dres", grad_of="x2"),
        _mm("dw2", "dx2", x1, "bsn,bsm->mn", ACT_FULL, hid, grad_of="w2"),
        _mm("dx1", "dx2", "w2", "bsn,mn->bsm", ACT_FULL, "Dff/tp, Dmodel", grad_of="x1"),
        _mm("dw1", "dx1", "x0", "bsn,bsm->mn", hid, ACT_FULL, grad_of="w1"),
        _same("dx00", "dres"),
        _mm("dx01", "dx1", "w1", "bsn,mn->bsm", hid, "Dmodel, Dff/tp"),
        _add("dx0", "dx00", "dx01", grad_of="x0"),
    ]
    return rows


def embedding(*, weight_sharded: bool) -> list[Row]:
    """A dense einsum against a one-hot input, with dW and a (useless) dX of the one-hot."""
    w = "Din/(dp*sp), Dout/tp" if weight_sharded else "Din, Dout/tp"
    full_in = "Batch/dp, Seq/sp, Din"
    out = "Batch/dp, Seq/sp, Dout/tp"
    return [
        _leaf("x", "Batch/dp, Seq/sp, Din/tp"),
        _leaf("w", w, weight=True),
        _mm("y", "x", "w", "bsm,mn->bsn", full_in, "Din, Dout/tp"),
        _leaf("dy", out, grad_of="y"),
        _mm("dw", "dy", "x", "bsn,bsm->mn", out, full_in, grad_of="w"),
        _mm("dx", "dy", "w", "bsn,mn->bsm", out, "Din, Dout/tp", grad_of="x"),
    ]
