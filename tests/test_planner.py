"""split_k.planner: layout, coverage, balance (CPU only)."""
from __future__ import annotations

import random

import pytest
import torch

from split_k import planner
from split_k.planner import Chunk


def _check_plan(lengths, num_parts, block_n=64, fixed_cost=5):
    """Check every promise of the planner's docstring for one input; return the chunks."""
    metadata, num_splits = planner.plan(lengths, num_parts, block_n=block_n, fixed_cost=fixed_cost)
    b = len(lengths)
    assert metadata.dtype == torch.int32 and tuple(metadata.shape) == (num_parts, 8)
    assert num_splits.dtype == torch.int32 and tuple(num_splits.shape) == (b + 1,)
    assert (metadata[:, 5:] == 0).all(), "reserved fields must be 0"
    bounds = num_splits.tolist()
    assert bounds[0] == 0
    n_chunks = [bounds[r + 1] - bounds[r] for r in range(b)]
    assert all(n >= 1 for n in n_chunks)
    assert bounds[b] <= b + num_parts - 1 or b == 0, "workspace bound num_splits[b] <= b + num_parts - 1"

    parts = planner.part_chunks(metadata, lengths, block_n)
    blocks = [planner.n_blocks(n, block_n) for n in lengths]
    covered = [[0] * n for n in blocks]
    chunks_of = [[] for _ in range(b)]
    for part in parts:
        for c in part:
            assert 0 <= c.begin_block <= c.end_block <= blocks[c.req]
            for t in range(c.begin_block, c.end_block):
                covered[c.req][t] += 1
            chunks_of[c.req].append(c)
    for r in range(b):
        assert covered[r] == [1] * blocks[r], f"request {r}: every tile exactly once"
        chunks = chunks_of[r]
        assert len(chunks) == n_chunks[r], f"request {r}: num_splits says {n_chunks[r]} chunks"
        # Chunks are numbered 0..n-1 in tile order, by increasing part, with no empty chunk unless
        # the request itself is empty.
        assert [c.split for c in chunks] == list(range(len(chunks)))
        assert [c.part for c in chunks] == sorted(c.part for c in chunks)
        if blocks[r] == 0:
            assert chunks == [Chunk(chunks[0].part, r, 0, 0, 0)], "an empty request is one [0, 0) chunk"
        else:
            assert all(c.end_block > c.begin_block for c in chunks)

    # Balance.
    target, payload = planner.balance_budget(lengths, num_parts, block_n, fixed_cost)
    costs = [sum(planner.chunk_cost(c, fixed_cost) for c in part) for part in parts]
    nonempty = [p for p, part in enumerate(parts) if part]
    if nonempty:
        assert nonempty == list(range(len(nonempty))), "empty parts only at the tail"
    for p in range(len(nonempty), num_parts):
        assert metadata[p].tolist() == [0, 0, -1, 0, 0, 0, 0, 0]
    params = planner.aligned_params(blocks, num_parts, fixed_cost)
    balanced_meta, balanced_splits = planner.plan(lengths, num_parts, block_n=block_n, fixed_cost=fixed_cost,
                                                  aligned=False)
    if params is not None:
        _check_aligned(parts, blocks, n_chunks, costs, nonempty, payload, target, num_parts, fixed_cost, *params)
        if balanced_splits[-1] == b:  # the balanced plan splits nothing either: the same plan
            assert metadata.equal(balanced_meta) and num_splits.equal(balanced_splits)
        return parts
    assert metadata.equal(balanced_meta) and num_splits.equal(balanced_splits)
    assert max(costs) <= payload, f"a part costs {max(costs)} > ceil(total / parts) + fixed = {payload}"
    for p in nonempty[:-1]:
        assert costs[p] >= target, f"part {p} costs {costs[p]} < ceil(total / parts) = {target}"
    # No split when it fits: a request is split only if its whole remaining cost did not fit in
    # the budget left in the part where its first chunk lies.
    for r in range(b):
        if n_chunks[r] > 1:
            first = chunks_of[r][0]
            others = costs[first.part] - planner.chunk_cost(first, fixed_cost)
            whole = blocks[r] - first.begin_block + fixed_cost
            assert others + whole > payload, f"request {r} was split although it fitted"
    return parts


def _check_aligned(parts, blocks, n_chunks, costs, nonempty, payload, target, num_parts, fixed_cost, capacity,
                   chunk_tiles):
    """The aligned plan's promises (split_k/planner.py, "Aligned plans")."""
    assert payload <= capacity <= payload + fixed_cost
    assert capacity == min(max(payload, max(blocks) + fixed_cost), payload + fixed_cost)
    assert max(costs) <= capacity
    for r, nb in enumerate(blocks):
        if nb + fixed_cost <= capacity:
            assert n_chunks[r] == 1, f"request {r} fits a part: whole"
        else:
            k, c = planner.long_chunks(nb, chunk_tiles)
            assert n_chunks[r] == k >= 2 and c <= chunk_tiles and (k - 1) * c < nb <= k * c
    for p in nonempty:
        if any(n_chunks[c.req] > 1 for c in parts[p]):  # a long request's chunk is alone in its part
            # (beside empty requests, which hold nothing of a part when fixed_cost is 0)
            others = [c for c in parts[p] if n_chunks[c.req] == 1]
            assert len(others) == len(parts[p]) - 1, f"part {p} holds chunks of two split requests"
            assert all(blocks[c.req] == 0 and fixed_cost == 0 for c in others), f"part {p} mixes requests"
        if len(parts[p]) == 1 and n_chunks[parts[p][0].req] > 1:
            k, c = planner.long_chunks(blocks[parts[p][0].req], chunk_tiles)
            chunk = parts[p][0]
            assert (chunk.begin_block, chunk.end_block) == (chunk.split * c, min((chunk.split + 1) * c, k * c, blocks[chunk.req]))
    for p in nonempty[:-1]:  # a part is closed only where the next request did not fit in it
        nxt = parts[p + 1][0]
        if n_chunks[nxt.req] == 1 and n_chunks[parts[p][-1].req] == 1:
            assert costs[p] + planner.chunk_cost(nxt, fixed_cost) > capacity, f"part {p} closed early"
    # The smallest chunk size that fits: the one before it needs too many parts.
    candidates = planner.chunk_tile_candidates(target, fixed_cost)
    assert candidates[planner.BELOW_TARGET] == target and candidates[-1] == payload and chunk_tiles in candidates
    assert candidates[:planner.BELOW_TARGET] == [max(target - d, 1) for d in range(planner.BELOW_TARGET, 0, -1)]
    longs = [nb for nb in blocks if nb + fixed_cost > capacity]
    _, opened = planner.aligned_capacity(blocks, num_parts, fixed_cost)
    assert len(nonempty) == opened + sum(planner.long_chunks(nb, chunk_tiles)[0] - 1 for nb in longs) <= num_parts
    if not longs:  # nothing is cut: the size is target's (the sizes below it would fit trivially)
        assert chunk_tiles == target
    for smaller in candidates[:candidates.index(chunk_tiles)] if longs else []:
        assert opened + sum(planner.long_chunks(nb, smaller)[0] - 1 for nb in longs) > num_parts


def test_num_sm_parts_follows_flashmla_rule():
    assert planner.num_sm_parts(132, 16, 1) == 132          # one M tile per request
    assert planner.num_sm_parts(132, 128, 1) == 66          # two M tiles
    assert planner.num_sm_parts(132, 4 * 128, 1) == 16      # eight M tiles
    assert planner.num_sm_parts(132, 64, 2) == 66           # kv heads share the SMs
    assert planner.num_sm_parts(4, 512, 1) == 1             # never below one part
    for bad in [(0, 16, 1), (132, 0, 1), (132, 16, 0), (132.0, 16, 1), (True, 16, 1)]:
        with pytest.raises(ValueError):
            planner.num_sm_parts(*bad)


def test_plan_splits_a_request_that_does_not_fit():
    # blocks [2, 30], total cost 2 + 30 + 2 * 5 = 42, payload ceil(42 / 2) + 5 = 26: part 0 takes
    # request 0 (7) and 14 tiles of request 1 (14 + 5), part 1 the remaining 16 tiles (16 + 5).
    # (Request 1 is long, 35 > capacity 31, and would need two parts of its own after request 0's:
    # the aligned plan does not fit.)
    metadata, num_splits = planner.plan([100, 64 * 30], 2)
    assert metadata.tolist() == [[0, 0, 1, 14, 0, 0, 0, 0], [1, 14, 1, 30, 1, 0, 0, 0]]
    assert num_splits.tolist() == [0, 1, 3]


def test_whole_requests_instead_of_a_split():
    # blocks [2, 5], total cost 17, payload ceil(17 / 2) + 5 = 14. The balanced plan splits request 1
    # (part 0: request 0 and 2 tiles of request 1, part 1: the other 3); every request fits whole in a
    # part of 14, and two parts hold them, so each request gets its own part.
    metadata, num_splits = planner.plan([100, 300], 2, aligned=False)
    assert metadata.tolist() == [[0, 0, 1, 2, 0, 0, 0, 0], [1, 2, 1, 5, 1, 0, 0, 0]]
    assert num_splits.tolist() == [0, 1, 3]
    assert planner.aligned_capacity([2, 5], 2, 5) == (14, 2)
    assert planner.aligned_params([2, 5], 2, 5) == (14, 9)
    metadata, num_splits = planner.plan([100, 300], 2)
    assert metadata.tolist() == [[0, 0, 0, 2, 0, 0, 0, 0], [1, 0, 1, 5, 0, 0, 0, 0]]
    assert num_splits.tolist() == [0, 1, 2]


def test_whole_requests_capacity_up_to_fixed_cost_above_payload():
    # 64 requests of 16 tiles on 132 parts (b64 s1 h64, 1024 keys): payload ceil(64 * 21 / 132) + 5
    # = 16 < 21 = one request, 21 <= 16 + 5: one request per part, 64 parts, no split (the balanced
    # plan cuts 64 requests into 171 chunks).
    lengths = [1024] * 64
    assert planner.balance_budget(lengths, 132) == (11, 16)
    assert planner.aligned_capacity([16] * 64, 132, 5) == (21, 64)
    _, balanced = planner.plan(lengths, 132, aligned=False)
    assert balanced[-1] == 64 + 107
    parts = _check_plan(lengths, 132)
    assert [len(p) for p in parts] == [1] * 64 + [0] * 68
    # Whole requests that would need more parts than there are: balanced plan. Blocks [10, 10, 10]
    # on 2 parts: payload ceil(45 / 2) + 5 = 28 >= 15, but 15 + 15 > 28: three parts.
    assert planner.aligned_capacity([10, 10, 10], 2, 5) == (28, 3)
    assert planner.aligned_params([10, 10, 10], 2, 5) is None
    _check_plan([640] * 3, 2)
    assert planner.aligned_params([10, 10, 10], 3, 5) == (20, 15)
    assert planner.aligned_params([], 4, 5) is None


def test_long_requests_split_evenly_one_part_per_chunk():
    # b32 s1 h128 4096 keys: 64 tiles each on 66 parts; payload ceil(32 * 69 / 66) + 5 = 39. The
    # balanced plan cuts each request into 34 + 30 tiles; the aligned one into 32 + 32.
    lengths = [4096] * 32
    _, balanced = planner.plan(lengths, 66, aligned=False)
    assert planner.aligned_params([64] * 32, 66, 5) == (44, 32)  # target 34: 2 chunks of 32 either way
    parts = _check_plan(lengths, 66)
    assert [[c.end_block - c.begin_block for c in p] for p in parts] == [[32]] * 64 + [[]] * 2
    # b32 s2 h64 16384 keys: target ceil(32 * 261 / 66) = 127 tiles would cut 256 into 3 chunks (96
    # parts); 128 (within fixed_cost above target) gives 2 chunks of 128.
    assert planner.aligned_params([256] * 32, 66, 5) == (137, 128)
    _check_plan([16384] * 32, 66)
    # b32 s1 h16 4096: 132 parts, target 17: 4 chunks of 16, not 3 of 22.
    assert planner.long_chunks(64, 17) == (4, 16)
    parts = _check_plan([4096] * 32, 132)
    assert sum(1 for p in parts if p) == 128
    # Chunk sizes as even as whole tiles allow, never an empty last chunk (9 tiles in 4 chunks of at
    # most 3 would leave the last one empty: 3 chunks of 3).
    assert planner.long_chunks(9, 3) == (3, 3) and planner.long_chunks(10, 3) == (4, 3)
    assert planner.long_chunks(65, 34) == (2, 33)


def test_long_and_whole_requests_together():
    # One long request among short ones: the long one closes the part it meets and takes parts of its
    # own; the short ones are packed whole around it.
    lengths = [640, 640, 64 * 100, 640, 0, 640]
    blocks = [planner.n_blocks(n) for n in lengths]
    assert planner.aligned_params(blocks, 8, 5) is not None
    parts = _check_plan(lengths, 8)
    # blocks [10, 10, 100, 10, 0, 10]: payload ceil(170 / 8) + 5 = 27, capacity 32, target 22: the
    # long request closes part 0 and takes 5 parts of 20 tiles; then 15 + 5 fit a part, 15 more do not.
    assert [[(c.req, c.end_block - c.begin_block) for c in p] for p in parts] == (
        [[(0, 10), (1, 10)]] + [[(2, 20)]] * 5 + [[(3, 10), (4, 0)], [(5, 10)]])
    # Too many parts for the aligned plan: the balanced plan stands.
    # Three requests of 300 tiles on 4 parts: payload ceil(915 / 4) + 5 = 234, each long request needs
    # 2 parts of at most 229..234 tiles: 6 parts.
    assert planner.aligned_params([300, 300, 300], 4, 5) is None
    _check_plan([64 * 300] * 3, 4)


def test_chunk_tile_candidates():
    assert planner.chunk_tile_candidates(17, 5) == [15, 16, 17, 18, 19, 20, 21, 22]
    assert planner.chunk_tile_candidates(17, 0) == [15, 16, 17]
    assert planner.chunk_tile_candidates(17, 1) == [15, 16, 17, 18]
    assert planner.chunk_tile_candidates(4, 100) == [2, 3, 4, 24, 44, 64, 84, 104]
    assert planner.chunk_tile_candidates(1, 5) == [1, 1, 1, 2, 3, 4, 5, 6]  # never below one tile
    assert planner.chunk_tile_offsets(5) == [-2, -1, 0, 1, 2, 3, 4, 5]


def test_aligned_plan_fills_parts_below_target():
    # b8 s1 h64 4096 keys on 132 parts: target 5 tiles would cut each 64-tile request into 13 chunks
    # (104 parts); 4 tiles makes 16 chunks each, 128 parts.
    meta, splits = planner.plan([4096] * 8, 132)
    assert int(splits[-1]) == 128
    assert max(int(r[3]) - int(r[1]) for r in meta.tolist() if r[0] == r[2]) == 4
    # Whole requests are untouched: 64 requests of 16 tiles stay one chunk each.
    _, splits = planner.plan([1024] * 64, 132)
    assert int(splits[-1]) == 64


def test_plan_does_not_split_when_only_the_fixed_cost_would_fit():
    # payload ceil(17 / 3) + 5 = 11: after request 0 (7) only 4 <= fixed cost is left, so part 0
    # stops instead of taking an empty chunk; part 2 stays empty.
    metadata, num_splits = planner.plan([100, 300], 3)
    assert metadata.tolist() == [[0, 0, 0, 2, 0, 0, 0, 0], [1, 0, 1, 5, 0, 0, 0, 0], [0, 0, -1, 0, 0, 0, 0, 0]]
    assert num_splits.tolist() == [0, 1, 2]


def test_one_part_never_splits():
    metadata, num_splits = planner.plan([5000, 0, 17], 1)
    assert metadata.tolist() == [[0, 0, 2, 1, 0, 0, 0, 0]]
    assert num_splits.tolist() == [0, 1, 2, 3]


def test_empty_batch_gives_empty_parts():
    metadata, num_splits = planner.plan([], 4)
    assert metadata.tolist() == [[0, 0, -1, 0, 0, 0, 0, 0]] * 4
    assert num_splits.tolist() == [0]


def test_zero_length_requests_at_part_boundaries():
    # Zero-length requests cost only the fixed overhead; they land whole in exactly one part.
    _check_plan([0, 0, 0], 3)
    _check_plan([64 * 10, 0, 64 * 10, 0], 4)
    _check_plan([0] * 7, 2, fixed_cost=0)


@pytest.mark.parametrize("seed", range(300))
def test_random_lengths_cover_every_tile_once_within_balance(seed):
    rng = random.Random(seed)
    b = rng.choice([1, 2, 3, 7, 16, 64, 128])
    zeros = rng.random() < 0.5
    long_tail = rng.random() < 0.3
    lengths = []
    for _ in range(b):
        if zeros and rng.random() < 0.25:
            lengths.append(0)
        elif long_tail and rng.random() < 0.1:
            lengths.append(rng.randint(10_000, 70_000))
        else:
            lengths.append(rng.randint(1, 5000))
    num_parts = rng.choice([1, 2, 5, 16, 33, 66, 132])
    fixed_cost = rng.choice([0, 1, 5, 5, 5])
    block_n = rng.choice([64, 64, 64, 16])
    _check_plan(lengths, num_parts, block_n=block_n, fixed_cost=fixed_cost)


def test_splitting_happens_for_small_batches():
    # A single long request is spread over the parts: each takes payload - fixed = ceil(1005 / 132)
    # = 8 tiles (every chunk pays the fixed cost), so 1000 tiles use ceil(1000 / 8) = 125 of 132.
    parts = _check_plan([64 * 1000], 132)
    assert sum(1 for p in parts if p) == 125
    assert all(len(p) == 1 and p[0].end_block - p[0].begin_block == 8 for p in parts[:125])


def test_plan_is_deterministic_and_accepts_tensors():
    lengths = [3, 0, 999, 4096, 1]
    a = planner.plan(lengths, 7)
    b = planner.plan(torch.tensor(lengths, dtype=torch.int32), 7)
    c = planner.plan(torch.tensor(lengths, dtype=torch.int64), 7)
    for x in (b, c):
        assert torch.equal(a[0], x[0]) and torch.equal(a[1], x[1])


@pytest.mark.parametrize("args, match", [
    (([5, -1], 4), r"seqlens\[1\] = -1 is negative"),
    (([5, 2.0], 4), r"seqlens\[1\] must be an int"),
    ((torch.tensor([5.0]), 4), "integer tensor"),
    ((torch.tensor([[5]]), 4), "1-D"),
    (([5], 0), "num_parts"),
    (([5], 2.5), "num_parts"),
])
def test_plan_rejects_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        planner.plan(*args)


@pytest.mark.parametrize("kwargs, match", [(dict(block_n=0), "block_n"), (dict(fixed_cost=-1), "fixed_cost")])
def test_plan_rejects_bad_knobs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        planner.plan([5], 2, **kwargs)


def test_host_lengths_names_the_argument():
    with pytest.raises(ValueError, match=r"cache_seqlens\[0\] = -2"):
        planner.host_lengths([-2], "cache_seqlens")


def test_workspace_shapes():
    assert planner.workspace_shapes(3, 66, 128) == ((69, 128, 512), (69, 128))


# ------------------------------------------------------------------------------ split clusters

def test_split_cluster_setting_and_groups(monkeypatch):
    monkeypatch.delenv(planner.SPLIT_CLUSTER_ENV_VAR, raising=False)
    assert planner.split_cluster_setting() == 1 and planner.split_cluster(1, 132) == 1  # off by default
    for text, size in (("0", 1), ("off", 1), (" 1 ", 1), ("4", 4), ("8", 8), ("2", 2)):
        assert planner.split_cluster_setting(text) == size
    for bad in ("3", "16", "auto", "yes"):
        with pytest.raises(ValueError, match="MLA_SPLIT_CLUSTER must be"):
            planner.split_cluster_setting(bad)
    monkeypatch.setenv(planner.SPLIT_CLUSTER_ENV_VAR, "8")
    assert planner.split_cluster(1, 132) == 8 and planner.split_cluster(1, 8) == 1  # no room for a group of 8
    # Groups that stay co-resident on a 132-SM H200 (measured: 15 clusters of 8, 30 of 4, 66 of 2).
    assert [planner.split_groups(132, c) for c in (1, 2, 4, 8)] == [132, 66, 30, 15]
    assert [planner.split_groups(66, c) for c in (2, 4, 8)] == [33, 15, 7]


@pytest.mark.parametrize("cluster", [2, 4, 8])
def test_plan_clustered_covers_every_tile_once(cluster):
    rng = random.Random(cluster)
    for _ in range(30):
        lengths = [rng.choice([0, 1, 63, 64, 65, 700, 4096, 20000]) for _ in range(rng.randint(1, 12))]
        parts = rng.choice([33, 66, 132])
        metadata, num_splits = planner.plan_clustered(lengths, parts, cluster)
        groups = planner.split_groups(parts, cluster)
        assert tuple(metadata.shape) == (parts, 8)
        assert (metadata[groups:, planner.END_REQ] == -1).all() and (metadata[groups:, :2] == 0).all()
        # The first rows are a plan of `groups` parts in units of `cluster` tiles: _check_plan checks
        # it exactly as a plain plan (coverage, chunk numbering, workspace bound, balance).
        want_meta, want_splits = planner.plan(lengths, groups, block_n=64 * cluster)
        assert torch.equal(metadata[:groups], want_meta) and torch.equal(num_splits, want_splits)
        _check_plan(lengths, groups, block_n=64 * cluster)


def test_clustered_plan_executes_to_the_reference():
    from mla.reference import mla_decode_reference, split_decode_reference
    from mla.testing import make_decode_problem

    prob = make_decode_problem([700, 0, 3, 1500], h_q=16)
    metadata, num_splits = planner.plan_clustered(prob.cache_seqlens.tolist(), 33, 4)
    out, lse, _, _ = split_decode_reference(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, metadata,
                                            num_splits, block_n=256)
    ref_out, ref_lse = mla_decode_reference(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse)
