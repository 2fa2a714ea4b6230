"""scripts/model_3wg_protocol.py: the pure-Python model of the 3wg kernel's barrier protocol.

The model as the kernel is written (WG1's overlap choice OR-reduced over the warpgroup) must pass
every scenario under random schedules; the pre-fix form (each warp branching on its own
``mbarrier.test_wait``) must be caught as misaligned wgmma, so the model keeps its teeth.
"""
from __future__ import annotations

import importlib.util
import pathlib
import random

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "model_3wg_protocol.py"


@pytest.fixture(scope="module")
def model():
    spec = importlib.util.spec_from_file_location("model_3wg_protocol", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("scenario", ["1-3-2", "5", "2-1", "5-5 (200x300 keys)", "0-length in the middle",
                                      "1-1-1-1"])
def test_protocol_holds(model, scenario):
    for seed in range(60):
        model.Sim(model.chunk_list(model.SCENARIOS[scenario]), random.Random(seed), racy=False).run()


def test_per_warp_test_wait_is_caught(model):
    errors = []
    for seed in range(60):
        try:
            model.Sim(model.chunk_list(model.SCENARIOS["5-5 (200x300 keys)"]), random.Random(seed), racy=True).run()
        except model.ProtocolError as exc:
            errors.append(str(exc))
    assert errors and all("misaligned wgmma" in e for e in errors)


def test_one_tile_chunks_never_diverge(model):
    # Why python -m mla (one tile per chunk) passed before the fix: no chunk has a next tile.
    for seed in range(60):
        model.Sim(model.chunk_list(model.SCENARIOS["1-1-1-1"]), random.Random(seed), racy=True).run()
