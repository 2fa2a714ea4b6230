"""2wg for narrow problems (at most 16 query rows per CTA: h_q 16 at s_q 1, the DeepSeek TP8 decode):
the score product transposed so that the tensor cores do not multiply 48 rows of padding.

Why. A wgmma's M is 64 rows, so the 2wg QK (S = Q.K^T, M = query rows) computes 64 x 64 scores per KV
tile whatever h_q is; at 16 rows three quarters of that is padding. Measured on an H100 (docs/perf-
notes.md, fifteenth session): one CTA walking a 16-tile chunk takes the same time per tile at h_q 16,
64 and 128 (32.7 / 33.3 / 34.1 us), about 2 us per tile, the rate of the compute-bound b128 h128
rows, and prefetching the chunk into L2 does not help it: the latency rows' CTAs wait for the tensor
cores, not for memory. Here WG0 computes S^T = K.Q^T instead (M = the 64 tokens, N = 16 rows: 64 x 16
x 576 multiply-adds, a quarter of the 64 x 64 x 576), with K as the A operand straight from its stage
and the first 16 rows of Q as B. P.V keeps its form (M = 64 rows, P from shared memory for both
warpgroups), so the tile's multiply-adds drop from 4.5M to 2.7M.

What changes against 2wg, WG0 only (WG1, the loads, the plan and the outputs are 2wg's):
- the score fragment is (tokens x rows): a row's max and sum run down a column, over the thread's two
  tokens, the 8 lanes sharing ``lane % 4`` (butterfly shuffles) and the 4 warps (one float per warp
  and row in ``row_max_x``, exchanged across ``BAR_WG0``);
- P goes to shared memory transposed (the fragment's (token, row) into sP's (row, token)); sP's rows
  16-63 stay zero, so the padding rows of O stay 0 (they are never stored);
- WG0's P.V reads P from shared memory (SS) like WG1's; its O rows' factors come back from
  ``row_scale`` (written by the 4 lanes that own the 16 rows' columns in warp 0);
- the chunk's row sums meet in ``row_sum_x``; 1/sum and the lse go to WG1 and WG0's own rows through
  ``row_inv`` and ``lse_slots``.
Only without clusters (one m-block has no multicast peer; split clusters are not served).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import warpgroup

from pipelines import layouts, softmax
from pipelines.skeleton import BLOCK_M, BLOCK_N, HEAD_DIM
from pipelines.variant_2wg import BAR_P_EMPTY, BAR_P_FULL, BAR_WG0, HALF, MLADecode2WG

NARROW = 16
"""Query rows the transposed QK computes (its wgmma N): the kernel serves up to this many rows per CTA."""
WARPS = 4  # warps of WG0


class MLADecode2WGNarrow(MLADecode2WG):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.rows > NARROW:
            raise ValueError(f"the narrow 2wg kernel serves at most {NARROW} query rows per kv head, "
                             f"got {self.rows} (h_q / h_kv * s_q)")
        if self.split_cluster != 1:
            raise ValueError(f"the narrow 2wg kernel has no split-cluster form (split_cluster {self.split_cluster})")

    def mma_st(self):
        """S^T = K.Q^T: 64 tokens x 16 rows, K (A) and Q (B) both K-major from shared memory."""
        return sm90.make_trivial_tiled_mma(
            self.dtype, self.dtype, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K, Float32,
            (1, 1, 1), (BLOCK_N, NARROW))

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

    # ------------------------------------------------------------------ WG0
    @cute.jit
    def wg0_qk_softmax_pv(self, wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block, begin_split,
                          mSeqlens, mNumSplits, mO, mLSE, mOaccum, mLSEaccum, sQ, sK, sP, sV0, s_row_scale,
                          s_row_inv, pipe_q, pipe_k, scale_log2, storage):
        thr_st = self.mma_st().get_slice(wg_tidx)
        tTrK = thr_st.make_fragment_A(thr_st.partition_A(sK))
        tTrQ = thr_st.make_fragment_B(thr_st.partition_B(cute.local_tile(sQ, (NARROW, HEAD_DIM), (0, 0))))
        # sP read transposed: (token, row) -> sP[row, token].
        sPt = cute.make_tensor(sP.iterator, cute.composition(
            sP.layout, cute.make_layout((BLOCK_N, NARROW), stride=(BLOCK_M, 1))))
        tTsP = thr_st.partition_C(sPt)
        tTcT = layouts.acc_mn_view(thr_st.partition_C(cute.make_identity_tensor((BLOCK_N, NARROW))))
        n_tok = cute.size(tTcT, mode=[0])
        n_col = cute.size(tTcT, mode=[1])

        _, _, mma_pv_ss = self.tiled_mmas()
        thr_pv = mma_pv_ss.get_slice(wg_tidx)
        tOrP = thr_pv.make_fragment_A(thr_pv.partition_A(sP))
        tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(sV0))
        tOcO = layouts.acc_mn_view(thr_pv.partition_C(cute.make_identity_tensor((BLOCK_M, HALF))))
        n_rows_thr = cute.size(tOcO, mode=[0])

        s_col_max = storage.row_max_x.get_tensor(cute.make_layout((NARROW, WARPS)))
        s_col_sum = storage.row_sum_x.get_tensor(cute.make_layout((NARROW, WARPS)))
        s_lse = storage.lse_slots.get_tensor(cute.make_layout(BLOCK_M))
        warp = wg_tidx // 32
        lane = wg_tidx % 32

        # Padding rows 16-63: P zero (their O rows stay 0) and factor 1 (no rescale pass for them), once;
        # WG1 reads both only after WG0's first P_FULL arrive, WG0 after its first BAR_WG0.
        for idx in cutlass.range(wg_tidx, (BLOCK_M - NARROW) * BLOCK_N, 128, unroll=1):
            sP[NARROW + idx // BLOCK_N, idx % BLOCK_N] = sP.element_type(0.0)
        if wg_tidx < BLOCK_M - NARROW:
            s_row_scale[NARROW + wg_tidx] = Float32(1.0)

        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        for r in cutlass.range(begin_req, end_req + 1, unroll=1):
            seqlen, n_blocks, start, stop, is_split, split_idx = self.chunk_bounds(
                r, begin_req, begin_block, end_req, end_block, begin_split, mSeqlens, mNumSplits)
            # (The rows' max and sum it also makes stay unused: this kernel keeps them per column.)
            acc_o, acc_o_mn, _, _, row_scale = self.new_chunk_state(thr_pv, n_rows_thr)
            col_max = cute.make_rmem_tensor(n_col, Float32)
            col_sum = cute.make_rmem_tensor(n_col, Float32)
            col_scale = cute.make_rmem_tensor(n_col, Float32)
            col_max.fill(-Float32.inf)
            col_sum.fill(0.0)
            col_limit = self.col_limits(seqlen, m_block, tTcT)

            pipe_q.consumer_wait(q_state)
            for blk in cutlass.range(start, stop, unroll=1):
                self.loader.consumer_wait(pipe_k, k_state)
                acc_t = cute.make_rmem_tensor(thr_st.partition_shape_C((BLOCK_N, NARROW)), Float32)
                self.issue_st(acc_t, tTrK, tTrQ, k_state.index)
                warpgroup.wait_group(0)
                t_mn = layouts.acc_mn_view(acc_t)
                if (blk + 1) * BLOCK_N > seqlen - (self.s_q - 1):
                    for i in cutlass.range_constexpr(n_tok):
                        for j in cutlass.range_constexpr(n_col):
                            if blk * BLOCK_N + tTcT[i, j][0] >= col_limit[j]:
                                t_mn[i, j] = -Float32.inf
                # The tile's max of each column: the thread's tokens, the warp's 8 lanes, the 4 warps.
                for j in cutlass.range_constexpr(n_col):
                    m = t_mn[0, j]
                    for i in cutlass.range_constexpr(1, n_tok):
                        m = cute.arch.fmax(m, t_mn[i, j])
                    m = self.column_total(m, cute.arch.fmax)
                    if lane < 4:
                        s_col_max[tTcT[0, j][1], warp] = m
                cute.arch.barrier(barrier_id=BAR_WG0, number_of_threads=128)
                for j in cutlass.range_constexpr(n_col):
                    col = tTcT[0, j][1]
                    m_prev = col_max[j]
                    m_new = m_prev
                    for w in cutlass.range_constexpr(WARPS):
                        m_new = cute.arch.fmax(m_new, s_col_max[col, w])
                    # Every thread of a column reads the same maxima, so they all keep the same max.
                    col_max[j], col_scale[j], col_sum[j] = softmax.settle_max(
                        t_mn[None, j], m_prev, m_new, col_sum[j], scale_log2, self.lazy_rescale)

                # P (transposed) and the 16 rows' factors to shared memory once WG1 is done with the
                # previous tile's P, then P_FULL for WG1.
                rP = cute.make_rmem_tensor_like(acc_t, self.dtype)
                rP.store(acc_t.load().to(self.dtype))
                cute.arch.barrier(barrier_id=BAR_P_EMPTY, number_of_threads=256)
                cute.autovec_copy(rP, tTsP)
                if wg_tidx < 4:
                    for j in cutlass.range_constexpr(n_col):
                        s_row_scale[tTcT[0, j][1]] = col_scale[j]
                cute.arch.fence_view_async_shared()  # P is read by the wgmma of both warpgroups
                cute.arch.barrier_arrive(barrier_id=BAR_P_FULL, number_of_threads=256)
                # WG0's own rows: their factors (and P) are visible after this barrier, which also
                # keeps the next tile's column maxima from overwriting this tile's before all read them.
                cute.arch.barrier(barrier_id=BAR_WG0, number_of_threads=128)
                for i in cutlass.range_constexpr(n_rows_thr):
                    row_scale[i] = s_row_scale[tOcO[i, 0][0]]
                softmax.rescale_rows_if_needed(acc_o_mn, row_scale)
                valid = seqlen - blk * BLOCK_N
                if valid < BLOCK_N:
                    self.zero_v_rows(sK, k_state.index, valid, 0, HALF, wg_tidx, BAR_WG0)
                self.issue_pv(acc_o, tOrP, tOrV, k_state.index)
                warpgroup.wait_group(0)
                self.loader.consumer_release(pipe_k, k_state)
                k_state.advance()
            pipe_q.consumer_release(q_state)
            q_state.advance()

            # The chunk's row sums (thread partials down each column), 1/sum and lse per row.
            for j in cutlass.range_constexpr(n_col):
                s = self.column_total(col_sum[j], lambda a, b: a + b)
                if lane < 4:
                    s_col_sum[tTcT[0, j][1], warp] = s
            cute.arch.barrier(barrier_id=BAR_WG0, number_of_threads=128)
            col_inv = cute.make_rmem_tensor(n_col, Float32)
            col_lse = cute.make_rmem_tensor(n_col, Float32)
            empty_lse = self.empty_row_lse(is_split)
            for j in cutlass.range_constexpr(n_col):
                col = tTcT[0, j][1]
                s = Float32(0.0)
                for w in cutlass.range_constexpr(WARPS):
                    s += s_col_sum[col, w]
                inv = Float32(0.0)
                lse = empty_lse
                if s > Float32(0.0):
                    inv = cute.arch.rcp_approx(s)
                    lse = (col_max[j] * scale_log2 + cute.math.log2(s, fastmath=True)) * Float32(softmax.LN2)
                col_inv[j] = inv
                col_lse[j] = lse
            cute.arch.barrier(barrier_id=BAR_P_EMPTY, number_of_threads=256)
            if wg_tidx < 4:
                for j in cutlass.range_constexpr(n_col):
                    s_row_inv[tTcT[0, j][1]] = col_inv[j]
                    s_lse[tTcT[0, j][1]] = col_lse[j]
            cute.arch.barrier_arrive(barrier_id=BAR_P_FULL, number_of_threads=256)
            cute.arch.barrier(barrier_id=BAR_WG0, number_of_threads=128)
            row_inv = cute.make_rmem_tensor(n_rows_thr, Float32)
            row_lse = cute.make_rmem_tensor(n_rows_thr, Float32)
            for i in cutlass.range_constexpr(n_rows_thr):
                row = tOcO[i, 0][0]
                row_inv[i] = Float32(0.0)
                row_lse[i] = empty_lse
                if row < NARROW:  # the padding rows are never stored; their slots hold nothing
                    row_inv[i] = s_row_inv[row]
                    row_lse[i] = s_lse[row]
            self.store_chunk(acc_o, mma_pv_ss, wg_tidx, wg_tidx, row_inv, row_lse, True, 0, m_block, kv_head, r,
                             is_split, split_idx, mO, mLSE, mOaccum, mLSEaccum, storage)
        self.wg0_exit(begin_req, end_req)
