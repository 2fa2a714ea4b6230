"""CPU: when a decode merges split-kv in its own grid (``pipelines.grid_merge_mode``,
``MLA_GRID_MERGE``), and that every API path hands the compiled entry that decision (the kernels
themselves run in tests/test_grid_merge_gpu.py; their SASS is checked by mla.compile_check)."""
from __future__ import annotations

import pytest
import torch

import mla
import pipelines
from mla.testing import make_decode_problem

NUM_SMS = 132


@pytest.mark.parametrize("value, setting", [(None, "auto"), ("", "auto"), (" ", "auto"), ("auto", "auto"),
                                            ("0", "off"), ("off", "off"), ("1", "on"), ("on", "on"), (" ON ", "on")])
def test_setting(monkeypatch, value, setting):
    if value is None:
        monkeypatch.delenv(pipelines.GRID_MERGE_ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(pipelines.GRID_MERGE_ENV_VAR, value)
    assert pipelines.grid_merge_setting() == setting


def test_bad_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv(pipelines.GRID_MERGE_ENV_VAR, "yes")
    with pytest.raises(ValueError, match="MLA_GRID_MERGE must be auto, 0, 1, off or on \\(or unset\\), got 'yes'"):
        pipelines.grid_merge_setting()


def test_mode_needs_a_variant_that_merges_no_split_cluster_and_one_wave():
    mode = pipelines.grid_merge_mode
    never, always, eager = pipelines.GRID_MERGE_NEVER, pipelines.GRID_MERGE_ALWAYS, pipelines.GRID_MERGE_EAGER
    assert mode("2wg", 16, 1, 1, 132, 132, "on") == always  # 132 CTAs on 132 SMs
    assert mode("2wg", 16, 1, 1, 132, 132, "auto") == eager
    assert mode("2wg", 16, 1, 1, 132, 132, "off") == never
    assert mode("3wg", 16, 1, 1, 132, 132, "on") == never == mode("seesaw", 16, 1, 1, 132, 132, "on")
    assert mode("2wg", 16, 1, 8, 132, 132, "on") == never  # a split cluster merges in its own epilogue
    assert mode("2wg", 16, 1, 1, 264, 132, "on") == never  # a plan made for twice the SMs: two waves
    assert mode("2wg", 128, 1, 1, 66, 132, "on") == always and mode("2wg", 128, 1, 1, 67, 132, "on") == never
    assert mode("2wg", 64, 2, 1, 66, 132, "on") == always and mode("2wg", 64, 2, 1, 67, 132, "on") == never
    assert mode("2wg", 16, 1, 1, 1, 0, "on") == never  # no SM count (not a CUDA device): never
    # auto: only where the merge gives each CTA of a part at most one cell (in-grid Y <= m-blocks x h_kv)
    assert mode("2wg", 128, 1, 1, 66, 132, "auto", merge_cells=2) == eager
    assert mode("2wg", 128, 1, 1, 66, 132, "auto", merge_cells=5) == never
    assert mode("2wg", 128, 1, 1, 66, 132, "on", merge_cells=5) == always


def test_auto_takes_short_single_request_merges_only():
    """The H200 A/B (docs/perf-notes.md): b1 h16 (one cell per CTA) gains eagerly; b1 h128 16384 and b8
    h64 4096 (several cells per CTA) lose 2-4 us of GPU time, so auto leaves them to the merge kernel."""
    from split_k import merge_kernel as mk
    cells = lambda rows, b, seqlen: mk.in_grid_y(rows, b, pipelines_parts(rows), mk.LOADS_WIDE,
                                                 mk.capacity_tiles(seqlen // 64, 64))
    assert cells(16, 1, 1024) == 1 and cells(16, 1, 16384) == 1
    assert cells(128, 1, 16384) > 2  # 2 m-blocks per part
    assert cells(64, 8, 4096) > 1


def pipelines_parts(rows):
    from split_k import planner
    return planner.num_sm_parts(NUM_SMS, rows, 1)


def test_the_variants_that_merge_in_their_grid_are_those_whose_kernels_do():
    from pipelines import variant_2wg, variant_2wg_narrow, variant_3wg, variant_seesaw
    classes = {"2wg": (variant_2wg.MLADecode2WG, variant_2wg_narrow.MLADecode2WGNarrow),
               "3wg": (variant_3wg.MLADecode3WG,), "seesaw": (variant_seesaw.MLADecodeSeesaw,)}
    for variant, kernels in classes.items():
        for cls in kernels:
            assert cls.in_grid_merge is (variant in pipelines.GRID_MERGE_VARIANTS), cls
            if cls.in_grid_merge:  # the merge's 8 warps are the CTA's threads, with every register
                assert cls.num_threads == 256


@pytest.mark.parametrize("setting, capturing, want", [("1", False, 1), ("1", True, 1), ("0", False, 0),
                                                     ("auto", False, 1), ("auto", True, 0)])
def test_every_entry_point_passes_the_flag(fake_kernel, monkeypatch, setting, capturing, want):
    monkeypatch.setenv(pipelines.GRID_MERGE_ENV_VAR, setting)
    monkeypatch.setattr(pipelines, "device_sm_count", lambda device: NUM_SMS)
    monkeypatch.setattr(mla.api, "_capturing", lambda: capturing)
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
    monkeypatch.setattr(mla.api, "_capturing", lambda: False)
    prob = make_decode_problem([100, 0, 3000], s_q=1, h_q=16)
    dec = mla.MLADecoder(pipeline="2wg", num_sms=2 * NUM_SMS)
    dec.plan(prob.cache_seqlens, num_heads_q=16, page_size=64)
    dec.run(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens)
    assert fake_kernel.calls[-1]["grid_merge"] == 0


def test_the_setting_is_part_of_the_flash_signature(fake_kernel, monkeypatch):
    monkeypatch.setattr(pipelines, "device_sm_count", lambda device: NUM_SMS)
    monkeypatch.setattr(mla.api, "_capturing", lambda: False)
    prob = make_decode_problem([100, 3000], s_q=1, h_q=16)
    meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
    for setting in ("1", "0", "1"):
        monkeypatch.setenv(pipelines.GRID_MERGE_ENV_VAR, setting)
        mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, meta, splits,
                                   pipeline="2wg")
    assert [c["grid_merge"] for c in fake_kernel.calls] == [1, 0, 1]


def test_a_refused_cooperative_launch_falls_back_to_the_merge_kernel_once_and_for_all(fake_kernel, monkeypatch):
    """MPS limits or green contexts can make the driver refuse the cooperative launch: the call is
    launched again with the merge kernel, a warning says so once, and no later call asks again."""
    from cutlass.base_dsl.common import DSLCudaRuntimeError

    monkeypatch.setenv(pipelines.GRID_MERGE_ENV_VAR, "1")
    monkeypatch.setattr(pipelines, "device_sm_count", lambda device: NUM_SMS)
    monkeypatch.setattr(mla.api, "_capturing", lambda: False)
    monkeypatch.setattr(mla.api, "_grid_merge_usable", True)
    asked = []
    make = fake_kernel.__call__

    def refusing(*args, **kwargs):
        launch = make(*args, **kwargs)

        def wrapped(*a):
            asked.append(a[-1])
            if a[-1] == 1:
                raise DSLCudaRuntimeError(720, "cudaErrorCooperativeLaunchTooLarge")
            return launch(*a)
        return wrapped
    monkeypatch.setattr(pipelines, "decode_launcher", refusing)
    prob = make_decode_problem([100, 0, 3000], s_q=1, h_q=16)
    dec = mla.MLADecoder(pipeline="2wg", num_sms=NUM_SMS)
    dec.plan(prob.cache_seqlens, num_heads_q=16, page_size=64)
    with pytest.warns(RuntimeWarning, match="cooperative launch was refused"):
        out, lse = dec.run(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens)
    ref_out, _ = mla.reference.mla_decode_reference(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens)
    assert torch.allclose(out.float(), ref_out, atol=2e-2)
    dec.run(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens)
    meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
    mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, meta, splits,
                               pipeline="2wg")
    assert asked == [1, 0, 0, 0]  # refused once, relaunched, then never asked again


@pytest.mark.parametrize("error", ["runtime", "illegal-address"])
def test_an_error_that_is_not_a_refusal_propagates(fake_kernel, monkeypatch, error):
    from cutlass.base_dsl.common import DSLCudaRuntimeError

    monkeypatch.setenv(pipelines.GRID_MERGE_ENV_VAR, "1")
    monkeypatch.setattr(pipelines, "device_sm_count", lambda device: NUM_SMS)
    monkeypatch.setattr(mla.api, "_capturing", lambda: False)
    monkeypatch.setattr(mla.api, "_grid_merge_usable", True)
    exc = RuntimeError("boom") if error == "runtime" else DSLCudaRuntimeError(700, "boom: cudaErrorIllegalAddress")
    monkeypatch.setattr(pipelines, "decode_launcher", lambda *a, **k: (lambda *args: (_ for _ in ()).throw(exc)))
    prob = make_decode_problem([100, 3000], s_q=1, h_q=16)
    dec = mla.MLADecoder(pipeline="2wg", num_sms=NUM_SMS)
    dec.plan(prob.cache_seqlens, num_heads_q=16, page_size=64)
    with pytest.raises(Exception, match="boom"):
        dec.run(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens)
    assert mla.api._grid_merge_usable is True


def test_a_cached_run_signature_with_another_dtype_still_names_the_argument(fake_kernel):
    """run's signature leaves dtypes to the compiled function: a q of another dtype with the same shapes
    is refused there, and the API's checks name what does not match."""
    prob = make_decode_problem([100, 3000], s_q=1, h_q=16)
    dec = mla.MLADecoder(pipeline="2wg", num_sms=NUM_SMS)
    dec.plan(prob.cache_seqlens, num_heads_q=16, page_size=64)
    dec.run(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens)
    with pytest.raises(TypeError, match="k_cache must be float16, got bfloat16"):  # as for a new signature
        dec.run(prob.q.half(), prob.k_cache, prob.block_table, prob.cache_seqlens)
