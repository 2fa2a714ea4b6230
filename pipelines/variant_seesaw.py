"""2-warpgroup pipeline, seesaw form (256 threads, no producer warpgroup, two KV tiles per iteration).

Why: in the original 2wg form WG0 runs QK, the softmax and half of P.V for every tile while WG1
only does the other half of P.V. On an H200 (ncu, b128 s1 h128 4096) WG1's warps spent about half
their time waiting for WG0's P, and WG0's non-wgmma work (softmax, rescale, P hand-off) left the
tensor cores idle for a third of each tile. Here both warpgroups score: each iteration takes two
tiles, t0 for WG0 and t1 for WG1, so each warpgroup does QK + softmax for one tile and P.V (its own
256 output columns) for both, and one warpgroup's softmax runs while the other's wgmma do.

Per iteration, in the max-first order (FlashMLA's; m: the running row max, identical in both warpgroups at
the start; S0 = QK(t0) and S1 = QK(t1) are already in the warpgroups' registers, computed at the end of the
previous iteration):
- WG0: m0 = max(m, rowmax S0), published at once (M0); P0 = exp(S0 - m0); O_L *= exp(m - m0);
  O_L += P0.V_L(t0) with P0 from registers (RS wgmma), and while it runs P0 into smem (relative to m0).
- WG1: on M0 alone: the softmax of t1 against m0: m1 = max(m0, rowmax S1), published (M1);
  P1 = exp(S1 - m1); O_R *= exp(m - m1) in one pass; O_R += P1.V_R(t1) (RS), and while it runs P1 into smem.
- WG0: on M1: its row sums, O_L and (in the warps where m1 moved past m0, rare with lazy rescaling) the P0
  in smem to m1; then P0 published (P0).
- WG1: on P0: O_R += P0.V_R(t0) (SS), right behind its P.V of t1; then P1 published (P1: P1 in smem and
  both of WG1's P.Vs in the tensor pipe).
- WG0: on P1: O_L += P1.V_L(t1) (SS), and right behind it S0' = QK(t0') of the next pair.
- WG1: once its P.Vs retired, S1' = QK(t1'), behind WG0's.
Both now hold O relative to m1, which becomes m. Why this order: in the one before it (P0 and m0 in one
hand-off, WG1's P.V of t0 before its softmax) ``scripts/seesaw_timeline.py`` showed WG1 waiting about 900
cycles per iteration for P0's store before its softmax could start; here WG1's softmax runs beside WG0's
P.V of t0 (the iteration about 9% shorter on the timeline; up to 3.4% faster paired on an H100,
docs/perf-notes.md, thirty-second session). A P tile goes to smem while the P.V that reads it from
registers runs, off the path; WG1 takes S1's row maxima before M0 (``wg1_max_ahead``); S is cleared once P
is in bf16 registers (``clear_p``).
Why the next pair's QK at the end of the iteration, staggered: WG0's QK(t0') goes into the tensor pipe
before WG1's QK(t1'), so that WG0's softmax of t0' can run while WG1's QK keeps the tensor cores busy.
The row sums stay per warpgroup (both relative to the same max) and are added at the end of a chunk.
A chunk with an odd tile count ends on an iteration without t1: WG1 then publishes m0 as m1 and adds only
P0.V_R(t0).

Loads: each K stage fills in two column groups, each with its own full/empty barrier pair
(``paged_kv`` loader ``by_columns``): G0 = columns 0..255 (V_L), G1 = columns 256..511 (V_R) and the
RoPE columns 512..575. A group is refilled as soon as both warpgroups released it, instead of the
whole stage after the last P.V: G0 of t0 is free after O_L += P0.V_L(t0), mid-iteration. QK takes
the column blocks of the group that lands first first. P0 goes into the RoPE block of t0's stage
(read only by QK(t0), done by then; G1 is released only after WG1's P.V that reads P0), P1 into the
skeleton's P tile. The smem plan is the skeleton's (Q 72 KB + 2 stages 144 KB + P 8 KB).
Who loads (``producer_warpgroup``): on the TMA page sizes a third warpgroup (warpgroup 0 of 384 threads;
the scoring warpgroups are 1 and 2, ``PRODUCER_REGISTERS`` after setmaxnreg) issues every load: Q per
request, then each pair's groups in the order the iteration frees them (``produce_pairs``), and (128+
rows) the L2 prefetch of the next pair's tiles, their stages' next fills (``producer_l2_ahead``). The next
request's Q and first tiles go out while the current chunk still computes. On the gather pages (whose
copies need the producer threads' registers) the scoring warpgroups load instead: WG0 every G0 and Q, WG1
every G1, each group by the warpgroup that finishes with it last. With the producer, ``early_releases``
splits WG0's QK(t0') to release G0 of t1 between its halves. Without a multicast cluster
(``multicast_cluster``), so each group of a tile is one 4-D TMA copy (``kv_wide_boxes``). Where it stands
(three H100 page-64 grids at 66e0995, docs/perf-notes.md, thirty-eighth session; time over 2wg's): 0.86-0.92 at
256 rows with b64-b128 and 4096-16384 keys, 0.91-0.92 at 128 rows with b128 and 16384 keys, 0.99 at 4096, 1.08-1.09
at 1024; up to 1.22-1.24 on short requests (b <= 32, <= 4096 keys) and at 64 rows. ``auto`` picks it where
full-grid runs measured it faster (``pipelines/auto_table.py``: 46 of 372 keys, from H100 and H200 runs with
the steady loop, docs/perf-notes.md, forty-first session).

Named barriers (``Bar``, 256 threads unless noted): M0 (WG0 -> WG1: m0 written), M1 (WG1 -> WG0: m1
written), P0 (WG0 -> WG1: P0 relative to m1 in smem), P1 (WG1 -> WG0: P1 in smem, WG1's P.Vs issued; only
in an iteration with t1), SUM (WG1 -> WG0: WG1's row sums written at a chunk's end), INV (WG0 -> WG1:
1/rowsum written), and the two 128-thread warpgroup barriers of ``zero_v_rows``. Every barrier is passed by
both warpgroups once per iteration (or chunk), P1 in the iterations with t1 (both know it), so the
arrive/sync counts always pair, and each arrival waits for the other warpgroup's previous use: WG0 arrives
on M0 after it passed the previous P1, WG1 on M1 after M0, WG0 on P0 after M1, WG1 on P1 after P0. P1's
tile needs no barrier of its own: WG1 writes it after M0, which WG0 arrives on only after the P.V that read
the previous P1 retired.

Empty-barrier arrivals of a group a warpgroup never reads (G0 of t0 for WG1, G1 of t1 for WG0) are
made after the iteration's first barrier from the other warpgroup (M0 for WG1, M1 for WG0), which the
other warpgroup passes only after its releases of the previous fill of that group: a warp never
arrives twice on one phase.
"""
from __future__ import annotations

import enum

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import warpgroup

from pipelines import layouts, paged_kv, softmax
from pipelines.paged_kv import COL_BLOCK
from pipelines.skeleton import BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, MLADecodeBase

HALF = HEAD_DIM_V // 2
G0_COLS = (0, 1, 2, 3)  # 64-column blocks of group 0: V_L
G1_COLS = (4, 5, 6, 7, 8)  # group 1: V_R and the RoPE block (where P0 goes)


class Bar(enum.IntEnum):
    M0 = 1
    M1 = 2
    WG0 = 3
    WG1 = 4
    SUM = 5
    INV = 6
    P0 = 7
    P1 = 8
    MERGE = 9  # the scoring warpgroups, around the merge by a request's last chunk (skeleton ``merge_by_last_chunk``)


class MLADecodeSeesaw(MLADecodeBase):
    num_threads = 256
    kv_stages = 2
    kv_groups = 2
    q_consumer_warps = 8  # both warpgroups score
    k_consumer_warps = 8
    # At an iteration's start each warpgroup's loading warps prefetch the next pair's tile it scores (WG0 t0',
    # WG1 t1') into L2 (``prefetch_next_pair``), so that the refills, which go out only once the P.V reading a
    # group retired, read L2. Why: ``scripts/seesaw_timeline.py`` shows WG0's QK of t0' waiting about 2000
    # cycles for the data of a refill issued mid-iteration. Off: paired on an H100 (``scripts/entry_ab.py``, mode
    # ``seesaw-l2-next``, two passes, docs/perf-notes.md, twenty-ninth session) it is 0.959-0.982 at b128 s1 h128
    # 4096, b64 s1 h128 1024 and b32 s2 h128 1024 but 1.035-1.046 at b128 s2 h128 4096, outputs bit-identical.
    # A class constant (an A/B sets it on a subclass).
    l2_prefetch_next_pair = False
    # A producer warpgroup (``produce``) issues every load on the TMA page sizes: 384 threads, the two
    # scoring warpgroups become warpgroups 1 and 2 and issue no load. Why: ``scripts/seesaw_timeline.py``
    # shows each refill costing its warpgroup 800-900 cycles of TMA issue (the empty-barrier wait and 4-5
    # copies about 120-150 cycles apart), on the path to that warpgroup's next P.V or QK, and the refills
    # going out late for it. A class constant (an A/B sets it on a subclass); registers per thread after
    # setmaxnreg in ``PRODUCER_REGISTERS`` (384 threads start at 168: a pool of 3 x 168).
    producer_warpgroup = True
    # (At 24 the producer's ``produce_pairs`` spills; at 32 / 232 / 240 ptxas serializes every wgmma;
    # 40 / 232 / 232 compiles without either.)
    PRODUCER_REGISTERS = (40, 232, 232)
    # With the producer warpgroup, where several m-blocks read each tile (``l2_ahead``): right after loading
    # tile t, its warps prefetch into L2 their box of tile t + 2 (the stage's next fill, which goes out only
    # once the pair's P.Vs release the stage), so that fill reads L2. Why: with the producer,
    # ``seesaw_timeline.py`` shows a refill landing about 2400 cycles after its release, on the next QK's
    # path. A class constant (an A/B sets it on a subclass).
    producer_l2_ahead = True
    # With the producer (``early``): WG0 issues QK(t0') as two commit groups and releases G0 of t1 between them,
    # once PV_L(t1) retired, instead of after the whole QK (whose G1 half waits for its refill): a refill lands
    # about 2000 cycles after its release, on a QK's path (``seesaw_timeline.py``). A class constant (an A/B
    # sets it).
    early_releases = True

    # The split-kv merge by each request's last chunk (skeleton ``chunk_merge``, ``split_k.last_chunk``): the
    # scoring warpgroups (their 8 warps, 232 registers after setmaxnreg) merge, on barrier ``Bar.MERGE``. On: paired
    # on an H100 (``scripts/entry_ab.py``, mode ``seesaw-no-chunk-merge``; docs/perf-notes.md, forty-sixth session) it
    # took 0.95-0.99 of the merge kernel's time on six split rows in both passes but one (b128 s1 h128 16384: 1.011 /
    # 0.977). A class constant (an A/B sets it).
    chunk_merge = True
    merge_barrier_id = int(Bar.MERGE)
    merge_threads = 256

    # No TMA multicast cluster (``pipelines.MULTICAST_VARIANTS``): each CTA loads its own tiles. Why: a multicast
    # refill waits for both CTAs' releases, and the iteration is bound by its refills; in one H100 perf run
    # the 49 cluster configurations of page 64 ran 5.7% faster without it (geomean, 0.893 to 1.018;
    # docs/perf-notes.md, thirtieth session). A class constant (an A/B sets it True on a subclass, built with
    # multicast on).
    multicast_cluster = False
    # The K waits in front of each QK by try_wait (skeleton ``k_wait_spin`` off). Polling them (``test_wait``)
    # was 2.5-3.7% faster at b128 s2 h128 4096 in the order before the max-first one (thirty-first session); in
    # the max-first order it is 1-4% slower (paired on an H100, docs/perf-notes.md, thirty-second session:
    # entry_ab mode ``seesaw-spin``). A class constant (an A/B sets it).
    k_wait_spin = False
    # WG1 takes S1's row maxima before it waits for m0 (M0), while WG0 runs its softmax, so that after M0 only
    # the exponentials remain on its path. Paired on an H100 (thirty-second session, mode ``seesaw-max-after``):
    # up to 1.5% faster (b64 s1 h128 1024), 0.1-0.5% slower at b128 s2 h128 4096; bit-identical. A class
    # constant (an A/B sets it).
    wg1_max_ahead = True
    # The producer polls each empty barrier (``produce_group``) before its acquire, which otherwise sleeps in
    # try_wait between checks: a refill is on the next QK's path. Off: paired (mode ``seesaw-producer-spin``)
    # 1-2% faster at b128 s2 h128 4096, 0.3-0.7% slower on three other rows. A class constant (an A/B sets it).
    producer_spin = False
    # S zeroed once P is in bf16 registers (``clear_s``); WG0 then rescales P0 to m1 from its bf16 copy. Paired
    # (mode ``seesaw-keep-p``): 2-4.5% faster on four rows, bit-identical there. A class constant (an A/B sets it).
    clear_p = True
    # Each warpgroup's proxy fence for its P tile (``fence_view_async_shared``: MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S)
    # right after the tile's stores and off the path to the other warpgroup: WG0's behind the stores of P0
    # while PV_L(t0) runs (again only where P0 is rewritten to m1), WG1's after its PV_R(t0) issue, before
    # P1's arrive, instead of between M1 and P0's arrive (WG0) and between P1's stores and the P0 wait (WG1).
    # Why: the timeline showed 420 cycles from M1 to P0's arrive in WG0 for a few instructions, and WG1 passing
    # P0 330 cycles after WG0 arrived, still in its P1 stores and fence. Paired on an H100 (mode
    # ``seesaw-late-fence``, docs/perf-notes.md, thirty-fourth session): 1.6-2.6% faster at b128 s1 / s2 h128
    # 4096, within 0.5% on three other rows; bit-identical. A class constant (an A/B sets it).
    early_p_fence = True
    # Each column group of a K tile by one 4-D TMA copy (skeleton ``kv_wide_boxes``; no multicast cluster here, so
    # a box is always the tile's 64 rows on pages 64 and 128): the producer issues a refill about 70 cycles after
    # its release instead of 500-600 (five copies 120-150 cycles apart), and t0's G1 lands about 460 cycles
    # sooner (``seesaw_timeline.py``). Paired on an H100 (mode ``seesaw-narrow-boxes``, docs/perf-notes.md,
    # thirty-fourth session): 0.984-0.992 at b128 s2 h128 4096 and 16384, 0.996-0.998 at b128 s1 h128 4096,
    # within 0.3% on three other rows; bit-identical.
    kv_wide_boxes = True
    # The P tiles stored with ``stmatrix`` (4 ``STSM`` x4 per thread instead of 16 4-byte stores with their swizzled
    # addresses; ``store_p``): 152 fewer instructions in the kernel, on both warpgroups' hand-off paths. Paired on
    # an H100 (mode ``seesaw-sts``, docs/perf-notes.md, thirty-fourth session): 0.961-0.964 at b128 s2 h128 4096 and
    # 16384, 0.971-0.973 at b128 s1 h128 4096, 0.98-0.99 on short requests; bit-identical. (In 2wg, one P store per
    # tile off WG0's path, it measured even in the twentieth session.) A class constant (an A/B sets it).
    p_stmatrix = True
    # A chunk's pairs in two loops (``role``): the steady ones first, compiled without the per-tile checks
    # (mask, zeroed V rows, a missing t1 or next pair), then the rest with them. Why: ncu put the scoring
    # loops' instruction-fetch stalls (no_inst) at the joins after those skipped branches, on the softmax and
    # P hand-off paths; FlashMLA compiles its last pairs as separate code the same way. Paired on an H100
    # (entry_ab, docs/perf-notes.md, thirty-sixth session; bit-identical): 0.950 / 0.929 and 0.989 / 0.950 at
    # b128 s1 h128 4096, 0.923 / 0.888 at b128 s2 h128 4096. On since the thirty-seventh session (seesaw GPU
    # tests, memcheck and synccheck clean on it); in the H100 grids then, the seesaw's time over 2wg's fell 7-12%
    # on long chunks and rose 3-10% on chunks of a few pairs (``steady_min_steps``). Not with a split cluster
    # (``skeleton``: it spilled there).
    steady_loop = True
    # ... and only where a chunk has at least two steady pairs: a chunk of one steady pair runs the one general
    # loop. Paired on an H100 (entry_ab, docs/perf-notes.md, thirty-eighth session; bit-identical), over the
    # threshold 1: 0.975-0.976 at b8 s1 h64 4096 and b32 s1 h64 1024, 0.994-0.996 at b8 s1 h128 1024, 0.992-0.997
    # at b32 s2 h128 4096, 0.998-1.007 on long chunks (b128 s2 h128 4096, b128 s1 h128 16384). Thresholds 4 and 8
    # measured too: no better overall (4: 1.006-1.014 at b32 s1 h64 1024).
    steady_min_steps = 2

    def __init__(self, dtype, num_heads: int, seqlen_q: int, page_size: int, causal: bool, num_heads_k: int = 1,
                 multicast: bool = True, split_cluster: int = 1):
        super().__init__(dtype, num_heads, seqlen_q, page_size, causal, num_heads_k,
                         multicast and self.multicast_cluster, split_cluster)
        # Only the TMA paths: the cp.async gather needs the producer threads' registers for its addresses.
        self.with_producer = self.producer_warpgroup and paged_kv.uses_tma(page_size)
        if self.with_producer:
            self.num_threads = 384
            assert sum(self.PRODUCER_REGISTERS) <= 3 * 168
        # Where each was measured to help (docs/perf-notes.md, thirtieth session, H100, paired): the L2
        # prefetch only where several m-blocks read each tile (128+ rows: 1-4% faster with the multicast
        # cluster, more without it; at 64 rows, one m-block, memory-bound: 15-19% slower); the early releases
        # only with the producer (without it 0-1.4% slower).
        self.l2_ahead = self.producer_l2_ahead and self.with_producer and self.num_m_blocks > 1
        self.early = self.early_releases and self.with_producer

    def kv_col_groups(self) -> tuple:
        return (G0_COLS, G1_COLS)

    def make_pipelines(self, storage):
        """Q as in the skeleton (both warpgroups consume it); K: one pipeline per column group over the
        same two stages, each completing on the group's bytes."""
        pipe_q = self.make_q_pipeline(storage)
        bytes_per_block = BLOCK_N * COL_BLOCK * self.dtype.width // 8
        ptr = storage.mbar_k.data_ptr()
        pipe_g0 = self.loader.make_pipeline(ptr, self.k_consumer_warps, tx_bytes=len(G0_COLS) * bytes_per_block)
        pipe_g1 = self.loader.make_pipeline(ptr + 2 * self.kv_stages, self.k_consumer_warps,
                                            tx_bytes=len(G1_COLS) * bytes_per_block)
        return pipe_q, (pipe_g0, pipe_g1)

    @cute.jit
    def warpgroup_roles(self, tidx, m_block, kv_head, mMeta, tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens,
                        mNumSplits, mO, mLSE, mOaccum, mLSEaccum, sQ, sK, sP, storage, pipe_q, pipe_k, scale_log2,
                        merge_tail=None):
        wg = tidx // 128
        wg_tidx = tidx % 128
        sV_layout = layouts.v_view_layout(sK.layout, HALF, BLOCK_N, HEAD_DIM, self.kv_stages)
        # P0 lives in the RoPE block (columns 512..575) of t0's stage: a 64 x 64 K-major tile with the
        # same swizzle as the skeleton's P tile, one per stage.
        sP0_layout = cute.composition(sK.layout, cute.make_layout(
            (BLOCK_M, BLOCK_N, self.kv_stages), stride=(1, BLOCK_N, BLOCK_N * HEAD_DIM)))
        sP0 = cute.make_tensor(sK.iterator + HEAD_DIM_V * BLOCK_N, sP0_layout)
        if const_expr(self.with_producer):
            # Whole warpgroups take each branch (setmaxnreg is warpgroup-wide); each role reads the work list
            # after its setmaxnreg (values live across the split are what ptxas spills first).
            wg = cute.arch.make_warp_uniform(cute.arch.warp_idx()) // 4
            producer_regs, regs0, regs1 = self.PRODUCER_REGISTERS
            if wg == 0:
                cute.arch.setmaxregister_decrease(producer_regs)
                begin_req, begin_block, end_req, end_block, begin_split = self.work_list(mMeta)
                self.produce(wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block, begin_split,
                             tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens, mNumSplits, sQ, sK, pipe_q, pipe_k)
            else:
                if const_expr(self.can_merge_chunks()):
                    # Both scoring warpgroups reach the merge by the last chunk from this one call (its barriers
                    # are aligned ``bar.sync``: every thread at the same instruction).
                    assert regs0 == regs1, self.PRODUCER_REGISTERS
                    cute.arch.setmaxregister_increase(regs0)
                    begin_req, begin_block, end_req, end_block, begin_split = self.work_list(mMeta)
                    if wg == 1:
                        sV = cute.make_tensor(sK.iterator, sV_layout)
                        self.role(0, wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block,
                                  begin_split, tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens, mNumSplits, mO, mLSE,
                                  mOaccum, mLSEaccum, sQ, sK, sP, sP0, sV, storage, pipe_q, pipe_k, scale_log2,
                                  merge_tail)
                    else:
                        sV = cute.make_tensor(sK.iterator + HALF * BLOCK_N, sV_layout)
                        self.role(1, wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block,
                                  begin_split, tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens, mNumSplits, mO, mLSE,
                                  mOaccum, mLSEaccum, sQ, sK, sP, sP0, sV, storage, pipe_q, pipe_k, scale_log2,
                                  merge_tail)
                    self.merge_by_last_chunk(merge_tail, tidx - 128, m_block, storage)
                elif wg == 1:
                    cute.arch.setmaxregister_increase(regs0)
                    begin_req, begin_block, end_req, end_block, begin_split = self.work_list(mMeta)
                    sV = cute.make_tensor(sK.iterator, sV_layout)
                    self.role(0, wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block,
                              begin_split, tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens, mNumSplits, mO, mLSE,
                              mOaccum, mLSEaccum, sQ, sK, sP, sP0, sV, storage, pipe_q, pipe_k, scale_log2)
                else:
                    cute.arch.setmaxregister_increase(regs1)
                    begin_req, begin_block, end_req, end_block, begin_split = self.work_list(mMeta)
                    sV = cute.make_tensor(sK.iterator + HALF * BLOCK_N, sV_layout)
                    self.role(1, wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block,
                              begin_split, tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens, mNumSplits, mO, mLSE,
                              mOaccum, mLSEaccum, sQ, sK, sP, sP0, sV, storage, pipe_q, pipe_k, scale_log2)
        else:
            begin_req, begin_block, end_req, end_block, begin_split = self.work_list(mMeta)
            if wg == 0:
                sV = cute.make_tensor(sK.iterator, sV_layout)
                self.role(0, wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block, begin_split,
                          tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens, mNumSplits, mO, mLSE, mOaccum, mLSEaccum,
                          sQ, sK, sP, sP0, sV, storage, pipe_q, pipe_k, scale_log2, merge_tail)
            else:
                sV = cute.make_tensor(sK.iterator + HALF * BLOCK_N, sV_layout)
                self.role(1, wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block, begin_split,
                          tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens, mNumSplits, mO, mLSE, mOaccum, mLSEaccum,
                          sQ, sK, sP, sP0, sV, storage, pipe_q, pipe_k, scale_log2, merge_tail)
            self.merge_by_last_chunk(merge_tail, tidx, m_block, storage)

    @cute.jit
    def role_fragments(self, me: cutlass.Constexpr[int], wg_tidx, mma_qk, mma_rs, mma_ss, sQ, sK, sP, sP0, sV):
        """Warpgroup ``me``'s operand views: Q and K for QK, its V half for the RS and SS P.V, the other
        warpgroup's P as the SS A operand (P1, the skeleton's P tile, for WG0; P0, a stage's RoPE block,
        for WG1, indexed by stage) and its own P as a C-shaped smem view to write."""
        thr_qk = mma_qk.get_slice(wg_tidx)
        thr_rs = mma_rs.get_slice(wg_tidx)
        thr_ss = mma_ss.get_slice(wg_tidx)
        tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ))
        tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK))
        tOrV_rs = thr_rs.make_fragment_B(thr_rs.partition_B(sV))
        tOrV_ss = thr_ss.make_fragment_B(thr_ss.partition_B(sV))
        own = sP0 if const_expr(me == 0) else sP
        if const_expr(me == 0):
            tOrP_other = thr_ss.make_fragment_A(thr_ss.partition_A(sP))
        else:
            tOrP_other = thr_ss.make_fragment_A(thr_ss.partition_A(sP0))
        if const_expr(self.p_stmatrix):
            tPsP_own = self.p_copy(mma_qk).get_slice(wg_tidx).partition_D(own)
        else:
            tPsP_own = thr_qk.partition_C(own)
        return thr_qk, thr_rs, tSrQ, tSrK, tOrV_rs, tOrV_ss, tOrP_other, tPsP_own

    @cute.jit
    def role(self, me: cutlass.Constexpr[int], wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block,
             begin_split, tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens, mNumSplits, mO, mLSE, mOaccum, mLSEaccum,
             sQ, sK, sP, sP0, sV, storage, pipe_q, pipe_k, scale_log2, merge_tail=None):
        """Warpgroup ``me``'s loop (0: scores t0, owns O[:, 0:256], loads group 0 and Q; 1: scores t1,
        owns O[:, 256:512], loads group 1)."""
        C = self.split_cluster
        mma_qk, mma_rs, mma_ss = self.tiled_mmas()
        pipe_g0, pipe_g1 = pipe_k
        pipe_own = pipe_g0 if const_expr(me == 0) else pipe_g1  # the group this warpgroup loads
        cols_own = G0_COLS if const_expr(me == 0) else G1_COLS
        g0 = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        g1 = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        q_prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)

        thr_qk, thr_rs, tSrQ, tSrK, tOrV_rs, tOrV_ss, tOrP_other, tPsP_own = self.role_fragments(
            me, wg_tidx, mma_qk, mma_rs, mma_ss, sQ, sK, sP, sP0, sV)
        cS = cute.make_identity_tensor((BLOCK_M, BLOCK_N))
        tScS = layouts.acc_mn_view(thr_qk.partition_C(cS))
        n_rows_thr = cute.size(tScS, mode=[0])
        s_m = storage.row_max_x.get_tensor(cute.make_layout((BLOCK_M, 2), stride=(1, BLOCK_M)))
        s_sum = storage.row_sum_x.get_tensor(cute.make_layout(BLOCK_M))
        s_inv = storage.row_inv.get_tensor(cute.make_layout(BLOCK_M))
        wg_warp = cute.arch.make_warp_uniform(wg_tidx // 32)
        is_producer = wg_warp < self.load_warps()  # the warps that issue this warpgroup's K loads
        # S of this warpgroup's next tile: written by the QK at the end of an iteration (or the chunk's
        # prologue) and turned into P at the start of the next.
        acc_s = cute.make_rmem_tensor(thr_qk.partition_shape_C((BLOCK_M, BLOCK_N)), Float32)

        for r in cutlass.range(begin_req, end_req + 1, unroll=1):
            self.mark(28 + me, wg_tidx, True)
            seqlen, n_blocks, start, stop, is_split, split_idx = self.chunk_bounds(
                r, begin_req, begin_block, end_req, end_block, begin_split, mSeqlens, mNumSplits)
            if const_expr(not self.with_producer):
                if const_expr(me == 0):
                    if wg_warp == 0:
                        self.tma_load_q(tma_q, mQ, sQ, pipe_q, q_prod, m_block, kv_head, r)
                        q_prod.advance()
                # This warpgroup's group of the chunk's first two tiles.
                if is_producer:
                    for blk in cutlass.range(start, cutlass.min(start + 2 * C, stop), C, unroll=1):
                        self.load_group(tma_k, mK, sK, mBlockTable, pipe_own, prod, r, blk, seqlen, kv_head,
                                        wg_tidx, cols=cols_own)
                        prod.advance()
            acc_o, acc_o_mn, row_max, row_sum, row_scale = self.new_chunk_state(thr_rs, n_rows_thr)
            other_max = cute.make_rmem_tensor(n_rows_thr, Float32)
            row_limit = self.row_limits(seqlen, m_block, tScS)
            pipe_q.consumer_wait(q_state)
            self.mark(30 + me, wg_tidx, True)
            # The chunk's first QK of each warpgroup (later ones go out at the end of an iteration).
            if const_expr(me == 0):
                if start < stop:  # (an empty chunk has no tile to score)
                    self.issue_qk_two_groups(acc_s, tSrQ, tSrK, g0.index, G0_COLS, G1_COLS, pipe_g0, g0, pipe_g1,
                                             g1)
                    warpgroup.wait_group(0)
                    self.loader.consumer_release(pipe_g1, g1)  # G1 of t0: QK was WG0's only read of it
            else:
                if start + C < stop:
                    t1_g0 = g0.clone()
                    t1_g1 = g1.clone()
                    t1_g0.advance()
                    t1_g1.advance()
                    self.issue_qk_two_groups(acc_s, tSrQ, tSrK, t1_g1.index, G1_COLS, G0_COLS, pipe_g1, t1_g1,
                                             pipe_g0, t1_g0)
                    warpgroup.wait_group(0)
                    self.loader.consumer_release(pipe_g0, t1_g0)  # G0 of t1: QK was WG1's only read of it
            self.mark(32 + me, wg_tidx, True)

            # With ``steady_loop`` the chunk's pairs run in two loops: first the steady ones (``steady_stop``: a
            # t1, a whole next pair, no tile needing a mask or zeroed V rows), traced with those checks left out,
            # then the rest with them.
            for lo, hi, steady in self.steady_loops(start, stop, seqlen):
                for t0 in cutlass.range(lo, hi, 2 * C, unroll=1):
                    t1 = t0 + C
                    has_t1 = self.unless_steady(steady, t1 < stop)
                    if const_expr(not steady):
                        if t0 + 2 * C >= stop:
                            self.mark(38 + me, wg_tidx, True)  # the chunk's last iteration
                    a0 = g0.clone()  # group states of t0, t1 and the next pair's t0' / t1'
                    a1 = g1.clone()
                    b0 = a0.clone()
                    b1 = a1.clone()
                    b0.advance()
                    b1.advance()
                    n0 = b0.clone()
                    n1 = b1.clone()
                    n0.advance()
                    n1.advance()
                    if const_expr(me == 0):
                        prod = self.wg0_iteration(t0, t1, has_t1, a0, a1, b0, b1, n0, n1, pipe_g0, pipe_g1, prod,
                                                  seqlen, stop, r, kv_head, wg_tidx, is_producer, row_limit, tScS,
                                                  row_max, row_sum, row_scale, other_max, acc_s, acc_o, acc_o_mn,
                                                  s_m, tSrQ, tSrK, tOrV_rs, tOrV_ss, tOrP_other, tPsP_own, tma_k,
                                                  mK, sK, mBlockTable, scale_log2, steady)
                    else:
                        prod = self.wg1_iteration(t0, t1, has_t1, a0, a1, b0, b1, n0, n1, pipe_g0, pipe_g1, prod,
                                                  seqlen, stop, r, kv_head, wg_tidx, is_producer, row_limit, tScS,
                                                  row_max, row_sum, row_scale, other_max, acc_s, acc_o, acc_o_mn,
                                                  s_m, tSrQ, tSrK, tOrV_rs, tOrV_ss, tOrP_other, tPsP_own, tma_k,
                                                  mK, sK, mBlockTable, scale_log2, steady)
                    self.mark(40 + me, wg_tidx, t1 + 2 * C < stop)  # (a full iteration returned)
                    g0.advance()
                    g1.advance()
                    if has_t1:
                        g0.advance()
                        g1.advance()
            pipe_q.consumer_release(q_state)
            q_state.advance()
            self.mark(34 + me, wg_tidx, True)

            self.finish_chunk(me, wg_tidx, m_block, kv_head, r, is_split, split_idx, acc_o, row_max, row_sum, tScS,
                              s_sum, s_inv, scale_log2, mO, mLSE, mOaccum, mLSEaccum, storage)
            if r == begin_req:  # the part's first chunk, counted in now when more chunks follow (skeleton)
                self.count_first_chunk(merge_tail, wg_tidx + 128 * me, m_block, r, begin_req, end_req, begin_split,
                                       storage)
            self.mark(36 + me, wg_tidx, True)

    @cute.jit
    def steady_stop(self, start, stop, seqlen):
        """The first pair start from which ``role``'s second loop takes over (``steady_end``): pair t0 (step 2C)
        is steady when it and the next pair are whole (t1' = t0 + 3C < stop: WG0 issues QK(t0') and WG1 QK(t1')
        at its end) and its t1 = t0 + C needs no mask and no zeroed V rows (t0 < t1 then neither)."""
        C = self.split_cluster
        return self.steady_end(start, stop, seqlen, 2 * C, C, 3 * C)

    @cute.jit
    def produce(self, wg_tidx, m_block, kv_head, begin_req, begin_block, end_req, end_block, begin_split, tma_q, mQ,
                tma_k, mK, mBlockTable, mSeqlens, mNumSplits, sQ, sK, pipe_q, pipe_k):
        """The producer warpgroup (``producer_warpgroup``): every load of the work list. Warp 3 loads each
        request's Q; the loader's producer warps load every tile of the chunk (``produce_pairs``), each
        group once the stage's group is free (its empty barrier). The next request's Q and first tiles go
        out as soon as their buffers are free, while the current chunk still computes (with a split
        cluster only after the chunk's epilogue, which reuses the stages)."""
        C = self.split_cluster
        pipe_g0, pipe_g1 = pipe_k
        warp = cute.arch.make_warp_uniform(wg_tidx // 32)
        q_prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        p0 = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
        p1 = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
        for r in cutlass.range(begin_req, end_req + 1, unroll=1):
            seqlen, n_blocks, start, stop, is_split, split_idx = self.chunk_bounds(
                r, begin_req, begin_block, end_req, end_block, begin_split, mSeqlens, mNumSplits)
            if warp == 3:
                self.tma_load_q(tma_q, mQ, sQ, pipe_q, q_prod, m_block, kv_head, r)
                q_prod.advance()
            if warp < self.loader.producer_warps:
                p0, p1 = self.produce_pairs(wg_tidx, r, start, stop, seqlen, kv_head, tma_k, mK, sK, mBlockTable,
                                            pipe_g0, pipe_g1, p0, p1)
            if const_expr(C > 1):
                self.cluster_idle()  # the chunk's epilogue barriers (it reduces in the K stages)

    @cute.jit
    def produce_pairs(self, wg_tidx, r, start, stop, seqlen, kv_head, tma_k, mK, sK, mBlockTable, pipe_g0, pipe_g1,
                      p0, p1):
        """The producer's loads of one chunk, pair by pair, in the order the max-first iteration frees the
        groups: G0 of t0 (after WG0's P.V of t0), G1 of t1 (after WG1's P.V of t1), G1 of t0 (after WG1's
        P.V of t0), G0 of t1 (after WG0's P.V of t1). Why: one queue in tile order would hold G1 of t1 behind
        the two groups released after it (and G1 of t0 before G1 of t1, so that QK(t0') gets its refill first,
        was 0.5-3% slower on the 128-row rows, paired on an H100: the refill still lands at the same time, and
        QK(t1') then runs into WG1's next softmax; docs/perf-notes.md, thirty-third session). Each load waits
        only for releases of the previous pair, so the order cannot deadlock. ``p0`` / ``p1`` advance in tile
        order as in ``produce``."""
        C = self.split_cluster
        for t0 in cutlass.range(start, stop, 2 * C, unroll=1):
            t1 = t0 + C
            page0 = self.loader.page_id(mBlockTable, r, t0, seqlen, wg_tidx)
            self.produce_group(tma_k, mK, sK, mBlockTable, pipe_g0, p0, r, t0, seqlen, kv_head, wg_tidx,
                               page0, G0_COLS)
            p0.advance()
            if t1 < stop:
                # (the probe's events 44-47: this pair's loads, stamped where the previous pair's iteration is
                # a full one, which they then belong to)
                loads_of_full = t0 > start
                self.mark(44, wg_tidx, loads_of_full)
                page1 = self.loader.page_id(mBlockTable, r, t1, seqlen, wg_tidx)
                q1 = p1.clone()
                q1.advance()
                self.produce_group(tma_k, mK, sK, mBlockTable, pipe_g1, q1, r, t1, seqlen, kv_head, wg_tidx,
                                   page1, G1_COLS)
                self.mark(45, wg_tidx, loads_of_full)
                self.produce_group(tma_k, mK, sK, mBlockTable, pipe_g1, p1, r, t0, seqlen, kv_head, wg_tidx,
                                   page0, G1_COLS)
                self.mark(46, wg_tidx, loads_of_full)
                self.produce_group(tma_k, mK, sK, mBlockTable, pipe_g0, p0, r, t1, seqlen, kv_head, wg_tidx,
                                   page1, G0_COLS)
                self.mark(47, wg_tidx, loads_of_full)
                p0.advance()
                p1.advance()
                p1.advance()
            else:
                self.produce_group(tma_k, mK, sK, mBlockTable, pipe_g1, p1, r, t0, seqlen, kv_head, wg_tidx,
                                   page0, G1_COLS)
                p1.advance()
            if const_expr(self.l2_ahead):
                for ahead in cutlass.range_constexpr(2):
                    blk = t0 + (2 + ahead) * C
                    if blk < stop:
                        page_ahead = self.loader.page_id(mBlockTable, r, blk, seqlen, wg_tidx)
                        self.loader.prefetch_tile(tma_k, mK, sK, blk, kv_head, page_ahead, wg_tidx)
        return p0, p1

    @cute.jit
    def produce_group(self, tma_k, mK, sK, mBlockTable, pipe, state, r, blk, seqlen, kv_head, wg_tidx, page, cols):
        """The loader's ``load_tile`` of column group ``cols`` of tile ``blk`` into ``state``'s stage. With
        ``producer_spin`` the producer first polls (``mbarrier.test_wait``) until the stage's group is free,
        so that the loader's acquire then passes at once instead of sleeping in try_wait."""
        if const_expr(self.producer_spin):
            paged_kv.poll_barrier(pipe.sync_object_empty.get_barrier(state.index), state.phase)
        self.loader.load_tile(tma_k, mK, sK, mBlockTable, pipe, state, r, blk, seqlen, kv_head, wg_tidx, page=page,
                              cols=cols)

    @cute.jit
    def finish_chunk(self, me: cutlass.Constexpr[int], wg_tidx, m_block, kv_head, r, is_split, split_idx, acc_o,
                     row_max, row_sum, tScS, s_sum, s_inv, scale_log2, mO, mLSE, mOaccum, mLSEaccum, storage):
        """Chunk end: WG1's row sums to WG0, which finalises (SUM); 1/rowsum back to WG1 (INV); both store
        their half of O (WG0 also the lse)."""
        n_rows_thr = cute.size(tScS, mode=[0])
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
            self.mark(51, wg_tidx, True)
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
            self.mark(50, wg_tidx, True)
        # A fresh MMA object for the epilogue's fragment layout: the loop's ones carry state set inside it.
        _, mma_store, _ = self.tiled_mmas()
        self.store_chunk(acc_o, mma_store, wg_tidx, wg_tidx + 128 * me, row_inv, row_lse, me == 0, HALF * me,
                         m_block, kv_head, r, is_split, split_idx, mO, mLSE, mOaccum, mLSEaccum, storage)
        self.mark(52 + me, wg_tidx, True)

    @cute.jit
    def publish_max(self, s_m, slot: cutlass.Constexpr[int], row_max, tScS, wg_tidx, bar: cutlass.Constexpr[int]):
        if wg_tidx % 4 == 0:
            for i in cutlass.range_constexpr(cute.size(row_max, mode=[0])):
                s_m[tScS[i, 0][0], slot] = row_max[i]
        cute.arch.barrier_arrive(barrier_id=bar, number_of_threads=256)

    def p_copy(self, mma_qk):
        """The tiled ``stmatrix`` copy of a P tile from the QK accumulator's layout (``p_stmatrix``)."""
        atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        return cute.make_tiled_copy_C(atom, mma_qk)

    @cute.jit
    def store_p(self, rP, tPsP, wg_tidx):
        """This warpgroup's P tile (bf16 registers) into its smem view ``tPsP`` (``role_fragments``)."""
        if const_expr(self.p_stmatrix):
            mma_qk, _, _ = self.tiled_mmas()
            p_copy = self.p_copy(mma_qk)
            cute.copy(p_copy, p_copy.get_slice(wg_tidx).retile(rP), tPsP)
        else:
            cute.autovec_copy(rP, tPsP)

    @cute.jit
    def read_max(self, s_m, slot: cutlass.Constexpr[int], out, tScS, bar: cutlass.Constexpr[int]):
        cute.arch.barrier(barrier_id=bar, number_of_threads=256)
        for i in cutlass.range_constexpr(cute.size(out, mode=[0])):
            out[i] = s_m[tScS[i, 0][0], slot]

    @cute.jit
    def pv(self, rs: cutlass.Constexpr[bool], acc_o, tOrP, tOrV, stage, first: cutlass.Constexpr[bool]):
        """O += P.V of one tile (issue only; the caller commits and waits): P from registers (``rs``) or
        from smem. A fresh MMA object: its ACCUMULATE state must not escape the caller's branch."""
        _, mma_rs, mma_ss = self.tiled_mmas()
        tiled_mma = mma_rs if const_expr(rs) else mma_ss
        if const_expr(first):
            warpgroup.fence()
        for k in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            cute.gemm(tiled_mma, acc_o, tOrP[None, None, k], tOrV[None, None, k, stage], acc_o)

    @cute.jit
    def mark(self, event: cutlass.Constexpr[int], wg_tidx, full):
        """A probe's hook (``scripts/seesaw_timeline.py`` stamps the clock here): ``event`` of a warpgroup's
        iteration (0-27), ``full`` when the iteration has t1 and a next pair, or of its chunk in ``role`` (28-41:
        chunk start, Q landed, first QK retired, loop done, chunk stored, last iteration, a full iteration
        returned; WG0's even, WG1's odd), 42 / 43 when QK(t0') / QK(t1')'s refilled group landed, or of the
        producer's warp 0 (44-47: after each load of a pair), 48 / 49 when QK(t0') / QK(t1')'s first group
        landed, or of a chunk's epilogue (50-53: row sums exchanged, O stored). Nothing in the library."""
        pass

    def spreads_copies(self) -> bool:
        """Whether a group's column-block copies are spread over the warpgroup's four warps (``load_group``):
        on the TMA path that issues one box per CTA and tile (pages 64 and 128, page 32 in a cluster), unless a
        group is one copy (``kv_wide_boxes``)."""
        return isinstance(self.loader, paged_kv.TmaPagedKV) and not self.loader.warp_per_box \
            and self.loader.boxes_per_cta == 1 and self.loader.wide_groups is None

    def load_warps(self) -> int:
        """Warps of each warpgroup that run ``load_group`` (and read the refills' page ids)."""
        return 4 if self.spreads_copies() else self.loader.producer_warps

    @cute.jit
    def cta_box(self, blk, wg_tidx):
        """``(box of the tile, box of the page)`` this CTA loads of tile ``blk`` on the one-box TMA path
        (``spreads_copies``): its rank in the multicast cluster, and the row block of the page it starts in."""
        box_idx = (self.loader.box_token(blk, wg_tidx) - blk * BLOCK_N) // self.loader.box_rows
        in_page = (self.loader.box_token(blk, wg_tidx) % self.page_size) // self.loader.box_rows
        return box_idx, in_page

    @cute.jit
    def load_group(self, tma_k, mK, sK, mBlockTable, pipe, prod, r, blk, seqlen, kv_head, wg_tidx, page=None,
                   cols=None):
        """The ``load_warps`` warps of a warpgroup load column group ``cols`` of tile ``blk`` into the stage
        ``prod`` points at. With ``spreads_copies`` each warp waits for the stage's empty barrier and issues
        every fourth of the group's 64-column copies, warp 0 also arriving on the full barrier with the
        group's whole byte count (its only expected arrival; copies that land before it leave the
        transaction count below zero, which the barrier allows, and cannot complete the phase while that
        arrival is pending). Why: a warp issues its TMA copies one after another, about 120-150 cycles each
        (``scripts/seesaw_timeline.py``: 600-750 cycles for a group's 4-5 multicast copies from one warp), and
        the warpgroup's next wgmma waits for that warp. Elsewhere the loader's own ``load_tile``."""
        if const_expr(not self.spreads_copies()):
            self.loader.load_tile(tma_k, mK, sK, mBlockTable, pipe, prod, r, blk, seqlen, kv_head, wg_tidx,
                                  page=page, cols=cols)
        else:
            warp = cute.arch.make_warp_uniform(wg_tidx // 32)
            if const_expr(page is None):
                page = self.loader.page_id(mBlockTable, r, blk, seqlen, wg_tidx)
            if warp == 0:
                pipe.producer_acquire(prod)
            else:
                pipe.sync_object_empty.wait(prod.index, prod.phase)
            bar = pipe.producer_get_barrier(prod)
            tKsK, tKgK = self.loader.tma_views(tma_k, mK, sK)
            rank, in_page = self.cta_box(blk, wg_tidx)
            for w in cutlass.range_constexpr(4):
                if const_expr(len(cols[w::4]) > 0):
                    if warp == w:
                        self.loader._copy_box(tma_k, tKgK, tKsK, in_page, kv_head, page, rank, prod.index, bar,
                                              cols[w::4])

    @cute.jit
    def refill_pages(self, is_producer, mBlockTable, r, t0, seqlen, wg_tidx):
        """This producer warp's page ids of the next pair's tiles t0 + 2C and t1 + 2C, read at the start of
        an iteration (``None, None`` where the loader reads its own). Why: the refills go out mid-iteration,
        right when a group frees, and a block_table read there put a global load's latency (about 1000
        cycles, measured with ``scripts/seesaw_timeline.py``) between the release and the TMA, on the
        warpgroup's path and the next QK's. A tile index past the chunk reads a valid page
        (``page_id`` clamps) that is never used."""
        C = self.split_cluster
        if const_expr(self.with_producer or not self.loader.prefetches_page()):
            return None, None
        page_a = Int32(0)
        page_b = Int32(0)
        if is_producer:
            page_a = self.loader.page_id(mBlockTable, r, t0 + 2 * C, seqlen, wg_tidx)
            page_b = self.loader.page_id(mBlockTable, r, t0 + 3 * C, seqlen, wg_tidx)
        return page_a, page_b

    @cute.jit
    def prefetch_next_pair(self, is_producer, tma_k, mK, sK, blk, stop, kv_head, page, wg_tidx):
        """With ``l2_prefetch_next_pair`` (and ``spreads_copies``): L2 prefetches of this CTA's box of tile
        ``blk`` (every 64-column block; ``page`` its page id from ``refill_pages``), each warp of the
        warpgroup every fourth block, if the tile is in the chunk. No-op otherwise."""
        if const_expr(self.l2_prefetch_next_pair and self.spreads_copies()):
            if is_producer:
                if blk < stop:
                    warp = cute.arch.make_warp_uniform(wg_tidx // 32)
                    _, tKgK = self.loader.tma_views(tma_k, mK, sK)
                    _, in_page = self.cta_box(blk, wg_tidx)
                    blocks = tuple(range(HEAD_DIM // COL_BLOCK))
                    for w in cutlass.range_constexpr(4):
                        if warp == w:
                            for c in cutlass.range_constexpr(len(blocks[w::4])):
                                cute.prefetch(tma_k, tKgK[None, in_page, blocks[w::4][c], kv_head, page])

    @cute.jit
    def clear_s(self, acc_s):
        """With ``clear_p``: zero S once its P is in bf16 registers. Why: S is carried around the loop (the
        next pair's QK refills it, but not on every path), so P's fp32 values stayed live past the P.V and
        ptxas recomputed the tile's 32 exponentials to keep them (seen in the SASS: 32 FFMA + 32 MUFU.EX2 per
        tile and warpgroup, off the softmax). No-op otherwise."""
        if const_expr(self.clear_p):
            acc_s.fill(0.0)

    @cute.jit
    def issue_qk_two_groups(self, acc_s, tSrQ, tSrK, stage, first_cols: cutlass.Constexpr,
                            second_cols: cutlass.Constexpr, pipe_first, state_first, pipe_second, state_second,
                            mark_second: cutlass.Constexpr[int] = -1, wg_tidx=None, full=None,
                            mark_first: cutlass.Constexpr[int] = -1):
        """S = Q.K^T of the tile in ``stage``, behind whatever wgmma group the caller has in flight: the
        column blocks of the group expected first, then the other group's, each after its full barrier;
        committed as one group, not waited for. ``mark_first`` / ``mark_second``: the probe's events once the first
        / second group landed."""
        mma_qk, _, _ = self.tiled_mmas()  # fresh: its ACCUMULATE state must not escape the caller's branch
        self.loader.consumer_wait(pipe_first, state_first, self.k_wait_spin)
        if const_expr(mark_first >= 0):
            self.mark(mark_first, wg_tidx, full)
        # A barrier wait is a loop (a branch) inside the wgmma chain: an explicit fence after it, or ptxas
        # injects one in the loop's divergent path and serializes every wgmma (info C7520).
        warpgroup.fence()
        self.qk_blocks(mma_qk, acc_s, tSrQ, tSrK, stage, first_cols, True)
        self.loader.consumer_wait(pipe_second, state_second, self.k_wait_spin)
        if const_expr(mark_second >= 0):
            self.mark(mark_second, wg_tidx, full)
        warpgroup.fence()
        self.qk_blocks(mma_qk, acc_s, tSrQ, tSrK, stage, second_cols, False)
        warpgroup.commit_group()

    @cute.jit
    def wg0_tail(self, t0, t1, b0, n0, n1, pipe_g0, pipe_g1, prod, seqlen, stop, r, kv_head, wg_tidx, is_producer,
                 acc_s, acc_o, tSrQ, tSrK, tOrV_ss, tOrP_other, tma_k, mK, sK, mBlockTable, page_b,
                 steady: cutlass.Constexpr[bool] = False):
        """WG0's end of an iteration with a t1 (P1 in smem, O_L at m1): O_L += P1.V_L(t1) (SS), then the next
        pair's QK(t0') right behind it in the tensor pipe (retired in ``acc_s``), releasing G0 of t1 once
        that P.V retired."""
        C = self.split_cluster
        full = t1 + 2 * C < stop
        stage_b = b0.index
        valid1 = seqlen - t1 * BLOCK_N
        self.loader.consumer_wait(pipe_g0, b0)
        self.zero_tail_v_rows(sK, stage_b, valid1, 0, HALF, wg_tidx, int(Bar.WG0), steady)
        # O_L += P1.V_L(t1) (SS, P1 from smem); the next pair's QK goes right behind it. Each branch
        # issues and retires its own wgmma groups (a group in flight across a branch makes ptxas
        # serialize every wgmma).
        has_next = self.unless_steady(steady, t0 + 2 * C < stop)
        if has_next:
            self.mark(7, wg_tidx, full)
            self.pv(False, acc_o, tOrP_other, tOrV_ss, stage_b, True)
            warpgroup.commit_group()
            self.mark(8, wg_tidx, full)
            if const_expr(self.early):
                # QK(t0') in two commit groups: G0's blocks, then (PV_L(t1) retired) G0 of t1 released
                # before the wait for G1's blocks, which land last. (Only with the producer: no refill here.)
                mma_qk, _, _ = self.tiled_mmas()
                self.loader.consumer_wait(pipe_g0, n0, self.k_wait_spin)
                self.mark(48, wg_tidx, full)
                warpgroup.fence()
                self.qk_blocks(mma_qk, acc_s, tSrQ, tSrK, n0.index, G0_COLS, True)
                warpgroup.commit_group()
                warpgroup.wait_group(1)
                self.mark(10, wg_tidx, full)
                self.loader.consumer_release(pipe_g0, b0)  # G0 of t1: P.V done; the producer refills it
                self.loader.consumer_wait(pipe_g1, n1, self.k_wait_spin)
                self.mark(42, wg_tidx, full)
                warpgroup.fence()
                self.qk_blocks(mma_qk, acc_s, tSrQ, tSrK, n0.index, G1_COLS, False)
                warpgroup.commit_group()
                self.mark(9, wg_tidx, full)
            else:
                self.issue_qk_two_groups(acc_s, tSrQ, tSrK, n0.index, G0_COLS, G1_COLS, pipe_g0, n0,
                                         pipe_g1, n1)
                self.mark(9, wg_tidx, full)
                warpgroup.wait_group(1)
                self.mark(10, wg_tidx, full)
                self.loader.consumer_release(pipe_g0, b0)  # G0 of t1: P.V done; refill it now
                if const_expr(not self.with_producer):
                    if is_producer:
                        if t1 + 2 * C < stop:
                            self.load_group(tma_k, mK, sK, mBlockTable, pipe_g0, prod, r, t1 + 2 * C, seqlen,
                                            kv_head, wg_tidx, page=page_b, cols=G0_COLS)
                            prod.advance()
            warpgroup.wait_group(0)
            self.mark(11, wg_tidx, full)
            self.loader.consumer_release(pipe_g1, n1)  # G1 of t0': QK was WG0's only read of it
        else:
            self.pv(False, acc_o, tOrP_other, tOrV_ss, stage_b, True)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            self.loader.consumer_release(pipe_g0, b0)
        return prod

    @cute.jit
    def wg0_iteration(self, t0, t1, has_t1, a0, a1, b0, b1, n0, n1, pipe_g0, pipe_g1, prod, seqlen, stop, r,
                      kv_head, wg_tidx, is_producer, row_limit, tScS, row_max, row_sum, row_scale, other_max,
                      acc_s, acc_o, acc_o_mn, s_m, tSrQ, tSrK, tOrV_rs, tOrV_ss, tOrP_other, tPsP_own, tma_k, mK,
                      sK, mBlockTable, scale_log2, steady: cutlass.Constexpr[bool] = False):
        """WG0's half of one iteration; S0 = QK(t0) is in ``acc_s`` (retired). m0 goes to WG1 right after the
        softmax, before any P.V, so that WG1's softmax of t1 runs beside this warpgroup's P.V of t0; P0 crosses
        over only after m1 came back, rescaled to m1."""
        C = self.split_cluster
        stage_a = a0.index
        full = t1 + 2 * C < stop
        self.mark(0, wg_tidx, full)
        page_a, page_b = self.refill_pages(is_producer, mBlockTable, r, t0, seqlen, wg_tidx)
        self.prefetch_next_pair(is_producer, tma_k, mK, sK, t0 + 2 * C, stop, kv_head, page_a, wg_tidx)
        self.softmax_tile(acc_s, t0, seqlen, row_limit, tScS, row_max, row_sum, row_scale, scale_log2,
                          mask=not steady)
        self.publish_max(s_m, 0, row_max, tScS, wg_tidx, int(Bar.M0))
        self.mark(1, wg_tidx, full)
        rP = cute.make_rmem_tensor_like(acc_s, self.dtype)
        rP.store(acc_s.load().to(self.dtype))
        self.clear_s(acc_s)
        softmax.rescale_rows_if_needed(acc_o_mn, row_scale)
        valid0 = seqlen - t0 * BLOCK_N
        self.zero_tail_v_rows(sK, stage_a, valid0, 0, HALF, wg_tidx, int(Bar.WG0), steady)
        self.pv(True, acc_o, layouts.acc_as_a_operand(rP), tOrV_rs, stage_a, True)
        warpgroup.commit_group()
        self.mark(3, wg_tidx, full)
        # P0 into t0's RoPE block for WG1 while the P.V runs (it only reads rP), relative to m0: with lazy
        # rescaling m1 is nearly always m0, and where it is not the tile is written again below.
        self.store_p(rP, tPsP_own[None, None, None, stage_a], wg_tidx)
        if const_expr(self.early_p_fence):
            cute.arch.fence_view_async_shared()
        warpgroup.wait_group(0)
        self.mark(4, wg_tidx, full)
        self.loader.consumer_release(pipe_g0, a0)  # G0 of t0: QK and P.V done; refill it now
        self.mark(25, wg_tidx, full)
        if const_expr(not self.with_producer):
            if is_producer:
                if t0 + 2 * C < stop:
                    self.load_group(tma_k, mK, sK, mBlockTable, pipe_g0, prod, r, t0 + 2 * C, seqlen, kv_head,
                                    wg_tidx, page=page_a, cols=G0_COLS)
                    prod.advance()
        self.mark(5, wg_tidx, full)
        # m1 = max(m0, rowmax S1) from WG1 (m0 itself where there is no t1).
        self.read_max(s_m, 1, other_max, tScS, int(Bar.M1))
        self.mark(6, wg_tidx, full)
        if has_t1:
            self.loader.consumer_release(pipe_g1, b1)  # G1 of t1: never read by WG0 (after M1: see docstring)
        softmax.raise_max(row_max, row_sum, row_scale, other_max, scale_log2)
        # P0 relative to m1 for WG1: written again only by the warps where the max moved.
        if softmax.warp_needs_rescale(row_scale):
            if const_expr(self.clear_p):  # from the bf16 P0 (S is cleared): rounded twice
                acc_s.store(rP.load().to(Float32))
            softmax.rescale_rows(layouts.acc_mn_view(acc_s), row_scale)
            rP.store(acc_s.load().to(self.dtype))
            self.store_p(rP, tPsP_own[None, None, None, stage_a], wg_tidx)
            if const_expr(self.early_p_fence):
                cute.arch.fence_view_async_shared()
        if const_expr(not self.early_p_fence):
            cute.arch.fence_view_async_shared()
        cute.arch.barrier_arrive(barrier_id=int(Bar.P0), number_of_threads=256)
        self.mark(2, wg_tidx, full)
        softmax.rescale_rows_if_needed(acc_o_mn, row_scale)
        if has_t1:
            # P1 in smem and WG1's two P.Vs issued: O_L += P1.V_L(t1) goes in behind them.
            cute.arch.barrier(barrier_id=int(Bar.P1), number_of_threads=256)
            prod = self.wg0_tail(t0, t1, b0, n0, n1, pipe_g0, pipe_g1, prod, seqlen, stop, r, kv_head, wg_tidx,
                                 is_producer, acc_s, acc_o, tSrQ, tSrK, tOrV_ss, tOrP_other, tma_k, mK, sK,
                                 mBlockTable, page_b, steady)
        return prod

    @cute.jit
    def wg1_iteration(self, t0, t1, has_t1, a0, a1, b0, b1, n0, n1, pipe_g0, pipe_g1, prod, seqlen, stop, r,
                      kv_head, wg_tidx, is_producer, row_limit, tScS, row_max, row_sum, row_scale, other_max,
                      acc_s, acc_o, acc_o_mn, s_m, tSrQ, tSrK, tOrV_rs, tOrV_ss, tOrP_other, tPsP_own, tma_k, mK,
                      sK, mBlockTable, scale_log2, steady: cutlass.Constexpr[bool] = False):
        """WG1's half of one iteration; S1 = QK(t1) is in ``acc_s`` (retired) when there is a t1. On m0 alone:
        the softmax of t1 (m1), m1 back to WG0, P1 to smem and O_R += P1.V_R(t1) (RS); then on P0 (relative to
        m1) O_R += P0.V_R(t0) (SS). Ends with QK(t1') of the next pair retired in ``acc_s``."""
        C = self.split_cluster
        stage_a = a0.index
        stage_b = b0.index
        full = t1 + 2 * C < stop
        self.mark(12, wg_tidx, full)
        page_a, page_b = self.refill_pages(is_producer, mBlockTable, r, t0, seqlen, wg_tidx)
        self.prefetch_next_pair(is_producer, tma_k, mK, sK, t1 + 2 * C, stop, kv_head, page_b, wg_tidx)
        tile_max = cute.make_rmem_tensor_like(row_max)
        if const_expr(self.wg1_max_ahead):
            # S1's row maxima while WG0 runs its softmax: after M0 only m1 = max(m0, them) and the exponentials.
            if has_t1:
                if const_expr(not steady):
                    self.mask_tile(acc_s, t1, seqlen, row_limit, tScS)
                softmax.tile_row_max(layouts.acc_mn_view(acc_s), tile_max, self.softmax_tree)
        self.read_max(s_m, 0, other_max, tScS, int(Bar.M0))
        self.mark(13, wg_tidx, full)
        self.loader.consumer_release(pipe_g0, a0)  # G0 of t0: never read by WG1 (after M0: see docstring)
        softmax.raise_max(row_max, row_sum, row_scale, other_max, scale_log2)  # to m0
        valid0 = seqlen - t0 * BLOCK_N
        if has_t1:
            to_m0 = cute.make_rmem_tensor_like(row_scale)
            to_m0.store(row_scale.load())
            if const_expr(self.wg1_max_ahead):
                softmax.online_softmax_step_from(layouts.acc_mn_view(acc_s), tile_max, row_max, row_sum, row_scale,
                                                 scale_log2, self.lazy_rescale)
            else:
                self.softmax_tile(acc_s, t1, seqlen, row_limit, tScS, row_max, row_sum, row_scale, scale_log2,
                                  mask=not steady)
            self.publish_max(s_m, 1, row_max, tScS, wg_tidx, int(Bar.M1))
            self.mark(16, wg_tidx, full)
            for i in cutlass.range_constexpr(cute.size(row_scale, mode=[0])):
                row_scale[i] = row_scale[i] * to_m0[i]  # O_R from m to m1 in one pass
            rP = cute.make_rmem_tensor_like(acc_s, self.dtype)
            rP.store(acc_s.load().to(self.dtype))
            self.clear_s(acc_s)
            softmax.rescale_rows_if_needed(acc_o_mn, row_scale)
            valid1 = seqlen - t1 * BLOCK_N
            self.zero_tail_v_rows(sK, stage_b, valid1, HALF, HALF, wg_tidx, int(Bar.WG1), steady)
            self.pv(True, acc_o, layouts.acc_as_a_operand(rP), tOrV_rs, stage_b, True)
            warpgroup.commit_group()
            self.mark(20, wg_tidx, full)
            # P1 to smem for WG0 while that P.V runs (it reads rP only). sP is free: WG0's P.V that read the
            # previous P1 retired before WG0 arrived on this iteration's M0.
            self.store_p(rP, tPsP_own, wg_tidx)
            if const_expr(not self.early_p_fence):
                cute.arch.fence_view_async_shared()
            self.mark(17, wg_tidx, full)
            cute.arch.barrier(barrier_id=int(Bar.P0), number_of_threads=256)
            self.mark(14, wg_tidx, full)
            self.loader.consumer_wait(pipe_g1, a1)
            self.zero_tail_v_rows(sK, stage_a, valid0, HALF, HALF, wg_tidx, int(Bar.WG1), steady)
            self.pv(False, acc_o, tOrP_other[None, None, None, stage_a], tOrV_ss, stage_a, True)
            warpgroup.commit_group()
            if const_expr(self.early_p_fence):
                cute.arch.fence_view_async_shared()  # P1's stores, before its arrive
            cute.arch.barrier_arrive(barrier_id=int(Bar.P1), number_of_threads=256)
            self.mark(15, wg_tidx, full)
            warpgroup.wait_group(1)
            self.mark(21, wg_tidx, full)
            self.loader.consumer_release(pipe_g1, b1)  # G1 of t1: QK and P.V done
            self.mark(27, wg_tidx, full)
            warpgroup.wait_group(0)
            self.mark(18, wg_tidx, full)
            self.loader.consumer_release(pipe_g1, a1)  # G1 of t0: P.V and P0 read
            self.mark(26, wg_tidx, full)
            if const_expr(not self.with_producer):
                if is_producer:  # in tile order (the loads' pipeline state): t0's refill, then t1's
                    if t0 + 2 * C < stop:
                        self.load_group(tma_k, mK, sK, mBlockTable, pipe_g1, prod, r, t0 + 2 * C, seqlen, kv_head,
                                        wg_tidx, page=page_a, cols=G1_COLS)
                        prod.advance()
                    if t1 + 2 * C < stop:
                        self.load_group(tma_k, mK, sK, mBlockTable, pipe_g1, prod, r, t1 + 2 * C, seqlen,
                                        kv_head, wg_tidx, page=page_b, cols=G1_COLS)
                        prod.advance()
            has_next = self.unless_steady(steady, t1 + 2 * C < stop)
            if has_next:
                m0s = n0.clone()
                m1s = n1.clone()
                m0s.advance()
                m1s.advance()
                self.mark(22, wg_tidx, full)
                # QK(t1'): the group loaded first. The producer loads in release order (``produce_pairs``): G1,
                # freed by this warpgroup's P.V of t1, before G0, freed by WG0's P.V of t1. Without it both go
                # out at about the same time (WG1 refills its G1s after both its P.Vs).
                first, second = (G1_COLS, pipe_g1, m1s), (G0_COLS, pipe_g0, m0s)
                if const_expr(not self.with_producer):
                    first, second = second, first
                self.issue_qk_two_groups(acc_s, tSrQ, tSrK, m1s.index, first[0], second[0], first[1], first[2],
                                         second[1], second[2], 43, wg_tidx, full, 49)
                self.mark(23, wg_tidx, full)
                warpgroup.wait_group(0)
                self.mark(24, wg_tidx, full)
                self.loader.consumer_release(pipe_g0, m0s)  # G0 of t1': QK was WG1's only read of it
        else:
            self.publish_max(s_m, 1, row_max, tScS, wg_tidx, int(Bar.M1))  # m1 = m0: no t1
            softmax.rescale_rows_if_needed(acc_o_mn, row_scale)
            cute.arch.barrier(barrier_id=int(Bar.P0), number_of_threads=256)
            self.loader.consumer_wait(pipe_g1, a1)
            self.zero_tail_v_rows(sK, stage_a, valid0, HALF, HALF, wg_tidx, int(Bar.WG1))
            self.pv(False, acc_o, tOrP_other[None, None, None, stage_a], tOrV_ss, stage_a, True)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            self.loader.consumer_release(pipe_g1, a1)
        return prod
