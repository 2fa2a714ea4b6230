"""A 64-token tile's schedule on operands that stay in shared memory: what bounds the compute-bound tile (issue 8)?

    python scripts/schedule_sim.py [--iters 2000] [--schedule 2wg ...] [--sass DIR]

One CTA per SM (132) runs ``--iters`` tiles of the decode's tensor work and softmax on operands that stay
in shared memory (zeros: the tensor cores' and the exponentials' speed does not depend on the values), with
the real hand-off of P through shared memory and named barriers, and no Q or K loads unless a schedule adds
them. So each schedule's tile period is what its order of wgmma, softmax and barriers allows when every K
tile is already there. Schedules:

- ``2wg``: today's 2wg order (256 threads). WG0: QK (36 k-steps of m64n64k16, Q and K from shared memory),
  wait, online softmax (``softmax.online_softmax_step``), P to 16 bits, P_EMPTY, P stored for WG1, its
  half of P.V with P from registers (4 k-steps of m64n256k16), the proxy fence and P_FULL behind that
  issue, wait. WG1: P_FULL, its half of P.V with P from shared memory, wait, P_EMPTY.
- ``2wg-bulk``: ``2wg`` with a K tile's 72 KB of async bulk copies (``cp.async.bulk``, 9 x 8 KB, from one
  L2-resident tile) landing in the K-like tile per tile, issued by WG1's first thread behind its P.V as
  2wg's producer warp refills a stage, the round before waited for first; ``2wg-bulk2``: two rounds in
  flight (two barriers); ``2wg-bulk2-hbm``: each CTA streams its own tiles from a 608 MB buffer (HBM: no
  multicast, so twice the decode's HBM bytes per tile; bandwidth-bound, not a model of the compute-bound rows).
- ``2wg-rope`` / ``2wg-bulk-rope``: the same with Q's RoPE block (the QK's last 4 k-steps) in registers.
- ``3role``: a score warpgroup and two P.V warpgroups (384 threads, ``setmaxnreg`` ``REGS_3ROLE``: the score
  warpgroup is the last one). The score warpgroup holds Q in registers (the QK's A operand, 144
  registers: Q out of shared memory is what would free room for a third K stage) and no O: QK (RS), wait,
  softmax, P to 16 bits, P_EMPTY (both P.V warpgroups done with the previous P), P stored, P_FULL, and
  straight on to the next QK, which so runs beside the P.V of the tile before. The two others: P_FULL,
  their half of P.V (SS), wait, P_EMPTY. It does not fit: ptxas drops ``setmaxnreg`` (no ``USETMAXREG``)
  when the P.V warpgroups get less than 160 registers, and at 184 the score warpgroup spills and its
  wgmma are serialized.
- ``3role-ss``: ``3role`` with Q in shared memory (SS QK): the schedule alone, without the RS step.
- ``2wg-defer`` (``-bulk``): ``2wg`` with WG1's P.V of tile t-1 issued only once WG0's QK of tile t has retired
  (``BAR_QK_DONE``), so that it runs beside WG0's softmax instead of beside its QK.
- ``2wg-ksplit`` (``-bulk``): the QK split along K between the warpgroups: WG0 runs k-steps 0-17, WG1 18-35
  and hands its partial scores (fp32, 16 KB, a buffer the decode kernel has no room for) to WG0 through shared
  memory (``BAR_S_FULL`` / ``BAR_S_EMPTY``) before its half of P.V. WG1 waits for its P.V behind the issue: with
  it in flight across the loop's back edge, ptxas serialized every wgmma.

Printed per schedule: SM cycles per tile (three runs, median CTA, from the score warpgroup's ``%clock64``
stamps around its loop) and the tile's tensor work at the dense bf16 peak (2048 multiply-adds per clock and
SM: 2176 cycles) over that. ``--sass DIR``: compile only, write each schedule's SASS there and print its
spill, HGMMA, ``WARPGROUP.DEPBAR`` and ``USETMAXREG`` counts. Measured (H100, docs/perf-notes.md,
twenty-sixth and twenty-seventh sessions): ``2wg`` 2733-2737 cycles, ``3role-ss`` 2781-2799, ``2wg-bulk``
3340-3672 by machine; ``2wg-defer`` 2918, ``2wg-ksplit`` 3000, ``2wg-defer-bulk`` 3595-3615, ``2wg-ksplit-bulk``
3328-3544 (``2wg-bulk`` 3377-3419 in that call).
"""
from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipelines import paged_kv  # noqa: E402,F401  (first: it pins the DSL's target arch)

import cuda.bindings.driver as cuda  # noqa: E402
import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
import cutlass.utils.hopper_helpers as sm90  # noqa: E402
from cutlass import Float32, Int32, const_expr  # noqa: E402
from cutlass.cute.nvgpu import warpgroup  # noqa: E402
from cutlass._mlir.dialects import llvm  # noqa: E402

from pipelines import layouts, softmax  # noqa: E402

BF16 = cutlass.BFloat16
SCHEDULES = ("2wg", "2wg-bulk", "2wg-bulk2", "2wg-bulk2-hbm", "2wg-rope", "2wg-bulk-rope", "3role", "3role-ss",
             "2wg-ksplit", "2wg-ksplit-bulk", "2wg-defer", "2wg-defer-bulk")
BULK_BYTES = 9 * 8192  # one 64-token K tile of 576 bf16 columns
STREAM_TILES = 64  # ``-hbm``: K-like tiles each CTA streams through (132 x 64 x 72 KB = 608 MB, far past L2)


def bulk_offset_words(threads: int) -> int:
    """fp32 words of the kernel's buffer before the bulk copies' source: per-thread results, the CTAs' stamps."""
    return 132 * threads + 132 * 4


def out_words(schedule: str, threads: int) -> int:
    """fp32 words of the kernel's buffer: per-thread results, the CTAs' stamps, then the bulk copies' source
    (one tile of zeros, or with ``-hbm`` every CTA's stream of tiles)."""
    tiles = 132 * STREAM_TILES if "hbm" in schedule else 1
    return bulk_offset_words(threads) + tiles * BULK_BYTES // 4
BAR_P_FULL = 1
BAR_P_EMPTY = 2
BAR_S_FULL = 3  # ksplit: WG1's partial scores in shared memory
BAR_S_EMPTY = 4  # ksplit: WG0 has read them
BAR_QK_DONE = 5  # defer: WG0's QK of the next tile has retired
# 3role: registers per thread after setmaxnreg (score, P.V, P.V): 384 threads at one CTA per SM start at 168,
# a pool of 128 x 504.
REGS_3ROLE = (184, 160, 160)
TILE_MACS = 64 * 64 * 576 + 64 * 512 * 64  # QK + both P.V halves of one 64-token tile


class ScheduleSim:
    def __init__(self, schedule: str):
        self.schedule = schedule
        self.wgs = 2 if schedule.startswith("2wg") else 3
        self.threads = 128 * self.wgs

    def mma(self, n: int, rs: bool):
        src = warpgroup.OperandSource.RMEM if rs else warpgroup.OperandSource.SMEM
        return sm90.make_trivial_tiled_mma(BF16, BF16, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
                                           Float32, (1, 1, 1), (64, n), src)

    @cute.jit
    def __call__(self, out: cute.Tensor, iters: Int32, stream: cuda.CUstream):
        sQ_layout = layouts.smem_tile_layout(BF16, 64, 576)
        sK_layout = layouts.smem_tile_layout(BF16, 64, 576)
        sP_layout = layouts.smem_tile_layout(BF16, 64, 64)
        sV_layout = layouts.smem_tile_layout(BF16, 256, 64)

        @cute.struct
        class Storage:
            q: cute.struct.Align[cute.struct.MemRange[BF16, cute.cosize(sQ_layout)], 1024]
            k: cute.struct.Align[cute.struct.MemRange[BF16, cute.cosize(sK_layout)], 1024]
            p: cute.struct.Align[cute.struct.MemRange[BF16, cute.cosize(sP_layout)], 1024]
            v: cute.struct.Align[cute.struct.MemRange[BF16, cute.cosize(sV_layout)], 1024]
            scale: cute.struct.Align[cute.struct.MemRange[Float32, 64], 16]
            x: cute.struct.Align[cute.struct.MemRange[Float32, 64 * 64], 16]  # ksplit's partial scores
            bulk_bar: cute.struct.Align[cute.struct.MemRange[cutlass.Int64, 2], 8]

        self.storage = Storage
        self.kernel(out, iters, sQ_layout, sK_layout, sP_layout, sV_layout).launch(
            grid=[132, 1, 1], block=[self.threads, 1, 1], smem=Storage.size_in_bytes(), stream=stream,
            min_blocks_per_mp=1)  # launch bounds: ptxas then honours setmaxnreg (else it drops it)

    @cute.kernel
    def kernel(self, out: cute.Tensor, iters: Int32, sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout,
               sP_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        storage = cutlass.utils.SmemAllocator().allocate(self.storage)
        sQ = storage.q.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.k.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sP = storage.p.get_tensor(sP_layout.outer, swizzle=sP_layout.inner)
        sV = storage.v.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        s_scale = storage.scale.get_tensor(cute.make_layout(64))
        for t in (sQ, sK, sP, sV):
            flat = cute.make_tensor(t.iterator, cute.make_layout(cute.cosize(t.layout)))
            for i in cutlass.range(tidx, cute.cosize(t.layout), self.threads, unroll=1):
                flat[i] = BF16(0.0)
        bulk_bar = storage.bulk_bar.data_ptr()
        if tidx == 0:
            cute.arch.mbarrier_init(bulk_bar, 1)
            cute.arch.mbarrier_init(bulk_bar + 1, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.fence_view_async_shared()
        cute.arch.sync_threads()
        wg = cute.arch.make_warp_uniform(cute.arch.warp_idx()) // 4  # warpgroup-uniform (setmaxnreg)
        wg_tidx = tidx % 128
        gidx = bidx * self.threads + tidx
        s_x = storage.x.get_tensor(cute.make_layout((128, 32), stride=(1, 128)))
        if const_expr("ksplit" in self.schedule):
            if wg == 0:
                self.score(wg_tidx, sQ, sK, sP, sV, s_scale, iters, out, gidx, 256, False, True, s_x)
            else:
                self.pv_ks(wg_tidx, sQ, sK, sP, sV, s_x, iters, out, gidx, bulk_bar)
        elif const_expr(self.wgs == 2):
            if wg == 0:
                self.score(wg_tidx, sQ, sK, sP, sV, s_scale, iters, out, gidx, 256, False, True)
            else:
                self.pv(wg_tidx, sP, sV, iters, out, gidx, 256, sK, bulk_bar)
        else:
            if wg < 2:
                cute.arch.setmaxregister_decrease(REGS_3ROLE[1])
                self.pv(wg_tidx, sP, sV, iters, out, gidx, 384)
            else:
                cute.arch.setmaxregister_increase(REGS_3ROLE[0])
                self.score(wg_tidx, sQ, sK, sP, sV, s_scale, iters, out, gidx, 384, self.schedule == "3role", False)

    @cute.jit
    def stamp(self, out, slot: int, wg_tidx):
        """%clock64 of the score warpgroup's first thread into ``out``'s stamp area (after the per-thread words)."""
        if wg_tidx == 0:
            bidx, _, _ = cute.arch.block_idx()
            addr = out.iterator.toint() + cutlass.Int64(132 * self.threads * 4) + (cutlass.Int64(bidx) * 2 + slot) * 8
            llvm.inline_asm(None, [addr.ir_value()],
                            "{\n.reg .u64 c;\nmov.u64 c, %clock64;\nst.global.u64 [$0], c;\n}", "l",
                            has_side_effects=True)

    @cute.jit
    def score(self, wg_tidx, sQ, sK, sP, sV, s_scale, iters, out, gidx, bar_threads: cutlass.Constexpr[int],
              q_in_registers: cutlass.Constexpr[bool], with_pv: cutlass.Constexpr[bool], s_x=None):
        """WG0: QK, softmax, P to shared memory (and with ``with_pv`` its own half of P.V from registers).
        ``2wg-ksplit``: only the first 18 k-steps of QK (Q and K columns 0-287), then WG1's partial scores (the
        other 18) added from ``s_x``."""
        mma_qk = self.mma(64, q_in_registers)
        thr_qk = mma_qk.get_slice(wg_tidx)
        tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ))
        if const_expr(q_in_registers):
            # Q's values from shared memory (zeros, but unknown to the compiler: a constant fill would let
            # ptxas feed every step the same zero registers instead of holding 144).
            cute.autovec_copy(thr_qk.partition_A(sQ), tSrQ)
        tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK))
        # ``-rope``: the last 64 columns of Q (RoPE, the QK's last 4 k-steps) in registers (16 per thread), read
        # once: those steps then read only K from shared memory.
        rope = const_expr("rope" in self.schedule)
        mma_rope = self.mma(64, True)
        thr_rope = mma_rope.get_slice(wg_tidx)
        sQr = cute.local_tile(sQ, (64, 64), (0, 8))
        tRrQ = thr_rope.make_fragment_A(thr_rope.partition_A(sQr))
        tRrK = thr_rope.make_fragment_B(thr_rope.partition_B(cute.local_tile(sK, (64, 64), (0, 8))))
        if const_expr(rope):
            cute.autovec_copy(thr_rope.partition_A(sQr), tRrQ)
        tPsP = thr_qk.partition_C(sP)
        tScS = layouts.acc_mn_view(thr_qk.partition_C(cute.make_identity_tensor((64, 64))))
        n_rows = cute.size(tScS, mode=[0])
        row_max = cute.make_rmem_tensor(n_rows, Float32)
        row_sum = cute.make_rmem_tensor(n_rows, Float32)
        row_scale = cute.make_rmem_tensor(n_rows, Float32)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)
        mma_pv = self.mma(256, True)
        thr_pv = mma_pv.get_slice(wg_tidx)
        tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(sV))
        acc_o = cute.make_rmem_tensor(thr_pv.partition_shape_C((64, 256)), Float32)
        if const_expr(with_pv):
            acc_o.fill(0.0)
        scale_log2 = Float32(0.0625)
        defer = const_expr("defer" in self.schedule)
        ksplit = const_expr("ksplit" in self.schedule)
        qk_steps = cute.size(tSrQ, mode=[2]) // 2 if ksplit else cute.size(tSrQ, mode=[2]) - (4 if rope else 0)
        if const_expr(ksplit):
            cute.arch.barrier_arrive(barrier_id=BAR_S_EMPTY, number_of_threads=bar_threads)  # the exchange starts free
        self.stamp(out, 0, wg_tidx)
        for t in cutlass.range(iters, unroll=1):
            acc_s = cute.make_rmem_tensor(thr_qk.partition_shape_C((64, 64)), Float32)
            warpgroup.fence()
            for k in cutlass.range_constexpr(qk_steps):
                mma_qk.set(warpgroup.Field.ACCUMULATE, k != 0)
                cute.gemm(mma_qk, acc_s, tSrQ[None, None, k], tSrK[None, None, k], acc_s)
            if const_expr(rope):
                for k in cutlass.range_constexpr(4):
                    mma_rope.set(warpgroup.Field.ACCUMULATE, True)
                    cute.gemm(mma_rope, acc_s, tRrQ[None, None, k], tRrK[None, None, k], acc_s)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            if const_expr(defer):
                if t > 0:  # WG1 may now run its P.V of the tile before, beside this softmax
                    cute.arch.barrier_arrive(barrier_id=BAR_QK_DONE, number_of_threads=bar_threads)
            if const_expr(ksplit):
                cute.arch.barrier(barrier_id=BAR_S_FULL, number_of_threads=bar_threads)
                for j in cutlass.range_constexpr(cute.size(acc_s)):
                    acc_s[j] = acc_s[j] + s_x[wg_tidx, j]
                cute.arch.barrier_arrive(barrier_id=BAR_S_EMPTY, number_of_threads=bar_threads)
            softmax.online_softmax_step(layouts.acc_mn_view(acc_s), row_max, row_sum, row_scale, scale_log2)
            rP = cute.make_rmem_tensor_like(acc_s, BF16)
            rP.store(acc_s.load().to(BF16))
            cute.arch.barrier(barrier_id=BAR_P_EMPTY, number_of_threads=bar_threads)
            cute.autovec_copy(rP, tPsP)
            if wg_tidx % 4 == 0:
                for i in cutlass.range_constexpr(n_rows):
                    s_scale[tScS[i, 0][0]] = row_scale[i]
            if const_expr(with_pv):
                softmax.rescale_rows_if_needed(layouts.acc_mn_view(acc_o), row_scale)
                tOrP = layouts.acc_as_a_operand(rP)
                warpgroup.fence()
                for k in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
                    mma_pv.set(warpgroup.Field.ACCUMULATE, True)
                    cute.gemm(mma_pv, acc_o, tOrP[None, None, k], tOrV[None, None, k], acc_o)
                warpgroup.commit_group()
            cute.arch.fence_view_async_shared()
            cute.arch.barrier_arrive(barrier_id=BAR_P_FULL, number_of_threads=bar_threads)
            if const_expr(with_pv):
                warpgroup.wait_group(0)
        self.stamp(out, 1, wg_tidx)
        cute.arch.barrier(barrier_id=BAR_P_EMPTY, number_of_threads=bar_threads)  # the last P.V's arrival
        if const_expr(ksplit):
            cute.arch.barrier(barrier_id=BAR_S_FULL, number_of_threads=bar_threads)  # WG1's extra partial (unused)
        res = row_sum[0]
        if const_expr(with_pv):
            res += acc_o[0]
        out[gidx] = res

    @cute.jit
    def bulk_tile(self, sK, src, bar):
        """One K tile's async bulk copies (9 x 8 KB from ``src``) into the K-like tile, on barrier ``bar`` (armed
        here for their bytes)."""
        cute.arch.mbarrier_arrive_and_expect_tx(bar, BULK_BYTES)
        dst = sK.iterator.toint()
        for c in cutlass.range_constexpr(BULK_BYTES // 8192):
            llvm.inline_asm(None, [(dst + c * 8192).ir_value(), (src + c * 8192).ir_value(), bar.toint().ir_value()],
                            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                            "[$0], [$1], 8192, [$2];", "r,l,r", has_side_effects=True)

    def bulk_source(self, out):
        """Where ``-bulk`` copies read from: ``out`` past the results and the stamps (``bulk_offset_words``)."""
        return out.iterator.toint() + cutlass.Int64(bulk_offset_words(self.threads) * 4)

    @cute.jit
    def pv_half(self, wg_tidx, sP, sV):
        """A P.V warpgroup's MMA (P from shared memory), its operand fragments and its zeroed 64x256 accumulator."""
        mma_pv = self.mma(256, False)
        thr_pv = mma_pv.get_slice(wg_tidx)
        tOrP = thr_pv.make_fragment_A(thr_pv.partition_A(sP))
        tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(sV))
        acc_o = cute.make_rmem_tensor(thr_pv.partition_shape_C((64, 256)), Float32)
        acc_o.fill(0.0)
        return mma_pv, tOrP, tOrV, acc_o

    @cute.jit
    def pv(self, wg_tidx, sP, sV, iters, out, gidx, bar_threads: cutlass.Constexpr[int], sK=None, bulk_bar=None):
        """A P.V warpgroup: its half of P.V with P from shared memory, per WG0's hand-off. ``2wg-bulk*``: its
        first thread also keeps a K tile's worth of async bulk copies landing in the K-like tile, one round
        per tile, issued behind its P.V (as 2wg's producer warp refills a stage): ``-bulk`` waits for the round
        before before it issues the next (one round in flight), ``-bulk2`` for the one two rounds back (two in
        flight, on two barriers); the source is one L2-resident tile, or with ``-hbm`` a stream of tiles
        per CTA far larger than L2 (as the decode's K pages)."""
        bulk = const_expr("bulk" in self.schedule)
        two = const_expr("bulk2" in self.schedule)
        hbm = const_expr("hbm" in self.schedule)
        phase = Int32(0)
        bidx, _, _ = cute.arch.block_idx()
        src0 = self.bulk_source(out)
        mma_pv, tOrP, tOrV, acc_o = self.pv_half(wg_tidx, sP, sV)
        cute.arch.barrier_arrive(barrier_id=BAR_P_EMPTY, number_of_threads=bar_threads)  # P starts free
        for it in cutlass.range(iters, unroll=1):
            cute.arch.barrier(barrier_id=BAR_P_FULL, number_of_threads=bar_threads)
            if const_expr("defer" in self.schedule):
                if it < iters - 1:  # ``-defer``: this P.V beside WG0's softmax of the next tile, not its QK
                    cute.arch.barrier(barrier_id=BAR_QK_DONE, number_of_threads=bar_threads)
            warpgroup.fence()
            for k in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
                mma_pv.set(warpgroup.Field.ACCUMULATE, True)
                cute.gemm(mma_pv, acc_o, tOrP[None, None, k], tOrV[None, None, k], acc_o)
            warpgroup.commit_group()
            if const_expr(bulk):
                if wg_tidx == 0:
                    bar = bulk_bar
                    if const_expr(two):
                        bar = bulk_bar + (it & 1)
                        if it > 1:
                            cute.arch.mbarrier_wait(bar, ((it >> 1) + 1) & 1)  # round it - 2 has landed
                    else:
                        if it > 0:
                            cute.arch.mbarrier_wait(bar, phase ^ 1)  # the previous round has landed
                    src = src0
                    if const_expr(hbm):
                        src = src0 + cutlass.Int64(bidx * STREAM_TILES + it % STREAM_TILES) * BULK_BYTES
                    self.bulk_tile(sK, src, bar)
                phase = phase ^ 1
            warpgroup.wait_group(0)
            cute.arch.barrier_arrive(barrier_id=BAR_P_EMPTY, number_of_threads=bar_threads)
        if const_expr(bulk):
            if wg_tidx == 0:  # nothing in flight at exit
                if const_expr(two):
                    for b in cutlass.range_constexpr(2):
                        uses = (iters - b + 1) >> 1
                        if uses > 0:
                            cute.arch.mbarrier_wait(bulk_bar + b, (uses - 1) & 1)
                else:
                    cute.arch.mbarrier_wait(bulk_bar, phase ^ 1)
        out[gidx] = acc_o[0]


    @cute.jit
    def pv_ks(self, wg_tidx, sQ, sK, sP, sV, s_x, iters, out, gidx, bulk_bar):
        """``2wg-ksplit`` WG1: the last 18 k-steps of QK into shared memory for WG0, and its half of P.V with P
        from shared memory; the next tile's partial QK goes out right behind that P.V (``-bulk``: and a K
        tile's bulk copies, one round in flight, as ``pv``)."""
        bulk = const_expr("bulk" in self.schedule)
        phase = Int32(0)
        src0 = self.bulk_source(out)
        mma_qk = self.mma(64, False)
        thr_qk = mma_qk.get_slice(wg_tidx)
        tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ))
        tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK))
        half = cute.size(tSrQ, mode=[2]) // 2
        mma_pv, tOrP, tOrV, acc_o = self.pv_half(wg_tidx, sP, sV)
        cute.arch.barrier_arrive(barrier_id=BAR_P_EMPTY, number_of_threads=256)  # P starts free
        for it in cutlass.range(iters + 1, unroll=1):
            # The partial scores of tile ``it`` (one past the last: WG0 waits for it at its end, unused).
            acc_s = cute.make_rmem_tensor(thr_qk.partition_shape_C((64, 64)), Float32)
            warpgroup.fence()
            for k in cutlass.range_constexpr(half):
                mma_qk.set(warpgroup.Field.ACCUMULATE, k != 0)
                cute.gemm(mma_qk, acc_s, tSrQ[None, None, half + k], tSrK[None, None, half + k], acc_s)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            cute.arch.barrier(barrier_id=BAR_S_EMPTY, number_of_threads=256)
            for j in cutlass.range_constexpr(cute.size(acc_s)):
                s_x[wg_tidx, j] = acc_s[j]
            cute.arch.barrier_arrive(barrier_id=BAR_S_FULL, number_of_threads=256)
            if it < iters:
                cute.arch.barrier(barrier_id=BAR_P_FULL, number_of_threads=256)
                warpgroup.fence()
                for k in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
                    mma_pv.set(warpgroup.Field.ACCUMULATE, True)
                    cute.gemm(mma_pv, acc_o, tOrP[None, None, k], tOrV[None, None, k], acc_o)
                warpgroup.commit_group()
                # Waited here: a P.V still in flight across the loop's back edge made ptxas serialize every wgmma.
                warpgroup.wait_group(0)
                cute.arch.barrier_arrive(barrier_id=BAR_P_EMPTY, number_of_threads=256)
                if const_expr(bulk):
                    if wg_tidx == 0:
                        if it > 0:
                            cute.arch.mbarrier_wait(bulk_bar, phase ^ 1)
                        self.bulk_tile(sK, src0, bulk_bar)
                    phase = phase ^ 1
        if const_expr(bulk):
            if wg_tidx == 0:
                cute.arch.mbarrier_wait(bulk_bar, phase ^ 1)
        out[gidx] = acc_o[0]


def compile_schedule(schedule: str, sass_dir: str | None = None):
    """The schedule's kernel (TVM-FFI, like the library's entries); with ``sass_dir`` its cubin kept there."""
    from cutlass.cute.runtime import make_fake_tensor

    from pipelines.launch import TVM_FFI_OPTION
    sim = ScheduleSim(schedule)
    fake = make_fake_tensor(Float32, (cute.sym_int32(),), (1,), assumed_align=16)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    opts = TVM_FFI_OPTION + (f" --gpu-arch sm_90a --keep-cubin --dump-dir {sass_dir}" if sass_dir else "")
    return sim, cute.compile(sim, fake, Int32(1), stream, options=opts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--schedule", action="append", choices=SCHEDULES)
    ap.add_argument("--sass", help="write each schedule's SASS (and its register count) into this folder; no run")
    args = ap.parse_args(argv)
    schedules = args.schedule or list(SCHEDULES)
    if args.sass:
        from mla import compile_check as cc
        for s in schedules:
            d = pathlib.Path(args.sass) / s
            d.mkdir(parents=True, exist_ok=True)
            _, fn = compile_schedule(s, str(d))
            sass = cc.disassemble(cc.find_nvdisasm(), fn.artifacts.CUBIN, str(d))
            (d / "kernel.sass").write_text(sass)
            print(s, "LDL/STL:", sass.count("LDL"), sass.count("STL"), "HGMMA:", sass.count("HGMMA"),
                  "WARPGROUP.DEPBAR:", sass.count("WARPGROUP.DEPBAR"), "USETMAXREG:", sass.count("USETMAXREG"))
        return 0
    import torch
    for s in schedules:
        sim, fn = compile_schedule(s)
        out = torch.zeros(out_words(s, sim.threads), dtype=torch.float32, device="cuda")
        fn(out, 10)
        torch.cuda.synchronize()
        rows = []
        for _ in range(3):
            fn(out, args.iters)
            torch.cuda.synchronize()
            st = out[132 * sim.threads:132 * sim.threads + 132 * 4].view(torch.int64).view(132, 2)
            cyc = ((st[:, 1] - st[:, 0]).double() / args.iters).median().item()
            rows.append(cyc)
        best = min(rows)
        print(f"{s:9s} cycles per tile (3 runs, median CTA): {', '.join(f'{c:.0f}' for c in rows)}; "
              f"tensor work at peak / period {TILE_MACS / 2048 / best:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
