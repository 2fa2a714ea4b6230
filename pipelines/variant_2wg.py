"""2-warpgroup pipeline, FlashMLA's original form (256 threads, no producer warpgroup).

Roles per 64-token KV tile:
- WG0 (warps 0-3): S = Q.K^T over 576 dims (SS wgmma, 64x64), mask, online softmax; hands P (bf16)
  and the row rescale factors to WG1 through smem; then O[:, 0:256] += P.V[:, 0:256] with P straight
  from registers (RS wgmma).
- WG1 (warps 4-7): its first warp issues the TMA loads (Q per request, K tiles two ahead), then
  O[:, 256:512] += P.V[:, 256:512] with P from smem (SS wgmma).
Why not FA3 ping-pong: two 64x512 fp32 O tiles do not fit the register file; splitting O by columns
across the two warpgroups keeps 128 accumulator registers per thread.

K stages: at 65-128 rows per kv head (s_q 1) each stage fills as two column groups with their own barriers
(``kv_groups``): V's left half, which only WG0 reads, is refilled as soon as WG0's P.V retired.

Ordering between the warpgroups uses two named barriers: P_FULL (WG0 arrives after writing P and
the factors, WG1 waits) and P_EMPTY (WG1 arrives after its P.V, WG0 waits before overwriting P).
WG0 also publishes 1/rowsum through P_FULL once a chunk is done.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import warpgroup

from pipelines import layouts, paged_kv, softmax
from pipelines.paged_kv import COL_BLOCK
from pipelines.skeleton import BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, MLADecodeBase

# named barrier ids (0 is __syncthreads)
BAR_P_FULL = 1
BAR_P_EMPTY = 2
BAR_WG0 = 3
BAR_WG1 = 4
BAR_PV_ISSUED = 5  # qk_ahead: WG1 arrives once its P.V of a tile is issued; WG0 waits before the next QK
HALF = HEAD_DIM_V // 2
# ``kv_groups = 2``: a K stage's 64-column blocks in two groups with their own barriers
# (``MLADecode2WG.kv_group_cols``). Group A holds V's left half, which only WG0 reads (its QK and its P.V);
# group B V's right half (WG0's QK, WG1's P.V).


class MLADecode2WG(MLADecodeBase):
    num_threads = 256
    kv_stages = 2
    q_consumer_warps = 4  # WG0 alone reads Q
    k_consumer_warps = 8  # both warpgroups read every K tile
    # Issue the next chunk's Q and first K tiles before this chunk's epilogue (``wg1_load_pv``). A class
    # constant (the kernel cache keys on the sources); an A/B sets it False with the disk cache off.
    prefetch_next_chunk = True
    early_cluster_arrive = True  # skeleton: both warpgroups arrive after their last K release
    in_grid_merge = True  # skeleton: the split-kv merge in this grid where the API asks for it
    late_cluster_start_wait = True  # skeleton: the start's cluster wait after the plan row's loads
    # K tiles are read once per CTA (or once per cluster, multicast) and never again: marking them first
    # to leave L2 keeps Q, the block table and the other m-block CTAs' lines. Measured on H200s (paired
    # A/B, docs/perf-notes.md): 0.947-0.964 at b64 h128 1024, b64 h32 1024, b128 h16 1024, b32 h64 4096,
    # 0.96-0.99 at b128 h128 1024, within 1% at 4096-16384 keys on one machine (1.02-1.04 at b128 h128
    # 16384 on another). evict_last was never faster.
    kv_l2_hint = "evict_first"
    # L2 prefetch distance (TMA pages): each time a stage is refilled with tile t, the K producer warps
    # also prefetch tile t + l2_prefetch_ahead of the chunk into L2 (``paged_kv.TmaPagedKV.prefetch_tile``),
    # so that its load, issued when its stage frees, reads L2; the chunk's first loads prefetch the
    # tiles after them. 0: off (the default). A first form read each prefetch's page id right before
    # issuing it, on the warp that also issues WG1's P.V; measured on an H100 it was 5.5% faster at b8 s1
    # h64 4096 and 6% slower at b64 s1 h128 1024 and b128 s1 h16 4096 (docs/perf-notes.md, twelfth
    # session). This form reads the page id a tile early, like the loads'; at 2 ahead, paired on an H100
    # (twenty-third session): 0.986 at b1 s1 h128 16384, 0.993 at b8 s1 h64 4096, but 1.012-1.023 at b128
    # s1 h128 4096 and 1.038-1.051 at b64 s1 h128 1024, so it stays off. A class constant like kv_l2_hint
    # (an A/B sets it on a subclass: scripts/entry_ab.py).
    l2_prefetch_ahead = 0
    # Short chunks: when a chunk has at most this many K tiles, the K producer warps prefetch all of its
    # tiles after the first kv_stages into L2 when they issue the chunk's first loads (``load_chunk_head``),
    # so a chunk of a few tiles pays the HBM latency about once instead of once per refill (the
    # latency-bound rows: few requests, or many parts). Longer chunks are streamed as before (a CTA
    # working through many tiles is limited by bandwidth or by its math, where earlier prefetch forms
    # cost up to 6%, and prefetching whole 16-tile chunks cost up to 19%: 132 CTAs x 14 tiles x 72 KB is
    # more than L2 holds; at 8 tiles the grid's largest footprint is 28 MB). Measured on an H100 (paired
    # A/B against 0, docs/perf-notes.md, thirteenth session): 0.96 at b8 s1 h64 4096, 0.975 at b8 s1 h16
    # 4096, 0.98-0.99 at b32 1024 keys and b1 s2 h128 4096, 0.98-1.003 on the 13 other configs measured.
    # 0: off. A class constant (the kernel cache keys on the sources).
    l2_prefetch_chunk_tiles = 8
    # A chunk's first loads: Q's TMA and the first tiles' page ids on the plan row alone, before the
    # request's length is back (``load_chunk_head``). A class constant like prefetch_next_chunk (an A/B
    # sets it False: the length first, as before).
    head_pages_early = True
    # The CTA's first chunk: its second K tile goes out only once the first has landed (``load_head_tiles``),
    # where a CTA has at least ``head_tiles_in_turn_rows`` query rows per kv head. Why: at the kernel's start
    # every CTA asks for Q and two tiles at once (19 MB at b64 s1 h128 1024, about 6.5 us of HBM on an H100),
    # and the first QK needs only Q and tile 0; the second is needed a tile's time later. Paired on an H100
    # (entry_ab mode ``2wg-head-in-turn``, docs/perf-notes.md, forty-second session; bit-identical): 0.987-0.995
    # at 128-256 rows (b64 s1 h128 1024, b32 s2 h128 1024, b64 s2 h64 1024, b128 s1 h128 1024 and 4096; 0.3-1.2%
    # faster on four more), 0.2-0.8% slower on two small-batch 128-row rows (b1 s1 h128 16384, b8 s1 h128 4096),
    # and 1.005-1.007 at 64 rows (b8 s1 h64 4096), where it is not taken. A class constant (an A/B sets it False).
    head_tiles_in_turn = True
    head_tiles_in_turn_rows = 65
    # A refill's page id read a tile early (``next_page_early``) on every TMA path; False: only where a
    # tile is several boxes (pages 16 and 32), the one-box path (pages 64 and 128) reading it after the
    # stage frees, right before the TMA, as before. A class constant like head_pages_early (an A/B
    # sets it False).
    refill_pages_early = True
    # Q's TMA from a warp of WG1 that issues no K box where there is one (``q_producer_warp``): a warp
    # issues its TMA copies one after another (about 15 uniform instructions each), so a chunk head's
    # 9 Q copies would no longer sit in front of its K copies. Off here (warp 0 issues both): measured
    # on an H100 (paired, docs/perf-notes.md, seventeenth session) this 64-row kernel gained 0.5-0.8% at
    # b8 h64 4096 and lost 0.4-1% at b1 h128 16384 and 0.3-0.9% at b128 h128 4096; the narrow kernel,
    # which gained 1.3-2.7%, sets it. A class constant (an A/B sets it on a subclass).
    q_warp_apart = False
    # WG0 stores P for WG1 before its own P.V but issues the proxy fence and P_FULL after that P.V's issue
    # (``store_p_for_wg1``), so the fence (MEMBAR.ALL.CTA, which waits for the stores) is not between the
    # softmax and WG0's P.V; WG1's P.V, issued later, queues behind WG0's in the tensor pipe anyway. P's
    # registers are not touched once the P.V that reads them is issued (an earlier form that stored P after
    # that issue lost 0.3-8%, docs/perf-notes.md, fourteenth session). Measured on an H200 with the tree max
    # (paired, twentieth session): 0.95-0.99 on the 64-row rows. A class constant (an A/B sets it False).
    p_fence_after_pv = True
    # P's tile without swizzle (wgmma's interleaved K-major layout: 8 x 16-byte core matrices), so that a
    # thread's 16 stores of P are one base register plus immediate offsets (the 128B swizzle took about 55
    # address instructions per tile on WG0's path) and each warp store still writes 128 contiguous bytes.
    # Measured on an H200 (paired, twentieth session): 0.977-1.005, 14 of 16 readings at or below 1.0 on the
    # 64-row rows; outputs bit-identical. A class constant (an A/B sets it False).
    p_interleaved = True
    # WG0 issues the QK of tile t + 1 right behind its P.V of tile t, once WG1 has issued its own P.V of t
    # (BAR_PV_ISSUED), so the tensor pipe goes from both P.V halves straight into the next QK instead of
    # idling through WG0's P.V wait, the stage release and the loop (``wg0_tiles_qk_ahead``). Off: paired
    # on an H100 (twenty-third session) it is 1.11-1.15x at b128 s1 h128 4096, 1.07-1.08x at b64 s1 h128
    # 1024 and 1.06x at b1 s1 h128 16384, and 1.11-1.17x at b128 s1 h128 4096 with every K tile an L2 hit
    # (``scripts/l2_bound.py``), so the K loads are not what it loses to. Stamped (``scripts/segment_probe.py``)
    # its tile's non-wgmma segments run about 540 cycles longer than in 2wg's order (softmax 831 against
    # 584 cycles) with no wgmma in flight. Peeling the chunk's last tile off the loop (as now: 224
    # registers instead of 252, no last-tile path keeping S live) gained 2-4 points: 1.10-1.12x at b128 s1
    # h128 4096, 1.07x at b64 s1 h128 1024, 1.02-1.03x at b1 s1 h128 16384. ncu's per-instruction samples
    # (twenty-fourth session) show where: it saves the P.V retire wait, but the next K tile is not there when
    # its QK goes out early, and the loop's code under register pressure recomputes thread-index values and
    # waits on a register the P stores still hold; with ``kv_groups`` 2 WG1's producer also waits for group
    # A's release before its P.V retires (docs/perf-notes.md). Kept for that A/B; a class constant (the
    # default SASS is byte-identical to the kernel without it).
    qk_ahead = False
    # With qk_ahead: whether WG0 waits for WG1's P.V issue (BAR_PV_ISSUED) before the next QK. False: the QK
    # goes right behind WG0's own P.V and WG1's P.V queues behind that QK, beside WG0's next softmax (the
    # twelfth session's form); the stage of t is then released a QK later. A class constant.
    qk_ahead_waits_pv = True
    # 2: each K stage fills in two column groups (``kv_group_cols``) on their own full and empty barriers, so
    # V's left half (group A, read by WG0 alone) is refilled as soon as WG0's P.V of the tile retired,
    # instead of after WG1's P.V too (about 600 cycles later); WG0 releases group B once its QK retired and
    # starts each QK on group A (``kv_groups_qk_split``). In a multicast cluster each group's release goes
    # to both CTAs, as the tile's does with one group. Taken where the CTA has 65-128 query rows per kv head
    # from one query position (s_q 1: h_q 128 with one kv head) with TMA pages and no split cluster; elsewhere
    # 1. Measured on H100s (paired over one group, 2026-11-26; docs/perf-notes.md, twenty-fourth session):
    # 0.98-0.99 at b128 s1 h128 1024/4096/16384, b64 s1 h128 1024, b32 s1 h128 4096, pages 16 and 128 too;
    # 0.99-1.00 at b1 s1 h128 16384; 1.000-1.009 at b8 s1 h128 4096. Not taken: s_q 2 at h_q 64 (128 rows,
    # causal: 0.99-1.01, mostly slower), 64 rows (b128 s1 h64 4096: 1.003-1.008), 256 rows (b128 s2 h128 4096:
    # 0.995-1.023; again, with ``kv_groups_sq`` and ``kv_groups_rows`` widened, twenty-sixth session: 1.002-1.027
    # at b64/b128 s2 h128 4096, 0.999-1.008 at b32-b128 s2 h128 1024, 0.984-1.000 at s2 h64). 1: one barrier pair
    # per stage. A class constant (an A/B sets it on a subclass; 2 still falls back to 1 where it is not taken).
    # A chunk's tiles in two loops per warpgroup: the steady ones first (``steady_end``: no mask, no zeroed V rows,
    # the stage's refill always due), compiled without those checks, then the rest with them (the default
    # order only, not ``qk_ahead``). The seesaw's form of it measured 5-11% faster paired on an H100 at 128-256
    # rows (docs/perf-notes.md, thirty-sixth session). Prepared, not run on a GPU (entry_ab mode
    # ``2wg-steady``).
    steady_loop = False
    kv_groups = 2
    kv_groups_rows = (65, 128)  # the rows per kv head where kv_groups 2 is taken (with s_q in kv_groups_sq)
    kv_groups_sq = (1,)  # the query lengths where kv_groups 2 is taken (an A/B widens both)
    # The 64-column blocks of groups A and B (block 8 is RoPE, read by WG0's QK alone; V's right half,
    # blocks 4-7, must be in B: WG1 reads it). The QK runs A's blocks first, then B's, in these orders.
    kv_group_cols = ((0, 1, 2, 3), (4, 5, 6, 7, 8))
    # With kv_groups 2: WG0's QK waits for group B halfway through its chain (True), or for both groups
    # before it (False: 1.00-1.01 over one group on the same rows, H100; the split wins although ncu shows
    # the first wgmma after the mid-chain fence stalling). A class constant.
    kv_groups_qk_split = True

    def __init__(self, dtype, num_heads: int, seqlen_q: int, page_size: int, causal: bool, num_heads_k: int = 1,
                 multicast: bool = True, split_cluster: int = 1):
        if self.steady_loop and self.qk_ahead:
            # WG0's qk_ahead loop is not split; only WG1's would be (correct, but half the option).
            raise ValueError("steady_loop is not built for qk_ahead (WG0's qk_ahead loop has no steady split)")
        rows = num_heads // max(num_heads_k, 1) * seqlen_q
        lo, hi = self.kv_groups_rows
        if self.kv_groups == 2 and (split_cluster > 1 or not paged_kv.uses_tma(page_size) or not lo <= rows <= hi
                                    or seqlen_q not in self.kv_groups_sq):
            # Column groups need TMA pages, and a split cluster's epilogue reuses the K stages as scratch: one
            # group there, and outside ``kv_groups_rows`` / ``kv_groups_sq``, where they did not win (``kv_groups``).
            # The instance's value shadows the class constant before the skeleton reads it.
            self.kv_groups = 1
        if self.head_tiles_in_turn and rows < self.head_tiles_in_turn_rows:
            self.head_tiles_in_turn = False  # (the instance's value shadows the class constant)
        super().__init__(dtype, num_heads, seqlen_q, page_size, causal, num_heads_k, multicast, split_cluster)

    def kv_col_groups(self) -> tuple:
        return super().kv_col_groups() if self.kv_groups == 1 else self.kv_group_cols

    def make_pipelines(self, storage):
        """Q as in the skeleton; K as one pipeline (``kv_groups`` 1) or one per column group over the same
        stages (2): group A consumed by WG0's four warps, group B by all eight."""
        if self.kv_groups == 1:
            return super().make_pipelines(storage)
        pipe_q = self.make_q_pipeline(storage)
        block_bytes = BLOCK_N * COL_BLOCK * self.dtype.width // 8
        ptr = storage.mbar_k.data_ptr()
        pipe_a = self.loader.make_pipeline(ptr, 4, tx_bytes=len(self.kv_group_cols[0]) * block_bytes)
        pipe_b = self.loader.make_pipeline(ptr + 2 * self.kv_stages, 8, tx_bytes=len(self.kv_group_cols[1]) * block_bytes)
        return pipe_q, (pipe_a, pipe_b)

    @cute.jit
    def load_k(self, tma_k, mK, sK, mBlockTable, pipe_k, k_prod, r, blk, seqlen, kv_head, wg_tidx, page=None,
               group: cutlass.Constexpr[int] = -1):
        """A K producer warp's load of tile ``blk`` into the stage ``k_prod`` points at (acquired inside):
        the whole tile, or with ``kv_groups`` 2 both groups (``group`` -1) or one of them (0: A, 1: B)."""
        if const_expr(self.kv_groups == 1):
            self.loader.load_tile(tma_k, mK, sK, mBlockTable, pipe_k, k_prod, r, blk, seqlen, kv_head, wg_tidx,
                                  page=page)
        else:
            pipe_a, pipe_b = pipe_k
            if const_expr(group != 1):
                self.loader.load_tile(tma_k, mK, sK, mBlockTable, pipe_a, k_prod, r, blk, seqlen, kv_head, wg_tidx,
                                      page=page, cols=self.kv_group_cols[0])
            if const_expr(group != 0):
                self.loader.load_tile(tma_k, mK, sK, mBlockTable, pipe_b, k_prod, r, blk, seqlen, kv_head, wg_tidx,
                                      page=page, cols=self.kv_group_cols[1])

    @cute.jit
    def wg0_qk(self, acc_s, tSrQ, tSrK, pipe_k, k_state):
        """WG0: wait for the tile in ``k_state``'s stage and issue its QK as one committed group (not
        waited for). With ``kv_groups`` 2 the chain starts on group A and waits for group B halfway."""
        if const_expr(self.kv_groups == 1):
            self.k_wait(pipe_k, k_state, spin=self.k_wait_spin)
            self.issue_qk(acc_s, tSrQ, tSrK, k_state.index)
        else:
            mma_qk, _, _ = self.tiled_mmas()
            self.k_wait(pipe_k, k_state, 0, self.k_wait_spin)
            if const_expr(not self.kv_groups_qk_split):
                self.k_wait(pipe_k, k_state, 1, self.k_wait_spin)
            warpgroup.fence()  # after the barrier's wait loop (else ptxas serializes the chain)
            self.qk_blocks(mma_qk, acc_s, tSrQ, tSrK, k_state.index, self.kv_group_cols[0], True)
            if const_expr(self.kv_groups_qk_split):
                self.k_wait(pipe_k, k_state, 1, self.k_wait_spin)
                warpgroup.fence()
            self.qk_blocks(mma_qk, acc_s, tSrQ, tSrK, k_state.index, self.kv_group_cols[1], False)
            warpgroup.commit_group()

    def k_pipes(self, pipe_k, group: int) -> list:
        """The K pipelines a wait or release of ``group`` acts on: the one pipeline with ``kv_groups`` 1, else
        group ``group``'s (0: A, 1: B) or both (-1)."""
        if self.kv_groups == 1:
            return [pipe_k]
        return [pipe_k[g] for g in (0, 1) if group in (-1, g)]

    @cute.jit
    def k_wait(self, pipe_k, k_state, group: cutlass.Constexpr[int] = -1, spin: cutlass.Constexpr[bool] = False):
        """Wait for the stage of ``k_state``: the whole tile, or with ``kv_groups`` 2 the group ``group``
        (``k_pipes``); ``spin``: by polling (WG0's QK waits with ``k_wait_spin``)."""
        pipes = self.k_pipes(pipe_k, group)
        for i in cutlass.range_constexpr(len(pipes)):
            self.loader.consumer_wait(pipes[i], k_state, spin)

    @cute.jit
    def k_release(self, pipe_k, k_state, group: cutlass.Constexpr[int] = -1):
        """Release the stage of ``k_state``: the whole tile, or with ``kv_groups`` 2 the group ``group``
        (``k_pipes``)."""
        pipes = self.k_pipes(pipe_k, group)
        for i in cutlass.range_constexpr(len(pipes)):
            self.loader.consumer_release(pipes[i], k_state)

    @cute.jit
    def wg0_release_after_qk(self, pipe_k, k_state):
        """WG0 once its QK of the tile retired: group B with ``kv_groups`` 2 (WG0 reads no more of it), else
        nothing."""
        if const_expr(self.kv_groups == 2):
            self.k_release(pipe_k, k_state, 1)

    @cute.jit
    def wg0_release_after_pv(self, pipe_k, k_state):
        """WG0 once its P.V of the tile retired: group A with ``kv_groups`` 2 (B went after the QK), else the
        tile."""
        self.k_release(pipe_k, k_state, 0 if const_expr(self.kv_groups == 2) else -1)

    def wg1_group(self) -> int:
        """The K group WG1's P.V reads (``k_wait`` / ``k_release`` / ``load_k``): B with ``kv_groups`` 2, else
        the tile (-1)."""
        return 1 if self.kv_groups == 2 else -1

    @cute.jit
    def warpgroup_roles(self, tidx, m_block, kv_head, mMeta, tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens,
                        mNumSplits, mO, mLSE, mOaccum, mLSEaccum, sQ, sK, sP, storage, pipe_q, pipe_k, scale_log2,
                        merge_tail=None):
        begin_req, begin_block, end_req, end_block, begin_split = self.work_list(mMeta)
        self.cluster_start_wait()  # the plan row's loads are out: they overlap the wait
        wg = tidx // 128
        wg_tidx = tidx % 128
        # V^T halves viewed in place from the K stages (MN-major B operand, no copy).
        sV_layout = layouts.v_view_layout(sK.layout, HALF, BLOCK_N, HEAD_DIM, self.kv_stages)
        sV0 = cute.make_tensor(sK.iterator, sV_layout)
        sV1 = cute.make_tensor(sK.iterator + HALF * BLOCK_N, sV_layout)
        s_row_scale = storage.row_scale.get_tensor(cute.make_layout(BLOCK_M))
        s_row_inv = storage.row_inv.get_tensor(cute.make_layout(BLOCK_M))

        # Pipeline states and MMA objects are created inside each role: they are mutated while
        # tracing, and the two roles are two branches of one dynamic if.
        if wg == 0:
            self.wg0_qk_softmax_pv(wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block, begin_split,
                                   mSeqlens, mNumSplits, mO, mLSE, mOaccum, mLSEaccum, sQ, sK, sP, sV0,
                                   s_row_scale, s_row_inv, pipe_q, pipe_k, scale_log2, storage)
        else:
            self.wg1_load_pv(wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block, begin_split,
                             tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens, mNumSplits, mO, mLSE, mOaccum,
                             mLSEaccum, sQ, sK, sP, sV1, s_row_scale, s_row_inv, pipe_q, pipe_k, storage)

    # ------------------------------------------------------------------ WG0
    @cute.jit
    def wg0_qk_softmax_pv(self, wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block, begin_split,
                          mSeqlens, mNumSplits, mO, mLSE, mOaccum, mLSEaccum, sQ, sK, sP, sV0, s_row_scale,
                          s_row_inv, pipe_q, pipe_k, scale_log2, storage):
        _, mma_pv_rs, thr_qk, thr_pv, tSrQ, tSrK, tOrV, tPsP, tScS = self.wg0_fragments(wg_tidx, sQ, sK, sP, sV0)
        n_rows_thr = cute.size(tScS, mode=[0])
        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)

        for r in cutlass.range(begin_req, end_req + 1, unroll=1):
            seqlen, n_blocks, start, stop, is_split, split_idx = self.chunk_bounds(
                r, begin_req, begin_block, end_req, end_block, begin_split, mSeqlens, mNumSplits)
            acc_o, acc_o_mn, row_max, row_sum, row_scale = self.new_chunk_state(thr_pv, n_rows_thr)
            row_limit = self.row_limits(seqlen, m_block, tScS)

            pipe_q.consumer_wait(q_state)
            if const_expr(self.qk_ahead):
                k_state = self.wg0_tiles_qk_ahead(wg_tidx, start, stop, seqlen, row_limit, thr_qk, tSrQ, tSrK, tOrV,
                                                  tPsP, tScS, acc_o, acc_o_mn, row_max, row_sum, row_scale,
                                                  s_row_scale, sK, pipe_k, k_state, scale_log2)
            else:
                k_state = self.wg0_tiles(wg_tidx, start, stop, seqlen, row_limit, thr_qk, tSrQ, tSrK, tOrV, tPsP,
                                         tScS, acc_o, acc_o_mn, row_max, row_sum, row_scale, s_row_scale, sK, pipe_k,
                                         k_state, scale_log2)
            if const_expr(self.arrives_early()):
                if r == end_req:  # this warpgroup's last release (to the peer too) is behind it
                    cute.arch.cluster_arrive()
            pipe_q.consumer_release(q_state)
            q_state.advance()

            self.wg0_store_chunk(wg_tidx, m_block, kv_head, r, is_split, split_idx, acc_o, mma_pv_rs, row_max,
                                 row_sum, tScS, s_row_inv, scale_log2, mO, mLSE, mOaccum, mLSEaccum, storage)
        self.wg0_exit(begin_req, end_req)

    @cute.jit
    def wg0_softmax_p(self, acc_s, blk, seqlen, row_limit, tScS, tPsP, acc_o_mn, row_max, row_sum, row_scale,
                      s_row_scale, sK, k_state, scale_log2, wg_tidx, steady: cutlass.Constexpr[bool] = False):
        """WG0 between a tile's QK and its P.V: mask + online softmax of S, P (16-bit registers, returned)
        stored for WG1 (and published too unless ``p_fence_after_pv``), O rescaled where the max moved, and
        a tail tile's V rows zeroed in WG0's half (``steady``: the tile needs neither mask nor zeroing)."""
        self.softmax_tile(acc_s, blk, seqlen, row_limit, tScS, row_max, row_sum, row_scale, scale_log2,
                          mask=not steady)
        rP = cute.make_rmem_tensor_like(acc_s, self.dtype)
        rP.store(acc_s.load().to(self.dtype))
        if const_expr(self.p_fence_after_pv):
            self.store_p_for_wg1(rP, tPsP, tScS, row_scale, s_row_scale, wg_tidx)
        else:
            self.hand_p_to_wg1(rP, tPsP, tScS, row_scale, s_row_scale, wg_tidx)
        softmax.rescale_rows_if_needed(acc_o_mn, row_scale)
        self.zero_tail_v_rows(sK, k_state.index, seqlen - blk * BLOCK_N, 0, HALF, wg_tidx, BAR_WG0, steady)
        return rP

    @cute.jit
    def wg0_softmax_pv(self, acc_s, blk, seqlen, row_limit, tScS, tPsP, tOrV, acc_o, acc_o_mn, row_max, row_sum,
                       row_scale, s_row_scale, sK, k_state, scale_log2, wg_tidx,
                       steady: cutlass.Constexpr[bool] = False):
        """WG0 from a tile's S to its P.V in flight: ``wg0_softmax_p``, then O[:, 0:256] += P.V with P from
        registers (issued, not waited for), then the proxy fence and P_FULL with ``p_fence_after_pv``: P's
        stores were issued before this P.V (its registers are not touched after the issue), and the fence
        follows the issue so that WG0's P.V does not wait for it."""
        rP = self.wg0_softmax_p(acc_s, blk, seqlen, row_limit, tScS, tPsP, acc_o_mn, row_max, row_sum, row_scale,
                                s_row_scale, sK, k_state, scale_log2, wg_tidx, steady)
        self.issue_pv(acc_o, layouts.acc_as_a_operand(rP), tOrV, k_state.index, p_in_registers=True)
        if const_expr(self.p_fence_after_pv):
            self.publish_p()

    @cute.jit
    def wg0_tiles(self, wg_tidx, start, stop, seqlen, row_limit, thr_qk, tSrQ, tSrK, tOrV, tPsP, tScS, acc_o,
                  acc_o_mn, row_max, row_sum, row_scale, s_row_scale, sK, pipe_k, k_state, scale_log2):
        """WG0's tiles of one chunk: per tile, the stage wait, QK, softmax and P for WG1, its P.V, the stage
        release. Returns the consumer state past the chunk."""
        for lo, hi, steady in self.steady_loops(start, stop, seqlen):
            for blk in cutlass.range(lo, hi, self.split_cluster, unroll=1):
                acc_s = cute.make_rmem_tensor(thr_qk.partition_shape_C((BLOCK_M, BLOCK_N)), Float32)
                self.wg0_qk(acc_s, tSrQ, tSrK, pipe_k, k_state)
                warpgroup.wait_group(0)
                self.wg0_release_after_qk(pipe_k, k_state)
                self.wg0_softmax_pv(acc_s, blk, seqlen, row_limit, tScS, tPsP, tOrV, acc_o, acc_o_mn, row_max,
                                    row_sum, row_scale, s_row_scale, sK, k_state, scale_log2, wg_tidx, steady)
                warpgroup.wait_group(0)
                self.wg0_release_after_pv(pipe_k, k_state)
                k_state.advance()
        return k_state

    def refill_due(self, steady: bool, blk, stop):
        """Whether WG1 refills tile ``blk``'s stage with tile blk + kv_stages C: always in a steady tile
        (``steady_stop``), else while that tile is in the chunk (traced at each use, as written inline)."""
        return self.unless_steady(steady, blk + self.kv_stages * self.split_cluster < stop)

    @cute.jit
    def steady_stop(self, start, stop, seqlen):
        """Where ``steady_loop``'s first loop ends (``steady_end``): tile blk is steady when it needs no mask and
        no zeroed V rows and its stage's refill (blk + kv_stages C) is due."""
        return self.steady_end(start, stop, seqlen, self.split_cluster, 0, self.kv_stages * self.split_cluster)

    @cute.jit
    def wg0_tiles_qk_ahead(self, wg_tidx, start, stop, seqlen, row_limit, thr_qk, tSrQ, tSrK, tOrV, tPsP, tScS,
                           acc_o, acc_o_mn, row_max, row_sum, row_scale, s_row_scale, sK, pipe_k, k_state,
                           scale_log2):
        """WG0's tiles of one chunk with the next tile's QK issued behind each P.V (``qk_ahead``).

        The chunk's first QK is issued before the loop; each tile runs its softmax on the S the previous
        step left, issues its P.V (and publishes P), waits for the next stage (and, with
        ``qk_ahead_waits_pv``, for WG1's P.V issue: BAR_PV_ISSUED), issues the next QK into the same S
        registers (P has its own), retires the P.V (``wait_group(1)``), releases the stage, then retires
        the QK. The chunk's last tile is peeled off the loop, so the loop has no last-tile branch (that
        branch kept S's registers live through the softmax and doubled the loop's code). Every wgmma group
        retires inside the block that issued it (one in flight across a branch or loop iteration makes
        ptxas serialize every wgmma). Returns the consumer state past the chunk."""
        acc_s = cute.make_rmem_tensor(thr_qk.partition_shape_C((BLOCK_M, BLOCK_N)), Float32)
        last = stop
        if start < stop:
            last = start + (stop - 1 - start) // self.split_cluster * self.split_cluster
            self.wg0_qk(acc_s, tSrQ, tSrK, pipe_k, k_state)
            warpgroup.wait_group(0)
            self.wg0_release_after_qk(pipe_k, k_state)
        k_next = k_state.clone()
        k_next.advance()
        for blk in cutlass.range(start, last, self.split_cluster, unroll=1):
            self.wg0_softmax_pv(acc_s, blk, seqlen, row_limit, tScS, tPsP, tOrV, acc_o, acc_o_mn, row_max, row_sum,
                                row_scale, s_row_scale, sK, k_state, scale_log2, wg_tidx)
            if const_expr(self.kv_groups == 1):
                self.loader.consumer_wait(pipe_k, k_next, self.k_wait_spin)
                if const_expr(self.qk_ahead_waits_pv):
                    cute.arch.barrier(barrier_id=BAR_PV_ISSUED, number_of_threads=256)
                self.issue_qk(acc_s, tSrQ, tSrK, k_next.index)
            else:
                if const_expr(self.qk_ahead_waits_pv):
                    cute.arch.barrier(barrier_id=BAR_PV_ISSUED, number_of_threads=256)
                self.wg0_qk(acc_s, tSrQ, tSrK, pipe_k, k_next)
            warpgroup.wait_group(1)
            self.wg0_release_after_pv(pipe_k, k_state)
            warpgroup.wait_group(0)
            self.wg0_release_after_qk(pipe_k, k_next)
            k_state.advance()
            k_next.advance()
        if start < stop:
            self.wg0_softmax_pv(acc_s, last, seqlen, row_limit, tScS, tPsP, tOrV, acc_o, acc_o_mn, row_max, row_sum,
                                row_scale, s_row_scale, sK, k_state, scale_log2, wg_tidx)
            warpgroup.wait_group(0)
            self.wg0_release_after_pv(pipe_k, k_state)
            k_state.advance()
        return k_state

    def p_tile_layout(self, dtype):
        """P's tile: the interleaved (unswizzled) K-major layout with ``p_interleaved``, else the base's."""
        if self.p_interleaved:
            atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_INTER, dtype)
            return cute.tile_to_shape(atom, (BLOCK_M, BLOCK_N), order=(0, 1))
        return super().p_tile_layout(dtype)

    @cute.jit
    def wg0_fragments(self, wg_tidx, sQ, sK, sP, sV0):
        """WG0's MMA objects (QK; P.V with P from registers), their thread slices and its operand views:
        Q and K for QK, V's left half for P.V, P's smem tile as QK's C fragment, the score coordinates."""
        mma_qk, mma_pv_rs, _ = self.tiled_mmas()
        thr_qk = mma_qk.get_slice(wg_tidx)
        thr_pv = mma_pv_rs.get_slice(wg_tidx)
        tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ))
        tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK))
        tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(sV0))
        tPsP = thr_qk.partition_C(sP)
        tScS = layouts.acc_mn_view(thr_qk.partition_C(cute.make_identity_tensor((BLOCK_M, BLOCK_N))))
        return mma_qk, mma_pv_rs, thr_qk, thr_pv, tSrQ, tSrK, tOrV, tPsP, tScS

    @cute.jit
    def hand_p_to_wg1(self, rP, tPsP, tScS, row_scale, s_row_scale, wg_tidx):
        """P (16-bit registers) and the rows' rescale factors to WG1 through smem, once WG1 is done with
        the previous tile's P (P_EMPTY), then P_FULL."""
        self.store_p_for_wg1(rP, tPsP, tScS, row_scale, s_row_scale, wg_tidx)
        self.publish_p()

    @cute.jit
    def store_p_for_wg1(self, rP, tPsP, tScS, row_scale, s_row_scale, wg_tidx):
        """P and the rows' rescale factors into smem once WG1 is done with the previous tile's P (P_EMPTY),
        not yet published (``publish_p``)."""
        cute.arch.barrier(barrier_id=BAR_P_EMPTY, number_of_threads=256)
        cute.autovec_copy(rP, tPsP)
        if wg_tidx % 4 == 0:
            for i in cutlass.range_constexpr(cute.size(row_scale, mode=[0])):
                s_row_scale[tScS[i, 0][0]] = row_scale[i]

    @cute.jit
    def publish_p(self):
        """The stores of ``store_p_for_wg1`` to WG1: the proxy fence (WG1's wgmma reads P through the async
        proxy), then P_FULL."""
        cute.arch.fence_view_async_shared()
        cute.arch.barrier_arrive(barrier_id=BAR_P_FULL, number_of_threads=256)

    @cute.jit
    def wg0_store_chunk(self, wg_tidx, m_block, kv_head, r, is_split, split_idx, acc_o, mma_pv, row_max, row_sum,
                        tScS, s_row_inv, scale_log2, mO, mLSE, mOaccum, mLSEaccum, storage):
        """WG0 at the end of a chunk: 1/rowsum to WG1 (P_EMPTY / P_FULL), its half of O stored (with lse)."""
        n_rows_thr = cute.size(tScS, mode=[0])
        row_inv = cute.make_rmem_tensor(n_rows_thr, Float32)
        row_lse = cute.make_rmem_tensor(n_rows_thr, Float32)
        softmax.finalize_rows(row_max, row_sum, row_inv, row_lse, scale_log2, self.empty_row_lse(is_split))
        cute.arch.barrier(barrier_id=BAR_P_EMPTY, number_of_threads=256)
        if wg_tidx % 4 == 0:
            for i in cutlass.range_constexpr(n_rows_thr):
                s_row_inv[tScS[i, 0][0]] = row_inv[i]
        cute.arch.barrier_arrive(barrier_id=BAR_P_FULL, number_of_threads=256)
        self.store_chunk(acc_o, mma_pv, wg_tidx, wg_tidx, row_inv, row_lse, True, 0, m_block, kv_head, r,
                         is_split, split_idx, mO, mLSE, mOaccum, mLSEaccum, storage)

    @cute.jit
    def wg0_exit(self, begin_req, end_req):
        """Pairs WG1's last P_EMPTY arrive so no arrival is left pending at exit; a CTA with no work
        arrives on the exit's cluster barrier here (its loop did not)."""
        cute.arch.barrier(barrier_id=BAR_P_EMPTY, number_of_threads=256)
        if const_expr(self.arrives_early()):
            if begin_req > end_req:
                cute.arch.cluster_arrive()

    # ------------------------------------------------------------------ WG1
    @cute.jit
    def wg1_load_pv(self, wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block, begin_split,
                    tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens, mNumSplits, mO, mLSE, mOaccum, mLSEaccum,
                    sQ, sK, sP, sV1, s_row_scale, s_row_inv, pipe_q, pipe_k, storage):
        _, _, mma_pv_ss = self.tiled_mmas()
        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        thr_pv = mma_pv_ss.get_slice(wg_tidx)
        tOrP = thr_pv.make_fragment_A(thr_pv.partition_A(sP))
        tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(sV1))
        cO = cute.make_identity_tensor((BLOCK_M, HALF))
        tOcO = layouts.acc_mn_view(thr_pv.partition_C(cO))
        n_rows_thr = cute.size(tOcO, mode=[0])
        is_q_producer, is_k_producer, q_prod, k_prod = self.wg1_producers(wg_tidx)

        # P_EMPTY starts "free": WG0 waits on it before its first P write.
        cute.arch.barrier_arrive(barrier_id=BAR_P_EMPTY, number_of_threads=256)
        # 1 when this chunk's Q and first K tiles were issued at the end of the previous chunk.
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
            acc_o = cute.make_rmem_tensor(thr_pv.partition_shape_C((BLOCK_M, HALF)), Float32)
            acc_o.fill(0.0)
            acc_o_mn = layouts.acc_mn_view(acc_o)
            row_scale = cute.make_rmem_tensor(n_rows_thr, Float32)
            for lo, hi, steady in self.steady_loops(start, stop, seqlen):
                for blk in cutlass.range(lo, hi, self.split_cluster, unroll=1):
                    if const_expr(self.prefetches_l2()):
                        # The tile to prefetch and this warp's page id of it, read now like next_page and
                        # used after the stage's refill below.
                        ahead = blk + (self.kv_stages + self.l2_prefetch_ahead) * self.split_cluster
                        ahead_page = Int32(0)
                        if is_k_producer:
                            ahead_page = self.loader.page_id(mBlockTable, r, ahead, seqlen, wg_tidx)
                    # Read now (before the waits for P and the stage, and the P.V) so that its latency is
                    # hidden by them instead of sitting between the stage's release and the TMA issue below.
                    next_page = self.next_page_early(is_k_producer, mBlockTable, r,
                                                     blk + self.kv_stages * self.split_cluster, seqlen, wg_tidx)
                    cute.arch.barrier(barrier_id=BAR_P_FULL, number_of_threads=256)
                    for i in cutlass.range_constexpr(n_rows_thr):
                        row_scale[i] = s_row_scale[tOcO[i, 0][0]]
                    softmax.rescale_rows_if_needed(acc_o_mn, row_scale)
                    self.k_wait(pipe_k, k_state, self.wg1_group())
                    self.zero_tail_v_rows(sK, k_state.index, seqlen - blk * BLOCK_N, HALF, HALF, wg_tidx, BAR_WG1,
                                          steady)
                    self.issue_pv(acc_o, tOrP, tOrV, k_state.index)
                    if const_expr(self.qk_ahead and self.qk_ahead_waits_pv):
                        if blk + self.split_cluster < stop:  # WG0 issues the next QK behind this P.V
                            cute.arch.barrier_arrive(barrier_id=BAR_PV_ISSUED, number_of_threads=256)
                    if const_expr(self.kv_groups == 2):
                        # Group A of the stage goes out once WG0's P.V of this tile retired (its release), while
                        # this warpgroup's P.V still runs.
                        if is_k_producer:
                            if self.refill_due(steady, blk, stop):
                                self.refill(tma_k, mK, sK, mBlockTable, pipe_k, k_prod, r,
                                            blk + self.kv_stages * self.split_cluster, seqlen, kv_head, wg_tidx,
                                            next_page, 0)
                    warpgroup.wait_group(0)
                    cute.arch.barrier_arrive(barrier_id=BAR_P_EMPTY, number_of_threads=256)
                    self.k_release(pipe_k, k_state, self.wg1_group())
                    k_state.advance()
                    if is_k_producer:
                        if self.refill_due(steady, blk, stop):
                            self.refill(tma_k, mK, sK, mBlockTable, pipe_k, k_prod, r,
                                        blk + self.kv_stages * self.split_cluster, seqlen, kv_head, wg_tidx, next_page,
                                        self.wg1_group())
                            k_prod.advance()
                        if const_expr(self.prefetches_l2()):
                            if ahead < stop:
                                self.loader.prefetch_tile(tma_k, mK, sK, ahead, kv_head, ahead_page, wg_tidx)
            if const_expr(self.arrives_early()):
                # The last release and the last multicast load of this warpgroup are behind it (the
                # last chunk prefetches nothing).
                if r == end_req:
                    cute.arch.cluster_arrive()
            cute.arch.barrier(barrier_id=BAR_P_FULL, number_of_threads=256)
            row_inv = cute.make_rmem_tensor(n_rows_thr, Float32)
            for i in cutlass.range_constexpr(n_rows_thr):
                row_inv[i] = s_row_inv[tOcO[i, 0][0]]
            cute.arch.barrier_arrive(barrier_id=BAR_P_EMPTY, number_of_threads=256)
            if const_expr(self.prefetch_next_chunk and self.split_cluster == 1):
                # The next chunk's Q and first K tiles go out now, before this chunk's epilogue, so their
                # latency hides behind both warpgroups' stores instead of opening the next chunk. Q(r) is
                # free: WG0 released it before publishing 1/rowsum (the P_FULL just passed), and every K
                # stage is free once the chunk's last P.V has released it. (Not with a split cluster:
                # its epilogue uses the K stages as scratch.)
                if r < end_req:
                    q_prod, k_prod = self.load_chunk_head(
                        is_q_producer, is_k_producer, tma_q, mQ, sQ, pipe_q, q_prod, tma_k, mK, sK, mBlockTable, pipe_k,
                        k_prod, m_block, kv_head, r + 1, begin_req, begin_block, end_req, end_block, begin_split,
                        mSeqlens, mNumSplits, wg_tidx)
                    prefetched = Int32(1)
            self.store_chunk(acc_o, mma_pv_ss, wg_tidx, wg_tidx + 128, row_inv, row_inv, False, HALF, m_block,
                             kv_head, r, is_split, split_idx, mO, mLSE, mOaccum, mLSEaccum, storage)
        if const_expr(self.arrives_early()):
            if begin_req > end_req:  # no work: the loop did not arrive
                cute.arch.cluster_arrive()

    @cute.jit
    def load_chunk_head(self, is_q_producer, is_k_producer, tma_q, mQ, sQ, pipe_q, q_prod, tma_k, mK, sK,
                        mBlockTable, pipe_k, k_prod, m_block, kv_head, r, begin_req, begin_block, end_req, end_block,
                        begin_split, mSeqlens, mNumSplits, wg_tidx):
        """Q of request ``r`` and its chunk's first ``kv_stages`` K tiles (producer warps of WG1); the
        chunk's bounds are read here (``load_head_tiles``). Q's TMA goes first: it needs only the plan
        row. Called before the caller's own ``chunk_bounds`` of the chunk, so nothing waits for the
        request's length before it."""
        if is_q_producer:
            self.tma_load_q(tma_q, mQ, sQ, pipe_q, q_prod, m_block, kv_head, r)
            q_prod.advance()
        if is_k_producer:
            k_prod = self.load_head_tiles(tma_k, mK, sK, mBlockTable, pipe_k, k_prod, kv_head, r, begin_req,
                                          begin_block, end_req, end_block, begin_split, mSeqlens, mNumSplits, wg_tidx)
        return q_prod, k_prod

    @cute.jit
    def load_head_tiles(self, tma_k, mK, sK, mBlockTable, pipe_k, k_prod, kv_head, r, begin_req, begin_block,
                        end_req, end_block, begin_split, mSeqlens, mNumSplits, wg_tidx):
        """A K producer warp's loads of the first ``kv_stages`` tiles of request ``r``'s chunk, and the
        L2 prefetches of a short chunk's other tiles.

        With ``head_pages_early`` (TMA pages) the block_table loads of the first tiles
        (``head_page_ids``) need only the plan row, so they go out beside the loads of the request's
        length, and the tiles' TMA follows once both are back. Without it the length comes first (the
        page clamp and the chunk's end need it), then each tile's page id, then its TMA: two dependent
        global loads between the plan row and a chunk's first data instead of one. With
        ``head_tiles_in_turn`` (on this path) the CTA's first chunk issues each tile after the previous one
        landed, so that Q and the first tile are not shared out with the second at the kernel's start."""
        early = self.head_pages_early and paged_kv.uses_tma(self.page_size)
        if const_expr(early):
            head = self.chunk_start(r, begin_req, begin_block)
            own = cute.make_rmem_tensor(self.kv_stages, Int32)
            first = cute.make_rmem_tensor(self.kv_stages, Int32)
            for s in cutlass.range_constexpr(self.kv_stages):
                own[s], first[s] = self.loader.head_page_ids(mBlockTable, r, head + s * self.split_cluster, wg_tidx)
        seqlen, _, start, stop, _, _ = self.chunk_bounds(r, begin_req, begin_block, end_req, end_block, begin_split,
                                                         mSeqlens, mNumSplits)
        if const_expr(early):
            for s in cutlass.range_constexpr(self.kv_stages):
                blk = start + s * self.split_cluster
                if const_expr(self.head_tiles_in_turn and s > 0):
                    if r == begin_req:
                        if blk < stop:
                            # The previous tile's last-issued group landed (its full barrier: the producer's
                            # phase, flipped).
                            last = self.k_pipes(pipe_k, self.kv_groups - 1)[0]
                            paged_kv.poll_barrier(last.sync_object_full.get_barrier(prev.index), prev.phase ^ 1)
                if const_expr(self.head_tiles_in_turn):
                    prev = k_prod.clone()
                if blk < stop:
                    page = self.loader.pick_head_page(own[s], first[s], blk, seqlen, wg_tidx)
                    self.load_k(tma_k, mK, sK, mBlockTable, pipe_k, k_prod, r, blk, seqlen, kv_head, wg_tidx,
                                page=page)
                    k_prod.advance()
        else:
            for blk in cutlass.range(start, cutlass.min(start + self.kv_stages * self.split_cluster, stop),
                                      self.split_cluster, unroll=1):
                self.load_k(tma_k, mK, sK, mBlockTable, pipe_k, k_prod, r, blk, seqlen, kv_head, wg_tidx)
                k_prod.advance()
        if const_expr(self.prefetches_short_chunks()):
            # Every tile after the first kv_stages, if the chunk is short and has any: the page ids
            # first (``page_id`` clamps to the request's last page, so all are safe to read once the
            # request has a tile past the first kv_stages; a zero-length request has no page, so the
            # chunk must not be empty), then the prefetches.
            rest0 = start + self.kv_stages * self.split_cluster
            if stop > rest0 and stop - start <= self.l2_prefetch_chunk_tiles * self.split_cluster:
                n_rest = self.l2_prefetch_chunk_tiles - self.kv_stages
                pages = cute.make_rmem_tensor(n_rest, Int32)
                for d in cutlass.range_constexpr(n_rest):
                    pages[d] = self.loader.page_id(mBlockTable, r, rest0 + d * self.split_cluster, seqlen,
                                                   wg_tidx)
                for d in cutlass.range_constexpr(n_rest):
                    if rest0 + d * self.split_cluster < stop:
                        self.loader.prefetch_tile(tma_k, mK, sK, rest0 + d * self.split_cluster, kv_head,
                                                  pages[d], wg_tidx)
        if const_expr(self.prefetches_l2()):
            # The tiles after the first kv_stages up to the distance; the tile loop prefetches the rest.
            for d in cutlass.range_constexpr(self.l2_prefetch_ahead):
                ahead = start + (self.kv_stages + d) * self.split_cluster
                if ahead < stop:
                    page = self.loader.page_id(mBlockTable, r, ahead, seqlen, wg_tidx)
                    self.loader.prefetch_tile(tma_k, mK, sK, ahead, kv_head, page, wg_tidx)
        return k_prod

    @cute.jit
    def next_page_early(self, is_k_producer, mBlockTable, r, blk, seqlen, wg_tidx) -> Int32:
        """This producer warp's page id of tile ``blk`` where refills take one from the caller
        (``reads_refill_page_early``; 0 elsewhere, unused): read a tile early, so that its latency is not
        on the path from a stage's release to its refill. A tile index past the chunk reads the last
        valid page (clamped) and is not used."""
        page = Int32(0)
        if const_expr(self.reads_refill_page_early()):
            if is_k_producer:
                page = self.loader.page_id(mBlockTable, r, blk, seqlen, wg_tidx)
        return page

    def wg1_producers(self, wg_tidx):
        """``(is_q_producer, is_k_producer, q_prod, k_prod)`` of WG1's thread ``wg_tidx``: whether its warp
        issues Q and K, and the producer states of both pipelines.

        Warp ``q_producer_warp`` issues Q (TMA); the loader's first ``producer_warps`` warps issue the K
        tiles (TMA pages 64/128: the first warp; TMA pages 16/32: one warp per box of the tile, 2 or 4,
        because one warp issues its TMA copies serially, see paged_kv.TmaPagedKV; cp.async gather: all
        four, because a 72 KB tile is 4608 16-byte copies, 36 per thread over 128 threads, 144 for one
        warp). WG1 issues because it has the slack: WG0 also does QK and the softmax on the critical
        path. Whole warps run the producer code: the DSL's TMA issue and expect-tx arrive elect one lane
        with a full-warp elect.sync, which deadlocks under a one-lane branch."""
        wg_warp = cute.arch.make_warp_uniform(wg_tidx // 32)
        q_prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        k_prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
        return wg_warp == self.q_producer_warp(), wg_warp < self.loader.producer_warps, q_prod, k_prod

    def q_producer_warp(self) -> int:
        """The warp of WG1 (0-3) that issues Q: the first one after the K producers (``q_warp_apart``),
        the last one where all four issue K boxes (pages 16 without a cluster, and the gather)."""
        if not self.q_warp_apart:
            return 0
        return min(self.loader.producer_warps, 3)

    def reads_refill_page_early(self) -> bool:
        """Whether refills take their page id from ``next_page_early`` (``refill_pages_early``)."""
        return self.loader.prefetches_page() and (self.refill_pages_early or self.loader.warp_per_box)

    @cute.jit
    def refill(self, tma_k, mK, sK, mBlockTable, pipe_k, k_prod, r, blk, seqlen, kv_head, wg_tidx, page,
               group: cutlass.Constexpr[int] = -1):
        """A K producer warp's load of tile ``blk`` (or of its column group ``group``, ``load_k``) into the
        stage ``k_prod`` points at (acquired inside), with ``page`` from ``next_page_early`` where the loader
        takes it."""
        early = page if const_expr(self.reads_refill_page_early()) else None  # None: load_tile reads it
        self.load_k(tma_k, mK, sK, mBlockTable, pipe_k, k_prod, r, blk, seqlen, kv_head, wg_tidx, page=early,
                    group=group)

    def prefetches_short_chunks(self) -> bool:
        """Whether short chunks are prefetched into L2 whole (``l2_prefetch_chunk_tiles``; TMA pages only)."""
        return self.l2_prefetch_chunk_tiles > self.kv_stages and paged_kv.uses_tma(self.page_size)

    def prefetches_l2(self) -> bool:
        """Whether the K producers prefetch tiles into L2 (``l2_prefetch_ahead``; TMA pages only)."""
        return self.l2_prefetch_ahead > 0 and paged_kv.uses_tma(self.page_size)
