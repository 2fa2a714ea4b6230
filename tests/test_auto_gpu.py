"""GPU: ``pipeline="auto"`` runs the variant the committed table (``pipelines/auto_table.py``) gives the
call's shape, through both entry points, and its output matches the fp32 reference.

One shape per pipeline the table picks at batch 8 (the table's keys there: the seesaw at page 64 s_q 2
h_q 128 and page 16 s_q 2 h_q 128, 3wg at page 64 s_q 2 h_q 32, 2wg at page 64 s_q 1 h_q 16), so that a
table or a lookup change that sends a shape to another variant fails here, and a variant that auto
reaches only through the table is checked through it. Lengths vary, one is zero, every unused cache slot
is NaN (``mla.testing.make_decode_problem``), and the block table is sized to the longest request, so
its capacity is the key's 1024.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

SEQLENS = [1024, 1000, 517, 0, 1024, 63, 800, 1023]

CASES = [  # (page_size, s_q, h_q, the table's variant)
    (64, 2, 128, "seesaw"),
    (16, 2, 128, "seesaw"),
    (64, 2, 32, "3wg"),
    (64, 1, 16, "2wg"),
]


@pytest.mark.parametrize("page_size,s_q,h_q,variant", CASES, ids=[f"p{c[0]}-s{c[1]}-h{c[2]}" for c in CASES])
def test_auto_runs_the_tables_variant_and_matches_the_reference(monkeypatch, page_size, s_q, h_q, variant):
    import mla
    from mla.reference import compare_to_reference, mla_decode_reference
    from mla.testing import make_decode_problem
    from pipelines import auto

    monkeypatch.delenv("MLA_PIPELINE", raising=False)
    b = len(SEQLENS)
    causal = s_q > 1
    p = make_decode_problem(SEQLENS, s_q=s_q, h_q=h_q, page_size=page_size, device="cuda", seed=11,
                            value_scale=0.1)
    width = p.block_table.shape[1]
    assert width * page_size == 1024
    chosen = mla.resolve_pipeline("auto", page_size=page_size, seq_len_q=s_q, num_heads_q=h_q, num_heads_k=1,
                                  batch_size=b, max_pages=width)
    assert chosen == variant
    assert auto.choose(page_size, s_q, h_q, 1, b, width * page_size, ("2wg", "3wg", "seesaw")) == variant
    ref_out, ref_lse = mla_decode_reference(p.q, p.k_cache, p.block_table, p.cache_seqlens, causal=causal)

    meta, splits = mla.get_mla_metadata(p.cache_seqlens, s_q * h_q, 1)
    out, lse = mla.flash_mla_with_kvcache(p.q, p.k_cache, p.block_table, p.cache_seqlens, 512, meta, splits,
                                          causal=causal, pipeline="auto")
    check = compare_to_reference(out, lse, ref_out, ref_lse)
    assert check.ok, f"flash_mla_with_kvcache (auto -> {variant}): {check.message}"

    dec = mla.MLADecoder("auto")
    dec.plan(p.cache_seqlens, num_heads_q=h_q, seq_len_q=s_q, page_size=page_size, dtype=p.q.dtype, causal=causal)
    assert variant in dec.variants
    assert dec.variant_for(p.block_table) == variant
    out2, lse2 = dec.run(p.q, p.k_cache, p.block_table, p.cache_seqlens)
    check = compare_to_reference(out2, lse2, ref_out, ref_lse)
    assert check.ok, f"MLADecoder.run (auto -> {variant}): {check.message}"
