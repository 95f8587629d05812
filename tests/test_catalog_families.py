"""Cluster families (planner/catalog_families.py): ``dgx-h100-{gpus}`` names a cluster of any
number of whole DGX H100 nodes, as the Megatron-LM, MLPerf and MegaScale runs use (6,144,
10,752, 12,288 GPUs), wherever a system name is taken. The figures are dgx.yaml's header's: a
DGX H100 node of 8 GPUs (392 GB/s each for the ring, fit on a 4-GPU slice of an H100 node's
nccl-tests, and NVLink SHARP's all-reduce at 270 GB/s and 89 us from 6 GPUs), 42.5 GB/s a
GPU over InfiniBand between nodes, sends at 48 GB/s (one NDR 400G NIC a GPU, NVIDIA/nccl-tests
issue 119)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from planner import cli
from planner.catalog import load_catalog
from planner.errors import PlannerUsageError
from planner.runs_csv import read_runs
from simcore import estimate
from simcore.specs import Strategy, TrainingSpec

GB = 1e9


@pytest.fixture(autouse=True)
def user_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "user-catalog"
    monkeypatch.setenv("PLANNER_CATALOG", str(folder))
    return folder


def test_a_member_is_the_family_node_at_that_many_nodes() -> None:
    system = load_catalog().system("dgx-h100-6144")
    node, between = system.network.dims
    assert system.name == "dgx-h100-6144"
    assert system.devices == 6144
    assert system.device.name == "h100-sxm"
    assert (node.npus, between.npus) == (8, 6144 // 8)  # 768 nodes
    assert node.bandwidth_bytes_per_s == pytest.approx(392 * GB)
    assert node.nvls is not None and node.nvls.bandwidth_bytes_per_s == pytest.approx(270 * GB)
    assert between.bandwidth_bytes_per_s == pytest.approx(42.5 * GB)
    assert between.p2p_bandwidth_bytes_per_s == pytest.approx(48 * GB)
    assert load_catalog().system("dgx-h100-6144") is system  # built once


@pytest.mark.parametrize("name, nodes, ib_gbps", [
    ("dgx-a100-1024", 128, 15.1),     # Narayanan et al. 2021's cluster
    ("dgx-a100-40gb-64", 8, 15.1),    # llm-foundry's A100 40GB table
    ("dgx-h100-16384", 2048, 42.5),   # the shipped Llama 3 405B study
    ("dgx1-v100-16", 2, 0.55),        # DLPerf's two DGX-1s (v100.yaml's header)
    ("dgx-h800-2048", 256, 50),       # DeepSeek-V3's cluster (arXiv:2412.19437 section 3.2.2)
])
def test_the_names_studies_and_runs_used_keep_their_networks(name: str, nodes: int,
                                                             ib_gbps: float) -> None:
    system = load_catalog().system(name)
    assert [d.npus for d in system.network.dims] == [8, nodes]
    assert system.network.dims[1].bandwidth_bytes_per_s == pytest.approx(ib_gbps * GB)


def test_part_of_a_node_is_its_own_entry() -> None:
    assert [d.npus for d in load_catalog().system("dgx-h100-4").network.dims] == [4]
    assert [d.npus for d in load_catalog().system("dgx-h100-8").network.dims] == [8]


@pytest.mark.parametrize("name", ["dgx-h100-12", "dgx-h100-6150", "dgx-h100-10"])
def test_a_count_of_part_nodes_is_refused_with_the_counts_that_work(name: str) -> None:
    with pytest.raises(PlannerUsageError, match=r"multiple of 8, 16 or more \(e\.g\."
                                                r" dgx-h100-16\)"):
        load_catalog().system(name)


def test_the_family_name_itself_says_to_put_a_count_in() -> None:
    with pytest.raises(PlannerUsageError, match=r"a family of clusters: put the GPU count in"
                                                r" place of \{gpus\}, e.g. dgx-h100-64"):
        load_catalog().system("dgx-h100-{gpus}")


def test_the_estimate_on_a_member_is_the_one_on_the_same_cluster_written_out(
        tmp_path: Path) -> None:
    """The family adds no figure: a YAML of 768 DGX H100 nodes with dgx.yaml's link figures
    (written out here by hand) gives the same step time and memory."""
    written = tmp_path / "eos.yaml"
    written.write_text(textwrap.dedent("""\
        eos:
          device: h100-sxm
          network:
            - {topology: Switch, npus: 8, bandwidth_gbps: 392, latency_us: 0.33,
               call_latency_us: 11.0,
               nvls: {bandwidth_gbps: 270, latency_us: 89, min_npus: 6}}
            - {topology: Switch, npus: 768, bandwidth_gbps: 42.5, latency_us: 8.8,
               call_latency_us: 0.7, p2p_bandwidth_gbps: 48}
          scheduling: {preferred_dataset_splits: 4, active_chunks_per_dim: 1}
        """))
    catalog = load_catalog()
    model = catalog.model("gpt3-175b")
    training = TrainingSpec(global_batch=1536, seq_len=2048)
    strategy = Strategy(dp=96, tp=8, pp=8, micro_batch=1)
    member = estimate(model, catalog.system("dgx-h100-6144"), training, strategy)
    by_hand = estimate(model, catalog.system(str(written)), training, strategy)
    assert member.step_time == by_hand.step_time
    assert member.peak_memory == by_hand.peak_memory


def test_a_runs_csv_names_a_member_and_a_bad_count_skips_the_row_naming_file_and_field(
        tmp_path: Path) -> None:
    header = "name,model,system,global_batch,seq_len,dp,tp,pp,micro_batch,step_time_s\n"
    good = tmp_path / "runs.csv"
    good.write_text(header + "a,gpt3-175b,dgx-h100-6144,1536,2048,96,8,8,1,2.0\n")
    (run,), skipped = read_runs(good, load_catalog())
    assert run.system.devices == 6144 and not skipped
    bad = tmp_path / "bad.csv"
    bad.write_text(header + "a,gpt3-175b,dgx-h100-6150,1536,2048,96,8,8,1,2.0\n")
    runs, (reason,) = read_runs(bad, load_catalog())
    assert not runs
    # the file once, in the row's place (FILE:LINE), the field in the reason
    assert reason.where == f"{bad}:2"
    assert reason.reason.startswith("system: system 'dgx-h100-6150'")
    assert "multiple of 8" in reason.reason


def test_estimate_command_takes_a_member(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["estimate", "--model", "gpt3-175b", "--system", "dgx-a100-12288",
                     "--dp", "192", "--tp", "8", "--pp", "8", "--micro-batch", "1",
                     "--global-batch", "1536", "--seq-len", "2048"])
    assert code == 0
    assert "12288 x a100-80gb" in capsys.readouterr().out


def test_a_mistyped_member_is_offered_the_familys(capsys: pytest.CaptureFixture[str]) -> None:
    # "dgx-h1OO-256" was offered dgx-h100-2, dgx-16 and dgx-h100-8, not the family's member
    assert cli.main(["estimate", "--model", "llama3-8b", "--system", "dgx-h1OO-256",
                     "--global-batch", "256"]) == 2
    assert "did you mean dgx-h100-256," in capsys.readouterr().err


def test_a_users_family_with_nodes_of_four(user_catalog: Path) -> None:
    (user_catalog / "systems").mkdir(parents=True)
    (user_catalog / "systems" / "mine.yaml").write_text(textwrap.dedent("""\
        jz-v100-{gpus}:
          device: v100-32gb
          network:
            - {topology: Switch, npus: 4, bandwidth_gbps: 156, latency_us: 0.58}
            - {topology: Switch, npus: "{nodes}", bandwidth_gbps: 2.16, latency_us: 8.8}
        """))
    catalog = load_catalog()
    assert [d.npus for d in catalog.system("jz-v100-12").network.dims] == [4, 3]
    assert catalog.has_system("jz-v100-12") and not catalog.has_system("jz-v100.yaml")
    with pytest.raises(PlannerUsageError, match="multiple of 4, 8 or more"):
        catalog.system("jz-v100-6")


@pytest.mark.parametrize("last, message", [
    ('{topology: Switch, npus: 16, bandwidth_gbps: 2, latency_us: 8.8}',
     r'mine\.yaml.*bad-\{gpus\}\.network\[1\]\.npus.*npus: "\{nodes\}"'),
    ('{topology: Switch, npus: "{nodes}", latency_us: 8.8}',
     r"mine\.yaml.*bandwidth_gbps"),
])
def test_a_bad_family_entry_names_its_file_and_field(user_catalog: Path, last: str,
                                                     message: str) -> None:
    (user_catalog / "systems").mkdir(parents=True)
    (user_catalog / "systems" / "mine.yaml").write_text(
        "bad-{gpus}:\n  device: h100-sxm\n  network:\n"
        "    - {topology: Switch, npus: 8, bandwidth_gbps: 545, latency_us: 0.33}\n"
        f"    - {last}\n")
    with pytest.raises(PlannerUsageError, match=message):
        load_catalog()


def test_the_dgx_b200_node_is_the_h100_fit_scaled_by_measured_busbw() -> None:
    """dgx.yaml: stas00/ml-engineering's nccl-tests at 8 GiB on 8 GPUs, 838.0 GB/s busbw on
    B200 against 473.1 on H200 (the table the H100 node's nvls is fit on): the ring
    392 x 838.0 / 473.1 = 694, nvls 270 x 838.0 / 473.1 = 478."""
    node = load_catalog().system("dgx-b200-8").network.dims[0]
    assert node.bandwidth_bytes_per_s == pytest.approx(392 * 838.0 / 473.1 * GB, rel=1e-3)
    assert node.nvls is not None
    assert node.nvls.bandwidth_bytes_per_s == pytest.approx(270 * 838.0 / 473.1 * GB, rel=1e-3)
    cluster = load_catalog().system("dgx-b200-128")
    assert cluster.device.name == "b200"
    assert cluster.network.dims[0] == node
    assert cluster.network.dims[1].p2p_bandwidth_bytes_per_s == pytest.approx(48 * GB)


def test_a_users_entry_that_a_shipped_family_names_is_refused(user_catalog: Path) -> None:
    """One name, one system: dgx-h100-64 is 8 nodes of dgx-h100-{gpus}, so a user entry of that
    name (an A100 cluster here) would change what every study naming it plans on."""
    (user_catalog / "systems").mkdir(parents=True)
    (user_catalog / "systems" / "mine.yaml").write_text(textwrap.dedent("""\
        dgx-h100-64:
          device: a100-80gb
          network:
            - {topology: Switch, npus: 8, bandwidth_gbps: 231, latency_us: 0.58}
            - {topology: Switch, npus: 8, bandwidth_gbps: 15.1, latency_us: 8.8}
        """))
    with pytest.raises(PlannerUsageError, match=r"mine\.yaml: dgx-h100-64: already named by the"
                                                r" family dgx-h100-\{gpus\}"):
        load_catalog()


def test_a_users_family_that_names_a_shipped_entry_is_refused(user_catalog: Path) -> None:
    (user_catalog / "systems").mkdir(parents=True)
    (user_catalog / "systems" / "mine.yaml").write_text(textwrap.dedent("""\
        distir-{gpus}:
          device: a100-80gb
          network:
            - {topology: Switch, npus: 8, bandwidth_gbps: 231, latency_us: 0.58}
            - {topology: Switch, npus: "{nodes}", bandwidth_gbps: 15.1, latency_us: 8.8}
        """))
    with pytest.raises(PlannerUsageError, match=r"mine\.yaml: distir-\{gpus\}: names distir-16,"
                                                r" already defined in .*astra-lab\.yaml"):
        load_catalog()


def test_a_member_of_a_family_in_a_file_named_by_path(tmp_path: Path) -> None:
    family = tmp_path / "jz.yaml"
    family.write_text(textwrap.dedent("""\
        jz-{gpus}:
          device: v100-32gb
          network:
            - {topology: Switch, npus: 4, bandwidth_gbps: 156, latency_us: 0.58}
            - {topology: Switch, npus: "{nodes}", bandwidth_gbps: 2.16, latency_us: 8.8}
        """))
    catalog = load_catalog()
    assert [d.npus for d in catalog.system(f"{family}#jz-12").network.dims] == [4, 3]
    with pytest.raises(PlannerUsageError, match=r"jz\.yaml: system 'jz-6': .*multiple of 4"):
        catalog.system(f"{family}#jz-6")
    with pytest.raises(PlannerUsageError, match=r"name one as .*#NAME \(jz-\{gpus\}; a family's"):
        catalog.system(str(family))


def test_too_many_nodes_is_the_count_refused_not_the_catalog_file() -> None:
    with pytest.raises(PlannerUsageError, match=r"^--system: system 'dgx-h100-8000000': 8 x"
                                                r" 1000000 NPUs is over"):
        load_catalog().system("dgx-h100-8000000")


def test_a_leading_zero_is_no_member() -> None:
    """dgx-h100-016 would plan on dgx-h100-16 under another name (studies, groups, compare)."""
    with pytest.raises(PlannerUsageError, match="unknown system 'dgx-h100-016'"):
        load_catalog().system("dgx-h100-016")
