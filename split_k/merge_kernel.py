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

Work units. A split request's work is ``rows * 4`` row-chunks (one query row times 128 of the 512
columns: a warp covers one with one 16-byte load of fp32 per lane, 8 bytes for 16-bit partials).
A row-chunk is reduced by ``G`` warps, each over every ``G``-th split, with ``G`` chosen per request
so that a warp has at most ``LOADS_IN_FLIGHT`` splits per round (``G = 1`` up to 8 splits, 2 up to
16, 4 up to 32, else 8). A CTA of 8 warps therefore takes ``R = 8 / G`` row-chunks at once (a
*unit*): many rows per CTA when splits are few (big batches), one row-chunk spread over 8 warps when
they are many (b = 1, long context). Unit ``u`` goes to slot ``u % S`` and CTA row ``(u // S) % Y``
of the grid (a grid-stride loop covers any ``Y``).

``Y`` is chosen on the host without reading the plan: with ``n ~ max(num_parts // b, 2)`` chunks per
request (uniform lengths) it is the units per slot, ``ceil(units(n) / (n - 1))``; skewed plans only
make some CTAs loop more, and idle CTAs return before waiting for the main kernel.

Inside a warp the merge is an online softmax over the warp's own splits: each round issues the
loads of up to ``LOADS_IN_FLIGHT`` splits (their lse and 4 columns of their partial per lane) before
using any, then folds them into a running ``(max, sum, acc)``. So the lse values and the partials
are fetched together (one L2 round trip per round, no separate lse pass), and no barrier precedes
the loads. With ``G > 1`` the ``G`` warps of a row-chunk combine their ``(max, sum, acc)`` through
shared memory (rescaled to the common max), and the first of them writes ``out`` and ``lse``.

Programmatic dependent launch: the entry launches this kernel with ``use_pdl`` and the main kernel
triggers its dependents when it starts, so this grid is scheduled while the main kernel runs;
``griddepcontrol.wait`` (a no-op without PDL) orders every read of a partial after the main
kernel's completion and memory flush. The plan tensors are inputs of both kernels, so the slot test
reads them before the wait.

Layouts (docs/interfaces.md): o_accum [splits, rows, 512] fp32 or the input dtype (``partial_dtype``), lse_accum [splits, rows] fp32
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


def split_groups(n: int) -> int:
    """``G``: warps sharing one row-chunk of a request with ``n`` chunks (the kernel's rule)."""
    return 1 if n <= LOADS_IN_FLIGHT else 2 if n <= 2 * LOADS_IN_FLIGHT else 4 if n <= 4 * LOADS_IN_FLIGHT else 8


def units_per_request(rows: int, n: int) -> int:
    """Units (one CTA step: ``8 / G`` row-chunks) of a split request with ``rows`` rows, ``n`` chunks."""
    per_unit = WARPS // split_groups(n)
    return -(-rows * CHUNKS // per_unit)


def grid_y(rows: int, batch_size: int, num_parts: int) -> int:
    """The grid's second extent (CTAs per slot), as the host code of ``SplitMerge`` computes it."""
    n = max(num_parts // max(batch_size, 1), 2)  # chunks per request if the lengths were uniform
    return max(-(-units_per_request(rows, n) // (n - 1)), 1)


def unit_assignment(metadata, num_splits, rows: int) -> dict:
    """The kernel's work split in plain Python, for the CPU tests: ``{(part, cta_y): [(req, row,
    first_col, ncols, first_split, split_step), ...]}`` (one entry per warp and unit) for the plan
    ``(metadata [num_parts, 8], num_splits [b + 1])`` (lists or tensors). Every (split request, row,
    column, split) must be reduced exactly once."""
    meta = [list(map(int, m)) for m in (metadata.tolist() if hasattr(metadata, "tolist") else metadata)]
    splits = [int(x) for x in (num_splits.tolist() if hasattr(num_splits, "tolist") else num_splits)]
    y_ext = grid_y(rows, len(splits) - 1, len(meta))
    work = {}
    for part, m in enumerate(meta):
        if m[BEGIN_SPLIT] < 1:
            continue
        r = m[BEGIN_REQ]
        n = splits[r + 1] - splits[r]
        slots = n - 1
        slot = m[BEGIN_SPLIT] - 1
        g_count = split_groups(n)
        per_unit = WARPS // g_count
        for cta_y in range(y_ext):
            for unit in range(cta_y * slots + slot, units_per_request(rows, n), y_ext * slots):
                for warp in range(WARPS):
                    rc = unit * per_unit + warp // g_count
                    if rc < rows * CHUNKS:
                        work.setdefault((part, cta_y), []).append(
                            (r, rc // CHUNKS, (rc % CHUNKS) * CHUNK, CHUNK, warp % g_count, g_count))
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
            m: cute.struct.MemRange[Float32, WARPS]
            s: cute.struct.MemRange[Float32, WARPS]

        self.shared_storage = SharedStorage
        batch = mNumSplits.shape[0] - 1
        num_parts = mMeta.shape[0]
        # out [b, s_q, h_q, 512] -> [b, rows, 512]: row s_idx * h_q + head is at s_idx * stride(1) +
        # head * stride(2) = row * stride(2), because the API checked stride(1) == h_q * stride(2).
        mO = cute.make_tensor(mO.iterator, cute.make_layout(
            (mO.shape[0], self.rows, HEAD_DIM_V), stride=(mO.stride[0], mO.stride[2], 1)))
        # CTAs per slot (grid_y): units per slot if every request had num_parts / b chunks.
        n_est = cutlass.max(num_parts // cutlass.max(batch, Int32(1)), Int32(2))
        groups = self._split_groups(n_est)
        units = (Int32(self.rows * CHUNKS) + WARPS // groups - 1) // (WARPS // groups)
        y = cutlass.max((units + n_est - 2) // (n_est - 1), Int32(1))
        self.kernel(mOaccum, mLSEaccum, mNumSplits, mMeta, mO, mLSE).launch(
            grid=[num_parts, y, 1], block=[THREADS, 1, 1], smem=SharedStorage.size_in_bytes(), stream=stream,
            use_pdl=use_pdl)

    @cute.jit
    def _split_groups(self, n: Int32) -> Int32:
        g = Int32(8)
        if n <= 4 * LOADS_IN_FLIGHT:
            g = Int32(4)
        if n <= 2 * LOADS_IN_FLIGHT:
            g = Int32(2)
        if n <= LOADS_IN_FLIGHT:
            g = Int32(1)
        return g

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
            groups = self._split_groups(n)
            per_unit = WARPS // groups  # row-chunks per unit
            units = (rows * CHUNKS + per_unit - 1) // per_unit
            group = warp % groups
            storage = cutlass.utils.SmemAllocator().allocate(self.shared_storage)
            sAcc = storage.acc.get_tensor(cute.make_layout((CHUNK, WARPS)))
            sM = storage.m.get_tensor(cute.make_layout(WARPS))
            sS = storage.s.get_tensor(cute.make_layout(WARPS))
            rPart = cute.make_rmem_tensor((LANE_COLS, LOADS_IN_FLIGHT), self.partial_dtype)
            rLse = cute.make_rmem_tensor(LOADS_IN_FLIGHT, Float32)
            acc = cute.make_rmem_tensor(LANE_COLS, Float32)

            cute.arch.griddepcontrol_wait()  # partials and lse_accum come from the main kernel
            for unit in cutlass.range(cta_y * slots + slot, units, grid_y * slots, unroll=1):
                rc = unit * per_unit + warp // groups  # this warp's row-chunk
                row = rc // CHUNKS
                col0 = (rc % CHUNKS) * CHUNK + lane * LANE_COLS
                active = rc < rows * CHUNKS
                # Online softmax over this warp's splits, in log2 units; m = -inf until a split with a key.
                m = -Float32.inf
                total = Float32(0.0)
                acc.fill(0.0)
                if active:
                    for i0 in cutlass.range(group, n, groups * LOADS_IN_FLIGHT, unroll=1):
                        # Issue every load of the round (lse and partial) before using any.
                        for k in cutlass.range_constexpr(LOADS_IN_FLIGHT):
                            i = i0 + k * groups
                            rLse[k] = -Float32.inf
                            if i < n:
                                gPart = cute.local_tile(mOaccum[base + i, row, None], (LANE_COLS,), (col0 // LANE_COLS,))
                                cute.autovec_copy(gPart, rPart[None, k])
                                rLse[k] = mLSEaccum[base + i, row] * Float32(LOG2E)
                        m_new = m
                        for k in cutlass.range_constexpr(LOADS_IN_FLIGHT):
                            m_new = cute.arch.fmax(m_new, rLse[k])
                        if m_new != -Float32.inf:  # else nothing seen yet: acc, total stay 0
                            rescale = cute.math.exp2(m - m_new, fastmath=True)  # 0 when m = -inf
                            total *= rescale
                            for c in cutlass.range_constexpr(LANE_COLS):
                                acc[c] *= rescale
                            for k in cutlass.range_constexpr(LOADS_IN_FLIGHT):
                                if rLse[k] != -Float32.inf:  # a chunk without a key may hold anything
                                    w = cute.math.exp2(rLse[k] - m_new, fastmath=True)
                                    total += w
                                    for c in cutlass.range_constexpr(LANE_COLS):
                                        acc[c] += w * Float32(rPart[c, k])
                            m = m_new
                if groups > 1:
                    # The row-chunk's warps combine (max, sum, acc) in shared memory.
                    for c in cutlass.range_constexpr(LANE_COLS):
                        sAcc[lane * LANE_COLS + c, warp] = acc[c]
                    if lane == 0:
                        sM[warp] = m
                        sS[warp] = total
                    cute.arch.sync_threads()
                    if group == 0:
                        m_all = m
                        for g in cutlass.range(1, groups, unroll=1):
                            m_all = cute.arch.fmax(m_all, sM[warp + g])
                        if m_all != -Float32.inf:
                            scale = cute.math.exp2(m - m_all, fastmath=True)
                            total *= scale
                            for c in cutlass.range_constexpr(LANE_COLS):
                                acc[c] *= scale
                            for g in cutlass.range(1, groups, unroll=1):
                                scale_g = cute.math.exp2(sM[warp + g] - m_all, fastmath=True)
                                total += scale_g * sS[warp + g]
                                for c in cutlass.range_constexpr(LANE_COLS):
                                    acc[c] += scale_g * sAcc[lane * LANE_COLS + c, warp + g]
                        m = m_all
                    cute.arch.sync_threads()  # shared memory is rewritten by the next unit
                if active and group == 0:
                    # Normalise and store; a row with no key in any chunk gets out 0, lse +inf.
                    inv = Float32(0.0)
                    lse = Float32.inf
                    if total > Float32(0.0):
                        inv = Float32(1.0) / total
                        lse = (m + cute.math.log2(total, fastmath=True)) * Float32(LN2)
                    rOut = cute.make_rmem_tensor(LANE_COLS, mO.element_type)
                    for c in cutlass.range_constexpr(LANE_COLS):
                        rOut[c] = (acc[c] * inv).to(mO.element_type)
                    cute.autovec_copy(rOut, cute.local_tile(mO[r, row, None], (LANE_COLS,), (col0 // LANE_COLS,)))
                    if rc % CHUNKS == 0:
                        if lane == 0:
                            mLSE[r, row % self.h_q, row // self.h_q] = lse
