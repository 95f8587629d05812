"""A study resumed after the catalog entry it was made from changed (a model's layers, a device
`planner calibrate` refit): its fingerprint names the model and system only, so the new trials
were of another model and were ranked beside the old ones. It is refused; an unchanged entry
resumes."""

from __future__ import annotations

from planner.cli import main

MODEL = ("umodel: {family: llama, layers: %d, hidden: 4096, ffn_hidden: 14336, heads: 32,"
         " kv_heads: 8, vocab: 128256, seq_len: 8192}\n")
STUDY = ("model: umodel\nsystem: dgx-h100-8\ntraining: {global_batch: 64}\nsampler: random\n"
         "n_trials: %d\nspace: {tp: powers_of_two, pp: [1, 2], micro_batch: [1, 2]}\n")


def test_a_changed_catalog_entry_is_not_resumed(tmp_path, monkeypatch, capsys) -> None:
    catalog = tmp_path / "catalog"
    (catalog / "models").mkdir(parents=True)
    entry = catalog / "models" / "u.yaml"
    monkeypatch.setenv("PLANNER_CATALOG", str(catalog))
    study, storage = tmp_path / "res.yaml", str(tmp_path / "s.journal")
    entry.write_text(MODEL % 32)
    study.write_text(STUDY % 3)
    assert main(["run", str(study), "--storage", storage, "--quiet"]) == 0
    study.write_text(STUDY % 6)  # more trials of the same study: resumed
    assert main(["run", str(study), "--storage", storage, "--quiet", "--resume"]) == 0
    capsys.readouterr()
    entry.write_text(MODEL % 16)
    study.write_text(STUDY % 9)
    assert main(["run", str(study), "--storage", storage, "--quiet", "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the stored study 'res' was made from another model entry" \
        " 'umodel' (model.layers 32 -> 16); its catalog entry changed since" in err[0]
    assert main(["trials", "res", "--storage", storage]) == 0
    assert capsys.readouterr().out.count("COMPLETE") == 6
