"""The chunk schedule: closed forms and the event list agree, and hand-computed cases hold."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.collectives._schedule import (
    _event_schedule,
    _up_then_down_schedule,
    schedule_chunks,
)


def test_one_phase_runs_in_waves() -> None:
    # NOTES.md 3.1 step 7: T = ceil(chunks / active) * T_chunk; 11 chunks, 4 at a time: 3 waves
    assert schedule_chunks(11, [29_445], [0], 4) == 3 * 29_445


def test_flow_shop_by_hand() -> None:
    # baseline 2-D all-reduce (NOTES.md microbench baseline_opt_2d: 122,900 ns): phases of
    # 22,180 (dim 0) and 25,180 (dim 1) on their own queues, 4 chunks, 1 at a time:
    # dim 1 is the bottleneck: 22,180 + 4 * 25,180 = 122,900
    assert schedule_chunks(4, [22_180, 25_180], [0, 1], 1) == 122_900


def test_shared_queue_by_hand() -> None:
    # NOTES.md 3.3: RS0 16,990, AR1 10,843, AG0 5,200 on queues 0, 1, 0; 4 chunks, 1 active.
    # Queue 0 runs the four RS0 (ends 67,960), then AG0 of chunks 0..3; chunk 3's AR1 ends
    # 67,960 + 10,843 = 78,803 < 67,960 + 3 * 5,200 = 83,560, so AG0 runs back to back:
    # 67,960 + 4 * 5,200 = 88,760
    assert schedule_chunks(4, [16_990, 10_843, 5_200], [0, 1, 0], 1) == 88_760
    # one chunk: nothing to overlap, 16,990 + 10,843 + 5,200 = 33,033
    assert schedule_chunks(1, [16_990, 10_843, 5_200], [0, 1, 0], 1) == 33_033


@settings(max_examples=300, deadline=None)
@given(
    chunks=st.integers(1, 16),
    active=st.integers(1, 5),
    dims=st.integers(2, 4),
    data=st.data(),
)
def test_fast_path_agrees_with_the_event_list(chunks, active, dims, data) -> None:
    durations = data.draw(st.lists(st.integers(1, 60_000), min_size=2 * dims - 1,
                                   max_size=2 * dims - 1))
    queues = list(range(dims)) + list(range(dims - 2, -1, -1))
    fast = _up_then_down_schedule(chunks, durations, queues, active)
    if fast is not None:
        assert fast == _event_schedule(chunks, durations, queues, active)
