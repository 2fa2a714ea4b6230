"""Tensor-core rate of the decode kernels' wgmma shapes, alone and side by side (issue 8's profile).

    python scripts/wgmma_rate.py [--iters 4000] [--case qk-ss ...]

One CTA per SM (132) loops ``--iters`` times over a committed wgmma group and its wait, on operands
that stay in shared memory (zeros; the tensor cores' speed does not depend on the values):
- ``qk``: the score product, 36 k-steps of m64n64k16 (A: a 64 x 576 Q-like tile, B: a 64 x 576 K-like
  tile), SS, or RS with A from registers (``-rs``);
- ``qk32``: ``qk`` on 32 keys (m64n32k16, B: a 32 x 576 tile in the K-like tile's storage): the score product of a
  design that splits each 64-token tile's keys between two warpgroups (``qk32-ss+qk32-ss``);
- ``pv``: one half of P.V, 4 k-steps of m64n256k16 (A: 64 x 64 P-like, B: 256 x 64), SS;
- ``qkf``: ``qk`` with a ``wgmma.fence`` before every 4 k-steps (one 64-column box of K): what a QK chain
  that waits on a barrier per K box (a seesaw's per-box stages) must issue after each wait;
- ``qkb``: ``qkf`` with an mbarrier wait (on a barrier whose phase has completed, so it returns at once)
  before each of those fences: the whole per-box sequence but the load;
- ``pvqk``: one ``pv`` (P from registers with ``-rs``, as 2wg's WG0) then one ``qk`` (SS) per iteration, the
  QK issued right behind the P.V as a second commit group and both waited for together (``qk_ahead``'s order);
  ``pvwqk``: the same with the P.V waited for before the QK is issued (the committed kernel's order);
  ``pvwqk32``: ``pvwqk`` with ``qk32``: the tensor work of one warpgroup's tile in the key-split design, no softmax;
- ``alu``: no wgmma: a softmax-like pass per iteration over 32 fp32 registers per thread (scale, max tree,
  exp2, row sum, as WG0's softmax of a 64x64 tile), to time beside another warpgroup's wgmma on the same SM
  sub-partitions (``alu-ss+pv-ss``: WG1 loops over P.V twice as many times as WG0's passes, so every pass
  runs beside it). Printed for it: SM cycles per pass (median CTA), from WG0's own stamps;
- ``falu``: ``alu`` on the FMA pipe alone: no shuffles, and a cubic in FFMA where ``alu`` has ``MUFU.EX2``
  (the values are not an exponential; only the instruction mix matters): whether what slows ``alu`` beside
  a wgmma is its MUFU and shuffle instructions (which go through the SM's MIO queue with shared-memory
  traffic) or every instruction;
- ``bulk``: no wgmma: the warpgroup's thread 0 keeps the async copy engine writing into shared memory, 64 KB
  per round (8 ``cp.async.bulk`` copies of 8 KB from global memory, L2-resident, into the Q-like tile, then
  an mbarrier wait), twice as many rounds as ``alu``'s passes: what a TMA K refill landing beside the
  softmax does to it (``alu-ss+bulk-ss``);
- ``lds``: no wgmma: 16-byte shared-memory loads in a loop (a warpgroup that keeps the shared-memory pipe
  busy without the tensor cores), to time ``alu`` beside (``alu-ss+lds-ss``).
A case names what each warpgroup of the CTA runs, e.g. ``qk-ss`` (one warpgroup), ``qk-ss+qk-ss`` (two,
same operands, each its own accumulator), ``qk-ss+pv-ss`` (the 2wg overlap a seesaw form wants).
Printed per case: the tensor work per SM per microsecond and as a fraction of the dense bf16 peak
(2048 multiply-adds per clock and SM) at the SM clock nvidia-smi reports (its maximum) and at the clock
the kernel actually ran at (``%clock64`` over ``%globaltimer`` across each CTA's loop, median of the CTAs). So it tells whether the
64x64x16 score steps alone reach the peak, and how much two warpgroups issuing at once gain.
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
from cutlass.cute.runtime import make_fake_tensor  # noqa: E402
from cutlass._mlir.dialects import llvm  # noqa: E402

from pipelines import layouts  # noqa: E402
from pipelines.launch import TVM_FFI_OPTION  # noqa: E402

BF16 = cutlass.BFloat16
SHAPES = {"qk": (64, 576), "qkf": (64, 576), "qkb": (64, 576), "qk32": (32, 576), "pv": (256, 64)}  # (N, K); M is 64
CHAINS = {"pvqk": ("pv", "qk"), "pvwqk": ("pv", "qk"), "pvwqk32": ("pv", "qk32")}  # two products per iteration, in order


def macs(kind: str) -> int:
    if kind in ("alu", "falu", "lds", "bulk"):
        return 0
    if kind in CHAINS:
        return sum(macs(k) for k in CHAINS[kind])
    n, k = SHAPES[kind]
    return 64 * n * k


class WgmmaRate:
    def __init__(self, roles):
        self.roles = tuple(roles)  # per warpgroup: (kind, register A)

    def tiled_mma(self, kind: str, rs: bool):
        n, _ = SHAPES[kind]
        src = warpgroup.OperandSource.RMEM if rs else warpgroup.OperandSource.SMEM
        return sm90.make_trivial_tiled_mma(BF16, BF16, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
                                           Float32, (1, 1, 1), (64, n), src)

    @cute.jit
    def __call__(self, out: cute.Tensor, iters: Int32, stream: cuda.CUstream):
        sA_layout = layouts.smem_tile_layout(BF16, 64, 576)
        sB_layout = layouts.smem_tile_layout(BF16, 64, 576)
        sPA_layout = layouts.smem_tile_layout(BF16, 64, 64)
        sPB_layout = layouts.smem_tile_layout(BF16, 256, 64)
        sB32_layout = layouts.smem_tile_layout(BF16, 32, 576)

        @cute.struct
        class Storage:
            a: cute.struct.Align[cute.struct.MemRange[BF16, cute.cosize(sA_layout)], 1024]
            b: cute.struct.Align[cute.struct.MemRange[BF16, cute.cosize(sB_layout)], 1024]
            pa: cute.struct.Align[cute.struct.MemRange[BF16, cute.cosize(sPA_layout)], 1024]
            pb: cute.struct.Align[cute.struct.MemRange[BF16, cute.cosize(sPB_layout)], 1024]
            bar: cute.struct.Align[cute.struct.MemRange[cutlass.Int64, 1], 8]
            bulk_bar: cute.struct.Align[cute.struct.MemRange[cutlass.Int64, 1], 8]

        self.storage = Storage
        self.kernel(out, iters, sA_layout, sB_layout, sPA_layout, sPB_layout, sB32_layout).launch(
            grid=[132, 1, 1], block=[128 * len(self.roles), 1, 1], smem=Storage.size_in_bytes(), stream=stream)

    @cute.kernel
    def kernel(self, out: cute.Tensor, iters: Int32, sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout,
               sPA_layout: cute.ComposedLayout, sPB_layout: cute.ComposedLayout, sB32_layout: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        storage = cutlass.utils.SmemAllocator().allocate(self.storage)
        views = {
            "qk": (storage.a.get_tensor(sA_layout.outer, swizzle=sA_layout.inner),
                   storage.b.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)),
            "pv": (storage.pa.get_tensor(sPA_layout.outer, swizzle=sPA_layout.inner),
                   storage.pb.get_tensor(sPB_layout.outer, swizzle=sPB_layout.inner)),
        }
        views["qkf"] = views["qkb"] = views["qk"]  # the same product, with per-box fences / waits
        # a 32 x 576 tile laid out in the K-like tile's storage (same swizzle and descriptor strides; the values are zeros)
        views["qk32"] = (views["qk"][0], storage.b.get_tensor(sB32_layout.outer, swizzle=sB32_layout.inner))
        nthreads = 128 * len(self.roles)
        for name in ("qk", "pv"):
            for t in views[name]:
                flat = cute.make_tensor(t.iterator, cute.make_layout(cute.cosize(t.layout)))
                for i in cutlass.range(tidx, cute.cosize(t.layout), nthreads, unroll=1):
                    flat[i] = BF16(0.0)
        bar = storage.bar.data_ptr()
        bulk_bar = storage.bulk_bar.data_ptr()
        if tidx == 0:
            cute.arch.mbarrier_init(bar, 1)
            cute.arch.mbarrier_init(bulk_bar, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        if tidx == 0:
            cute.arch.mbarrier_arrive(bar)  # phase 0 completes: every wait on it returns at once
        cute.arch.fence_view_async_shared()
        cute.arch.sync_threads()
        wg = cute.arch.make_warp_uniform(tidx // 128)
        with_alu = any(kind in ("alu", "falu") for kind, _ in self.roles)
        for w in cutlass.range_constexpr(len(self.roles)):
            if wg == w:
                n = iters * 2 if const_expr(with_alu and self.roles[w][0] not in ("alu", "falu")) else iters
                self.run_role(self.roles[w], views, bar, bulk_bar, tidx % 128, n, out, bidx * nthreads + tidx)

    @cute.jit
    def stamp(self, out, slot: int, gidx):
        """%globaltimer and %clock64 of this CTA into ``out``'s stamp area (after the per-thread words), by
        the CTA's thread 0 (the first role's; ``gidx``: the caller's global thread index)."""
        if gidx % (128 * len(self.roles)) == 0:
            bidx, _, _ = cute.arch.block_idx()
            addr = out.iterator.toint() + cutlass.Int64(132 * 128 * len(self.roles) * 4) \
                + (cutlass.Int64(bidx) * 4 + slot * 2) * 8
            llvm.inline_asm(None, [addr.ir_value()],
                            "{\n.reg .u64 t, c;\nmov.u64 t, %globaltimer;\nmov.u64 c, %clock64;\n"
                            "st.global.u64 [$0], t;\nst.global.u64 [$0+8], c;\n}", "l", has_side_effects=True)

    @cute.jit
    def run_role(self, role, views, bar, bulk_bar, wg_tidx, iters, out, gidx):
        kind, rs = role
        if const_expr(kind == "bulk"):
            self.run_bulk(views, bulk_bar, wg_tidx, iters, out)
        elif const_expr(kind in CHAINS):
            self.run_chain(role, views, bar, wg_tidx, iters, out, gidx)
        elif const_expr(kind in ("alu", "falu")):
            self.run_alu(wg_tidx, iters, out, gidx, kind == "alu")
        elif const_expr(kind == "lds"):
            self.run_lds(views, wg_tidx, iters, out, gidx)
        else:
            self.run_one(role, views, bar, wg_tidx, iters, out, gidx)

    @cute.jit
    def operands(self, kind: str, rs: bool, views, wg_tidx):
        """``(mma, tA, tB, acc)`` of product ``kind`` for this warpgroup thread: A from shared memory or, with
        ``rs``, from registers (zeros), B from shared memory, the accumulator zeroed."""
        sA, sB = views[kind]
        mma = self.tiled_mma(kind, rs)
        thr = mma.get_slice(wg_tidx)
        tB = thr.make_fragment_B(thr.partition_B(sB))
        n, _ = SHAPES[kind]
        acc = cute.make_rmem_tensor(thr.partition_shape_C((64, n)), Float32)
        acc.fill(0.0)
        tA = thr.make_fragment_A(thr.partition_A(sA))
        if const_expr(rs):
            tA.fill(0.0)
        return mma, tA, tB, acc

    @cute.jit
    def issue(self, kind: str, mma, tA, tB, acc, bar, fence: cutlass.Constexpr[bool] = True):
        """One product as one commit group (not waited for), after a ``wgmma.fence`` unless ``fence`` is
        False (a group issued right behind another with no wait between); ``qkf`` / ``qkb`` with their
        per-box fences and waits (module docstring)."""
        if const_expr(fence):
            warpgroup.fence()
        for k in cutlass.range_constexpr(cute.size(tA, mode=[2])):
            if const_expr(kind in ("qkf", "qkb") and k > 0 and k % 4 == 0):
                if const_expr(kind == "qkb"):
                    cute.arch.mbarrier_wait(bar, 0)
                warpgroup.fence()
            mma.set(warpgroup.Field.ACCUMULATE, True)
            cute.gemm(mma, acc, tA[None, None, k], tB[None, None, k], acc)
        warpgroup.commit_group()

    @cute.jit
    def run_chain(self, role, views, bar, wg_tidx, iters, out, gidx):
        """``pvqk`` / ``pvwqk`` / ``pvwqk32``: P.V (A from registers with ``rs``) then QK (SS; 32 keys for
        ``pvwqk32``) per iteration, as two commit groups, with (``pvwqk``, ``pvwqk32``) or without (``pvqk``) a
        wait for the P.V before the QK's issue."""
        kind, rs = role
        pv_mma, tPA, tPB, acc_o = self.operands("pv", rs, views, wg_tidx)
        qk_kind = CHAINS[kind][1]
        qk_mma, tA, tB, acc_s = self.operands(qk_kind, False, views, wg_tidx)
        self.stamp(out, 0, gidx)
        for _ in cutlass.range(iters, unroll=1):
            self.issue("pv", pv_mma, tPA, tPB, acc_o, bar)
            if const_expr(kind != "pvqk"):
                warpgroup.wait_group(0)
            self.issue(qk_kind, qk_mma, tA, tB, acc_s, bar, fence=kind != "pvqk")
            warpgroup.wait_group(0)
        self.stamp(out, 1, gidx)
        out[gidx] = acc_o[0] + acc_s[0]

    @cute.jit
    def run_alu(self, wg_tidx, iters, out, gidx, mio: cutlass.Constexpr[bool]):
        """``alu`` (``mio``) / ``falu``: ``iters`` softmax-like passes over 32 fp32 registers (module docstring)."""
        x = cute.make_rmem_tensor(32, Float32)
        for i in cutlass.range_constexpr(32):
            x[i] = Float32(wg_tidx * 0.001 + i * 0.01)
        total = Float32(0.0)
        self.stamp(out, 0, gidx)
        for it in cutlass.range(iters, unroll=1):
            m = Float32(-1e30)
            for i in cutlass.range_constexpr(32):
                x[i] = x[i] * Float32(1.0001) + Float32(0.0001)
                m = cute.arch.fmax(m, x[i])
            if const_expr(mio):
                m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, offset=1))
                m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, offset=2))
            for i in cutlass.range_constexpr(32):
                d = x[i] - m
                e = Float32(0.0)
                if const_expr(mio):
                    e = cute.math.exp2(d, fastmath=True)
                else:
                    e = d * (d * (d * Float32(0.077) + Float32(0.228)) + Float32(0.695)) + Float32(1.0)
                total += e
                x[i] = x[i] - e * Float32(0.001)
        self.stamp(out, 1, gidx)
        out[gidx] = total

    @cute.jit
    def run_bulk(self, views, bulk_bar, wg_tidx, iters, out):
        """``bulk``: ``iters`` rounds of 64 KB of async bulk copies into shared memory (module docstring)."""
        sA, _ = views["qk"]
        bidx, _, _ = cute.arch.block_idx()
        dst = sA.iterator.toint()
        src = out.iterator.toint() + cutlass.Int64(bidx % 3) * 65536
        phase = cutlass.Int32(0)
        for _ in cutlass.range(iters, unroll=1):
            if wg_tidx == 0:
                cute.arch.mbarrier_arrive_and_expect_tx(bulk_bar, 65536)
                for c in cutlass.range_constexpr(8):
                    llvm.inline_asm(None, [(dst + c * 8192).ir_value(), (src + c * 8192).ir_value(),
                                           bulk_bar.toint().ir_value()],
                                    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], 8192, [$2];",
                                    "r,l,r", has_side_effects=True)
                cute.arch.mbarrier_wait(bulk_bar, phase)
            phase = phase ^ 1

    @cute.jit
    def run_lds(self, views, wg_tidx, iters, out, gidx):
        """``lds``: per iteration, 64 loads of 16 bytes per thread from the Q-like tile (module docstring)."""
        sA, _ = views["qk"]
        flat = cute.make_tensor(cute.recast_ptr(sA.iterator, dtype=cutlass.Int32), cute.make_layout(64 * 576 // 2))
        acc = cutlass.Int32(0)
        for it in cutlass.range(iters * 8, unroll=1):
            for j in cutlass.range_constexpr(16):
                v = cute.make_rmem_tensor(4, cutlass.Int32)
                offset = cute.assume((wg_tidx * 4 + j * 512 + it * 4) % 18432, divby=4)
                src = cute.make_tensor(flat.iterator + offset, cute.make_layout(4))
                cute.autovec_copy(src, v)
                acc = acc ^ v[0] ^ v[1] ^ v[2] ^ v[3]
        out[gidx] = Float32(acc)

    @cute.jit
    def run_one(self, role, views, bar, wg_tidx, iters, out, gidx):
        kind, rs = role
        mma, tA, tB, acc = self.operands(kind, rs, views, wg_tidx)
        self.stamp(out, 0, gidx)
        for _ in cutlass.range(iters, unroll=1):
            self.issue(kind, mma, tA, tB, acc, bar)
            warpgroup.wait_group(0)
        self.stamp(out, 1, gidx)
        out[gidx] = acc[0]


def parse_case(case: str):
    roles = []
    for part in case.split("+"):
        kind, src = part.split("-")
        roles.append((kind, src == "rs"))
    return roles


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=4000)
    ap.add_argument("--case", action="append", default=[])
    args = ap.parse_args(argv)
    cases = args.case or ["qk-ss", "qk-rs", "pv-ss", "qk-ss+qk-ss", "qk-rs+qk-rs", "pv-ss+pv-ss", "qk-ss+pv-ss",
                          "qk-rs+pv-ss"]

    import subprocess

    import torch

    clock = subprocess.run(["nvidia-smi", "--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True).stdout.split()
    mhz = float(clock[0]) if clock else 1980.0
    peak = 2048 * mhz  # multiply-adds per SM per microsecond
    print(f"{torch.cuda.get_device_name(0)}, SM clock {mhz:.0f} MHz: peak {peak / 1e3:.0f}K MAC/us per SM")
    for case in cases:
        roles = parse_case(case)
        words = 132 * 128 * len(roles)
        # + 4 u64 stamps per CTA, and room for ``bulk``'s reads (three 64 KB windows from the start)
        out = torch.zeros(max(words + 132 * 4 * 2, 3 * 65536 // 4 + 65536 // 4), dtype=torch.float32, device="cuda")
        fake = make_fake_tensor(Float32, (cute.sym_int32(),), (1,), assumed_align=16)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        fn = cute.compile(WgmmaRate(roles), fake, Int32(1), stream, options=TVM_FFI_OPTION)
        fn(out, 10)
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn(out, args.iters)
            e1.record()
            torch.cuda.synchronize()
            times.append(e0.elapsed_time(e1) * 1e3)
        us = sorted(times)[len(times) // 2]
        work = sum(macs(kind) for kind, _ in roles) * args.iters  # per SM
        rate = work / us
        st = out[words:words + 132 * 4 * 2].view(torch.int64).view(132, 2, 2).cpu().double()  # [cta, start/end, ns/clk]
        clk = float(((st[:, 1, 1] - st[:, 0, 1]) / (st[:, 1, 0] - st[:, 0, 0]) * 1e3).median())  # MHz, last call
        per_role = ", ".join(f"{k}-{'rs' if r else 'ss'} {macs(k) * args.iters / us / peak:.2f}" for k, r in roles)
        if roles[0][0] in ("alu", "falu"):
            cyc = float((st[:, 1, 1] - st[:, 0, 1]).median()) / args.iters
            print(f"  {case:<14} WG0 alu pass: {cyc:.0f} SM cycles (median CTA)", flush=True)
            continue
        print(f"  {case:<14} {us:9.1f} us  {rate / 1e3:7.0f}K MAC/us per SM = {rate / peak:.3f} of peak"
              f"  (each role alone at this time: {per_role}); SM clock in the kernel {clk:.0f} MHz: "
              f"{rate / (2048 * clk):.3f} of the peak at that clock", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
