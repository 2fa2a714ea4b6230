"""CPU tests of perf_table: formulas, grid, the runner's bookkeeping, regeneration, the CLI."""
from __future__ import annotations

import collections
import csv
import dataclasses
import io
import json
import pathlib
import shutil
import subprocess
import sys
import types

import pytest
import torch

from perf_table import anchors as anchors_mod
from perf_table import bench, formulas, grid, regenerate, runner
from perf_table.grid import Config

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
FIXTURE_RUNS = sorted(FIXTURES.glob("perf_*.json"))
ROOFLINE = {"copy_gbps": 4000.0, "gemm_tflops": 700.0}


# ------------------------------------------------------------------------------------- formulas

def test_bytes_and_flops_of_a_known_config():
    # b128 s_q1 h_q16 seqlen 4096: q 128*16*576*2 + KV 128*4096*576*2 + out 128*16*512*2.
    assert formulas.decode_bytes(128, 1, 16, 128 * 4096) == 2_359_296 + 603_979_776 + 2_097_152
    assert formulas.decode_flops(1, 16, 128 * 4096) == 2 * 16 * 524_288 * 1088
    # FlashMLA's anchor for it: 145.6 us -> 4180 GB/s, 125 TFLOP/s (us rounded to 0.1 in the CSV).
    assert formulas.gbps(608_436_224, 145.6) == pytest.approx(4178.8, abs=0.05)
    assert formulas.tflops(18_253_611_008, 145.6) == pytest.approx(125.37, abs=0.005)


def test_formulas_reproduce_every_anchor_row():
    """Our counts give the anchors' GB/s and TFLOP/s from their times: the columns compare."""
    checked = 0
    for path in sorted(anchors_mod.ANCHORS_DIR.glob("*.csv")):
        for row in csv.DictReader(open(path)):
            if row["varlen"] == "1":  # their lengths are not in the CSV
                continue
            b, s_q, h_q, seqlen = (int(row[k]) for k in ("b", "s_q", "h_q", "seqlen"))
            nbytes = formulas.decode_bytes(b, s_q, h_q, b * seqlen, row["dtype"])
            flops = formulas.decode_flops(s_q, h_q, b * seqlen)
            us = float(row["us"])
            # The CSV's us is rounded to 0.1: the true time lies within +-0.05 us of it.
            lo, hi = us - 0.05, us + 0.05
            assert nbytes / hi / 1e3 - 0.5 <= int(row["gbps"]) <= nbytes / lo / 1e3 + 0.5, row
            assert flops / hi / 1e6 - 0.5 <= int(row["tflops"]) <= flops / lo / 1e6 + 0.5, row
            checked += 1
    assert checked == 120 + 120 + 128


def test_roofline_picks_the_larger_term_and_the_fraction():
    # 4 GB at 4000 GB/s = 1000 us; 1.4e12 FLOPs at 700 TFLOP/s = 2000 us -> compute bound.
    assert formulas.roofline_us(4e9, 1.4e12, 4000.0, 700.0) == pytest.approx((2000.0, "compute"))
    assert formulas.roofline_us(4e9, 0.7e12, 4000.0, 700.0) == pytest.approx((1000.0, "memory"))
    assert formulas.roofline_fraction(2500.0, 4e9, 1.4e12, 4000.0, 700.0) == pytest.approx(0.8)
    assert formulas.roofline_fraction(1000.0, 4e9, 0.7e12, 4000.0, 700.0) == pytest.approx(1.0)


# ----------------------------------------------------------------------------------------- grid

def test_full_grid_is_issue_4s_grid():
    configs = grid.full_grid((64,))
    assert len(configs) == 5 * 2 * 4 * 3 + 4 == len(set(configs))
    uniform = {(c.b, c.s_q, c.h_q, c.seqlen) for c in configs if not c.varlen}
    assert uniform == {(b, s, h, n) for b in (1, 8, 32, 64, 128) for s in (1, 2) for h in (16, 32, 64, 128)
                       for n in (1024, 4096, 16384)}
    assert {(c.b, c.s_q, c.h_q, c.seqlen) for c in configs if c.varlen} == {
        (128, s, 128, n) for s in (1, 2) for n in (4096, 16384)}
    assert [c.page_size for c in grid.full_grid((64, 1))].count(1) == 124


def test_quick_grid_is_the_anchor_configs():
    quick = grid.quick_grid((64, 16, 1))
    assert [c.page_size for c in quick].count(64) == 10
    assert [c.page_size for c in quick].count(16) == [c.page_size for c in quick].count(1) == 4
    fm = anchors_mod.load_anchors()["FlashMLA"]
    fi = anchors_mod.load_anchors()["FlashInfer"]
    for c in quick:  # every quick config has an anchor at its own page size
        key = anchors_mod.anchor_key("NVIDIA H200", c.dtype, c.page_size, c.b, c.s_q, c.h_q, c.seqlen, c.varlen)
        assert key in (fm if c.page_size == 64 else fi), c


def test_varlen_lengths_are_seeded_with_zeros():
    lengths = grid.varlen_lengths(128, 4096)
    assert lengths == grid.varlen_lengths(128, 4096)
    assert lengths != grid.varlen_lengths(128, 16384)
    assert len(lengths) == 128 and min(lengths) == 0 and lengths.count(0) >= 4
    assert 0.8 * 4096 < sum(lengths) / 128 < 1.2 * 4096
    assert Config(64, 128, 1, 128, 4096, varlen=True).seqlens() == lengths
    assert Config(64, 2, 2, 16, 100).seqlens() == [100, 100]


def test_config_label_and_causal():
    assert Config(64, 128, 1, 128, 4096).label() == "p64 b128 s1 h128 L4096"
    assert Config(1, 128, 2, 128, 8192, varlen=True).label() == "p1 b128 s2 h128 L~8192 varlen"
    assert not Config(64, 1, 1, 16, 1024).causal and Config(64, 1, 2, 16, 1024).causal


# --------------------------------------------------------------------------------------- runner

def test_preflight_messages():
    with pytest.raises(runner.PreflightError, match=r"needs a CUDA GPU.*torch 2\.x\+cpu"):
        runner.require_gpu(False, "2.x+cpu")
    runner.require_gpu(True, "2.x")
    with pytest.raises(runner.PreflightError, match=r"no pipeline variant has a kernel yet.*'2wg', '3wg'"):
        runner.select_variants([], ("2wg", "3wg"), None)
    with pytest.raises(runner.PreflightError, match=r"'3wg' is not available; available: \['2wg'\]"):
        runner.select_variants(["2wg"], ("2wg", "3wg"), "3wg")
    assert runner.select_variants(["2wg", "3wg"], ("2wg", "3wg"), None) == ["2wg", "3wg"]
    assert runner.select_variants(["2wg", "3wg"], ("2wg", "3wg"), "3wg") == ["3wg"]
    assert runner.select_variants(["2wg", "3wg", "x"], ("2wg", "3wg", "x"), ["3wg", "2wg", "3wg"]) == ["3wg", "2wg"]
    with pytest.raises(runner.PreflightError, match="'y' is not available"):
        runner.select_variants(["2wg", "3wg"], ("2wg", "3wg"), ["2wg", "y"])


def test_plan_follows_each_variants_page_sizes():
    pages = {"2wg": (64,), "3wg": (1, 16, 32, 64)}
    plan = runner.build_plan(["2wg", "3wg"], pages.__getitem__, quick=False)
    # page 64: both variants and auto; pages 16 and 1: 3wg alone, so no auto row (nothing to choose)
    assert len(plan) == 124 + 3 * 124 + 124
    assert {c.page_size for v, c in plan if v == "2wg"} == {64}
    assert {c.page_size for v, c in plan if v == "auto"} == {64}
    assert [c.page_size for v, c in plan if v == "3wg"][::124] == [64, 16, 1]  # grid order, 32 not in grid
    # config by config: a config's rows back to back
    assert [v for v, _ in plan[:6]] == ["2wg", "3wg", "auto"] * 2
    assert plan[0][1] == plan[1][1] == plan[2][1] != plan[3][1]
    quick = runner.build_plan(["2wg", "3wg"], pages.__getitem__, quick=True, page_sizes=[16])
    assert [(v, c.page_size) for v, c in quick] == [("3wg", 16)] * 4
    assert "auto" not in {v for v, _ in runner.build_plan(["2wg", "3wg"], pages.__getitem__, quick=False, auto=False)}
    assert "auto" not in {v for v, _ in runner.build_plan(["3wg"], pages.__getitem__, quick=True)}


def test_plan_times_auto_on_the_default_path_beside_both_variants():
    import pipelines

    pages = {"2wg": (1, 16, 64), "3wg": (1, 16, 64)}
    plan = runner.build_plan(["2wg", "3wg"], pages.__getitem__, quick=False,
                             multicast_cluster=pipelines.multicast_cluster)
    auto_rows = [c for v, c in plan if v == "auto"]
    assert len(auto_rows) == 3 * 124  # every config of the grid, once
    assert all(c.multicast is not False for c in auto_rows)  # never the multicast-off half of an A/B pair
    cluster = dataclasses.replace(Config(64, 8, 1, 128, 4096), multicast=True)
    i = plan.index(("2wg", cluster))
    off = dataclasses.replace(cluster, multicast=False)
    assert plan[i:i + 5] == [("2wg", cluster), ("3wg", cluster), ("auto", cluster), ("2wg", off), ("3wg", off)]
    assert len(plan) == 2 * (3 * 124 + 2 * (3 * 5 * 3 + 4)) + 3 * 124


def test_plan_times_only_the_clustered_variants_twice():
    import pipelines

    pages = {"2wg": (1, 16, 64), "seesaw": (1, 16, 64)}
    plan = runner.build_plan(["2wg", "seesaw"], pages.__getitem__, quick=False,
                             multicast_cluster=pipelines.multicast_cluster)
    cfg = Config(64, 8, 1, 128, 4096)
    on, off = dataclasses.replace(cfg, multicast=True), dataclasses.replace(cfg, multicast=False)
    i = plan.index(("2wg", on))
    # seesaw runs no multicast cluster (pipelines.MULTICAST_VARIANTS): one row, no A/B half
    assert plan[i:i + 4] == [("2wg", on), ("seesaw", cfg), ("auto", on), ("2wg", off)]
    assert all(c.multicast is None for v, c in plan if v == "seesaw")
    assert pipelines.multicast_cluster(64, 128) == pipelines.multicast_cluster(64, 128, "2wg") == 2
    assert pipelines.multicast_cluster(64, 128, "seesaw") == 1


def test_plan_times_multicast_configs_twice():
    import pipelines

    pages = {"2wg": (1, 16, 64)}
    plan = runner.build_plan(["2wg"], pages.__getitem__, quick=False, multicast_cluster=pipelines.multicast_cluster)
    cluster = [c for _, c in plan if c.multicast is not None]
    # h_q * s_q of 128 and 256 (h128 s1, h64 s2, h128 s2) at pages 64 and 16: 3 x 5 x 3 + 4 varlen, twice each.
    assert len(cluster) == 2 * 2 * (3 * 5 * 3 + 4) and len(plan) == 3 * 124 + len(cluster) // 2
    assert all(c.page_size in (16, 64) and c.h_q * c.s_q > 64 for c in cluster)
    on = [c for c in cluster if c.multicast]
    assert [dataclasses.replace(c, multicast=False) for c in on] == [c for c in cluster if c.multicast is False]
    # the pair is adjacent in the plan, on first
    i = [c for _, c in plan].index(on[0])
    assert plan[i + 1][1] == dataclasses.replace(on[0], multicast=False)
    assert Config(16, 8, 1, 128, 4096, multicast=False).label() == "p16 b8 s1 h128 L4096 mc-off"
    assert all(c.multicast is None for _, c in plan if c.page_size == 1)  # the gather has no cluster
    # without a cluster function nothing doubles (the plan of a variant without clusters)
    assert len(runner.build_plan(["2wg"], pages.__getitem__, quick=False)) == 3 * 124


def test_multicast_env_sets_and_restores(monkeypatch):
    import os

    monkeypatch.setenv("MLA_MULTICAST", "1")
    with runner.multicast_env(False):
        assert os.environ["MLA_MULTICAST"] == "0"
    assert os.environ["MLA_MULTICAST"] == "1"
    monkeypatch.delenv("MLA_MULTICAST")
    with runner.multicast_env(True):
        assert os.environ["MLA_MULTICAST"] == "1"
    assert "MLA_MULTICAST" not in os.environ
    with runner.multicast_env(None):
        assert "MLA_MULTICAST" not in os.environ
    import pipelines.paged_kv as paged_kv
    assert runner.MULTICAST_ENV_VAR == paged_kv.MULTICAST_ENV_VAR


def _fake_bench(variant, cfg):
    if cfg.h_q == 32:
        raise RuntimeError("kernel exploded\nsecond line")
    return sum(cfg.seqlens()), [100.0, 90.0, 110.0, 95.0, 105.0]


def test_run_plan_records_rows_and_failures():
    plan = [("2wg", Config(64, 128, 1, 128, 4096)), ("2wg", Config(64, 1, 1, 32, 1024)),
            ("2wg", Config(64, 128, 1, 128, 4096, varlen=True))]
    lines = []
    rows = runner.run_plan(plan, _fake_bench, ROOFLINE, log=lines.append, anchors=anchors_mod.load_anchors(),
                           device="NVIDIA H200")
    ok, failed, varlen = rows
    assert ok["us"] == 100.0 and ok["us_min"] == 90.0 and ok["us_p90"] == 110.0 and ok["replays"] == 5
    assert ok["bytes"] == 639_631_360 and ok["flops"] == 146_028_888_064
    assert ok["gbps"] == pytest.approx(6396.3136) and ok["tflops"] == pytest.approx(1460.28888064)
    assert ok["bound"] == "compute" and ok["roofline_us"] == pytest.approx(208.61269723)
    assert ok["roofline_frac"] == pytest.approx(2.0861269723)
    assert ok["error"] is None and ok["causal"] is False and ok["pipeline"] == "2wg"
    assert failed["us"] is None and failed["error"] == "RuntimeError: kernel exploded\nsecond line"
    assert varlen["total_kv_tokens"] == sum(grid.varlen_lengths(128, 4096)) and varlen["varlen"] is True
    assert "FlashMLA 224.1 us x2.24 | FlashInfer 273.7 us x2.74" in lines[0]
    assert "FAILED RuntimeError: kernel exploded" in lines[1] and "second line" not in lines[1]


def test_run_plan_stops_timing_once_the_context_is_lost():
    plan = [("2wg", Config(64, 1, 1, h, 1024)) for h in (16, 32, 64, 128)]
    calls = []

    def bench_fn(variant, cfg):
        calls.append(cfg.h_q)
        return _fake_bench(variant, cfg)

    seen = []
    rows = runner.run_plan(plan, bench_fn, ROOFLINE, log=lambda _: None, healthy=lambda: False,
                           after_each=lambda so_far: seen.append(len(so_far)))
    assert calls == [16, 32] and seen == [1, 2, 3, 4]
    assert [r["error"] is None for r in rows] == [True, False, False, False]
    assert rows[2]["error"] == "not run: CUDA context lost at 2wg p64 b1 s1 h32 L1024"


def test_record_round_trips_and_is_named_by_device_date_commit(tmp_path):
    rows = runner.run_plan([("2wg", Config(64, 8, 1, 64, 4096))], _fake_bench, ROOFLINE, log=lambda _: None)
    record = runner.build_record(device={"name": "NVIDIA H200", "sm_count": 132}, versions={"torch": "x"},
                                 git={"commit": "abc", "short": "abc", "dirty": True}, date="2026-01-02T03:04:05Z",
                                 quick=True, replays=100, roofline=ROOFLINE, rows=rows)
    text = runner.dumps_record(record)
    assert json.loads(text) == record
    assert text.count("\n") < 60  # rows one per line
    assert record["mode"] == "quick" and record["timing"]["replays"] == 100 and record["schema"] == 1
    assert record["complete"] is True
    path = runner.result_path(tmp_path, "NVIDIA H100 80GB HBM3", "2026-01-02", "abc1234", quick=True)
    assert path.name == "nvidia-h100-80gb-hbm3_2026-01-02_abc1234_quick.json"
    assert runner.result_path(tmp_path, "NVIDIA H200", "2026-01-02", "abc1234", False).name == \
        "nvidia-h200_2026-01-02_abc1234.json"


def test_git_info(tmp_path):
    info = runner.git_info(ROOT)
    assert len(info["commit"]) == 40 and info["short"] == info["commit"][:7] and info["dirty"] in (True, False)
    assert runner.git_info(ROOT, override=info["short"]) == info  # the override names HEAD: keep git's facts
    # A copy without .git (the GPU machine's): the override is all there is.
    assert runner.git_info(tmp_path, override="0123456789abcdef") == {
        "commit": "0123456789abcdef", "short": "0123456", "dirty": None}
    assert runner.git_info(tmp_path) == {"commit": "unknown", "short": "nogit", "dirty": None}


def test_make_inputs_on_cpu():
    cfg = Config(16, 3, 2, 4, 40)
    inp = bench.make_inputs(cfg, device="cpu", seed=1)
    assert inp.q.shape == (3, 2, 4, 576) and inp.q.dtype == torch.bfloat16
    assert inp.k_cache.shape == (9, 16, 1, 576)
    assert inp.block_table.dtype == torch.int32 and inp.block_table.shape == (3, 3)
    assert sorted(inp.block_table.flatten().tolist()) == list(range(9))  # a permutation of the pool
    assert inp.cache_seqlens.tolist() == [40, 40, 40] and inp.total_kv_tokens == 120
    for t in (inp.q, inp.k_cache):
        assert t.abs().max() <= 1 and (t != 0).float().mean() > 0.99
    assert torch.equal(bench.make_inputs(cfg, device="cpu", seed=1).k_cache, inp.k_cache)
    var = bench.make_inputs(Config(64, 64, 1, 16, 100, varlen=True), device="cpu")
    lengths = grid.varlen_lengths(64, 100)
    assert var.cache_seqlens.tolist() == lengths and var.total_kv_tokens == sum(lengths)
    pages = [-(-n // 64) for n in lengths]
    used = var.block_table[torch.arange(var.block_table.shape[1])[None, :] < torch.tensor(pages)[:, None]]
    assert sorted(used.tolist()) == list(range(sum(pages)))


def test_decode_fn_drives_the_public_api(fake_kernel):
    """The runner's call goes through mla.MLADecoder: planned once, then run into its own ``out``."""
    import mla
    from mla.reference import mla_decode_reference

    cfg = Config(64, 2, 2, 16, 100)
    inp = bench.make_inputs(cfg, device="cpu")
    call = bench.make_decode_fn(mla, "2wg", cfg, inp, num_sms=8)
    call()
    call()
    assert len(fake_kernel.calls) == 2 and fake_kernel.calls[0]["causal"] is True
    out = fake_kernel.calls[0]["out"]
    assert out.data_ptr() == fake_kernel.calls[1]["out"].data_ptr()
    ref_out, _ = mla_decode_reference(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, 512, causal=True)
    torch.testing.assert_close(out.float(), ref_out.float(), atol=1e-2, rtol=1e-2)


def test_main_end_to_end_on_a_fake_gpu(fake_kernel, fake_planner, monkeypatch, tmp_path, capsys):
    """runner.main's wiring (preflight, plan, API calls, JSON), with the GPU parts replaced."""
    import types

    import pipelines

    import os

    launched = []

    def decode_launcher(variant, dtype, num_heads_q, *config, partial=None, split_cluster=1):
        if num_heads_q == 32:
            raise RuntimeError("no kernel for h_q 32")

        def launch(q, *args):
            launched.append((variant, tuple(q.shape), os.environ.get("MLA_MULTICAST")))
        return launch

    monkeypatch.setattr(pipelines, "decode_launcher", decode_launcher)
    monkeypatch.delenv("MLA_MULTICAST", raising=False)
    # h_q 128 at page 16: two m-blocks, a multicast cluster: timed with MLA_MULTICAST=1 and =0.
    monkeypatch.setattr(grid, "_QUICK_SMALL_PAGES", ((2, 1, 16, 100, False), (3, 2, 32, 70, False),
                                                     (2, 1, 128, 100, False)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(
        name="NVIDIA H200", multi_processor_count=132, major=9, minor=0, total_memory=141 * 2**30))
    monkeypatch.setattr(bench, "measure_roofline", lambda: dict(ROOFLINE, gemm_n=8192))
    make_inputs = bench.make_inputs
    monkeypatch.setattr(bench, "make_inputs", lambda cfg, seed: make_inputs(cfg, device="cpu", seed=seed))
    monkeypatch.setattr(bench, "capture_graph", lambda fn, warmup: (fn(), object())[1])
    monkeypatch.setattr(bench, "time_graphs_interleaved", lambda graphs, replays, per=None: {n: [10.0] * replays for n in graphs})
    eager_calls = []
    monkeypatch.setattr(bench, "time_eager", lambda fn, calls, warmup, rounds: (
        eager_calls.append((calls, warmup, rounds)), fn(), 7.0 + len(eager_calls))[2])
    monkeypatch.setattr(bench, "cuda_healthy", lambda: True)

    rc = runner.main(quick=True, pipeline="2wg", page_sizes=[16], out=str(tmp_path), replays=100, commit="abc1234")
    assert rc == 1  # one config failed
    (out,) = tmp_path.glob("nvidia-h200_20*-*-*_abc1234_quick.json")  # --out DIR: the usual name inside
    # Each row: one graph capture's call and the three eager timings' calls (quick runs time eager
    # calls), all under the row's multicast switch; the plan+flash timing plans on the device
    # every call (the fake planner: the kernel's model).
    # The multicast on/off rows of a config are one timing group: both captured, then each row's
    # eager timings.
    assert launched == ([("2wg", (2, 1, 16, 576), None)] * 4 + [("2wg", (2, 1, 128, 576), "1")]
                        + [("2wg", (2, 1, 128, 576), "0")] + [("2wg", (2, 1, 128, 576), "1")] * 3
                        + [("2wg", (2, 1, 128, 576), "0")] * 3)
    assert eager_calls == [(300, 20, 3)] * 9
    # Per config: MLADecoder.plan, make_flash_fn's metadata (both once, outside the timing) and the
    # plan+flash call: the fake planner makes CPU lengths count as on the device for all three.
    assert len(fake_planner.calls) == 3 * 3
    assert "MLA_MULTICAST" not in os.environ  # restored
    record = json.loads(out.read_text())
    assert record["complete"] is True and record["mode"] == "quick"
    assert record["git"] == {"commit": "abc1234", "short": "abc1234", "dirty": None}
    assert record["device"] == {"name": "NVIDIA H200", "sm_count": 132, "compute_capability": "9.0",
                                "memory_gib": 141.0}
    assert record["versions"]["cutlass_dsl"] and record["versions"]["torch"] == torch.__version__
    ok, failed, mc_on, mc_off = record["rows"]
    assert (ok["pipeline"], ok["page_size"], ok["b"], ok["us"], ok["replays"]) == ("2wg", 16, 2, 10.0, 100)
    assert (ok["eager_run_us"], ok["eager_flash_us"], ok["eager_plan_run_us"]) == (8.0, 9.0, 10.0)
    assert record["timing"]["eager_calls"] == 300 and "flash_mla_with_kvcache" in record["timing"]["eager"]
    assert "eager_plan_run_us" in record["timing"]["eager"] and failed["error"] and "eager_plan_run_us" not in failed
    assert ok["multicast"] is None and (mc_on["multicast"], mc_off["multicast"]) == (True, False)
    assert mc_on["h_q"] == mc_off["h_q"] == 128 and mc_on["error"] is None and mc_off["error"] is None
    assert failed["error"] == "RuntimeError: no kernel for h_q 32" and failed["causal"] is True
    printed = capsys.readouterr().out
    assert "plan+flash 10.0 us" in printed
    assert "4 configs (quick)" in printed and "p16 b2 s1 h128 L100 mc-off" in printed and "FAILED RuntimeError: no kernel for h_q 32" in printed


def test_main_times_auto_beside_both_pipelines(fake_kernel, fake_planner, monkeypatch, tmp_path):
    """With both pipelines, each config also gets an auto row: MLADecoder(pipeline="auto") with
    MLA_PIPELINE unset, the variant it ran recorded; a config's rows share one set of inputs."""
    import os
    import types

    import mla
    import pipelines
    from pipelines import auto, auto_table

    launched = []

    def decode_launcher(variant, dtype, num_heads_q, *config, partial=None, split_cluster=1):
        return lambda q, *args: launched.append((variant, num_heads_q, os.environ.get("MLA_PIPELINE")))

    monkeypatch.setattr(pipelines, "decode_launcher", decode_launcher)
    monkeypatch.setenv("MLA_PIPELINE", "2wg")  # set in the shell: auto rows must time auto's own choice
    monkeypatch.setattr(auto_table, "ENTRIES", [
        {"key": [64, 1, 16, 1, 2, 128], "pipeline": "3wg", "geomean_us": {}, "configs": 1},
        {"key": [64, 1, 64, 1, 2, 128], "pipeline": "2wg", "geomean_us": {}, "configs": 1}])
    mla.api.clear_caches()
    monkeypatch.setattr(grid, "_QUICK_64", ((2, 1, 16, 100, False), (2, 1, 64, 100, False)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(
        name="NVIDIA H200", multi_processor_count=132, major=9, minor=0, total_memory=141 * 2**30))
    monkeypatch.setattr(bench, "measure_roofline", lambda: dict(ROOFLINE, gemm_n=8192))
    made = []
    make_inputs = bench.make_inputs
    monkeypatch.setattr(bench, "make_inputs", lambda cfg, seed: (made.append(cfg), make_inputs(cfg, device="cpu",
                                                                                             seed=seed))[1])
    monkeypatch.setattr(bench, "capture_graph", lambda fn, warmup: (fn(), object())[1])
    pers = []

    def timed(graphs, replays, per=None):
        # 2wg and auto alternate 10 / 20 us, 3wg 12 / 24 us: medians 15, 15, 18; auto's paired ratios
        # (round by round) 1.0 against 2wg and 10/12 against 3wg.
        pers.append(per)
        return {n: ([12.0, 24.0] if n[0] == "3wg" else [10.0, 20.0]) * (replays // 2) for n in graphs}

    monkeypatch.setattr(bench, "time_graphs_interleaved", timed)
    monkeypatch.setattr(bench, "cuda_healthy", lambda: True)
    try:
        rc = runner.main(quick=True, page_sizes=[64], out=str(tmp_path), replays=100, commit="abc1234", eager=False)
    finally:
        auto.clear_caches()
    assert rc == 0
    (out,) = tmp_path.glob("*.json")
    rows = json.loads(out.read_text())["rows"]
    assert [(r["pipeline"], r["h_q"], r["resolved"]) for r in rows] == [
        ("2wg", 16, "2wg"), ("3wg", 16, "3wg"), ("auto", 16, "3wg"),
        ("2wg", 64, "2wg"), ("3wg", 64, "3wg"), ("auto", 64, "2wg")]
    assert all(r["kv_capacity"] == 128 and r["error"] is None for r in rows)
    assert [v for v, _, _ in launched] == ["2wg", "3wg", "3wg", "2wg", "3wg", "2wg"]
    assert [env for v, _, env in launched] == ["2wg", "2wg", None, "2wg", "2wg", None]  # unset for auto only
    assert os.environ["MLA_PIPELINE"] == "2wg"  # restored
    assert [c.h_q for c in made] == [16, 64]  # one set of inputs per config
    assert pers == [None, None]  # one timing group per config, the default rounds
    assert [r.get("paired") for r in rows] == [None, None, {"2wg": 1.0, "3wg": 0.83333}] * 2
    # the run file verifies (every auto row within 2% of the faster variant: the fake times are equal)
    assert auto.print_verify(auto.verify(json.loads(out.read_text())), out.name) == 0


def test_time_eager_is_wall_time_per_call_after_warmup():
    """300 calls between two clock reads that bracket a final synchronize; warm-up calls untimed."""
    events = []
    ticks = iter([0.0, 600e-6, 1.0, 1.0 + 900e-6, 2.0, 2.0 + 750e-6])

    def clock():
        events.append("clock")
        return next(ticks)

    us = bench.time_eager(lambda: events.append("call"), calls=300, warmup=5, rounds=3, clock=clock,
                          synchronize=lambda: events.append("sync"))
    assert us == pytest.approx(2.5)  # median of 2.0, 3.0, 2.5 us per call
    assert events[:6] == ["call"] * 5 + ["sync"]
    assert events[6] == "clock" and events[7:307] == ["call"] * 300 and events[307:309] == ["sync", "clock"]
    assert events.count("call") == 5 + 3 * 300


def test_flash_fn_computes_the_metadata_once(fake_kernel):
    import mla

    cfg = Config(64, 2, 1, 16, 100)
    inp = bench.make_inputs(cfg, device="cpu")
    call = bench.make_flash_fn(mla, "2wg", cfg, inp, num_sms=8)
    call()
    call()
    a, b = fake_kernel.calls
    assert a["tile_scheduler_metadata"] is b["tile_scheduler_metadata"]
    assert a["out"] is not b["out"]  # allocated per call, as FlashMLA's callers do


def test_plan_flash_fn_plans_on_the_device_every_call(fake_kernel, fake_planner):
    import mla

    cfg = Config(64, 2, 1, 16, 100)
    inp = bench.make_inputs(cfg, device="cpu")
    call = bench.make_plan_flash_fn(mla, "2wg", cfg, inp, num_sms=8)
    call()
    call()
    assert len(fake_planner.calls) == 2 and len(fake_kernel.calls) == 2
    for planned, launched in zip(fake_planner.calls, fake_kernel.calls):
        assert planned["cache_seqlens"] is inp.cache_seqlens
        assert launched["tile_scheduler_metadata"] is planned["tile_scheduler_metadata"]  # this call's plan
    assert fake_kernel.calls[0]["tile_scheduler_metadata"] is not fake_kernel.calls[1]["tile_scheduler_metadata"]


def test_eager_plan_column_is_dash_for_rows_without_it():
    row = {"b": 1, "s_q": 1, "h_q": 16, "seqlen": 1024, "varlen": False, "pipeline": "2wg", "page_size": 64,
           "dtype": "bf16", "error": None, "us": 15.0, "eager_run_us": 16.0, "eager_flash_us": 17.0, "gbps": 81.0,
           "tflops": 2.4, "roofline_frac": 0.02, "bound": "memory"}
    run = regenerate.Run("r.json", {"git": {"short": "abc1234"}})
    header, _, line = regenerate._page_table([(row, run)], {}, "NVIDIA H200")
    assert "| us | eager run us | eager flash us | eager plan+flash us | GB/s |" in header
    assert line.startswith("| 1 | 1 | 16 | 1024 | 2wg | 15.0 | 16.0 | 17.0 | - | 81 |")


def test_cli_refuses_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = subprocess.run([sys.executable, "-m", "perf_table", "run", "--quick"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert "needs a CUDA GPU" in proc.stderr and "regenerate" in proc.stderr


def test_planner_timing_cli():
    from perf_table import __main__ as cli

    args = cli.parse_args(["planner", "--batch", "128", "--batch", "7", "--rows", "64"])
    assert (args.command, args.batches, args.rows, args.seqlen, args.replays) == ("planner", [128, 7], 64, 4096, 200)
    assert cli.parse_args(["planner"]).batches is None  # bench.PLANNER_BATCHES
    assert cli.parse_args(["run", "--pipeline", "2wg", "--pipeline", "3wg"]).pipeline == ["2wg", "3wg"]
    assert cli.parse_args(["run"]).pipeline is None  # every available variant
    if torch.cuda.is_available():
        return
    proc = subprocess.run([sys.executable, "-m", "perf_table", "planner"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "planner needs a CUDA GPU" in proc.stderr


# ----------------------------------------------------------------------------------- regenerate

@pytest.fixture
def fixture_results(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    for path in FIXTURE_RUNS:
        shutil.copy(path, results)
    return results


def test_regenerate_from_fixture(fixture_results, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    written = regenerate.regenerate(fixture_results, out_dir=out, log=lambda _: None)
    assert {p.relative_to(out).as_posix() for p in written} >= {"README.md", "table.csv"}
    readme = (out / "README.md").read_text()

    # One section per device; the H200 table holds the newest row per config (the quick run's 220 us
    # replaces the full run's 250 us), anchors side by side, the failure visible.
    assert readme.index("## NVIDIA H100 80GB HBM3") < readme.index("## NVIDIA H200")
    for line in [
        "| 128 | 1 | 128 | 4096 | 2wg | 220.0 | 221.3 | 223.9 | 230.4 | 2907 | 663.8 | 94.8 | compute | 224.1 | 1.02 | 273.7 | 1.24 | 2222222 |",
        "| 1 | 1 | 16 | 1024 | 2wg | 15.0 | - | - | - | 81 | 2.4 | 2.0 | memory | 14.1 | 0.94 | 17.1 | 1.14 | 1111111 |",
        "| 128 | 2 | 128 | 4096 | 2wg | FAILED | - | - | - | - | - | - | - | 435.4 | - | 541.2 | - | 1111111 |",
        "| 128 | 1 | 128 | 16384 varlen | 2wg | 1000.0 | - | - | - | 2438 | 580.7 | 83.0 | compute | 1007.0 | 1.01 | - | - | 1111111 |",
        # page 1: FlashInfer's page-1 anchor only (FlashMLA has none at that page size)
        # (no eager columns: no row of this table has eager times)
        "| b | s_q | h_q | seqlen | pipeline | us | GB/s | TFLOP/s | % roofline | bound | FlashInfer us | xFlashInfer | run |",
        "| 1 | 1 | 128 | 16384 | 2wg | 40.0 | 479 | 114.1 | 16.3 | compute | 37.6 | 0.94 | 1111111 |",
        "| 8 | 1 | 64 | 4096 | 2wg | 30.0 | 1295 | 152.1 | 43.2 | memory | 32.1 | 1.07 | 3333333 |",
        "| 2wg | 64 | 6 | 1 | 83.0 | 1.00 | 3 of 5 | 1.21 | 4 of 4 |",
        "- 2wg page 64 b128 s_q2 h_q128 4096 (perf_h200_full.json): `RuntimeError: kernel exploded`",
        "| perf_h200_quick.json | 2026-11-24T09:00:00Z | 2222222 | quick | 1 | 0 | 4000 | 700 | 132 | 2.9.0+cu130 | 13.0 | 4.8.1 |",
        # a run that ended early says so
        "| perf_h100_full.json | 2026-11-23T12:00:00Z | 3333333 | full (partial) | 1 | 0 | 3000 | 667 | 132 | 2.9.0+cu130 | 13.0 | 4.8.1 |",
    ]:
        assert line + "\n" in readme, line
    assert "250.0" not in readme.split("## NVIDIA H200")[1].split("Failed configs")[1]

    # The CSV holds the README's rows (the newest of each config per device, failures included): not the
    # superseded 250 us row, which the raw runs keep.
    rows = list(csv.DictReader(io.StringIO((out / "table.csv").read_text())))
    assert sum(len(json.loads(p.read_text())["rows"]) for p in FIXTURE_RUNS) == 9 and len(rows) == 8
    by_us = {(r["run"], r["us"]): r for r in rows}
    assert ("perf_h200_full.json", "250.00") not in by_us
    newest = by_us[("perf_h200_quick.json", "220.00")]  # the config the 250 us row measured
    assert newest["FlashMLA_us"] == "224.1" and newest["xFlashMLA"] == "1.019"
    assert newest["roofline_pct"] == "94.82" and newest["bound"] == "compute"
    assert newest["eager_run_us"] == "221.30"
    assert newest["eager_flash_us"] == "223.90"
    assert newest["eager_plan_run_us"] == "230.40"
    other = by_us[("perf_h200_full.json", "80.00")]
    assert other["eager_run_us"] == other["eager_plan_run_us"] == ""  # a run without eager times
    assert [r["device"] for r in rows] == sorted(r["device"] for r in rows)
    failed = [r for r in rows if r["error"]]
    assert len(failed) == 1 and failed[0]["us"] == "" and failed[0]["xFlashMLA"] == ""
    assert failed[0]["error"].startswith("RuntimeError: kernel exploded\n")


def test_regenerate_is_deterministic(fixture_results, tmp_path):
    outputs = []
    for name in ("a", "b"):
        out = tmp_path / name
        out.mkdir()
        regenerate.regenerate(fixture_results, out_dir=out, log=lambda _: None)
        outputs.append({p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()})
    assert outputs[0] == outputs[1]
    pytest.importorskip("matplotlib")
    assert {"plots/nvidia-h200.png", "plots/nvidia-h100-80gb-hbm3.png"} <= set(outputs[0])


def test_check_detects_a_stale_table(fixture_results, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    regenerate.regenerate(fixture_results, out_dir=out, log=lambda _: None)
    assert regenerate.check(fixture_results, committed_dir=out, log=lambda _: None) == 0
    (out / "README.md").write_text((out / "README.md").read_text().replace("220.0", "219.9"))
    log = []
    assert regenerate.check(fixture_results, committed_dir=out, log=log.append) == 1
    assert "out of date" in log[0] and "+| 128 | 1 | 128 | 4096 | 2wg | 220.0" in log[1]


def test_committed_table_is_current():
    """perf_table/README.md and table.csv are exactly what regenerate makes of perf_table/results/."""
    log = []
    assert regenerate.check(log=log.append) == 0, "\n".join(log)


def test_regenerate_shows_multicast_pairs(fixture_results, tmp_path):
    """A run with an A/B pair: both rows kept (multicast is part of the key), the off row labelled, the
    pair side by side, and only the default kernel in the plot."""
    run = json.loads((fixture_results / "perf_h200_quick.json").read_text())
    (row,) = run["rows"]
    on = dict(row, multicast=True, us=200.0)
    off = dict(row, multicast=False, us=210.0)
    run.update(file=None, rows=[on, off], date="2026-11-25T00:00:00Z", git={"commit": "4444444", "short": "4444444"})
    (fixture_results / "perf_h200_zz_mc.json").write_text(json.dumps(run))
    out = tmp_path / "out"
    out.mkdir()
    regenerate.regenerate(fixture_results, out_dir=out, log=lambda _: None, plots=False)
    readme = (out / "README.md").read_text()
    assert "| 128 | 1 | 128 | 4096 | 2wg | 200.0 |" in readme and "| 128 | 1 | 128 | 4096 | 2wg mc-off | 210.0 |" in readme
    assert "| 64 | 128 | 1 | 128 | 4096 | 2wg | 200.0 | 210.0 | 1.050 | 4444444 |" in readme
    # the older row without a multicast field (a kernel without clusters) is replaced by the newer pair
    assert "| 128 | 1 | 128 | 4096 | 2wg | 220.0 |" not in readme
    views = regenerate.device_views(regenerate.load_runs(fixture_results))
    plotted = regenerate.plottable(views["NVIDIA H200"].latest)
    assert all(r.get("multicast") is not False for r in plotted) and any(r.get("multicast") for r in plotted)
    rows = list(csv.DictReader(io.StringIO((out / "table.csv").read_text())))
    assert sorted(r["multicast"] for r in rows if r["run"] == "perf_h200_zz_mc.json") == ["0", "1"]
    assert {r["multicast"] for r in rows if r["run"] != "perf_h200_zz_mc.json"} == {""}


def test_regenerate_shows_auto_rows(fixture_results, tmp_path):
    """A run with 2wg, 3wg and auto rows: auto rows labelled with the variant they ran, the Auto line and
    its table of slower configs, no auto line in the plot, the CSV's resolved and kv_capacity columns."""
    run = json.loads((fixture_results / "perf_h200_quick.json").read_text())
    (row,) = run["rows"]  # b128 s_q1 h_q128 4096, page 64

    def at(pipeline, us, resolved, **change):
        return dict(row, pipeline=pipeline, us=us, resolved=resolved, kv_capacity=4096, **change)

    run.update(rows=[at("2wg", 200.0, "2wg"), at("3wg", 190.0, "3wg"),
                     at("auto", 191.0, "3wg", paired={"2wg": 0.955, "3wg": 1.025}),
                     at("2wg", 20.0, "2wg", b=8), at("3wg", 22.0, "3wg", b=8),
                     at("auto", 21.0, "2wg", b=8, paired={"2wg": 1.004, "3wg": 0.95}),
                     at("2wg", 30.0, "2wg", b=32), at("auto", 30.0, "2wg", b=32)],  # one variant: not compared
               date="2026-11-25T00:00:00Z", git={"commit": "5555555", "short": "5555555"})
    (fixture_results / "perf_h200_zz_auto.json").write_text(json.dumps(run))
    out = tmp_path / "out"
    out.mkdir()
    regenerate.regenerate(fixture_results, out_dir=out, log=lambda _: None, plots=False)
    readme = (out / "README.md").read_text()
    assert "| 128 | 1 | 128 | 4096 | auto (3wg) | 191.0 |" in readme and "| 128 | 1 | 128 | 4096 | 3wg | 190.0 |" in readme
    # by medians b8 is slower (x1.050); by paired ratios (each against its config's faster variant) b128
    # is (x1.025 against 3wg) and b8 is not (x1.004): both rows are listed, with both ratios.
    assert ("2 configs; by medians 1 within 2% of the faster variant, 1 slower, worst x1.050 (page 64 b8 s_q1 "
            "h_q128 4096). By paired ratio" in readme)
    assert "same round; 2 configs): 1 within 2%, 1 slower, worst x1.025 (page 64 b128 s_q1 h_q128 4096)." in readme
    assert "| 64 | 8 | 1 | 128 | 4096 | 2wg | 21.0 | 2wg | 20.0 | 1.050 | 1.004 | 5555555 |" in readme
    assert "| 64 | 128 | 1 | 128 | 4096 | 3wg | 191.0 | 3wg | 190.0 | 1.005 | 1.025 | 5555555 |" in readme
    assert "| auto | 64 | 3 |" in readme  # the summary has an auto line
    views = regenerate.device_views(regenerate.load_runs(fixture_results))
    assert "auto" not in {r["pipeline"] for r in regenerate.plottable(views["NVIDIA H200"].latest)}
    rows = [r for r in csv.DictReader(io.StringIO((out / "table.csv").read_text())) if r["run"] == "perf_h200_zz_auto.json"]
    assert {(r["pipeline"], r["resolved"], r["kv_capacity"]) for r in rows if r["b"] == "128"} == {
        ("2wg", "2wg", "4096"), ("3wg", "3wg", "4096"), ("auto", "3wg", "4096")}
    assert regenerate.AUTO_SLOWER == __import__("pipelines.auto").auto.SLOWER
    assert regenerate.AUTO == runner.AUTO == __import__("pipelines.auto").auto.AUTO


def test_duplicate_anchor_is_an_error(tmp_path):
    text = (anchors_mod.ANCHORS_DIR / "flashmla_h200_2026-11-21.csv").read_text()
    (tmp_path / "a.csv").write_text(text)
    (tmp_path / "b.csv").write_text(text.splitlines()[0] + "\n" + text.splitlines()[1] + "\n")
    with pytest.raises(ValueError, match="duplicate FlashMLA anchor"):
        anchors_mod.load_anchors(tmp_path)


def _fake_interleaving(monkeypatch):
    """Graphs ``a``, ``b``, ``c`` that log their replays, and a fake ``torch.cuda`` (every event pair
    1 us apart) that logs synchronizes and backlogs: ``(graphs, order, syncs, backlogs)``."""
    order, syncs, backlogs = [], [], []

    class Graph:
        def __init__(self, name):
            self.name = name

        def replay(self):
            order.append(self.name)

    class Event:
        def __init__(self, enable_timing):
            pass

        def record(self):
            pass

        def elapsed_time(self, other):
            return 0.001

    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=Event, synchronize=lambda: syncs.append(1)))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setattr(bench, "_backlog", lambda torch, n: backlogs.append(n))
    return {n: Graph(n) for n in "abc"}, order, syncs, backlogs


def test_interleaved_rounds_balance_position_and_predecessor(monkeypatch):
    """time_graphs_interleaved: every graph gets about `replays` samples, in rounds whose orders put each
    graph first, in the middle and last equally often, and directly behind each other graph equally often
    (a rotation would put it behind the same one every round)."""
    graphs, order, _, _ = _fake_interleaving(monkeypatch)
    samples = bench.time_graphs_interleaved(graphs, replays=12)
    assert {n: len(v) for n, v in samples.items()} == {"a": 12, "b": 12, "c": 12} and samples["a"][0] == 1.0
    assert len(order) == 36  # 6 rounds x 3 graphs x 2 replays
    rounds = [order[i:i + 6:2] for i in range(0, 36, 6)]
    for pos in range(3):
        assert sorted(r[pos] for r in rounds) == list("aabbcc")
    pairs = collections.Counter((r[k], r[k + 1]) for r in rounds for k in range(2))
    assert pairs == {(x, y): 2 for x in "abc" for y in "abc" if x != y}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7])
def test_round_orders_is_a_williams_design(n):
    """round_orders: permutations in which every graph takes every position equally often and follows
    every other graph equally often."""
    orders = bench.round_orders(n)
    assert len(orders) == (n if n % 2 == 0 else 2 * n) and all(sorted(o) == list(range(n)) for o in orders)
    for pos in range(n):
        assert collections.Counter(o[pos] for o in orders) == {i: len(orders) // n for i in range(n)}
    pairs = collections.Counter((o[k], o[k + 1]) for o in orders for k in range(n - 1))
    assert set(pairs.values()) <= {len(orders) // n} and len(pairs) == n * (n - 1)


def test_interleaved_per_one_alternates_replay_by_replay(monkeypatch):
    """per=1: every round replays each graph once (in the rounds' balanced orders), so sample i of every graph
    comes from round i; several rounds share one backlog and one synchronize."""
    graphs, order, syncs, backlogs = _fake_interleaving(monkeypatch)
    samples = bench.time_graphs_interleaved(graphs, replays=25, per=1)
    assert {n: len(v) for n, v in samples.items()} == {"a": 25, "b": 25, "c": 25}
    assert order[:9] == list("abcbcacab") and len(order) == 75
    assert len(syncs) == 3 and backlogs == [30, 30, 15]


def test_load_runs_reads_compressed_runs_under_their_plain_name(fixture_results):
    import gzip

    plain = regenerate.load_runs(fixture_results)
    first = sorted(fixture_results.glob("*.json"))[0]
    first.with_name(first.name + ".gz").write_bytes(gzip.compress(first.read_bytes()))
    with pytest.raises(ValueError, match="both plain and compressed"):
        regenerate.load_runs(fixture_results)
    first.unlink()
    compressed = regenerate.load_runs(fixture_results)
    assert [(r.file, r.data) for r in compressed] == [(r.file, r.data) for r in plain]


def test_capture_entries_gives_each_entry_its_own_outputs_and_the_decoders_plan(monkeypatch):
    """capture_entries (the A/B scripts' helper): one graph per entry, each entry launched with the
    inputs, the decoder's plan, workspace and scale, and an out / lse of its own."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bench, "capture_graph", lambda fn: (fn(), "graph")[1])
    inp = types.SimpleNamespace(q=torch.zeros(3, 2, 16, 576, dtype=torch.bfloat16), k_cache="K", block_table="BT",
                                cache_seqlens="L")
    dec = types.SimpleNamespace(_lse=torch.zeros(3, 16, 2), tile_scheduler_metadata="M", num_splits="N",
                                _workspace="W", _scale=0.5, _planned="P", _launch_for=lambda shape: ("launch", 1))
    calls = {}

    def entry(name):
        return lambda *args: calls.setdefault(name, args)

    graphs, outs = bench.capture_entries({"a": entry("a"), "b": (entry("b"), 0)}, inp, dec)
    assert graphs == {"a": "graph", "b": "graph"}
    for name, flag in (("a", 1), ("b", 0)):  # the decoder's grid_merge, or the one given with the entry
        q, k, bt, lens, meta, splits, out, lse, ws, scale, grid_merge = calls[name]
        assert (q is inp.q, k, bt, lens, meta, splits, ws, scale, grid_merge) == (
            True, "K", "BT", "L", "M", "N", "W", 0.5, flag)
        assert out is outs[name] and out.shape == (3, 2, 16, 512) and out.dtype == torch.bfloat16
        assert lse.shape == (3, 16, 2) and lse is not dec._lse
    assert outs["a"] is not outs["b"] and calls["a"][7] is not calls["b"][7]


def test_regenerate_shows_flashmla_paired_runs(fixture_results, tmp_path):
    """A ``paired/`` directory beside the results (scripts/flashmla_pair.py --json files) adds, to its device's
    section, a line per file (geomean, count below 0.92, lowest ratio over the timed rows) and its lowest
    configs; a row whose outputs differed (not timed) counts in the total but in no ratio."""
    paired = tmp_path / "paired"
    paired.mkdir()
    rows = [dict(config=[64, 128, 1, 128, 4096, 0], maxdiff_ours=3e-5, flash_us=250.0, ours_us=240.0),
            dict(config=[64, 32, 2, 128, 1024, 0], maxdiff_ours=6e-5, flash_us=40.0, ours_us=45.0),
            dict(config=[64, 128, 2, 128, 4096, 1], maxdiff_ours=0.5)]
    data = dict(device="NVIDIA H200", date="2026-11-26", commit="abc1234", flashmla="9241ae3", replays=100, rows=rows)
    (paired / "nvidia-h200_2026-11-26_abc1234_flashmla.json").write_text(json.dumps(data))
    out = tmp_path / "out"
    out.mkdir()
    regenerate.regenerate(fixture_results, out_dir=out, log=lambda _: None, plots=False)
    readme = (out / "README.md").read_text()
    h200 = readme.split("## NVIDIA H200")[1]
    geo = (250 / 240 * 40 / 45) ** 0.5
    assert (f"| nvidia-h200_2026-11-26_abc1234_flashmla.json | 2026-11-26 | abc1234 | 9241ae3 | 2wg | 2 of 3 | {geo:.3f} "
            f"| 1 | 0.889 |\n") in h200
    assert "| nvidia-h200_2026-11-26_abc1234_flashmla.json | 32 | 2 | 128 | 1024 | 40.0 | 45.0 | 2wg | 0.889 |\n" in h200
    assert "FlashMLA paired" not in readme.split("## NVIDIA H200")[0].split("## NVIDIA H100")[1]  # H100: no file


def test_paired_files_name_the_pipeline_timed_as_ours(fixture_results, tmp_path):
    """A paired file of ``--variant auto`` says so in its line, and its lowest configs name the variant auto ran
    (``ours_ran``); a file without the field timed 2wg (the script's default before it recorded it)."""
    paired = tmp_path / "paired"
    paired.mkdir()
    rows = [dict(config=[64, 32, 2, 128, 1024, 0], maxdiff_ours=6e-5, flash_us=40.0, ours_us=44.0, ours_ran="2wg"),
            dict(config=[64, 128, 2, 128, 4096, 0], maxdiff_ours=6e-5, flash_us=480.0, ours_us=450.0,
                 ours_ran="seesaw")]
    data = dict(device="NVIDIA H200", date="2026-11-27", commit="abc1234", flashmla="9241ae3", replays=100,
                variant="auto", rows=rows)
    (paired / "nvidia-h200_2026-11-27_abc1234_flashmla.json").write_text(json.dumps(data))
    out = tmp_path / "out"
    out.mkdir()
    regenerate.regenerate(fixture_results, out_dir=out, log=lambda _: None, plots=False)
    h200 = (out / "README.md").read_text().split("## NVIDIA H200")[1]
    assert "| nvidia-h200_2026-11-27_abc1234_flashmla.json | 2026-11-27 | abc1234 | 9241ae3 | auto | 2 of 2 |" in h200
    assert "| nvidia-h200_2026-11-27_abc1234_flashmla.json | 32 | 2 | 128 | 1024 | 40.0 | 44.0 | 2wg | 0.909 |\n" in h200
    assert "| 128 | 2 | 128 | 4096 | 480.0 | 450.0 | seesaw | 1.067 |\n" in h200
    assert regenerate.paired_variant({"rows": []}) == "2wg"


def test_auto_rows_pair_with_every_default_path_variant():
    # An auto row of a cluster config (multicast True) pairs with 2wg's mc-on row and the seesaw's
    # no-cluster row (multicast None), not with the mc-off A/B rows; an auto row of a config without a
    # cluster pairs with the variants' None rows only.
    on = Config(page_size=64, b=128, s_q=2, h_q=128, seqlen=4096, multicast=True)
    off = dataclasses.replace(on, multicast=False)
    none = dataclasses.replace(on, multicast=None)
    assert runner.paired_with(on, on) and runner.paired_with(on, none)
    assert not runner.paired_with(on, off) and not runner.paired_with(off, on)
    assert runner.paired_with(none, none) and not runner.paired_with(none, off)
    assert not runner.paired_with(on, dataclasses.replace(none, seqlen=1024))
