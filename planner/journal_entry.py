"""Whether a parsed journal line is an entry Optuna's journal can replay.

Optuna's ``JournalStorage`` replays each line by its ``op_code`` and reads the fields of that
operation by key (``optuna/storages/journal/_storage.py``, ``JournalStorageReplayResult``):
a line that is JSON but lacks one (``{"x": 1}``, an ``op_code`` of 11, a CREATE_TRIAL without
its ``study_id``) stops every reader with a ``KeyError`` or an ``AssertionError``. The keys
below are the ones its replay reads unconditionally, with the types it relies on; the
``worker_id`` is read by the operations that own trials.
"""

from __future__ import annotations

from typing import Any

__all__ = ["REQUIRED_KEYS", "is_journal_entry"]

REQUIRED_KEYS: dict[int, tuple[str, ...]] = {
    0: ("study_name", "directions"),  # CREATE_STUDY
    1: ("study_id",),  # DELETE_STUDY
    2: ("study_id", "user_attr"),  # SET_STUDY_USER_ATTR
    3: ("study_id", "system_attr"),  # SET_STUDY_SYSTEM_ATTR
    4: ("study_id", "datetime_start"),  # CREATE_TRIAL
    5: ("trial_id", "param_name", "param_value_internal", "distribution"),  # SET_TRIAL_PARAM
    6: ("trial_id", "state", "values"),  # SET_TRIAL_STATE_VALUES
    7: ("trial_id", "step", "intermediate_value"),  # SET_TRIAL_INTERMEDIATE_VALUE
    8: ("trial_id", "user_attr"),  # SET_TRIAL_USER_ATTR
    9: ("trial_id", "system_attr"),  # SET_TRIAL_SYSTEM_ATTR
    10: (),  # DISCARD_TRIALS (skipped by Optuna's replay)
}
"""``optuna.storages.journal._storage.JournalOperation``'s codes and the keys each replay
reads."""

_IDS = ("study_id", "trial_id")
_ATTRS = ("user_attr", "system_attr")


def is_journal_entry(entry: Any) -> bool:
    """``entry`` (a parsed line) is an operation Optuna's journal replays without failing on
    a missing key or a wrongly typed id."""
    if not isinstance(entry, dict):
        return False
    op = entry.get("op_code")
    if type(op) is not int or op not in REQUIRED_KEYS:
        return False
    if not isinstance(entry.get("worker_id"), str):
        return False
    keys = REQUIRED_KEYS[op]
    if any(key not in entry for key in keys):
        return False
    if any(type(entry[key]) is not int for key in _IDS if key in keys):
        return False
    if any(not isinstance(entry[key], dict) for key in _ATTRS if key in keys):
        return False
    return op != 0 or isinstance(entry["directions"], list)
