"""2wg for narrow problems (at most 32 query rows per kv head: h_q 16 at s_q 1, the DeepSeek TP8 decode; h_q
32 at s_q 1 (TP4); h_q 16 at s_q 2 (TP8 with MTP); h_q 8 at s_q 4): both products transposed, so the tensor
cores multiply no padding rows. ``launch`` builds this kernel for the ``"2wg"`` pipeline wherever it serves
the configuration (``serves``).

Why. A wgmma's M is 64 rows, so the 2wg products (S = Q.K^T and O = P.V, M = query rows) compute 64
rows whatever h_q is; at 16 rows three quarters of the tensor-core work is padding. Measured on an H100
(docs/perf-notes.md, fifteenth session): one CTA walking a 16-tile chunk took the same time per tile at
h_q 16, 64 and 128, about 2 us, and prefetching the chunk into L2 did not help: the latency rows' CTAs
wait for their per-tile chain, not for memory. A first narrow form (S^T only) saved 2-4%; with both
transposed (this module, sixteenth session) 2wg's 64-row form takes 1.01-1.26x its time on the h16 rows,
and up to 1.10x on the 32-row shapes (b1, long context; within 1.3% on batches).

The products, with N = ``width``, the 16 or 32 columns that hold the rows (``width_for``): S^T = K.Q^T
(M = the 64 tokens; K as the A operand straight from its stage, Q's rows as B) and O^T = V^T.P^T (M =
the 512 value dims, K = the 64 tokens: the K stage read MN-major as the A operand, no copy, and P from
shared memory as the B operand). At N = 16 the tile's multiply-adds drop from 4.5M (2wg) to 1.1M, and
the two products are about equal in size (0.59M and 0.52M), so they go to one warpgroup each:

- WG0: S^T of tile t; the softmax runs down the columns (the thread's two tokens, the 8 lanes sharing
  ``lane % 4`` by butterfly shuffles, the 4 warps through one shared slot per warp, ``warps_total``);
  P^T and the columns' factors to shared memory (P_FULL), then the next tile's S^T while WG1 multiplies
  this one's P.V (WG0 waits only for P_EMPTY before it writes the next P). It releases its read of the K
  stage right after its wgmma (the stage refills once WG1 has released it too).
- WG1: the loads (2wg's producer warps), then per tile the factors applied to its columns, the whole
  O^T (8 wgmma M blocks x 4 k-steps of m64nNk16; 64 or 128 fp32 accumulators per thread), P_EMPTY, the
  stage released and refilled.
- Epilogue (WG1): O^T is the transpose of what ``out`` and the partials want, and each lane holds single
  16-bit elements of 8-element runs, so the normalised values go to a shared-memory scratch laid out
  as the destination rows, 16 rows per pass (``epilogue_scratch_bytes``; row strides chosen so that the
  4 lane groups of a store hit distinct banks), and leave as 16-byte vector stores. WG0 writes the lse.

Shared memory: Q is kept as ``width`` rows (``q_tile_rows``: 18 or 36 KB instead of 72), which makes
room for the scratch (16 x 516 fp32) and the column statistics (224 KB in all at N = 32). Only without
clusters: one m-block has no multicast peer, and split clusters are not served (``serves``).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import warpgroup

from cutlass._mlir.dialects import llvm

from pipelines import layouts, softmax
from pipelines.skeleton import BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, _store_global_v4
from pipelines.variant_2wg import BAR_P_EMPTY, BAR_P_FULL, BAR_WG0, BAR_WG1, MLADecode2WG

NARROW = 32
"""The most query rows per kv head the kernel serves."""
WIDTHS = (16, 32)
"""The wgmma N of its transposed products: the smallest that holds the rows (``width_for``)."""
PASS_ROWS = 16  # rows the epilogue stages through the scratch at a time
WARPS = 4  # warps of WG0


def width_for(rows: int) -> int:
    """The products' N for ``rows`` query rows per kv head (at most ``NARROW``)."""
    return next(w for w in WIDTHS if rows <= w)


def serves(rows_per_kv_head: int, split_cluster: int = 1) -> bool:
    """Whether this kernel serves a configuration: at most ``NARROW`` query rows per kv head
    (``h_q / h_kv * s_q``) and no split cluster."""
    return rows_per_kv_head <= NARROW and split_cluster == 1


# Scratch row strides (elements): 16-bit rows of 1040 bytes and fp32 rows of 2064 bytes put the four
# query rows one store instruction writes (lanes 4g..4g+3 hold rows 2q and 2q+1 of 8 consecutive dims)
# in disjoint bank ranges; both are multiples of 16 bytes, as the vector loads need.
ROW_16 = 520
ROW_32 = 516


def _load_shared_v4(addr: Int32):
    """Four 32-bit words (16 bytes, 16-byte aligned) from shared-memory address ``addr``: one LDS.128.
    Inline PTX with side effects, so it stays behind the named barrier that publishes the words."""
    i32 = Int32.mlir_type
    res = llvm.inline_asm(llvm.StructType.get_literal([i32] * 4), [Int32(addr).ir_value()],
                          "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r", has_side_effects=True)
    return [Int32(llvm.extractvalue(i32, res, [e])) for e in range(4)]


class MLADecode2WGNarrow(MLADecode2WG):
    # Q's TMA from WG1's warp 1 (pages 64/128), K's from warp 0 (2wg's ``q_producer_warp``): 1.3-2.7%
    # faster at b1 h16 1024 and b1 h16 16384 on an H100 (paired, docs/perf-notes.md, seventeenth session).
    q_warp_apart = True
    # P^T's tile keeps the 128B swizzle: the unswizzled tile (``MLADecode2WG.p_interleaved``) helps the 64-row
    # kernel's register-fragment stores of P; measured here (H200, paired, twentieth session) it was neutral
    # to 1% slower (b8 s1 h16 4096 1.010 / 1.012, b32 s1 h32 1024 0.996, the others 0.985-1.005).
    p_interleaved = False
    # 16 rows of fp32 per epilogue pass (``store_transposed``; 16-bit rows take less).
    epilogue_scratch_bytes = PASS_ROWS * ROW_32 * 4
    # One barrier pair per K stage: this kernel's loop waits for and releases whole tiles (its own
    # consumer code, not the 64-row kernel's column groups).
    kv_groups = 1

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.rows > NARROW:
            raise ValueError(f"the narrow 2wg kernel serves at most {NARROW} query rows per kv head, "
                             f"got {self.rows} (h_q / h_kv * s_q)")
        if self.split_cluster != 1:
            raise ValueError(f"the narrow 2wg kernel has no split-cluster form (split_cluster {self.split_cluster})")
        if self.l2_prefetch_ahead:
            raise ValueError("the narrow 2wg kernel has no per-tile L2 prefetch (l2_prefetch_ahead must be 0, got "
                             f"{self.l2_prefetch_ahead}); short chunks are prefetched whole (l2_prefetch_chunk_tiles)")
        self.width = width_for(self.rows)
        self.q_tile_rows = self.width  # Q's rows in shared memory and its TMA box

    def extra_shared_fields(self) -> dict:
        """The column statistics of WG0's softmax (``warps_total``): per warp and column the tile's max
        and the chunk's sum."""
        mem = cute.struct.MemRange
        return {"col_max_x": mem[Float32, WARPS * self.width], "col_sum_x": mem[Float32, WARPS * self.width]}

    def mma_st(self):
        """S^T = K.Q^T: 64 tokens x ``width`` rows, K (A) and Q (B) both K-major from shared memory."""
        return sm90.make_trivial_tiled_mma(
            self.dtype, self.dtype, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K, Float32,
            (1, 1, 1), (BLOCK_N, self.width))

    @cute.jit
    def issue_st(self, acc_t, tTrK, tTrQ, stage):
        """S^T of the K tile in ``stage``, one committed wgmma group (``issue_qk`` with the operands
        swapped). A fresh MMA object for the same reason as there."""
        mma = self.mma_st()
        warpgroup.fence()
        for k in cutlass.range_constexpr(cute.size(tTrQ, mode=[2])):
            mma.set(warpgroup.Field.ACCUMULATE, k != 0)
            cute.gemm(mma, acc_t, tTrK[None, None, k, stage], tTrQ[None, None, k], acc_t)
        warpgroup.commit_group()

    @cute.jit
    def col_limits(self, seqlen: Int32, m_block: Int32, tTcT: cute.Tensor) -> cute.Tensor:
        """``row_limits`` for the thread's score columns (the rows of the transposed fragment)."""
        n_cols = cute.size(tTcT, mode=[1])
        limit = cute.make_rmem_tensor(n_cols, Int32)
        for j in cutlass.range_constexpr(n_cols):
            limit[j] = seqlen
            if const_expr(self.causal):
                s_idx = (m_block * BLOCK_M + tTcT[0, j][1]) // self.heads_per_kv
                limit[j] = seqlen - (self.s_q - 1 - s_idx)
        return limit

    def column_total(self, value: Float32, op) -> Float32:
        """``op``-reduce over the 8 lanes of a warp that share ``lane % 4`` (the fragment's column); traced
        inline by the caller (a plain method: ``op`` is a Python function)."""
        for offset in range(3):  # a Python loop: unrolled while tracing
            value = op(value, cute.arch.shuffle_sync_bfly(value, offset=4 << offset))
        return value

    @cute.jit
    def warps_total(self, part: cute.Tensor, init: cute.Tensor, s_x: cute.Tensor, tTcT: cute.Tensor,
                    wg_tidx: Int32, reduce: cutlass.Constexpr[str]) -> cute.Tensor:
        """Per column of the thread's fragment, the max (``reduce="max"``) or sum (``"sum"``) of all of
        WG0's values: ``part[j]`` (the thread's own, already reduced over its tokens) over the 8 lanes
        sharing the column (``column_total``), one value per warp into ``s_x[col, warp]``, WG0's
        barrier, then the 4 warps' values folded into ``init[j]``. ``s_x`` is free again once every WG0
        thread has passed the next barrier that all of them reach after this call."""
        op = cute.arch.fmax if const_expr(reduce == "max") else (lambda a, b: a + b)
        warp = wg_tidx // 32
        n_col = cute.size(part, mode=[0])
        for j in cutlass.range_constexpr(n_col):
            v = self.column_total(part[j], op)
            if wg_tidx % 32 < 4:
                s_x[tTcT[0, j][1], warp] = v
        cute.arch.barrier(barrier_id=BAR_WG0, number_of_threads=128)
        total = cute.make_rmem_tensor(n_col, Float32)
        for j in cutlass.range_constexpr(n_col):
            v = init[j]
            for w in cutlass.range_constexpr(WARPS):
                v = op(v, s_x[tTcT[0, j][1], w])
            total[j] = v
        return total

    def mma_ot(self):
        """O^T = V^T.P^T: M = value dims (A: the K stage, MN-major), N = ``width`` rows, K = the 64 tokens
        (B: P, K-major, its rows' tokens contiguous)."""
        return sm90.make_trivial_tiled_mma(
            self.dtype, self.dtype, warpgroup.OperandMajorMode.MN, warpgroup.OperandMajorMode.K, Float32,
            (1, 1, 1), (64, self.width))

    @cute.jit
    def issue_ot(self, acc_ot, tOrV, tOrP, stage):
        """O^T += V^T.P^T of the K tile in ``stage``, one committed wgmma group (a fresh MMA object, as in
        ``issue_qk``)."""
        mma = self.mma_ot()
        warpgroup.fence()
        for k in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
            mma.set(warpgroup.Field.ACCUMULATE, True)
            cute.gemm(mma, acc_ot, tOrV[None, None, k, stage], tOrP[None, None, k], acc_ot)
        warpgroup.commit_group()

    @cute.jit
    def warpgroup_roles(self, tidx, m_block, kv_head, mMeta, tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens,
                        mNumSplits, mO, mLSE, mOaccum, mLSEaccum, sQ, sK, sP, storage, pipe_q, pipe_k, scale_log2,
                        merge_tail=None):
        begin_req, begin_block, end_req, end_block, begin_split = self.work_list(mMeta)
        self.cluster_start_wait()  # no-op: the kernel never runs in a cluster (``serves``)
        wg = tidx // 128
        wg_tidx = tidx % 128
        s_row_scale = storage.row_scale.get_tensor(cute.make_layout(self.width))
        s_row_inv = storage.row_inv.get_tensor(cute.make_layout(self.width))
        if wg == 0:
            self.wg0_scores(wg_tidx, kv_head, begin_req, begin_block, end_req, end_block, begin_split, mSeqlens,
                            mNumSplits, mLSE, mLSEaccum, sQ, sK, sP, s_row_scale, s_row_inv, pipe_q, pipe_k,
                            scale_log2, storage)
        else:
            self.wg1_load_ot(wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block, begin_split,
                             tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens, mNumSplits, mO, mOaccum, sQ, sK, sP,
                             s_row_scale, s_row_inv, pipe_q, pipe_k, storage)

    # ------------------------------------------------------------------ WG0
    @cute.jit
    def wg0_scores(self, wg_tidx, kv_head, begin_req, begin_block, end_req, end_block, begin_split, mSeqlens,
                   mNumSplits, mLSE, mLSEaccum, sQ, sK, sP, s_row_scale, s_row_inv, pipe_q, pipe_k, scale_log2,
                   storage):
        thr_st = self.mma_st().get_slice(wg_tidx)
        tTrK = thr_st.make_fragment_A(thr_st.partition_A(sK))
        tTrQ = thr_st.make_fragment_B(thr_st.partition_B(sQ))
        # P written transposed: the fragment's (token, row) -> sP[row, token] (rows 0 .. width-1 of sP, the B
        # operand of WG1's O^T).
        sPt = cute.make_tensor(sP.iterator, cute.composition(
            sP.layout, cute.make_layout((BLOCK_N, self.width), stride=(BLOCK_M, 1))))
        tTsP = thr_st.partition_C(sPt)
        tTcT = layouts.acc_mn_view(thr_st.partition_C(cute.make_identity_tensor((BLOCK_N, self.width))))
        n_tok = cute.size(tTcT, mode=[0])
        n_col = cute.size(tTcT, mode=[1])
        # Column maxima and the chunk's column sums per warp (``warps_total``). One slot per warp serves
        # every tile: each WG0 thread reads a tile's maxima before its P_EMPTY sync and writes the next
        # tile's after it; the sums are read before the chunk's last P_EMPTY sync.
        s_col_max = storage.col_max_x.get_tensor(cute.make_layout((self.width, WARPS)))
        s_col_sum = storage.col_sum_x.get_tensor(cute.make_layout((self.width, WARPS)))

        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        for r in cutlass.range(begin_req, end_req + 1, unroll=1):
            seqlen, n_blocks, start, stop, is_split, split_idx = self.chunk_bounds(
                r, begin_req, begin_block, end_req, end_block, begin_split, mSeqlens, mNumSplits)
            col_max = cute.make_rmem_tensor(n_col, Float32)
            col_sum = cute.make_rmem_tensor(n_col, Float32)
            col_scale = cute.make_rmem_tensor(n_col, Float32)
            col_max.fill(-Float32.inf)
            col_sum.fill(0.0)
            col_limit = self.col_limits(seqlen, 0, tTcT)

            pipe_q.consumer_wait(q_state)
            for blk in cutlass.range(start, stop, unroll=1):
                self.loader.consumer_wait(pipe_k, k_state)
                acc_t = cute.make_rmem_tensor(thr_st.partition_shape_C((BLOCK_N, self.width)), Float32)
                self.issue_st(acc_t, tTrK, tTrQ, k_state.index)
                warpgroup.wait_group(0)
                # WG0 reads nothing more of this stage (WG1's P.V still does: the stage refills once both
                # warpgroups released it).
                self.loader.consumer_release(pipe_k, k_state)
                k_state.advance()
                t_mn = layouts.acc_mn_view(acc_t)
                if (blk + 1) * BLOCK_N > seqlen - (self.s_q - 1):
                    for i in cutlass.range_constexpr(n_tok):
                        for j in cutlass.range_constexpr(n_col):
                            if blk * BLOCK_N + tTcT[i, j][0] >= col_limit[j]:
                                t_mn[i, j] = -Float32.inf
                part_max = cute.make_rmem_tensor(n_col, Float32)
                for j in cutlass.range_constexpr(n_col):
                    part_max[j] = t_mn[0, j]
                    for i in cutlass.range_constexpr(1, n_tok):
                        part_max[j] = cute.arch.fmax(part_max[j], t_mn[i, j])
                m_new = self.warps_total(part_max, col_max, s_col_max, tTcT, wg_tidx, "max")
                for j in cutlass.range_constexpr(n_col):
                    col_max[j], col_scale[j], col_sum[j] = softmax.settle_max(
                        t_mn[None, j], col_max[j], m_new[j], col_sum[j], scale_log2, self.lazy_rescale)

                # P^T and the columns' factors once WG1's previous P.V is done with them, then P_FULL.
                rP = cute.make_rmem_tensor_like(acc_t, self.dtype)
                rP.store(acc_t.load().to(self.dtype))
                cute.arch.barrier(barrier_id=BAR_P_EMPTY, number_of_threads=256)
                cute.autovec_copy(rP, tTsP)
                if wg_tidx < 4:  # lanes 0-3 of warp 0 hold every column
                    for j in cutlass.range_constexpr(n_col):
                        s_row_scale[tTcT[0, j][1]] = col_scale[j]
                cute.arch.fence_view_async_shared()  # P is read by WG1's wgmma (async proxy)
                cute.arch.barrier_arrive(barrier_id=BAR_P_FULL, number_of_threads=256)
            pipe_q.consumer_release(q_state)
            q_state.advance()

            # The chunk's column sums, 1/sum to WG1 and the lse to global memory.
            zero = cute.make_rmem_tensor(n_col, Float32)
            zero.fill(0.0)
            sums = self.warps_total(col_sum, zero, s_col_sum, tTcT, wg_tidx, "sum")
            col_inv = cute.make_rmem_tensor(n_col, Float32)
            empty_lse = self.empty_row_lse(is_split)
            for j in cutlass.range_constexpr(n_col):
                col = tTcT[0, j][1]
                s = sums[j]
                inv = Float32(0.0)
                lse = empty_lse
                if s > Float32(0.0):
                    inv = cute.arch.rcp_approx(s)
                    lse = (col_max[j] * scale_log2 + cute.math.log2(s, fastmath=True)) * Float32(softmax.LN2)
                col_inv[j] = inv
                if wg_tidx < 4:
                    if col < self.rows:
                        if is_split:
                            mLSEaccum[col, kv_head, split_idx] = lse
                        else:
                            mLSE[col, kv_head, r] = lse
            # (Every WG0 thread read s_col_sum before this barrier completes: the next chunk may write it.)
            cute.arch.barrier(barrier_id=BAR_P_EMPTY, number_of_threads=256)
            if wg_tidx < 4:
                for j in cutlass.range_constexpr(n_col):
                    s_row_inv[tTcT[0, j][1]] = col_inv[j]
            cute.arch.barrier_arrive(barrier_id=BAR_P_FULL, number_of_threads=256)
        self.wg0_exit(begin_req, end_req)

    # ------------------------------------------------------------------ WG1
    @cute.jit
    def wg1_load_ot(self, wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block, begin_split,
                    tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens, mNumSplits, mO, mOaccum, sQ, sK, sP,
                    s_row_scale, s_row_inv, pipe_q, pipe_k, storage):
        thr_ot = self.mma_ot().get_slice(wg_tidx)
        # V^T (512 dims x 64 tokens x stages) viewed in place from the K stages, as the MN-major A operand.
        sV = cute.make_tensor(sK.iterator, layouts.v_view_layout(sK.layout, HEAD_DIM_V, BLOCK_N, HEAD_DIM,
                                                                 self.kv_stages))
        tOrV = thr_ot.make_fragment_A(thr_ot.partition_A(sV))
        tOrP = thr_ot.make_fragment_B(thr_ot.partition_B(cute.local_tile(sP, (self.width, BLOCK_N), (0, 0))))
        tOcO = layouts.acc_mn_view(thr_ot.partition_C(cute.make_identity_tensor((HEAD_DIM_V, self.width))))
        n_col = cute.size(tOcO, mode=[1])
        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        is_q_producer, is_k_producer, q_prod, k_prod = self.wg1_producers(wg_tidx)  # as in 2wg

        cute.arch.barrier_arrive(barrier_id=BAR_P_EMPTY, number_of_threads=256)  # P starts free
        prefetched = Int32(0)
        for r in cutlass.range(begin_req, end_req + 1, unroll=1):
            if prefetched == 0:
                q_prod, k_prod = self.load_chunk_head(is_q_producer, is_k_producer, tma_q, mQ, sQ, pipe_q, q_prod,
                                                      tma_k, mK, sK, mBlockTable, pipe_k, k_prod, m_block, kv_head,
                                                      r, begin_req, begin_block, end_req, end_block, begin_split,
                                                      mSeqlens, mNumSplits, wg_tidx)
            prefetched = Int32(0)
            seqlen, n_blocks, start, stop, is_split, split_idx = self.chunk_bounds(
                r, begin_req, begin_block, end_req, end_block, begin_split, mSeqlens, mNumSplits)
            acc_ot = cute.make_rmem_tensor(thr_ot.partition_shape_C((HEAD_DIM_V, self.width)), Float32)
            acc_ot.fill(0.0)
            acc_mn = layouts.acc_mn_view(acc_ot)
            col_scale = cute.make_rmem_tensor(n_col, Float32)
            for blk in cutlass.range(start, stop, unroll=1):
                next_page = self.next_page_early(is_k_producer, mBlockTable, r, blk + self.kv_stages, seqlen, wg_tidx)
                cute.arch.barrier(barrier_id=BAR_P_FULL, number_of_threads=256)
                for j in cutlass.range_constexpr(n_col):
                    col_scale[j] = s_row_scale[tOcO[0, j][1]]
                # The query rows are O^T's columns: the row helper on the transposed view.
                softmax.rescale_rows_if_needed(layouts.transposed(acc_mn), col_scale)
                self.loader.consumer_wait(pipe_k, k_state)
                # Past the end P is 0 but the cache slots may hold NaN (0 * NaN = NaN): zero those V rows of
                # the request's tail tile. WG0's S^T of this stage is complete (P_FULL).
                self.zero_tail_v_rows(sK, k_state.index, seqlen - blk * BLOCK_N, 0, HEAD_DIM_V, wg_tidx, BAR_WG1)
                self.issue_ot(acc_ot, tOrV, tOrP, k_state.index)
                warpgroup.wait_group(0)
                cute.arch.barrier_arrive(barrier_id=BAR_P_EMPTY, number_of_threads=256)
                self.loader.consumer_release(pipe_k, k_state)
                k_state.advance()
                if is_k_producer:
                    if blk + self.kv_stages < stop:
                        self.refill(tma_k, mK, sK, mBlockTable, pipe_k, k_prod, r, blk + self.kv_stages, seqlen, kv_head,
                                    wg_tidx, next_page)
                        k_prod.advance()
            cute.arch.barrier(barrier_id=BAR_P_FULL, number_of_threads=256)
            col_inv = cute.make_rmem_tensor(n_col, Float32)
            for j in cutlass.range_constexpr(n_col):
                col_inv[j] = s_row_inv[tOcO[0, j][1]]
            cute.arch.barrier_arrive(barrier_id=BAR_P_EMPTY, number_of_threads=256)
            if const_expr(self.prefetch_next_chunk):
                # The next chunk's Q and first K tiles before this chunk's epilogue (2wg's reasoning:
                # Q was released by WG0 before it published 1/sum, every K stage by the last P.V).
                if r < end_req:
                    q_prod, k_prod = self.load_chunk_head(
                        is_q_producer, is_k_producer, tma_q, mQ, sQ, pipe_q, q_prod, tma_k, mK, sK, mBlockTable, pipe_k,
                        k_prod, m_block, kv_head, r + 1, begin_req, begin_block, end_req, end_block, begin_split,
                        mSeqlens, mNumSplits, wg_tidx)
                    prefetched = Int32(1)
            if is_split:
                self.store_transposed(acc_mn, tOcO, col_inv, wg_tidx, kv_head, split_idx, mOaccum, storage)
            else:
                self.store_transposed(acc_mn, tOcO, col_inv, wg_tidx, kv_head, r, mO, storage)

    @cute.jit
    def store_transposed(self, acc_mn, tOcO, col_inv, wg_tidx, kv_head, last, mDst, storage):
        """WG1's O^T, normalised, into ``mDst[row, dim, kv_head, last]`` (``out`` or a partial): through
        the scratch in ``mDst``'s dtype and row order, 16 rows at a time, then 16-byte loads and stores
        (rows past ``self.rows``, the rows of one kv head, are not stored). The thread's columns are ``2q + e + 8g`` for its fragment
        column ``j = e + 2g``, so pass ``p`` (rows ``16p .. 16p + 15``) holds ``j`` in ``[4p, 4p + 4)``."""
        dtype = mDst.element_type
        row_elems = ROW_16 if const_expr(dtype.width == 16) else ROW_32
        scratch = cute.recast_ptr(storage.scratch.data_ptr(), dtype=dtype)
        sO = cute.make_tensor(scratch, cute.make_layout((PASS_ROWS, HEAD_DIM_V), stride=(row_elems, 1)))
        per_vec = 128 // dtype.width  # elements per 16 bytes
        vecs = HEAD_DIM_V // per_vec  # per row
        base = Int32(scratch.toint())
        n_col = cute.size(acc_mn, mode=[1])
        passes = self.width // PASS_ROWS
        for p in cutlass.range_constexpr(passes):
            # The previous pass's (or chunk's) vector loads are done before anyone overwrites the scratch.
            cute.arch.barrier(barrier_id=BAR_WG1, number_of_threads=128)
            for i in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
                for j in cutlass.range_constexpr(p * n_col // passes, (p + 1) * n_col // passes):
                    sO[tOcO[i, j][1] - p * PASS_ROWS, tOcO[i, j][0]] = (acc_mn[i, j] * col_inv[j]).to(dtype)
            cute.arch.barrier(barrier_id=BAR_WG1, number_of_threads=128)
            rows = min(PASS_ROWS, self.rows - p * PASS_ROWS)
            if const_expr(rows > 0):
                for v in cutlass.range(wg_tidx, rows * vecs, 128, unroll=1):
                    row = v // vecs
                    col = (v - row * vecs) * per_vec
                    words = _load_shared_v4(base + (row * row_elems + col) * (dtype.width // 8))
                    ptr = mDst.iterator + cute.crd2idx((row + p * PASS_ROWS, col, kv_head, last), mDst.layout)
                    _store_global_v4(ptr, words)
