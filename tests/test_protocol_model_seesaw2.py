"""scripts/model_seesaw2_protocol.py: the pure-Python model of the experimental seesaw2 kernel's barrier
protocol (pipelines/variant_seesaw2.py).

The kernel as written must pass every scenario (chunks of 0-7 tiles, alone and in sequence) under
random schedules with fixed seeds; forms broken on purpose (a refill before the P.V reading the range
retired, a missing P1_FREE arrive, a stale phase bit, a missing proxy fence) must be caught exactly in
the scenarios that exercise them, so the model keeps its teeth. Two forms without P1_FREE's ordering
pass too (SCALE0 already gives it). The kernel is checked under per-warp wgmma retirement (its
warpgroup bar.sync before each refill and before WG0's zeroing of stage 0 make it independent of
collective retirement); its first form without those syncs must be caught.
"""
from __future__ import annotations

import ast
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "model_seesaw2_protocol.py"
KERNEL = ROOT / "pipelines" / "variant_seesaw2.py"
SEESAW = ROOT / "pipelines" / "variant_seesaw.py"


def _load():
    spec = importlib.util.spec_from_file_location("model_seesaw2_protocol", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MODEL = _load()


@pytest.fixture(scope="module")
def model():
    return MODEL


def _module_constants(path: pathlib.Path):
    """({class name: {member: value}}, {name: literal or source text}) of a module's top level, read
    with ast (no DSL import)."""
    classes, values = {}, {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef):
            classes[node.name] = {item.targets[0].id: item.value for item in node.body if isinstance(item, ast.Assign)}
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                values[node.targets[0].id] = ast.unparse(node.value)
    return classes, values


def test_model_constants_match_the_kernel(model):
    """Barrier ids and box groups as in the kernel's source (SUM / INV: variant_seesaw's Bar)."""
    classes, values = _module_constants(KERNEL)
    seesaw_bar = {k: ast.literal_eval(v) for k, v in _module_constants(SEESAW)[0]["Bar"].items()}
    bars = {}
    for name, node in classes["Bar"].items():
        text = ast.unparse(node)
        bars[name] = seesaw_bar[text[len("int(SeesawBar."):-1]] if text.startswith("int(SeesawBar.") \
            else ast.literal_eval(node)
    assert bars == {name: bid for bid, name in model.BAR_NAMES.items()}
    assert len(set(bars.values())) == len(bars) and all(0 < bid < 16 for bid in bars.values())
    assert values["V_L_BOXES"] == model.V_L_BOXES
    assert values["V_R_ROPE_BOXES"] == model.V_R_ROPE_BOXES
    assert values["WG1_QK_ORDER"] == "V_R_ROPE_BOXES + V_L_BOXES"
    assert values["N_BOXES"] == "HEAD_DIM // COL_BLOCK" and model.N_BOXES == 576 // 64


@pytest.mark.parametrize("scenario", list(MODEL.SCENARIOS))
def test_protocol_holds(model, scenario):
    errors = model.run_form("seesaw2", runs=40, scenarios=[scenario])[scenario]
    assert not errors, errors


@pytest.mark.parametrize("form", ["p1-store-before-p1-free", "no-p1-free"])
def test_p1_free_is_implied_by_scale0(model, form):
    for scenario, errors in model.run_form(form, runs=20).items():
        assert not errors, (scenario, errors)


def test_the_kernel_holds_under_collective_retirement_too(model):
    for scenario, errors in model.run_form("assume:warpgroup-retire", runs=20).items():
        assert not errors, (scenario, errors)


# form -> what every error it reports must say
BROKEN = {
    "broken:early-stage0-refill": ("TMA into ('K', 0,",),
    "broken:early-stage1-refill": ("TMA into ('K', 1,",),
    "broken:skip-p1-free-without-t1": ("deadlock",),
    "broken:wg1-qk-stale-phase": ("deadlock", "reads ('K', 1,"),
    "broken:no-p0-fence": ("before WG0.w",),
    # (a deadlock too: warp 0 refills a box while another warp of its warpgroup has not yet waited for
    # the phase before, which then never completes for it)
    "broken:no-wg-sync": ("TMA into ('K',", "overwrites ('K',", "reads ('K',", "deadlock"),
}


@pytest.mark.parametrize("form", list(BROKEN))
def test_broken_form_is_caught(model, form):
    result = model.run_form(form, runs=30)
    for scenario, errors in result.items():
        assert bool(errors) == model.expected_caught(form, scenario), (scenario, errors)
        for _, msg in errors.values():
            assert any(s in msg for s in BROKEN[form]), (scenario, msg)
    assert any(result.values())


def test_skipped_p1_free_arrive_hangs_wg1_on_p1_free(model):
    """WG0 without its P1_FREE arrive in the pair without t1 (one tile): WG1's exit sync never completes."""
    errors = model.run_form("broken:skip-p1-free-without-t1", runs=5, scenarios=["1"])["1"]
    (_, msg), = errors.values()
    assert "'WG1.w0': ('nbwait', 'P1_FREE')" in msg and "WG0" not in msg
