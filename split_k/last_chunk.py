"""The split-kv merge by a request's last chunk (``chunk_merge`` on the decode kernels).

Why: the merge kernel runs after the whole decode grid, and its cost on the rows whose plans split many
requests is large beside the decode (``scripts/merge_tail.py``, H100, docs/perf-notes.md: 15-27 us of 480-500 at
b128 s2 h128 4096 with 29 split requests, 17-22 us of 240-260 on the b128 s1 h128 4096 varlen row). Here the CTA
that stores the last partial of a split request (whichever of its chunks finishes last) merges that request's
rows of its m-block right away, in the decode grid: no second launch, no wait for the slowest CTA, and the
partials it reads were just written (L2).

Protocol. Each (split request, m-block) has an 8-bit arrival count in the plan's reserved words: columns
``COUNTER_COLUMNS`` (5-7) of the plan row of the request's chunk 1 (``counter_row``: chunk ``j`` of a request
sits in part ``p``, and its chunk 1 begins part ``p - j + 1``, because every chunk after a request's first
begins the next part), field ``m_block`` of those 96 bits (``counter_slot``). The planners write 0 there, and
the count returns to 0 at the end of every decode, so a plan serves any number of decodes one after another
(not two at a time, as for its workspace). Once a CTA's partial of chunk ``j`` is stored (a barrier of the
storing threads first), one thread adds 1 to the field with ``atom.acq_rel.gpu``: the release covers the
partial; the thread that reads ``n - 1`` (the request has ``n`` chunks) is the last, takes the others'
partials with the same atomic's acquire, subtracts ``n`` (the field is 0 again) and its CTA merges the
m-block's rows (``SplitMerge.merge_rows``) after a second barrier. Exactly one CTA merges each (request,
m-block): the ``n`` arrivals on a field are ordered by its atomics.

Limits (``fits``): one kv head (an m-block is then a plain run of 64 rows of the merged ``[s_q * h_q]``), at
most ``MAX_M_BLOCKS`` m-blocks (12: 8-bit fields in three words), 16-bit partials; at launch at most
``MAX_PARTS`` plan parts (a request has at most ``num_parts`` chunks: the count must not reach 256, and the merge
must fit one row of each in shared memory) and an estimate of at most ``MAX_EST`` chunks per request. Elsewhere
the merge kernel runs.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from split_k import grid_sync
from split_k.planner import BEGIN_REQ, BEGIN_SPLIT, END_REQ, METADATA_WIDTH

COUNTER_COLUMNS = (5, 6, 7)
FIELD_BITS = 8
FIELDS_PER_WORD = 32 // FIELD_BITS
MAX_M_BLOCKS = len(COUNTER_COLUMNS) * FIELDS_PER_WORD
MAX_PARTS = 200
"""Most plan parts (so most chunks of one request): under the 8-bit count's 256, and one 16-bit partial row of
every chunk (1028 bytes with its weight) fits the seesaw's 229376 bytes of Q, K and P tiles (``merge_rows``)."""
MAX_EST = 3
"""Most chunks per request, as the merge kernel estimates them from the shapes (``n_est``), where the decode
merges by the last chunk: beyond it the merge kernel spreads a request over many CTAs, where one CTA here would
take several batches (``SplitMerge.merge_rows``). Measured on an H100 (docs/perf-notes.md, forty-fifth session):
b8 s1 h128 4096 (8 chunks) and b1 s1 h128 16384 (66) were 2x and 14x slower with the last chunk merging."""


def fits(num_m_blocks: int, h_kv: int, partial_bits: int = 16) -> bool:
    """Whether a decode kernel of ``num_m_blocks`` m-blocks and ``h_kv`` kv heads, with partials of
    ``partial_bits``, can merge by its last chunks (16-bit partials only: fp32 ones take twice the shared
    memory per row; the plan's part count and ``n_est`` are checked at launch)."""
    return h_kv == 1 and num_m_blocks <= MAX_M_BLOCKS and partial_bits == 16


def counter_row(part, chunk):
    """Plan row holding the counts of the request whose chunk ``chunk`` sits in part ``part`` (its chunk 1's
    part). Python ints or the DSL's Int32."""
    return part - chunk + 1


def counter_slot(part, chunk, m_block):
    """``(row, column, shift)``: the count of m-block ``m_block`` for that request is bits ``shift ..
    shift + 7`` of ``metadata[row, column]``."""
    return (counter_row(part, chunk), COUNTER_COLUMNS[0] + m_block // FIELDS_PER_WORD,
            (m_block % FIELDS_PER_WORD) * FIELD_BITS)


def split_chunks(meta_row, num_splits) -> list[tuple[int, int, int]]:
    """``[(request, chunk, n), ...]``: the chunks of split requests (``n > 1`` chunks) that a part of plan row
    ``meta_row`` holds: its first request's chunk (``begin_split``) and, if the part holds more than one
    request, its last request's chunk 0 (plain Python, for the CPU tests; the kernel does the same)."""
    begin_req, end_req, begin_split = int(meta_row[BEGIN_REQ]), int(meta_row[END_REQ]), int(meta_row[BEGIN_SPLIT])
    out = []
    if end_req >= begin_req:
        n = int(num_splits[begin_req + 1]) - int(num_splits[begin_req])
        if n > 1:
            out.append((begin_req, begin_split, n))
    if end_req > begin_req:
        n = int(num_splits[end_req + 1]) - int(num_splits[end_req])
        if n > 1:
            out.append((end_req, 0, n))
    return out


def counter_words(metadata) -> list[tuple[int, int]]:
    """Every ``(row, column)`` of the plan that holds counts (for the CPU tests)."""
    return [(row, col) for row in range(len(metadata)) for col in COUNTER_COLUMNS]


@cute.jit
def arrive(mMeta: cute.Tensor, part: Int32, chunk: Int32, m_block: Int32, n: Int32) -> Int32:
    """Count this CTA's stored partial of chunk ``chunk`` (of a request with ``n`` chunks, in part ``part``) for
    m-block ``m_block``; 1 if it was the last of the ``n``, which then owns the merge (and has reset the count),
    else 0. One thread, after a barrier of every thread that stored the partial."""
    row = counter_row(part, chunk)
    col = Int32(COUNTER_COLUMNS[0]) + m_block // FIELDS_PER_WORD
    shift = (m_block % FIELDS_PER_WORD) * FIELD_BITS
    addr = (mMeta.iterator + (Int64(row) * METADATA_WIDTH + Int64(col))).toint()
    before = grid_sync.atomic_add_acq_rel(addr, Int32(1) << shift)
    last = Int32(0)
    if ((before >> shift) & Int32((1 << FIELD_BITS) - 1)) == n - 1:
        last = Int32(1)
        grid_sync.atomic_add_acq_rel(addr, Int32(0) - (n << shift))
    return last


def applies(kernel_can: bool, num_parts: int, n_est: int) -> bool:
    """Whether a launch merges by the last chunks (``pipelines.launch.DecodeEntry``'s test, in plain Python):
    the kernel can (``can_merge_chunks``), the plan has at most ``MAX_PARTS`` parts, and the merge kernel's
    estimate ``n_est`` (``split_k.merge_kernel.estimated_chunks``) is at most ``MAX_EST``."""
    return bool(kernel_can) and num_parts <= MAX_PARTS and n_est <= MAX_EST
