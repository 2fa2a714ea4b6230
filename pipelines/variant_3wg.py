"""3-warpgroup pipeline: a producer warpgroup and two consumer warpgroups (384 threads, setmaxnreg).

Roles (warpgroup: job; registers per thread after ``setmaxnreg``, TMA pages / gather pages):
- WG0, producer (``load``; 40 / 56): issues every load of the CTA's work list in the consumers'
  order: per request Q (TMA, warp 0), then the chunk's K tiles through the page-size loader
  (``pipelines.paged_kv``: TMA boxes from warp 0, or the cp.async row gather from all 128 threads,
  whose page ids and copy addresses need the extra registers). Unlike 2wg, where WG1 issues loads
  (and for small pages gathers whole tiles) between its own P.V, nothing else waits on these
  threads, so a stage is refilled as soon as the consumers release it.
- WG1, QK consumer (``mma_qk_softmax_pv``; 256): S = Q.K^T (64x64, Q and K from smem), mask, online
  softmax; hands P (bf16) and the row factors to WG2 through smem; O[:, 0:256] += P.V[:, 0:256].
- WG2, PV consumer (``mma_pv``; 208 / 192): O[:, 256:512] += P.V[:, 256:512].
Both consumers hold a 64x256 fp32 accumulator (128 registers per thread); the epilogue is the
skeleton's, one 256-column half per consumer, as in 2wg.

Which QK split, and why: one consumer does all of QK, the other only P.V. FlashInfer's FA3-style form
splits QK along the KV tile instead (each consumer scores half the tokens), which needs a
cross-consumer row-max exchange through smem and a named barrier every tile, on the critical path of
both consumers; that exchange is what made FlashInfer drop the form at h_q = 128. Its score product is
also half as wide (m64n32k16), and shared-memory operand reads bind those steps: measured at 0.61 of the
tensor peak against 0.92 for the 64-key steps (docs/perf-notes.md, twenty-fifth session). Here the only
exchange is 2wg's one-way P hand-off, which WG2 consumes off WG1's critical path. The cost is
imbalance: per tile WG1 issues QK (36 k-steps of 64x64) plus half of P.V, WG2 only the other half,
so WG2 idles part of each tile while the tensor cores stay busy with WG1's work.

Overlap of QK(i+1) with P.V(i) in WG1 (FA3's intra-warpgroup pipelining): when tile i+1 has already
landed, WG1 issues QK(i+1) and then P.V(i), waits for QK(i+1) only, and runs the mask and softmax of
tile i+1 on the CUDA cores while P.V(i) runs on the tensor cores; then it waits for P.V(i), releases
tile i and hands P(i+1) over. When tile i+1 has not landed (the memory-bound case), WG1 does not
wait for it before P.V(i): it issues P.V(i), releases tile i, then waits for tile i+1. Waiting first
would hold tile i's stage until tile i+1 arrived, and with two stages that leaves one tile in flight
instead of two. A non-blocking ``mbarrier.test_wait`` picks the order per tile; both orders compute
the same thing. Each order is a self-contained branch (issues, waits, softmax): a first form that
shared the softmax and the last wait after the branches merged made ptxas serialize every wgmma of
the kernel (info C7515). The two branches issue different wgmma sequences, so all four warps of WG1
must take the same one (``wgmma.mma_async.sync.aligned``); ``test_wait`` answers per thread, and the
warps test at slightly different times, so a tile landing in between used to split the warpgroup
(an "illegal instruction" or a hang on the GPU, only where a chunk has 2+ tiles). The answer is
OR-reduced over WG1 with ``bar.red.or`` (``warpgroup_any``, barrier ``Bar.LANDED``) before the
branch.

Registers: during the overlap WG1 holds O (128), S (32) and the row state, plus addresses; ptxas
needs 256 for that without spilling or serializing across all configurations (h_kv > 1 and causal
s_q = 4 were the tightest), which is also why WG1 reads P for its own P.V from smem (SS wgmma, like
WG2) rather than from registers as 2wg's WG0 does: P(i) would otherwise stay live (16 registers)
beside S(i+1) for the whole overlap. The cost is one 128-thread barrier per tile (WG1's P stores
visible to its own wgmma) and 2 KB more smem reads per k-step. 384 threads at one CTA per SM start
at 168 registers, a pool of 128 x 504: producer + WG1 + WG2 = 40 + 256 + 208 (TMA) or
56 + 256 + 192 (gather). WG2 needs about 160. With 40 registers a producer warp could not issue a
tile's 2 or 4 boxes unrolled (ptxas hoists every box's 9 descriptor copies and spills); the loader
now gives each box its own producer warp (``paged_kv``). ``python -m mla.compile_check`` checks
the SASS: USETMAXREG, no LDL/STL, wgmma not serialized.

Shared memory (the skeleton's plan, unchanged): Q 72 KB + 2 stages of 64x576 K 144 KB + P 8 KB +
barriers and factors fill 225 KB of the 227 KB. A deeper K ring (FA3's usual 3-4 stages) is not
possible with 64-token tiles: a third stage alone is 72 KB. Smaller tiles (FlashInfer used 32
tokens and 4 stages) would halve every wgmma's N and double the per-tile softmax and barrier
overhead; the skeleton keeps one tile shape for both designs.

Ordering (named barriers, ``Bar``): P_FULL and P_EMPTY between the two consumers (256 threads), a
one-deep queue exactly as in 2wg: WG2 pre-arrives P_EMPTY once; WG1 syncs P_EMPTY before every write
of sP/factors (one per tile plus one for 1/rowsum per chunk) and arrives P_FULL after it; WG2 syncs
P_FULL before each read and arrives P_EMPTY after it; WG1's final P_EMPTY sync pairs WG2's last
arrive. Neither side can arrive twice on one barrier before the other has synced on it (each arrive
is followed by a sync on the other barrier), so no arrival is ever counted into the wrong phase.
QK_WG and PV_WG (128 threads) order each consumer's own smem writes (zeroed V rows, WG1's P) before
its wgmma; LANDED (WG1's 128 threads, every tile) makes the overlap decision warpgroup-uniform.
``scripts/model_3wg_protocol.py`` models this protocol (all three warpgroups, every barrier). The producer touches no named barrier: it waits on the stages' "empty" mbarriers (both
consumers' 8 warps release a K stage, per CTA of the cluster; WG1's 4 warps release Q) and the
consumers on the "full" ones.
"""
from __future__ import annotations

import enum

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, const_expr
from cutlass.cute.nvgpu import warpgroup

from pipelines import layouts, paged_kv, softmax
from pipelines.skeleton import BLOCK_M, BLOCK_N, HEAD_DIM_V, MLADecodeBase

HALF = HEAD_DIM_V // 2
WG_THREADS = 128
CONSUMER_THREADS = 2 * WG_THREADS  # the P hand-off barriers count both consumer warpgroups


class Bar(enum.IntEnum):
    """Named barrier ids (0 is __syncthreads)."""
    P_FULL = 1  # WG1 wrote P (or 1/rowsum) and the factors: WG2 may read (256 threads)
    P_EMPTY = 2  # WG2 is done reading them: WG1 may overwrite (256 threads)
    QK_WG = 3  # WG1 alone (128 threads): its zeroed V rows and its P stores before its P.V
    PV_WG = 4  # WG2 alone (128 threads): its zeroed V rows before its P.V
    LANDED = 5  # WG1 alone (128 threads): bar.red.or of "tile i+1 has landed" (warpgroup_any)


# Registers per thread after setmaxnreg: (producer, QK consumer, PV consumer). 384 threads launched
# with one CTA per SM start at 168 registers (65536 / 384 rounded down to 8): a pool of 128 x 504,
# so the three must stay within 504. The cp.async gather keeps more state per producer thread (FA4
# makes the same distinction), so its producer keeps 56. Module docstring: why WG1 gets 256.
REGISTERS_TMA = (40, 256, 208)
REGISTERS_GATHER = (56, 256, 192)
ENTRY_REGISTERS = 168


@cute.jit
def warpgroup_any(pred, barrier_id: cutlass.Constexpr[int]):
    """OR of ``pred`` over the 128 threads of one warpgroup, the same value in every thread
    (``bar.red.or.pred`` on a barrier id that only this warpgroup uses, all 128 threads).

    What it is for: a branch whose two sides issue different wgmma sequences must be taken by every
    warp of the warpgroup (``wgmma.mma_async.sync.aligned``). A per-thread value such as
    ``mbarrier.test_wait`` is not warpgroup-uniform: the four warps test at slightly different
    times, and a tile that lands in between sends them down different branches.
    """
    res = cute.arch.inline_ptx(
        "{\n.reg .pred any_in, any_out;\nsetp.ne.u32 any_in, {$r0}, 0;\n"
        "bar.red.or.pred any_out, " + str(int(barrier_id)) + ", 128, any_in;\n"
        "selp.u32 {$w0}, 1, 0, any_out;\n}",
        write_only_types=[cutlass.Int32], read_only_args=[cutlass.Int32(pred)])
    return res != cutlass.Int32(0)


class MLADecode3WG(MLADecodeBase):
    num_threads = 384
    kv_stages = 2  # the most that fits (module docstring)
    q_consumer_warps = 4  # WG1 alone reads Q
    k_consumer_warps = 8  # both consumer warpgroups read every K tile

    def __init__(self, dtype, num_heads: int, seqlen_q: int, page_size: int, causal: bool, num_heads_k: int = 1,
                 multicast: bool = True, split_cluster: int = 1):
        super().__init__(dtype, num_heads, seqlen_q, page_size, causal, num_heads_k, multicast, split_cluster)
        self.producer_regs, self.qk_regs, self.pv_regs = \
            REGISTERS_TMA if paged_kv.uses_tma(page_size) else REGISTERS_GATHER
        assert self.producer_regs + self.qk_regs + self.pv_regs <= 3 * ENTRY_REGISTERS

    @cute.jit
    def warpgroup_roles(self, tidx, m_block, kv_head, mMeta, tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens,
                        mNumSplits, mO, mLSE, mOaccum, mLSEaccum, sQ, sK, sP, storage, pipe_q, pipe_k, scale_log2,
                        merge_tail=None):
        wg = cute.arch.make_warp_uniform(cute.arch.warp_idx()) // 4
        wg_tidx = tidx % WG_THREADS
        # V^T halves viewed in place from the K stages (MN-major B operand, no copy).
        sV_layout = layouts.v_view_layout(sK.layout, HALF, BLOCK_N, self.loader.head_dim, self.kv_stages)
        sV0 = cute.make_tensor(sK.iterator, sV_layout)
        sV1 = cute.make_tensor(sK.iterator + HALF * BLOCK_N, sV_layout)
        s_row_scale = storage.row_scale.get_tensor(cute.make_layout(BLOCK_M))
        s_row_inv = storage.row_inv.get_tensor(cute.make_layout(BLOCK_M))

        # Whole warpgroups take each branch (setmaxnreg is warpgroup-wide). Pipeline states and MMA
        # objects are created inside each role: they are mutated while tracing. Each role reads the
        # work list after its setmaxnreg: values live across the role split (with three register
        # limits below it) are what ptxas spills first.
        if wg == 0:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            begin_req, begin_block, end_req, end_block, begin_split = self.work_list(mMeta)
            self.load(wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block, begin_split,
                      tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens, mNumSplits, sQ, sK, pipe_q, pipe_k)
        else:
            if wg == 1:
                cute.arch.setmaxregister_increase(self.qk_regs)
                begin_req, begin_block, end_req, end_block, begin_split = self.work_list(mMeta)
                self.mma_qk_softmax_pv(wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block,
                                       begin_split, mSeqlens, mNumSplits, mO, mLSE, mOaccum, mLSEaccum, sQ, sK,
                                       sP, sV0, s_row_scale, s_row_inv, pipe_q, pipe_k, scale_log2, storage)
            else:
                cute.arch.setmaxregister_increase(self.pv_regs)
                begin_req, begin_block, end_req, end_block, begin_split = self.work_list(mMeta)
                self.mma_pv(wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block, begin_split,
                            mSeqlens, mNumSplits, mO, mLSE, mOaccum, mLSEaccum, sK, sP, sV1, s_row_scale,
                            s_row_inv, pipe_k, storage)

    # ------------------------------------------------------------- producer
    @cute.jit
    def load(self, wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block, begin_split,
             tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens, mNumSplits, sQ, sK, pipe_q, pipe_k):
        """Every load of the work list, in the consumers' order: Q of a request, then its K tiles.

        Q before the tiles: WG1 releases Q as soon as the chunk's last QK is done, while the stage
        the next request's first tile needs is released only after the last-but-one tile's P.V, so
        the Q load starts first. Whole warps run the producer code: the DSL's TMA issue and
        expect-tx arrive elect one lane with a full-warp elect.sync.
        """
        warp = cute.arch.make_warp_uniform(wg_tidx // 32)
        is_q_producer = warp == 0
        is_k_producer = warp < self.loader.producer_warps
        q_prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        k_prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
        for r in cutlass.range(begin_req, end_req + 1, unroll=1):
            seqlen, n_blocks, start, stop, is_split, split_idx = self.chunk_bounds(
                r, begin_req, begin_block, end_req, end_block, begin_split, mSeqlens, mNumSplits)
            if is_q_producer:
                self.tma_load_q(tma_q, mQ, sQ, pipe_q, q_prod, m_block, kv_head, r)
                q_prod.advance()
            if is_k_producer:
                for blk in cutlass.range(start, stop, self.split_cluster, unroll=1):
                    self.loader.load_tile(tma_k, mK, sK, mBlockTable, pipe_k, k_prod, r, blk, seqlen, kv_head,
                                          wg_tidx)
                    k_prod.advance()
            if const_expr(self.split_cluster > 1):
                # The consumers reduce the chunk in the K stages: no load of the next chunk before.
                self.cluster_idle()
        if const_expr(not paged_kv.uses_tma(self.page_size)):
            # No gather thread leaves with copies in flight (their completion arrives on the stage
            # barriers the consumers still wait on).
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(0)

    # ------------------------------------------------------------ consumers
    @cute.jit
    def hand_off_p(self, rP, tPsP, row_scale, s_row_scale, tScS, wg_tidx):
        """WG1 -> WG2: P (bf16) and the row factors into smem, once WG2 is done with the previous P."""
        pipeline.NamedBarrier(barrier_id=int(Bar.P_EMPTY), num_threads=CONSUMER_THREADS).arrive_and_wait()
        cute.autovec_copy(rP, tPsP)
        if wg_tidx % 4 == 0:
            for i in cutlass.range_constexpr(cute.size(row_scale, mode=[0])):
                s_row_scale[tScS[i, 0][0]] = row_scale[i]
        cute.arch.fence_view_async_shared()  # P is read by wgmma (async proxy)
        pipeline.NamedBarrier(barrier_id=int(Bar.P_FULL), num_threads=CONSUMER_THREADS).arrive()
        # WG1's own P.V reads the whole tile: every WG1 thread's part must be written first.
        pipeline.NamedBarrier(barrier_id=int(Bar.QK_WG), num_threads=WG_THREADS).arrive_and_wait()

    @cute.jit
    def mma_qk_softmax_pv(self, wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block, begin_split,
                          mSeqlens, mNumSplits, mO, mLSE, mOaccum, mLSEaccum, sQ, sK, sP, sV0, s_row_scale,
                          s_row_inv, pipe_q, pipe_k, scale_log2, storage):
        """WG1: QK, softmax, P hand-off, P.V for columns 0..255 (module docstring: the overlap)."""
        mma_qk, _, mma_pv_ss = self.tiled_mmas()
        p_full = pipeline.NamedBarrier(barrier_id=int(Bar.P_FULL), num_threads=CONSUMER_THREADS)
        p_empty = pipeline.NamedBarrier(barrier_id=int(Bar.P_EMPTY), num_threads=CONSUMER_THREADS)
        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        thr_qk = mma_qk.get_slice(wg_tidx)
        thr_pv = mma_pv_ss.get_slice(wg_tidx)
        tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ))
        tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK))
        tOrP = thr_pv.make_fragment_A(thr_pv.partition_A(sP))  # P from smem, as WG2 (module docstring)
        tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(sV0))
        tPsP = thr_qk.partition_C(sP)
        cS = cute.make_identity_tensor((BLOCK_M, BLOCK_N))
        tScS = layouts.acc_mn_view(thr_qk.partition_C(cS))
        n_rows_thr = cute.size(tScS, mode=[0])

        for r in cutlass.range(begin_req, end_req + 1, unroll=1):
            seqlen, n_blocks, start, stop, is_split, split_idx = self.chunk_bounds(
                r, begin_req, begin_block, end_req, end_block, begin_split, mSeqlens, mNumSplits)
            acc_s = cute.make_rmem_tensor(thr_qk.partition_shape_C((BLOCK_M, BLOCK_N)), Float32)
            rP = cute.make_rmem_tensor_like(acc_s, self.dtype)
            acc_o, acc_o_mn, row_max, row_sum, row_scale = self.new_chunk_state(thr_pv, n_rows_thr)
            row_limit = self.row_limits(seqlen, m_block, tScS)

            # Q is released right after the chunk's last QK, so the producer can load the next
            # request's Q during the last P.V and the epilogue.
            pipe_q.consumer_wait(q_state)
            if start < stop:
                # Prologue: S(start) -> P(start) in rP, handed to WG2.
                self.loader.consumer_wait(pipe_k, k_state)
                self.issue_qk(acc_s, tSrQ, tSrK, k_state.index)
                warpgroup.wait_group(0)
                if start + self.split_cluster >= stop:  # start is the chunk's only tile here
                    pipe_q.consumer_release(q_state)
                self.softmax_tile(acc_s, start, seqlen, row_limit, tScS, row_max, row_sum, row_scale, scale_log2)
                rP.store(acc_s.load().to(self.dtype))
                self.hand_off_p(rP, tPsP, row_scale, s_row_scale, tScS, wg_tidx)
            else:
                pipe_q.consumer_release(q_state)  # a zero-length request: no tile, nothing read

            # Iteration blk: rP holds P(blk), row_scale its factor; P(blk) is already with WG2.
            for blk in cutlass.range(start, stop, self.split_cluster, unroll=1):
                k_next = k_state.clone()
                k_next.advance()
                has_next = blk + self.split_cluster < stop
                softmax.rescale_rows_if_needed(acc_o_mn, row_scale)
                # (only the request's last tile has rows to zero: it never has a next tile in this chunk)
                self.zero_tail_v_rows(sK, k_state.index, seqlen - blk * BLOCK_N, 0, HALF, wg_tidx, int(Bar.QK_WG))
                # Has tile blk+1 landed? (non-blocking; a stale "true" is impossible: the stage's
                # phase cannot flip back before this warpgroup releases it.) The two branches issue
                # different wgmma sequences, so all four warps must take the same one: test_wait is
                # per thread and the warps test at different times, so the answer is OR-reduced over
                # the warpgroup (any thread that saw the tile means it has landed for all of them;
                # the branch's consumer_wait still blocks, so correctness never rests on the value).
                landed = warpgroup_any(has_next & pipe_k.sync_object_full.test_wait(k_next.index, k_next.phase),
                                       int(Bar.LANDED))
                if landed:
                    self.loader.consumer_wait(pipe_k, k_next)  # returns at once; the gather's proxy fence
                    self.issue_qk(acc_s, tSrQ, tSrK, k_next.index)
                    self.issue_pv(acc_o, tOrP, tOrV, k_state.index)
                    warpgroup.wait_group(1)  # QK(blk+1) done; P.V(blk) may still run
                    if blk + 2 * self.split_cluster >= stop:  # tile blk + step is the last
                        pipe_q.consumer_release(q_state)
                    self.softmax_tile(acc_s, blk + self.split_cluster, seqlen, row_limit, tScS, row_max, row_sum, row_scale,
                                      scale_log2)
                    warpgroup.wait_group(0)  # P.V(blk) done: rP and tile blk are free
                    self.loader.consumer_release(pipe_k, k_state)
                else:
                    self.issue_pv(acc_o, tOrP, tOrV, k_state.index)
                    warpgroup.wait_group(0)
                    self.loader.consumer_release(pipe_k, k_state)
                    if has_next:
                        self.loader.consumer_wait(pipe_k, k_next)
                        self.issue_qk(acc_s, tSrQ, tSrK, k_next.index)
                        warpgroup.wait_group(0)
                        if blk + 2 * self.split_cluster >= stop:  # tile blk + step is the last
                            pipe_q.consumer_release(q_state)
                        self.softmax_tile(acc_s, blk + self.split_cluster, seqlen, row_limit, tScS, row_max, row_sum, row_scale,
                                          scale_log2)
                if has_next:
                    rP.store(acc_s.load().to(self.dtype))
                    self.hand_off_p(rP, tPsP, row_scale, s_row_scale, tScS, wg_tidx)
                k_state.advance()
            q_state.advance()

            row_inv = cute.make_rmem_tensor(n_rows_thr, Float32)
            row_lse = cute.make_rmem_tensor(n_rows_thr, Float32)
            softmax.finalize_rows(row_max, row_sum, row_inv, row_lse, scale_log2, self.empty_row_lse(is_split))
            p_empty.arrive_and_wait()
            if wg_tidx % 4 == 0:
                for i in cutlass.range_constexpr(n_rows_thr):
                    s_row_inv[tScS[i, 0][0]] = row_inv[i]
            p_full.arrive()
            self.store_chunk(acc_o, mma_pv_ss, wg_tidx, wg_tidx, row_inv, row_lse, True, 0, m_block, kv_head, r,
                             is_split, split_idx, mO, mLSE, mOaccum, mLSEaccum, storage)
        # Pairs WG2's last P_EMPTY arrive so no arrival is left pending at exit.
        p_empty.arrive_and_wait()

    @cute.jit
    def mma_pv(self, wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block, begin_split,
               mSeqlens, mNumSplits, mO, mLSE, mOaccum, mLSEaccum, sK, sP, sV1, s_row_scale, s_row_inv, pipe_k,
               storage):
        """WG2: P.V for columns 256..511 with P from smem, per WG1's hand-off."""
        _, _, mma_pv_ss = self.tiled_mmas()
        p_full = pipeline.NamedBarrier(barrier_id=int(Bar.P_FULL), num_threads=CONSUMER_THREADS)
        p_empty = pipeline.NamedBarrier(barrier_id=int(Bar.P_EMPTY), num_threads=CONSUMER_THREADS)
        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        thr_pv = mma_pv_ss.get_slice(wg_tidx)
        tOrP = thr_pv.make_fragment_A(thr_pv.partition_A(sP))
        tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(sV1))
        cO = cute.make_identity_tensor((BLOCK_M, HALF))
        tOcO = layouts.acc_mn_view(thr_pv.partition_C(cO))
        n_rows_thr = cute.size(tOcO, mode=[0])

        p_empty.arrive()  # the queue starts empty: WG1's first P write may go ahead
        for r in cutlass.range(begin_req, end_req + 1, unroll=1):
            seqlen, n_blocks, start, stop, is_split, split_idx = self.chunk_bounds(
                r, begin_req, begin_block, end_req, end_block, begin_split, mSeqlens, mNumSplits)
            acc_o = cute.make_rmem_tensor(thr_pv.partition_shape_C((BLOCK_M, HALF)), Float32)
            acc_o.fill(0.0)
            acc_o_mn = layouts.acc_mn_view(acc_o)
            row_scale = cute.make_rmem_tensor(n_rows_thr, Float32)
            for blk in cutlass.range(start, stop, self.split_cluster, unroll=1):
                p_full.arrive_and_wait()
                for i in cutlass.range_constexpr(n_rows_thr):
                    row_scale[i] = s_row_scale[tOcO[i, 0][0]]
                softmax.rescale_rows_if_needed(acc_o_mn, row_scale)
                self.loader.consumer_wait(pipe_k, k_state)  # already full: WG1 scored this tile
                self.zero_tail_v_rows(sK, k_state.index, seqlen - blk * BLOCK_N, HALF, HALF, wg_tidx, int(Bar.PV_WG))
                self.issue_pv(acc_o, tOrP, tOrV, k_state.index)
                warpgroup.wait_group(0)
                p_empty.arrive()
                self.loader.consumer_release(pipe_k, k_state)
                k_state.advance()
            p_full.arrive_and_wait()
            row_inv = cute.make_rmem_tensor(n_rows_thr, Float32)
            for i in cutlass.range_constexpr(n_rows_thr):
                row_inv[i] = s_row_inv[tOcO[i, 0][0]]
            p_empty.arrive()
            self.store_chunk(acc_o, mma_pv_ss, wg_tidx, wg_tidx + WG_THREADS, row_inv, row_inv, False, HALF, m_block,
                             kv_head, r, is_split, split_idx, mO, mLSE, mOaccum, mLSEaccum, storage)
