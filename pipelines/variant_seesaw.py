"""2-warpgroup pipeline, seesaw form (256 threads, no producer warpgroup, two KV tiles per iteration).

Why: in the original 2wg form WG0 runs QK, the softmax and half of P.V for every tile while WG1
only does the other half of P.V. On an H200 (ncu, b128 s1 h128 4096) WG1's warps spent about half
their time waiting for WG0's P, and WG0's non-wgmma work (softmax, rescale, P hand-off) left the
tensor cores idle for a third of each tile. Here both warpgroups score: each iteration takes two
tiles, t0 for WG0 and t1 for WG1, so each warpgroup does QK + softmax for one tile and P.V (its own
256 output columns) for both, and one warpgroup's softmax runs while the other's wgmma do.

Schedule (the third form; docs/perf-notes.md has the measurements of each). An iteration starts
with the scores of its two tiles already in registers: S0 = Q.K(t0)^T in WG0, S1 = Q.K(t1)^T in WG1,
issued at the end of the previous iteration (or by the chunk's prologue). Then, m being the running
row max (identical in both warpgroups at the start):
- WG0: m0 = max(m, rowmax S0), P0 = exp(S0 - m0); m0 published (M0); O_L *= exp(m - m0);
  O_L += P0.V_L(t0) (RS, P0 from registers); then, on m1: P0 *= exp(m0 - m1) written to smem (P0);
  O_L *= exp(m0 - m1); on P1: O_L += P1.V_L(t1) (SS); and S0 of the next pair (QK, issued while that
  P.V runs).
- WG1: on m0: m1 = max(m0, rowmax S1), P1 = exp(S1 - m1); m1 published (M1); P1 to smem (P1);
  O_R *= exp(m - m1); O_R += P1.V_R(t1) (RS); on P0: O_R += P0.V_R(t0) (SS); then S1 of the next
  pair.
Both now hold O relative to m1, which becomes m. WG0's softmax runs beside WG1's QK of the pair
before, WG1's softmax beside WG0's P.V of t0, and each QK beside the other warpgroup's P.V: the
tensor pipe always has a warpgroup's work queued. The row sums stay per warpgroup (both relative to
the same max) and are added at the end of a chunk. A chunk with an odd tile count ends on an
iteration without t1: WG1 then publishes m1 = m0 and only adds P0.V_R(t0).

Loads: a K stage fills in 64-column blocks, each group of blocks ("fill") completing on its own
full/empty barrier pair (``paged_kv`` ``load_fills``). TMA pages: one fill per 64-column block, so
a QK starts on the first block that lands instead of waiting for the tile; cp.async pages: two fills
(the 128 gather threads commit once per fill). WG0 refills the V_L blocks (0..3), WG1 the V_R and
RoPE blocks (4..8), each as soon as the last P.V reading them retires: V_L of t0 right after
P0.V_L(t0) mid-iteration, V_R of t1 and of t0 after WG1's two P.V. Each QK takes its tile's blocks
in the order they were refilled (WG0: 0..3 then 4..8; WG1: 4..8 then 0..3). WG0 issues its QK in
two parts and refills V_L of t1 between them, once P1.V_L(t1) has retired.

Where P goes: P0 into the RoPE block of t0's stage (read only by QK(t0), done by then; that block is
refilled only after WG1's P.V that reads P0), P1 into the skeleton's P tile. The smem plan is the
skeleton's (Q 72 KB + 2 stages 144 KB + P 8 KB).

Named barriers (``Bar``, 256 threads unless noted): M0 (WG0 -> WG1: m0 written), M1 (WG1 -> WG0: m1
written), P0 (WG0 -> WG1: P0 written), P1 (WG1 -> WG0: P1 written), P1_FREE (WG0 -> WG1: the P.V
reading P1 retired; WG0 pre-arrives it once), SUM (WG1 -> WG0: WG1's row sums written at a chunk's
end), INV (WG0 -> WG1: 1/rowsum written), and the two 128-thread warpgroup barriers of
``zero_v_rows``. Every barrier is passed by both warpgroups once per iteration (or chunk), also in an
iteration without t1, so the arrive/sync counts always pair.

Empty-barrier arrivals of blocks a warpgroup never reads again: WG0 releases t0's blocks 4..8 right
after its QK(t0) (it writes P0 into block 8 later, and WG1, which refills it, reads P0 first); WG1
releases t1's blocks 0..3 after its QK(t1). WG1 never reads blocks 0..3 of t0 and releases them after
M0; WG0 never reads blocks 4..8 of t1 and releases them after M1: the other warpgroup passes that
barrier only after its releases of the previous fill of those blocks, so a warp never arrives twice
on one phase.
"""
from __future__ import annotations

import enum

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, const_expr
from cutlass.cute.nvgpu import warpgroup

from pipelines import layouts, softmax
from pipelines.paged_kv import COL_BLOCK, uses_tma
from pipelines.skeleton import BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, MLADecodeBase

HALF = HEAD_DIM_V // 2
V_L_BLOCKS = (0, 1, 2, 3)  # 64-column blocks WG0 refills: V_L
V_R_BLOCKS = (4, 5, 6, 7, 8)  # WG1 refills: V_R and the RoPE block (where P0 goes)
K_STEPS_PER_BLOCK = COL_BLOCK // 16  # wgmma k16 steps per 64-column block


def fills_of(blocks, per_block: bool):
    """The fills of ``blocks``: one per block, or one for all of them."""
    return tuple((b,) for b in blocks) if per_block else (tuple(blocks),)


class Bar(enum.IntEnum):
    M0 = 1
    M1 = 2
    P1 = 3
    P1_FREE = 4
    WG0 = 5
    WG1 = 6
    SUM = 7
    INV = 8
    P0 = 9


class MLADecodeSeesaw(MLADecodeBase):
    num_threads = 256
    kv_stages = 2
    kv_groups = 2  # >1 builds the loader by columns; set to the number of fills in __init__
    q_consumer_warps = 8  # both warpgroups score
    k_consumer_warps = 8
    # TMA pages: one fill per 64-column block (False: two fills, V_L and V_R + RoPE, as the gather
    # pages). A class constant like lazy_rescale (the A/B sets it on a subclass).
    block_fills = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # One fill per 64-column block where TMA loads the tile (a copy per block anyway); the gather's
        # 128 threads commit once per fill, so it keeps two.
        per_block = self.block_fills and uses_tma(self.page_size)
        self.fills = (fills_of(V_L_BLOCKS, per_block), fills_of(V_R_BLOCKS, per_block))
        self.kv_groups = len(self.fills[0]) + len(self.fills[1])

    def make_pipelines(self, storage):
        """Q as in the skeleton (both warpgroups consume it); K: one pipeline per fill over the same two
        stages, each completing on the fill's bytes. Returned as (WG0's fills, WG1's fills)."""
        pipe_q = self.make_q_pipeline(storage)
        bytes_per_block = BLOCK_N * COL_BLOCK * self.dtype.width // 8
        ptr = storage.mbar_k.data_ptr()
        pipes = []
        for side in range(2):
            side_pipes = []
            for cols in self.fills[side]:
                side_pipes.append(self.loader.make_pipeline(ptr, self.k_consumer_warps,
                                                            tx_bytes=len(cols) * bytes_per_block))
                ptr = ptr + 2 * self.kv_stages
            pipes.append(tuple(side_pipes))
        return pipe_q, tuple(pipes)

    @cute.jit
    def warpgroup_roles(self, tidx, m_block, kv_head, mMeta, tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens,
                        mNumSplits, mO, mLSE, mOaccum, mLSEaccum, sQ, sK, sP, storage, pipe_q, pipe_k, scale_log2):
        begin_req, begin_block, end_req, end_block, begin_split = self.work_list(mMeta)
        wg = tidx // 128
        wg_tidx = tidx % 128
        sV_layout = layouts.v_view_layout(sK.layout, HALF, BLOCK_N, HEAD_DIM, self.kv_stages)
        # P0 lives in the RoPE block (columns 512..575) of t0's stage: a 64 x 64 K-major tile with the
        # same swizzle as the skeleton's P tile, one per stage.
        sP0_layout = cute.composition(sK.layout, cute.make_layout(
            (BLOCK_M, BLOCK_N, self.kv_stages), stride=(1, BLOCK_N, BLOCK_N * HEAD_DIM)))
        sP0 = cute.make_tensor(sK.iterator + HEAD_DIM_V * BLOCK_N, sP0_layout)
        if wg == 0:
            sV = cute.make_tensor(sK.iterator, sV_layout)
            self.role(0, wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block, begin_split,
                      tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens, mNumSplits, mO, mLSE, mOaccum, mLSEaccum,
                      sQ, sK, sP, sP0, sV, storage, pipe_q, pipe_k, scale_log2)
        else:
            sV = cute.make_tensor(sK.iterator + HALF * BLOCK_N, sV_layout)
            self.role(1, wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block, begin_split,
                      tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens, mNumSplits, mO, mLSE, mOaccum, mLSEaccum,
                      sQ, sK, sP, sP0, sV, storage, pipe_q, pipe_k, scale_log2)

    # ------------------------------------------------------------ helpers
    @cute.jit
    def qk_part(self, mma_qk, acc_s, tSrQ, tSrK, stage, pipes, fills: cutlass.Constexpr, state,
                first: cutlass.Constexpr[bool]):
        """Issue the QK wgmma of the column blocks of ``fills`` of the tile in ``stage``, each fill after
        its full barrier (no commit). ``first``: the first part of the tile (zeroes the accumulator).
        The MMA object is made here: its ACCUMULATE field is set while tracing, and a caller's object
        set inside a dynamic branch would carry a value that does not dominate its next use."""
        mma_qk = self.tiled_mmas()[0]
        for f in cutlass.range_constexpr(len(fills)):
            self.loader.consumer_wait(pipes[f], state)
            # The barrier wait is a loop (a branch) inside the wgmma chain: an explicit fence after it, or
            # ptxas injects one in the loop's divergent path and serializes every wgmma (info C7520).
            warpgroup.fence()
            for bi in cutlass.range_constexpr(len(fills[f])):
                for kk in cutlass.range_constexpr(K_STEPS_PER_BLOCK):
                    k = fills[f][bi] * K_STEPS_PER_BLOCK + kk
                    mma_qk.set(warpgroup.Field.ACCUMULATE, not (first and f == 0 and bi == 0 and kk == 0))
                    cute.gemm(mma_qk, acc_s, tSrQ[None, None, k], tSrK[None, None, k, stage], acc_s)

    @cute.jit
    def release(self, pipes, state):
        for f in cutlass.range_constexpr(len(pipes)):
            self.loader.consumer_release(pipes[f], state)

    @cute.jit
    def refill(self, is_producer, tma_k, mK, sK, mBlockTable, pipes, fills: cutlass.Constexpr, prod, r, blk, stop,
               seqlen, kv_head, wg_tidx):
        """This warpgroup's fills of tile ``blk`` (if the chunk has it); returns the advanced producer state."""
        if blk < stop:
            if is_producer:
                self.loader.load_fills(tma_k, mK, sK, mBlockTable, pipes, fills, prod, r, blk, seqlen, kv_head,
                                       wg_tidx)
            prod.advance()
        return prod

    @cute.jit
    def publish_max(self, s_m, slot: cutlass.Constexpr[int], row_max, tScS, wg_tidx, bar: cutlass.Constexpr[int]):
        if wg_tidx % 4 == 0:
            for i in cutlass.range_constexpr(cute.size(row_max, mode=[0])):
                s_m[tScS[i, 0][0], slot] = row_max[i]
        cute.arch.barrier_arrive(barrier_id=bar, number_of_threads=256)

    @cute.jit
    def read_max(self, s_m, slot: cutlass.Constexpr[int], out, tScS, bar: cutlass.Constexpr[int]):
        cute.arch.barrier(barrier_id=bar, number_of_threads=256)
        for i in cutlass.range_constexpr(cute.size(out, mode=[0])):
            out[i] = s_m[tScS[i, 0][0], slot]

    @cute.jit
    def pv(self, rs: cutlass.Constexpr[bool], acc_o, tOrP, tOrV, stage):
        """O += P.V of one tile, P from registers (``rs``) or smem (issue only; the caller commits and
        waits). A fresh MMA object, as in ``qk_part``."""
        _, mma_rs, mma_ss = self.tiled_mmas()
        tiled_mma = mma_rs if const_expr(rs) else mma_ss
        warpgroup.fence()
        for k in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            cute.gemm(tiled_mma, acc_o, tOrP[None, None, k], tOrV[None, None, k, stage], acc_o)

    # --------------------------------------------------------------- role
    @cute.jit
    def role(self, me: cutlass.Constexpr[int], wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block,
             begin_split, tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens, mNumSplits, mO, mLSE, mOaccum, mLSEaccum,
             sQ, sK, sP, sP0, sV, storage, pipe_q, pipe_k, scale_log2):
        """Warpgroup ``me``'s loop (0: scores t0, owns O[:, 0:256], refills V_L and loads Q; 1: scores t1,
        owns O[:, 256:512], refills V_R and RoPE)."""
        C = self.split_cluster
        mma_qk, mma_rs, mma_ss = self.tiled_mmas()
        pipes_l, pipes_r = pipe_k
        fills_l, fills_r = self.fills
        ks = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        q_prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)

        thr_qk = mma_qk.get_slice(wg_tidx)
        thr_rs = mma_rs.get_slice(wg_tidx)
        thr_ss = mma_ss.get_slice(wg_tidx)
        tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ))
        tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK))
        tOrV_rs = thr_rs.make_fragment_B(thr_rs.partition_B(sV))
        tOrV_ss = thr_ss.make_fragment_B(thr_ss.partition_B(sV))
        # The other warpgroup's P as the A operand of the SS P.V: P1 (skeleton's P tile) for WG0, P0
        # (RoPE block of a stage) for WG1. This warpgroup's own P as a C-shaped smem view to write.
        if const_expr(me == 0):
            tOrP_other = thr_ss.make_fragment_A(thr_ss.partition_A(sP))
            tPsP_own = thr_qk.partition_C(sP0)
        else:
            tOrP_other = thr_ss.make_fragment_A(thr_ss.partition_A(sP0))
            tPsP_own = thr_qk.partition_C(sP)
        cS = cute.make_identity_tensor((BLOCK_M, BLOCK_N))
        tScS = layouts.acc_mn_view(thr_qk.partition_C(cS))
        n_rows_thr = cute.size(tScS, mode=[0])
        s_m = storage.row_max_x.get_tensor(cute.make_layout((BLOCK_M, 2), stride=(1, BLOCK_M)))
        s_sum = storage.row_sum_x.get_tensor(cute.make_layout(BLOCK_M))
        s_inv = storage.row_inv.get_tensor(cute.make_layout(BLOCK_M))
        col0 = 0 if const_expr(me == 0) else HALF
        wg_warp = cute.arch.make_warp_uniform(wg_tidx // 32)
        is_producer = wg_warp < self.loader.producer_warps
        # This warpgroup's fills, and the order its QK takes a tile's fills in (those it refills first).
        my_pipes = pipes_l if const_expr(me == 0) else pipes_r
        my_fills = fills_l if const_expr(me == 0) else fills_r

        if const_expr(me == 0):
            cute.arch.barrier_arrive(barrier_id=int(Bar.P1_FREE), number_of_threads=256)  # sP starts free
        for r in cutlass.range(begin_req, end_req + 1, unroll=1):
            seqlen, n_blocks, start, stop, is_split, split_idx = self.chunk_bounds(
                r, begin_req, begin_block, end_req, end_block, begin_split, mSeqlens, mNumSplits)
            if const_expr(me == 0):
                if wg_warp == 0:
                    self.tma_load_q(tma_q, mQ, sQ, pipe_q, q_prod, m_block, kv_head, r)
                    q_prod.advance()
            # This warpgroup's fills of the chunk's first two tiles.
            prod = self.refill(is_producer, tma_k, mK, sK, mBlockTable, my_pipes, my_fills, prod, r, start, stop,
                               seqlen, kv_head, wg_tidx)
            prod = self.refill(is_producer, tma_k, mK, sK, mBlockTable, my_pipes, my_fills, prod, r, start + C, stop,
                               seqlen, kv_head, wg_tidx)
            acc_o, acc_o_mn, row_max, row_sum, row_scale = self.new_chunk_state(thr_rs, n_rows_thr)
            other_max = cute.make_rmem_tensor(n_rows_thr, Float32)
            row_limit = self.row_limits(seqlen, m_block, tScS)
            acc_s = cute.make_rmem_tensor(thr_qk.partition_shape_C((BLOCK_M, BLOCK_N)), Float32)
            pipe_q.consumer_wait(q_state)
            # Prologue: the scores of the first pair (none for an empty chunk; WG1's only if the chunk
            # has a second tile).
            if const_expr(me == 0):
                if start < stop:
                    self.qk_part(mma_qk, acc_s, tSrQ, tSrK, ks.index, pipes_l, fills_l, ks, True)
                    self.qk_part(mma_qk, acc_s, tSrQ, tSrK, ks.index, pipes_r, fills_r, ks, False)
                    warpgroup.commit_group()
                    warpgroup.wait_group(0)
                    self.release(pipes_r, ks)  # t0's blocks 4..8: WG0's last read (P0 goes into block 8)
            else:
                if start + C < stop:
                    kb = ks.clone()
                    kb.advance()
                    self.qk_part(mma_qk, acc_s, tSrQ, tSrK, kb.index, pipes_r, fills_r, kb, True)
                    self.qk_part(mma_qk, acc_s, tSrQ, tSrK, kb.index, pipes_l, fills_l, kb, False)
                    warpgroup.commit_group()
                    warpgroup.wait_group(0)
                    self.release(pipes_l, kb)  # t1's blocks 0..3: WG1's only read

            for t0 in cutlass.range(start, stop, 2 * C, unroll=1):
                t1 = t0 + C
                has_t1 = t1 < stop
                ka = ks.clone()  # pipeline states of t0 ...
                ks.advance()
                kb = ks.clone()  # ... and of t1 (used only when has_t1)
                if const_expr(me == 0):
                    prod = self.wg0_iteration(t0, t1, has_t1, ka, kb, pipes_l, pipes_r, prod, seqlen, stop, r, kv_head,
                                              wg_tidx, is_producer, row_limit, tScS, row_max, row_sum, row_scale,
                                              other_max, acc_s, acc_o, acc_o_mn, s_m, mma_qk, mma_rs, mma_ss, tSrQ,
                                              tSrK, tOrV_rs, tOrV_ss, tOrP_other, tPsP_own, tma_k, mK, sK,
                                              mBlockTable, scale_log2)
                else:
                    prod = self.wg1_iteration(t0, t1, has_t1, ka, kb, pipes_l, pipes_r, prod, seqlen, stop, r, kv_head,
                                              wg_tidx, is_producer, row_limit, tScS, row_max, row_sum, row_scale,
                                              other_max, acc_s, acc_o, acc_o_mn, s_m, mma_qk, mma_rs, mma_ss, tSrQ,
                                              tSrK, tOrV_rs, tOrV_ss, tOrP_other, tPsP_own, tma_k, mK, sK,
                                              mBlockTable, scale_log2)
                if has_t1:  # (a last tile without partner leaves t1's slot to the next chunk)
                    ks.advance()
            pipe_q.consumer_release(q_state)
            q_state.advance()

            # Chunk end: WG1's row sums to WG0, which finalises; 1/rowsum back to WG1.
            row_inv = cute.make_rmem_tensor(n_rows_thr, Float32)
            row_lse = cute.make_rmem_tensor(n_rows_thr, Float32)
            if const_expr(me == 1):
                for i in cutlass.range_constexpr(n_rows_thr):
                    total = cute.arch.warp_reduction_sum(row_sum[i], threads_in_group=4)
                    if wg_tidx % 4 == 0:
                        s_sum[tScS[i, 0][0]] = total
                cute.arch.barrier_arrive(barrier_id=int(Bar.SUM), number_of_threads=256)
                cute.arch.barrier(barrier_id=int(Bar.INV), number_of_threads=256)
                for i in cutlass.range_constexpr(n_rows_thr):
                    row_inv[i] = s_inv[tScS[i, 0][0]]
            else:
                cute.arch.barrier(barrier_id=int(Bar.SUM), number_of_threads=256)
                if wg_tidx % 4 == 0:  # one thread of the quad adds WG1's (quad-reduced) sum
                    for i in cutlass.range_constexpr(n_rows_thr):
                        row_sum[i] = row_sum[i] + s_sum[tScS[i, 0][0]]
                softmax.finalize_rows(row_max, row_sum, row_inv, row_lse, scale_log2, self.empty_row_lse(is_split))
                if wg_tidx % 4 == 0:
                    for i in cutlass.range_constexpr(n_rows_thr):
                        s_inv[tScS[i, 0][0]] = row_inv[i]
                cute.arch.barrier_arrive(barrier_id=int(Bar.INV), number_of_threads=256)
            # A fresh MMA object for the epilogue's fragment layout: the loop's ones carry state set inside it.
            _, mma_store, _ = self.tiled_mmas()
            self.store_chunk(acc_o, mma_store, wg_tidx, wg_tidx + 128 * me, row_inv, row_lse, me == 0, col0, m_block,
                             kv_head, r, is_split, split_idx, mO, mLSE, mOaccum, mLSEaccum, storage)
        if const_expr(me == 1):
            # Pairs WG0's last P1_FREE arrive so no arrival is left pending at exit.
            cute.arch.barrier(barrier_id=int(Bar.P1_FREE), number_of_threads=256)

    # ------------------------------------------------------------------ WG0
    @cute.jit
    def wg0_iteration(self, t0, t1, has_t1, ka, kb, pipes_l, pipes_r, prod, seqlen, stop, r, kv_head, wg_tidx,
                      is_producer, row_limit, tScS, row_max, row_sum, row_scale, other_max, acc_s, acc_o, acc_o_mn,
                      s_m, mma_qk, mma_rs, mma_ss, tSrQ, tSrK, tOrV_rs, tOrV_ss, tOrP_other, tPsP_own, tma_k, mK, sK,
                      mBlockTable, scale_log2):
        C = self.split_cluster
        fills_l, fills_r = self.fills
        # Softmax of t0 (S0 in acc_s since the end of the previous iteration); m0 to WG1.
        self.softmax_tile(acc_s, t0, seqlen, row_limit, tScS, row_max, row_sum, row_scale, scale_log2)
        self.publish_max(s_m, 0, row_max, tScS, wg_tidx, int(Bar.M0))
        # O_L to m0, O_L += P0.V_L(t0) with P0 from registers.
        softmax.rescale_rows_if_needed(acc_o_mn, row_scale)
        valid0 = seqlen - t0 * BLOCK_N
        if valid0 < BLOCK_N:
            self.zero_v_rows(sK, ka.index, valid0, 0, HALF, wg_tidx, int(Bar.WG0))
        rP = cute.make_rmem_tensor_like(acc_s, self.dtype)
        rP.store(acc_s.load().to(self.dtype))
        self.pv(True, acc_o, layouts.acc_as_a_operand(rP), tOrV_rs, ka.index)
        warpgroup.commit_group()
        warpgroup.wait_group(0)
        # V_L of t0: WG0 was its last reader; refill it with t0 + 2C (the first blocks the next QK takes).
        self.release(pipes_l, ka)
        prod = self.refill(is_producer, tma_k, mK, sK, mBlockTable, pipes_l, fills_l, prod, r, t0 + 2 * C, stop,
                           seqlen, kv_head, wg_tidx)
        # m1 from WG1: P0 to m1 into t0's RoPE block for WG1; O_L and the row sums to m1.
        self.read_max(s_m, 1, other_max, tScS, int(Bar.M1))
        if has_t1:
            self.release(pipes_r, kb)  # t1's blocks 4..8: never read by WG0 (after M1: see docstring)
        softmax.raise_max(row_max, row_sum, row_scale, other_max, scale_log2)
        s_mn = layouts.acc_mn_view(acc_s)
        for i in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
            for j in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
                s_mn[i, j] = s_mn[i, j] * row_scale[i]
        rP.store(acc_s.load().to(self.dtype))
        cute.autovec_copy(rP, tPsP_own[None, None, None, ka.index])
        cute.arch.fence_view_async_shared()
        cute.arch.barrier_arrive(barrier_id=int(Bar.P0), number_of_threads=256)
        softmax.rescale_rows_if_needed(acc_o_mn, row_scale)
        # O_L += P1.V_L(t1), P1 from smem; S0 of the next pair issued behind it.
        cute.arch.barrier(barrier_id=int(Bar.P1), number_of_threads=256)
        if has_t1:
            valid1 = seqlen - t1 * BLOCK_N
            if valid1 < BLOCK_N:
                self.zero_v_rows(sK, kb.index, valid1, 0, HALF, wg_tidx, int(Bar.WG0))
            self.pv(False, acc_o, tOrP_other, tOrV_ss, kb.index)
            warpgroup.commit_group()
        next0 = t0 + 2 * C < stop
        ka_next = ka.clone()
        ka_next.advance()
        ka_next.advance()
        if next0:
            self.qk_part(mma_qk, acc_s, tSrQ, tSrK, ka_next.index, pipes_l, fills_l, ka_next, True)
            warpgroup.commit_group()
        if has_t1:
            # P1.V_L(t1) retired (the QK part may still run): V_L of t1 and the P tile are free.
            if next0:
                warpgroup.wait_group(1)
            else:
                warpgroup.wait_group(0)
            self.release(pipes_l, kb)
        cute.arch.barrier_arrive(barrier_id=int(Bar.P1_FREE), number_of_threads=256)
        if has_t1:
            prod = self.refill(is_producer, tma_k, mK, sK, mBlockTable, pipes_l, fills_l, prod, r, t1 + 2 * C, stop,
                               seqlen, kv_head, wg_tidx)
        if next0:
            self.qk_part(mma_qk, acc_s, tSrQ, tSrK, ka_next.index, pipes_r, fills_r, ka_next, False)
            warpgroup.commit_group()
        warpgroup.wait_group(0)
        if next0:
            self.release(pipes_r, ka_next)  # blocks 4..8 of the next t0: WG0's last read
        return prod

    # ------------------------------------------------------------------ WG1
    @cute.jit
    def wg1_iteration(self, t0, t1, has_t1, ka, kb, pipes_l, pipes_r, prod, seqlen, stop, r, kv_head, wg_tidx,
                      is_producer, row_limit, tScS, row_max, row_sum, row_scale, other_max, acc_s, acc_o, acc_o_mn,
                      s_m, mma_qk, mma_rs, mma_ss, tSrQ, tSrK, tOrV_rs, tOrV_ss, tOrP_other, tPsP_own, tma_k, mK, sK,
                      mBlockTable, scale_log2):
        C = self.split_cluster
        fills_l, fills_r = self.fills
        # m0 from WG0; then the softmax of t1 against it (S1 in acc_s since the previous iteration).
        self.read_max(s_m, 0, other_max, tScS, int(Bar.M0))
        self.release(pipes_l, ka)  # t0's blocks 0..3: never read by WG1 (after M0: see docstring)
        softmax.raise_max(row_max, row_sum, row_scale, other_max, scale_log2)
        o_scale = cute.make_rmem_tensor_like(row_scale)
        o_scale.store(row_scale.load())
        if has_t1:
            self.softmax_tile(acc_s, t1, seqlen, row_limit, tScS, row_max, row_sum, row_scale, scale_log2)
            for i in cutlass.range_constexpr(cute.size(o_scale, mode=[0])):
                o_scale[i] = o_scale[i] * row_scale[i]
        self.publish_max(s_m, 1, row_max, tScS, wg_tidx, int(Bar.M1))
        rP = cute.make_rmem_tensor_like(acc_s, self.dtype)
        # P1 to smem for WG0, once WG0's P.V from the previous P1 retired.
        cute.arch.barrier(barrier_id=int(Bar.P1_FREE), number_of_threads=256)
        if has_t1:
            rP.store(acc_s.load().to(self.dtype))
            cute.autovec_copy(rP, tPsP_own)
            cute.arch.fence_view_async_shared()
        cute.arch.barrier_arrive(barrier_id=int(Bar.P1), number_of_threads=256)
        # O_R to m1; O_R += P1.V_R(t1) (registers), then P0.V_R(t0) (smem).
        softmax.rescale_rows_if_needed(acc_o_mn, o_scale)
        if has_t1:
            valid1 = seqlen - t1 * BLOCK_N
            if valid1 < BLOCK_N:
                self.zero_v_rows(sK, kb.index, valid1, HALF, HALF, wg_tidx, int(Bar.WG1))
            self.pv(True, acc_o, layouts.acc_as_a_operand(rP), tOrV_rs, kb.index)
            warpgroup.commit_group()
        cute.arch.barrier(barrier_id=int(Bar.P0), number_of_threads=256)
        valid0 = seqlen - t0 * BLOCK_N
        if valid0 < BLOCK_N:
            self.zero_v_rows(sK, ka.index, valid0, HALF, HALF, wg_tidx, int(Bar.WG1))
        self.pv(False, acc_o, tOrP_other[None, None, None, ka.index], tOrV_ss, ka.index)
        warpgroup.commit_group()
        if has_t1:
            # P1.V_R(t1) retired: blocks 4..8 of t1 (WG1 their last reader) refill first, with t1 + 2C
            # (t1's stage: the producer state one past t0 + 2C's).
            warpgroup.wait_group(1)
            self.release(pipes_r, kb)
            if t1 + 2 * C < stop:
                if is_producer:
                    prod_b = prod.clone()
                    prod_b.advance()
                    self.loader.load_fills(tma_k, mK, sK, mBlockTable, pipes_r, fills_r, prod_b, r, t1 + 2 * C,
                                           seqlen, kv_head, wg_tidx)
        warpgroup.wait_group(0)
        # P0.V_R(t0) retired: blocks 4..8 of t0 (and P0 in them) free; refill with t0 + 2C.
        self.release(pipes_r, ka)
        prod = self.refill(is_producer, tma_k, mK, sK, mBlockTable, pipes_r, fills_r, prod, r, t0 + 2 * C, stop,
                           seqlen, kv_head, wg_tidx)
        if t1 + 2 * C < stop:
            prod.advance()  # t1 + 2C, issued above
        # S1 of the next pair: blocks 4..8 (refilled first), then 0..3.
        if t1 + 2 * C < stop:
            kb_next = kb.clone()
            kb_next.advance()
            kb_next.advance()
            self.qk_part(mma_qk, acc_s, tSrQ, tSrK, kb_next.index, pipes_r, fills_r, kb_next, True)
            self.qk_part(mma_qk, acc_s, tSrQ, tSrK, kb_next.index, pipes_l, fills_l, kb_next, False)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            self.release(pipes_l, kb_next)  # blocks 0..3 of the next t1: WG1's only read
        return prod
