"""Second stage of split-kv: merge the partial outputs of split requests by their lse (CuTe DSL).

Which CTAs run. A request is split exactly when it crosses a part boundary of the plan, and every
chunk after its first begins a part: part ``p`` with ``begin_split >= 1`` holds chunk
``begin_split`` of request ``begin_req`` (split_k/planner.py). So the parts are the merge's *slots*:
a request of ``n`` chunks owns the ``S = n - 1`` slots ``s = begin_split - 1`` of its parts 1..n-1,
and the grid is ``[num_parts, Y]``. A CTA whose part begins no continuation chunk (part 0, parts
that start a request whole, empty parts) returns after reading one metadata row, before it waits
for the main kernel; unsplit requests are never touched. The old form (one CTA per request and
row) launched ``b * rows`` CTAs whatever the plan: 16384 mostly idle CTAs at b128/h128 (11 us on an
H200) and only 16 busy ones at b1/h16, each looping over 128 splits (17 us).

Work units. A split request's work is ``rows * K`` units: one query row times one of ``K`` column
groups of ``512 / K`` columns. ``K`` grows with the slots per row (1 when ``S < 2 * rows``, 2, 4 when
``S >= 4 * rows``), so a request with many splits and few rows (b1, h16, 16384 keys: 127 slots,
16 rows) spreads its partial traffic over 64 CTAs instead of 16. Unit ``u`` goes to slot ``u % S``
and CTA row ``(u // S) % Y`` of the grid (a grid-stride loop covers any ``Y``). ``Y`` is picked on
the host from what it knows without reading the plan: ``ceil(rows * b / num_parts)`` clamped to
``[1, rows]`` is the units per slot when the splits are spread evenly (uniform lengths); a skewed
plan only makes some CTAs loop more.

Inside a CTA (256 threads, 8 warps). Warp ``w`` takes 128-column chunk ``w % (4 / K)`` of the unit's
columns and every ``G``-th split (``G = 2K`` groups), each lane 4 consecutive columns (one 16-byte
load of fp32 partials). Each warp derives the row's max lse and the sum of weights itself (the lse
values are a few hundred bytes, L1-resident after the first warp), so no barrier precedes the
partial loads; ``LOADS_IN_FLIGHT`` partial loads per lane are issued before any is used (the
latency of L2 is paid once per group of splits, not once per split). The ``G`` per-group sums meet
in shared memory and are written as ``out`` by the whole CTA.

Programmatic dependent launch: the entry launches this kernel with ``use_pdl`` and the main kernel
triggers its dependents when it starts, so this grid is scheduled while the main kernel runs;
``griddepcontrol.wait`` (a no-op without PDL) orders every read of a partial after the main
kernel's completion and memory flush. The plan tensors are inputs of both kernels, so the slot test
reads them before the wait.

Layouts (docs/interfaces.md): o_accum [splits, rows, 512] fp32, lse_accum [splits, rows] fp32
natural log (-inf = no key in that chunk), num_splits [b + 1] prefix sums, tile_scheduler_metadata
[num_parts, 8], out [b, s_q, h_q, 512] (viewed as [b, rows, 512]: the API checks that the rows
merge), lse [b, h_q, s_q], with row = s_idx * h_q + head for any number of kv heads.
"""
from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from split_k.planner import BEGIN_REQ, BEGIN_SPLIT

HEAD_DIM_V = 512
THREADS = 256
WARPS = THREADS // 32
LANE_COLS = 4  # columns per lane per load: 16 bytes of fp32
CHUNK = 32 * LANE_COLS  # columns a warp covers with one load per lane
CHUNKS = HEAD_DIM_V // CHUNK  # 4
LOADS_IN_FLIGHT = 8
LOG2E = math.log2(math.e)
LN2 = math.log(2.0)


def grid_y(rows: int, batch_size: int, num_parts: int) -> int:
    """The grid's second extent (CTAs per slot), as the host code of ``SplitMerge`` computes it."""
    return max(min(-(-rows * batch_size // num_parts), rows), 1)


def column_groups(slots: int, rows: int) -> int:
    """``K``: column groups per row of a request with ``slots`` merge slots (the kernel's rule)."""
    return 4 if slots >= 4 * rows else 2 if slots >= 2 * rows else 1


def unit_assignment(metadata, num_splits, rows: int) -> dict:
    """The kernel's work split in plain Python, for the CPU tests: ``{(part, cta_y): [(req, row,
    first_col, ncols), ...]}`` for the plan ``(metadata [num_parts, 8], num_splits [b + 1])``
    (lists or tensors). Every (split request, row, column) must appear exactly once."""
    meta = [list(map(int, m)) for m in (metadata.tolist() if hasattr(metadata, "tolist") else metadata)]
    splits = [int(x) for x in (num_splits.tolist() if hasattr(num_splits, "tolist") else num_splits)]
    y_ext = grid_y(rows, len(splits) - 1, len(meta))
    work = {}
    for part, m in enumerate(meta):
        if m[BEGIN_SPLIT] < 1:
            continue
        r = m[BEGIN_REQ]
        slots = splits[r + 1] - splits[r] - 1
        slot = m[BEGIN_SPLIT] - 1
        k = column_groups(slots, rows)
        for cta_y in range(y_ext):
            for unit in range(cta_y * slots + slot, rows * k, y_ext * slots):
                ncols = HEAD_DIM_V // k
                work.setdefault((part, cta_y), []).append((r, unit // k, (unit % k) * ncols, ncols))
    return work


class SplitMerge:
    def __init__(self, dtype, num_heads: int, seqlen_q: int, partial_dtype=cutlass.Float32):
        self.dtype = dtype
        self.partial_dtype = partial_dtype
        self.h_q = num_heads
        self.rows = num_heads * seqlen_q

    @cute.jit
    def __call__(self, mOaccum: cute.Tensor, mLSEaccum: cute.Tensor, mNumSplits: cute.Tensor, mMeta: cute.Tensor,
                 mO: cute.Tensor, mLSE: cute.Tensor, stream: cuda.CUstream, use_pdl: cutlass.Constexpr[bool] = False):
        @cute.struct
        class SharedStorage:
            acc: cute.struct.Align[cute.struct.MemRange[Float32, WARPS * CHUNK], 16]

        self.shared_storage = SharedStorage
        batch = mNumSplits.shape[0] - 1
        num_parts = mMeta.shape[0]
        # out [b, s_q, h_q, 512] -> [b, rows, 512]: row s_idx * h_q + head is at s_idx * stride(1) +
        # head * stride(2) = row * stride(2), because the API checked stride(1) == h_q * stride(2).
        mO = cute.make_tensor(mO.iterator, cute.make_layout(
            (mO.shape[0], self.rows, HEAD_DIM_V), stride=(mO.stride[0], mO.stride[2], 1)))
        # CTAs per slot: the units per slot of an evenly spread plan (see the module docstring).
        y = (Int32(self.rows) * batch + num_parts - 1) // num_parts
        y = cutlass.max(cutlass.min(y, Int32(self.rows)), Int32(1))
        self.kernel(mOaccum, mLSEaccum, mNumSplits, mMeta, mO, mLSE).launch(
            grid=[num_parts, y, 1], block=[THREADS, 1, 1], smem=SharedStorage.size_in_bytes(), stream=stream,
            use_pdl=use_pdl)

    @cute.kernel
    def kernel(self, mOaccum: cute.Tensor, mLSEaccum: cute.Tensor, mNumSplits: cute.Tensor, mMeta: cute.Tensor,
               mO: cute.Tensor, mLSE: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        part, cta_y, _ = cute.arch.block_idx()
        _, grid_y, _ = cute.arch.grid_dim()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = tidx % 32
        rows = self.rows
        begin_split = mMeta[part, BEGIN_SPLIT]
        if begin_split >= 1:  # this part begins chunk begin_split of a split request: one of its slots
            r = mMeta[part, BEGIN_REQ]
            base = mNumSplits[r]
            n = mNumSplits[r + 1] - base
            slots = n - 1
            slot = begin_split - 1
            groups_k = Int32(1)  # column groups per row
            if slots >= 2 * rows:
                groups_k = Int32(2)
            if slots >= 4 * rows:
                groups_k = Int32(4)
            chunks_per_unit = CHUNKS // groups_k
            split_groups = WARPS // chunks_per_unit
            chunk = warp % chunks_per_unit
            group = warp // chunks_per_unit
            storage = cutlass.utils.SmemAllocator().allocate(self.shared_storage)
            sAcc = storage.acc.get_tensor(cute.make_layout((CHUNK, WARPS)))
            rPart = cute.make_rmem_tensor((LANE_COLS, LOADS_IN_FLIGHT), self.partial_dtype)
            rW = cute.make_rmem_tensor(LOADS_IN_FLIGHT, Float32)
            acc = cute.make_rmem_tensor(LANE_COLS, Float32)

            cute.arch.griddepcontrol_wait()  # partials and lse_accum come from the main kernel
            for unit in cutlass.range(cta_y * slots + slot, rows * groups_k, grid_y * slots, unroll=1):
                row = unit // groups_k
                col0 = (unit % groups_k) * (HEAD_DIM_V // groups_k) + chunk * CHUNK + lane * LANE_COLS
                # The row's max lse and weight sum, per warp (lanes stride over the splits).
                m = -Float32.inf
                for i in cutlass.range(lane, n, 32, unroll=1):
                    m = cute.arch.fmax(m, mLSEaccum[base + i, row])
                m = cute.arch.warp_reduction_max(m)
                lse = Float32.inf  # no key in any chunk: out 0, lse +inf (the empty-row convention)
                inv_total = Float32(0.0)
                m_log2 = Float32(0.0)
                if m != -Float32.inf:
                    total = Float32(0.0)
                    m_log2 = m * Float32(LOG2E)
                    for i in cutlass.range(lane, n, 32, unroll=1):
                        total += cute.math.exp2(mLSEaccum[base + i, row] * Float32(LOG2E) - m_log2, fastmath=True)
                    total = cute.arch.warp_reduction_sum(total)
                    lse = m + cute.math.log2(total, fastmath=True) * Float32(LN2)
                    inv_total = Float32(1.0) / total
                acc.fill(0.0)
                if inv_total > Float32(0.0):
                    for i0 in cutlass.range(group, n, split_groups * LOADS_IN_FLIGHT, unroll=1):
                        # Issue every load of the group before using any.
                        for k in cutlass.range_constexpr(LOADS_IN_FLIGHT):
                            i = i0 + k * split_groups
                            rW[k] = Float32(0.0)
                            if i < n:
                                gPart = cute.local_tile(mOaccum[base + i, row, None], (LANE_COLS,), (col0 // LANE_COLS,))
                                cute.autovec_copy(gPart, rPart[None, k])  # one 16-byte (fp32) or 8-byte load
                                rW[k] = mLSEaccum[base + i, row]
                        for k in cutlass.range_constexpr(LOADS_IN_FLIGHT):
                            if i0 + k * split_groups < n:
                                w = cute.math.exp2(rW[k] * Float32(LOG2E) - m_log2, fastmath=True) * inv_total
                                for c in cutlass.range_constexpr(LANE_COLS):
                                    acc[c] += w * Float32(rPart[c, k])
                for c in cutlass.range_constexpr(LANE_COLS):
                    sAcc[lane * LANE_COLS + c, warp] = acc[c]
                cute.arch.sync_threads()
                # The unit's columns, summed over the split groups, stored as out.
                ncols = HEAD_DIM_V // groups_k
                unit_col0 = (unit % groups_k) * ncols
                for t in cutlass.range(tidx, ncols, THREADS, unroll=1):
                    ch = t // CHUNK
                    s = Float32(0.0)
                    for g in cutlass.range(split_groups, unroll=1):
                        s += sAcc[t % CHUNK, g * chunks_per_unit + ch]
                    mO[r, row, unit_col0 + t] = s.to(mO.element_type)
                if tidx == 0:
                    if unit % groups_k == 0:
                        mLSE[r, row % self.h_q, row // self.h_q] = lse
                cute.arch.sync_threads()  # sAcc is rewritten by the next unit
