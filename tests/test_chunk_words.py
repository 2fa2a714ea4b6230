"""The chunk words' rows (split_k.grid_sync, "Chunk words"): for every split request of a plan, the
decode CTAs of all its chunks and the merge CTAs of all its slots name one row, the part where its chunk 1
begins, and no two requests share a row. CPU only: the kernels compute the same rows
(``MLADecodeBase.chunk_word_rows``, ``SplitMerge.merge_slot``); the GPU tests run them."""
import pytest

from mla import testing
from split_k import grid_sync, planner
from split_k.planner import BEGIN_REQ, BEGIN_SPLIT

# Plans of at most 4096 requests and 2^24 keys: the rows' rule does not depend on the size, and the
# larger edge cases would only slow the host planner down.
CASES = [c for c in testing.plan_cases(seed=7, count=60) + testing.edge_plan_cases()
         if len(c.lengths) <= 4096 and max(c.lengths, default=0) <= 2**24]


def check_word_rows(metadata, num_splits):
    meta = [list(map(int, row)) for row in metadata.tolist()]
    ns = [int(x) for x in num_splits.tolist()]
    decode_rows, merge_rows = {}, {}
    for part, m in enumerate(meta):
        for r, row in grid_sync.decode_word_rows(meta, ns, part):
            decode_rows.setdefault(r, []).append(row)
        if m[BEGIN_SPLIT] >= 1:
            merge_rows.setdefault(m[BEGIN_REQ], set()).add(grid_sync.merge_word_row(part, m[BEGIN_SPLIT]))
    split = [r for r in range(len(ns) - 1) if ns[r + 1] - ns[r] > 1]
    assert sorted(decode_rows) == split and sorted(merge_rows) == split
    owners = {}
    for r in split:
        (row,) = merge_rows[r]  # every slot of the request names one row
        assert decode_rows[r] == [row] * (ns[r + 1] - ns[r])  # one count per chunk, all on that row
        assert 1 <= row < len(meta) and meta[row][BEGIN_REQ] == r and meta[row][BEGIN_SPLIT] == 1
        assert owners.setdefault(row, r) == r  # no two requests share a word


@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_word_rows(case, aligned):
    check_word_rows(*planner.plan(case.lengths, case.num_parts, aligned=aligned))


def test_word_rows_split_plan_exists():
    """The cases do split requests (else the test above would check nothing)."""
    metadata, num_splits = planner.plan([20000] + [64] * 31, 132)
    ns = num_splits.tolist()
    assert sum(b - a > 1 for a, b in zip(ns, ns[1:])) >= 1
    check_word_rows(metadata, num_splits)
