"""`planner run / best / trials / studies / catalog` as a user runs them."""

from __future__ import annotations

import shlex

import pandas as pd
import pytest

from planner.cli import main
from planner.storage import DEFAULT_STORAGE, storage_option
from tests.study_files import lab_study


@pytest.fixture
def storage(tmp_path, monkeypatch):
    path = tmp_path / "results" / "studies.journal"
    monkeypatch.setenv("PLANNER_STORAGE", str(path))
    return path


def test_run_prints_the_space_and_the_best_plans(tmp_path, storage, capsys):
    assert main(["run", str(lab_study(tmp_path)), "--quiet", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "56 valid strategies (of 56 candidates)" in out
    assert "best plans (HBM 80 GB)" in out
    assert out.count("dp") >= 3 and storage.exists()
    assert main(["best", "lab", "--top", "2"]) == 0
    best = capsys.readouterr().out.splitlines()
    assert len(best) == 3  # header and two plans


def test_run_again_needs_resume(tmp_path, storage, capsys):
    path = lab_study(tmp_path)
    assert main(["run", str(path), "--quiet"]) == 0
    size = storage.stat().st_size
    capsys.readouterr()
    assert main(["run", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "--resume" in err and "Traceback" not in err
    assert storage.stat().st_size == size  # nothing written
    assert main(["run", str(path), "--quiet", "--resume"]) == 0
    assert "0 trials" in capsys.readouterr().out


def test_resume_of_a_study_not_stored_says_it_starts_it(tmp_path, storage, capsys):
    # A mistyped --storage with --resume started the study afresh without a word.
    path = lab_study(tmp_path)
    assert main(["run", str(path), "--quiet", "--resume"]) == 0
    err = capsys.readouterr().err
    assert "--resume: no study 'lab' is stored in" in err and "starting it" in err
    assert main(["run", str(path), "--quiet", "--resume"]) == 0
    assert "no study" not in capsys.readouterr().err


def test_hbm_override_makes_its_own_study(tmp_path, storage, capsys):
    path = lab_study(tmp_path, hbm="unlimited")
    assert main(["run", str(path), "--quiet", "--hbm-gb", "80"]) == 0
    assert "study lab-hbm80gb" in capsys.readouterr().out
    assert main(["studies"]) == 0
    assert "lab-hbm80gb" in capsys.readouterr().out


@pytest.mark.parametrize("text, field", [
    ("model: llama70b\nsystem: lab-system1\ntraining: {global_batch: 512}\nspace: {tp: [3]}\n",
     "space"),
    ("model: gpt-5\nsystem: lab-system1\ntraining: {global_batch: 512}\nspace: {}\n", "model"),
    ("model: llama70b\nsystem: lab-system1\ntraining: {global_batch: 512}\nspace: {}\n"
     "hbm_gb: 0\n", "hbm_gb"),
    ("model: llama70b\nsystem: lab-system1\ntraining: {global_batch: 512}\n", "space"),
])
def test_bad_input_is_one_line_exit_2_and_creates_nothing(tmp_path, storage, capsys, text, field):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and field in err
    assert not storage.exists()


def test_bad_hbm_flag(tmp_path, storage, capsys):
    assert main(["run", str(lab_study(tmp_path)), "--hbm-gb", "-1"]) == 2
    assert "--hbm-gb" in capsys.readouterr().err and not storage.exists()


def test_trials_csv_and_parquet(tmp_path, storage, capsys):
    main(["run", str(lab_study(tmp_path)), "--quiet"])
    csv = tmp_path / "t.csv"
    assert main(["trials", "lab", "--csv", str(csv)]) == 0
    df = pd.read_csv(csv)
    assert len(df) == 56 and {"plan", "tp", "step_time_s", "time_compute_s",
                              "memory_activations_gb", "feasible", "reason"} <= set(df.columns)
    pytest.importorskip("pyarrow")
    pq = tmp_path / "t.parquet"
    assert main(["trials", "lab", "--parquet", str(pq)]) == 0
    assert len(pd.read_parquet(pq)) == 56


def test_trials_into_a_missing_folder_is_one_line(tmp_path, storage, capsys):
    # issue 19: "--csv /nonexistent-dir/t.csv prints 'cannot write: None'"
    main(["run", str(lab_study(tmp_path)), "--quiet"])
    capsys.readouterr()
    for flag in ("--csv", "--parquet"):
        target = tmp_path / "missing" / "t.out"
        assert main(["trials", "lab", flag, str(target)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"the folder {target.parent} does not exist" in err[0]
        assert "None" not in err[0]


def test_trials_named_for_the_other_format_is_one_line(tmp_path, storage, capsys):
    # --csv x.parquet wrote CSV under a Parquet name (and the reverse)
    main(["run", str(lab_study(tmp_path)), "--quiet"])
    capsys.readouterr()
    for flag, name, other in (("--csv", "t.parquet", "--parquet"),
                              ("--parquet", "t.CSV", "--csv")):
        assert main(["trials", "lab", flag, str(tmp_path / name)]) == 2
        assert f"use {other} {tmp_path / name}" in capsys.readouterr().err
        assert not (tmp_path / name).exists()


def test_trials_keeps_files_of_another_kind(tmp_path, storage, capsys):
    # --csv naming the journal it read replaced it with CSV (every study in it lost); a study
    # YAML the same; --csv and --parquet of one path wrote one over the other
    main(["run", str(lab_study(tmp_path)), "--quiet"])
    capsys.readouterr()
    journal = storage.read_bytes()
    for flags, said in ((["--csv", str(storage)], "exists and is not a .csv file"),
                        (["--parquet", str(tmp_path / "lab.yaml")], "is not a .parquet file"),
                        (["--csv", str(tmp_path / "t"), "--parquet", str(tmp_path / "t")],
                         "--parquet " + str(tmp_path / "t") + ": the same file as --csv")):
        assert main(["trials", "lab", *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], err
    assert storage.read_bytes() == journal and not (tmp_path / "t").exists()


def test_trials_of_a_study_without_any_says_so(tmp_path, storage, capsys):
    # a study made and stopped before its first trial printed pandas' "Empty DataFrame"
    import optuna

    from planner.storage import open_storage

    main(["run", str(lab_study(tmp_path)), "--quiet"])
    capsys.readouterr()
    backend = open_storage(str(storage), create=False)
    lab = optuna.load_study(study_name="lab", storage=backend)
    empty = optuna.create_study(study_name="empty", storage=backend)
    for key, value in lab.user_attrs.items():
        empty.set_user_attr(key, value)
    assert main(["trials", "empty"]) == 0
    assert "study 'empty' has no trials stored yet" in capsys.readouterr().out


def test_unknown_study_and_empty_storage(tmp_path, storage, capsys):
    assert main(["best", "lab"]) == 2
    assert "no studies there yet" in capsys.readouterr().err
    main(["run", str(lab_study(tmp_path)), "--quiet"])
    capsys.readouterr()
    assert main(["best", "other"]) == 2
    assert "stored: lab" in capsys.readouterr().err
    # a name close to a stored one: did you mean it (a storage of hundreds listed every one)
    assert main(["best", "lba"]) == 2
    assert "no study named 'lba'" in (err := capsys.readouterr().err) and "did you mean lab?" in err


@pytest.mark.parametrize("kind, name", [("models", "llama3-405b"), ("systems", "dgx-h100-{gpus}"),
                                        ("devices", "h100-sxm")])
def test_catalog(capsys, kind, name):
    assert main(["catalog", kind]) == 0
    assert name in capsys.readouterr().out


def test_catalog_counts_llama2_70b_parameters(capsys):
    # Llama-2-70B: 68,976,648,192 parameters (the Hugging Face checkpoint) -> "69.0" billion.
    main(["catalog", "models"])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.split()[0] == "llama2-70b")
    assert "69.0" in line.split()


def test_hints_carry_the_storage_given(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("PLANNER_STORAGE", raising=False)
    journal = str(tmp_path / "my results" / "s.journal")  # a space: the hint must quote it
    assert main(["run", str(lab_study(tmp_path)), "--quiet", "--top", "2",
                 "--storage", journal]) == 0
    more = capsys.readouterr().out.splitlines()[-1]
    assert more.startswith("more: ")
    hints = more.removeprefix("more: ").split("; ")
    assert len(hints) == 2
    for hint in hints:  # each runs as printed, on the storage given
        words = shlex.split(hint)
        assert words[0] == "planner" and words[words.index("--storage") + 1] == journal
    best = shlex.split(hints[0])[1:]
    assert main(best) == 0 and "dp" in capsys.readouterr().out
    assert main(["show", "lab", "--plan", "999", "--storage", journal]) == 2
    err = capsys.readouterr().err
    assert f"`planner best lab --storage {shlex.quote(journal)}`" in err
    assert "has only " in err and " feasible plans; " in err


def test_a_rank_past_a_pareto_front_says_it_is_the_front(tmp_path, capsys) -> None:
    # a two-objective study's best plans are its Pareto front: it said "only 51 feasible
    # plan(s)" of a study with thousands
    journal = str(tmp_path / "s.journal")
    study = lab_study(tmp_path, "two", objectives="[step_time, peak_memory]")
    assert main(["run", str(study), "--quiet", "--storage", journal]) == 0
    capsys.readouterr()
    assert main(["show", "two", "--plan", "999", "--storage", journal]) == 2
    err = capsys.readouterr().err
    assert " plans on its Pareto front (step time and memory); `planner best two" in err


def test_hint_for_an_empty_storage_names_it(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("PLANNER_STORAGE", raising=False)
    journal = str(tmp_path / "empty.journal")
    assert main(["best", "lab", "--storage", journal]) == 2
    assert f"planner run STUDY.yaml --storage {journal}`" in capsys.readouterr().err


def test_default_storage_adds_no_option():
    assert storage_option(str(DEFAULT_STORAGE)) == ""


def test_a_file_name_that_is_no_study_name_says_to_add_one(tmp_path, storage, capsys):
    # with no name: field the study takes the file's name, which here has a space
    path = tmp_path / "my study.yaml"
    path.write_text(lab_study(tmp_path).read_text().replace("name: lab\n", ""))
    assert main(["run", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "but got 'my study'; with no name: field the file's name is the study's" in err
    assert "up to 200 letters" in err and len(err.strip().splitlines()) == 1
