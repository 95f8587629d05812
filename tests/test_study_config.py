"""Study YAMLs: every problem is one line naming the file, the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.errors import PlannerUsageError
from planner.study_config import load_study_config
from simcore.specs import Convention, Recompute, ZeroStage
from tests.study_files import lab_study

STUDIES = Path(__file__).resolve().parent.parent / "studies"


def test_reads_the_lab_study(tmp_path):
    c = load_study_config(lab_study(tmp_path))
    assert (c.name, c.model.name, c.system.name) == ("lab", "llama70b", "lab-system1")
    assert c.convention is Convention.MEGATRON and c.hbm_gb == 80
    assert c.space.recompute == (Recompute.NONE, Recompute.FULL)
    assert c.metric_names == ["step_time_s"]


def test_hbm_override_is_a_study_of_its_own(tmp_path):
    c = load_study_config(lab_study(tmp_path, hbm="unlimited"), hbm_gb=80)
    assert c.hbm_gb == 80 and c.name == "lab-hbm80gb"
    assert c.system.device.hbm_bytes == 80e9
    assert load_study_config(lab_study(tmp_path, hbm="unlimited")).hbm_gb is None


@pytest.mark.parametrize("path", sorted(STUDIES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_study_loads_and_has_valid_strategies(path):
    c = load_study_config(path)
    assert c.space.enumerate(), path


def test_shipped_lab_studies_are_the_labs_question():
    # shared design.md: dp, tp, sp in {1..64}, pp 1, no FSDP, recompute on/off: 56 strategies.
    for name in ("lab4b-llama70b-system1", "lab4b-gpt175b-system2"):
        c = load_study_config(STUDIES / f"{name}.yaml")
        assert c.convention is Convention.STAGE and c.hbm_gb is None
        assert c.space.size == 56 and c.space.zero == (ZeroStage.NONE,)


def _error(tmp_path: Path, text: str, **kw) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(PlannerUsageError) as e:
        load_study_config(path, **kw)
    message = str(e.value)
    assert "\n" not in message
    return message


GOOD = "model: llama70b\nsystem: lab-system1\ntraining: {global_batch: 512}\nspace: {tp: [1]}\n"


@pytest.mark.parametrize("text, where, hint", [
    ("system: lab-system1\ntraining: {global_batch: 512}\nspace: {}\n", "model", "missing"),
    (GOOD + "colour: red\n", "colour", "unknown field"),
    (GOOD.replace("llama70b", "llama-99b"), "model", "unknown model 'llama-99b'"),
    (GOOD.replace("lab-system1", "nowhere"), "system", "unknown system"),
    (GOOD + "hbm_gb: 0\n", "hbm_gb", "must be > 0"),
    (GOOD + "hbm_gb: -5\n", "hbm_gb", "must be > 0"),
    (GOOD + "sampler: annealing\n", "sampler", "use one of exhaustive"),
    (GOOD + "objectives: [memory]\n", "objectives", "[step_time, peak_memory]"),
    (GOOD.replace("space: {tp: [1]}", "space: {tp: [1], recompute: [some]}"),
     "space.recompute", "unknown value 'some'"),
    (GOOD.replace("space: {tp: [1]}", "space: {tpp: [1]}"), "space.tpp", "unknown field"),
    (GOOD.replace("space: {tp: [1]}", "space: {tp: [0]}"), "space.tp", ">= 1"),
    (GOOD.replace("{global_batch: 512}", "{}"), "training.global_batch", "missing"),
    (GOOD.replace("space: {tp: [1]}", "space: {schedule: [interleaved]}"), "space.v", "v > 1"),
    ("model: [unclosed\n", "line 2", "not valid YAML"),
])
def test_bad_fields(tmp_path, text, where, hint):
    message = _error(tmp_path, text)
    assert message.startswith(str(tmp_path / "bad.yaml"))
    assert where in message and hint in message


@pytest.mark.parametrize("text", ["", "# a study, some day\n", "---\n"])
def test_an_empty_study_file_says_so(tmp_path, text):
    assert _error(tmp_path, text) == (f"{tmp_path / 'bad.yaml'}: the study file is empty; write"
                                      " its fields (model, space, system, training at least)")


@pytest.mark.parametrize("wrong, right, where, fix", [
    ("training: {global_batch: 512}", "training:", "training", "global_batch at least"),
    ("space: {tp: [1]}", "space:", "space", "or {} for none"),
])
def test_an_empty_field_says_so(tmp_path, wrong, right, where, fix):
    message = _error(tmp_path, GOOD.replace(wrong, right))
    assert message.startswith(f"{tmp_path / 'bad.yaml'}: {where}: is empty; write its fields")
    assert fix in message and "NoneType" not in message


def test_bad_hbm_override(tmp_path):
    path = lab_study(tmp_path)
    with pytest.raises(PlannerUsageError, match="--hbm-gb must be a number > 0"):
        load_study_config(path, hbm_gb=0)


def test_missing_file(tmp_path):
    with pytest.raises(PlannerUsageError, match="no such file"):
        load_study_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize("wrong, right, where", [
    ("training:", "traning:", "traning"),
    ("space:", "spcae:", "spcae"),
    ("global_batch", "global_bach", "training.global_bach"),
    ("space: {tp: [1]}", "space: {tp: [1], micro_bath: [1]}", "space.micro_bath"),
])
def test_misspelt_fields_suggest_the_right_one(tmp_path, wrong, right, where):
    message = _error(tmp_path, GOOD.replace(wrong, right))
    meant = where.rsplit(".", 1)[-1]
    expected = {"traning": "training", "spcae": "space", "global_bach": "global_batch",
                "micro_bath": "micro_batch"}[meant]
    assert f"bad.yaml: {where}: unknown field; did you mean {expected}" in message
    assert "missing" not in message


def test_far_off_fields_get_no_suggestion(tmp_path):
    message = _error(tmp_path, GOOD + "colour: red\n")
    assert "did you mean" not in message and "allowed:" in message


@pytest.mark.parametrize("change, said", [
    # a YAML path that is not there: named beside the study and its field (it named the file
    # alone)
    (("system: lab-system1", "system: gone.yaml"),
     "study.yaml: system: gone.yaml: no such file ("),
    # a near miss of powers_of_two: "must be a whole number" said nothing of it
    (("tp: powers_of_two", "tp: powers_of_2"),
     "space.tp: must be a whole number, a list of them or powers_of_two, but got 'powers_of_2'"),
    # YAML 1.1 reads 1e30 as text: "must be a number, but got '1e30'" did not say why
    (("hbm_gb: 80", "hbm_gb: 1e30"), "hbm_gb: must be a number, but got '1e30', which YAML"
     " reads as text (an exponent needs a decimal point and a sign there); write 1.0e+30"),
    # ... and so 1.0e3, which the hint once suggested (PyYAML's float: a dot, a signed exponent)
    (("hbm_gb: 80", "hbm_gb: 1.0e3"), "but got '1.0e3', which YAML reads as text (an exponent"
     " needs a decimal point and a sign there); write 1.0e+3 or the number in full"),
])
def test_a_study_says_what_to_fix(tmp_path, change, said):
    path = lab_study(tmp_path, "study")
    text = path.read_text()
    assert change[0] in text
    path.write_text(text.replace(*change))
    with pytest.raises(PlannerUsageError) as e:
        load_study_config(path)
    assert said in str(e.value) and "\n" not in str(e.value)


def test_a_yaml_of_another_kind_is_named_as_such(tmp_path):
    # a study file given as the system said "description: must be a mapping of fields", a file
    # of systems given as a model named its first system's first field
    other = lab_study(tmp_path, "other")
    path = lab_study(tmp_path, "study")
    path.write_text(path.read_text().replace("system: lab-system1", f"system: {other.name}"))
    with pytest.raises(PlannerUsageError, match="top level: is a study file, not a system"
                       " YAML; name the study's system"):
        load_study_config(path)
    systems = tmp_path / "systems.yaml"
    systems.write_text("mine:\n  device: a100-80gb\n  network:\n    - {topology: Switch,"
                       " npus: 8, bandwidth_gbps: 231, latency_us: 0.58}\n")
    path.write_text(path.read_text().replace("model: llama70b", "model: systems.yaml#mine")
                    .replace(f"system: {other.name}", "system: systems.yaml#mine"))
    with pytest.raises(PlannerUsageError, match="systems.yaml: mine: is a system entry, not a"
                       " model; name a model YAML here"):
        load_study_config(path)
