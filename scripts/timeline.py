"""Where a short decode's time goes: per-CTA timestamps inside 2wg's narrow kernel (diagnostic).

    python scripts/timeline.py [--config 64,1,1,16,1024] [--replays 200]

The library's decode entry for the config (2wg; at <= 32 rows per kv head its narrow kernel) is compiled
once more with a subclass that records, per CTA, ``%globaltimer`` (ns, comparable across SMs) and
``%clock64`` (SM cycles) at five events, by one thread each (inline PTX, into a buffer whose address is
baked into the kernel):

- ``entry`` (printed as the first column): the CTA runs its first lines (before the barrier inits);
- ``start``: the roles begin (after the barrier inits, griddepcontrol.wait and the plan row's loads
  were issued);
- ``st 1`` / ``st 2``: WG0 issues a tile's S^T (its Q and K tile have landed), first and second tile of
  the CTA (an atomic counter per CTA picks the slot);
- ``store``: WG1 starts a chunk's epilogue (the scratch transpose and the stores);
- ``end``: WG1 has issued the chunk's last store.

And in the split-kv merge kernel (the same buffer, rows from ``MERGE_ROW0``; thread 0 of each CTA of grid
row 0, through hooks on ``cute.arch.griddepcontrol_*`` while the entry is traced): ``m entry`` (its first
line), ``m wait`` and ``m go`` (before and after its griddepcontrol.wait, which returns once the decode
grid has completed and its writes are visible).

The graph of one decode (decode + merge, as the perf table times it) is replayed ``--replays`` times;
the stamps of the last replay are printed per working CTA relative to the earliest ``start``, with the
graph's replay time (CUDA events) beside them, so the gap between the last ``end`` and the replay's
end is the merge's tail plus the launch. Not a benchmark: the stamps add a few instructions.
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

from pipelines.variant_2wg_narrow import MLADecode2WGNarrow  # noqa: E402

EVENTS = ("start", "st 1", "st 2", "store", "end")
SLOTS = 8  # per CTA: 5 events, the kernel entry, padding, the S^T counter
START, ST, STORE, END, ENTRY = 0, 1, 3, 4, 5
COUNTER = 7


def _stamp(base: int, slot):
    """%globaltimer into ``base[cta][slot]`` and %clock64 into the second half of the buffer (``MAX_CTAS``
    rows further)."""
    cta = cute.arch.block_idx()[1]  # grid y: the plan part
    addr = cutlass.Int64(base) + (cutlass.Int64(cta) * SLOTS + slot) * 8
    llvm.inline_asm(None, [addr.ir_value(), cutlass.Int64(MAX_CTAS * SLOTS * 8).ir_value()],
                    "{\n.reg .u64 t, c, a;\nmov.u64 t, %globaltimer;\nmov.u64 c, %clock64;\n"
                    "st.global.u64 [$0], t;\nadd.u64 a, $0, $1;\nst.global.u64 [a], c;\n}",
                    "l,l", has_side_effects=True)


def _stamp_counted(base: int, first_slot: int, n_slots: int):
    """``_stamp`` into slot ``first_slot + k``, ``k`` = this CTA's count of earlier calls (at most
    ``n_slots - 1``), from an atomic counter in slot ``COUNTER``."""
    cta = cute.arch.block_idx()[1]
    row = cutlass.Int64(base) + cutlass.Int64(cta) * SLOTS * 8
    llvm.inline_asm(None, [row.ir_value(), cutlass.Int64(MAX_CTAS * SLOTS * 8).ir_value()],
                    "{\n.reg .u32 o;\n.reg .u64 t, c, a, b;\n"
                    f"atom.global.add.u32 o, [$0+{COUNTER * 8}], 1;\nmin.u32 o, o, {n_slots - 1};\n"
                    f"add.u32 o, o, {first_slot};\nmul.wide.u32 a, o, 8;\nadd.u64 a, a, $0;\n"
                    "mov.u64 t, %globaltimer;\nmov.u64 c, %clock64;\nst.global.u64 [a], t;\n"
                    "add.u64 b, a, $1;\nst.global.u64 [b], c;\n}",
                    "l,l", has_side_effects=True)


MAX_CTAS = 1024
MERGE_ROW0 = 512  # merge CTA (part, 0) stamps into row MERGE_ROW0 + part
M_ENTRY, M_WAIT, M_GO = 0, 1, 2


def _stamp_merge(base: int, slot: int):
    """``_stamp`` for the merge kernel, by thread 0 of grid row 0 only (a predicate inside the PTX: this
    runs from a hook in plain Python, where no DSL ``if`` is available)."""
    tidx, _, _ = cute.arch.thread_idx()
    part, cta_y, _ = cute.arch.block_idx()
    addr = cutlass.Int64(base) + (cutlass.Int64(part) + MERGE_ROW0) * SLOTS * 8 + slot * 8
    who = cutlass.Int32(tidx) + cutlass.Int32(cta_y) * 1024
    llvm.inline_asm(None, [addr.ir_value(), cutlass.Int64(MAX_CTAS * SLOTS * 8).ir_value(), who.ir_value()],
                    "{\n.reg .pred p;\n.reg .u64 t, c, b;\nsetp.eq.u32 p, $2, 0;\nmov.u64 t, %globaltimer;\n"
                    "mov.u64 c, %clock64;\n@p st.global.u64 [$0], t;\nadd.u64 b, $0, $1;\n@p st.global.u64 [b], c;\n}",
                    "l,l,r", has_side_effects=True)


class MergeHooks:
    """While active, ``cute.arch.griddepcontrol_launch_dependents`` / ``_wait`` stamp when traced for the
    merge kernel: the entry traces the decode kernel first (one call of each) and the merge second."""

    def __init__(self, base: int):
        self.base, self.calls = base, {"launch": 0, "wait": 0}

    def __enter__(self):
        self.real = cute.arch.griddepcontrol_launch_dependents, cute.arch.griddepcontrol_wait

        def launch_dependents():
            self.calls["launch"] += 1
            if self.calls["launch"] > 1:
                _stamp_merge(self.base, M_ENTRY)
            self.real[0]()

        def wait():
            self.calls["wait"] += 1
            if self.calls["wait"] > 1:
                _stamp_merge(self.base, M_WAIT)
                self.real[1]()
                _stamp_merge(self.base, M_GO)
            else:
                self.real[1]()

        cute.arch.griddepcontrol_launch_dependents, cute.arch.griddepcontrol_wait = launch_dependents, wait
        return self

    def __exit__(self, *exc):
        cute.arch.griddepcontrol_launch_dependents, cute.arch.griddepcontrol_wait = self.real


def timed_class(base: int):
    """The narrow kernel with the stamps of the module docstring, writing to the buffer at ``base``."""

    class Timed(MLADecode2WGNarrow):
        @cute.jit
        def make_pipelines(self, storage):
            tidx, _, _ = cute.arch.thread_idx()
            if tidx == 0:
                _stamp(base, ENTRY)
            return super().make_pipelines(storage)

        @cute.jit
        def work_list(self, mMeta):
            res = super().work_list(mMeta)
            tidx, _, _ = cute.arch.thread_idx()
            if tidx == 0:
                _stamp(base, START)
            return res

        @cute.jit
        def issue_st(self, acc_t, tTrK, tTrQ, stage):
            tidx, _, _ = cute.arch.thread_idx()
            if tidx == 0:
                _stamp_counted(base, ST, 2)
            super().issue_st(acc_t, tTrK, tTrQ, stage)

        @cute.jit
        def store_transposed(self, acc_mn, tOcO, col_inv, wg_tidx, kv_head, last, mDst, storage):
            if wg_tidx == 0:
                _stamp(base, STORE)
            super().store_transposed(acc_mn, tOcO, col_inv, wg_tidx, kv_head, last, mDst, storage)
            if wg_tidx == 0:
                _stamp(base, END)

    return Timed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", default=[], help="page,b,s_q,h_q,seqlen (default 64,1,1,16,1024)")
    ap.add_argument("--replays", type=int, default=200)
    args = ap.parse_args(argv)

    import torch

    from perf_table import bench, grid
    from pipelines.launch import compile_entry
    from probe_setup import planned_entry

    print(torch.cuda.get_device_name(0), flush=True)
    for spec in args.config or ["64,1,1,16,1024"]:
        cfg = grid.Config(*(int(x) for x in spec.split(",")))
        inp, dec, config = planned_entry(cfg)
        parts = int(dec.tile_scheduler_metadata.shape[0])
        if parts > MAX_CTAS:
            raise SystemExit(f"{parts} plan parts: more than the buffer's {MAX_CTAS}")
        buf = torch.zeros(2, MAX_CTAS, SLOTS, dtype=torch.int64, device="cuda")
        with MergeHooks(buf.data_ptr()) as hooks:
            fn = compile_entry(config, kernel_class=timed_class(buf.data_ptr()))
        if hooks.calls["launch"] < 2 or hooks.calls["wait"] < 2:
            raise SystemExit(f"the merge hooks saw {hooks.calls}: not the entry's decode-then-merge order")
        graphs, _ = bench.capture_entries({"timed": fn}, inp, dec)
        times = []
        for i in range(args.replays):
            buf[:, :, COUNTER] = 0
            if i == args.replays - 1:
                buf.zero_()  # the printed replay's stamps only (a 1-tile CTA writes no "st 2")
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs["timed"].replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        ns, cyc = buf[0, :parts].cpu(), buf[1, :parts].cpu()
        t0 = int(ns[:, ENTRY][ns[:, ENTRY] > 0].min())
        print(f"{cfg.label()}: {parts} parts; graph replay median {statistics.median(times):.2f} us, last "
              f"{times[-1]:.2f} us; us from the earliest entry (globaltimer) | SM cycles from the CTA's start")
        print("  part     entry  " + "  ".join(f"{e:>8}" for e in EVENTS) + "   |  "
              + "  ".join(f"{e:>7}" for e in EVENTS[1:]))
        for p in range(parts):
            if int(ns[p, STORE]) == 0:
                continue  # no chunk
            row = [(int(ns[p, s]) - t0) / 1e3 if int(ns[p, s]) else float("nan") for s in (ENTRY,) + tuple(range(5))]
            cy = [int(cyc[p, s]) - int(cyc[p, START]) if int(cyc[p, s]) else -1 for s in range(1, 5)]
            print(f"  {p:>4}  " + "  ".join(f"{v:8.2f}" for v in row) + "   |  " + "  ".join(f"{c:7d}" for c in cy))
        ends = ns[:, END][ns[:, END] > 0]
        print(f"  last end {(int(ends.max()) - t0) / 1e3:.2f} us after the earliest entry", flush=True)
        mns = buf[0, MERGE_ROW0:MERGE_ROW0 + parts].cpu()
        went = [p for p in range(parts) if int(mns[p, M_GO])]
        entries = mns[:, M_ENTRY][mns[:, M_ENTRY] > 0]
        if len(entries):
            print(f"  merge: CTA entries {(int(entries.min()) - t0) / 1e3:.2f} to {(int(entries.max()) - t0) / 1e3:.2f} us; "
                  f"{len(went)} CTAs waited (m wait, m go):")
            for p in went:
                print(f"    part {p:>4}: entry {(int(mns[p, M_ENTRY]) - t0) / 1e3:6.2f}  wait "
                      f"{(int(mns[p, M_WAIT]) - t0) / 1e3:6.2f}  go {(int(mns[p, M_GO]) - t0) / 1e3:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
