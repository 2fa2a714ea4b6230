"""The seesaw's iteration as a timeline of both warpgroups, in SM cycles (diagnostic).

    python scripts/seesaw_timeline.py [--config 64,32,2,128,1024 ...] [--replays 50]

The library's seesaw entry (``pipelines/variant_seesaw.py``) for each config is compiled once more with a
subclass whose ``mark`` hook (a no-op in the library) has thread 0 (WG0) and thread 128 (WG1) add
``%clock64`` into a per-CTA sum for each event of every full iteration (one with t1 and a next pair), with
a count. ``%clock64`` is the SM's counter, so both warpgroups' stamps share a time base, and an event's mean
minus the mean of WG0's iteration start (event 0) is its mean offset into the iteration. The graph of one
decode is replayed ``--replays`` times; sums are reset before the last replay, whose numbers are printed
(the mean over the CTAs with full iterations). Not a benchmark: each stamp adds a few instructions.
Also printed: each CTA's span from the roles' start to their end with the SM clock over it (``%clock64`` against
``%globaltimer``), the start-to-start period of consecutive full iterations of each warpgroup (measured directly:
an event's offset from the start stamp is not the period, since ptxas may schedule an iteration's first
instructions above that stamp), each chunk's phases (chunk start, Q landed, first QK retired, last iteration, loop
done, row sums exchanged, O stored, chunk stored; over all chunks and over the chunks after a CTA's first), when
QK(t0') / QK(t1')'s refilled groups land, and when the producer issues each load.
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
from cutlass import const_expr  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass._mlir.dialects import llvm  # noqa: E402

from pipelines.variant_seesaw import MLADecodeSeesaw  # noqa: E402
from entry_ab import MODES  # noqa: E402
from probe_setup import cta_row  # noqa: E402

# ``mark`` numbers of the library's (max-first) iteration; "(unused)" numbers are not stamped
EVENTS = (
    # WG0 (thread 0)
    "wg0 start (S0 ready)", "wg0 softmax0 done, M0 (m0) arrived", "wg0 P0 stored (to m1), P0 arrived",
    "wg0 PV_L(t0) issued", "wg0 PV_L(t0) retired", "wg0 G0 refill issued", "wg0 M1 passed",
    "wg0 P1 passed, t1's G0 landed", "wg0 PV_L(t1) issued", "wg0 QK(t0') issued", "wg0 PV_L(t1) retired",
    "wg0 QK(t0') retired",
    # WG1 (thread 128)
    "wg1 start", "wg1 M0 passed", "wg1 P0 passed", "wg1 PV_R(t0) issued, P1 arrived",
    "wg1 softmax1 done, M1 arrived", "wg1 P1 stored", "wg1 PV_R(t0) retired", "(unused)", "wg1 PV_R(t1) issued",
    "wg1 PV_R(t1) retired", "wg1 before QK(t1')", "wg1 QK(t1') issued", "wg1 QK(t1') retired",
    # added later (the order of ``mark`` numbers in the library)
    "wg0 t0's G0 released", "wg1 t0's G1 released", "wg1 t1's G1 released",
    # once per chunk (``role``), WG0 then WG1: not part of an iteration (``CHUNK_EVENTS``)
    "wg0 chunk start", "wg1 chunk start", "wg0 Q landed", "wg1 Q landed", "wg0 first QK retired",
    "wg1 first QK retired", "wg0 loop done", "wg1 loop done", "wg0 chunk stored", "wg1 chunk stored",
    "wg0 last iteration", "wg1 last iteration", "wg0 iteration returned", "wg1 iteration returned",
    "wg0 t0's G1 refill landed", "wg1 t1's G0 refill landed",
    # the producer's warp 0, loads of the next pair (counted in the iteration they go out in)
    "prod G0(t0') issued", "prod G1(t1') issued", "prod G1(t0') issued", "prod G0(t1') issued",
    # the first group of the next pair's QKs landed (WG0: G0 of t0', WG1: G1 of t1')
    "wg0 t0's G0 refill landed", "wg1 t1's G1 refill landed",
    # a chunk's epilogue (``finish_chunk``): the row sums exchanged (SUM / INV), O stored (stores issued)
    "wg0 sums exchanged", "wg1 sums exchanged", "wg0 O stored", "wg1 O stored",
)
CHUNK_EVENTS = tuple(range(28, 40)) + (50, 51, 52, 53)
WG1_EVENTS_LATE = {41, 43, 49, 51, 53}
PRODUCER_EVENTS = range(44, 48)
WG1_EVENTS = set(range(12, 25)) | {26, 27} | WG1_EVENTS_LATE
SLOTS = 2 * len(EVENTS)
# after the events' sums and counts, thread 0's %clock64 and %globaltimer (ns) when the roles start and end,
# then per warpgroup the period of its full iterations: the last start's clock, the sum of start-to-start
# cycles between two full iterations of one chunk, their count
SPAN = 4
PERIOD = SLOTS + SPAN
SMEM_ROW = PERIOD + 6
# then each warpgroup's count of chunk starts, and the chunk events' sums again over the chunks after a CTA's first
# (``LATE``: a later chunk's head follows another chunk's epilogue, the first one the kernel's start; each counted
# once per later chunk). In shared memory these live in ``row_scale`` (unused by the seesaw): the probe's own field,
# after the kernel's 224 KB, has room for about 1 KB.
COUNTERS = SMEM_ROW
LATE = COUNTERS + 2
ROW = LATE + len(CHUNK_EVENTS)
# --form: class constants set on the probed kernel ("library": none), those of entry_ab's seesaw modes
FORMS = {"library": {}, **{m[len("seesaw-"):]: MODES[m][1] for m in ("seesaw-consumer-loads", "seesaw-spin",
                                                                   "seesaw-no-l2", "seesaw-max-after",
                                                                   "seesaw-producer-spin", "seesaw-keep-p",
                                                                   "seesaw-late-fence", "seesaw-narrow-boxes", "seesaw-sts",
                                                                   "seesaw-steady")}}
MAX_CTAS = 1024


def probe_class(base: int, overrides: dict | None = None):
    """The seesaw kernel with ``mark`` stamping into shared memory, copied to the buffer at ``base`` once the
    roles are done. Why shared memory: the stamps then add no global operation to the kernel's path (a first
    form with a ``red.global`` per stamp read the same timeline within about 10%, and 7% slower replays)."""

    class Probed(MLADecodeSeesaw):
        def extra_shared_fields(self) -> dict:
            fields = dict(super().extra_shared_fields())
            fields["probe_sums"] = cute.struct.Align[cute.struct.MemRange[cutlass.Int64, SMEM_ROW], 16]
            return fields

        @cute.jit
        def warpgroup_roles(self, tidx, m_block, kv_head, mMeta, tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens,
                            mNumSplits, mO, mLSE, mOaccum, mLSEaccum, sQ, sK, sP, storage, pipe_q, pipe_k,
                            scale_log2, merge_tail=None):
            sums = cutlass.Int32(storage.probe_sums.data_ptr().toint())
            late = cutlass.Int32(storage.row_scale.data_ptr().toint())
            self.probe_sums = sums  # read by ``mark`` while tracing (defined before every branch)
            self.probe_late = late
            if tidx < SMEM_ROW:
                llvm.inline_asm(None, [(sums + tidx * 8).ir_value()], "st.shared.u64 [$0], 0;", "r",
                                has_side_effects=True)
            if tidx < ROW - SMEM_ROW:
                llvm.inline_asm(None, [(late + tidx * 8).ir_value()], "st.shared.u64 [$0], 0;", "r",
                                has_side_effects=True)
            cute.arch.sync_threads()
            self.stamp_span(tidx, sums, 0)
            super().warpgroup_roles(tidx, m_block, kv_head, mMeta, tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens,
                                    mNumSplits, mO, mLSE, mOaccum, mLSEaccum, sQ, sK, sP, storage, pipe_q, pipe_k,
                                    scale_log2, merge_tail)
            cute.arch.sync_threads()
            self.stamp_span(tidx, sums, 1)
            cute.arch.sync_threads()
            if tidx < ROW:
                row = cta_row(base, ROW)
                src = sums + tidx * 8
                if tidx >= SMEM_ROW:
                    src = late + (tidx - SMEM_ROW) * 8
                llvm.inline_asm(None, [src.ir_value(), (row + cutlass.Int64(tidx) * 8).ir_value()],
                                "{\n.reg .u64 v;\nld.shared.u64 v, [$0];\nst.global.u64 [$1], v;\n}", "r,l",
                                has_side_effects=True)

        @cute.jit
        def stamp_span(self, tidx, sums, end: cutlass.Constexpr[int]):
            if tidx == 0:
                llvm.inline_asm(None, [(sums + (SLOTS + end) * 8).ir_value()],
                                "{\n.reg .u64 c, t;\nmov.u64 c, %clock64;\nmov.u64 t, %globaltimer;\n"
                                f"st.shared.u64 [$0], c;\nst.shared.u64 [$0+{2 * 8}], t;\n}}", "r",
                                has_side_effects=True)

        @cute.jit
        def mark(self, event: cutlass.Constexpr[int], wg_tidx, full):
            # Start-to-start cycles of consecutive full iterations (event 0 / 12: the first stamp of an
            # iteration), and the last start forgotten when a chunk's loop is done (events 34 / 35).
            if const_expr(event in (0, 12)):
                if full:
                    if wg_tidx == 0:
                        slot = PERIOD + (3 if event == 12 else 0)
                        llvm.inline_asm(None, [(self.probe_sums + slot * 8).ir_value()],
                                        "{\n.reg .u64 c, p, s, n, d;\n.reg .pred q;\nmov.u64 c, %clock64;\n"
                                        "ld.shared.u64 p, [$0];\nsetp.ne.u64 q, p, 0;\n"
                                        "@q ld.shared.u64 s, [$0+8];\n@q ld.shared.u64 n, [$0+16];\n"
                                        "@q sub.u64 d, c, p;\n@q add.u64 s, s, d;\n@q add.u64 n, n, 1;\n"
                                        "@q st.shared.u64 [$0+8], s;\n@q st.shared.u64 [$0+16], n;\n"
                                        "st.shared.u64 [$0], c;\n}", "r", has_side_effects=True)
            if const_expr(event in (34, 35)):
                if wg_tidx == 0:
                    slot = PERIOD + (3 if event == 35 else 0)
                    llvm.inline_asm(None, [(self.probe_sums + slot * 8).ir_value()], "st.shared.u64 [$0], 0;", "r",
                                    has_side_effects=True)
            if const_expr(event in CHUNK_EVENTS):
                # this warpgroup's chunk count (raised at its chunk start), then the stamp again into ``LATE``
                # from its second chunk on
                if wg_tidx == 0:
                    count = self.probe_late + (event % 2) * 8
                    late = self.probe_late + (2 + CHUNK_EVENTS.index(event)) * 8
                    bump = "add.u64 k, k, 1;\nst.shared.u64 [$0], k;\n" if event in (28, 29) else ""
                    llvm.inline_asm(None, [count.ir_value(), late.ir_value()],
                                    "{\n.reg .u64 c, k, v;\n.reg .pred q;\nmov.u64 c, %clock64;\n"
                                    f"ld.shared.u64 k, [$0];\n{bump}setp.ge.u64 q, k, 2;\n"
                                    "@q ld.shared.u64 v, [$1];\n@q add.u64 v, v, c;\n@q st.shared.u64 [$1], v;\n}",
                                    "r,r", has_side_effects=True)
            if full:
                if wg_tidx == 0:
                    llvm.inline_asm(None, [(self.probe_sums + event * 16).ir_value()],
                                    "{\n.reg .u64 c, v, n;\nmov.u64 c, %clock64;\nld.shared.u64 v, [$0];\n"
                                    "ld.shared.u64 n, [$0+8];\nadd.u64 v, v, c;\nadd.u64 n, n, 1;\n"
                                    "st.shared.u64 [$0], v;\nst.shared.u64 [$0+8], n;\n}", "r",
                                    has_side_effects=True)

    for name, value in (overrides or {}).items():  # class constants of the form probed (``--form``)
        setattr(Probed, name, value)
    return Probed


def report(label: str, buf) -> None:
    import torch

    rows = buf.double()
    sums, counts = rows[:, 0:SLOTS:2], rows[:, 1:SLOTS:2]
    used = counts[:, 0] > 0
    mean = sums[used] / counts[used].clamp(min=1)
    rel = (mean - mean[:, :1]).mean(dim=0)
    print(f"{label}: {int(used.sum())} CTAs, {float(counts[used, 0].mean()):.1f} full iterations each")
    # Where a CTA's time goes: its full iterations (each one start-to-start period of WG0: the period of
    # consecutive full iterations, measured directly; an event's offset from the start stamp is not the
    # period, as ptxas may schedule the iteration's first instructions above that stamp) against the span from
    # the roles' start to their end, and the SM clock over it.
    span = rows[:, SLOTS + 1] - rows[:, SLOTS]
    ns = rows[:, SLOTS + 3] - rows[:, SLOTS + 2]
    live = span > 0
    periods = []
    for wg in (0, 1):
        n = rows[:, PERIOD + 3 * wg + 2]
        periods.append(torch.where(n > 0, rows[:, PERIOD + 3 * wg + 1] / n.clamp(min=1), torch.zeros_like(n)))
    ok = periods[0] > 0
    steady = counts[:, 0] * periods[0]
    print(f"  CTA span: {float(span[live].mean()):.0f} cycles mean, {float(span[live].max()):.0f} max over "
          f"{int(live.sum())} CTAs; {float(ns[live].mean()) / 1e3:.1f} us mean; SM clock "
          f"{float((span[live] / ns[live].clamp(min=1)).median()) * 1e3:.0f} MHz")
    qk_retired = float(rel[EVENTS.index("wg0 QK(t0') retired")])
    print(f"  full iteration, start to start: wg0 {float(periods[0][ok].mean()):.0f}, wg1 "
          f"{float(periods[1][periods[1] > 0].mean()):.0f} cycles (wg0's QK(t0') retired "
          f"{qk_retired:.0f} after its start stamp); full iterations: "
          f"{float((steady[live & ok] / span[live & ok]).mean()):.3f} of the span (mean over CTAs)")
    # A chunk's phases (each chunk stamps every chunk event once): mean cycles from one event to the next.
    # (``CHUNK_EVENTS`` order, that of the ``LATE`` slots: the chunk starts first, then each WG0 event beside WG1's)
    c = list(CHUNK_EVENTS)
    chunks = counts[:, c[0]] > 0
    cmean = (sums[chunks][:, c] / counts[chunks][:, c].clamp(min=1)).mean(dim=0)
    late_sums = rows[:, LATE:ROW]
    late_counts = (rows[:, COUNTERS:COUNTERS + 2] - 1).clamp(min=0)[:, [e % 2 for e in c]]  # each wg's later chunks
    later = late_counts[:, 0] > 0
    lmean = (late_sums[later] / late_counts[later].clamp(min=1)).mean(dim=0)
    print(f"  chunks: {float(counts[chunks, c[0]].mean()):.2f} per CTA; cycles from each warpgroup's chunk start, "
          f"all chunks | chunks after a CTA's first ({int(later.sum())} CTAs):")
    order = sorted(range(len(c)), key=lambda k: float(cmean[k]))
    for wg in (0, 1):
        line = ", ".join(f"{EVENTS[c[k]][4:]} {float(cmean[k] - cmean[wg]):.0f} | "
                         f"{float(lmean[k] - lmean[wg]):.0f}" for k in order if k % 2 == wg and k > 1)
        print(f"    wg{wg}: {line}")
    for group in (sorted(set(range(len(EVENTS))) - WG1_EVENTS - set(CHUNK_EVENTS) - set(PRODUCER_EVENTS)),
                  sorted(WG1_EVENTS), PRODUCER_EVENTS):
        for i in sorted(group, key=lambda e: float(rel[e])):
            if EVENTS[i] != "(unused)":
                print(f"  {EVENTS[i]:<34} {float(rel[i]):8.0f}")
        print("  --")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", default=[], help="page,b,s_q,h_q,seqlen (default 64,32,2,128,1024)")
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--form", choices=sorted(FORMS), default="library", help="the seesaw form probed")
    args = ap.parse_args(argv)

    import torch

    from perf_table import grid
    from probe_setup import probe_graph, replay_last_clean

    print(torch.cuda.get_device_name(0), flush=True)
    for spec in args.config or ["64,32,2,128,1024"]:
        cfg = grid.Config(*(int(x) for x in spec.split(",")))
        _, buf, graph = probe_graph(cfg, lambda base: probe_class(base, FORMS[args.form]), (MAX_CTAS, ROW),
                                    variant="seesaw")
        times = replay_last_clean(graph, buf, args.replays)
        form = "seesaw" if args.form == "library" else f"seesaw ({args.form})"
        report(f"{cfg.label()} {form} (median replay {statistics.median(times):.1f} us)", buf.cpu())
    return 0


if __name__ == "__main__":
    sys.exit(main())
