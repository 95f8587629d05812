"""The fast ``astra_estimate`` (a long single-stage trace made by repeating a short model's middle
block, flat replay, direct memory timeline) equals the plain build + reference replay exactly."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from planner.catalog import load_catalog
from simcore.stage import StageArgs, astra_estimate, build_model
from simcore.stage import _estimate as estimate_module
from simcore.stage._estimate import _Durations
from simcore.stage._fast import K, repeated_rank
from simcore.stage._replay import flatten
from tests.stage_reference import replay_reference

CATALOG = load_catalog()
SYSTEMS = {"R4S2": (312e12, 2039e9), "lab-system1": (450e12, 3000e9)}
SMALL = {"dmodel": 1024, "dff": 4096, "head": 16, "seq": 256, "batch": 64, "din": 1024, "dout": 1024}


def _reference(args: StageArgs, network, **roofline):
    """The plain path: build the whole model, replay it with :func:`replay_reference`."""
    mp = pytest.MonkeyPatch()
    mp.setattr(estimate_module, "replay", replay_reference)
    mp.setattr(estimate_module, "repeated_rank", lambda *a: None)
    try:
        return astra_estimate(args, network, **roofline)
    finally:
        mp.undo()


def _assert_same(fast, ref) -> None:
    """Equal, but for the roofline totals: float sums, scaled in the fast path, so equal to
    rounding."""
    assert replace(fast, roofline=None) == replace(ref, roofline=None)
    assert fast.metrics() == pytest.approx(ref.metrics(), rel=1e-12)


def _degrees(npus: int):
    pows = [1 << k for k in range(npus.bit_length()) if npus % (1 << k) == 0]
    for dp, tp, sp, pp in itertools.product(pows, repeat=4):
        if dp * tp * sp * pp == npus:
            yield {"dp": dp, "tp": tp, "sp": sp, "pp": pp}


def _cases():
    cases = []
    for system in SYSTEMS:
        npus = CATALOG.system(system).network.npus
        degrees = list(_degrees(npus))
        # a spread of degree mixes, every ws/rc combination, pp = 1 mostly (the fast case)
        picks = [d for d in degrees if d["pp"] == 1][:: max(1, len(degrees) // 12)]
        picks += [d for d in degrees if d["pp"] > 1][:2]
        for i, d in enumerate(picks):
            ws, rc = divmod(i % 4, 2)
            cases.append((system, d, bool(ws), bool(rc)))
    return cases


@pytest.mark.parametrize(("system", "degrees", "ws", "rc"), _cases())
def test_fast_equals_reference(system, degrees, ws, rc) -> None:
    network = CATALOG.system(system).network
    peak, mem = SYSTEMS[system]
    for n in range(2, 13):
        if degrees["pp"] > n + 1:
            continue
        args = StageArgs(**SMALL, **degrees, weight_sharded=ws, activation_recompute=rc,
                         num_stacks=n)
        fast = astra_estimate(args, network, peak_ops_per_s=peak, local_mem_bytes_per_s=mem)
        ref = _reference(args, network, peak_ops_per_s=peak, local_mem_bytes_per_s=mem)
        _assert_same(fast, ref)


@pytest.mark.parametrize("n", [5, 6, 9, 17])
@pytest.mark.parametrize(("ws", "rc"), [(False, False), (True, True), (True, False)])
def test_repeated_trace_is_the_built_trace(n, ws, rc) -> None:
    # Structurally: node for node the same kind, duration, dependencies and tensors (the
    # repeated trace names tensors by int, the built one by string: a bijection).
    network = CATALOG.system("R4S2").network
    args = StageArgs(**SMALL, dp=2, tp=2, sp=2, weight_sharded=ws, activation_recompute=rc,
                     num_stacks=n)
    d = _Durations(network, 312e12, 2039e9)
    got = repeated_rank(args, d.comp_ns, d.coll_ns, d.p2p_ns, (312e12, 2039e9))
    assert got is not None
    flat = got[0]
    graph = build_model(args).ranks[0]
    want = flatten(graph, d.comp_ns, d.coll_ns, d.p2p_ns)
    assert flat.kind == want.kind
    assert flat.dur == want.dur
    assert flat.link == want.link
    assert flat.deps == want.deps
    names: dict[object, str] = {}
    for side_got, side_want in ((flat.inputs, want.inputs), (flat.outputs, want.outputs)):
        for a, b in zip(side_got, side_want, strict=True):
            assert [s for _, s in a] == [s for _, s in b]
            for (ka, _), (kb, _) in zip(a, b, strict=True):
                assert names.setdefault(ka, kb) == kb
    assert len(set(names.values())) == len(names)
    assert [flat.names(i) for i in range(len(flat.kind))] == [n.name for n in graph.nodes]


def test_fallbacks() -> None:
    network = CATALOG.system("R4S2").network
    d = _Durations(network, 312e12, 2039e9)
    short = StageArgs(**SMALL, dp=8, num_stacks=K)
    assert repeated_rank(short, d.comp_ns, d.coll_ns, d.p2p_ns, (312e12, 2039e9)) is None
    staged = StageArgs(**SMALL, dp=4, pp=2, num_stacks=12)
    assert repeated_rank(staged, d.comp_ns, d.coll_ns, d.p2p_ns, (312e12, 2039e9)) is None


@pytest.mark.parametrize("degrees", [{"dp": 64}, {"dp": 8, "tp": 4, "sp": 2},
                                     {"tp": 64, "activation_recompute": True},
                                     {"dp": 2, "tp": 32, "activation_recompute": True}])
def test_full_size_lab_models(degrees) -> None:
    # llama70b on lab-system1: includes the tp-heavy recompute strategies whose peak memory
    # moves from one place in the step to another only beyond ~26 blocks.
    network = CATALOG.system("lab-system1").network
    args = StageArgs(dmodel=8192, dff=28672, head=64, seq=1024, batch=512, din=32000,
                     dout=32000, num_stacks=80, **degrees)
    roofline = {"peak_ops_per_s": 450e12, "local_mem_bytes_per_s": 3000e9}
    _assert_same(astra_estimate(args, network, **roofline), _reference(args, network, **roofline))


@pytest.mark.parametrize("degrees", [{"dp": 4, "tp": 4, "sp": 4},
                                     {"tp": 8, "sp": 8, "activation_recompute": True}])
def test_full_size_gpt175b_lab_system2(degrees) -> None:
    # The lab's GPT-175B (96 blocks, vocabulary padded to 50,304 as studies/lab4b-gpt175b-
    # system2.yaml does): the block-skipping replay equals the plain reference replay.
    system = CATALOG.system("lab-system2")
    args = StageArgs(dmodel=12288, dff=49152, head=96, seq=1024, batch=512, din=50304,
                     dout=50304, num_stacks=96, **degrees)
    roofline = {"peak_ops_per_s": system.device.peak_flops_per_s,
                "local_mem_bytes_per_s": system.device.hbm_bandwidth_bytes_per_s}
    _assert_same(astra_estimate(args, system.network, **roofline),
                 _reference(args, system.network, **roofline))
