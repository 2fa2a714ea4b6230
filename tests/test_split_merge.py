"""Merge math, and planner + per-chunk reference + merge == unsplit reference (CPU only).

This proves the split plan and the merge math before any GPU: the kernels only have to compute
each chunk and the merge as ``mla.reference.split_decode_reference`` does.
"""
from __future__ import annotations

import random

import pytest
import torch

from mla.reference import mla_decode_reference, split_decode_reference
from mla.testing import make_decode_problem
from split_k import planner
from split_k.merge_ref import merge_partials, merge_workspace


def test_merge_equals_softmax_over_all_keys():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 100, generator=gen) * 4        # 3 rows, 100 keys
    values = torch.randn(100, 8, generator=gen)
    cuts = [0, 10, 11, 60, 100]
    o_parts, lse_parts = [], []
    for a, b in zip(cuts, cuts[1:]):
        s = scores[:, a:b]
        o_parts.append(torch.softmax(s, dim=-1) @ values[a:b])
        lse_parts.append(torch.logsumexp(s, dim=-1))
    o, lse = merge_partials(torch.stack(o_parts), torch.stack(lse_parts))
    torch.testing.assert_close(o, torch.softmax(scores, dim=-1) @ values, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1), atol=1e-6, rtol=1e-6)


def test_merge_ignores_partials_without_keys_even_if_they_hold_nan():
    o_parts = torch.tensor([[[1.0, 2.0]], [[float("nan"), float("nan")]], [[3.0, 4.0]]])
    lse_parts = torch.tensor([[0.0], [float("-inf")], [0.0]])
    o, lse = merge_partials(o_parts, lse_parts)
    torch.testing.assert_close(o, torch.tensor([[2.0, 3.0]]))
    torch.testing.assert_close(lse, torch.log(torch.tensor([2.0])))


def test_merge_of_only_empty_partials_is_zero_and_positive_infinity():
    o, lse = merge_partials(torch.full((2, 3, 4), float("nan")), torch.full((2, 3), float("-inf")))
    assert (o == 0).all() and torch.isposinf(lse).all()


def test_merge_survives_large_lse():
    # exp(1000) overflows fp32; the max shift must keep it finite.
    o, lse = merge_partials(torch.ones(2, 1, 1), torch.tensor([[1000.0], [1000.0]]))
    torch.testing.assert_close(lse, torch.tensor([1000.0 + torch.log(torch.tensor(2.0)).item()]))
    torch.testing.assert_close(o, torch.ones(1, 1))


@pytest.mark.parametrize("o_shape, lse_shape, lse_value, match", [
    ((2, 3, 4), (2, 3), float("inf"), r"\+inf"),
    ((2, 3, 4), (2, 3), float("nan"), "finite"),
    ((2, 3, 4), (2, 4), 0.0, "shape|must be"),
    ((0, 3, 4), (0, 3), 0.0, "at least one"),
])
def test_merge_rejects_bad_partials(o_shape, lse_shape, lse_value, match):
    with pytest.raises(ValueError, match=match):
        merge_partials(torch.zeros(o_shape), torch.full(lse_shape, lse_value))


def test_merge_workspace_checks_num_splits_length():
    with pytest.raises(ValueError, match="num_splits must have b \\+ 1 = 3 entries, got 2"):
        merge_workspace(torch.zeros(3, 2, 4), torch.zeros(3, 2), torch.tensor([0, 1], dtype=torch.int32),
                        torch.zeros(2, 1, 2, 4), torch.zeros(2, 2, 1))


def test_merge_workspace_leaves_unsplit_requests_alone_and_maps_rows():
    # Request 0: one chunk (untouched). Request 1: two chunks in workspace rows 1 and 2.
    b, s_q, h_q, dv = 2, 2, 3, 4
    o_accum = torch.randn(4, s_q * h_q, dv)
    lse_accum = torch.randn(4, s_q * h_q)
    out = torch.full((b, s_q, h_q, dv), 7.0)
    lse = torch.full((b, h_q, s_q), 7.0)
    merge_workspace(o_accum, lse_accum, torch.tensor([0, 1, 3], dtype=torch.int32), out, lse)
    assert (out[0] == 7).all() and (lse[0] == 7).all()
    o, row_lse = merge_partials(o_accum[1:3], lse_accum[1:3])
    # Workspace row s_idx * h_q + head <-> out[r, s_idx, head] and lse[r, head, s_idx].
    for s_idx in range(s_q):
        for head in range(h_q):
            row = s_idx * h_q + head
            torch.testing.assert_close(out[1, s_idx, head], o[row])
            torch.testing.assert_close(lse[1, head, s_idx], row_lse[row])


def _split_vs_unsplit(seqlens, s_q, h_q, causal, num_sms, seed, dtype=torch.bfloat16, h_kv=1):
    prob = make_decode_problem(seqlens, s_q=s_q, h_q=h_q, h_kv=h_kv, dtype=dtype, seed=seed)
    metadata, num_splits = planner.plan(seqlens, planner.num_sm_parts(num_sms, s_q * h_q // h_kv, h_kv))
    out, lse, o_accum, lse_accum = split_decode_reference(prob.q, prob.k_cache, prob.block_table,
                                                          prob.cache_seqlens, metadata, num_splits, causal=causal)
    ref_out, ref_lse = mla_decode_reference(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, causal=causal)
    torch.testing.assert_close(out, ref_out, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=2e-6, rtol=1e-6)
    return num_splits, lse_accum


@pytest.mark.parametrize("seed", range(12))
def test_planned_split_and_merge_equals_unsplit_reference(seed):
    rng = random.Random(seed)
    b = rng.choice([1, 2, 3, 6])
    seqlens = [0 if rng.random() < 0.2 else rng.randint(1, 1500) for _ in range(b)]
    s_q = rng.choice([1, 2, 4])
    h_q = rng.choice([1, 3, 16, 63])
    num_splits, _ = _split_vs_unsplit(seqlens, s_q, h_q, causal=rng.random() < 0.5,
                                      num_sms=rng.choice([8, 33, 132]), seed=seed)
    assert num_splits[-1].item() >= b


def test_split_cases_really_split():
    num_splits, _ = _split_vs_unsplit([1500, 0, 700], 1, 16, causal=False, num_sms=132, seed=20)
    counts = (num_splits[1:] - num_splits[:-1]).tolist()
    assert counts[0] > 1 and counts[1] == 1 and counts[2] > 1


def test_chunk_whose_rows_see_no_key_merges_correctly():
    # seqlen 257 = 4 full tiles + a tile holding only key 256. With s_q = 4 causal, query token i
    # sees keys [0, 257 - (3 - i)), so tokens 0..2 see nothing in the last tile and its partial lse
    # is -inf for their rows. 5 parts with no fixed cost give every tile its own chunk.
    seqlens = [64 * 4 + 1]
    prob = make_decode_problem(seqlens, s_q=4, h_q=2, seed=21)
    metadata, num_splits = planner.plan(seqlens, 5, fixed_cost=0)
    assert num_splits.tolist() == [0, 5]
    out, lse, o_accum, lse_accum = split_decode_reference(prob.q, prob.k_cache, prob.block_table,
                                                          prob.cache_seqlens, metadata, num_splits, causal=True)
    last = lse_accum[4].view(4, 2)  # rows s_idx * h_q + head
    assert torch.isneginf(last[:3]).all() and torch.isfinite(last[3]).all()
    assert (o_accum[4].view(4, 2, 512)[:3] == 0).all()
    ref_out, ref_lse = mla_decode_reference(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, causal=True)
    torch.testing.assert_close(out, ref_out, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=2e-6, rtol=1e-6)


def test_split_reference_rejects_plans_that_break_the_contract():
    seqlens = [640, 640]
    prob = make_decode_problem(seqlens, h_q=2, seed=22)
    metadata, num_splits = planner.plan(seqlens, 4)
    args = (prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens)
    twice = metadata.clone()
    twice[1] = twice[0]  # part 1 repeats part 0's work
    with pytest.raises(ValueError, match="written twice"):
        split_decode_reference(*args, twice, num_splits)
    fewer = num_splits.clone()
    fewer[1:] -= 1  # request 0 claims one chunk fewer than the plan walks
    with pytest.raises(ValueError, match=r"chunk \d+ of request 0, which has \d+ chunks"):
        split_decode_reference(*args, metadata, fewer)
    more = num_splits.clone()
    more[1:] += 1  # request 0 claims one chunk more
    with pytest.raises(ValueError, match="chunks in num_splits"):
        split_decode_reference(*args, metadata, more)
    with pytest.raises(ValueError, match="prefix sum"):
        split_decode_reference(*args, metadata, num_splits[:-1])


@pytest.mark.parametrize("h_kv, h_q", [(2, 2), (2, 16), (3, 9), (8, 64)])
def test_split_reference_with_several_kv_heads(h_kv, h_q):
    # Every kv head walks the same plan; the workspace keeps out's row order for all of them.
    num_splits, lse_accum = _split_vs_unsplit([1500, 0, 700], 2, h_q, causal=True, num_sms=33, seed=23, h_kv=h_kv)
    assert lse_accum.shape[1] == 2 * h_q
    assert (num_splits[1:] - num_splits[:-1]).max() > 1  # something was really split


@pytest.mark.parametrize("seed", range(40))
def test_merge_kernel_units_cover_every_split_row_once(seed):
    """The merge kernel's slot/unit indexing (split_k.merge_kernel.unit_assignment, the kernel's
    rule in Python) covers every column of every row of every split request exactly once, and
    never an unsplit request, for random plans of every shape."""
    from split_k import merge_kernel, planner
    rng = random.Random(seed)
    b = rng.choice([1, 1, 2, 3, 8, 17, 64, 128, 300])
    lengths = [rng.choice([0, 1, 64, 65, 1000, 4096, 16384, rng.randrange(0, 70000)]) for _ in range(b)]
    rows = rng.choice([1, 16, 32, 64, 128, 256, 512])
    num_parts = rng.choice([1, 2, 7, 33, 66, 132])
    meta, splits = planner.plan(lengths, num_parts)
    max_loads = rng.choice([merge_kernel.LOADS_WIDE, merge_kernel.LOADS_NARROW])  # 16-bit, fp32 partials
    # The block table's capacity only sizes the grid and picks L: any value must cover the work.
    max_tiles = rng.choice([None, 1, 16, rng.randrange(1, 2000)])
    work = merge_kernel.unit_assignment(meta, splits, rows, max_loads, max_tiles)
    _assert_split_rows_merged_once(work, splits, rows)


def _assert_split_rows_merged_once(work, splits, rows):
    """``work`` (``unit_assignment``'s) reduces every (split request, row, 128-column chunk, split) exactly once
    and touches no unsplit request."""
    seen = {}
    n_of = {r: int(splits[r + 1] - splits[r]) for r in range(len(splits) - 1)}
    for items in work.values():
        for r, row, c0, nc, mine in items:
            for i in mine:
                key = (r, row, c0, i)
                assert key not in seen, f"split {key} merged twice"
                seen[key] = 1
    want = {(r, row, c, i) for r, n in n_of.items() if n > 1
            for row in range(rows) for c in range(0, 512, 128) for i in range(n)}
    assert set(seen) == want


def test_merge_grid_is_capped_and_still_covers_every_split_row_once():
    """At ``n_est`` 2 (big batches) the merge grid's ``Y`` would be a slot's units, 128 at 128 rows: about 8400
    CTAs, nearly all of which find nothing to merge where nothing is split. ``grid_y`` caps the grid at
    ``GRID_CTAS`` CTAs; the CTAs' grid-stride loop then takes several units each, and a plan that does split
    (long requests among short ones, so ``n_est`` stays 2 while they get 6 chunks each) is still merged exactly
    once per split row."""
    from split_k import merge_kernel, planner
    rows, parts, tiles = 128, 66, 64
    lengths = [tiles * 64] * 8 + [64] * 56
    assert merge_kernel.estimated_chunks(len(lengths), parts, tiles) == 2
    uncapped = merge_kernel.units_per_request(rows, 2, merge_kernel.LOADS_NARROW, merge_kernel.NARROW_WARPS)
    y = merge_kernel.grid_y(rows, len(lengths), parts, merge_kernel.LOADS_WIDE, tiles)
    assert y == merge_kernel.GRID_CTAS // parts < uncapped == 128
    assert parts * y <= merge_kernel.GRID_CTAS
    meta, splits = planner.plan(lengths, parts)
    n_of = [int(splits[r + 1] - splits[r]) for r in range(len(lengths))]
    assert max(n_of) >= 3  # split, with more slots than n_est assumed
    work = merge_kernel.unit_assignment(meta, splits, rows, merge_kernel.LOADS_WIDE, tiles)
    assert max(cta_y for _, cta_y in work) < y
    _assert_split_rows_merged_once(work, splits, rows)
    # Where Y is already small (few requests, many chunks each) the cap changes nothing.
    assert merge_kernel.grid_y(128, 1, 132, merge_kernel.LOADS_WIDE, 256) < merge_kernel.GRID_CTAS // 132


def test_merge_narrow_kernel_caps_warp_groups_at_its_warps():
    """The narrow kernel of 16-bit partials runs 4-warp CTAs (``NARROW_WARPS``): a request with more chunks
    than its estimate (a varlen plan) gets at most 4 warps per row-chunk, each taking several rounds, and
    every split row is still merged exactly once."""
    from split_k import merge_kernel, planner
    L, W = merge_kernel.LOADS_NARROW, merge_kernel.LOADS_WIDE
    assert merge_kernel.kernel_warps(L, W) == merge_kernel.NARROW_WARPS == 4
    assert merge_kernel.kernel_warps(W, W) == merge_kernel.kernel_warps(L, L) == merge_kernel.WARPS == 8
    assert merge_kernel.split_groups(100, L, 4) == 4 and merge_kernel.split_groups(100, L) == 8
    lengths = [300000] + [64] * 100  # one long request among many one-tile ones: n_est is small
    meta, splits = planner.plan(lengths, 132)
    n_of = [int(splits[r + 1] - splits[r]) for r in range(len(lengths))]
    assert n_of[0] > 4 * L  # more chunks than 4 warps take in one round
    assert merge_kernel.kernel_loads(len(lengths), 132, W, None, 64) == L
    work = merge_kernel.unit_assignment(meta, splits, 64, W)
    seen = [(r, row, c0, i) for items in work.values() for r, row, c0, _, mine in items for i in mine]
    assert len(seen) == len(set(seen))
    assert set(seen) == {(r, row, c, i) for r in range(len(lengths)) if n_of[r] > 1
                         for row in range(64) for c in range(0, 512, 128) for i in range(n_of[r])}
    assert max(len(mine) for items in work.values() for *_, mine in items) > L  # several rounds per warp


def test_merge_estimate_follows_the_planner_on_uniform_batches():
    """``estimated_chunks`` with the block table's capacity (what the merge sizes for and picks its
    loads per round from) lands on the same side of the 8- and 16-chunk thresholds (``LOADS_NARROW``,
    ``WIDE_ABOVE``: which kernel, how many warps per row-chunk) as the planner's real chunk count for
    batches of requests that fill the table; the estimate without the capacity did not at b8 with 512
    keys (16 estimated, 8 planned)."""
    from split_k import merge_kernel, planner
    for b in (1, 2, 3, 5, 8, 16, 32, 64, 128):
        for seqlen in (64, 512, 1024, 2048, 3000, 4096, 8192, 16384, 32768):
            for num_parts in (16, 33, 66, 132):
                _, splits = planner.plan([seqlen] * b, num_parts)
                planned = max(int(splits[r + 1] - splits[r]) for r in range(b))
                est = merge_kernel.estimated_chunks(b, num_parts, merge_kernel.capacity_tiles(-(-seqlen // 64), 64))
                for threshold in (merge_kernel.LOADS_NARROW, merge_kernel.WIDE_ABOVE):
                    assert (est > threshold) == (planned > threshold), (b, seqlen, num_parts, threshold)
                assert abs(est - max(planned, 2)) <= 2, (b, seqlen, num_parts, est, planned)
    assert merge_kernel.estimated_chunks(8, 132) == 16
    assert merge_kernel.estimated_chunks(8, 132, merge_kernel.capacity_tiles(8, 64)) == 8
    assert merge_kernel.kernel_loads(8, 132, merge_kernel.LOADS_WIDE, 8, rows=64) == merge_kernel.LOADS_NARROW
    assert merge_kernel.kernel_loads(8, 132, merge_kernel.LOADS_WIDE, 8, rows=16) == merge_kernel.LOADS_NARROW
    # b8 with 1024 keys: target 2 tiles would make 8 chunks of 2; the aligned plan's 1-tile chunks make 16.
    assert merge_kernel.estimated_chunks(8, 132, merge_kernel.capacity_tiles(16, 64)) == 16
    # 16 chunks: the narrow kernel from 64 rows (WIDE_ABOVE), the wide one below; 128 (b1 with 16384
    # keys): the wide one.
    assert merge_kernel.kernel_loads(1, 132, merge_kernel.LOADS_WIDE, 16, rows=64) == merge_kernel.LOADS_NARROW
    assert merge_kernel.kernel_loads(1, 132, merge_kernel.LOADS_WIDE, 16, rows=32) == merge_kernel.LOADS_WIDE
    assert merge_kernel.kernel_loads(1, 132, merge_kernel.LOADS_WIDE, 256, rows=128) == merge_kernel.LOADS_WIDE
