"""A catalog number that must be > 0 but is too small to compute with (a bandwidth of 1e-300
GB/s) is one line naming the file and the field: it made every collective's time infinite,
``failed: OverflowError: cannot convert float infinity to integer``, exit 1, and left a study
behind with no trials."""

from __future__ import annotations

from planner.cli import main


def test_a_vanishing_bandwidth_is_one_line(tmp_path, monkeypatch, capsys) -> None:
    catalog = tmp_path / "catalog"
    (catalog / "systems").mkdir(parents=True)
    entry = catalog / "systems" / "u.yaml"
    entry.write_text("usys: {device: h100-sxm, network: [{topology: Switch, bandwidth_gbps:"
                     " 1.0e-300, latency_us: 0.33, npus: 8}]}\n")
    monkeypatch.setenv("PLANNER_CATALOG", str(catalog))
    assert main(["estimate", "--model", "llama3-8b", "--system", "usys", "--tp", "2",
                 "--global-batch", "64"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{entry}: usys.network[0].bandwidth_gbps: 1e-300 is too small" \
        " to compute with; give at least 1e-09" in err[0]


def test_a_name_given_as_a_number_and_as_text_is_one_line(tmp_path, monkeypatch, capsys) -> None:
    # `1:` and `"1":` are two YAML keys and one catalog name: one entry vanished, exit 0
    catalog = tmp_path / "catalog"
    (catalog / "models").mkdir(parents=True)
    entry = catalog / "models" / "num.yaml"
    model = "{family: llama, layers: %d, hidden: 8, ffn_hidden: 8, heads: 1, vocab: 8, seq_len: 8}"
    entry.write_text(f"1: {model % 1}\n\"1\": {model % 2}\n")
    monkeypatch.setenv("PLANNER_CATALOG", str(catalog))
    assert main(["catalog", "models"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{entry}: 1: given twice (once as a number, once as text)" in err[0]


def test_a_moe_model_without_a_moe_layer_is_one_line(tmp_path, monkeypatch, capsys) -> None:
    # first_dense 40 of 32 layers: listed as a MoE, priced as dense, --ep 2 accepted
    catalog = tmp_path / "catalog"
    (catalog / "models").mkdir(parents=True)
    entry = catalog / "models" / "u.yaml"
    entry.write_text("umoe: {family: llama, layers: 32, hidden: 4096, ffn_hidden: 14336, heads:"
                     " 32, kv_heads: 8, vocab: 128256, seq_len: 8192, moe: {experts: 64, top_k:"
                     " 2, expert_ffn: 14336, first_dense: 40}}\n")
    monkeypatch.setenv("PLANNER_CATALOG", str(catalog))
    assert main(["estimate", "--model", "umoe", "--system", "dgx-h100-8", "--tp", "2",
                 "--global-batch", "64", "--ep", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "umoe: moe: none of the 32 layers is a mixture of experts" \
        " (first_dense 40, every 1)" in err[0]
