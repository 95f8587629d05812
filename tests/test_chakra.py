"""Chakra execution traces in and out: the tutorial's demos, STAGE's graph round-tripped through
`.et` files, and the files checked by a protobuf wire-format decoder written here (independent
of the protobuf library)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from planner.chakra.io import read_trace, write_trace
from planner.chakra.schema import message_class
from planner.cli import main

ROOT = Path(__file__).resolve().parent.parent
ASTRA = ROOT / "studies" / "astra"
TUTORIAL = ["--system-json", str(ASTRA / "tutorial-system.json"),
            "--network-yml", str(ASTRA / "tutorial-ring8.yml")]
SYSTEMS = ROOT / "tests" / "data" / "astra_systems"
R4S2 = ["--system-json", str(SYSTEMS / "R4S2-system.json"),
        "--network-yml", str(SYSTEMS / "R4S2-network.yml")]
MODEL = ["--dmodel", "1024", "--dff", "4096", "--head", "16", "--seq", "1024", "--batch", "64",
         "--num_stacks", "4", "--din", "32000", "--dout", "32000"]


def _attr(name: str, **value):
    return message_class("AttributeProto")(name=name, **value)


def _collective(node_id: int, name: str, comm_type: int, size: int, deps=()):
    node = message_class("Node")(id=node_id, name=name, type=7, data_deps=list(deps))
    node.attr.extend([
        _attr("is_cpu_op", bool_val=False), _attr("comm_type", int64_val=comm_type),
        _attr("comm_size", uint64_val=size),
        _attr("involved_dim", bool_list=message_class("BoolList")(values=[True])),
    ])
    return node


def _replay(capsys, prefix: Path, system=TUTORIAL) -> list[dict]:
    assert main(["replay", str(prefix), *system, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_tutorial_demo_1_1(tmp_path, capsys):
    # astra-sim/tutorials@ead2d5d hoti2024/demo1/generate_all_reduce.py: one 1 MiB all-reduce
    # (comm_type ALL_REDUCE = 0) per NPU; the tutorial's result is 117,780 cycles on every NPU.
    for npu in range(8):
        write_trace(tmp_path / f"allreduce.{npu}.et", [_collective(1, "All-Reduce", 0, 1 << 20)])
    assert [r["finished_cycles"] for r in _replay(capsys, tmp_path / "allreduce")] == [117_780] * 8


def test_tutorial_demo_1_2(tmp_path, capsys):
    # generate_3nodes.py: a 1 MiB all-reduce, then a 2 MiB all-gather (ALL_GATHER = 2) and a
    # 50 us compute node, both depending on it; the tutorial's result: 405,520 cycles. By hand
    # (shared reference NOTES.md section 3): 117,780 + 4 chunks x (10 + 7 x (trunc(500 +
    # 524,288 / 53.687) + 10)) = 117,780 + 4 x 71,935 = 405,520; the compute (50,000 ns) hides
    # behind the all-gather.
    for npu in range(8):
        compute = message_class("Node")(id=3, name="Compute-50us", type=4, duration_micros=50,
                                         data_deps=[1])
        compute.attr.append(_attr("is_cpu_op", bool_val=False))
        write_trace(tmp_path / f"3nodes.{npu}.et", [
            _collective(1, "All-Reduce-1MB", 0, 1 << 20),
            _collective(2, "All-Gather-2MB", 2, 2 << 20, deps=[1]), compute])
    npus = _replay(capsys, tmp_path / "3nodes")
    assert [r["finished_cycles"] for r in npus] == [405_520] * 8
    assert npus[0]["gpu_time"] == 50_000


@pytest.mark.parametrize("flags, row", [
    # tests/data/astra_results.csv rows (measured): wall, GPU, comm, exposed, peak, and the lab's
    # four metrics of sys[0]
    (["--dp", "4", "--tp", "2"],
     (14_925_334, 4_671_062, 12_067_572, 10_254_272, 1_452_146_688,
      65.283, 70.21, 68.372, 435.711)),
    (["--dp", "4", "--pp", "2"],
     (15_515_290, 4_671_093, 14_404_211, 10_844_197, 1_679_032_320,
      65.282, 70.21, 58.989, 562.776)),
])
def test_stage_traces_replayed_give_the_estimate(tmp_path, capsys, flags, row):
    assert main(["astra-estimate", *R4S2, "--et-out", str(tmp_path), "--", *flags, *MODEL]) == 0
    estimate = json.loads(capsys.readouterr().out)
    npus = _replay(capsys, tmp_path / "workload", system=R4S2)
    assert len(npus) == 8
    first = npus[0]
    keys = ("wall_time", "gpu_time", "comm_time", "exposed_comm", "peak_memory_usage")
    assert tuple(first[k] for k in keys) == tuple(estimate[k] for k in keys) == row[:5]
    metrics = ("compute_bound_pct", "avg_compute_util_pct", "avg_mem_util_pct",
               "avg_op_intensity")
    assert tuple(round(first[k], 3) for k in metrics) == row[5:]
    assert max(r["wall_time"] for r in npus) == estimate["max_wall_time_all_ranks"]


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos


def _fields(data: bytes) -> list[tuple[int, object]]:
    """Protobuf wire format by hand (varint 0, 64-bit 1, length-delimited 2, 32-bit 5)."""
    out, pos = [], 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos:pos + size], pos + size
        elif wire in (1, 5):
            step = 8 if wire == 1 else 4
            value, pos = data[pos:pos + step], pos + step
        else:
            raise AssertionError(f"wire type {wire}")
        out.append((number, value))
    return out


def _messages(data: bytes) -> list[list[tuple[int, object]]]:
    """A trace file's length-delimited messages, each as its (field, value) pairs."""
    messages, pos = [], 0
    while pos < len(data):
        size, pos = _varint(data, pos)
        messages.append(_fields(data[pos:pos + size]))
        pos += size
    assert pos == len(data)
    return messages


def test_traces_are_valid_protobuf_by_an_independent_decoder(tmp_path, capsys):
    assert main(["astra-estimate", *R4S2, "--et-out", str(tmp_path), "--", "--dp", "4",
                 "--pp", "2", *MODEL]) == 0
    capsys.readouterr()
    messages = _messages((tmp_path / "workload.0.et").read_bytes())
    # GlobalMetadata: field 1 version "0.0.4" (et_def.proto)
    assert (1, b"0.0.4") in messages[0]
    nodes = messages[1:]
    types = [dict(n)[3] for n in nodes]  # Node.type = 3: COMP 4, SEND 5, RECV 6, COLL 7
    assert set(types) == {4, 5, 6, 7}
    # every node has an id (field 1) and every data dependency (field 5, packed) names one
    ids = {dict(n)[1] for n in nodes}
    for n in nodes:
        for number, value in n:
            if number == 5:
                packed, p = [], 0
                while p < len(value):
                    v, p = _varint(value, p)
                    packed.append(v)
                assert set(packed) <= ids
    # the library reads the same nodes back
    assert [n.type for n in read_trace(tmp_path / "workload.0.et").nodes] == types
    groups = json.loads((tmp_path / "comm_group.json").read_text())
    assert sorted(groups.values()) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # dp groups of each stage


def test_a_file_that_is_not_a_trace_is_one_line(tmp_path, capsys):
    for npu in range(8):
        (tmp_path / f"bad.{npu}.et").write_bytes(b"\xff\xff\xff\xff\xff not a trace")
    assert main(["replay", str(tmp_path / "bad"), *TUTORIAL]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a Chakra execution trace" in err[0]


def test_a_fifo_as_a_trace_or_text_workload_is_refused_not_waited_on(tmp_path, capsys):
    # Issue 20 #10: a FIFO given as an input hung the reader; every input is read bounded
    for npu in range(8):
        os.mkfifo(tmp_path / f"pipe.{npu}.et")
    assert main(["replay", str(tmp_path / "pipe"), *TUTORIAL]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a regular file (a FIFO)" in err[0]
    os.mkfifo(tmp_path / "workload.txt")
    assert main(["convert-text", str(tmp_path / "workload.txt"), "--num-npus", "8", "--out",
                 str(tmp_path / "out" / "w")]) == 2
    assert "not a regular file (a FIFO)" in capsys.readouterr().err


def test_missing_traces_are_one_line(tmp_path, capsys):
    write_trace(tmp_path / "w.0.et", [_collective(1, "ar", 0, 1024)])
    write_trace(tmp_path / "w.2.et", [_collective(1, "ar", 0, 1024)])
    assert main(["replay", str(tmp_path / "w"), *TUTORIAL]) == 2
    assert "w.1.et is missing" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "none"), *TUTORIAL]) == 2
    assert "no trace files" in capsys.readouterr().err


DEMO2 = ROOT / "tests" / "data" / "chakra" / "demo2-workload_text.txt"


def test_tutorial_demo_2(tmp_path, capsys):
    # The tutorial's demo 2: its text workload (MODEL, 6 layers) converted on 8 NPUs and run:
    # 195,206,000 cycles on every NPU. Its Chakra wrote no comm_size, so the collectives took no
    # time: the sum of the compute times, 78,883 (forward) + 78,883 (input gradient) + 37,440
    # (weight gradient) us.
    npus = _replay(capsys, DEMO2, system=[*TUTORIAL, "--hoti2024"])
    assert [r["finished_cycles"] for r in npus] == [195_206_000] * 8
    assert main(["convert-text", str(DEMO2), "--num-npus", "8", "--hoti2024", "--out",
                 str(tmp_path / "workload_chakra")]) == 0
    # 6 forward computes + 6 forward collectives + 6 input-gradient computes + 5 input-gradient
    # collectives (none for the first layer) + 6 weight-gradient computes
    assert "29 nodes each" in capsys.readouterr().out
    nodes = read_trace(tmp_path / "workload_chakra.3.et").nodes
    assert [n.type for n in nodes].count(7) == 11 and len(nodes) == 29
    npus = _replay(capsys, tmp_path / "workload_chakra")
    assert [r["finished_cycles"] for r in npus] == [195_206_000] * 8


def test_text_workload_with_comm_sizes_times_its_collectives(capsys):
    # As Chakra's converter writes it today (comm_size set), the collectives run on the ring:
    # the compute is the same 195,206,000 ns and the step is longer.
    first = _replay(capsys, DEMO2)[0]
    assert first["gpu_time"] == 195_206_000
    assert first["wall_time"] > 195_206_000 and first["comm_time"] > 0


@pytest.mark.parametrize("text, message", [
    ("PIPELINE\n1\nl -1 1 NONE 0 1 NONE 0 1 NONE 0 1\n", "line 1: parallelism 'PIPELINE'"),
    ("DATA\n2\nl -1 1 NONE 0 1 NONE 0 1 NONE 0 1\n", "says 2 layers but 1 follow"),
    ("DATA\n1\nl -1 x NONE 0 1 NONE 0 1 NONE 0 1\n", "line 3: expected name"),
    # Chakra's duration_micros is a uint64 and comm_size an int64: a negative time or a size
    # past 2**63 - 1 failed inside protobuf's encoder
    ("DATA\n1\nl -1 -5 NONE 0 1 NONE 0 1 NONE 0 1\n",
     "line 3: the forward's compute time -5 must be a whole number from 0 to"),
    ("DATA\n1\nl -1 1 NONE 0 1 NONE 0 1 ALLREDUCE 9223372036854775808 1\n",
     "line 3: the weight gradient's comm size 9223372036854775808 must be"),
    ("HYBRID_DLRM\n3\n" + "l -1 1 ALLTOALL 1 1 NONE 0 1 NONE 0 1\n" * 3,
     "takes the index of the last bottom-MLP layer"),
    ("HYBRID_DLRM 2\n3\n" + "l -1 1 ALLTOALL 1 1 NONE 0 1 NONE 0 1\n" * 3,
     "must be after the embedding and before the last"),
    ("HYBRID_TRANSFORMER model_parallel_NPU_group: 4\n1\nl -1 1 NONE 0 1 NONE 0 1 NONE 0 1\n",
     "nor by Chakra's text converter"),
])
def test_a_bad_text_workload_is_one_line(tmp_path, capsys, text, message):
    path = tmp_path / "w.txt"
    path.write_text(text)
    assert main(["replay", str(path), *TUTORIAL]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


@pytest.mark.parametrize("parallelism, collectives", [
    # per layer of 3: MICRO weight-gradient only; DATA one per layer; MODEL forward 3 + input
    # gradient 2; the hybrids add the weight-gradient one per layer
    ("MICRO", 3), ("DATA", 3), ("MODEL", 5), ("HYBRID_DATA_MODEL", 8), ("HYBRID_MODEL_DATA", 8),
])
def test_every_parallelism_converts_and_replays(tmp_path, capsys, parallelism, collectives):
    layer = " -1 10 ALLGATHER 1024 10 ALLREDUCE 1024 10 ALLREDUCE 1024 1"
    path = tmp_path / "w.txt"
    path.write_text(f"{parallelism}\n3\n" + "".join(f"l{i}{layer}\n" for i in range(3)))
    assert main(["convert-text", str(path), "--num-npus", "8", "--out",
                 str(tmp_path / "w")]) == 0
    capsys.readouterr()
    nodes = read_trace(tmp_path / "w.0.et").nodes
    assert [n.type for n in nodes].count(7) == collectives
    npus = _replay(capsys, tmp_path / "w")
    computes = 0 if parallelism == "MICRO" else 3 + 3 + (2 if parallelism == "DATA" else 3)
    assert npus[0]["gpu_time"] == computes * 10_000  # every compute node is 10 us


DLRM = """HYBRID_DLRM 1
4
emb -1 10 ALLTOALL 1024 11 ALLTOALL 1024 12 NONE 0 1
bot -1 20 NONE 0 21 NONE 0 22 ALLREDUCE 1024 1
top0 -1 30 NONE 0 31 NONE 0 32 ALLREDUCE 1024 1
top1 -1 40 NONE 0 41 NONE 0 42 ALLREDUCE 1024 1
"""


def test_dlrm_graph_is_the_converters(tmp_path):
    # mlcommons/chakra@21585d8 convert_hybrid_dlrm, read by hand, last bottom layer 1:
    # forward: each layer's compute after the one before; emb's all-to-all after its compute;
    # bot (index 1 = last bottom layer) also awaits that all-to-all. Backward, top1 first: its
    # weight gradient after the last forward; a collective after each weight gradient unless
    # NONE; an input gradient after each weight gradient but emb's; each weight gradient after
    # the input gradient of the layer above; after top0's input gradient (index last bottom + 1)
    # emb's backward all-to-all, which emb's weight gradient also awaits.
    from planner.chakra.text import read_text_workload, text_nodes

    path = tmp_path / "dlrm.txt"
    path.write_text(DLRM)
    nodes = text_nodes(read_text_workload(path))
    name = {n.id: n.name.replace("COMP_NODE_", "").replace("COMM_COLL_NODE_", "coll ")
            for n in nodes}
    got = [(name[n.id], sorted(name[d] for d in n.data_deps)) for n in nodes]
    assert got == [
        ("emb_FWD", []),
        ("coll emb_ALLTOALL", ["emb_FWD"]),
        ("bot_FWD", ["coll emb_ALLTOALL", "emb_FWD"]),
        ("top0_FWD", ["bot_FWD"]),
        ("top1_FWD", ["top0_FWD"]),
        ("top1_BWD_WG", ["top1_FWD"]),
        ("coll top1_ALLREDUCE", ["top1_BWD_WG"]),
        ("top1_BWD_IG", ["top1_BWD_WG"]),
        ("top0_BWD_WG", ["top1_BWD_IG"]),
        ("coll top0_ALLREDUCE", ["top0_BWD_WG"]),
        ("top0_BWD_IG", ["top0_BWD_WG"]),
        ("coll emb_ALLTOALL", ["top0_BWD_IG"]),
        ("bot_BWD_WG", ["top0_BWD_IG"]),
        ("coll bot_ALLREDUCE", ["bot_BWD_WG"]),
        ("bot_BWD_IG", ["bot_BWD_WG"]),
        ("emb_BWD_WG", ["bot_BWD_IG", "coll emb_ALLTOALL"]),
    ]


def test_dlrm_replays_with_the_tutorials_converter(tmp_path, capsys):
    # With --hoti2024 the collectives take no time and one compute runs at a time, so the step
    # is the sum of the compute times: forward 10+20+30+40, weight gradients 12+22+32+42, input
    # gradients (not emb's) 21+31+41 = 301 us; two passes twice that (pass 2 waits on pass 1).
    path = tmp_path / "dlrm.txt"
    path.write_text(DLRM)
    npus = _replay(capsys, path, system=[*TUTORIAL, "--hoti2024"])
    assert [r["finished_cycles"] for r in npus] == [301_000] * 8
    npus = _replay(capsys, path, system=[*TUTORIAL, "--hoti2024", "--passes", "2"])
    assert npus[0]["finished_cycles"] == 602_000


def test_passes_past_ten_million_nodes_are_one_line(tmp_path, capsys):
    # --passes 1000000000 unrolled the demo's 6 layers in memory (220 MB a second, until the
    # machine ran out); at most 6 nodes a layer a pass, so 10,000,000 // 36 = 277,777 passes
    for command in (["replay", str(DEMO2), *TUTORIAL],
                    ["convert-text", str(DEMO2), "--num-npus", "8", "--out",
                     str(tmp_path / "w")]):
        assert main([*command, "--passes", "1000000000"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--passes 1,000,000,000: 6 layers over that many passes is" \
            " over 10,000,000 nodes; give at most 277,777" in err[0]
    assert not list(tmp_path.iterdir())


def test_text_options_beside_traces_are_one_line(tmp_path, capsys):
    # --passes and --hoti2024 convert a text workload; beside .et traces they were ignored
    assert main(["convert-text", str(DEMO2), "--num-npus", "8", "--out", str(tmp_path / "w")]) == 0
    capsys.readouterr()
    for flag, said in ((["--passes", "5"], "--passes 5"), (["--hoti2024"], "--hoti2024")):
        assert main(["replay", str(tmp_path / "w"), *TUTORIAL, *flag]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{said}: converts a text workload (.txt);" in err[0]


def test_a_smaller_trace_set_replaces_a_larger_one(tmp_path, capsys):
    # traces of 16 NPUs then of 8 into one folder: workload.8.et .. workload.15.et stayed, and
    # the replay the command printed refused "16 trace files, but ... has 8 NPUs"
    big = tmp_path / "big"
    astra = ROOT / "studies" / "astra"
    dgx16 = ["--system-json", str(astra / "dgx-16-system.json"),
             "--network-yml", str(astra / "dgx-16-network.yml")]
    assert main(["astra-estimate", *dgx16, "--et-out", str(big), "--", "--dp", "8", "--tp", "2",
                 *MODEL]) == 0
    assert len(list(big.glob("workload.*.et"))) == 16
    (big / "notes.txt").write_text("mine")
    assert main(["astra-estimate", *R4S2, "--et-out", str(big), "--", "--dp", "4", "--tp", "2",
                 *MODEL]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in big.glob("workload.*.et")) == sorted(
        f"workload.{n}.et" for n in range(8))
    assert (big / "notes.txt").read_text() == "mine"
    assert len(_replay(capsys, big / "workload", system=R4S2)) == 8
