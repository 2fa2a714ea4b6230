"""Per-request readiness counters: the merge kernel starts a split request as soon as its chunks are stored.

Why: with programmatic dependent launch the merge grid is resident early, but its ``griddepcontrol.wait``
returns only once the whole decode grid has completed and flushed: 0.7-1.3 us after the last decode CTA's
stores on an H100 (``scripts/timeline.py``), and every request waits for the slowest CTA of the grid.
Here each merge CTA waits only for the chunks of its own request, on a counter the decode CTAs of that
request count up.

Where the counters live: the plan's reserved column ``READY_COLUMN`` (``split_k.planner``), on the row of
the part that begins the request's chunk 1 (every split request has one; the parts of a request's
continuation chunks are consecutive, so part ``p`` holding chunk ``j >= 1`` finds it at ``p - j + 1`` and
the part ending with chunk 0 at ``p + 1``). The planners write 0 there, and each decode returns it to 0:

- a decode CTA, once its stores are done (after a CTA barrier), adds 1 for each split request it holds a
  chunk of (``arrive``: ``red.release.gpu``), so after ``target = chunks x CTAs per part`` arrivals the low
  16 bits read ``target``;
- a merge CTA with work on the request polls the word (``ld.acquire.gpu``) until its low 16 bits reach
  ``target`` (``wait``), then adds ``2^16`` (``check_out``); the last of the request's ``m`` merge CTAs
  (its add returned ``m - 1`` in the high half) subtracts ``target + m x 2^16``, which returns the word
  to 0. Every merge CTA has polled by then, and the next decode's arrivals come after this merge grid
  has completed (its CTAs ``griddepcontrol.wait`` before their first global access).

So one plan must not serve two decodes at the same time (as for the in-grid merge's word,
``split_k.grid_sync``). Deadlock-free: the merge grid is launched only once every decode CTA has
started (the decode triggers its dependents at its start), so the CTAs a merge CTA waits for are
running and need no SM the merge holds.
"""
from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int32, Int64

from cutlass._mlir.dialects import llvm

MERGE_UNIT = 1 << 16  # a merge CTA's check-out; decode arrivals count in the low 16 bits
COUNT_MASK = MERGE_UNIT - 1


def _red_release_add(addr: Int64, value: Int32):
    llvm.inline_asm(None, [Int64(addr).ir_value(), Int32(value).ir_value()],
                    "red.release.gpu.global.add.u32 [$0], $1;", "l,r", has_side_effects=True)


def _load_acquire(addr: Int64) -> Int32:
    return Int32(llvm.inline_asm(Int32.mlir_type, [Int64(addr).ir_value()],
                                 "ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", has_side_effects=True))


def _atomic_add_relaxed(addr: Int64, value: Int32) -> Int32:
    return Int32(llvm.inline_asm(Int32.mlir_type, [Int64(addr).ir_value(), Int32(value).ir_value()],
                                 "atom.relaxed.gpu.global.add.u32 $0, [$1], $2;", "=r,l,r", has_side_effects=True))


def _nanosleep(ns: int):
    llvm.inline_asm(None, [], f"nanosleep.u32 {ns};", "", has_side_effects=True)


@cute.jit
def counter_part(part: Int32, chunk: Int32) -> Int32:
    """The plan row holding the counter of the request whose chunk ``chunk`` part ``part`` holds (the
    chunk begins the part when ``chunk >= 1``; chunk 0 of a split request ends it)."""
    p1 = part + 1
    if chunk >= 1:
        p1 = part - chunk + 1
    return p1


@cute.jit
def arrive(addr: Int64):
    """One decode CTA's chunk of the request is stored (one thread, after a CTA barrier that follows every
    store of the CTA: the release is cumulative)."""
    _red_release_add(addr, Int32(1))


@cute.jit
def wait(addr: Int64, target: Int32):
    """Spin (one thread) until ``target`` decode arrivals are counted; the caller's CTA barrier then orders
    every thread's reads of the partials after this acquire."""
    seen = _load_acquire(addr)
    while (seen & Int32(COUNT_MASK)) < target:
        _nanosleep(64)
        seen = _load_acquire(addr)


@cute.jit
def check_out(addr: Int64, target: Int32, merge_ctas: Int32):
    """A merge CTA is done waiting (one thread, after ``wait``); the last of the request's ``merge_ctas``
    returns the word to 0."""
    old = _atomic_add_relaxed(addr, Int32(MERGE_UNIT))
    if (old >> 16) == merge_ctas - 1:
        _red_release_add(addr, Int32(0) - (target + merge_ctas * Int32(MERGE_UNIT)))
