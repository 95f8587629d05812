"""Running studies into a storage: exhaustive batches, samplers, workers, resume."""

from __future__ import annotations

import optuna
import pandas as pd
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

import simcore
from planner.errors import PlannerUsageError
from planner.runner import run_study
from planner.storage import open_storage
from planner.study_config import load_study_config
from planner.tables import best_frame, trials_frame
from search_spaces import LayoutEncoding
from tests.study_files import lab_study

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _run(tmp_path, path, *, resume=False, jobs=1, store="s.journal", **kw):
    config = load_study_config(path, **kw)
    label = str(tmp_path / store)
    return config, run_study(config, open_storage(label, create=True), label, resume=resume,
                             jobs=jobs, progress=False)


def _plans(study: optuna.Study) -> dict[str, float]:
    return {t.user_attrs["plan"]: t.values[0]
            for t in study.get_trials(states=(TrialState.COMPLETE,))}


def test_exhaustive_equals_a_plain_loop_over_enumerate(tmp_path):
    config, report = _run(tmp_path, lab_study(tmp_path))
    study = report.study
    assert report.added == len(study.trials) == 56
    # The check: the same best plan as a plain loop calling simcore.estimate.
    plain = {}
    for s in config.space.enumerate():
        est = simcore.estimate(config.model, config.system, config.training, s)
        if est.fits:
            plain[s] = est.step_time
    best_plain = min(plain, key=plain.get)
    best = best_frame(study, 1).iloc[0]
    assert best["step_time_s"] == plain[best_plain]
    assert (best["dp"], best["tp"], best["sp"], best["recompute"]) == (
        best_plain.dp, best_plain.tp, best_plain.sp, best_plain.recompute.value)
    # optuna's own best_trial agrees (it counts feasible trials only)
    assert study.best_trial.value == plain[best_plain]


def test_infeasible_trials_are_kept_with_their_reason(tmp_path):
    _, report = _run(tmp_path, lab_study(tmp_path, hbm="80"))
    df = trials_frame(report.study)
    bad = df[~df["feasible"].astype(bool)]
    assert len(bad) > 0 and len(df) == 56
    assert bad["reason"].str.len().min() > 0
    # the constraint reached Optuna: memory minus the limit, > 0 exactly when infeasible
    for t in report.study.trials:
        assert (t.constraints["hbm_gb"] > 0) == (not t.user_attrs["feasible"])
        assert t.constraints["hbm_gb"] == pytest.approx(t.user_attrs["peak_memory_gb"] - 80)


def test_every_part_of_the_estimate_is_stored(tmp_path):
    _, report = _run(tmp_path, lab_study(tmp_path))
    t = report.study.trials[0]
    time_parts = sum(v for k, v in t.user_attrs.items() if k.startswith("time_"))
    memory_parts = sum(v for k, v in t.user_attrs.items() if k.startswith("memory_"))
    assert time_parts == pytest.approx(t.user_attrs["step_time_s"])
    assert memory_parts == pytest.approx(t.user_attrs["peak_memory_gb"])
    for key in ("dp", "tp", "pp", "sp", "zero", "recompute", "micro_batch", "schedule", "mfu",
                "tokens_per_s", "feasible", "reason"):
        assert key in t.user_attrs


def test_jobs_two_gives_the_same_trials(tmp_path):
    _, serial = _run(tmp_path, lab_study(tmp_path, "a"))
    _, parallel = _run(tmp_path, lab_study(tmp_path, "b"), jobs=2, store="p.journal")
    assert _plans(serial.study) == _plans(parallel.study)


def test_rerun_without_resume_is_refused_and_changes_nothing(tmp_path):
    path = lab_study(tmp_path)
    _run(tmp_path, path)
    with pytest.raises(PlannerUsageError, match="already exists.*--resume"):
        _run(tmp_path, path)
    storage = open_storage(str(tmp_path / "s.journal"), create=False)
    assert len(optuna.load_study(study_name="lab", storage=storage).trials) == 56


def test_resume_fails_stale_running_trials_and_finishes_the_space(tmp_path):
    path = lab_study(tmp_path)
    config = load_study_config(path)
    label = str(tmp_path / "s.journal")
    storage = open_storage(label, create=True)
    study = optuna.create_study(study_name="lab", storage=storage)
    study.set_user_attr("fingerprint", config.fingerprint())
    study.ask()  # a trial a killed process left RUNNING
    report = run_study(config, storage, label, resume=True, progress=False)
    assert report.requeued == 1
    states = [t.state for t in report.study.trials]
    assert states.count(TrialState.RUNNING) == 0 and states.count(TrialState.FAIL) == 1
    assert len(_plans(report.study)) == states.count(TrialState.COMPLETE) == 56
    # resuming a finished exhaustive study adds nothing
    again = run_study(config, storage, label, resume=True, progress=False)
    assert again.added == 0 and len(again.study.trials) == 57


def test_resume_refuses_a_changed_study(tmp_path):
    path = lab_study(tmp_path)
    _run(tmp_path, path)
    path.write_text(path.read_text().replace("recompute: [none, full]", "recompute: [none]"))
    # the message names the field of the space that changed, with both values
    with pytest.raises(PlannerUsageError, match=r"different settings \(space\.recompute"
                       r" \['none', 'full'\] -> \['none'\]\)"):
        _run(tmp_path, path, resume=True)
    # and without --resume the same: it said "add --resume to continue it", which then failed
    with pytest.raises(PlannerUsageError, match=r"different settings .*set another name"):
        _run(tmp_path, path)


def test_sampler_study_requeues_a_stale_trial(tmp_path):
    path = lab_study(tmp_path, sampler="tpe", n_trials=10)
    config = load_study_config(path)
    label = str(tmp_path / "s.journal")
    storage = open_storage(label, create=True)
    study = optuna.create_study(study_name="lab", storage=storage)
    study.set_user_attr("fingerprint", config.fingerprint())
    stale = study.ask()
    choices = LayoutEncoding(config.space).distributions["layout"].choices
    stale.suggest_categorical("layout", choices)
    report = run_study(config, storage, label, resume=True, progress=False)
    done = report.study.get_trials(states=(TrialState.COMPLETE,))
    assert len(done) == 10
    assert done[0].params["layout"] == stale.params["layout"]  # the re-queued one ran first


@pytest.mark.parametrize("sampler", ["tpe", "nsga2", "random"])
def test_samplers_run_valid_plans_with_the_constraint(tmp_path, sampler):
    config, report = _run(tmp_path, lab_study(tmp_path, sampler=sampler, n_trials=15,
                                              objectives="[step_time, peak_memory]"))
    trials = report.study.get_trials(states=(TrialState.COMPLETE,))
    assert len(trials) == 15
    valid = {s for s in config.space.enumerate()}
    for t in trials:
        assert t.user_attrs["dp"] * t.user_attrs["tp"] * t.user_attrs["sp"] == 64
        assert "hbm_gb" in t.constraints
        assert len(t.values) == 2
    assert len(valid) == 56


def test_random_sampling_draws_distinct_plans_and_a_resume_draws_the_same(tmp_path):
    # Optuna's RandomSampler draws with replacement: 20 trials of the lab's 56 strategies held
    # 18 distinct plans (issue 19). Here 20 trials are 20 distinct plans, the same every time.
    path = lab_study(tmp_path, sampler="random", n_trials=20)
    _, report = _run(tmp_path, path)
    plans = [t.user_attrs["plan"] for t in report.study.get_trials(states=(TrialState.COMPLETE,))]
    assert len(plans) == len(set(plans)) == 20
    _, again = _run(tmp_path, path, store="other.journal")
    assert [t.user_attrs["plan"] for t in again.study.trials] == plans
    # More trials than the space holds: every plan once.
    _, every = _run(tmp_path, lab_study(tmp_path, sampler="random", n_trials=100),
                    store="every.journal")
    assert len({t.user_attrs["plan"] for t in every.study.trials}) == len(every.study.trials) == 56


def test_sampler_with_two_jobs_runs_all_trials(tmp_path):
    _, report = _run(tmp_path, lab_study(tmp_path, sampler="random", n_trials=12), jobs=2)
    assert len(report.study.get_trials(states=(TrialState.COMPLETE,))) == 12


def test_batched_journal_is_a_plain_optuna_journal(tmp_path):
    _, report = _run(tmp_path, lab_study(tmp_path))
    plain = JournalStorage(JournalFileBackend(str(tmp_path / "s.journal")))
    again = optuna.load_study(study_name="lab", storage=plain)
    assert _plans(again) == _plans(report.study)
    assert [t.number for t in again.trials] == list(range(56))


def test_tables_export_csv_and_parquet(tmp_path):
    _, report = _run(tmp_path, lab_study(tmp_path))
    df = trials_frame(report.study)
    assert len(df) == 56
    df.to_csv(tmp_path / "t.csv", index=False)
    back = pd.read_csv(tmp_path / "t.csv")
    assert list(back.columns) == list(df.columns)
    pytest.importorskip("pyarrow")
    df.to_parquet(tmp_path / "t.parquet", index=False)
    assert pd.read_parquet(tmp_path / "t.parquet")["step_time_s"].tolist() == \
        df["step_time_s"].tolist()


@pytest.mark.parametrize("sampler", ["tpe", "random", "nsga2"])
def test_a_seeded_serial_run_gives_the_same_trials_every_time(tmp_path, sampler):
    """Reproducibility: same seed, same sampler, serial run -> the same trials."""
    runs = []
    for store in ("a.journal", "b.journal"):
        _, report = _run(tmp_path, lab_study(tmp_path, sampler=sampler, n_trials=25),
                         store=store)
        runs.append([(t.params, t.values, t.user_attrs["plan"]) for t in report.study.trials])
    assert runs[0] == runs[1] and len(runs[0]) == 25


def _trial_rows(study: optuna.Study) -> list[tuple]:
    return [(t.number, t.state, t.values, t.params, t.distributions, t.user_attrs,
             t.system_attrs, t.datetime_start, t.datetime_complete) for t in study.trials]


def test_the_database_bulk_write_equals_optunas_add_trials(tmp_path):
    """PlannerRDBStorage.add_trials_at_once writes what Optuna's add_trials writes."""
    from planner.record import frozen_trial
    from planner.storage import PlannerRDBStorage

    config = load_study_config(lab_study(tmp_path, hbm="80"))
    encoding = LayoutEncoding(config.space)
    evaluator = config.evaluator()
    trials = [frozen_trial(evaluator(s), encoding.params(s), encoding.distributions)
              for s in config.space.valid]
    storage = open_storage(f"sqlite:///{tmp_path / 'db.sqlite'}", create=True)
    assert isinstance(storage, PlannerRDBStorage)
    plain = optuna.create_study(study_name="plain", storage=storage)
    plain.add_trials(trials)
    bulk = optuna.create_study(study_name="bulk", storage=storage)
    storage.add_trials_at_once(bulk._study_id, trials[:17])
    storage.add_trials_at_once(bulk._study_id, trials[17:])
    assert _trial_rows(bulk) == _trial_rows(plain)
    assert bulk.best_trial.number == plain.best_trial.number
    assert sorted(storage.user_attr_values(bulk._study_id, "plan", TrialState.COMPLETE)) == \
        sorted(t.user_attrs["plan"] for t in plain.trials)
    assert storage.get_n_trials(bulk._study_id, TrialState.COMPLETE) == len(trials)
    assert storage.get_n_trials(bulk._study_id, TrialState.RUNNING) == 0


def test_a_work_item_is_completed_with_its_trials_or_not_at_all(tmp_path):
    from planner.record import frozen_trial

    config = load_study_config(lab_study(tmp_path))
    encoding = LayoutEncoding(config.space)
    trial = frozen_trial(config.evaluator()(config.space.valid[0]), encoding.params(
        config.space.valid[0]), encoding.distributions)
    storage = open_storage(f"sqlite:///{tmp_path / 'db.sqlite'}", create=True)
    study = optuna.create_study(study_name="s", storage=storage)
    queue = optuna.create_study(study_name="q", storage=storage)
    item = queue.ask()
    assert storage.add_trials_at_once(study._study_id, [trial], item_id=item._trial_id,
                                       item_value=1)
    assert queue.trials[0].state == TrialState.COMPLETE and queue.trials[0].value == 1
    # a second attempt on the same item writes nothing
    assert not storage.add_trials_at_once(study._study_id, [trial], item_id=item._trial_id)
    assert len(study.trials) == 1


def test_a_stored_study_gives_back_its_configuration(tmp_path):
    from planner.runner import config_from_study

    for sampler in ("exhaustive", "tpe"):
        config, report = _run(tmp_path, lab_study(tmp_path, f"lab-{sampler}", sampler=sampler,
                                                  n_trials=3, objectives="[step_time,"
                                                  " peak_memory]"))
        again = config_from_study(report.study)
        assert again.fingerprint() == config.fingerprint()
        assert again.space.valid == config.space.valid
        assert (again.sampler, again.n_trials, again.seed, again.objectives) == (
            config.sampler, config.n_trials, config.seed, config.objectives)
        s = config.space.valid[5]
        assert again.evaluator()(s) == config.evaluator()(s)


def test_reading_a_missing_sqlite_file_makes_none(tmp_path, capsys) -> None:
    # `planner best` on a sqlite URL of no file made a 114 kB database as it read it
    from planner.cli import main

    url = f"sqlite:///{tmp_path / 'none.db'}"
    assert main(["best", "s", "--storage", url]) == 2
    assert f"{tmp_path / 'none.db'} does not exist, so no studies are there yet" in (
        capsys.readouterr().err)
    assert not (tmp_path / "none.db").exists()
