"""GPU tests of the decode kernels against the fp32 reference (design notes, section 7).

Run on a Hopper GPU: ``python -m pytest -m gpu``. Each case draws fresh random inputs, NaN-poisons
every unused cache slot, permutes pages, and poisons the output before the launch so an unwritten
element fails.
"""
from __future__ import annotations

import pytest
import torch

import pipelines
from mla.testing import make_decode_problem, varlen


def make_paged_case(seqlens, s_q, h_q, *, h_kv=1, page_size=64, dtype=torch.bfloat16, seed=0):
    """A poisoned paged problem with the anchors' value distribution: randn / 10 clamped to [-1, 1]
    (FlashMLA's tests draw the same; the NaN poison survives the clamp)."""
    p = make_decode_problem(seqlens, s_q=s_q, h_q=h_q, h_kv=h_kv, page_size=page_size, dtype=dtype, device="cuda",
                            seed=seed, value_scale=0.1)
    return p.q, p.k_cache, p.block_table, p.cache_seqlens

pytestmark = pytest.mark.gpu

# Every pipeline with a kernel runs every case: a registered variant must pass them all.
VARIANTS = pipelines.available_variants()

# (seqlens, s_q, h_q, causal, dtype)
CASES = [
    ([140, 20], 1, 64, False, torch.bfloat16),  # one full M tile, masked tail
    ([64], 1, 64, False, torch.bfloat16),  # exactly one tile, no tail
    ([20, 140, 4096, 0, 1, 63, 65], 1, 16, False, torch.bfloat16),  # varlen with zero length
    ([0, 300, 0, 700], 1, 64, False, torch.bfloat16),  # zero lengths first: no block_table read for them
    ([4096] * 6, 1, 128, False, torch.bfloat16),
    ([140] * 2, 1, 32, False, torch.float16),
    ([140, 20], 1, 1, False, torch.bfloat16),
    ([140, 20, 300], 1, 3, False, torch.float16),
    ([140, 4096], 1, 63, False, torch.bfloat16),
    ([140, 4096], 1, 126, False, torch.bfloat16),
    ([20, 140, 2, 0], 2, 16, True, torch.bfloat16),  # causal MTP incl. seqlen < s_q
    ([20, 140, 4096, 3], 4, 16, True, torch.bfloat16),
    ([140, 4096], 2, 64, False, torch.bfloat16),
    ([140, 4096], 2, 128, True, torch.float16),
    ([141, 20, 7], 4, 128, True, torch.bfloat16),  # 512 rows: 8 m-blocks
    ([140, 33], 4, 3, True, torch.bfloat16),
    ([16384], 1, 128, False, torch.bfloat16),  # b=1 long: split across all SMs + merge
    # A skewed batch: the merge picks its narrow kernel (n_est 4, 4-warp CTAs) but the long request has 105
    # chunks on 132 SMs, more than 4 warps take in one round: G capped at 4, each warp several rounds.
    ([20000] + [64] * 31, 1, 64, False, torch.bfloat16),
    ([16384], 2, 64, True, torch.bfloat16),
    # A big batch that splits a few requests: the merge grid's Y is capped (split_k.merge_kernel.GRID_CTAS: 31 of
    # 128 CTAs per slot on 132 SMs), so each merge CTA loops over several units of the 6-chunk requests.
    ([4096] * 8 + [64] * 56, 1, 128, False, torch.bfloat16),
    ([0, 0], 1, 16, False, torch.bfloat16),  # every row empty
    (varlen(64, 4096, seed=1, zeros=3), 1, 16, False, torch.bfloat16),
    (varlen(128, 1024, seed=2, zeros=2), 1, 128, False, torch.bfloat16),
    (varlen(64, 600, seed=3, zeros=2), 2, 64, True, torch.float16),
]


def _ids():
    return [f"b{len(c[0])}-sq{c[1]}-h{c[2]}-{'causal' if c[3] else 'full'}-{str(c[4])[6:]}-max{max(c[0])}"
            for c in CASES]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", CASES, ids=_ids())
def test_decode_matches_reference(variant, case):
    seqlens, s_q, h_q, causal, dtype = case
    _check_decode(variant, seqlens, s_q, h_q, causal, dtype, 64, seed=hash((tuple(seqlens), s_q, h_q)) % 1000)


# Several kv heads (FlashMLA's grouping: query head h reads kv head h // (h_q / h_kv)):
# (seqlens, s_q, h_q, h_kv, causal, dtype)
KV_HEAD_CASES = [
    ([140, 20, 0], 1, 16, 2, False, torch.bfloat16),
    ([140, 4096, 33], 2, 9, 3, True, torch.bfloat16),  # odd heads per kv head, causal MTP
    ([20, 140, 4096, 0], 4, 24, 8, True, torch.float16),
    ([141, 600], 2, 128, 2, True, torch.bfloat16),  # 128 rows per kv head: 2 m-blocks each
    ([16384], 1, 64, 2, False, torch.bfloat16),  # split across SMs + merge
    (varlen(32, 1000, seed=4, zeros=2), 1, 16, 8, False, torch.bfloat16),
]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", KV_HEAD_CASES, ids=lambda c: f"b{len(c[0])}-sq{c[1]}-h{c[2]}-hkv{c[3]}")
def test_several_kv_heads_match_reference(variant, case):
    seqlens, s_q, h_q, h_kv, causal, dtype = case
    _check_decode(variant, seqlens, s_q, h_q, causal, dtype, 64, h_kv=h_kv, seed=len(seqlens) + h_kv)


# Page sizes: every case below at every page size of the list, each loader path and box shape
# (1: cp.async row gather; 16, 32: several pages per TMA tile; 64: one; 128: half a page), and the
# smaller gather pages (2, 4, 8: several tokens per page) on the first cases.
# (seqlens, s_q, h_q, causal, dtype)
PAGE_CASES = [
    ([20, 140, 4096, 0, 1, 63, 65, 17], 1, 16, False, torch.bfloat16),  # varlen, zero length, every tail
    ([140, 33, 2], 2, 3, True, torch.float16),  # odd h_q, causal MTP, seqlen < s_q
    ([20, 140, 4096, 3], 4, 16, True, torch.bfloat16),  # causal s_q 4
    (varlen(32, 1024, seed=6, zeros=2), 1, 128, False, torch.bfloat16),  # 2 m-blocks: a multicast cluster
    ([141, 20, 7], 4, 128, True, torch.bfloat16),  # 8 m-blocks: 4 clusters per plan part
    ([700, 90], 3, 64, True, torch.bfloat16),  # 3 m-blocks: odd, no cluster
    ([16384], 2, 64, True, torch.float16),  # split across the SMs + merge, in clusters
]
PAGE_SIZES = [1, 16, 32, 64, 128]
SMALL_GATHER_PAGES = [2, 4, 8]


def _page_params():
    params = [(p, c) for p in PAGE_SIZES for c in PAGE_CASES]
    params += [(p, c) for p in SMALL_GATHER_PAGES for c in PAGE_CASES[:3]]
    return [pytest.param(p, c, id=f"p{p}-b{len(c[0])}-sq{c[1]}-h{c[2]}-{'causal' if c[3] else 'full'}-"
                                  f"{str(c[4])[6:]}-max{max(c[0])}") for p, c in params]


def _check_decode(variant, seqlens, s_q, h_q, causal, dtype, page_size, h_kv=1, seed=0):
    import mla
    from mla.reference import compare_to_reference, mla_decode_reference

    q, k_cache, block_table, cache_seqlens = make_paged_case(seqlens, s_q, h_q, h_kv=h_kv, page_size=page_size,
                                                             dtype=dtype, seed=seed)
    if any(n % page_size for n in seqlens):
        assert torch.isnan(k_cache).any()  # the poison is there (page 1 has no slot past an end)
    meta, num_splits = mla.get_mla_metadata(cache_seqlens, s_q * h_q // h_kv, h_kv)
    out = torch.full((len(seqlens), s_q, h_q, 512), float("nan"), dtype=dtype, device="cuda")
    out, lse = mla.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, 512, meta, num_splits,
                                          causal=causal, pipeline=variant, out=out)
    torch.cuda.synchronize()
    ref_out, ref_lse = mla_decode_reference(q, k_cache, block_table, cache_seqlens, causal=causal)
    cmp = compare_to_reference(out, lse, ref_out, ref_lse)
    assert cmp.ok, cmp.message


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("h_q", [16, 128])  # 16: 2wg's narrow kernel; 128: a 2-CTA multicast cluster
def test_every_request_empty_with_a_zero_width_block_table(variant, h_q):
    """All lengths 0 and a block_table with no column: no entry may be read (the chunk heads read page
    ids before the lengths, guarded by the table's width); every row gets out 0 and lse +inf."""
    import mla

    b, s_q = 3, 1
    q = torch.randn(b, s_q, h_q, 576, dtype=torch.bfloat16, device="cuda")
    k_cache = torch.full((2, 64, 1, 576), float("nan"), dtype=torch.bfloat16, device="cuda")
    block_table = torch.empty(b, 0, dtype=torch.int32, device="cuda")
    cache_seqlens = torch.zeros(b, dtype=torch.int32, device="cuda")
    meta, num_splits = mla.get_mla_metadata(cache_seqlens, s_q * h_q, 1)
    out = torch.full((b, s_q, h_q, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    out, lse = mla.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, 512, meta, num_splits,
                                          pipeline=variant, out=out)
    torch.cuda.synchronize()
    assert bool((out == 0).all())
    assert bool((lse == float("inf")).all())


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("h_q, s_q, causal", [(64, 2, True), (128, 1, False)])
def test_lazy_rescale_with_growing_scores(variant, h_q, s_q, causal):
    """Scores whose row max grows by more and by less than softmax.LAZY_RESCALE_LOG2 from tile to tile
    (both branches of lazy rescaling, and P up to 256 against a stale max): the RoPE columns of K (not
    part of V, so the output keeps its scale) are multiplied by 50 * (tile + 1) on even tiles: the
    tiles' score maxima rise by ~1 (natural log units) per even tile, to ~25 at 4096 keys, so the
    stale max is kept for several tiles and then moved; odd tiles keep small scores."""
    import mla
    from mla.reference import compare_to_reference, mla_decode_reference

    seqlens = [4096, 1000]
    q, k_cache, block_table, cache_seqlens = make_paged_case(seqlens, s_q, h_q, seed=7)
    for r, n in enumerate(seqlens):
        for tile in range(-(-n // 64)):
            page = int(block_table[r, tile])  # page size 64: one page per tile
            if tile % 2 == 0:
                k_cache[page, :, :, 512:] *= 50.0 * (tile + 1)
    meta, num_splits = mla.get_mla_metadata(cache_seqlens, s_q * h_q, 1)
    out, lse = mla.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, 512, meta, num_splits,
                                          causal=causal, pipeline=variant)
    torch.cuda.synchronize()
    ref_out, ref_lse = mla_decode_reference(q, k_cache, block_table, cache_seqlens, causal=causal)
    assert ref_lse[torch.isfinite(ref_lse)].max() > 12  # the scaling did make large, growing scores
    cmp = compare_to_reference(out, lse, ref_out, ref_lse)
    assert cmp.ok, cmp.message


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("page_size, case", _page_params())
def test_page_sizes_match_reference(variant, page_size, case):
    from pipelines import paged_kv

    assert page_size in paged_kv.PAGE_SIZES
    seqlens, s_q, h_q, causal, dtype = case
    _check_decode(variant, seqlens, s_q, h_q, causal, dtype, page_size, seed=page_size + s_q * h_q)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("page_size", [1, 32])
def test_page_sizes_with_several_kv_heads(variant, page_size):
    # The loaders' kv-head coordinate: TMA box and gathered row of kv head 1 and 2.
    _check_decode(variant, [140, 4096, 33, 0], 2, 24, True, torch.bfloat16, page_size, h_kv=3, seed=9)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("page_size", [16, 64, 128])
def test_multicast_off_matches_reference(variant, page_size, monkeypatch):
    """MLA_MULTICAST=0 (the A/B switch and fallback): the same 2-m-block problems without a cluster."""
    from pipelines import paged_kv

    monkeypatch.setenv(paged_kv.MULTICAST_ENV_VAR, "0")
    _check_decode(variant, varlen(32, 1024, seed=6, zeros=2), 1, 128, False, torch.bfloat16, page_size, seed=3)
    _check_decode(variant, [141, 20, 7], 4, 128, True, torch.bfloat16, page_size, seed=4)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("page_size", [1, 64])
def test_decoder_graph_replay(variant, page_size):
    """Plan once, capture run() in a CUDA graph, replay on new q values: same as the reference
    (h_q 128: a multicast cluster at page 64; the cp.async gather at page 1)."""
    import mla
    from mla.reference import compare_to_reference, mla_decode_reference

    seqlens = varlen(8, 2000, seed=5, zeros=1)
    q, k_cache, block_table, cache_seqlens = make_paged_case(seqlens, 1, 128, page_size=page_size, seed=11)
    assert page_size == 1 or torch.isnan(k_cache).any()  # the poison is there (page 1 has no slot past an end)
    dec = mla.MLADecoder(pipeline=variant)
    dec.plan(cache_seqlens, num_heads_q=128, seq_len_q=1, num_heads_k=1, page_size=page_size, dtype=q.dtype)
    out = torch.empty(len(seqlens), 1, 128, 512, dtype=q.dtype, device="cuda")
    dec.run(q, k_cache, block_table, cache_seqlens, out=out)  # warm-up (compiles)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = dec.run(q, k_cache, block_table, cache_seqlens, out=out)
    q.copy_((torch.randn_like(q, dtype=torch.float32) / 10).to(q.dtype))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref_out, ref_lse = mla_decode_reference(q, k_cache, block_table, cache_seqlens)
    cmp = compare_to_reference(out, lse, ref_out, ref_lse)
    assert cmp.ok, cmp.message


# Split-heavy problems for the partial dtypes (every request split over many parts, or a big batch
# whose part boundaries split requests): (seqlens, s_q, h_q, h_kv, causal, dtype)
PARTIAL_CASES = [
    ([16384], 1, 128, 1, False, torch.bfloat16),
    ([16384], 1, 16, 1, False, torch.float16),
    ([16384], 2, 64, 1, True, torch.bfloat16),
    ([1024, 0, 5000], 4, 16, 1, True, torch.bfloat16),
    ([16384], 1, 64, 2, False, torch.bfloat16),
    (varlen(128, 1024, seed=2, zeros=2), 1, 128, 1, False, torch.bfloat16),
]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("partial", ["float32", "input"])
@pytest.mark.parametrize("case", PARTIAL_CASES, ids=lambda c: f"b{len(c[0])}-sq{c[1]}-h{c[2]}-hkv{c[3]}")
def test_partial_dtypes_match_reference(variant, partial, case, monkeypatch):
    """Split-kv partials in fp32 and in the input dtype (``MLA_PARTIAL_DTYPE``) both meet the
    reference tolerances on problems where most rows are merged from many partials."""
    from pipelines.launch import PARTIAL_ENV_VAR

    monkeypatch.setenv(PARTIAL_ENV_VAR, partial)
    seqlens, s_q, h_q, h_kv, causal, dtype = case
    _check_decode(variant, seqlens, s_q, h_q, causal, dtype, 64, h_kv=h_kv, seed=len(seqlens) + h_q)


def test_partial_dtype_error_report():
    """Measures (prints) the max and mean abs error against the fp32 reference of fp32 vs 16-bit
    partials on one heavily split problem (b1, 16384 keys, h128: 66 partials per row), and checks
    both within tolerance. Run with -s to see the numbers (docs/perf-notes.md quotes them)."""
    import mla
    from mla.reference import compare_to_reference, mla_decode_reference

    q, k_cache, block_table, cache_seqlens = make_paged_case([16384], 1, 128, seed=21)
    ref_out, ref_lse = mla_decode_reference(q, k_cache, block_table, cache_seqlens)
    ref_out = ref_out.float().cuda()
    for partial in ("float32", "input"):
        dec = mla.MLADecoder(pipeline=VARIANTS[0], partial_dtype=partial)
        dec.plan(cache_seqlens, num_heads_q=128, seq_len_q=1, page_size=64, dtype=q.dtype)
        out, lse = dec.run(q, k_cache, block_table, cache_seqlens)
        torch.cuda.synchronize()
        err = (out.float() - ref_out).abs()
        print(f"\npartials {partial}: max abs err {err.max().item():.3e}, mean abs err {err.mean().item():.3e}")
        cmp = compare_to_reference(out, lse, ref_out, ref_lse)
        assert cmp.ok, cmp.message


# Split clusters (MLA_SPLIT_CLUSTER): the CTAs of a group share each chunk tile by tile and combine
# their partials through distributed shared memory. Cases: single requests split over 1 group or
# several (then the global merge too), varlen with zeros (ranks with no tile), odd h_q, causal MTP,
# 2 and 8 m-blocks, h_kv 2; every page loader.
SPLIT_CLUSTER_CASES = [
    ([1024], 1, 16, 1, False, torch.bfloat16),
    ([16384], 1, 128, 1, False, torch.bfloat16),
    ([20, 140, 4096, 0, 1, 63, 65, 17], 1, 16, 1, False, torch.bfloat16),
    ([140, 33, 2], 2, 3, 1, True, torch.float16),
    ([3000, 700], 4, 64, 1, True, torch.bfloat16),
    ([900, 5000], 2, 64, 2, True, torch.bfloat16),
    ([141, 20, 7], 4, 128, 1, True, torch.bfloat16),
]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("cluster", ["4", "8"], ids=lambda c: f"c{c}")
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("case", SPLIT_CLUSTER_CASES,
                         ids=lambda c: f"b{len(c[0])}-sq{c[1]}-h{c[2]}-hkv{c[3]}-max{max(c[0])}")
def test_split_clusters_match_reference(variant, cluster, page_size, case, monkeypatch):
    from split_k.planner import SPLIT_CLUSTER_ENV_VAR

    monkeypatch.setenv(SPLIT_CLUSTER_ENV_VAR, cluster)
    seqlens, s_q, h_q, h_kv, causal, dtype = case
    _check_decode(variant, seqlens, s_q, h_q, causal, dtype, page_size, h_kv=h_kv, seed=int(cluster) + h_q)


@pytest.mark.parametrize("variant", VARIANTS)
def test_split_cluster_graph_replay_and_partials(variant, monkeypatch):
    """A split-cluster decoder captured in a CUDA graph gives the eager result after the lengths and
    the query change in place, with 16-bit partials for the groups' merge."""
    import mla
    from mla.reference import compare_to_reference, mla_decode_reference
    from split_k.planner import SPLIT_CLUSTER_ENV_VAR

    monkeypatch.setenv(SPLIT_CLUSTER_ENV_VAR, "8")
    q, k_cache, block_table, cache_seqlens = make_paged_case([5000, 300], 1, 64, seed=5)
    dec = mla.MLADecoder(pipeline=variant, partial_dtype="input")
    dec.plan(cache_seqlens, num_heads_q=64, seq_len_q=1, page_size=64, dtype=q.dtype)
    out = torch.empty(2, 1, 64, 512, dtype=q.dtype, device="cuda")
    dec.run(q, k_cache, block_table, cache_seqlens, out=out)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        dec.plan(cache_seqlens, num_heads_q=64, seq_len_q=1, page_size=64, dtype=q.dtype)
        dec.run(q, k_cache, block_table, cache_seqlens, out=out)
    cache_seqlens.copy_(torch.tensor([4000, 250], dtype=torch.int32))  # within each request's pages
    q.copy_((torch.randn_like(q, dtype=torch.float32) / 10).to(q.dtype))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref_out, ref_lse = mla_decode_reference(q, k_cache, block_table, cache_seqlens)
    cmp = compare_to_reference(out, dec._lse, ref_out, ref_lse)
    assert cmp.ok, cmp.message
