"""simcore's one interface: estimate, check and step_timeline go through the registry."""

from __future__ import annotations

from dataclasses import replace

import pytest

import simcore
from planner.catalog import load_catalog
from simcore import Convention, Strategy, TrainingSpec
from simcore.conventions import CONVENTIONS, implementation


def test_every_convention_is_registered():
    assert set(CONVENTIONS) == set(Convention)


def test_estimate_dispatches_through_the_registry(monkeypatch):
    # Replace the megatron convention's estimate by one that records its call: the public
    # entry points must reach it, not a hard-wired function.
    catalog = load_catalog(user=False)
    model, system = catalog.model("gpt-1.7b"), catalog.system("dgx-a100-8")
    training, strategy = TrainingSpec(global_batch=8, seq_len=2048), Strategy(dp=8)
    real = implementation(Convention.MEGATRON)
    calls = []

    def recording(*args):
        calls.append(args)
        return real.estimate(*args)

    monkeypatch.setitem(CONVENTIONS, Convention.MEGATRON, replace(real, estimate=recording))
    est = simcore.estimate(model, system, training, strategy)
    assert len(calls) == 1 and est.step_time > 0
    tl = simcore.step_timeline(model, system, training, strategy)
    assert len(calls) == 2 and tl.estimate_step_time == est.step_time


def test_unregistered_convention_is_a_clear_error(monkeypatch):
    monkeypatch.delitem(CONVENTIONS, Convention.MLP)
    with pytest.raises(ValueError, match="no implementation"):
        implementation(Convention.MLP)
