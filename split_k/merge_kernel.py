"""Second stage of split-kv: merge fp32 partial outputs by their lse (CuTe DSL kernel).

One warp per query row. The warp first turns the row's split lse values into normalised weights
and keeps them in shared memory (each weight computed once), then streams the partial rows:
lane ``l`` owns columns ``l, l + 32, ...`` so every load and store of the warp is one contiguous
128-byte (fp32) / 64-byte (16-bit) segment. Requests with a single chunk were written directly by
the main kernel and are skipped here.

Layouts (docs/interfaces.md): o_accum [splits, rows, 512] fp32, lse_accum [splits, rows] fp32
natural log (-inf = no key in that chunk), num_splits [b + 1] prefix sums, out [b, rows, 512],
lse [b, h_q, s_q] with row = s_idx * h_q + head.
"""
from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

HEAD_DIM_V = 512
WARPS = 4  # rows per CTA
MAX_SPLITS = 256  # per request; the planner makes at most num_sm_parts (<= SM count) chunks
LOG2E = math.log2(math.e)
LN2 = math.log(2.0)


class SplitMerge:
    def __init__(self, dtype, num_heads: int, seqlen_q: int):
        self.dtype = dtype
        self.h_q = num_heads
        self.rows = num_heads * seqlen_q

    @cute.jit
    def __call__(self, mOaccum: cute.Tensor, mLSEaccum: cute.Tensor, mNumSplits: cute.Tensor, mO: cute.Tensor,
                 mLSE: cute.Tensor, stream: cuda.CUstream):
        @cute.struct
        class SharedStorage:
            weights: cute.struct.MemRange[Float32, WARPS * MAX_SPLITS]

        self.shared_storage = SharedStorage
        batch = mNumSplits.shape[0] - 1
        self.kernel(mOaccum, mLSEaccum, mNumSplits, mO, mLSE).launch(
            grid=[batch, (self.rows + WARPS - 1) // WARPS, 1], block=[32 * WARPS, 1, 1],
            smem=SharedStorage.size_in_bytes(), stream=stream)

    @cute.kernel
    def kernel(self, mOaccum: cute.Tensor, mLSEaccum: cute.Tensor, mNumSplits: cute.Tensor, mO: cute.Tensor,
               mLSE: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        r, row_blk, _ = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        row = row_blk * WARPS + warp
        base = mNumSplits[r]
        n = mNumSplits[r + 1] - base
        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sW = storage.weights.get_tensor(cute.make_layout((MAX_SPLITS, WARPS)))
        if n > 1 and row < self.rows:
            m = -Float32.inf
            for i in cutlass.range(lane, n, 32, unroll=1):
                m = cute.arch.fmax(m, mLSEaccum[base + i, row])
            m = cute.arch.warp_reduction_max(m)
            lse = Float32.inf  # no key in any chunk: out 0, lse +inf (the empty-row convention)
            if m != -Float32.inf:
                total = Float32(0.0)
                for i in cutlass.range(lane, n, 32, unroll=1):
                    w = cute.math.exp2((mLSEaccum[base + i, row] - m) * Float32(LOG2E), fastmath=True)
                    sW[i, warp] = w
                    total += w
                total = cute.arch.warp_reduction_sum(total)
                lse = m + cute.math.log2(total, fastmath=True) * Float32(LN2)
                inv_total = Float32(1.0) / total
                cute.arch.sync_warp()  # weights written by other lanes
                acc = cute.make_rmem_tensor(HEAD_DIM_V // 32, Float32)
                acc.fill(0.0)
                for i in cutlass.range(n, unroll=1):
                    w = sW[i, warp] * inv_total
                    for k in cutlass.range_constexpr(HEAD_DIM_V // 32):
                        acc[k] += w * mOaccum[base + i, row, k * 32 + lane]
                for k in cutlass.range_constexpr(HEAD_DIM_V // 32):
                    mO[r, row, k * 32 + lane] = acc[k].to(mO.element_type)
            else:
                for k in cutlass.range_constexpr(HEAD_DIM_V // 32):
                    mO[r, row, k * 32 + lane] = mO.element_type(0.0)
            if lane == 0:
                mLSE[r, row % self.h_q, row // self.h_q] = lse
