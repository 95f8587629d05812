"""``simcore.stage.astra_estimate`` against the measured STAGE recomp -> ASTRA-sim runs
(tests/data/astra_results.csv, the 23 Congestion_Unaware rows; systems in
tests/data/astra_systems, NOTES.md section 6.1)."""

from __future__ import annotations

import statistics
import time

import pytest

from planner.astra_io import load_astra_system
from simcore.network import Network, NetworkDim, Topology
from simcore.stage import StageArgs, astra_estimate, roofline_ns
from tests.test_stage_inventory import recomp_rows, stage_args, system_files

# Targets of the task brief (percent of the measured value).
GPU_TOLERANCE = 0.01
WALL_MEDIAN_TOLERANCE = 0.05
WALL_ROW_TOLERANCE = 0.15
PEAK_MEDIAN_TOLERANCE = 0.03
PEAK_ROW_TOLERANCE = 0.10

ROWS = recomp_rows("Congestion_Unaware")


def _estimate(row: dict[str, str]):
    system = load_astra_system(*system_files(row))
    assert system.peak_flops_per_s is not None
    return astra_estimate(stage_args(row), system.network,
                          peak_ops_per_s=system.peak_flops_per_s,
                          local_mem_bytes_per_s=system.local_mem_bandwidth_bytes_per_s)


@pytest.fixture(scope="module")
def estimates() -> list[tuple[dict[str, str], object]]:
    return [(row, _estimate(row)) for row in ROWS]


def _errors(estimates, field: str, column: str) -> list[float]:
    return [abs(getattr(e, field) / float(r[column]) - 1) for r, e in estimates]


def test_rows_present() -> None:
    # tests/data/astra_results.README.md: 23 Congestion_Unaware recomp rows in the team's copy
    assert len(ROWS) == 23


def test_gpu_time_within_tolerance(estimates) -> None:
    assert max(_errors(estimates, "gpu_time", "sys0_gpu_time_ns")) <= GPU_TOLERANCE


def test_wall_time_within_tolerance(estimates) -> None:
    errors = _errors(estimates, "wall_time", "sys0_wall_time_ns")
    assert statistics.median(errors) <= WALL_MEDIAN_TOLERANCE
    assert max(errors) <= WALL_ROW_TOLERANCE


def test_peak_memory_within_tolerance(estimates) -> None:
    errors = _errors(estimates, "peak_memory_usage", "sys0_peak_mem_tracker_units")
    assert statistics.median(errors) <= PEAK_MEDIAN_TOLERANCE
    assert max(errors) <= PEAK_ROW_TOLERANCE


def test_every_reported_figure_is_exact(estimates) -> None:
    # The replay follows ASTRA-sim's scheduling, roofline and tracker rules, so every sys[0]
    # figure and both all-rank maxima agree to the ns / element on every row.
    columns = {
        "wall_time": "sys0_wall_time_ns",
        "gpu_time": "sys0_gpu_time_ns",
        "comm_time": "sys0_comm_time_ns",
        "exposed_comm": "sys0_exposed_comm_ns",
        "peak_memory_usage": "sys0_peak_mem_tracker_units",
        "max_wall_time_all_ranks": "max_finished_all_sys_ns",
        "max_peak_memory_all_ranks": "max_peak_mem_tracker_units_all_sys",
    }
    mismatches = [
        (r["name"], field, getattr(e, field), int(float(r[column])))
        for r, e in estimates
        for field, column in columns.items()
        if getattr(e, field) != int(float(r[column]))
    ]
    assert mismatches == []


def test_the_labs_metrics_are_exact(estimates) -> None:
    # The four figures the lab extracts for sys[0] (ASTRA-sim prints them to 3 decimals):
    # compute-bound %, average compute and memory utilisation %, average operation intensity.
    columns = {
        "compute_bound_pct": "sys0_compute_bound_pct",
        "avg_compute_util_pct": "sys0_avg_compute_util_pct",
        "avg_mem_util_pct": "sys0_avg_mem_util_pct",
        "avg_op_intensity": "sys0_avg_op_intensity",
    }
    mismatches = [
        (r["name"], field, round(e.metrics()[field], 3), float(r[column]))
        for r, e in estimates
        for field, column in columns.items()
        if round(e.metrics()[field], 3) != float(r[column])
    ]
    assert mismatches == []


def test_roofline_by_hand() -> None:
    # NOTES.md section 4, dp = 8 at peak-perf 900 TFLOP/s and local-mem-bw 3000 GB/s:
    # in_emb_y: 268,435,456,000 MACs over 303,300,608 elements, OI = 885 > 900e12 / 3000e9
    # = 300, so compute-bound: 268,435,456,000 / 900e12 s = 298,261.6 us -> 298,261 ns.
    assert roofline_ns(268_435_456_000, 303_300_608, 900e12, 3000e9) == 298_261
    # qk scores: 8,589,934,592 MACs over 150,994,944 elements, OI = 56.9 < 300, memory-bound:
    # 150,994,944 B / 3000e9 B/s = 50,331.6 ns -> 50,331 ns ("50.3 us" in NOTES.md).
    assert roofline_ns(8_589_934_592, 150_994_944, 900e12, 3000e9) == 50_331


def test_pure_dp_hides_all_communication(estimates) -> None:
    # NOTES.md 6.3 / results.csv R4S2_dp8_tp1_pp1_sp1_ws0_rc0: exposed 0, wall = GPU = 4,726,894
    est = next(e for r, e in estimates if r["name"] == "R4S2_dp8_tp1_pp1_sp1_ws0_rc0")
    assert (est.exposed_comm, est.wall_time, est.gpu_time) == (0, 4_726_894, 4_726_894)


def test_large_model_is_fast() -> None:
    # The brief's speed case: a GPT-3 175B shape (96 blocks, dmodel 12288, dff 49152, 96 heads,
    # seq 1024, batch 512, vocab 50257) on 64 NPUs of a 4x4x4 ring (lab-system1 of design.md:
    # 100 GB/s, 50 ns per link, 450 TFLOP/s, 3000 GB/s local memory); pure dp and dp x pp.
    dim = NetworkDim(topology=Topology.RING, npus=4, bandwidth_bytes_per_s=100 * 2**30,
                     latency_s=50e-9)
    network = Network(dims=(dim, dim, dim))
    shape = {"dmodel": 12288, "dff": 49152, "head": 96, "seq": 1024, "batch": 512,
             "din": 50257, "dout": 50257, "num_stacks": 96}
    for degrees in ({"dp": 64}, {"dp": 16, "pp": 4}):
        start = time.perf_counter()
        result = astra_estimate(StageArgs(**shape, **degrees), network, peak_ops_per_s=450e12,
                                local_mem_bytes_per_s=3000e9)
        assert time.perf_counter() - start < 1.0
        assert result.gpu_time > 0 and result.wall_time >= result.gpu_time


def test_product_of_degrees_must_match_npus() -> None:
    dim = NetworkDim(topology=Topology.RING, npus=8, bandwidth_bytes_per_s=2**30,
                     latency_s=0.0)
    args = StageArgs(dp=4, din=64, dout=64, dmodel=64, dff=128, head=4, seq=32, batch=4,
                     num_stacks=2)
    with pytest.raises(ValueError, match="dp \\* tp \\* sp \\* pp == NPUs"):
        astra_estimate(args, Network(dims=(dim,)), peak_ops_per_s=1e12,
                       local_mem_bytes_per_s=1e12)
