"""CPU: when a decode merges split-kv in its own grid (``pipelines.grid_merge_flag``,
``MLA_GRID_MERGE``), and that every API path hands the compiled entry that decision (the kernels
themselves run in tests/test_grid_merge_gpu.py; their SASS is checked by mla.compile_check)."""
from __future__ import annotations

import pytest
import torch

import mla
import pipelines
from mla.testing import make_decode_problem

NUM_SMS = 132


@pytest.mark.parametrize("value, on", [(None, False), ("", False), (" ", False), ("0", False), ("off", False),
                                       ("1", True), ("on", True), (" ON ", True)])
def test_setting_is_off_unless_asked_for(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv(pipelines.GRID_MERGE_ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(pipelines.GRID_MERGE_ENV_VAR, value)
    assert pipelines.grid_merge_setting() is on


def test_bad_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv(pipelines.GRID_MERGE_ENV_VAR, "yes")
    with pytest.raises(ValueError, match="MLA_GRID_MERGE must be 0, 1, off or on, got 'yes'"):
        pipelines.grid_merge_setting()


def test_flag_needs_the_setting_a_variant_that_merges_no_split_cluster_and_one_wave():
    flag = pipelines.grid_merge_flag
    assert flag("2wg", 16, 1, 1, 132, 132) == 1  # 132 CTAs on 132 SMs
    assert flag("2wg", 16, 1, 1, 132, 132, setting=False) == 0
    assert flag("3wg", 16, 1, 1, 132, 132) == 0 and flag("seesaw", 16, 1, 1, 132, 132) == 0
    assert flag("2wg", 16, 1, 8, 132, 132) == 0  # a split cluster merges in its own epilogue
    assert flag("2wg", 16, 1, 1, 264, 132) == 0  # a plan made for twice the SMs: two waves
    assert flag("2wg", 128, 1, 1, 66, 132) == 1 and flag("2wg", 128, 1, 1, 67, 132) == 0  # 2 m-blocks each
    assert flag("2wg", 64, 2, 1, 66, 132) == 1 and flag("2wg", 64, 2, 1, 67, 132) == 0  # 2 kv heads each
    assert flag("2wg", 16, 1, 1, 1, 0) == 0  # no SM count (not a CUDA device): never


def test_the_variants_that_merge_in_their_grid_are_those_whose_kernels_do():
    from pipelines import variant_2wg, variant_2wg_narrow, variant_3wg, variant_seesaw
    classes = {"2wg": (variant_2wg.MLADecode2WG, variant_2wg_narrow.MLADecode2WGNarrow),
               "3wg": (variant_3wg.MLADecode3WG,), "seesaw": (variant_seesaw.MLADecodeSeesaw,)}
    for variant, kernels in classes.items():
        for cls in kernels:
            assert cls.in_grid_merge is (variant in pipelines.GRID_MERGE_VARIANTS), cls
            if cls.in_grid_merge:  # the merge's 8 warps are the CTA's threads, with every register
                assert cls.num_threads == 256


@pytest.mark.parametrize("setting, want", [("1", 1), ("0", 0)])
def test_every_entry_point_passes_the_flag(fake_kernel, monkeypatch, setting, want):
    monkeypatch.setenv(pipelines.GRID_MERGE_ENV_VAR, setting)
    monkeypatch.setattr(pipelines, "device_sm_count", lambda device: NUM_SMS)
    prob = make_decode_problem([100, 0, 3000], s_q=1, h_q=16)
    dec = mla.MLADecoder(pipeline="2wg", num_sms=NUM_SMS)
    dec.plan(prob.cache_seqlens, num_heads_q=16, page_size=64)
    dec.run(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens)
    meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
    mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, meta, splits,
                               pipeline="2wg")
    mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, meta, splits,
                               pipeline="3wg")  # 3wg never merges in its grid
    assert [c["grid_merge"] for c in fake_kernel.calls] == [want, want, 0]


def test_a_plan_for_more_sms_than_the_device_has_gets_the_merge_kernel(fake_kernel, monkeypatch):
    monkeypatch.setenv(pipelines.GRID_MERGE_ENV_VAR, "1")
    monkeypatch.setattr(pipelines, "device_sm_count", lambda device: NUM_SMS)
    prob = make_decode_problem([100, 0, 3000], s_q=1, h_q=16)
    dec = mla.MLADecoder(pipeline="2wg", num_sms=2 * NUM_SMS)
    dec.plan(prob.cache_seqlens, num_heads_q=16, page_size=64)
    dec.run(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens)
    assert fake_kernel.calls[-1]["grid_merge"] == 0


def test_the_setting_is_part_of_the_flash_signature(fake_kernel, monkeypatch):
    monkeypatch.setattr(pipelines, "device_sm_count", lambda device: NUM_SMS)
    prob = make_decode_problem([100, 3000], s_q=1, h_q=16)
    meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
    for setting in ("1", "0", "1"):
        monkeypatch.setenv(pipelines.GRID_MERGE_ENV_VAR, setting)
        mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, meta, splits,
                                   pipeline="2wg")
    assert [c["grid_merge"] for c in fake_kernel.calls] == [1, 0, 1]
