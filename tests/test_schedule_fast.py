"""The fast paths of a collective estimate agree exactly with their references: the chunk
schedule with the event list (``_event_schedule``), the compiled phase durations with the
per-message formulas, and whole estimates on the catalog systems with the event list."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.catalog import load_catalog
from simcore.collectives import _schedule, collective_time
from simcore.collectives._base import Costs, Link
from simcore.collectives._direct import DirectCollective
from simcore.collectives._flat import FlatLink
from simcore.collectives._halving_doubling import HalvingDoublingCollective
from simcore.collectives._ring import RingCollective
from simcore.collectives._schedule import (
    _event_schedule,
    _up_then_down_schedule,
    schedule_chunks,
)
from simcore.collectives._schedule_levels import _merged_levels
from simcore.network import (
    AlgorithmChoice,
    Collective,
    CollectiveScheduling,
    Network,
    NetworkDim,
    Topology,
)

GIB = 2**30


def _up_and_down(levels: int, ids: list[int]) -> list[int]:
    up = ids[:levels]
    return up + up[-2::-1]


durations_small = st.integers(1, 4)  # many ties in one tick
durations_large = st.integers(1, 1_000_000)


@settings(max_examples=600, deadline=None)
@given(
    levels=st.integers(2, 6),
    chunks=st.integers(1, 24),
    active=st.integers(1, 8),
    ids=st.permutations(range(6)),
    data=st.data(),
)
def test_up_then_down_matches_the_event_list(levels, chunks, active, ids, data) -> None:
    durations = data.draw(st.lists(st.one_of(durations_small, durations_large),
                                   min_size=2 * levels - 1, max_size=2 * levels - 1))
    queues = _up_and_down(levels, list(ids))
    fast = _up_then_down_schedule(chunks, durations, queues, active)
    if fast is not None:
        assert fast == _event_schedule(chunks, durations, queues, active)
    assert schedule_chunks(chunks, durations, queues, active) == _event_schedule(
        chunks, durations, queues, active
    )


@pytest.mark.parametrize("levels", [2, 3, 4, 5])
def test_up_then_down_matches_the_event_list_in_tie_heavy_sweeps(levels) -> None:
    # short phases put many arrivals of both ways into one tick at one queue, where the order
    # of service decides; a seeded sweep meets far more of those than the examples above
    rng = random.Random(levels)
    queues = _up_and_down(levels, list(range(levels)))
    fast_cases = 0
    for _ in range(4000):
        hi = rng.choice([2, 3, 5, 10, 1000])
        durations = [rng.randint(1, hi) for _ in range(2 * levels - 1)]
        chunks, active = rng.randint(1, 20), rng.randint(1, 7)
        fast = _up_then_down_schedule(chunks, durations, queues, active)
        if fast is not None:
            fast_cases += 1
            assert fast == _event_schedule(chunks, durations, queues, active), (
                chunks, active, durations)
    assert fast_cases > 2000


@settings(max_examples=300, deadline=None)
@given(
    levels=st.integers(2, 6),
    chunks=st.integers(1, 24),
    active=st.integers(1, 8),
    data=st.data(),
)
def test_distinct_durations_need_no_event_list(levels, chunks, active, data) -> None:
    # the fast path gives up only on a same-tick tie behind two equally long phases
    durations = data.draw(st.lists(durations_large, min_size=2 * levels - 1,
                                   max_size=2 * levels - 1, unique=True))
    queues = _up_and_down(levels, list(range(levels)))
    fast = _up_then_down_schedule(chunks, durations, queues, active)
    assert fast == _event_schedule(chunks, durations, queues, active)


@settings(max_examples=300, deadline=None)
@given(
    levels=st.integers(3, 6),
    chunks=st.integers(1, 24),
    active=st.integers(1, 8),
    data=st.data(),
)
def test_the_one_heap_merge_matches_the_event_list_at_any_depth(levels, chunks, active,
                                                                data) -> None:
    # _merged_levels serves deeper networks; checked here also where _two_levels and
    # _three_levels serve, so the specialised merges have a second, independent witness
    n = 2 * levels - 1
    durations = data.draw(st.lists(st.one_of(durations_small, durations_large),
                                   min_size=n, max_size=n))
    up_first = []
    for q in range(1, levels - 1):
        up_source, down_source = durations[q - 1], durations[n - 2 - q]
        if up_source == down_source:
            return
        up_first.append(up_source > down_source)
    level0 = [(c // active + 1) * durations[0] for c in range(chunks)]
    busy0 = level0[-active:] if chunks >= active else [0] * (active - chunks) + level0
    queues = _up_and_down(levels, list(range(levels)))
    assert _merged_levels(level0, busy0, durations, active, up_first) == _event_schedule(
        chunks, durations, queues, active
    )


@settings(max_examples=200, deadline=None)
@given(
    phases=st.integers(1, 5),
    chunks=st.integers(1, 24),
    active=st.integers(1, 8),
    data=st.data(),
)
def test_one_phase_and_flow_shop_match_the_event_list(phases, chunks, active, data) -> None:
    durations = data.draw(st.lists(st.integers(1, 100_000), min_size=phases, max_size=phases))
    queues = list(range(phases))
    assert schedule_chunks(chunks, durations, queues, active) == _event_schedule(
        chunks, durations, queues, active
    )


# ---- whole estimates on the catalog systems: fast schedule == event list ------------------

_SYSTEMS = ["lab-system1", "tpu-512", "dgx-2k", "lab-system2", "dgx-h100-16384", "R4S2"]


@pytest.mark.parametrize("system", _SYSTEMS)
def test_catalog_estimates_match_the_event_list(system, monkeypatch) -> None:
    base = load_catalog().system(system).network
    rng = random.Random(system)
    networks = [base] + [
        dataclasses.replace(base, scheduling=dataclasses.replace(
            base.scheduling, preferred_dataset_splits=splits, active_chunks_per_dim=active))
        for splits, active in [(1, 1), (4, 2), (16, 3), (10, 8), (64, 4)]
    ]
    sizes = [2**k for k in range(10, 34, 3)] + [rng.randint(1, 2**33) for _ in range(6)]
    ops = []
    for op in Collective:
        try:
            collective_time(base, op, 2**20)
        except ValueError:  # e.g. all-to-all on a halvingDoubling dimension
            continue
        ops.append(op)
    cases = list(itertools.product(networks, ops, sizes))
    fast = [collective_time(net, op, size).time_ns for net, op, size in cases]
    monkeypatch.setattr(_schedule, "_up_down", lambda *args: None)  # always the event list
    assert fast == [collective_time(net, op, size).time_ns for net, op, size in cases]


# ---- compiled phase durations == the per-message formulas --------------------------------


def _send(link: Link | FlatLink, offset: int, message_bytes: int) -> int:
    """ASTRA-sim's message time, from the topology's hop count (no cached latencies)."""
    if isinstance(link, FlatLink):
        stride = 1
        for sub in link.links:
            if offset < stride * sub.npus:
                return _send(sub, offset // stride, message_bytes)
            stride *= sub.npus
        raise AssertionError(offset)
    return link.message_ns(link.topology.offset_hops(offset), message_bytes)


def _ring_ns(op: Collective, n: int, d: int, link, costs: Costs) -> int:
    e = costs.endpoint_ns
    if op is Collective.ALL_GATHER:
        return e + (n - 1) * (_send(link, 1, d) + e)
    m = d // n
    step = _send(link, 1, m) + e
    if op is Collective.ALL_REDUCE:
        return e + 2 * (n - 1) * step + (n - 1) * costs.reduce_ns(m)
    if op is Collective.REDUCE_SCATTER:
        return e + (n - 1) * (step + costs.reduce_ns(m))
    return e + n * (n - 1) // 2 * step


def _halving_doubling_ns(op: Collective, n: int, d: int, link, costs: Costs) -> int:
    e, steps = costs.endpoint_ns, n.bit_length() - 1
    if op is Collective.ALL_GATHER:
        return e + sum(_send(link, n >> (k + 1), d << k) + e for k in range(steps))
    sizes = [d >> k for k in range(1, steps + 1)]
    t = e + sum(_send(link, 1 << k, m) + e for k, m in enumerate(sizes))
    t += sum(costs.reduce_ns(m) for m in sizes[1:])
    if op is Collective.ALL_REDUCE:
        base = 2 * (sizes[-1] // 2)
        t += sum(_send(link, n >> (k + 1), base << k) + e for k in range(steps))
    return t


def _direct_ns(op: Collective, n: int, d: int, link: Link, costs: Costs) -> int:
    e = costs.endpoint_ns
    farthest = max(link.topology.offset_hops(j) for j in range(1, n))

    def slowest(b: int) -> int:
        return link.message_ns(farthest, b)

    if op is Collective.ALL_GATHER:
        return 2 * e + slowest(d)
    m = d // n
    if op is Collective.ALL_TO_ALL:
        return 2 * e + slowest(m)
    r = costs.reduce_ns(m)
    if op is Collective.REDUCE_SCATTER:
        return 2 * e + slowest(m) + r
    sends = [_send(link, j, m) for j in range(1, n)]
    arrivals = [e + s for s in sends]
    done = sorted(a + e + r for a in arrivals)
    release = next(g for g in done if g >= max(arrivals))
    return e + max(max(g, release) + s for g, s in zip(done, sends))


_DIMS = [
    NetworkDim(topology=Topology.RING, npus=8, bandwidth_bytes_per_s=25 * GIB, latency_s=700e-9),
    NetworkDim(topology=Topology.SWITCH, npus=16, bandwidth_bytes_per_s=100 * GIB,
               latency_s=300e-9),
    NetworkDim(topology=Topology.FULLY_CONNECTED, npus=8, bandwidth_bytes_per_s=128.5714 * GIB,
               latency_s=20e-9),
    NetworkDim(topology=Topology.MESH_2D, npus=16, width=4, bandwidth_bytes_per_s=37.3 * GIB,
               latency_s=123.4e-9),
    NetworkDim(topology=Topology.TORUS_2D, npus=8, width=4, bandwidth_bytes_per_s=6.25 * GIB,
               latency_s=1e-6),
]
_COSTS = Costs(endpoint_ns=10, local_mem_bytes_per_s=2.765e12)
_SIZES = [1, 7, 4096, 999_983, 2**20, 3 * 2**27 + 5, 2**33]


@pytest.mark.parametrize("dim", _DIMS, ids=lambda d: d.topology.value)
def test_phase_functions_match_the_message_formulas(dim) -> None:
    link = Link(dim)
    n = dim.npus
    algorithms = [(RingCollective(), _ring_ns), (DirectCollective(), _direct_ns)]
    if n & (n - 1) == 0:
        algorithms.append((HalvingDoublingCollective(), _halving_doubling_ns))
    for (algorithm, reference), op in itertools.product(algorithms, Collective):
        if op not in algorithm.supports:
            continue
        phase = algorithm.phase_fn(op, n, link, _COSTS)
        output = algorithm.output_fn(op, n)
        for d in _SIZES:
            expected = reference(op, n, d, link, _COSTS)
            assert phase(d) == algorithm.phase_ns(op, n, d, link, _COSTS) == expected, (op, d)
            assert output(d) == algorithm.output_bytes(op, n, d)


def test_one_ring_phases_match_the_message_formulas() -> None:
    # oneRing / oneHalvingDoubling: one ring over every NPU, each offset on its own dimension
    dims = (_DIMS[0], dataclasses.replace(_DIMS[1], npus=4), _DIMS[2])
    network = Network(dims=dims, scheduling=CollectiveScheduling())
    flat = FlatLink(network, [Link(d) for d in dims])
    n = network.npus
    for (algorithm, reference), op in itertools.product(
        [(RingCollective(), _ring_ns), (HalvingDoublingCollective(), _halving_doubling_ns)],
        Collective,
    ):
        if op not in algorithm.supports:
            continue
        phase = algorithm.phase_fn(op, n, flat, _COSTS)
        for d in _SIZES:
            assert phase(d) == reference(op, n, d, flat, _COSTS), (algorithm.name, op, d)
    for name, reference in (("oneRing", _ring_ns), ("oneHalvingDoubling", _halving_doubling_ns)):
        choice = {c: AlgorithmChoice.parse(name) for c in Collective}
        one = Network(dims=tuple(dataclasses.replace(d, algorithms=choice) for d in dims))
        timing = collective_time(one, Collective.ALL_REDUCE, 2**26)
        assert timing.phase_ns == (reference(Collective.ALL_REDUCE, n, timing.chunk_bytes,
                                             flat, Costs.of(one.scheduling)),)
