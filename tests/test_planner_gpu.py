"""GPU tests of the split planner kernel (``split_k.planner_kernel``): it writes exactly the host
planner's plan, makes no host synchronisation, and a CUDA graph that captured plan + decode re-plans
from ``cache_seqlens`` at every replay. Run on a Hopper GPU: ``python -m pytest -m gpu``."""
from __future__ import annotations

import pytest
import torch

import mla
import pipelines
from mla.testing import edge_plan_cases, make_decode_problem, plan_cases
from split_k import planner

pytestmark = pytest.mark.gpu

POISON = -7  # never a valid plan value where it is checked: catches entries the kernel did not write


def device_sms() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def kernel_plan(lengths, num_parts):
    """The kernel's plan for ``lengths`` into poisoned buffers (``pipelines.run_planner`` directly)."""
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    metadata = torch.full((num_parts, 8), POISON, dtype=torch.int32, device="cuda")
    num_splits = torch.full((len(lengths) + 1,), POISON, dtype=torch.int32, device="cuda")
    pipelines.run_planner(cache_seqlens, metadata, num_splits)
    return metadata.cpu(), num_splits.cpu()


def assert_equal_plans(got, want, what):
    for name, g, w in zip(("tile_scheduler_metadata", "num_splits"), got, want):
        if not torch.equal(g.cpu(), w):
            bad = (g.cpu() != w).nonzero()[:5].tolist()
            raise AssertionError(f"{what}: {name} differs from the host plan at {bad}")


@pytest.mark.parametrize("seed", range(5))
def test_device_plan_equals_host_plan(seed):
    """Through the public API: b 1..1024, zeros, up to 128k+, rows from s_q 1..4 x h_q 1..128."""
    sms = device_sms()
    for case in plan_cases(seed, 60, num_sms=sms):
        cache_seqlens = torch.tensor(case.lengths, dtype=torch.int32, device="cuda")
        got = mla.get_mla_metadata(cache_seqlens, case.s_q * case.h_q, 1, planner="device")
        assert got[0].shape == (case.num_parts, 8)
        assert_equal_plans(got, planner.plan(case.lengths, case.num_parts), str(case))


def test_kernel_equals_host_plan_on_edge_cases():
    """int32-extreme lengths (32-bit and 64-bit walks), the largest batch, many parts, all zeros."""
    for case in edge_plan_cases(device_sms()):
        assert_equal_plans(kernel_plan(case.lengths, case.num_parts),
                           planner.plan(case.lengths, case.num_parts), str(case))


def test_kernel_plans_negative_lengths_as_zero():
    lengths = [300, -5, 0, -(2**31), 4096]
    assert_equal_plans(kernel_plan(lengths, 7), planner.plan([max(n, 0) for n in lengths], 7), "negative lengths")


def test_empty_batch():
    meta, splits = mla.get_mla_metadata(torch.zeros(0, dtype=torch.int32, device="cuda"), 16, 1, planner="device")
    assert meta.cpu().tolist() == [[0, 0, -1, 0, 0, 0, 0, 0]] * device_sms() and splits.cpu().tolist() == [0]


def test_no_host_sync():
    """Neither torch's sync detector nor a busy GPU sees the host wait inside planning."""
    lengths = [4096, 0, 70_000, 17, 1000] * 20
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    prob = make_decode_problem([64] * len(lengths), h_q=16, device="cuda")
    dec = mla.MLADecoder()
    kwargs = dict(num_heads_q=16, seq_len_q=1, page_size=64, dtype=torch.bfloat16)
    mla.get_mla_metadata(cache_seqlens, 16, 1)  # warm-up: compiles, fills the allocator's cache
    dec.plan(cache_seqlens, **kwargs)
    mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512,
                               *mla.get_mla_metadata(prob.cache_seqlens, 16, 1))
    torch.cuda.synchronize()

    torch.cuda.set_sync_debug_mode("error")
    try:
        meta, splits = mla.get_mla_metadata(cache_seqlens, 16, 1)
        dec.plan(cache_seqlens, **kwargs)
        sched, _ = mla.get_mla_metadata()
        mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, sched, None)
    finally:
        torch.cuda.set_sync_debug_mode(0)

    del meta, splits, sched  # the busy check below reuses their allocator blocks (no cudaMalloc)
    busy_done = torch.cuda.Event()
    torch.cuda._sleep(int(1e9))  # about half a second of GPU time
    busy_done.record()
    meta, splits = mla.get_mla_metadata(cache_seqlens, 16, 1)
    dec.plan(cache_seqlens, **kwargs)
    assert not busy_done.query(), "planning waited for the GPU"
    torch.cuda.synchronize()
    want = planner.plan(lengths, planner.num_sm_parts(device_sms(), 16, 1))
    assert_equal_plans((meta, splits), want, "get_mla_metadata")
    assert_equal_plans((dec.tile_scheduler_metadata, dec.num_splits), want, "MLADecoder.plan")


@pytest.mark.parametrize("s_q, h_q, causal", [(1, 128, False), (2, 16, True)])
def test_graph_of_plan_and_decode_follows_lengths_changed_in_place(s_q, h_q, causal):
    """Capture MLADecoder.plan + run once; replay after writing new lengths into cache_seqlens: the
    graph re-plans on the device, and the output matches the reference for the new lengths."""
    from mla.reference import compare_to_reference, mla_decode_reference

    longest = [3000, 50, 9000, 4000, 700, 16000, 64, 1]  # the cache holds these many tokens per request
    schedules = [[3000, 50, 9000, 0, 700, 16000, 64, 1], [1, 0, 9000, 4000, 65, 2, 0, 1],
                 [128, 50, 4000, 0, 700, 15999, 64, 1], [0] * 8]  # each <= longest, request by request
    prob = make_decode_problem(longest, s_q=s_q, h_q=h_q, device="cuda", seed=3)
    q = (prob.q.float() / 10).clamp(-1, 1).to(prob.q.dtype)
    k_cache = (prob.k_cache.float() / 10).clamp(-1, 1).to(prob.q.dtype)
    cache_seqlens = torch.tensor(schedules[-1], dtype=torch.int32, device="cuda")
    dec = mla.MLADecoder()
    kwargs = dict(num_heads_q=h_q, seq_len_q=s_q, page_size=64, dtype=q.dtype, causal=causal)
    out = torch.empty(len(longest), s_q, h_q, 512, dtype=q.dtype, device="cuda")
    dec.plan(cache_seqlens, **kwargs)  # allocates and compiles outside the capture
    dec.run(q, k_cache, prob.block_table, cache_seqlens, out=out)
    torch.cuda.synchronize()
    buffers = [dec.tile_scheduler_metadata, dec.num_splits, dec._workspace, dec._lse]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dec.plan(cache_seqlens, **kwargs)
        _, lse = dec.run(q, k_cache, prob.block_table, cache_seqlens, out=out)
    assert [t.data_ptr() for t in buffers] == [t.data_ptr() for t in (
        dec.tile_scheduler_metadata, dec.num_splits, dec._workspace, dec._lse)], "plan reallocated"
    parts = dec.tile_scheduler_metadata.shape[0]
    for lengths in schedules:
        cache_seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))
        out.fill_(float("nan"))
        dec.tile_scheduler_metadata.fill_(POISON)
        graph.replay()
        torch.cuda.synchronize()
        assert_equal_plans((dec.tile_scheduler_metadata, dec.num_splits), planner.plan(lengths, parts),
                           f"replayed plan for {lengths}")
        ref_out, ref_lse = mla_decode_reference(q, k_cache, prob.block_table, cache_seqlens, causal=causal)
        cmp = compare_to_reference(out, lse, ref_out, ref_lse)
        assert cmp.ok, f"lengths {lengths}: {cmp.message}"
