"""scripts/model_2wg_protocol.py: the pure-Python model of the 2wg kernels' barrier protocol (the
committed 2wg, its narrow kernel, and the overlap schedule, with and without WG1's deferred P.V).

Every real form must pass every scenario under random schedules; three forms broken on purpose (a
deferred WG1 behind a WG0 that never signals it; an overlap WG0 writing P before the previous P.V
retired; a narrow WG1 zeroing a tail tile's V rows before WG0's S^T of the stage is known to be done)
must be caught, so the model keeps its teeth.
"""
from __future__ import annotations

import importlib.util
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "model_2wg_protocol.py"


@pytest.fixture(scope="module")
def model():
    spec = importlib.util.spec_from_file_location("model_2wg_protocol", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("form", ["2wg", "narrow", "overlap", "overlap-defer"])
def test_protocol_holds(model, form):
    for scenario, errors in model.run_form(form, runs=40).items():
        assert not errors, (scenario, errors)


def test_deferred_wg1_behind_an_eager_wg0_deadlocks(model):
    result = model.run_form("broken:defer-on-eager", runs=10)
    # Scenarios with a chunk of two or more tiles hang; one-tile chunks never wait for the signal.
    assert all(set(errors) == {"deadlock"} for name, errors in result.items() if name != "1-1-1-1"), result
    assert not result["1-1-1-1"]


def test_p_written_before_the_previous_pv_retired_is_caught(model):
    result = model.run_form("broken:early-hand-off", runs=40)
    assert all(errors for errors in result.values()), result
    assert all(any("overwrites ('rP'" in msg for _, msg in errors.values()) for errors in result.values()), result


def test_narrow_zeroing_before_p_full_is_caught(model):
    result = model.run_form("broken:narrow-early-zero", runs=40)
    # Every scenario with a tail tile; the one of whole tiles only never zeroes.
    for name, errors in result.items():
        if name.startswith("9 "):
            assert not errors, (name, errors)
        else:
            assert errors and all("overwrites ('sK'" in msg for _, msg in errors.values()), (name, errors)
