"""GPU: the split-kv merge by each request's last chunk (``split_k.last_chunk``, skeleton ``chunk_merge``).

Each case builds the kernel of a variant that can merge by its last chunks with ``chunk_merge`` on (whatever the
library's default), plans a batch whose requests split in two, three or many chunks, and checks: the output and
lse against the fp32 reference (NaN in every unused cache slot, out pre-filled with NaN), decode after decode on
one stream and in CUDA-graph replays (the counts must be back at 0 after each, so the plan is unchanged), and
that the library's own merge kernel gives the same result to bf16 rounding.
"""
from __future__ import annotations

import pytest
import torch

import mla
from mla.reference import compare_to_reference, mla_decode_reference
from mla.testing import make_decode_problem

pytestmark = pytest.mark.gpu

VARIANTS = ["seesaw"]

# (seqlens, s_q, h_q, causal, page_size, partial): requests split in two or three (b128-like plans at small b),
# one request over every part (n up to the part count: many rounds of the merge), a ragged batch with empty and
# one-tile requests, an m-block with 16 of its 64 rows, s_q 2 causal (4 m-blocks), page 1 (the scoring
# warpgroups load: no producer warpgroup), fp32 partials.
CASES = [
    ([4096] * 40, 2, 128, False, 64, None),
    ([16384], 1, 128, False, 64, None),
    ([20, 140, 4096, 0, 1, 63, 65, 3000, 9000, 700], 1, 64, False, 64, None),
    ([5000, 17, 9000], 1, 16, False, 64, None),
    ([3000, 4100, 2500, 6000, 5], 2, 128, True, 64, None),
    ([3000, 800, 4096], 1, 128, False, 1, None),
    ([7000, 300, 5000], 2, 64, True, 16, "float32"),
]


def _entry(variant, dec, partial):
    from pipelines import launch

    shape = dec._planned
    config = launch.DecodeConfig.make(variant, shape.dtype, shape.h_q, shape.s_q, shape.page_size, shape.causal, 1,
                                      True, partial, dec._info.split_cluster)
    base = launch._kernel_class(variant, config)
    cls = type(f"{base.__name__}_chunk_merge", (base,), {"chunk_merge": True})
    entry = launch.compile_entry(config, kernel_class=cls)
    return entry, launch.DecodeEntry(config, cls).decode.can_merge_chunks()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"b{len(c[0])}-sq{c[1]}-h{c[2]}-p{c[4]}-{c[5] or 'input'}")
def test_merge_by_last_chunk_matches_reference(variant, case):
    seqlens, s_q, h_q, causal, page_size, partial = case
    p = make_decode_problem(seqlens, s_q=s_q, h_q=h_q, page_size=page_size, device="cuda", seed=len(seqlens) + h_q,
                            value_scale=0.1)
    dec = mla.MLADecoder(pipeline=variant, partial_dtype=partial)
    dec.plan(p.cache_seqlens, num_heads_q=h_q, seq_len_q=s_q, page_size=page_size, dtype=p.q.dtype, causal=causal)
    splits = dec.num_splits.tolist()
    assert max(b - a for a, b in zip(splits, splits[1:])) > 1, "the case must split a request"
    entry, merges = _entry(variant, dec, partial)
    assert merges, "the kernel must merge by its last chunks here"
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
