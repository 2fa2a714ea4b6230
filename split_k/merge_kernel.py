"""Second stage of split-kv: merge fp32 partial outputs by their lse (CuTe DSL kernel).

One CTA per (request, query row), 128 threads. Warp 0 turns the row's split lse values into
weights once and keeps them in shared memory; then every thread streams its own 4 consecutive
columns of each partial row (one 16-byte load per split per thread, the CTA covering the 512
columns), so the partial traffic is spread over b * rows CTAs instead of a few long warps.
Requests with a single chunk were written directly by the main kernel and are skipped here.

Layouts (docs/interfaces.md): o_accum [splits, rows, 512] fp32, lse_accum [splits, rows] fp32
natural log (-inf = no key in that chunk), num_splits [b + 1] prefix sums, out [b, s_q, h_q, 512]
(viewed as [b, rows, 512]: the API checks that the rows merge), lse [b, h_q, s_q], with
row = s_idx * h_q + head for any number of kv heads (the main kernel writes the partials of each
kv head's query heads at their own rows), so the merge needs no kv-head knowledge.
"""
from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32

HEAD_DIM_V = 512
THREADS = 128
VEC = HEAD_DIM_V // THREADS  # columns per thread
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
            weights: cute.struct.MemRange[Float32, MAX_SPLITS]
            inv_total: cute.struct.MemRange[Float32, 1]

        self.shared_storage = SharedStorage
        batch = mNumSplits.shape[0] - 1
        # out [b, s_q, h_q, 512] -> [b, rows, 512]: row s_idx * h_q + head is at s_idx * stride(1) +
        # head * stride(2) = row * stride(2), because the API checked stride(1) == h_q * stride(2).
        mO = cute.make_tensor(mO.iterator, cute.make_layout(
            (mO.shape[0], self.rows, HEAD_DIM_V), stride=(mO.stride[0], mO.stride[2], 1)))
        self.kernel(mOaccum, mLSEaccum, mNumSplits, mO, mLSE).launch(
            grid=[batch, self.rows, 1], block=[THREADS, 1, 1], smem=SharedStorage.size_in_bytes(), stream=stream)

    @cute.kernel
    def kernel(self, mOaccum: cute.Tensor, mLSEaccum: cute.Tensor, mNumSplits: cute.Tensor, mO: cute.Tensor,
               mLSE: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        r, row, _ = cute.arch.block_idx()
        base = mNumSplits[r]
        n = mNumSplits[r + 1] - base
        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sW = storage.weights.get_tensor(cute.make_layout(MAX_SPLITS))
        sInv = storage.inv_total.get_tensor(cute.make_layout(1))
        if n > 1:
            if tidx < 32:
                lane = tidx
                m = -Float32.inf
                for i in cutlass.range(lane, n, 32, unroll=1):
                    m = cute.arch.fmax(m, mLSEaccum[base + i, row])
                m = cute.arch.warp_reduction_max(m)
                lse = Float32.inf  # no key in any chunk: out 0, lse +inf (the empty-row convention)
                inv_total = Float32(0.0)
                if m != -Float32.inf:
                    total = Float32(0.0)
                    for i in cutlass.range(lane, n, 32, unroll=1):
                        w = cute.math.exp2((mLSEaccum[base + i, row] - m) * Float32(LOG2E), fastmath=True)
                        sW[i] = w
                        total += w
                    total = cute.arch.warp_reduction_sum(total)
                    lse = m + cute.math.log2(total, fastmath=True) * Float32(LN2)
                    inv_total = Float32(1.0) / total
                if lane == 0:
                    sInv[0] = inv_total
                    mLSE[r, row % self.h_q, row // self.h_q] = lse
            cute.arch.sync_threads()
            inv_total = sInv[0]
            acc = cute.make_rmem_tensor(VEC, Float32)
            acc.fill(0.0)
            part = cute.make_rmem_tensor(VEC, Float32)
            if inv_total > Float32(0.0):
                for i in cutlass.range(n, unroll=4):
                    w = sW[i] * inv_total
                    gPart = cute.local_tile(mOaccum[base + i, row, None], (VEC,), (tidx,))
                    cute.autovec_copy(gPart, part)  # one 16-byte load
                    for k in cutlass.range_constexpr(VEC):
                        acc[k] += w * part[k]
            rOut = cute.make_rmem_tensor(VEC, mO.element_type)
            rOut.store(acc.load().to(mO.element_type))
            cute.autovec_copy(rOut, cute.local_tile(mO[r, row, None], (VEC,), (tidx,)))
