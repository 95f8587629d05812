"""Why FSDP can take more memory than no FSDP in the stage convention (issue 20 #13).

STAGE's fully-sharded template with recompute (astra-sim/symbolic_tensor_graph, branch recomp,
``sharding_spreadsheets/module/fully_sharded_fullset_recomp/multi_head_attention.csv``, row
``qk_recomp,N,q,k,...``) recomputes the attention scores from the forward's own ``q`` and ``k``,
where the unsharded template (``fullset_recomp``, row ``qk_recomp,N,q_recomp,k_recomp,...``)
recomputes them from ``q_recomp`` and ``k_recomp``. ASTRA-sim's tracker frees a tensor after its
last consumer, so with FSDP and recompute every layer's forward ``q`` and ``k`` stay alive until
that layer's backward. The stage convention replays STAGE's graph as ASTRA-sim runs it, so it
does the same: where the weights are already split thin (tp 8), keeping q and k costs more than
sharding the weights saves. ASTRA-sim + STAGE give these figures; they are STAGE's, not real
FSDP's (which re-gathers weights in backward and keeps no forward activation under recompute).
"""

from __future__ import annotations

from planner.catalog import load_catalog
from simcore import estimate
from simcore.specs import Convention, Recompute, Strategy, TrainingSpec, ZeroStage
from simcore.stage._templates import attention

TRAINING = TrainingSpec(global_batch=512, seq_len=1024)  # the lab's Llama-70B question


def _inputs(rows, name: str) -> tuple[str, str]:
    row = next(r for r in rows if r.name == name)
    return row.x1, row.x2


def test_the_templates_recompute_scores_as_stage_s_spreadsheets_do() -> None:
    assert _inputs(attention(weight_sharded=True, recompute=True), "qk_recomp") == ("q", "k")
    assert _inputs(attention(weight_sharded=False, recompute=True), "qk_recomp") == (
        "q_recomp", "k_recomp")


def test_fsdp_with_recompute_at_tp8_keeps_q_and_k_and_outweighs_the_sharding() -> None:
    c = load_catalog()
    model, system = c.model("llama70b"), c.system("lab-system1")
    dp, tp = 8, 8
    plain = Strategy(dp=dp, tp=tp, recompute=Recompute.FULL)
    fsdp = Strategy(dp=dp, tp=tp, recompute=Recompute.FULL, zero=ZeroStage.PARAMETERS)
    no_fsdp = estimate(model, system, TRAINING, plain, Convention.STAGE).memory.total
    with_fsdp = estimate(model, system, TRAINING, fsdp, Convention.STAGE).memory.total
    # By hand (tracker units, one per element): q and k kept, 2 x (batch/dp) x seq x
    # (hidden/tp) per layer = 2 x 64 x 1024 x 1024 x 80 = 10,737,418,240; sharding the layers'
    # weights (wq, wk, wv: hidden^2/tp each; the two FFN matrices hidden x ffn/tp each) over dp
    # saves at most (3 x 8192^2 + 2 x 8192 x 28672) / 8 x 80 x (1 - 1/8) = 5,872,025,600.
    kept, saved = 10_737_418_240, 5_872_025_600
    assert with_fsdp > no_fsdp  # 24.09 GB against 19.41 GB
    assert kept - saved - 0.05 * kept <= with_fsdp - no_fsdp <= kept
