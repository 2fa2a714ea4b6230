"""The split planner on the GPU (CuTe DSL): ``tile_scheduler_metadata`` and ``num_splits`` from
``cache_seqlens`` without a host synchronisation.

It writes exactly what ``split_k.planner.plan(lengths, num_parts)`` returns (the layout and the
balance rule are documented there; that host function stays the reference), so the decode kernel
cannot tell which planner ran. ``num_parts`` is known on the host (``planner.num_sm_parts``), so the
output shapes are too, and nothing has to be read back.

The host planner fills parts one after the other, so the plan is a serial scan; what is truly serial
in it is only the budget left in the current part when each request starts. One CTA of ``THREADS``
threads, five phases, barriers in between:

1. all threads load the lengths (coalesced, ``LOADS_IN_FLIGHT`` per thread at once), store each
   request's cost ``tiles + fixed_cost`` in shared memory and reduce the total and the longest
   request, which fix ``target = ceil(total / num_parts)``, ``payload = target + fixed_cost`` and
   the aligned plan's capacity ``min(max(payload, longest cost), payload + fixed_cost)``
   (``planner.aligned_capacity``);
1b. all threads store each request's ``cost_mod`` (its cost reduced modulo ``target`` into
   ``[F + 1, F + target]``; a division only for a request longer than a whole part), so that the
   walk never divides, and its share of a part in the aligned walk, ``min(cost, capacity)``; for
   each long request (cost above the capacity) they count its further chunks for every chunk-size
   candidate (``planner.chunk_tile_candidates``, ``planner.long_chunks``: divisions, long requests
   only) and sum them per warp;
2. two warps walk the requests in order, at the same time, and store the budget each one starts
   with: warp 1 the balanced way (below), warp 0 the aligned way (``_walk_aligned``: a request that
   does not fit in what is left opens a part), counting the parts it opens; warp 0 publishes which
   walk stands (the aligned one when, for some candidate, those parts plus the long requests'
   further chunks fit in ``num_parts``) and the smallest such candidate. A balanced step is
   three candidates one operation from the budget, an unsigned min and two selects (``_walk_step``);
   no branch and no memory access on the chain: per chunk of ``WALK_CHUNK`` requests the costs come
   into registers with vector loads, the chunk is walked fully unrolled, and its budgets leave with
   vector stores. All 32 lanes run the same walk (no divergence, no shuffles). 32-bit arithmetic
   whenever ``payload < CAP``, 64-bit otherwise;
3. all threads, each on a contiguous run of requests, derive from its start budget what a request
   does (``_request_plan``: close the part first? split? into how many new parts?); a block-wide
   exclusive scan of (parts opened, chunks) gives each request the index of the parts it opens,
   whose begins ``(req, block, split)`` go to shared memory, and its ``num_splits`` entry;
4. all threads write one metadata row per part: a part ends where the next one begins (after the
   previous request when the next one begins at block 0), the last used part ends after the last
   request, and parts that got no work are ``[0, 0, -1, 0, 0, 0, 0, 0]``.

Why this shape (issue 12: <= 8 us at b = 128 as a graph replay; it was 11.6 us, 7.95 at b = 1,
with a one-kernel graph's floor at 3.65 us):

- Shared memory is dynamic and sized per launch from the tensor extents (``smem_bytes(b,
  num_parts)``: 3.2 KB at b = 128 and 132 parts, 204 KiB at ``MAX_BATCH`` and ``MAX_PARTS``). The
  earlier static layout reserved 143 KB for b = 16384 at every launch, which (the suspicion
  this change acts on, not yet measured apart) makes the launch set up the largest shared-memory
  carveout for a kernel that needs a few KB. One compiled kernel serves
  every batch (no second specialisation, no host-side choice): the request arrays are carved by
  hand from the dynamic base with run-time offsets. Requests are stored by chunk
  (``[r % 32, r // 32, field]``, static strides), so a chunk's 32 values of a field are contiguous
  and 16-byte aligned whatever ``b`` is: that is what lets the walk use 128-bit loads and stores.
- The walk was a loop of ~20 instructions per request with shared-memory loads and stores and a
  branch on its chain (~30 ns per request measured: b = 512 -> 1024 added 21 us). Reducing the cost
  modulo ``target`` in the parallel phase 1b removes the rare division from the walk and bounds the
  wrap to one correction, which an unsigned min does in one instruction (ptxas fuses it with an add:
  ``VIADDMNMX.U32``); the loop body is now six SASS instructions per request (ISETP, IADD3,
  VIADDMNMX, two predicated IMAD and no branch; STS.128/LDS.128 once per four requests), a chain of
  four dependent ALU operations. No parallel formulation was adopted: the step is a rotation by the
  cost modulo ``target`` except where a budget falls to ``<= fixed_cost``, so composing segments
  needs the set of budgets that hit that case per segment, far more code than the walk for
  batches of a few hundred.
- Phase 1b costs one extra barrier (five instead of four) but it is constant: doing it inside the
  walk (each lane reducing its chunk's costs) would put a load-compute-store round trip per chunk
  on warp 0's serial path. The remaining barriers are each needed: the total (1), the cost_mods
  (1b), the budgets (2), the scan (3) and the part begins (4).
- Metadata rows stay scalar stores (eight per row, at most one row per thread for up to 256
  parts): vector stores would need the metadata's 16-byte alignment and unit row stride as
  compile-time promises, which the compiled entry (``pipelines.launch.planner_args``) does not
  make today, for at most a few tens of nanoseconds.

Cost: everything but phase 2 is parallel; phase 2 costs a few ALU latencies per request (an
estimate from the SASS, not a measurement). ``python -m perf_table planner`` measures it.

``kernel_model`` is the same algorithm in plain Python, phase by phase; the CPU tests check it
against the host planner on many inputs, the GPU tests check the kernel against the host planner.

Limits (``check_limits`` raises ``ValueError`` on the host before any launch): ``b <= MAX_BATCH``
(three int32 per request in shared memory) and ``num_parts <= MAX_PARTS`` (one begin record per part).
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
from cutlass import Int32, Int64, Uint32, Uint64  # noqa: E402

from .planner import (BEGIN_BLOCK, BEGIN_REQ, BEGIN_SPLIT, BLOCK_N, CHUNK_CANDIDATES, END_BLOCK,  # noqa: E402
                      END_REQ, FIXED_COST, METADATA_WIDTH, chunk_tile_candidates, chunk_tile_offsets,
                      long_chunks)

THREADS = 256
NUM_WARPS = THREADS // 32
LOADS_IN_FLIGHT = 8
"""Lengths each thread loads before using any (phase 1)."""
MAX_BATCH = 16384
"""Largest batch the kernel plans: three int32 values per request in dynamic shared memory (192 KiB
at this batch; a launch asks only for what its batch needs, ``smem_bytes``)."""
MAX_PARTS = 1024
"""Largest ``num_parts``: three int32 begin fields per part in shared memory (12 KiB). A plan has at
most one part per SM (``planner.num_sm_parts``), so this only binds for an explicit huge
``num_sms``."""
WALK_CHUNK = 32
"""Requests the walk takes into registers at a time (and the padding of the request arrays)."""
HEADER_WORDS = (5 + CHUNK_CANDIDATES) * NUM_WARPS + 4
"""int32 words of scratch before the request arrays: per warp an Int64 total, the longest request's
tiles, opened and chunks, and per chunk-size candidate the long requests' further chunks; then the
walks' verdict (1: the aligned plan), its chunk size and padding to 16 bytes."""
REQ_FIELDS = 3
BUDGET, COST, COSTM = range(REQ_FIELDS)
"""Per-request smem fields: the share of a part it holds in an aligned plan, ``min(cost, capacity)``
(phase 1b), which the aligned walk overwrites with the budget it starts with there (phase 2); its
cost ``tiles + fixed_cost`` (phase 1); and ``cost_mod`` (phase 1b), which the balanced walk
overwrites with the budget it starts with in the balanced plan (phase 2)."""
SMEM_LIMIT = 227 * 1024
"""Opt-in shared memory per block on Hopper; ``smem_bytes(MAX_BATCH, MAX_PARTS)`` stays below it."""
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


def cost_mod(nb: int, target: int, fixed_cost: int) -> int:
    """``nb' + fixed_cost`` with ``nb' = ((nb - 1) mod target) + 1`` when ``nb > target`` (else ``nb``):
    the cost of the request's last chunk were it cut into whole parts of ``target`` tiles. It is
    congruent to the cost modulo ``target`` and lies in ``[fixed_cost + 1, fixed_cost + target]`` for
    ``nb >= 1``, which is what lets the walk wrap with one compare instead of a division (phase 1b
    computes it for every request in parallel, once ``target`` is known)."""
    if nb > target:
        nb = (nb - 1) % target + 1
    return nb + fixed_cost


def _walk_step(budget: int, cost: int, costm: int, payload: int, target: int, fixed_cost: int) -> int:
    """Phase 2's step: the budget left after a request of ``cost`` (``costm = cost_mod(...)``) that
    starts with ``budget`` left. Branch-free on the device (``SplitPlanner._walk``): candidates one
    operation from ``budget``, then a select, an unsigned min and a select.

    - Whole fit (``budget >= cost``): ``budget - cost``.
    - Split (``budget > fixed_cost``): the request fills the current part and continues in fresh
      parts of ``target`` tiles each (no waste: every chunk pays its fixed cost), so the budget left
      is ``(budget - cost) mod target``. With ``costm`` congruent to ``cost`` and in
      ``[F + 1, F + target]`` and ``budget`` in ``[F + 1, payload = target + F]``,
      ``d = budget - costm`` lies in ``(-target, target)``: ``d mod target`` is ``d`` or ``d + target``.
    - Closed unused (``budget <= fixed_cost``: not even one tile fits): the request starts over in a
      fresh part: ``(payload - cost)`` if it fits there, else ``(payload - cost) mod target``. Both
      are ``payload - costm`` (``costm == cost`` when ``nb <= target``, i.e. when it fits;
      ``payload - costm`` is in ``[0, target)`` otherwise).
    """
    if budget >= cost:
        return budget - cost
    if budget > fixed_cost:
        d = budget - costm
        return d + target if d < 0 else d
    return payload - costm


def _request_plan(budget: int, nb: int, payload_c: int, target_c: int, fixed_cost: int):
    """Phase 3 of a balanced plan: what request ``r`` does from the (clamped) budget it starts with. A
    request that does not fit closes the part when at most ``fixed_cost`` is left, else it takes what
    is left.

    Returns ``(waste, first, n_new, step)``: whether it closes the current part and opens a fresh one
    at block 0, how many tiles its first chunk takes when it is split (the chunk in the part where it
    starts), how many parts it opens for its further chunks (0 when it fits whole), and the tiles
    between the begins of those parts (``target``).
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
    return waste, first, n_new, target_c


def _aligned_request_plan(budget: int, nb: int, capacity_c: int, chunk_tiles: int, fixed_cost: int):
    """Phase 3 of an aligned plan (``planner.aligned_params``), same returns as ``_request_plan``: a
    request that does not fit in what is left opens a part (a long one holds ``capacity`` of it), and
    a long request opens one more part per further chunk, ``c`` tiles apart (``planner.long_chunks``)."""
    cost = nb + fixed_cost
    waste = 1 if budget < min(cost, capacity_c) else 0
    first = n_new = step = 0
    if cost > capacity_c:
        k, step = long_chunks(nb, chunk_tiles)
        first, n_new = step, k - 1
    return waste, first, n_new, step


def kernel_model(lengths: Sequence[int], num_parts: int, block_n: int = BLOCK_N,
                 fixed_cost: int = FIXED_COST) -> tuple[list[list[int]], list[int]]:
    """The kernel's algorithm in plain Python, phase by phase (for the CPU tests).

    Returns ``(metadata rows, num_splits)`` as lists; must equal ``planner.plan`` for every input
    with ``block_n >= MIN_BLOCK_N``. Negative lengths are planned as 0, as the kernel does.
    """
    _check_knobs(block_n, fixed_cost)
    b = len(lengths)
    # Phase 1: tile counts, the budget and the aligned plan's capacity.
    blocks = [(max(n, 0) + block_n - 1) // block_n for n in lengths]
    total = sum(blocks) + fixed_cost * b
    target = (total + num_parts - 1) // num_parts
    payload = target + fixed_cost
    longest = max(blocks, default=0) + fixed_cost
    capacity = min(max(payload, longest), payload + fixed_cost)

    # Phase 1b (in parallel once target is known): each request's cost modulo target (cost_mod) for
    # the balanced walk, the share of a part it holds in the aligned walk (min(cost, capacity)), and
    # per chunk-size candidate the sum of the long requests' further chunks (each clamped to
    # num_parts: a larger sum fails the fit anyway, and the clamped sum fits in int32).
    costm = [cost_mod(nb, target, fixed_cost) for nb in blocks]
    held = [min(nb + fixed_cost, capacity) for nb in blocks]
    candidates = chunk_tile_candidates(min(target, CAP), fixed_cost)
    extra = [sum(min(long_chunks(nb, t)[0] - 1, num_parts) for nb in blocks if nb + fixed_cost > capacity)
             for t in candidates]

    # Phase 2: the serial walks; budgets[r] = budget left in the current part when request r starts.
    # The aligned walk counts the parts it opens; the smallest candidate whose long chunks fit with
    # them chooses the aligned plan, else the balanced walk's budgets stand.
    budgets = [0] * b
    chunk_tiles = None
    if b > 0:
        budget, opened = capacity, 1
        for r in range(b):
            budgets[r] = min(budget, CAP)
            if budget < held[r]:
                opened += 1
            budget = (budget if budget >= held[r] else capacity) - held[r]
        chunk_tiles = next((t for t, e in zip(candidates, extra) if opened + e <= num_parts), None)
    if chunk_tiles is None:
        budget = payload
        for r in range(b):
            budgets[r] = min(budget, CAP)
            budget = _walk_step(budget, blocks[r] + fixed_cost, costm[r], payload, target, fixed_cost)

    # Phase 3: per request (in parallel on the GPU), parts opened and chunks; their exclusive prefix
    # sums give the index of the first part each request opens and its workspace rows.
    if chunk_tiles is not None:
        capacity_c = min(capacity, CAP)
        plans = [_aligned_request_plan(budgets[r], blocks[r], capacity_c, chunk_tiles, fixed_cost) for r in range(b)]
    else:
        payload_c, target_c = min(payload, CAP), min(target, CAP)
        plans = [_request_plan(budgets[r], blocks[r], payload_c, target_c, fixed_cost) for r in range(b)]
    begin_req, begin_block, begin_split = [0] * num_parts, [0] * num_parts, [0] * num_parts
    num_splits = [0] * (b + 1)
    opened = chunks = 0  # exclusive prefix sums
    for r, (waste, first, n_new, step) in enumerate(plans):
        part = opened + 1  # part 0 begins at request 0; every other part is opened by some request
        if waste:
            if part < num_parts:
                begin_req[part], begin_block[part], begin_split[part] = r, 0, 0
            part += 1
        for k in range(n_new):
            if part < num_parts:
                begin_req[part], begin_block[part], begin_split[part] = r, first + k * step, k + 1
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


def _chunks(batch_size):
    """Walk chunks of ``WALK_CHUNK`` requests covering a batch (host ints or DSL Int32)."""
    return (batch_size + WALK_CHUNK - 1) // WALK_CHUNK


def smem_words(batch_size, num_parts):
    """Dynamic shared memory of one launch, in int32 words (host ints or DSL Int32): the header
    (per-warp partial sums), ``REQ_FIELDS`` words per request rounded up to whole walk chunks, and
    three begin fields per part. ``smem_bytes`` is what the launch asks for."""
    return HEADER_WORDS + REQ_FIELDS * WALK_CHUNK * _chunks(batch_size) + 3 * num_parts


def smem_bytes(batch_size: int, num_parts: int) -> int:
    return 4 * smem_words(batch_size, num_parts)


class SplitPlanner:
    """CuTe DSL planner kernel: ``(mSeqlens [b], mMetadata [num_parts, 8], mNumSplits [b + 1])``,
    all int32; ``b`` and ``num_parts`` are read from the tensor extents at run time, and so is the
    dynamic shared memory the launch asks for (``smem_bytes(b, num_parts)``). The caller checks
    ``check_limits`` first."""

    def __init__(self, block_n: int = BLOCK_N, fixed_cost: int = FIXED_COST):
        _check_knobs(block_n, fixed_cost)
        self.block_n = block_n
        self.fixed_cost = fixed_cost

    @cute.jit
    def __call__(self, mSeqlens: cute.Tensor, mMetadata: cute.Tensor, mNumSplits: cute.Tensor,
                 stream: cuda.CUstream):
        b = mSeqlens.shape[0]
        num_parts = mMetadata.shape[0]
        self.kernel(mSeqlens, mMetadata, mNumSplits).launch(
            grid=[1, 1, 1], block=[THREADS, 1, 1], smem=Int32(4) * smem_words(b, num_parts), stream=stream)

    @cute.kernel
    def kernel(self, mSeqlens: cute.Tensor, mMetadata: cute.Tensor, mNumSplits: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        warp = tidx // 32
        lane = tidx % 32
        b = mSeqlens.shape[0]
        num_parts = mMetadata.shape[0]
        F = self.fixed_cost
        W = WALK_CHUNK
        chunks = _chunks(b)
        # The decode that follows (launched with programmatic dependent launch) may be scheduled now:
        # its CTAs wait in griddepcontrol.wait for this grid to complete before reading the plan, so
        # its launch and prologue overlap the planning.
        cute.arch.griddepcontrol_launch_dependents()
        # Dynamic smem, carved by hand (sizes are run-time values): header, requests, part begins.
        base32 = cute.arch.get_dyn_smem(Int32, alignment=16)
        sWarpTotal = cute.make_tensor(cute.arch.get_dyn_smem(Int64, alignment=16), cute.make_layout(NUM_WARPS))
        sWarpLongest = cute.make_tensor(base32 + 2 * NUM_WARPS, cute.make_layout(NUM_WARPS))
        sWarpOpened = cute.make_tensor(base32 + 3 * NUM_WARPS, cute.make_layout(NUM_WARPS))
        sWarpChunks = cute.make_tensor(base32 + 4 * NUM_WARPS, cute.make_layout(NUM_WARPS))
        sWarpExtra = cute.make_tensor(base32 + 5 * NUM_WARPS, cute.make_layout(
            (NUM_WARPS, CHUNK_CANDIDATES), stride=(CHUNK_CANDIDATES, 1)))
        sAligned = cute.make_tensor(base32 + (5 + CHUNK_CANDIDATES) * NUM_WARPS, cute.make_layout(2))
        # Request r's fields live at [r % W, r // W, field]: a chunk's W values of one field are
        # contiguous and 16-byte aligned (static strides), so the walk moves them with vector accesses.
        sReq = cute.make_tensor(base32 + HEADER_WORDS, cute.make_layout(
            (W, chunks, REQ_FIELDS), stride=(1, REQ_FIELDS * W, W)))
        begins = base32 + HEADER_WORDS + REQ_FIELDS * W * chunks
        sBeginReq = cute.make_tensor(begins, cute.make_layout(num_parts))
        sBeginBlock = cute.make_tensor(begins + num_parts, cute.make_layout(num_parts))
        sBeginSplit = cute.make_tensor(begins + 2 * num_parts, cute.make_layout(num_parts))

        # Phase 1: tile counts, as costs (tiles + F), into smem, and their total (64-bit: b * 2^25
        # tiles overflows int32). LOADS_IN_FLIGHT loads per thread are issued before any is used (a
        # guarded register array), so a large batch pays the global latency once per group.
        local = Int64(0)
        longest_nb = Int32(0)
        rLen = cute.make_rmem_tensor(LOADS_IN_FLIGHT, Int32)
        for base in cutlass.range(tidx, b, THREADS * LOADS_IN_FLIGHT, unroll=1):
            for i in cutlass.range_constexpr(LOADS_IN_FLIGHT):
                rLen[i] = Int32(0)
                if base + i * THREADS < b:
                    rLen[i] = mSeqlens[base + i * THREADS]
            for i in cutlass.range_constexpr(LOADS_IN_FLIGHT):
                n = cutlass.max(rLen[i], Int32(0))  # a negative length is planned as 0
                nb = Int32((Int64(n) + (self.block_n - 1)) // self.block_n)  # 64-bit: n + block_n - 1 may overflow
                r = base + i * THREADS
                if r < b:
                    sReq[r % W, r // W, COST] = nb + F
                local += Int64(nb)  # 0 for the guarded-off slots
                longest_nb = cutlass.max(longest_nb, nb)
        local = cute.arch.warp_reduction_sum(local)
        longest_nb = cute.arch.warp_reduction(longest_nb, op=lambda x, y: cutlass.max(x, y))
        if lane == 0:
            sWarpTotal[warp] = local
            sWarpLongest[warp] = longest_nb
        cute.arch.sync_threads()
        # Every thread derives the budget itself (no broadcast barrier needed).
        total = Int64(F) * Int64(b)
        for w in cutlass.range_constexpr(NUM_WARPS):
            total += sWarpTotal[w]
        target = (total + Int64(num_parts) - 1) // Int64(num_parts)
        payload = target + F
        payload_c = Int32(cutlass.min(payload, Int64(CAP)))
        target_c = Int32(cutlass.min(target, Int64(CAP)))
        longest_nb = Int32(0)
        for w in cutlass.range_constexpr(NUM_WARPS):
            longest_nb = cutlass.max(longest_nb, sWarpLongest[w])
        longest = Int64(longest_nb) + F
        capacity = cutlass.min(cutlass.max(payload, longest), payload + F)
        capacity_c = Int32(cutlass.min(capacity, Int64(CAP)))

        # Phase 1b: cost_mod of every request and the share of a part it holds in the aligned walk
        # (the same thread wrote its cost in phase 1: same index stride), with costs of F for the
        # padding up to whole chunks, which the walks read; and for every long request (one that
        # costs more than the capacity) its further chunks per chunk-size candidate (divisions,
        # but only for long requests, in parallel), summed per warp. (target_c: a tile count is
        # below 2^29 <= CAP, so only target < CAP can be exceeded; a long request has tiles >
        # target, so target < CAP then.)
        offsets = chunk_tile_offsets(F)  # chunk sizes tried: target_c + offsets[i] (``_candidate``; trace-time)
        num_candidates = len(offsets)
        rExtra = cute.make_rmem_tensor(CHUNK_CANDIDATES, Int32)
        rExtra.fill(0)
        for r in cutlass.range(tidx, chunks * W, THREADS, unroll=1):
            cost = Int32(F)
            if r < b:
                cost = sReq[r % W, r // W, COST]
            nb = cost - F
            costm = cost
            if nb > target_c:  # rare: the request spans more than a whole part
                costm = (nb - 1) % target_c + 1 + F
            sReq[r % W, r // W, COST] = cost
            sReq[r % W, r // W, COSTM] = costm
            sReq[r % W, r // W, BUDGET] = cutlass.min(cost, capacity_c)
            if cost > capacity_c:
                for i in cutlass.range_constexpr(num_candidates):
                    k, _ = self._long_chunks(nb, self._candidate(target_c, offsets[i]))
                    rExtra[i] += cutlass.min(k - 1, num_parts)
        for i in cutlass.range_constexpr(num_candidates):
            extra = cute.arch.warp_reduction_sum(rExtra[i])
            if lane == 0:
                sWarpExtra[warp, i] = extra
        cute.arch.sync_threads()

        # Phase 2: two warps walk the requests, all lanes of each in step (no divergence, no shuffles); only
        # the budget chain is serial. 32-bit arithmetic whenever every budget fits; 64-bit otherwise.
        # The two walks run at once on two warps (each as long as the other), so trying the aligned
        # plan costs no time: warp 0 the aligned walk (budgets into BUDGET over the shares it reads)
        # and its verdict, the smallest chunk-size candidate whose long chunks fit with the parts
        # the walk opens; warp 1 the balanced walk (budgets into COSTM, each chunk's cost_mods read
        # before its budgets overwrite them; nothing else reads COSTM after phase 1b).
        if warp == 0:
            verdict = Int32(0)
            tiles = Int32(0)
            if b > 0:
                opened = Int32(0)
                if capacity < CAP:
                    opened = self._walk_aligned(Int32, sReq, chunks, b, capacity)
                else:
                    opened = self._walk_aligned(Int64, sReq, chunks, b, capacity)
                for i in cutlass.range_constexpr(num_candidates - 1, -1, -1):  # the smallest that fits wins
                    extra = Int32(0)
                    for w in cutlass.range_constexpr(NUM_WARPS):
                        extra += sWarpExtra[w, i]
                    if opened + extra <= num_parts:
                        verdict = Int32(1)
                        tiles = self._candidate(target_c, offsets[i])
            if lane == 0:
                sAligned[0] = verdict
                sAligned[1] = tiles
        if warp == 1:
            if payload < CAP:
                self._walk(Int32, sReq, chunks, payload, target)
            else:
                self._walk(Int64, sReq, chunks, payload, target)
        cute.arch.sync_threads()
        aligned = sAligned[0] == 1
        chunk_tiles = sAligned[1]
        budget_field = Int32(COSTM)
        if aligned:
            budget_field = Int32(BUDGET)

        # Phase 3: each thread takes a contiguous run of requests; a block-wide exclusive scan of
        # (parts opened, chunks) places each request's part begins and num_splits entries.
        per_thread = (b + THREADS - 1) // THREADS
        lo = cutlass.min(tidx * per_thread, b)
        hi = cutlass.min(lo + per_thread, b)
        opened = Int32(0)
        nchunks = Int32(0)
        for r in cutlass.range(lo, hi, unroll=1):
            waste, first, n_new, step = self._request_plan(
                aligned, sReq[r % W, r // W, budget_field], sReq[r % W, r // W, COST] - F, payload_c, target_c,
                capacity_c, chunk_tiles)
            opened += waste + n_new
            nchunks += n_new + 1
        own_opened = opened
        own_chunks = nchunks
        # Warp inclusive scan, plus the totals of the warps before, minus the own run: exclusive.
        for i in cutlass.range_constexpr(5):
            up_opened = cute.arch.shuffle_sync_up(opened, 1 << i)
            up_chunks = cute.arch.shuffle_sync_up(nchunks, 1 << i)
            if lane >= (1 << i):
                opened += up_opened
                nchunks += up_chunks
        if lane == 31:
            sWarpOpened[warp] = opened
            sWarpChunks[warp] = nchunks
        cute.arch.sync_threads()
        opened -= own_opened
        nchunks -= own_chunks
        all_opened = Int32(0)
        for w in cutlass.range_constexpr(NUM_WARPS):
            if w < warp:
                opened += sWarpOpened[w]
                nchunks += sWarpChunks[w]
            all_opened += sWarpOpened[w]
        if tidx == 0:
            mNumSplits[0] = Int32(0)
            if b > 0:  # part 0 begins at the first request
                sBeginReq[0] = Int32(0)
                sBeginBlock[0] = Int32(0)
                sBeginSplit[0] = Int32(0)
        for r in cutlass.range(lo, hi, unroll=1):
            waste, first, n_new, step = self._request_plan(
                aligned, sReq[r % W, r // W, budget_field], sReq[r % W, r // W, COST] - F, payload_c, target_c,
                capacity_c, chunk_tiles)
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
                blk += step
            opened += waste + n_new
            nchunks += n_new + 1
            mNumSplits[r + 1] = nchunks
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
                    end_block = sReq[end_req % W, end_req // W, COST] - F
            mMetadata[q, BEGIN_REQ] = begin_req
            mMetadata[q, BEGIN_BLOCK] = begin_block
            mMetadata[q, END_REQ] = end_req
            mMetadata[q, END_BLOCK] = end_block
            mMetadata[q, BEGIN_SPLIT] = begin_split
            for i in cutlass.range_constexpr(BEGIN_SPLIT + 1, METADATA_WIDTH):
                mMetadata[q, i] = Int32(0)

    @cute.jit
    def _walk(self, ty: cutlass.Constexpr, sReq: cute.Tensor, chunks: Int32, payload64: Int64, target64: Int64):
        """Phase 2 in integer type ``ty`` (every lane of warp 1 the same): the budget (clamped to
        CAP) each request starts with, into ``sReq[.., COSTM]`` over the cost_mods. Per chunk of ``WALK_CHUNK``
        requests: the costs and cost_mods come into registers (vector loads, one latency per
        chunk), the chunk is walked fully unrolled with ``_walk_step``'s three selects (no branch, no
        memory access on the chain), and the budgets leave with vector stores."""
        F = self.fixed_cost
        W = WALK_CHUNK
        uty = Uint32 if cutlass.const_expr(ty is Int32) else Uint64
        payload = ty(payload64)
        target = ty(target64)
        budget = payload
        for c in cutlass.range(chunks, unroll=1):
            rCost = cute.make_rmem_tensor(W, Int32)
            rCostm = cute.make_rmem_tensor(W, Int32)
            rBudget = cute.make_rmem_tensor(W, Int32)
            cute.autovec_copy(sReq[None, c, COST], rCost)
            cute.autovec_copy(sReq[None, c, COSTM], rCostm)
            for j in cutlass.range_constexpr(W):
                cost = ty(rCost[j])
                costm = ty(rCostm[j])
                if cutlass.const_expr(ty is Int64):
                    rBudget[j] = Int32(cutlass.min(budget, Int64(CAP)))
                else:
                    rBudget[j] = budget
                # Candidates one operation from budget, then a min and two selects: the chain is
                # three operations deep (_walk_step; d mod target = d or d + target, whichever is
                # smaller as an unsigned number, since -target < d < target).
                whole = budget - cost
                d = budget - costm
                d_wrapped = budget + (target - costm)
                kept = ty(cutlass.select_(budget >= cost, whole, payload - costm))
                split_left = ty(cutlass.min(uty(d), uty(d_wrapped)))
                budget = ty(cutlass.select_((budget >= cost) | (budget <= F), kept, split_left))
            # The budgets overwrite the cost_mods this warp's lanes just read (the same addresses for
            # every lane): order the reads of all lanes before any lane's store.
            cute.arch.sync_warp()
            cute.autovec_copy(rBudget, sReq[None, c, COSTM])

    @cute.jit
    def _walk_aligned(self, ty: cutlass.Constexpr, sReq: cute.Tensor, chunks: Int32, b: Int32,
                      capacity64: Int64) -> Int32:
        """Phase 2 for an aligned plan, in integer type ``ty``: the budget (clamped to CAP) each
        request starts with, into ``sReq[.., BUDGET]`` over the shares ``min(cost, capacity)`` it
        reads there, with parts of ``capacity`` where a request that does not fit opens the next
        part; returns the number of parts opened (a long request's further chunks come on top). Same
        shape as ``_walk``: per chunk, shares in with vector loads, an unrolled select chain, budgets
        out with vector stores; the padding past ``b`` is walked but not counted."""
        W = WALK_CHUNK
        capacity = ty(capacity64)
        budget = capacity
        parts = Int32(1)
        for c in cutlass.range(chunks, unroll=1):
            rHeld = cute.make_rmem_tensor(W, Int32)
            rBudget = cute.make_rmem_tensor(W, Int32)
            cute.autovec_copy(sReq[None, c, BUDGET], rHeld)
            for j in cutlass.range_constexpr(W):
                held = ty(rHeld[j])
                if cutlass.const_expr(ty is Int64):
                    rBudget[j] = Int32(cutlass.min(budget, Int64(CAP)))
                else:
                    rBudget[j] = budget
                fits = budget >= held
                parts += Int32(cutlass.select_(fits | (c * W + j >= b), Int32(0), Int32(1)))
                budget = ty(cutlass.select_(fits, budget - held, capacity - held))
            # The budgets overwrite the shares this warp's lanes just read (the same addresses for
            # every lane): order the reads of all lanes before any lane's store.
            cute.arch.sync_warp()
            cute.autovec_copy(rBudget, sReq[None, c, BUDGET])
        return parts

    def _candidate(self, target_c: Int32, offset: int) -> Int32:
        """Chunk-size candidate ``target + offset`` (``planner.chunk_tile_candidates``): the sizes under
        ``target`` (``offset < 0``, a trace-time constant) clamped at one tile."""
        if offset < 0:
            return cutlass.max(target_c + offset, Int32(1))
        return target_c + offset

    @cute.jit
    def _long_chunks(self, nb: Int32, chunk_tiles: Int32):
        """``planner.long_chunks`` on the device: ``(k, c)`` as Int32."""
        k = (nb + chunk_tiles - 1) // chunk_tiles
        c = (nb + k - 1) // k
        return (nb + c - 1) // c, c

    @cute.jit
    def _request_plan(self, aligned, budget: Int32, nb: Int32, payload_c: Int32, target_c: Int32, capacity_c: Int32,
                      chunk_tiles: Int32):
        """``_request_plan`` (balanced) or ``_aligned_request_plan`` of the model, on the device:
        ``(waste, first, n_new, step)`` as Int32."""
        F = self.fixed_cost
        cost = nb + F
        waste = Int32(0)
        first = Int32(0)
        n_new = Int32(0)
        step = target_c
        if aligned:
            if budget < cutlass.min(cost, capacity_c):
                waste = Int32(1)
            if cost > capacity_c:
                k, c = self._long_chunks(nb, chunk_tiles)
                first = c
                n_new = k - 1
                step = c
        else:
            if cost > budget:
                if budget <= F:
                    waste = Int32(1)
                    budget = payload_c
            if cost > budget:
                first = budget - F
                rest = nb - first
                n_new = Int32(1)
                if rest > target_c:
                    n_new = (rest + target_c - 1) // target_c
        return waste, first, n_new, step
