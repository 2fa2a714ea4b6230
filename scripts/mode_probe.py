"""Why a compute-bound row's replays fall into a fast and a slow mode: per-CTA clock, span and SM (diagnostic).

    python scripts/mode_probe.py [--config 64,128,1,128,4096] [--replays 300]

On an H200 the graph replays of b128 s1 h128 4096 (2wg's 64-row kernel) split into two modes, about 229
and about 250 us, with or without multicast, whatever the replay's position behind the backlog kernel
(``scripts/clock_probe.py``; docs/perf-notes.md, nineteenth session). This compiles the library's decode
entry once more with a subclass of the 64-row kernel whose thread 0 (WG0) and thread 128 (WG1) record
``%globaltimer`` and ``%clock64`` at the CTA's start and at the end of their role, and ``%smid``; the graph is
replayed one replay at a time (events around it, the stamps copied after each). Printed, per mode: the
replay times, the CTAs' effective SM clock (cycles over nanoseconds from start to WG1's end), their spans,
how late the last CTA ends after the median one, and how the two m-block CTAs of a plan part were placed
(same TPC, i.e. SM ids 2k and 2k+1). Not a benchmark: the stamps add a few instructions.
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
from cutlass._mlir.dialects import llvm  # noqa: E402

from pipelines.variant_2wg import MLADecode2WG  # noqa: E402
from probe_setup import cta_row  # noqa: E402

SLOTS = 8  # per CTA: start ns, start clk, end0 ns, end0 clk, end1 ns, end1 clk, smid, pad
START, END0, END1, SMID = 0, 2, 4, 6
MAX_CTAS = 1024


def _stamp(base: int, slot: int):
    """%globaltimer and %clock64 into slots ``slot`` and ``slot + 1`` of this CTA's row."""
    addr = cta_row(base, SLOTS) + slot * 8
    llvm.inline_asm(None, [addr.ir_value()],
                    "{\n.reg .u64 t, c;\nmov.u64 t, %globaltimer;\nmov.u64 c, %clock64;\n"
                    "st.global.u64 [$0], t;\nst.global.u64 [$0+8], c;\n}", "l", has_side_effects=True)


def _stamp_smid(base: int):
    addr = cta_row(base, SLOTS) + SMID * 8
    llvm.inline_asm(None, [addr.ir_value()],
                    "{\n.reg .u32 s;\n.reg .u64 w;\nmov.u32 s, %smid;\ncvt.u64.u32 w, s;\nst.global.u64 [$0], w;\n}",
                    "l", has_side_effects=True)


def timed_class(base: int):
    class Timed(MLADecode2WG):
        @cute.jit
        def make_pipelines(self, storage):
            tidx, _, _ = cute.arch.thread_idx()
            if tidx == 0:
                _stamp(base, START)
                _stamp_smid(base)
            return super().make_pipelines(storage)

        @cute.jit
        def wg0_exit(self, begin_req, end_req):
            super().wg0_exit(begin_req, end_req)
            tidx, _, _ = cute.arch.thread_idx()
            if tidx == 0:
                _stamp(base, END0)

        @cute.jit
        def store_chunk(self, acc_o, mma_pv, wg_tidx, tidx, row_inv, row_lse, write_lse: cutlass.Constexpr[bool],
                        col0: cutlass.Constexpr[int], m_block, kv_head, r, is_split, split_idx, mO, mLSE, mOaccum,
                        mLSEaccum, storage):
            super().store_chunk(acc_o, mma_pv, wg_tidx, tidx, row_inv, row_lse, write_lse, col0, m_block, kv_head, r,
                                is_split, split_idx, mO, mLSE, mOaccum, mLSEaccum, storage)
            if tidx == 128:  # WG1's first thread: its last store of a chunk (the last chunk's stays)
                _stamp(base, END1)

    return Timed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="64,128,1,128,4096", help="page,b,s_q,h_q,seqlen")
    ap.add_argument("--replays", type=int, default=300)
    args = ap.parse_args(argv)

    from perf_table import grid
    from probe_setup import probe_graph, replay_us

    cfg = grid.Config(*(int(x) for x in args.config.split(",")))
    config, buf, graph = probe_graph(cfg, timed_class, (MAX_CTAS, SLOTS))
    records = []
    for _ in range(args.replays):
        buf.zero_()
        records.append((replay_us(graph), buf.cpu().clone()))
    times = sorted(t for t, _ in records)
    cut = times[len(times) // 2]
    lo = [t for t in times if t < 0.96 * cut]
    split = (max(lo) + min(t for t in times if t >= 0.96 * cut)) / 2 if lo else None
    print(f"{cfg.label()} ({config.cluster}-CTA clusters): {len(times)} replays, us: min {times[0]:.1f} "
          f"median {cut:.1f} max {times[-1]:.1f}; fast mode (< {split:.1f} us): {len(lo)}" if split else
          f"{cfg.label()}: {len(times)} replays, us: min {times[0]:.1f} median {cut:.1f}: one mode")

    def summary(name, recs):
        if not recs:
            return
        clocks, spans, tails, starts, same_tpc = [], [], [], [], []
        for t, b in recs:
            used = b[:, START] > 0
            rows = b[used]
            ns0, ck0 = rows[:, START].double(), rows[:, START + 1].double()
            ns1, ck1 = rows[:, END1].double(), rows[:, END1 + 1].double()
            ok = ns1 > 0
            clocks.append(float(((ck1 - ck0)[ok] / (ns1 - ns0)[ok] * 1e3).median()))  # MHz
            span = (ns1 - ns0)[ok] / 1e3
            spans.append(float(span.median()))
            end_rel = (ns1[ok] - ns0.min()) / 1e3
            tails.append(float(end_rel.max() - end_rel.median()))
            starts.append(float((ns0.max() - ns0.min()) / 1e3))
            sm = rows[:, SMID]
            n = sm.shape[0] // 2 * 2
            pairs = sm[:n].view(-1, 2)  # grid x = m-block: CTAs (0, p), (1, p) are neighbours
            same_tpc.append(float((pairs[:, 0] // 2 == pairs[:, 1] // 2).double().mean()))
        md = statistics.median
        print(f"  {name}: {len(recs)} replays, median {md([t for t, _ in recs]):.1f} us; CTA clock {md(clocks):.0f} MHz "
              f"(range {min(clocks):.0f}-{max(clocks):.0f}); CTA span {md(spans):.1f} us; last end - median end "
              f"{md(tails):.1f} us; start spread {md(starts):.2f} us; m-block pairs on one TPC {md(same_tpc):.2f}")

    if split:
        summary("fast", [r for r in records if r[0] < split])
        summary("slow", [r for r in records if r[0] >= split])
    else:
        summary("all", records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
