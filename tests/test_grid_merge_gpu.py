"""GPU: the in-grid split-kv merge (``pipelines.grid_merge_mode``, ``split_k.grid_sync``).

By default (``MLA_GRID_MERGE`` auto) only eager calls with a one-cell merge use it; these run the 2wg
kernels with it on for every call and off, on split cases, and check that both agree with the reference, that a decode
changes nothing in the plan but the barrier word (whose low 31 bits stay 0), that many decodes in a
row (one stream, and replays of a CUDA graph) stay right, and that a grid too large for the GPU at
once is never launched cooperatively.
"""
from __future__ import annotations

import pytest
import torch

import mla
import pipelines
from mla.reference import compare_to_reference, mla_decode_reference
from mla.testing import make_decode_problem
from split_k.planner import GRID_COUNT_COLUMN

pytestmark = pytest.mark.gpu

# (seqlens, s_q, h_q, h_kv, causal, dtype, partial): splits of one request over every SM, many
# requests split in two or three, the 2-CTA multicast cluster (h128), several kv heads, fp32 partials.
CASES = [
    ([1024], 1, 16, 1, False, torch.bfloat16, None),
    ([16384], 1, 128, 1, False, torch.bfloat16, None),
    ([20, 140, 4096, 0, 1, 63, 65, 3000], 1, 16, 1, False, torch.bfloat16, None),
    ([141, 5000, 7], 4, 32, 1, True, torch.float16, None),
    ([16384], 1, 64, 2, False, torch.bfloat16, None),
    ([16384, 300], 1, 16, 1, False, torch.bfloat16, "float32"),
]


def _problem(seqlens, s_q, h_q, h_kv, dtype, seed):
    p = make_decode_problem(seqlens, s_q=s_q, h_q=h_q, h_kv=h_kv, dtype=dtype, device="cuda", seed=seed,
                            value_scale=0.1)
    return p.q, p.k_cache, p.block_table, p.cache_seqlens


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"b{len(c[0])}-sq{c[1]}-h{c[2]}-hkv{c[3]}-{c[6] or 'input'}")
@pytest.mark.parametrize("grid_merge", ["1", "0"])
def test_decoder_matches_reference_and_leaves_the_plan_as_planned(monkeypatch, case, grid_merge):
    seqlens, s_q, h_q, h_kv, causal, dtype, partial = case
    monkeypatch.setenv(pipelines.GRID_MERGE_ENV_VAR, grid_merge)
    q, k_cache, block_table, cache_seqlens = _problem(seqlens, s_q, h_q, h_kv, dtype, seed=len(seqlens) + h_q)
    dec = mla.MLADecoder(pipeline="2wg", partial_dtype=partial)
    dec.plan(cache_seqlens, num_heads_q=h_q, seq_len_q=s_q, num_heads_k=h_kv, page_size=64, dtype=dtype,
             causal=causal)
    launch, flag = dec._launch_for(dec._planned)
    assert flag == int(grid_merge)
    planned = dec.tile_scheduler_metadata.clone()
    assert int(planned[0, GRID_COUNT_COLUMN]) == 0
    flips = 0
    ref_out, ref_lse = mla_decode_reference(q, k_cache, block_table, cache_seqlens, causal=causal)
    for i in range(3):  # back to back on one stream: each decode finds the barrier word at 0 again
        out = torch.full((len(seqlens), s_q, h_q, 512), float("nan"), dtype=dtype, device="cuda")
        out, lse = dec.run(q, k_cache, block_table, cache_seqlens, out=out)
        torch.cuda.synchronize()
        cmp = compare_to_reference(out, lse, ref_out, ref_lse)
        assert cmp.ok, f"decode {i}: {cmp.message}"
        flips += flag
        word = int(dec.tile_scheduler_metadata[0, GRID_COUNT_COLUMN]) & 0xFFFFFFFF
        assert word == (0x80000000 if flips % 2 else 0), (i, hex(word))  # one flip per in-grid decode
    meta = dec.tile_scheduler_metadata.clone()
    meta[0, GRID_COUNT_COLUMN] = 0
    assert torch.equal(meta, planned)


def test_graph_replays_and_inputs_changed_in_place(monkeypatch):
    """A captured decode replayed many times (the barrier word carries over from replay to replay), with
    new q values between replays."""
    monkeypatch.setenv(pipelines.GRID_MERGE_ENV_VAR, "1")
    q, k_cache, block_table, cache_seqlens = _problem([3000, 700, 0, 5000], 1, 16, 1, torch.bfloat16, seed=11)
    dec = mla.MLADecoder(pipeline="2wg")
    dec.plan(cache_seqlens, num_heads_q=16, seq_len_q=1, page_size=64, dtype=torch.bfloat16)
    assert dec._launch_for(dec._planned)[1] == 1
    out = torch.empty(4, 1, 16, 512, dtype=torch.bfloat16, device="cuda")
    dec.run(q, k_cache, block_table, cache_seqlens, out=out)  # loads the kernel outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = dec.run(q, k_cache, block_table, cache_seqlens, out=out)
    gen = torch.Generator().manual_seed(5)
    for i in range(20):
        q.copy_((torch.randn(q.shape, generator=gen) * 0.1).clamp(-1, 1).to(q.dtype))
        out.fill_(float("nan"))
        graph.replay()
        if i % 5 == 4:
            torch.cuda.synchronize()
            ref_out, ref_lse = mla_decode_reference(q, k_cache, block_table, cache_seqlens)
            cmp = compare_to_reference(out, lse, ref_out, ref_lse)
            assert cmp.ok, f"replay {i}: {cmp.message}"
    assert int(dec.tile_scheduler_metadata[0, GRID_COUNT_COLUMN]) & 0x7FFFFFFF == 0


def test_a_plan_for_more_sms_than_the_gpu_has_uses_the_merge_kernel(monkeypatch):
    """num_sms above the device's: the grid cannot be resident at once, so no in-grid merge (a
    cooperative launch of it would be refused); the result is still right."""
    monkeypatch.setenv(pipelines.GRID_MERGE_ENV_VAR, "1")
    q, k_cache, block_table, cache_seqlens = _problem([9000], 1, 16, 1, torch.bfloat16, seed=2)
    sms = pipelines.device_sm_count(q.device)
    dec = mla.MLADecoder(pipeline="2wg", num_sms=2 * sms)
    dec.plan(cache_seqlens, num_heads_q=16, seq_len_q=1, page_size=64, dtype=torch.bfloat16)
    assert dec._launch_for(dec._planned)[1] == 0
    out, lse = dec.run(q, k_cache, block_table, cache_seqlens)
    torch.cuda.synchronize()
    ref_out, ref_lse = mla_decode_reference(q, k_cache, block_table, cache_seqlens)
    cmp = compare_to_reference(out, lse, ref_out, ref_lse)
    assert cmp.ok, cmp.message
