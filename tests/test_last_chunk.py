"""CPU: the counts of the merge by a request's last chunk (``split_k.last_chunk``) on the planners' plans.

The kernel finds a split request's counts from the part and chunk index alone (``counter_row``: the part of the
request's chunk 1). These tests check, on random plans, that this row is the request's chunk 1's, that each
(request, m-block) count receives exactly one arrival per chunk (so the last of them reads ``n - 1``), that no two
requests share a count, and that the fields fit their words.
"""
from __future__ import annotations

import pytest

from mla.testing import plan_cases
from split_k import last_chunk, planner


def _arrivals(metadata, num_splits, m_blocks):
    """``{(row, column, shift): [(request, chunk, n), ...]}``: every arrival the kernel makes on this plan."""
    out = {}
    for part, row in enumerate(metadata):
        for r, chunk, n in last_chunk.split_chunks(row, num_splits):
            for m in range(m_blocks):
                out.setdefault(last_chunk.counter_slot(part, chunk, m), []).append((r, chunk, n))
    return out


@pytest.mark.parametrize("seed", range(3))
def test_counts_sit_in_the_chunk_one_row_and_see_every_chunk_once(seed):
    for case in plan_cases(seed, 40):
        metadata, num_splits = planner.plan_default(case.lengths, case.num_parts)
        meta = metadata.tolist()
        splits = num_splits.tolist()
        m_blocks = min(-(-case.s_q * case.h_q // 64), last_chunk.MAX_M_BLOCKS)
        arrivals = _arrivals(meta, splits, m_blocks)
        split_requests = {r for r in range(len(case.lengths)) if splits[r + 1] - splits[r] > 1}
        assert {a[0][0] for a in arrivals.values()} == split_requests
        for (row, column, shift), got in arrivals.items():
            r, _, n = got[0]
            assert all(g[0] == r for g in got), "two requests share a count"
            assert sorted(g[1] for g in got) == list(range(n)), (r, got)  # each chunk once
            assert meta[row][planner.BEGIN_REQ] == r and meta[row][planner.BEGIN_SPLIT] == 1
            assert column in last_chunk.COUNTER_COLUMNS and 0 <= shift <= 32 - last_chunk.FIELD_BITS
            assert n <= case.num_parts <= last_chunk.MAX_PARTS  # the count never reaches 2^FIELD_BITS
        # The planners leave the count words 0 (the protocol's starting state).
        assert all(meta[row][col] == 0 for row, col in last_chunk.counter_words(meta))


def test_fits():
    assert last_chunk.fits(2, 1) and last_chunk.fits(12, 1)
    assert not last_chunk.fits(13, 1)
    assert not last_chunk.fits(1, 2)  # several kv heads: the merge kernel


def test_slots_of_the_twelve_m_blocks_are_distinct():
    slots = {last_chunk.counter_slot(5, 2, m) for m in range(last_chunk.MAX_M_BLOCKS)}
    assert len(slots) == last_chunk.MAX_M_BLOCKS
    assert {row for row, _, _ in slots} == {4}
