"""WG0's tile loop cut into segments, for 2wg's order and for ``qk_ahead`` (diagnostic, SM cycles).

    python scripts/segment_probe.py [--config 64,128,1,128,4096 ...] [--form base --form ahead ...]
                                    [--replays 50]

Each form is the 64-row kernel with WG0's tile loop (``MLADecode2WG.wg0_tiles`` / ``wg0_tiles_qk_ahead``)
copied here with thread 0 reading ``%clock64`` at the end of every segment and adding the cycles since the
previous reading into a per-CTA sum for that segment (``red.global.add``), with a count; WG1's thread 128
does the same for its own two segments. A segment's mean is its sum over its count, so segments that only
some tiles run (the next QK of ``qk_ahead``: not after a chunk's last tile) are still per-tile means, and
WG0's segments of a tile add up to its period. Each reading costs roughly 100 cycles, added to the segment
it ends. Forms: ``base`` (2wg's order), ``ahead`` (``qk_ahead``: the next QK behind WG1's P.V issue),
``nowait`` (``qk_ahead`` without waiting for WG1's P.V issue).
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipelines import paged_kv  # noqa: E402,F401  (first: it pins the DSL's target arch)

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Float32, const_expr  # noqa: E402
from cutlass._mlir.dialects import llvm  # noqa: E402
from cutlass.cute.nvgpu import warpgroup  # noqa: E402

from pipelines import layouts  # noqa: E402
from pipelines.skeleton import BLOCK_M, BLOCK_N  # noqa: E402
from pipelines import softmax  # noqa: E402
from pipelines.variant_2wg import BAR_PV_ISSUED, BAR_WG0, HALF, MLADecode2WG  # noqa: E402
from probe_setup import cta_row, hook_loader  # noqa: E402

SEGMENTS = ("k wait", "qk issue", "qk run", "softmax + bf16", "P_EMPTY, P stores, rescale", "pv0 issue",
            "fence + P_FULL", "PV_ISSUED wait", "pv0 run (to its retire)", "release + qk run left")
(K_WAIT, QK_ISSUE, QK_RUN, SOFTMAX, STORES, PV0_ISSUE, PUBLISH, PVI_WAIT, PV0_RUN, QK_LEFT) = range(len(SEGMENTS))
PV1_ISSUE, PV1_DONE = len(SEGMENTS), len(SEGMENTS) + 1  # WG1: absolute clocks (sums), every tile
SLOTS = 2 * len(SEGMENTS) + 4
MAX_CTAS = 1024
FORMS = {"base": {}, "ahead": dict(qk_ahead=True), "nowait": dict(qk_ahead=True, qk_ahead_waits_pv=False)}


def _clock():
    return cutlass.Int64(llvm.inline_asm(cutlass.Int64.mlir_type, [], "mov.u64 $0, %clock64;", "=l",
                                         has_side_effects=True))


def _segment(base: int, seg: int, last):
    """Adds ``%clock64 - last`` into this CTA's sum of ``seg`` (and 1 into its count); returns the clock."""
    now = _clock()
    addr = cta_row(base, SLOTS) + seg * 16
    llvm.inline_asm(None, [addr.ir_value(), (now - last).ir_value()],
                    "red.global.add.u64 [$0], $1;\nred.global.add.u64 [$0+8], 1;", "l,l", has_side_effects=True)
    return now


def probe_class(form: str):
    attrs = FORMS[form]

    def make(base: int):
        class Probed(MLADecode2WG):
            # One barrier pair per K stage (``MLADecode2WG.kv_groups``): the loops below are the one-group
            # loops, one K wait and one release per tile.
            kv_groups = 1
            qk_ahead = attrs.get("qk_ahead", False)
            qk_ahead_waits_pv = attrs.get("qk_ahead_waits_pv", True)

            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)

                @cute.jit
                def released():
                    tidx, _, _ = cute.arch.thread_idx()
                    if tidx == 128:  # WG1 releases right after its P.V retired
                        _segment(base, PV1_DONE, cutlass.Int64(0))

                hook_loader(self, release=released)

            @cute.jit
            def issue_pv(self, acc_o, tOrP, tOrV, stage, p_in_registers: cutlass.Constexpr[bool] = False):
                tidx, _, _ = cute.arch.thread_idx()
                if const_expr(not p_in_registers):
                    if tidx == 128:
                        _segment(base, PV1_ISSUE, cutlass.Int64(0))
                super().issue_pv(acc_o, tOrP, tOrV, stage, p_in_registers)

            @cute.jit
            def wg0_softmax_stamped(self, acc_s, blk, seqlen, row_limit, tScS, tPsP, acc_o_mn, row_max, row_sum,
                                    row_scale, s_row_scale, sK, k_state, scale_log2, wg_tidx, last, on):
                self.softmax_tile(acc_s, blk, seqlen, row_limit, tScS, row_max, row_sum, row_scale, scale_log2)
                rP = cute.make_rmem_tensor_like(acc_s, self.dtype)
                rP.store(acc_s.load().to(self.dtype))
                if on:
                    last = _segment(base, SOFTMAX, last)
                self.store_p_for_wg1(rP, tPsP, tScS, row_scale, s_row_scale, wg_tidx)
                softmax.rescale_rows_if_needed(acc_o_mn, row_scale)
                valid = seqlen - blk * BLOCK_N
                if valid < BLOCK_N:
                    self.zero_v_rows(sK, k_state.index, valid, 0, HALF, wg_tidx, BAR_WG0)
                if on:
                    last = _segment(base, STORES, last)
                return rP, last

            @cute.jit
            def stamped_softmax_pv(self, acc_s, blk, seqlen, row_limit, tScS, tPsP, tOrV, acc_o, acc_o_mn, row_max,
                                   row_sum, row_scale, s_row_scale, sK, k_state, scale_log2, wg_tidx, last, on):
                """``MLADecode2WG.wg0_softmax_pv`` with the stamps; returns the last clock."""
                rP, last = self.wg0_softmax_stamped(acc_s, blk, seqlen, row_limit, tScS, tPsP, acc_o_mn, row_max,
                                                    row_sum, row_scale, s_row_scale, sK, k_state, scale_log2,
                                                    wg_tidx, last, on)
                self.issue_pv(acc_o, layouts.acc_as_a_operand(rP), tOrV, k_state.index, p_in_registers=True)
                if on:
                    last = _segment(base, PV0_ISSUE, last)
                self.publish_p()
                if on:
                    last = _segment(base, PUBLISH, last)
                return last

            @cute.jit
            def wg0_tiles(self, wg_tidx, start, stop, seqlen, row_limit, thr_qk, tSrQ, tSrK, tOrV, tPsP, tScS, acc_o,
                          acc_o_mn, row_max, row_sum, row_scale, s_row_scale, sK, pipe_k, k_state, scale_log2):
                on = wg_tidx == 0
                last = _clock()
                for blk in cutlass.range(start, stop, self.split_cluster, unroll=1):
                    self.loader.consumer_wait(pipe_k, k_state)
                    if on:
                        last = _segment(base, K_WAIT, last)
                    acc_s = cute.make_rmem_tensor(thr_qk.partition_shape_C((BLOCK_M, BLOCK_N)), Float32)
                    self.issue_qk(acc_s, tSrQ, tSrK, k_state.index)
                    if on:
                        last = _segment(base, QK_ISSUE, last)
                    warpgroup.wait_group(0)
                    if on:
                        last = _segment(base, QK_RUN, last)
                    last = self.stamped_softmax_pv(acc_s, blk, seqlen, row_limit, tScS, tPsP, tOrV, acc_o, acc_o_mn,
                                                   row_max, row_sum, row_scale, s_row_scale, sK, k_state, scale_log2,
                                                   wg_tidx, last, on)
                    warpgroup.wait_group(0)
                    if on:
                        last = _segment(base, PV0_RUN, last)
                    self.loader.consumer_release(pipe_k, k_state)
                    k_state.advance()
                return k_state

            @cute.jit
            def wg0_tiles_qk_ahead(self, wg_tidx, start, stop, seqlen, row_limit, thr_qk, tSrQ, tSrK, tOrV, tPsP, tScS,
                                   acc_o, acc_o_mn, row_max, row_sum, row_scale, s_row_scale, sK, pipe_k, k_state,
                                   scale_log2):
                # The library's loop (the chunk's last tile peeled off it) with the stamps.
                on = wg_tidx == 0
                acc_s = cute.make_rmem_tensor(thr_qk.partition_shape_C((BLOCK_M, BLOCK_N)), Float32)
                last_blk = stop
                if start < stop:
                    last_blk = start + (stop - 1 - start) // self.split_cluster * self.split_cluster
                    self.loader.consumer_wait(pipe_k, k_state)
                    self.issue_qk(acc_s, tSrQ, tSrK, k_state.index)
                    warpgroup.wait_group(0)
                k_next = k_state.clone()
                k_next.advance()
                last = _clock()
                for blk in cutlass.range(start, last_blk, self.split_cluster, unroll=1):
                    last = self.stamped_softmax_pv(acc_s, blk, seqlen, row_limit, tScS, tPsP, tOrV, acc_o, acc_o_mn,
                                                   row_max, row_sum, row_scale, s_row_scale, sK, k_state, scale_log2,
                                                   wg_tidx, last, on)
                    self.loader.consumer_wait(pipe_k, k_next)
                    if on:
                        last = _segment(base, K_WAIT, last)
                    if const_expr(self.qk_ahead_waits_pv):
                        cute.arch.barrier(barrier_id=BAR_PV_ISSUED, number_of_threads=256)
                    if on:
                        last = _segment(base, PVI_WAIT, last)
                    self.issue_qk(acc_s, tSrQ, tSrK, k_next.index)
                    if on:
                        last = _segment(base, QK_ISSUE, last)
                    warpgroup.wait_group(1)
                    if on:
                        last = _segment(base, PV0_RUN, last)
                    self.loader.consumer_release(pipe_k, k_state)
                    warpgroup.wait_group(0)
                    if on:
                        last = _segment(base, QK_LEFT, last)
                    k_state.advance()
                    k_next.advance()
                if start < stop:
                    last = self.stamped_softmax_pv(acc_s, last_blk, seqlen, row_limit, tScS, tPsP, tOrV, acc_o, acc_o_mn,
                                                    row_max, row_sum, row_scale, s_row_scale, sK, k_state, scale_log2,
                                                    wg_tidx, last, on)
                    warpgroup.wait_group(0)
                    self.loader.consumer_release(pipe_k, k_state)
                    if on:
                        last = _segment(base, PV0_RUN, last)
                    k_state.advance()
                return k_state

        return Probed

    return make


def report(label: str, buf) -> None:
    rows = buf.double()
    sums, counts = rows[:, 0::2], rows[:, 1::2]  # the WG1 pairs: (sum of clocks, count)
    used = counts[:, SOFTMAX] > 0
    mean = (sums[used] / counts[used].clamp(min=1)).mean(dim=0)
    tiles = float(counts[used, SOFTMAX].mean())
    # WG0's segments per tile: each segment's mean times the share of tiles that run it.
    share = (counts[used] / counts[used, SOFTMAX:SOFTMAX + 1]).mean(dim=0)
    print(f"{label}: {int(used.sum())} CTAs, {tiles:.1f} tiles each")
    total = 0.0
    for i, name in enumerate(SEGMENTS):
        if float(counts[used, i].sum()) == 0:
            continue
        per_tile = float(mean[i] * share[i])
        if not name.startswith("wg1"):
            total += per_tile
        print(f"  {name:<32} {float(mean[i]):8.0f} cycles x {float(share[i]):.2f} of tiles = {per_tile:8.0f}")
    print(f"  {'WG0 per tile (sum)':<32} {total:8.0f}")
    pv1 = sums[used, PV1_DONE] / counts[used, PV1_DONE] - sums[used, PV1_ISSUE] / counts[used, PV1_ISSUE]
    print(f"  {'wg1: pv1 issue to its retire':<32} {float(pv1.mean()):8.0f}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", default=[], help="page,b,s_q,h_q,seqlen (default 64,128,1,128,4096)")
    ap.add_argument("--form", action="append", default=[], choices=sorted(FORMS))
    ap.add_argument("--replays", type=int, default=50)
    args = ap.parse_args(argv)

    import torch

    from perf_table import grid
    from probe_setup import probe_graph, replay_last_clean

    print(torch.cuda.get_device_name(0), flush=True)
    for spec in args.config or ["64,128,1,128,4096"]:
        cfg = grid.Config(*(int(x) for x in spec.split(",")))
        for form in args.form or ["base", "ahead", "nowait"]:
            _, buf, graph = probe_graph(cfg, probe_class(form), (MAX_CTAS, SLOTS))
            times = replay_last_clean(graph, buf, args.replays)
            report(f"{cfg.label()} {form} (median replay {statistics.median(times):.1f} us)", buf.cpu())
    return 0


if __name__ == "__main__":
    sys.exit(main())
