"""Experimental: the 2-warpgroup seesaw with per-box K barriers and QK issued behind P.V (not a variant).

Not registered: it is built for an A/B against 2wg (``scripts/entry_ab.py --mode seesaw2``) and tested by
``tests/test_seesaw2_gpu.py``; ``auto`` never runs it. Why it exists: FlashMLA's current decode kernel
runs this kind of schedule and is about 12% faster than our 2wg on compute-bound rows on an H200, while
our first seesaw (``variant_seesaw``) was 15-27% slower than 2wg. docs/perf-notes.md (thirteenth
session) lists where that seesaw differs; this module changes those points:

- **A barrier per 64-column box** of each K stage (9 per stage, 18 in all; count 1: the issuing warp's
  elected lane arrives with the box's bytes, then issues its copy). QK waits box by box and commits one
  wgmma group per box, so it starts on the first box that landed.
- **No "stage empty" barriers.** Tile t0 of a pair always lives in stage 0 and t1 in stage 1, and the
  last reader of a column range refills it as soon as its wgmma retired (in all 4 warps of the
  warpgroup: a 128-thread barrier before warp 0's refill, since PTX defines retirement per thread): V_L of stage 0 by WG0 after
  its P.V of t0; V_R + RoPE of stage 0 by WG1 after its P.V of t0 (which reads P0, stored in stage 0's
  RoPE block); V_L of stage 1 by WG0 after its P.V of t1 (P1 from smem); V_R + RoPE of stage 1 by WG1
  after its P.V of t1. Every other reader of a range is ordered before that refill by a named barrier
  the exchange needs anyway (below). No multicast cluster: a peer CTA's refill would need a cross-CTA
  release.
- **QK of the next pair at the end of the iteration**, issued right behind the P.V just issued, so the
  tensor pipe goes from P.V into QK with no wait between, and the next iteration starts with its
  scores in registers.

Per iteration (pair t0, t1; m the running row max, the same in both warpgroups at the top):
- WG0: softmax of S0 (t0) -> m0, P0; publish m0 (SCALE0); O_L += P0.V_L(t0) (RS), wait; refill V_L of
  stage 0 (t0 + 2). On m1 (SCALE1): P0 *= exp(m0 - m1) into stage 0's RoPE block (P0_READY); O_L and
  the row sum *= exp(m0 - m1). On ISSUED (WG1 has written P1 and issued both its P.V): O_L +=
  P1.V_L(t1) (SS), then QK(t0 + 2) box by box; when that P.V retired: P1's tile is free (P1_FREE) and
  V_L of stage 1 is refilled (t1 + 2); then wait for QK.
- WG1: on m0 (SCALE0): raise its max to m0, softmax of S1 (t1) against it -> m1, P1; publish m1
  (SCALE1); O_R and its row sum *= exp(m_prev - m1) (one rescale); on P1_FREE: P1 into the P tile;
  O_R += P1.V_R(t1) (RS); on P0_READY: O_R += P0.V_R(t0) (SS); ISSUED. When P.V(t1) retired: refill
  V_R + RoPE of stage 1 (t1 + 2); when P.V(t0) retired: refill V_R + RoPE of stage 0 (t0 + 2); then
  QK(t1 + 2) (the boxes it refilled first), and wait for it.
Every named barrier is passed once per iteration by both warpgroups, also in a pair without t1, so the
arrive/sync counts pair (P1_FREE: WG0 pre-arrives once, WG1 pairs the last at exit). No wgmma is in
flight across a branch join: each branch that issues one also waits for it.

Protocol model: ``scripts/model_seesaw2_protocol.py`` (CPU test ``tests/test_protocol_model_seesaw2.py``)
runs both warpgroups warp by warp under random schedules, with a wgmma retired per warp (so the
warpgroup syncs above are checked, and the form without them is caught); it finds P1_FREE implied by
SCALE0 (kept: one barrier, and the hand-off reads plainly).

Page sizes: the TMA ones (16, 32, 64, 128); each column box of a tile is one copy per page of the tile,
all on the box's barrier. No split clusters. Correctness and speed are unmeasured until the GPU run
(``tests/test_seesaw2_gpu.py``, ``scripts/entry_ab.py --mode 2wg --mode seesaw2``).
"""
from __future__ import annotations

import enum

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import warpgroup

from pipelines import layouts, paged_kv, softmax
from pipelines.paged_kv import COL_BLOCK
from pipelines.skeleton import BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V
from pipelines.variant_seesaw import Bar as SeesawBar
from pipelines.variant_seesaw import MLADecodeSeesaw

HALF = HEAD_DIM_V // 2
N_BOXES = HEAD_DIM // COL_BLOCK  # 9 column boxes per 576-wide tile
V_L_BOXES = (0, 1, 2, 3)  # columns 0..255
V_R_ROPE_BOXES = (4, 5, 6, 7, 8)  # columns 256..511 and the RoPE block 512..575
ALL_BOXES = tuple(range(N_BOXES))
WG1_QK_ORDER = V_R_ROPE_BOXES + V_L_BOXES  # WG1 refills V_R + RoPE itself, before WG0 refills V_L
K_STEPS_PER_BOX = COL_BLOCK // 16
BOX_BYTES_BF16 = BLOCK_N * COL_BLOCK * 2


class Bar(enum.IntEnum):
    """Named barrier ids; SUM and INV (chunk end) are the seesaw's, whose ``finish_chunk`` this reuses."""
    SCALE0 = 1  # WG0 -> WG1: m0 published
    SCALE1 = 2  # WG1 -> WG0: m1 published
    P0_READY = 3  # WG0 -> WG1: P0 (relative to m1) in stage 0's RoPE block
    P1_FREE = 4  # WG0 -> WG1: the P.V reading P1 retired
    WG0 = 5
    WG1 = 6
    SUM = int(SeesawBar.SUM)
    INV = int(SeesawBar.INV)
    ISSUED = 9  # WG1 -> WG0: P1 written and both of WG1's P.V issued


class MLADecodeSeesaw2(MLADecodeSeesaw):
    """The seesaw's roles (``warpgroup_roles``: P0 in stage 0's RoPE block), chunk end and max exchange,
    with its own barriers, refills and iteration (module docstring)."""

    num_threads = 256
    kv_stages = 2
    kv_groups = N_BOXES  # the skeleton sizes mbar_k by it: 2 x 2 x 9 >= the 18 box barriers used
    q_consumer_warps = 8  # both warpgroups score
    k_consumer_warps = 8
    kv_l2_hint = "evict_first"

    def __init__(self, dtype, num_heads: int, seqlen_q: int, page_size: int, causal: bool, num_heads_k: int = 1,
                 multicast: bool = True, split_cluster: int = 1):
        if split_cluster != 1:
            raise ValueError("the seesaw2 kernel does not run split clusters")
        if not paged_kv.uses_tma(page_size):
            raise ValueError(f"the seesaw2 kernel serves the TMA page sizes {paged_kv.TMA_PAGE_SIZES}, "
                             f"got {page_size}")
        # No multicast cluster: the refills have no cross-CTA release (module docstring).
        super().__init__(dtype, num_heads, seqlen_q, page_size, causal, num_heads_k, multicast=False,
                         split_cluster=1)
        self.box_bytes = BLOCK_N * COL_BLOCK * dtype.width // 8
        self.pages_per_tile = self.loader.boxes_per_cta  # row boxes of a tile (pages 16/32: 4/2; else 1)

    # ------------------------------------------------------------------ barriers
    @cute.jit
    def make_pipelines(self, storage):
        """Q as in the skeleton (both warpgroups consume it); K: 18 plain mbarriers (stage s, box b at
        ``s * 9 + b``), count 1, initialised here by one thread (the kernel fences and syncs after)."""
        pipe_q = self.make_q_pipeline(storage)
        mbar = storage.mbar_k.data_ptr()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == 0:
            with cute.arch.elect_one():
                for i in cutlass.range_constexpr(self.kv_stages * N_BOXES):
                    cute.arch.mbarrier_init(mbar + i, 1)
        return pipe_q, mbar

    @cute.jit
    def wg_sync(self, me: cutlass.Constexpr[int]):
        """All 4 warps of warpgroup ``me`` past this point (their own ``wait_group`` before it): PTX
        defines a wgmma's retirement per executing thread, so warp 0 refills (or a warp zeroes) a
        range only once every warp of its warpgroup has seen the wgmma that reads it retire."""
        cute.arch.barrier(barrier_id=int(Bar.WG0) if const_expr(me == 0) else int(Bar.WG1), number_of_threads=128)

    @cute.jit
    def wait_box(self, mbar, stage: cutlass.Constexpr[int], box: cutlass.Constexpr[int], phase):
        cute.arch.mbarrier_wait(mbar + (stage * N_BOXES + box), phase)

    @cute.jit
    def page_ids(self, mBlockTable, r, blk, seqlen):
        """block_table entries of tile ``blk``'s pages (one per row box; the loader's ``box_pages``, no
        cluster). Read at the top of an iteration for the tiles its refills will load, so that a
        refill's TMA follows its wgmma's retirement without a global load in between (``seqlen`` > 0)."""
        return self.loader.box_pages(mBlockTable, r, blk, (seqlen - 1) // self.page_size, Int32(0))

    @cute.jit
    def load_boxes(self, tma_k, mK, sK, mBlockTable, mbar, r, blk, seqlen, kv_head, stage: cutlass.Constexpr[int],
                   boxes: cutlass.Constexpr, pages=None):
        """Column boxes ``boxes`` of tile ``blk`` of request ``r`` into ``stage`` (called by one whole
        warp): per box, the elected lane arrives with the box's bytes on its barrier, then the copies
        (one per page of the tile) complete on it. ``pages``: the tile's ``page_ids``, read earlier."""
        P = self.page_size
        loader = self.loader
        tKsK, tKgK = loader.tma_views(tma_k, mK, sK)
        rows = loader.box_rows
        if const_expr(pages is None):
            pages = self.page_ids(mBlockTable, r, blk, seqlen)
        for bi in cutlass.range_constexpr(len(boxes)):
            bar = mbar + (stage * N_BOXES + boxes[bi])
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(bar, self.box_bytes)
            for k in cutlass.range_constexpr(self.pages_per_tile):
                in_page = ((blk * BLOCK_N + k * rows) % P) // rows
                loader._copy_box(tma_k, tKgK, tKsK, in_page, kv_head, pages[k], k, stage, bar, (boxes[bi],))

    @cute.jit
    def issue_qk_boxes(self, acc_s, tSrQ, tSrK, mbar, stage: cutlass.Constexpr[int], order: cutlass.Constexpr,
                       phase):
        """S = Q.K^T of the tile in ``stage``, box by box in ``order``: each box after its barrier, one
        committed wgmma group per box (not waited for)."""
        mma_qk, _, _ = self.tiled_mmas()
        for bi in cutlass.range_constexpr(len(order)):
            self.wait_box(mbar, stage, order[bi], phase)
            # A barrier wait is a loop (a branch) inside the chain: the fence after it keeps ptxas from
            # serializing the wgmma (info C7520).
            warpgroup.fence()
            for kk in cutlass.range_constexpr(K_STEPS_PER_BOX):
                k = order[bi] * K_STEPS_PER_BOX + kk
                mma_qk.set(warpgroup.Field.ACCUMULATE, bi != 0 or kk != 0)
                cute.gemm(mma_qk, acc_s, tSrQ[None, None, k], tSrK[None, None, k, stage], acc_s)
            warpgroup.commit_group()

    # ------------------------------------------------------------------ roles
    @cute.jit
    def role(self, me: cutlass.Constexpr[int], wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block,
             begin_split, tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens, mNumSplits, mO, mLSE, mOaccum, mLSEaccum,
             sQ, sK, sP, sP0, sV, storage, pipe_q, mbar, scale_log2):
        """Warpgroup ``me``'s loop (0: scores t0, owns O[:, 0:256], issues Q and each chunk's first
        loads; 1: scores t1, owns O[:, 256:512])."""
        mma_qk, mma_rs, mma_ss = self.tiled_mmas()
        q_state = cutlass.pipeline.make_pipeline_state(cutlass.pipeline.PipelineUserType.Consumer, 1)
        q_prod = cutlass.pipeline.make_pipeline_state(cutlass.pipeline.PipelineUserType.Producer, 1)
        thr_qk, thr_rs, tSrQ, tSrK, tOrV_rs, tOrV_ss, tOrP_other, tPsP_own = self.role_fragments(
            me, wg_tidx, mma_qk, mma_rs, mma_ss, sQ, sK, sP, sP0, sV)
        # P0 lives in stage 0 only (t0's stage).
        if const_expr(me == 0):
            tPsP_own = tPsP_own[None, None, None, 0]
        else:
            tOrP_other = tOrP_other[None, None, None, 0]
        tScS = layouts.acc_mn_view(thr_qk.partition_C(cute.make_identity_tensor((BLOCK_M, BLOCK_N))))
        n_rows_thr = cute.size(tScS, mode=[0])
        s_m = storage.row_max_x.get_tensor(cute.make_layout((BLOCK_M, 2), stride=(1, BLOCK_M)))
        s_sum = storage.row_sum_x.get_tensor(cute.make_layout(BLOCK_M))
        s_inv = storage.row_inv.get_tensor(cute.make_layout(BLOCK_M))
        wg_warp = cute.arch.make_warp_uniform(wg_tidx // 32)
        issuer = wg_warp == 0  # the warp of this warpgroup that issues its TMA loads
        # Phase of the tile now in stage 0 / stage 1 (flipped each time a stage's tile is consumed).
        ph0 = Int32(0)
        ph1 = Int32(0)
        acc_s = cute.make_rmem_tensor(thr_qk.partition_shape_C((BLOCK_M, BLOCK_N)), Float32)

        if const_expr(me == 0):
            cute.arch.barrier_arrive(barrier_id=int(Bar.P1_FREE), number_of_threads=256)  # sP starts free
        for r in cutlass.range(begin_req, end_req + 1, unroll=1):
            seqlen, n_blocks, start, stop, is_split, split_idx = self.chunk_bounds(
                r, begin_req, begin_block, end_req, end_block, begin_split, mSeqlens, mNumSplits)
            if const_expr(me == 0):
                # Q and the chunk's first two tiles, whole (every reader of the previous chunk's tiles
                # and of Q is past the previous chunk's SUM / INV exchange).
                if issuer:
                    self.tma_load_q(tma_q, mQ, sQ, pipe_q, q_prod, m_block, kv_head, r)
                    q_prod.advance()
                    if start < stop:
                        self.load_boxes(tma_k, mK, sK, mBlockTable, mbar, r, start, seqlen, kv_head, 0, ALL_BOXES)
                    if start + 1 < stop:
                        self.load_boxes(tma_k, mK, sK, mBlockTable, mbar, r, start + 1, seqlen, kv_head, 1,
                                        ALL_BOXES)
            acc_o, acc_o_mn, row_max, row_sum, row_scale = self.new_chunk_state(thr_rs, n_rows_thr)
            other_max = cute.make_rmem_tensor(n_rows_thr, Float32)
            row_limit = self.row_limits(seqlen, m_block, tScS)
            pipe_q.consumer_wait(q_state)
            # The first scores of the chunk: S0 in WG0, S1 in WG1.
            if const_expr(me == 0):
                if start < stop:
                    self.issue_qk_boxes(acc_s, tSrQ, tSrK, mbar, 0, ALL_BOXES, ph0)
                    warpgroup.wait_group(0)
            else:
                if start + 1 < stop:
                    self.issue_qk_boxes(acc_s, tSrQ, tSrK, mbar, 1, ALL_BOXES, ph1)
                    warpgroup.wait_group(0)

            for t0 in cutlass.range(start, stop, 2, unroll=1):
                t1 = t0 + 1
                if const_expr(me == 0):
                    self.wg0_iteration(t0, t1, stop, seqlen, r, kv_head, wg_tidx, issuer, ph0, ph1, row_limit, tScS,
                                       row_max, row_sum, row_scale, other_max, acc_s, acc_o, acc_o_mn, s_m, tSrQ,
                                       tSrK, tOrV_rs, tOrV_ss, tOrP_other, tPsP_own, tma_k, mK, sK, mBlockTable,
                                       mbar, scale_log2)
                else:
                    self.wg1_iteration(t0, t1, stop, seqlen, r, kv_head, wg_tidx, issuer, ph0, ph1, row_limit, tScS,
                                       row_max, row_sum, row_scale, other_max, acc_s, acc_o, acc_o_mn, s_m, tSrQ,
                                       tSrK, tOrV_rs, tOrV_ss, tOrP_other, tPsP_own, tma_k, mK, sK, mBlockTable,
                                       mbar, scale_log2)
                ph0 = ph0 ^ 1
                if t1 < stop:
                    ph1 = ph1 ^ 1
            pipe_q.consumer_release(q_state)
            q_state.advance()
            self.finish_chunk(me, wg_tidx, m_block, kv_head, r, is_split, split_idx, acc_o, row_max, row_sum, tScS,
                              s_sum, s_inv, scale_log2, mO, mLSE, mOaccum, mLSEaccum, storage)
        if const_expr(me == 1):
            # Pairs WG0's last P1_FREE arrive so no arrival is left pending at exit.
            cute.arch.barrier(barrier_id=int(Bar.P1_FREE), number_of_threads=256)

    # ------------------------------------------------------------------ WG0
    @cute.jit
    def wg0_iteration(self, t0, t1, stop, seqlen, r, kv_head, wg_tidx, issuer, ph0, ph1, row_limit, tScS, row_max,
                      row_sum, row_scale, other_max, acc_s, acc_o, acc_o_mn, s_m, tSrQ, tSrK, tOrV_rs, tOrV_ss,
                      tOrP_other, tPsP_own, tma_k, mK, sK, mBlockTable, mbar, scale_log2):
        # The page ids of this iteration's refills (tiles t0 + 2 and t1 + 2), read before the softmax.
        pages0 = self.page_ids(mBlockTable, r, t0 + 2, seqlen)
        pages1 = self.page_ids(mBlockTable, r, t1 + 2, seqlen)
        self.softmax_tile(acc_s, t0, seqlen, row_limit, tScS, row_max, row_sum, row_scale, scale_log2)
        self.publish_max(s_m, 0, row_max, tScS, wg_tidx, int(Bar.SCALE0))
        softmax.rescale_rows_if_needed(acc_o_mn, row_scale)
        valid0 = seqlen - t0 * BLOCK_N
        if valid0 < BLOCK_N:
            self.wg_sync(0)  # every warp's QK(t0) retired before any warp's stores
            self.zero_v_rows(sK, 0, valid0, 0, HALF, wg_tidx, int(Bar.WG0))
        rP = cute.make_rmem_tensor_like(acc_s, self.dtype)
        rP.store(acc_s.load().to(self.dtype))
        self.issue_pv(acc_o, layouts.acc_as_a_operand(rP), tOrV_rs, 0, p_in_registers=True)
        warpgroup.wait_group(0)
        if t0 + 2 < stop:
            self.wg_sync(0)
            if issuer:
                self.load_boxes(tma_k, mK, sK, mBlockTable, mbar, r, t0 + 2, seqlen, kv_head, 0, V_L_BOXES, pages0)
        # m1 from WG1: P0 moves to it for WG1's P.V, and so do O_L and the row sums.
        self.read_max(s_m, 1, other_max, tScS, int(Bar.SCALE1))
        softmax.raise_max(row_max, row_sum, row_scale, other_max, scale_log2)
        s_mn = layouts.acc_mn_view(acc_s)
        for i in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
            for j in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
                s_mn[i, j] = s_mn[i, j] * row_scale[i]
        rP.store(acc_s.load().to(self.dtype))
        cute.autovec_copy(rP, tPsP_own)
        cute.arch.fence_view_async_shared()  # P0 is read by WG1's wgmma (async proxy)
        cute.arch.barrier_arrive(barrier_id=int(Bar.P0_READY), number_of_threads=256)
        softmax.rescale_rows_if_needed(acc_o_mn, row_scale)
        cute.arch.barrier(barrier_id=int(Bar.ISSUED), number_of_threads=256)
        if t0 + 2 < stop:  # (then t1 exists too)
            self.wg0_pv_t1(t1, stop, seqlen, r, kv_head, wg_tidx, issuer, ph1, acc_o, tOrV_ss, tOrP_other, tma_k,
                           mK, sK, mBlockTable, mbar, True, acc_s, tSrQ, tSrK, ph0 ^ 1, pages1)
        elif t1 < stop:
            self.wg0_pv_t1(t1, stop, seqlen, r, kv_head, wg_tidx, issuer, ph1, acc_o, tOrV_ss, tOrP_other, tma_k,
                           mK, sK, mBlockTable, mbar, False, acc_s, tSrQ, tSrK, ph0 ^ 1, pages1)
        else:
            cute.arch.barrier_arrive(barrier_id=int(Bar.P1_FREE), number_of_threads=256)

    @cute.jit
    def wg0_pv_t1(self, t1, stop, seqlen, r, kv_head, wg_tidx, issuer, ph1, acc_o, tOrV_ss, tOrP_other, tma_k, mK, sK,
                  mBlockTable, mbar, next_qk: cutlass.Constexpr[bool], acc_s, tSrQ, tSrK, next_ph0, pages1):
        """O_L += P1.V_L(t1) (SS), then (``next_qk``) QK of the next t0 behind it; when the P.V retired,
        P1's tile is free and V_L of stage 1 is refilled. Every wgmma issued here is waited for here."""
        # V_L of stage 1 was refilled by this warpgroup: its phase is this warpgroup's to wait on (a
        # completed phase returns at once; WG1's QK waited for every box of t1 already).
        for bi in cutlass.range_constexpr(len(V_L_BOXES)):
            self.wait_box(mbar, 1, V_L_BOXES[bi], ph1)
        valid1 = seqlen - t1 * BLOCK_N
        if valid1 < BLOCK_N:
            self.zero_v_rows(sK, 1, valid1, 0, HALF, wg_tidx, int(Bar.WG0))
        self.issue_pv(acc_o, tOrP_other, tOrV_ss, 1)
        if const_expr(next_qk):
            self.issue_qk_boxes(acc_s, tSrQ, tSrK, mbar, 0, ALL_BOXES, next_ph0)
            warpgroup.wait_group(N_BOXES)
        else:
            warpgroup.wait_group(0)
        cute.arch.barrier_arrive(barrier_id=int(Bar.P1_FREE), number_of_threads=256)
        if t1 + 2 < stop:
            self.wg_sync(0)
            if issuer:
                self.load_boxes(tma_k, mK, sK, mBlockTable, mbar, r, t1 + 2, seqlen, kv_head, 1, V_L_BOXES, pages1)
        if const_expr(next_qk):
            warpgroup.wait_group(0)

    # ------------------------------------------------------------------ WG1
    @cute.jit
    def wg1_iteration(self, t0, t1, stop, seqlen, r, kv_head, wg_tidx, issuer, ph0, ph1, row_limit, tScS, row_max,
                      row_sum, row_scale, other_max, acc_s, acc_o, acc_o_mn, s_m, tSrQ, tSrK, tOrV_rs, tOrV_ss,
                      tOrP_other, tPsP_own, tma_k, mK, sK, mBlockTable, mbar, scale_log2):
        # The page ids of this iteration's refills (tiles t0 + 2 and t1 + 2), read before the waits.
        pages0 = self.page_ids(mBlockTable, r, t0 + 2, seqlen)
        pages1 = self.page_ids(mBlockTable, r, t1 + 2, seqlen)
        # m0 from WG0: this warpgroup's max moves to it, then the softmax of t1 against it.
        self.read_max(s_m, 0, other_max, tScS, int(Bar.SCALE0))
        softmax.raise_max(row_max, row_sum, row_scale, other_max, scale_log2)
        if t1 < stop:
            factor = cute.make_rmem_tensor_like(row_scale)
            for i in cutlass.range_constexpr(cute.size(row_scale, mode=[0])):
                factor[i] = row_scale[i]
            self.softmax_tile(acc_s, t1, seqlen, row_limit, tScS, row_max, row_sum, row_scale, scale_log2)
            for i in cutlass.range_constexpr(cute.size(row_scale, mode=[0])):
                row_scale[i] = row_scale[i] * factor[i]
        self.publish_max(s_m, 1, row_max, tScS, wg_tidx, int(Bar.SCALE1))
        softmax.rescale_rows_if_needed(acc_o_mn, row_scale)  # O_R to m1, one pass
        # WG1 reads V_R of stage 0 (t0): WG0's QK waited for it; wait on this phase too (returns at once).
        for bi in cutlass.range_constexpr(4):
            self.wait_box(mbar, 0, V_R_ROPE_BOXES[bi], ph0)
        valid0 = seqlen - t0 * BLOCK_N
        if valid0 < BLOCK_N:
            self.zero_v_rows(sK, 0, valid0, HALF, HALF, wg_tidx, int(Bar.WG1))
        cute.arch.barrier(barrier_id=int(Bar.P1_FREE), number_of_threads=256)
        if t1 + 2 < stop:
            self.wg1_pvs(t0, t1, stop, seqlen, r, kv_head, wg_tidx, issuer, ph1, acc_s, acc_o, tSrQ, tSrK, tOrV_rs,
                         tOrV_ss, tOrP_other, tPsP_own, tma_k, mK, sK, mBlockTable, mbar, True, True, pages0, pages1)
        elif t1 < stop:
            self.wg1_pvs(t0, t1, stop, seqlen, r, kv_head, wg_tidx, issuer, ph1, acc_s, acc_o, tSrQ, tSrK, tOrV_rs,
                         tOrV_ss, tOrP_other, tPsP_own, tma_k, mK, sK, mBlockTable, mbar, True, False, pages0, pages1)
        else:
            self.wg1_pvs(t0, t1, stop, seqlen, r, kv_head, wg_tidx, issuer, ph1, acc_s, acc_o, tSrQ, tSrK, tOrV_rs,
                         tOrV_ss, tOrP_other, tPsP_own, tma_k, mK, sK, mBlockTable, mbar, False, False, pages0, pages1)

    @cute.jit
    def wg1_pvs(self, t0, t1, stop, seqlen, r, kv_head, wg_tidx, issuer, ph1, acc_s, acc_o, tSrQ, tSrK, tOrV_rs,
                tOrV_ss, tOrP_other, tPsP_own, tma_k, mK, sK, mBlockTable, mbar, has_t1: cutlass.Constexpr[bool],
                next_qk: cutlass.Constexpr[bool], pages0, pages1):
        """P1 to smem, O_R += P1.V_R(t1) (RS), O_R += P0.V_R(t0) (SS), ISSUED; the refills of V_R + RoPE
        as each P.V retires; then (``next_qk``) QK of the next t1. Every wgmma issued here is waited for
        here."""
        rP = cute.make_rmem_tensor_like(acc_s, self.dtype)
        if const_expr(has_t1):
            rP.store(acc_s.load().to(self.dtype))
            cute.autovec_copy(rP, tPsP_own)
            cute.arch.fence_view_async_shared()  # P1 is read by WG0's wgmma (async proxy)
            valid1 = seqlen - t1 * BLOCK_N
            if valid1 < BLOCK_N:
                self.zero_v_rows(sK, 1, valid1, HALF, HALF, wg_tidx, int(Bar.WG1))
            self.issue_pv(acc_o, layouts.acc_as_a_operand(rP), tOrV_rs, 1, p_in_registers=True)
        cute.arch.barrier(barrier_id=int(Bar.P0_READY), number_of_threads=256)
        self.issue_pv(acc_o, tOrP_other, tOrV_ss, 0)
        cute.arch.barrier_arrive(barrier_id=int(Bar.ISSUED), number_of_threads=256)
        if const_expr(has_t1):
            warpgroup.wait_group(1)
            if t1 + 2 < stop:
                self.wg_sync(1)
                if issuer:
                    self.load_boxes(tma_k, mK, sK, mBlockTable, mbar, r, t1 + 2, seqlen, kv_head, 1, V_R_ROPE_BOXES,
                                    pages1)
        warpgroup.wait_group(0)
        if t0 + 2 < stop:
            self.wg_sync(1)
            if issuer:
                self.load_boxes(tma_k, mK, sK, mBlockTable, mbar, r, t0 + 2, seqlen, kv_head, 0, V_R_ROPE_BOXES,
                                pages0)
        if const_expr(next_qk):
            self.issue_qk_boxes(acc_s, tSrQ, tSrK, mbar, 1, WG1_QK_ORDER, ph1 ^ 1)
            warpgroup.wait_group(0)
