"""2-warpgroup pipeline with 32-token K tiles in four stages and WG0's softmax overlapped with its P.V
(FlashAttention-3's intra-warpgroup overlap). Experimental: not registered as a variant; ``scripts/
entry_ab.py`` mode ``2wg-overlap`` compiles it on a plan beside 2wg, and a GPU test checks it against the
fp32 reference.

Why: in ``variant_2wg`` the tensor cores idle while WG0 runs the softmax of a tile: its P.V can only
follow the softmax, and WG1's P.V runs beside WG0's. Moving wgmma around the softmax with two 64-token
K stages lost each time, because it moved a stage's release closer to its next use and the K loads
then waited (docs/perf-notes.md, twelfth session). The same 144 KB as four 32-token stages keep two
tiles loading while two are in use.

WG0, per tile t (QK 64x32x576, P.V 64x256x32):
- wait for K(t), issue S(t) = Q.K(t)^T, then O_L += P(t-1).V_L(t-1) (RS wgmma, P(t-1) in registers);
- ``wait_group(1)``: S(t) is complete; softmax of t while the P.V of t-1 (and WG1's) runs;
- ``wait_group(0)``: release the stage of t-1; P(t) to bf16 registers and to smem for WG1 (P_EMPTY /
  P_FULL), O_L moved to the new max, V_L rows past the end zeroed.
The chunk's first tile has no P.V before it, its last P.V none after it. Nothing is in flight across a
loop iteration or a branch (ptxas serializes every wgmma otherwise: info C7520).
WG1: ``variant_2wg``'s role on 32-token tiles (P.V of the right half with P from smem, the loads).
With ``defer_pv_r`` (a class constant, off; ``scripts/entry_ab.py`` mode ``2wg-overlap-defer``) WG1
issues its P.V of t-1 only once WG0 has issued QK(t) and P.V(t-1), so both P.V halves run beside the
softmax of t and QK(t) is not queued behind WG1's P.V; the stage of t-1 is then released later, which
four stages may afford (two 64-token stages did not).

Limits: no split clusters (``split_cluster`` must be 1). Everything else (page sizes, multicast
clusters, h_kv, causal s_q, split plans and their merge) is the skeleton's, as in ``variant_2wg``; the
plan still counts 64-token blocks (``tile_range`` splits them).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, const_expr
from cutlass.cute.nvgpu import warpgroup

from pipelines import layouts, softmax
from pipelines.skeleton import BLOCK_M, HEAD_DIM_V
from pipelines.variant_2wg import BAR_QK_ISSUED, BAR_WG0, MLADecode2WG

HALF = HEAD_DIM_V // 2


class MLADecode2WGOverlap(MLADecode2WG):
    block_n = 32
    kv_stages = 4

    def __init__(self, dtype, num_heads: int, seqlen_q: int, page_size: int, causal: bool, num_heads_k: int = 1,
                 multicast: bool = True, split_cluster: int = 1):
        if split_cluster != 1:
            raise ValueError(f"{type(self).__name__} does not serve split clusters (got {split_cluster})")
        super().__init__(dtype, num_heads, seqlen_q, page_size, causal, num_heads_k, multicast, split_cluster)

    @cute.jit
    def hand_off(self, blk, seqlen, acc_s, rP, tPsP, tScS, row_scale, s_row_scale, acc_o_mn, sK, stage, wg_tidx):
        """After the softmax of tile ``blk`` and once no P.V is in flight: P to bf16 registers (the A
        operand of the next P.V) and to smem with the factors for WG1 (P_EMPTY / P_FULL), O_L moved to the
        tile's max, and the tile's V_L rows past the request's end zeroed."""
        rP.store(acc_s.load().to(self.dtype))
        self.hand_p_to_wg1(rP, tPsP, tScS, row_scale, s_row_scale, wg_tidx)
        softmax.rescale_rows_if_needed(acc_o_mn, row_scale)
        valid = seqlen - blk * self.block_n
        if valid < self.block_n:
            self.zero_v_rows(sK, stage, valid, 0, HALF, wg_tidx, BAR_WG0)

    @cute.jit
    def wg0_qk_softmax_pv(self, wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block, begin_split,
                          mSeqlens, mNumSplits, mO, mLSE, mOaccum, mLSEaccum, sQ, sK, sP, sV0, s_row_scale,
                          s_row_inv, pipe_q, pipe_k, scale_log2, storage):
        _, _, thr_qk, thr_pv, tSrQ, tSrK, tOrV, tPsP, tScS = self.wg0_fragments(wg_tidx, sQ, sK, sP, sV0)
        n_rows_thr = cute.size(tScS, mode=[0])
        # k_rd: the stage of the next tile QK reads; k_rel: the stage of the oldest tile not yet released.
        k_rd = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        k_rel = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        acc_s = cute.make_rmem_tensor(thr_qk.partition_shape_C((BLOCK_M, self.block_n)), Float32)
        rP = cute.make_rmem_tensor_like(acc_s, self.dtype)

        for r in cutlass.range(begin_req, end_req + 1, unroll=1):
            seqlen, n_blocks, start, stop, is_split, split_idx = self.chunk_bounds(
                r, begin_req, begin_block, end_req, end_block, begin_split, mSeqlens, mNumSplits)
            start, stop = self.tile_range(seqlen, start, stop)
            acc_o, acc_o_mn, row_max, row_sum, row_scale = self.new_chunk_state(thr_pv, n_rows_thr)
            row_limit = self.row_limits(seqlen, m_block, tScS)

            pipe_q.consumer_wait(q_state)
            if start < stop:  # the chunk's first tile: QK and softmax, no P.V before it
                self.loader.consumer_wait(pipe_k, k_rd)
                stage = k_rd.index
                k_rd.advance()
                self.issue_qk(acc_s, tSrQ, tSrK, stage)
                warpgroup.wait_group(0)
                self.softmax_tile(acc_s, start, seqlen, row_limit, tScS, row_max, row_sum, row_scale, scale_log2)
                self.hand_off(start, seqlen, acc_s, rP, tPsP, tScS, row_scale, s_row_scale, acc_o_mn, sK,
                              k_rel.index, wg_tidx)
            for blk in cutlass.range(start + 1, stop, unroll=1):
                # QK of this tile, then the P.V of the previous one behind it: the softmax below runs while
                # that P.V (and WG1's) keeps the tensor cores busy.
                self.loader.consumer_wait(pipe_k, k_rd)
                stage = k_rd.index
                k_rd.advance()
                self.issue_qk(acc_s, tSrQ, tSrK, stage)
                self.issue_pv(acc_o, layouts.acc_as_a_operand(rP), tOrV, k_rel.index, p_in_registers=True)
                if const_expr(self.defer_pv_r):
                    cute.arch.barrier_arrive(barrier_id=BAR_QK_ISSUED, number_of_threads=256)
                warpgroup.wait_group(1)  # S(blk)
                self.softmax_tile(acc_s, blk, seqlen, row_limit, tScS, row_max, row_sum, row_scale, scale_log2)
                warpgroup.wait_group(0)  # the previous tile's P.V: its stage, P registers and O_L are free
                self.loader.consumer_release(pipe_k, k_rel)
                k_rel.advance()
                self.hand_off(blk, seqlen, acc_s, rP, tPsP, tScS, row_scale, s_row_scale, acc_o_mn, sK,
                              k_rel.index, wg_tidx)
            if start < stop:  # the chunk's last P.V
                self.issue_pv(acc_o, layouts.acc_as_a_operand(rP), tOrV, k_rel.index, p_in_registers=True)
                warpgroup.wait_group(0)
                self.loader.consumer_release(pipe_k, k_rel)
                k_rel.advance()
            if const_expr(self.arrives_early()):
                if r == end_req:  # this warpgroup's last release (to the peer too) is behind it
                    cute.arch.cluster_arrive()
            pipe_q.consumer_release(q_state)
            q_state.advance()

            _, mma_store, _ = self.tiled_mmas()  # a fresh MMA object: the loop's carry state set in them
            self.wg0_store_chunk(wg_tidx, m_block, kv_head, r, is_split, split_idx, acc_o, mma_store, row_max,
                                 row_sum, tScS, s_row_inv, scale_log2, mO, mLSE, mOaccum, mLSEaccum, storage)
        self.wg0_exit(begin_req, end_req)
