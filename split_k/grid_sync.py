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
"""
from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int32, Int64

from cutlass._mlir.dialects import llvm

FLIP = -2147483648  # 2^31 as a 32-bit pattern


def _load_acquire(addr: Int64) -> Int32:
    return Int32(llvm.inline_asm(Int32.mlir_type, [Int64(addr).ir_value()],
                                 "ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", has_side_effects=True))


def atomic_add_acq_rel(addr: Int64, value: Int32) -> Int32:
    """``atom.acq_rel.gpu.global.add.u32`` on the word at ``addr``: the value before the add."""
    return Int32(llvm.inline_asm(Int32.mlir_type, [Int64(addr).ir_value(), Int32(value).ir_value()],
                                 "atom.acq_rel.gpu.global.add.u32 $0, [$1], $2;", "=r,l,r", has_side_effects=True))


@cute.jit
def arrive(count_addr: Int64, expected: Int32, leader) -> Int32:
    """Count this CTA in (one thread; ``expected`` CTAs in the grid, ``leader`` true in exactly one).
    Returns the word's value before this arrival, for ``wait``."""
    add = Int32(1)
    if leader:
        add = Int32(FLIP) - (expected - 1)
    return atomic_add_acq_rel(count_addr, add)


@cute.jit
def wait(count_addr: Int64, before: Int32):
    """Spin until bit 31 of the word differs from ``before``'s: every CTA has arrived."""
    seen = _load_acquire(count_addr)
    while ((seen ^ before) & Int32(FLIP)) == Int32(0):
        seen = _load_acquire(count_addr)
