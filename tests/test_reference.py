"""mla.reference against a direct dense softmax, the empty-row convention, and the comparison helper."""
from __future__ import annotations

import pytest
import torch

from mla.reference import compare_to_reference, default_softmax_scale, mla_decode_reference, request_partial
from mla.testing import UNUSED_PAGE_ID, make_decode_problem


def dense_attention(q, keys_per_request, head_dim_v, scale, causal):
    """float64 softmax attention over each request's dense keys [L, h_kv, d]; empty rows 0 / +inf."""
    b, s_q, h_q, _ = q.shape
    out = torch.zeros(b, s_q, h_q, head_dim_v, dtype=torch.float64)
    lse = torch.full((b, h_q, s_q), float("inf"), dtype=torch.float64)
    for r, keys in enumerate(keys_per_request):
        seqlen, h_kv = keys.shape[0], keys.shape[1]
        for i in range(s_q):
            visible = seqlen - (s_q - 1 - i) if causal else seqlen
            if visible <= 0:
                continue
            for h in range(h_q):
                k = keys[:visible, h // (h_q // h_kv)].double()
                s = (k @ q[r, i, h].double()) * scale
                p = torch.softmax(s, dim=0)
                out[r, i, h] = p @ k[:, :head_dim_v]
                lse[r, h, i] = torch.logsumexp(s, dim=0)
    return out, lse


def dense_keys(prob):
    """Each request's keys gathered through block_table, the slow obvious way."""
    page_size = prob.k_cache.shape[1]
    keys = []
    for r, seqlen in enumerate(prob.cache_seqlens.tolist()):
        rows = [prob.k_cache[prob.block_table[r, t // page_size], t % page_size] for t in range(seqlen)]
        keys.append(torch.stack(rows) if rows else prob.k_cache[:0, 0])
    return keys


@pytest.mark.parametrize("seqlens, s_q, h_q, h_kv, page_size, causal", [
    ([20, 140, 0, 65], 1, 16, 1, 64, False),
    ([20, 140, 0, 65], 2, 16, 1, 64, True),
    ([3, 1, 130], 4, 3, 1, 16, True),     # causal rows with no key (seqlen < s_q)
    ([77, 5], 3, 8, 2, 1, True),          # h_kv > 1, page size 1
    ([200], 1, 63, 1, 64, False),         # odd head count
    ([64, 128], 2, 4, 4, 32, False),      # h_kv == h_q
])
def test_reference_matches_dense_softmax(seqlens, s_q, h_q, h_kv, page_size, causal):
    # Small head dims keep the float64 loop fast; the reference does not depend on 576/512.
    prob = make_decode_problem(seqlens, s_q=s_q, h_q=h_q, h_kv=h_kv, page_size=page_size, head_dim=40,
                               dtype=torch.float32, seed=3)
    scale = 0.37
    out, lse = mla_decode_reference(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, head_dim_v=32,
                                    softmax_scale=scale, causal=causal)
    ref_out, ref_lse = dense_attention(prob.q, dense_keys(prob), 32, scale, causal)
    assert out.dtype == lse.dtype == torch.float32
    assert out.shape == (len(seqlens), s_q, h_q, 32) and lse.shape == (len(seqlens), h_q, s_q)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)


def test_full_size_bf16_problem_ignores_poisoned_slots():
    # NaN in every unused cache slot and huge ids in unused block_table entries: none may be read.
    prob = make_decode_problem([20, 140, 0], s_q=2, h_q=16, seed=4)
    assert torch.isnan(prob.k_cache.float()).any() and (prob.block_table == UNUSED_PAGE_ID).any()
    out, lse = mla_decode_reference(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, causal=True)
    assert out.shape == (3, 2, 16, 512) and not torch.isnan(out).any() and not torch.isnan(lse).any()
    ref_out, ref_lse = dense_attention(prob.q.float(), [k.float() for k in dense_keys(prob)], 512,
                                       default_softmax_scale(), True)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)


def test_empty_rows_get_zero_out_and_positive_infinite_lse():
    prob = make_decode_problem([0, 2], s_q=4, h_q=2, head_dim=8, dtype=torch.float32, seed=5)
    out, lse = mla_decode_reference(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, head_dim_v=8,
                                    causal=True)
    # Request 0 has no key; request 1 (2 keys, s_q 4) leaves query tokens 0 and 1 without a key.
    assert (out[0] == 0).all() and torch.isposinf(lse[0]).all()
    assert (out[1, :2] == 0).all() and torch.isposinf(lse[1, :, :2]).all()
    assert torch.isfinite(lse[1, :, 2:]).all() and (out[1, 2:] != 0).any()


def test_partial_uses_negative_infinity_for_rows_without_keys():
    prob = make_decode_problem([65], s_q=4, h_q=2, head_dim=8, dtype=torch.float32, seed=6)
    # Keys [64, 65): with causal, only query token 3 sees key 64.
    o, lse = request_partial(prob.q, prob.k_cache, prob.block_table, 65, 0, 64, 128, head_dim_v=8, causal=True)
    assert torch.isneginf(lse[:, :3]).all() and (o[:3] == 0).all()
    assert torch.isfinite(lse[:, 3]).all()


def test_default_softmax_scale_is_one_over_sqrt_576():
    assert default_softmax_scale() == pytest.approx(576 ** -0.5)
    prob = make_decode_problem([30], h_q=4, dtype=torch.float32, seed=7)
    a = mla_decode_reference(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens)
    b = mla_decode_reference(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, softmax_scale=576 ** -0.5)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("mutate, match", [
    (lambda p: p.__setattr__("block_table", p.block_table[:, :1]), "block_table has 1 pages"),
    (lambda p: p.__setattr__("cache_seqlens", torch.tensor([-1, 5], dtype=torch.int32)), "is negative"),
    (lambda p: p.__setattr__("q", p.q[..., :100]), "head dims differ"),
    (lambda p: p.__setattr__("cache_seqlens", p.cache_seqlens[:1]), "cache_seqlens"),
    (lambda p: p.__setattr__("q", p.q[:, 0]), r"q must be \[b, s_q, h_q, d\]"),
    (lambda p: p.__setattr__("k_cache", p.k_cache.repeat(1, 1, 3, 1)), r"h_q \(2\) must be a multiple of h_kv \(3\)"),
])
def test_reference_rejects_inconsistent_inputs(mutate, match):
    prob = make_decode_problem([100, 5], h_q=2, page_size=64, dtype=torch.float32)
    mutate(prob)
    with pytest.raises(ValueError, match=match):
        mla_decode_reference(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens)


@pytest.mark.parametrize("head_dim_v", [0, 577])
def test_reference_rejects_head_dim_v_outside_the_key(head_dim_v):
    prob = make_decode_problem([10], h_q=2, dtype=torch.float32)
    with pytest.raises(ValueError, match="head_dim_v must be in 1..576"):
        mla_decode_reference(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, head_dim_v=head_dim_v)


class TestCompareToReference:
    def setup_method(self):
        gen = torch.Generator().manual_seed(8)
        self.out = torch.randn(2, 1, 4, 512, generator=gen)
        self.lse = torch.randn(2, 4, 1, generator=gen) + 5
        self.lse[1] = float("inf")
        self.out[1] = 0

    def test_identical_passes(self):
        c = compare_to_reference(self.out.bfloat16(), self.lse, self.out, self.lse)
        assert c.ok, c.message

    def test_detects_out_error(self):
        bad = self.out.clone()
        bad[0, 0, 0, 0] += 0.5
        c = compare_to_reference(bad, self.lse, self.out, self.lse)
        assert not c.ok and "out off" in c.message and c.max_abs_out == pytest.approx(0.5)

    def test_detects_lse_error_and_empty_row_mismatch(self):
        bad = self.lse.clone()
        bad[0, 0, 0] += 1e-3
        assert "lse off" in compare_to_reference(self.out, bad, self.out, self.lse).message
        bad = self.lse.clone()
        bad[1, 0, 0] = 3.0
        assert "empty rows" in compare_to_reference(self.out, bad, self.out, self.lse).message

    def test_detects_nan_and_shape(self):
        bad = self.out.clone()
        bad[0, 0, 1, 3] = float("nan")
        assert "NaN" in compare_to_reference(bad, self.lse, self.out, self.lse).message
        assert "shape" in compare_to_reference(self.out[:1], self.lse, self.out, self.lse).message

    def test_detects_direction_error_through_cosine_distance(self):
        # Every element within rtol of the reference, but systematically off: the cosine check
        # is what catches a scaled/rotated output.
        bad = self.out * (1 + 0.01 * torch.sign(torch.randn(self.out.shape, generator=torch.Generator().manual_seed(9))))
        c = compare_to_reference(bad, self.lse, self.out, self.lse)
        assert not c.ok and "cosine" in c.message
