"""A grid-wide barrier for the in-grid split-kv merge (``pipelines.skeleton``, ``DecodeEntry``).

Why: the split-kv merge as its own kernel costs a second launch on the host for every eager call
(about 2-3.5 us of a ~10 us call, docs/perf-notes.md) and its own grid's start and end on the GPU.
When every CTA of the decode grid is resident at once (one wave: the plan has at most one CTA per
SM, and the grid is launched *cooperatively*, so the driver refuses a grid that could not be), the
decode CTAs can wait for each other and merge the partials themselves.

Protocol (one thread per CTA calls these; the rest of the CTA is ordered by a CTA barrier around
them):
- ``count``: an int32 that is 0 between launches. Each CTA adds 1 when its partials are stored; the
  CTA that brings it to ``expected`` (the grid's CTA count) sets it back to 0 and then bumps ``gen``.
  So the word is 0 again when the grid completes, as the planners wrote it, and nothing has to be
  reset between decodes or graph replays.
- ``gen``: a generation word, any initial value: a waiter reads it before it arrives and waits until
  it changes. Only the last arriver writes it, after every CTA has arrived.
- Ordering: arrivals are ``atom.acq_rel.gpu`` (each CTA's stored partials are released with its
  arrival; the last arriver's acquire sees all of them), the bump is ``red.release.gpu`` after the
  reset, and waiters poll with ``ld.acquire.gpu``. A CTA that has nothing to merge arrives and leaves.

The words must not be shared by two decodes that run at the same time (they are the plan's reserved
column and the workspace's last word; the workspace is already one decode's at a time).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from cutlass._mlir.dialects import llvm


def _load(addr: Int64, sem: str) -> Int32:
    return Int32(llvm.inline_asm(Int32.mlir_type, [Int64(addr).ir_value()],
                                 f"ld.{sem}.gpu.global.b32 $0, [$1];", "=r,l", has_side_effects=True))


def _atomic_add_acq_rel(addr: Int64, value: Int32) -> Int32:
    return Int32(llvm.inline_asm(Int32.mlir_type, [Int64(addr).ir_value(), Int32(value).ir_value()],
                                 "atom.acq_rel.gpu.global.add.u32 $0, [$1], $2;", "=r,l,r", has_side_effects=True))


def _store_relaxed(addr: Int64, value: Int32) -> None:
    llvm.inline_asm(None, [Int64(addr).ir_value(), Int32(value).ir_value()],
                    "st.relaxed.gpu.global.b32 [$0], $1;", "l,r", has_side_effects=True)


def _add_release(addr: Int64, value: Int32) -> None:
    llvm.inline_asm(None, [Int64(addr).ir_value(), Int32(value).ir_value()],
                    "red.release.gpu.global.add.u32 [$0], $1;", "l,r", has_side_effects=True)


@cute.jit
def arrive(count_addr: Int64, gen_addr: Int64, expected: Int32):
    """Count this CTA in (one thread, after a CTA barrier that follows the CTA's global stores).
    Returns ``(gen, last)``: the generation to wait on and whether this CTA was the last to arrive
    (then every CTA has arrived, and it must not wait)."""
    gen = _load(gen_addr, "relaxed")  # before the arrival: the release below orders it first
    old = _atomic_add_acq_rel(count_addr, Int32(1))
    last = old == expected - 1
    if last:
        _store_relaxed(count_addr, Int32(0))
        _add_release(gen_addr, Int32(1))
    return gen, last


@cute.jit
def wait(gen_addr: Int64, gen: Int32):
    """Spin until the generation moves past ``gen`` (one thread; a CTA barrier after it)."""
    seen = _load(gen_addr, "acquire")
    while seen == gen:
        seen = _load(gen_addr, "acquire")


@cute.jit
def arrive_flip(count_addr: Int64, expected: Int32, leader) -> Int32:
    """The one-word form (an A/B of ``arrive``): each launch adds exactly 2^31 to ``count`` (the leader
    CTA ``2^31 - (expected - 1)``, every other 1), so bit 31 flips exactly when the last CTA arrives,
    with no reset and no second word; the word alternates between 0 and 2^31 from decode to decode.
    Returns the value before this arrival (``wait_flip`` waits for its bit 31 to change)."""
    add = Int32(1)
    if leader:
        add = Int32(-2147483648) - (expected - 1)  # 2^31 - (expected - 1) as a 32-bit pattern
    return _atomic_add_acq_rel(count_addr, add)


@cute.jit
def wait_flip(count_addr: Int64, before: Int32):
    """Spin until bit 31 of ``count`` differs from ``before``'s (every CTA arrived)."""
    seen = _load(count_addr, "acquire")
    while ((seen ^ before) & Int32(-2147483648)) == Int32(0):
        seen = _load(count_addr, "acquire")
