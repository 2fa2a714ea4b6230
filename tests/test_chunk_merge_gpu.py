"""GPU: the split-kv merge by each request's last chunk (``split_k.last_chunk``, skeleton ``chunk_merge``).

Each case builds the kernel of a variant that can merge by its last chunks with ``chunk_merge`` on (whatever the
library's default), plans a batch whose requests split in two, three or many chunks, and checks: the output and
lse against the fp32 reference (NaN in every unused cache slot, out pre-filled with NaN), decode after decode on
one stream and in CUDA-graph replays (the counts must be back at 0 after each, so the plan is unchanged), and
that the library's own merge kernel gives the same result to bf16 rounding. Where the last chunks merge, the build
launches no merge kernel, so the reference check proves the decode merged every split row.
"""
from __future__ import annotations

import pytest
import torch

import mla
from mla.reference import compare_to_reference, mla_decode_reference
from mla.testing import make_decode_problem, varlen
from split_k import last_chunk, merge_kernel

pytestmark = pytest.mark.gpu

VARIANTS = ["seesaw"]

# (seqlens, s_q, h_q, causal, page_size, partial, merged by the last chunk): requests split in two (b40 at 33
# parts), one long request among short ones (the shapes estimate 2 chunks, the plan cuts it in 7: the merge's
# row batches), a ragged batch with empty requests, an m-block with 16 of its 64 rows, s_q 2 causal (4
# m-blocks), page 1 (the scoring warpgroups load: no producer warpgroup); fp32 partials and one request over
# every part take the merge kernel (``split_k.last_chunk.applies``).
CASES = [
    ([4096] * 40, 2, 128, False, 64, None, True),
    ([4096] + [64] * 39, 2, 128, False, 64, None, True),
    (varlen(100, 2000, seed=3, zeros=3), 1, 64, False, 64, None, True),
    (varlen(80, 3000, seed=4), 1, 16, False, 64, None, True),
    ([3000, 4100, 2500, 6000, 5] * 8, 2, 128, True, 64, None, True),
    ([3000, 800, 4096] * 14, 1, 128, False, 1, None, True),
    ([7000, 300, 5000] * 14, 2, 64, True, 16, "float32", False),
    ([16384], 1, 128, False, 64, None, False),
]


def _entry(variant, dec, partial, table_width, merged):
    """The chunk-merge build of ``variant`` for ``dec``'s plan, and whether its launch merges by the last chunks.
    Where the case says it does (``merged``), the build launches no merge kernel at all (``merge_launch`` off),
    so a split row the decode did not merge would keep out's NaN."""
    from pipelines import launch

    shape = dec._planned
    config = launch.DecodeConfig.make(variant, shape.dtype, shape.h_q, shape.s_q, shape.page_size, shape.causal, 1,
                                      True, partial, dec._info.split_cluster)
    base = launch._kernel_class(variant, config)
    cls = type(f"{base.__name__}_chunk_merge", (base,), {"chunk_merge": True, "merge_launch": not merged})
    entry = launch.compile_entry(config, kernel_class=cls)
    num_parts = dec.tile_scheduler_metadata.shape[0]
    n_est = merge_kernel.estimated_chunks(len(dec.num_splits) - 1, num_parts,
                                          merge_kernel.capacity_tiles(table_width, shape.page_size))
    can = launch.DecodeEntry(config, cls).decode.can_merge_chunks()
    return entry, last_chunk.applies(can, num_parts, n_est)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"b{len(c[0])}-sq{c[1]}-h{c[2]}-p{c[4]}-{c[5] or 'input'}-{c[6]}")
def test_merge_by_last_chunk_matches_reference(variant, case):
    seqlens, s_q, h_q, causal, page_size, partial, merged = case
    p = make_decode_problem(seqlens, s_q=s_q, h_q=h_q, page_size=page_size, device="cuda", seed=len(seqlens) + h_q,
                            value_scale=0.1)
    dec = mla.MLADecoder(pipeline=variant, partial_dtype=partial)
    dec.plan(p.cache_seqlens, num_heads_q=h_q, seq_len_q=s_q, page_size=page_size, dtype=p.q.dtype, causal=causal)
    splits = dec.num_splits.tolist()
    assert max(b - a for a, b in zip(splits, splits[1:])) > 1, "the case must split a request"
    entry, merges = _entry(variant, dec, partial, p.block_table.shape[1], merged)
    assert merges == merged, "the case must take the path it is listed for"
    planned = dec.tile_scheduler_metadata.clone()
    ref_out, ref_lse = mla_decode_reference(p.q, p.k_cache, p.block_table, p.cache_seqlens, causal=causal)
    lib_out, lib_lse = dec.run(p.q, p.k_cache, p.block_table, p.cache_seqlens)  # the merge kernel
    lib_out = lib_out.clone()

    def call(out, lse):
        entry(p.q, p.k_cache, p.block_table, p.cache_seqlens, dec.tile_scheduler_metadata, dec.num_splits, out, lse,
              dec._workspace, dec._scale, 0)

    for i in range(3):  # back to back on one stream: each decode finds the counts at 0 again
        out = torch.full((len(seqlens), s_q, h_q, 512), float("nan"), dtype=p.q.dtype, device="cuda")
        lse = torch.full((len(seqlens), h_q, s_q), float("nan"), dtype=torch.float32, device="cuda")
        call(out, lse)
        torch.cuda.synchronize()
        cmp = compare_to_reference(out, lse, ref_out, ref_lse)
        assert cmp.ok, f"decode {i}: {cmp.message}"
        assert torch.equal(dec.tile_scheduler_metadata, planned), f"decode {i} left counts in the plan"
    # The merge kernel's result, to bf16 rounding (two summation orders).
    assert float((out.float() - lib_out.float()).abs().max()) <= 2e-2

    out = torch.full_like(out, float("nan"))
    lse = torch.full_like(lse, float("nan"))
    call(out, lse)  # loaded outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(out, lse)
    for _ in range(5):
        out.fill_(float("nan"))
        graph.replay()
    torch.cuda.synchronize()
    cmp = compare_to_reference(out, lse, ref_out, ref_lse)
    assert cmp.ok, f"graph replays: {cmp.message}"
    assert torch.equal(dec.tile_scheduler_metadata, planned)


def test_plan_read_only_call_leaves_the_merge_to_the_merge_kernel():
    """``pipelines.PLAN_READ_ONLY`` (the torch op's ``grid_merge``): the decode does not merge by the last chunks.
    Proved on a build that launches no merge kernel: the split rows keep out's NaN there, while the same build
    with ``grid_merge`` 0 merges them (so the case does take the last-chunk path otherwise)."""
    import pipelines

    seqlens, s_q, h_q = [4096] * 40, 2, 128
    p = make_decode_problem(seqlens, s_q=s_q, h_q=h_q, page_size=64, device="cuda", seed=7, value_scale=0.1)
    dec = mla.MLADecoder(pipeline="seesaw")
    dec.plan(p.cache_seqlens, num_heads_q=h_q, seq_len_q=s_q, page_size=64, dtype=p.q.dtype)
    entry, merges = _entry("seesaw", dec, None, p.block_table.shape[1], True)
    assert merges
    splits = dec.num_splits.tolist()
    split_req = [r for r in range(len(seqlens)) if splits[r + 1] - splits[r] > 1]
    assert split_req, "the case must split a request"
    ref_out, ref_lse = mla_decode_reference(p.q, p.k_cache, p.block_table, p.cache_seqlens)
    for grid_merge in (0, pipelines.PLAN_READ_ONLY):
        out = torch.full((len(seqlens), s_q, h_q, 512), float("nan"), dtype=p.q.dtype, device="cuda")
        lse = torch.full((len(seqlens), h_q, s_q), float("nan"), dtype=torch.float32, device="cuda")
        entry(p.q, p.k_cache, p.block_table, p.cache_seqlens, dec.tile_scheduler_metadata, dec.num_splits, out, lse,
              dec._workspace, dec._scale, grid_merge)
        torch.cuda.synchronize()
        if grid_merge == 0:
            assert compare_to_reference(out, lse, ref_out, ref_lse).ok
        else:
            assert torch.isnan(out[split_req].float()).all(), "a read-only call merged by the last chunks"
            whole = [r for r in range(len(seqlens)) if r not in split_req]
            if whole:
                cmp = compare_to_reference(out[whole], lse[whole], ref_out[whole], ref_lse[whole])
                assert cmp.ok, cmp.message
