"""A grid-wide barrier for the in-grid split-kv merge (``pipelines.skeleton``, ``DecodeEntry``).

Why: the split-kv merge as its own kernel costs a second launch on the host for every eager call
(about 2.6 us of an ~11 us call on an H200, docs/perf-notes.md). When every CTA of the decode grid is
resident at once (one wave: the plan has at most one CTA per SM, and the grid is launched
*cooperatively*, so the driver refuses a grid that could not be), the decode CTAs can wait for each
other and merge the partials themselves: one launch per call.

Protocol: one 32-bit word, the plan's reserved ``tile_scheduler_metadata[0, GRID_COUNT_COLUMN]``,
whose low 31 bits are 0 between decodes (the planners write 0). One thread per CTA arrives, after a
CTA barrier that follows the CTA's global stores: the leader CTA adds ``2^31 - (n - 1)``, every other
CTA adds 1, so each decode adds exactly ``2^31``: bit 31 flips exactly when the last of the ``n`` CTAs
arrives, and the low bits are 0 again. Nothing is reset, no second word is needed, and the word
alternates between 0 and ``2^31`` from decode to decode. Arrivals are ``atom.acq_rel.gpu`` (they
release the CTA's stored partials); a CTA with merge work polls the word with ``ld.acquire.gpu``
until bit 31 differs from the value its own arrival returned; a CTA without merge work arrives and
leaves. (A two-word form that returned the word to 0, the last arriver resetting it and then bumping
a generation word, added about 0.5 us on an H200: one more fence and store on the path.)

The word must not be shared by two decodes that run at the same time: one plan serves one decode at
a time (as one workspace already does).

Chunk words (the merge kernel's wait per request, ``split_k.planner.MERGE_FLAG_COLUMN``): a split
request's word is ``tile_scheduler_metadata[q, 6]`` with ``q`` the part where its chunk 1 begins (the
part of chunk ``j`` is ``q + j - 1``: a decode CTA of part ``p`` holding chunk ``j`` uses ``q = p + 1 - j``,
also for chunk 0, which ends part ``q - 1``; a merge CTA of slot ``s`` in part ``p`` uses ``q = p - s``).
Its low 16 bits count the request's stored chunks: every decode CTA adds 1 per split chunk it holds
(``red.release.gpu`` after a CTA barrier that follows its stores), so the request is complete at ``n``
times the CTAs per chunk (m-blocks times kv heads). Each merge CTA with work polls with
``ld.acquire.gpu`` until then, adds ``2^16`` (its high 16 bits count the merge CTAs past the poll), and
the one whose add returns the count of all the others stores 0: every merge CTA of the request is past
its poll, and the next decode's arrivals come after this grid completes (the next decode's
griddepcontrol.wait), as do the next merge's polls (its launch follows that wait). So the word is 0
between decodes, as the planners wrote it, and the same rule as above holds: one plan, one decode at a
time.
"""
from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int32, Int64

from cutlass._mlir.dialects import llvm

FLIP = -2147483648  # 2^31 as a 32-bit pattern


def _load_acquire(addr: Int64) -> Int32:
    return Int32(llvm.inline_asm(Int32.mlir_type, [Int64(addr).ir_value()],
                                 "ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", has_side_effects=True))


def _atomic_add_acq_rel(addr: Int64, value: Int32) -> Int32:
    return Int32(llvm.inline_asm(Int32.mlir_type, [Int64(addr).ir_value(), Int32(value).ir_value()],
                                 "atom.acq_rel.gpu.global.add.u32 $0, [$1], $2;", "=r,l,r", has_side_effects=True))


@cute.jit
def arrive(count_addr: Int64, expected: Int32, leader) -> Int32:
    """Count this CTA in (one thread; ``expected`` CTAs in the grid, ``leader`` true in exactly one).
    Returns the word's value before this arrival, for ``wait``."""
    add = Int32(1)
    if leader:
        add = Int32(FLIP) - (expected - 1)
    return _atomic_add_acq_rel(count_addr, add)


@cute.jit
def wait(count_addr: Int64, before: Int32):
    """Spin until bit 31 of the word differs from ``before``'s: every CTA has arrived."""
    seen = _load_acquire(count_addr)
    while ((seen ^ before) & Int32(FLIP)) == Int32(0):
        seen = _load_acquire(count_addr)


def _red_release_add(addr: Int64, value: Int32):
    llvm.inline_asm(None, [Int64(addr).ir_value(), Int32(value).ir_value()],
                    "red.release.gpu.global.add.u32 [$0], $1;", "l,r", has_side_effects=True)


def _atomic_add_relaxed(addr: Int64, value: Int32) -> Int32:
    return Int32(llvm.inline_asm(Int32.mlir_type, [Int64(addr).ir_value(), Int32(value).ir_value()],
                                 "atom.relaxed.gpu.global.add.u32 $0, [$1], $2;", "=r,l,r", has_side_effects=True))


def _store_relaxed(addr: Int64, value: Int32):
    llvm.inline_asm(None, [Int64(addr).ir_value(), Int32(value).ir_value()],
                    "st.relaxed.gpu.global.b32 [$0], $1;", "l,r", has_side_effects=True)


CHUNK_MASK = 0xFFFF
CONSUMED_SHIFT = 16


@cute.jit
def chunk_arrive(word_addr: Int64):
    """One decode CTA's stored chunk of a split request (one thread, after a CTA barrier that follows
    the CTA's stores: the release orders them before the count)."""
    _red_release_add(word_addr, Int32(1))


@cute.jit
def chunk_wait(word_addr: Int64, target: Int32) -> Int32:
    """A merge CTA (one thread): spin until ``target`` chunks are counted on the request's word, then
    count this CTA as past its poll. Returns the word before that count (for ``chunk_release``)."""
    seen = _load_acquire(word_addr)
    while (seen & Int32(CHUNK_MASK)) < target:
        seen = _load_acquire(word_addr)
    return _atomic_add_relaxed(word_addr, Int32(1 << CONSUMED_SHIFT))


@cute.jit
def chunk_release(word_addr: Int64, before: Int32, consumers: Int32):
    """The last of the request's ``consumers`` merge CTAs past the poll returns the word to 0."""
    if ((before >> CONSUMED_SHIFT) & Int32(CHUNK_MASK)) == consumers - 1:
        _store_relaxed(word_addr, Int32(0))


def decode_word_rows(metadata, num_splits, part: int) -> list[tuple[int, int]]:
    """``(request, row)`` of each chunk word a decode CTA of plan part ``part`` counts on
    (``MLADecodeBase.chunk_word_rows`` in plain Python, for the CPU tests): lists or tensors of the plan."""
    from split_k.planner import BEGIN_REQ, BEGIN_SPLIT, END_REQ
    m = [int(x) for x in metadata[part]]
    ns = [int(x) for x in num_splits]
    words = []
    if m[BEGIN_REQ] <= m[END_REQ]:
        if ns[m[BEGIN_REQ] + 1] - ns[m[BEGIN_REQ]] > 1:
            words.append((m[BEGIN_REQ], part + 1 - m[BEGIN_SPLIT]))
        if m[END_REQ] > m[BEGIN_REQ] and ns[m[END_REQ] + 1] - ns[m[END_REQ]] > 1:
            words.append((m[END_REQ], part + 1))
    return words


def merge_word_row(part: int, begin_split: int) -> int:
    """The chunk-word row of the merge CTAs of plan part ``part`` (slot ``begin_split - 1``)."""
    return part - (begin_split - 1)
