"""The query-row <-> head mapping of several kv heads (pipelines/heads.py), checked against the
reference: a model of the kernels' data flow (grouped q, one attention per kv head over its own
rows and its own K slice, rows written back through ``row_to_head``) must equal
``mla_decode_reference`` for h_kv 1, 2, 3 and 8."""
from __future__ import annotations

import pytest
import torch

from mla.reference import mla_decode_reference
from mla.testing import make_decode_problem
from pipelines.heads import group_queries, row_to_head


@pytest.mark.parametrize("h_kv, h_q, s_q", [(1, 16, 2), (2, 2, 1), (2, 6, 4), (3, 9, 2), (8, 64, 3)])
def test_grouped_rows_per_kv_head_equal_the_reference(h_kv, h_q, s_q):
    seqlens = [70, 0, 5, 130]
    prob = make_decode_problem(seqlens, s_q=s_q, h_q=h_q, h_kv=h_kv, dtype=torch.float32, seed=h_kv * 10 + s_q)
    q, k_cache, block_table, cache_seqlens = prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens
    ref_out, ref_lse = mla_decode_reference(q, k_cache, block_table, cache_seqlens, causal=True)

    hpg = h_q // h_kv
    grouped = group_queries(q, h_kv)
    b = q.shape[0]
    assert grouped.shape == (b, h_kv, s_q * hpg, 576) if h_kv > 1 else grouped is q
    rows = grouped.view(b, h_kv, s_q * hpg, 576)
    out = torch.full_like(ref_out, float("nan"))
    lse = torch.full_like(ref_lse, float("nan"))
    for g in range(h_kv):
        # One kv head's problem as the kernel sees it: its rows, its K slice. Row `row` belongs to
        # query token row // hpg, which sets its causal limit.
        for s_idx in range(s_q):
            q_g = rows[:, g, s_idx * hpg:(s_idx + 1) * hpg].reshape(b, 1, hpg, 576)
            q_tok = torch.zeros(b, s_q, hpg, 576)
            q_tok[:, s_idx] = q_g[:, 0]
            o_g, lse_g = mla_decode_reference(q_tok, k_cache[:, :, g:g + 1], block_table, cache_seqlens,
                                              causal=True)
            for j in range(hpg):
                row = s_idx * hpg + j
                s_back, head = row_to_head(row, g, hpg)
                assert s_back == s_idx
                out[:, s_back, head] = o_g[:, s_idx, j]
                lse[:, head, s_back] = lse_g[:, j, s_idx]
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)


def test_row_to_head_covers_every_head_once():
    h_q, h_kv, s_q = 24, 3, 4
    hpg = h_q // h_kv
    seen = {row_to_head(row, g, hpg) for g in range(h_kv) for row in range(s_q * hpg)}
    assert seen == {(s, h) for s in range(s_q) for h in range(h_q)}
