"""The split planner on the GPU (CuTe DSL): ``tile_scheduler_metadata`` and ``num_splits`` from
``cache_seqlens`` without a host synchronisation.

It writes exactly what ``split_k.planner.plan(lengths, num_parts)`` returns (the layout and the
balance rule are documented there; that host function stays the reference), so the decode kernel
cannot tell which planner ran. ``num_parts`` is known on the host (``planner.num_sm_parts``), so the
output shapes are too, and nothing has to be read back.

The host planner fills parts one after the other, so the plan is a serial scan; what is truly serial
in it is only the budget left in the current part when each request starts. One CTA of ``THREADS``
threads, four phases, barriers in between:

1. all threads load the lengths (coalesced, ``LOADS_IN_FLIGHT`` per thread at once), store their
   KV tile counts in shared memory (``sBlocks``) and reduce the total, which fixes
   ``target = ceil(total / num_parts)`` and ``payload = target + fixed_cost``;
2. thread 0 walks the requests in order and stores the budget each one starts with (``sBudgets``).
   One step is ``budget - cost`` and two selects (see ``_walk_step``): a request that does not fit
   continues in fresh parts of ``target`` tiles each, so the budget after it is
   ``(budget - cost) mod target``; the division is a rare branch, the tile counts are loaded two
   requests ahead, and the arithmetic is 32-bit whenever ``payload < CAP`` (64-bit otherwise);
3. all threads, each on a contiguous run of requests, derive from its start budget what a request
   does (``_request_plan``: close the part first? split? into how many new parts?); a block-wide
   exclusive scan of (parts opened, chunks) gives each request the index of the parts it opens,
   whose begins ``(req, block, split)`` go to shared memory, and its ``num_splits`` entry;
4. all threads write one metadata row per part: a part ends where the next one begins (after the
   previous request when the next one begins at block 0), the last used part ends after the last
   request, and parts that got no work are ``[0, 0, -1, 0, 0, 0, 0, 0]``.

Cost: everything but phase 2 is parallel; the walk's loop body is about 20 SASS instructions with
a dependency chain of a few integer ops (read from the SASS, not yet measured), so it grows by some
tens of cycles per request: a few microseconds at b = 128, tens at b in the thousands.
``python -m perf_table planner`` measures it.

``kernel_model`` is the same algorithm in plain Python, phase by phase; the CPU tests check it
against the host planner on many inputs, the GPU tests check the kernel against the host planner.

Limits (``check_limits`` raises ``ValueError`` on the host before any launch): ``b <= MAX_BATCH``
(two int32 per request in shared memory) and ``num_parts <= MAX_PARTS`` (one begin record per part).
Budgets are exact for any int32 lengths (64-bit walk when needed). ``block_n >= MIN_BLOCK_N``.

What a device planner cannot do without reading the lengths back: reject a negative length (it is
planned as 0; the host planner raises) or know the longest sequence (``mla`` skips its block_table
width check for device plans; FlashMLA never checks it).
"""
from __future__ import annotations

import os
from typing import Sequence

# mla imports this module (for check_limits) before pipelines.launch; never let the DSL default to
# another arch on a machine without a GPU.
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import cuda.bindings.driver as cuda  # noqa: E402
import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Int32, Int64  # noqa: E402

from .planner import (BEGIN_BLOCK, BEGIN_REQ, BEGIN_SPLIT, BLOCK_N, END_BLOCK, END_REQ,  # noqa: E402
                      FIXED_COST, METADATA_WIDTH)

THREADS = 256
NUM_WARPS = THREADS // 32
LOADS_IN_FLIGHT = 8
"""Lengths each thread loads before using any (phase 1)."""
MAX_BATCH = 16384
"""Largest batch the kernel plans: two int32 values per request in shared memory (128 KiB)."""
MAX_PARTS = 1024
"""Largest ``num_parts``: three int32 begin fields per part in shared memory (12 KiB). A plan has at
most one part per SM (``planner.num_sm_parts``), so this only binds for an explicit huge
``num_sms``."""
CAP = 1 << 30
"""Budgets are kept exact in 64 bits during the walk and stored clamped to ``CAP`` for phase 3: every
decision there compares a budget with a request's cost (< CAP) or the fixed cost, which clamping
preserves; a budget below a cost is below CAP and so stored exactly."""
MIN_BLOCK_N = 4
"""Tile counts of int32 lengths stay below 2^29 for ``block_n >= 4``, which ``CAP`` relies on."""


def check_limits(batch_size: int, num_parts: int) -> None:
    """Raise ``ValueError`` when the kernel cannot plan this problem (before any launch)."""
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    if batch_size > MAX_BATCH:
        raise ValueError(f"the device planner handles batches of up to {MAX_BATCH} requests, got "
                         f"cache_seqlens of {batch_size}; plan on the host (planner='host') instead")
    if num_parts > MAX_PARTS:
        raise ValueError(f"the device planner handles up to {MAX_PARTS} parts, got num_parts = {num_parts} "
                         f"(from num_sms); plan on the host (planner='host') instead")


def _check_knobs(block_n: int, fixed_cost: int) -> None:
    if isinstance(block_n, bool) or not isinstance(block_n, int) or block_n < MIN_BLOCK_N:
        raise ValueError(f"block_n must be an int >= {MIN_BLOCK_N} for the device planner, got {block_n!r}")
    if isinstance(fixed_cost, bool) or not isinstance(fixed_cost, int) or not 0 <= fixed_cost < (1 << 20):
        raise ValueError(f"fixed_cost must be an int in [0, 2^20) for the device planner, got {fixed_cost!r}")


def _wrap(x: int, target: int) -> int:
    """``x mod target`` for ``x < 0``: the budget left after a split whose rest needed several parts."""
    return x + (-x + target - 1) // target * target


def _walk_step(budget: int, cost: int, payload: int, target: int, fixed_cost: int) -> int:
    """Phase 2's step: the budget left after a request of ``cost`` that starts with ``budget`` left.

    Whole fit: ``budget - cost``. Otherwise the request fills the current part and continues in
    fresh parts of ``target`` tiles each (no waste: every chunk pays its fixed cost), so the budget
    left is ``(budget - cost) mod target``: ``budget - cost + target`` unless the rest needs more than
    one further part. When not even one tile fits (``budget <= fixed_cost``) the part is closed
    unused and the request starts over in a fresh part: ``(payload - cost)``, wrapped the same way.
    The kernel keeps only ``x`` and two selects on its serial chain; the wrap is a rare branch.
    """
    fresh = payload - cost
    if fresh < 0:
        fresh += target
    x = budget - cost
    nxt = x
    if x < 0:
        nxt = x + target if budget > fixed_cost else fresh
    if nxt < 0:  # the rest spans more than one further part
        nxt = _wrap(x if budget > fixed_cost else payload - cost, target)
    return nxt


def _request_plan(budget: int, nb: int, payload_c: int, target_c: int, fixed_cost: int):
    """Phase 3: what request ``r`` does from the (clamped) budget it starts with.

    Returns ``(waste, first, n_new)``: whether it closes the current part and opens a fresh one at
    block 0, how many tiles its first chunk takes when it is split (the chunk in the part where it
    starts), and how many parts it opens for its further chunks (0 when it fits whole).
    """
    cost = nb + fixed_cost
    waste = 0
    if cost > budget and budget <= fixed_cost:
        waste = 1
        budget = payload_c
    first = 0
    n_new = 0
    if cost > budget:
        first = budget - fixed_cost
        rest = nb - first
        n_new = 1
        if rest > target_c:
            n_new = (rest + target_c - 1) // target_c
    return waste, first, n_new


def kernel_model(lengths: Sequence[int], num_parts: int, block_n: int = BLOCK_N,
                 fixed_cost: int = FIXED_COST) -> tuple[list[list[int]], list[int]]:
    """The kernel's algorithm in plain Python, phase by phase (for the CPU tests).

    Returns ``(metadata rows, num_splits)`` as lists; must equal ``planner.plan`` for every input
    with ``block_n >= MIN_BLOCK_N``. Negative lengths are planned as 0, as the kernel does.
    """
    _check_knobs(block_n, fixed_cost)
    b = len(lengths)
    # Phase 1: tile counts and the budget.
    blocks = [(max(n, 0) + block_n - 1) // block_n for n in lengths]
    total = sum(blocks) + fixed_cost * b
    target = (total + num_parts - 1) // num_parts
    payload = target + fixed_cost

    # Phase 2: the serial walk; budgets[r] = budget left in the current part when request r starts.
    budgets = [0] * b
    budget = payload
    for r in range(b):
        budgets[r] = min(budget, CAP)
        budget = _walk_step(budget, blocks[r] + fixed_cost, payload, target, fixed_cost)

    # Phase 3: per request (in parallel on the GPU), parts opened and chunks; their exclusive prefix
    # sums give the index of the first part each request opens and its workspace rows.
    payload_c, target_c = min(payload, CAP), min(target, CAP)
    plans = [_request_plan(budgets[r], blocks[r], payload_c, target_c, fixed_cost) for r in range(b)]
    begin_req, begin_block, begin_split = [0] * num_parts, [0] * num_parts, [0] * num_parts
    num_splits = [0] * (b + 1)
    opened = chunks = 0  # exclusive prefix sums
    for r, (waste, first, n_new) in enumerate(plans):
        part = opened + 1  # part 0 begins at request 0; every other part is opened by some request
        if waste:
            if part < num_parts:
                begin_req[part], begin_block[part], begin_split[part] = r, 0, 0
            part += 1
        for k in range(n_new):
            if part < num_parts:
                begin_req[part], begin_block[part], begin_split[part] = r, first + k * target_c, k + 1
            part += 1
        opened += waste + n_new
        chunks += n_new + 1
        num_splits[r + 1] = chunks
    used = min(opened + 1, num_parts) if b > 0 else 0

    # Phase 4: rows from consecutive begins.
    rows = []
    for q in range(num_parts):
        row = [0] * METADATA_WIDTH
        row[END_REQ] = -1
        if q < used:
            next_req, next_block = b, 0
            if q + 1 < used:
                next_req, next_block = begin_req[q + 1], begin_block[q + 1]
            end_req, end_block = next_req, next_block
            if next_block == 0:  # the next part starts a request: this one ends with the previous request
                end_req, end_block = next_req - 1, blocks[next_req - 1]
            row[BEGIN_REQ], row[BEGIN_BLOCK], row[BEGIN_SPLIT] = begin_req[q], begin_block[q], begin_split[q]
            row[END_REQ], row[END_BLOCK] = end_req, end_block
        rows.append(row)
    return rows, num_splits


class SplitPlanner:
    """CuTe DSL planner kernel: ``(mSeqlens [b], mMetadata [num_parts, 8], mNumSplits [b + 1])``,
    all int32; ``b`` and ``num_parts`` are read from the tensor extents at run time. The caller
    checks ``check_limits`` first (the kernel indexes fixed-size shared memory)."""

    def __init__(self, block_n: int = BLOCK_N, fixed_cost: int = FIXED_COST):
        _check_knobs(block_n, fixed_cost)
        self.block_n = block_n
        self.fixed_cost = fixed_cost

    @cute.jit
    def __call__(self, mSeqlens: cute.Tensor, mMetadata: cute.Tensor, mNumSplits: cute.Tensor,
                 stream: cuda.CUstream):
        @cute.struct
        class SharedStorage:
            # +2: the walk loads the tile counts of requests r + 1 and r + 2 while it handles r.
            blocks: cute.struct.MemRange[Int32, MAX_BATCH + 2]
            budgets: cute.struct.MemRange[Int32, MAX_BATCH]
            begin_req: cute.struct.MemRange[Int32, MAX_PARTS]
            begin_block: cute.struct.MemRange[Int32, MAX_PARTS]
            begin_split: cute.struct.MemRange[Int32, MAX_PARTS]
            warp_total: cute.struct.MemRange[Int64, NUM_WARPS]
            warp_opened: cute.struct.MemRange[Int32, NUM_WARPS]
            warp_chunks: cute.struct.MemRange[Int32, NUM_WARPS]

        self.shared_storage = SharedStorage
        self.kernel(mSeqlens, mMetadata, mNumSplits).launch(
            grid=[1, 1, 1], block=[THREADS, 1, 1], smem=SharedStorage.size_in_bytes(), stream=stream)

    @cute.kernel
    def kernel(self, mSeqlens: cute.Tensor, mMetadata: cute.Tensor, mNumSplits: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        warp = tidx // 32
        lane = tidx % 32
        b = mSeqlens.shape[0]
        num_parts = mMetadata.shape[0]
        F = self.fixed_cost
        storage = cutlass.memory.SmemAllocator().allocate(self.shared_storage)
        sBlocks = storage.blocks.get_tensor(cute.make_layout(MAX_BATCH + 2))
        sBudgets = storage.budgets.get_tensor(cute.make_layout(MAX_BATCH))
        sBeginReq = storage.begin_req.get_tensor(cute.make_layout(MAX_PARTS))
        sBeginBlock = storage.begin_block.get_tensor(cute.make_layout(MAX_PARTS))
        sBeginSplit = storage.begin_split.get_tensor(cute.make_layout(MAX_PARTS))
        sWarpTotal = storage.warp_total.get_tensor(cute.make_layout(NUM_WARPS))
        sWarpOpened = storage.warp_opened.get_tensor(cute.make_layout(NUM_WARPS))
        sWarpChunks = storage.warp_chunks.get_tensor(cute.make_layout(NUM_WARPS))

        # Phase 1: tile counts into smem, and their total (64-bit: b * 2^25 tiles overflows int32).
        # LOADS_IN_FLIGHT loads per thread are issued before any is used (a guarded register array),
        # so a large batch pays the global latency once per group, not once per request.
        local = Int64(0)
        rLen = cute.make_rmem_tensor(LOADS_IN_FLIGHT, Int32)
        for base in cutlass.range(tidx, b, THREADS * LOADS_IN_FLIGHT, unroll=1):
            for i in cutlass.range_constexpr(LOADS_IN_FLIGHT):
                rLen[i] = Int32(0)
                if base + i * THREADS < b:
                    rLen[i] = mSeqlens[base + i * THREADS]
            for i in cutlass.range_constexpr(LOADS_IN_FLIGHT):
                n = cutlass.max(rLen[i], Int32(0))  # a negative length is planned as 0
                nb = Int32((Int64(n) + (self.block_n - 1)) // self.block_n)  # 64-bit: n + block_n - 1 may overflow
                if base + i * THREADS < b:
                    sBlocks[base + i * THREADS] = nb
                local += Int64(nb)  # 0 for the guarded-off slots
        local = cute.arch.warp_reduction_sum(local)
        if lane == 0:
            sWarpTotal[warp] = local
        cute.arch.sync_threads()
        # Every thread derives the budget itself (no broadcast barrier needed).
        total = Int64(F) * Int64(b)
        for w in cutlass.range_constexpr(NUM_WARPS):
            total += sWarpTotal[w]
        target = (total + Int64(num_parts) - 1) // Int64(num_parts)
        payload = target + F

        # Phase 2: thread 0 walks the requests; only the budget chain is serial. 32-bit arithmetic
        # (shorter dependency chain) whenever every budget fits; 64-bit otherwise.
        if tidx == 0:
            if payload < CAP:
                self._walk(Int32, sBlocks, sBudgets, b, payload, target)
            else:
                self._walk(Int64, sBlocks, sBudgets, b, payload, target)
        cute.arch.sync_threads()

        # Phase 3: each thread takes a contiguous run of requests; a block-wide exclusive scan of
        # (parts opened, chunks) places each request's part begins and num_splits entries.
        payload_c = Int32(cutlass.min(payload, Int64(CAP)))
        target_c = Int32(cutlass.min(target, Int64(CAP)))
        per_thread = (b + THREADS - 1) // THREADS
        lo = cutlass.min(tidx * per_thread, b)
        hi = cutlass.min(lo + per_thread, b)
        opened = Int32(0)
        chunks = Int32(0)
        for r in cutlass.range(lo, hi, unroll=1):
            waste, first, n_new = self._request_plan(sBudgets[r], sBlocks[r], payload_c, target_c)
            opened += waste + n_new
            chunks += n_new + 1
        own_opened = opened
        own_chunks = chunks
        # Warp inclusive scan, plus the totals of the warps before, minus the own run: exclusive.
        for i in cutlass.range_constexpr(5):
            up_opened = cute.arch.shuffle_sync_up(opened, 1 << i)
            up_chunks = cute.arch.shuffle_sync_up(chunks, 1 << i)
            if lane >= (1 << i):
                opened += up_opened
                chunks += up_chunks
        if lane == 31:
            sWarpOpened[warp] = opened
            sWarpChunks[warp] = chunks
        cute.arch.sync_threads()
        opened -= own_opened
        chunks -= own_chunks
        all_opened = Int32(0)
        for w in cutlass.range_constexpr(NUM_WARPS):
            if w < warp:
                opened += sWarpOpened[w]
                chunks += sWarpChunks[w]
            all_opened += sWarpOpened[w]
        if tidx == 0:
            mNumSplits[0] = Int32(0)
            if b > 0:  # part 0 begins at the first request
                sBeginReq[0] = Int32(0)
                sBeginBlock[0] = Int32(0)
                sBeginSplit[0] = Int32(0)
        for r in cutlass.range(lo, hi, unroll=1):
            waste, first, n_new = self._request_plan(sBudgets[r], sBlocks[r], payload_c, target_c)
            part = opened + 1  # parts other than 0 are opened by the request they begin in
            if waste == 1:
                if part < num_parts:
                    sBeginReq[part] = r
                    sBeginBlock[part] = Int32(0)
                    sBeginSplit[part] = Int32(0)
                part += 1
            blk = first
            for k in cutlass.range(n_new, unroll=1):
                if part < num_parts:
                    sBeginReq[part] = r
                    sBeginBlock[part] = blk
                    sBeginSplit[part] = k + 1
                part += 1
                blk += target_c
            opened += waste + n_new
            chunks += n_new + 1
            mNumSplits[r + 1] = chunks
        used = Int32(0)
        if b > 0:
            used = cutlass.min(all_opened + 1, num_parts)
        cute.arch.sync_threads()

        # Phase 4: one row per part, in parallel.
        for q in cutlass.range(tidx, num_parts, THREADS, unroll=1):
            begin_req = Int32(0)
            begin_block = Int32(0)
            begin_split = Int32(0)
            end_req = Int32(-1)
            end_block = Int32(0)
            if q < used:
                begin_req = sBeginReq[q]
                begin_block = sBeginBlock[q]
                begin_split = sBeginSplit[q]
                next_req = b
                next_block = Int32(0)
                if q + 1 < used:
                    next_req = sBeginReq[q + 1]
                    next_block = sBeginBlock[q + 1]
                end_req = next_req
                end_block = next_block
                if next_block == 0:  # the next part starts a request: this one ends with the previous one
                    end_req = next_req - 1
                    end_block = sBlocks[next_req - 1]
            mMetadata[q, BEGIN_REQ] = begin_req
            mMetadata[q, BEGIN_BLOCK] = begin_block
            mMetadata[q, END_REQ] = end_req
            mMetadata[q, END_BLOCK] = end_block
            mMetadata[q, BEGIN_SPLIT] = begin_split
            for i in cutlass.range_constexpr(BEGIN_SPLIT + 1, METADATA_WIDTH):
                mMetadata[q, i] = Int32(0)

    @cute.jit
    def _walk(self, ty: cutlass.Constexpr, sBlocks: cute.Tensor, sBudgets: cute.Tensor, b: Int32,
              payload64: Int64, target64: Int64):
        """Phase 2 in integer type ``ty``: ``sBudgets[r]`` = budget (clamped to CAP) when request r
        starts. The loop-carried chain is only ``x = budget - cost`` and two selects; the outcome of
        a fresh part and the rare multi-part wrap stay off it (see ``_walk_step``)."""
        F = self.fixed_cost
        payload = ty(payload64)
        target = ty(target64)
        budget = payload
        nb0 = sBlocks[0]
        nb1 = sBlocks[1]
        for r in cutlass.range(b, unroll=1):
            nb2 = sBlocks[r + 2]  # two requests ahead: the load latency hides behind the chain
            cost = ty(nb0 + F)
            fresh = payload - cost  # the outcome when a fresh part must be opened: off the chain
            if fresh < 0:
                fresh += target
            if cutlass.const_expr(ty is Int64):
                sBudgets[r] = Int32(cutlass.min(budget, Int64(CAP)))
            else:
                sBudgets[r] = budget
            x = budget - cost
            split = budget > F
            nxt = x
            if x < 0:
                nxt = fresh
                if split:
                    nxt = x + target
            if nxt < 0:  # the rest spans more than one further part (rare): x mod target
                base = payload - cost
                if split:
                    base = x
                nxt = self._wrap(base, target)
            budget = nxt
            nb0 = nb1
            nb1 = nb2

    @cute.jit
    def _wrap(self, x, target):
        """``x mod target`` for ``x < 0`` (the model's ``_wrap``)."""
        return x + (target - 1 - x) // target * target

    @cute.jit
    def _request_plan(self, budget: Int32, nb: Int32, payload_c: Int32, target_c: Int32):
        """``_request_plan`` of the model, on the device: ``(waste, first, n_new)`` as Int32."""
        F = self.fixed_cost
        cost = nb + F
        waste = Int32(0)
        if cost > budget:
            if budget <= F:
                waste = Int32(1)
                budget = payload_c
        first = Int32(0)
        n_new = Int32(0)
        if cost > budget:
            first = budget - F
            rest = nb - first
            n_new = Int32(1)
            if rest > target_c:
                n_new = (rest + target_c - 1) // target_c
        return waste, first, n_new
