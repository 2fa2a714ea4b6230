"""Where a short decode's time goes: per-CTA timestamps inside 2wg's kernels (diagnostic).

    python scripts/timeline.py [--config 64,1,1,16,1024] [--replays 200] [--attr l2_prefetch_chunk_tiles=0]

The library's decode entry for the config (2wg: at <= 32 rows per kv head its narrow kernel, else the
64-row one, with one barrier pair per K stage) is compiled once more with a subclass that records, per
CTA, ``%globaltimer`` (ns, comparable across SMs) and ``%clock64`` (SM cycles) at these events, by one
thread each (inline PTX, into a buffer whose address is baked into the kernel):

- ``entry`` (printed as the first column): the CTA runs its first lines (before the barrier inits);
- ``start``: the roles begin (after the barrier inits, griddepcontrol.wait and the plan row's loads
  were issued);
- ``t 1`` .. ``t 8``: WG0 issues a tile's first product (S^T in the narrow kernel, QK in the 64-row one):
  its Q and K tile have landed; the CTA's first to eighth tile (an atomic counter per CTA picks the slot);
- ``store``: a chunk's epilogue starts (WG1's in the narrow kernel, WG0's in the 64-row one);
- ``end``: that warpgroup has issued the chunk's last store.

``--attr name=value`` (repeatable) sets a class constant of the kernel (an integer or a name), as
``scripts/entry_ab.py``'s modes do. With more than ``--rows`` working CTAs, the per-CTA table is cut to
that many rows and each event's minimum / median / maximum over all working CTAs follows.

And in the split-kv merge kernel (the same buffer, rows from ``MERGE_ROW0``; thread 0 of each CTA of grid
row 0, through hooks on ``cute.arch.griddepcontrol_*`` and ``SplitMerge.merge_slot`` while the entry is
traced): ``m entry`` (its first line), ``m wait`` and ``m go`` (before and after its griddepcontrol.wait,
which returns once the decode grid has completed and its writes are visible), ``m end`` (its units merged
and their stores issued).

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

TILES = 8  # tile stamps per CTA
EVENTS = ("start",) + tuple(f"t {k + 1}" for k in range(TILES)) + ("store", "end")
SLOTS = 16  # per CTA: the events, the kernel entry, padding, the tile counter
START, ST, STORE, END, ENTRY = 0, 1, 1 + TILES, 2 + TILES, 3 + TILES
COUNTER = 15


def _cta():
    """This CTA's row: plan part (grid y) times the m-blocks (grid x) plus its m-block."""
    bx, by, _ = cute.arch.block_idx()
    gx, _, _ = cute.arch.grid_dim()
    return by * gx + bx


def _stamp(base: int, slot):
    """%globaltimer into ``base[cta][slot]`` and %clock64 into the second half of the buffer (``MAX_CTAS``
    rows further)."""
    cta = _cta()
    addr = cutlass.Int64(base) + (cutlass.Int64(cta) * SLOTS + slot) * 8
    llvm.inline_asm(None, [addr.ir_value(), cutlass.Int64(MAX_CTAS * SLOTS * 8).ir_value()],
                    "{\n.reg .u64 t, c, a;\nmov.u64 t, %globaltimer;\nmov.u64 c, %clock64;\n"
                    "st.global.u64 [$0], t;\nadd.u64 a, $0, $1;\nst.global.u64 [a], c;\n}",
                    "l,l", has_side_effects=True)


def _stamp_counted(base: int, first_slot: int, n_slots: int):
    """``_stamp`` into slot ``first_slot + k``, ``k`` = this CTA's count of earlier calls (at most
    ``n_slots - 1``), from an atomic counter in slot ``COUNTER``."""
    cta = _cta()
    row = cutlass.Int64(base) + cutlass.Int64(cta) * SLOTS * 8
    llvm.inline_asm(None, [row.ir_value(), cutlass.Int64(MAX_CTAS * SLOTS * 8).ir_value()],
                    "{\n.reg .u32 o;\n.reg .u64 t, c, a, b;\n"
                    f"atom.global.add.u32 o, [$0+{COUNTER * 8}], 1;\nmin.u32 o, o, {n_slots - 1};\n"
                    f"add.u32 o, o, {first_slot};\nmul.wide.u32 a, o, 8;\nadd.u64 a, a, $0;\n"
                    "mov.u64 t, %globaltimer;\nmov.u64 c, %clock64;\nst.global.u64 [a], t;\n"
                    "add.u64 b, a, $1;\nst.global.u64 [b], c;\n}",
                    "l,l", has_side_effects=True)


MAX_CTAS = 1024
MERGE_ROW0 = 640  # merge CTA (part, 0) stamps into row MERGE_ROW0 + part
M_ENTRY, M_WAIT, M_GO, M_END = 0, 1, 2, 3


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

        # The merge CTA's end: after its merge_slot (the units it merged, their stores issued).
        from split_k.merge_kernel import SplitMerge
        self.real_slot = SplitMerge.merge_slot
        real_slot, base = self.real_slot, self.base

        def merge_slot(this, *args, **kwargs):
            res = real_slot(this, *args, **kwargs)
            _stamp_merge(base, M_END)
            return res

        SplitMerge.merge_slot = merge_slot
        return self

    def __exit__(self, *exc):
        from split_k.merge_kernel import SplitMerge
        SplitMerge.merge_slot = self.real_slot
        cute.arch.griddepcontrol_launch_dependents, cute.arch.griddepcontrol_wait = self.real


def timed_class(base: int, parent):
    """``parent`` (the entry's 2wg kernel class, narrow or 64-row) with the stamps of the module docstring,
    writing to the buffer at ``base``. (The overrides call ``parent``'s methods by name: the DSL rebuilds a
    jit method from its source, where a zero-argument ``super()`` of a shared base class recursed.)"""

    @cute.jit
    def make_pipelines(self, storage):
        tidx, _, _ = cute.arch.thread_idx()
        if tidx == 0:
            _stamp(base, ENTRY)
        return parent.make_pipelines(self, storage)

    @cute.jit
    def work_list(self, mMeta):
        res = parent.work_list(self, mMeta)
        tidx, _, _ = cute.arch.thread_idx()
        if tidx == 0:
            _stamp(base, START)
        return res

    @cute.jit
    def stamp_tile():
        """Thread 0 (WG0, which issues every tile's first product): the CTA's next tile stamp."""
        tidx, _, _ = cute.arch.thread_idx()
        if tidx == 0:
            _stamp_counted(base, ST, TILES)

    @cute.jit
    def issue_st(self, acc_t, tTrK, tTrQ, stage):
        stamp_tile()
        parent.issue_st(self, acc_t, tTrK, tTrQ, stage)

    @cute.jit
    def store_transposed(self, acc_mn, tOcO, col_inv, wg_tidx, kv_head, last, mDst, storage):
        if wg_tidx == 0:
            _stamp(base, STORE)
        parent.store_transposed(self, acc_mn, tOcO, col_inv, wg_tidx, kv_head, last, mDst, storage)
        if wg_tidx == 0:
            _stamp(base, END)

    @cute.jit
    def issue_qk(self, acc_s, tSrQ, tSrK, stage):
        stamp_tile()
        parent.issue_qk(self, acc_s, tSrQ, tSrK, stage)

    @cute.jit
    def store_chunk(self, acc, tiled_mma, wg_tidx, math_tidx, row_inv, row_lse, write_lse: cutlass.Constexpr[bool],
                    col0: cutlass.Constexpr[int], m_block, kv_head, r, is_split, split_idx, mO, mLSE, mOaccum,
                    mLSEaccum, storage):
        if math_tidx == 0:
            _stamp(base, STORE)
        parent.store_chunk(self, acc, tiled_mma, wg_tidx, math_tidx, row_inv, row_lse, write_lse, col0, m_block,
                           kv_head, r, is_split, split_idx, mO, mLSE, mOaccum, mLSEaccum, storage)
        if math_tidx == 0:
            _stamp(base, END)

    hooks = dict(make_pipelines=make_pipelines, work_list=work_list)
    if issubclass(parent, MLADecode2WGNarrow):
        hooks.update(issue_st=issue_st, store_transposed=store_transposed)
    else:
        # One barrier pair per K stage (``MLADecode2WG.kv_groups``): with two column groups the 64-row kernel's
        # QK does not go through ``issue_qk``, whose call is the tile stamp.
        hooks.update(issue_qk=issue_qk, store_chunk=store_chunk, kv_groups=1)
    return type("Timed", (parent,), hooks)


def _attrs(specs) -> dict:
    out = {}
    for spec in specs:
        name, _, value = spec.partition("=")
        try:
            out[name] = int(value)
        except ValueError:
            out[name] = value
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", default=[], help="page,b,s_q,h_q,seqlen (default 64,1,1,16,1024)")
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--attr", action="append", default=[], help="name=value: a class constant of the kernel")
    ap.add_argument("--rows", type=int, default=16, help="per-CTA rows printed at most")
    args = ap.parse_args(argv)

    import torch

    from perf_table import bench, grid
    from pipelines.launch import _kernel_class, compile_entry
    from probe_setup import planned_entry, replay_us

    print(torch.cuda.get_device_name(0), flush=True)
    for spec in args.config or ["64,1,1,16,1024"]:
        cfg = grid.Config(*(int(x) for x in spec.split(",")))
        inp, dec, config = planned_entry(cfg)
        parts = int(dec.tile_scheduler_metadata.shape[0])
        # Decode CTA rows (part x m-blocks x kv heads, ``_cta``) must stay below the merge's rows.
        ctas = parts * -(-config.rows // config.num_heads_k // 64) * config.num_heads_k
        if ctas > MERGE_ROW0 or parts > MAX_CTAS - MERGE_ROW0:
            raise SystemExit(f"{ctas} decode CTAs / {parts} plan parts: more than the buffer's "
                             f"{MERGE_ROW0} / {MAX_CTAS - MERGE_ROW0} rows")
        buf = torch.zeros(2, MAX_CTAS, SLOTS, dtype=torch.int64, device="cuda")
        with MergeHooks(buf.data_ptr()) as hooks:
            parent = type("Probed", (_kernel_class("2wg", config),), _attrs(args.attr))
            fn = compile_entry(config, kernel_class=timed_class(buf.data_ptr(), parent))
        if hooks.calls["launch"] < 2 or hooks.calls["wait"] < 2:
            raise SystemExit(f"the merge hooks saw {hooks.calls}: not the entry's decode-then-merge order")
        graphs, _ = bench.capture_entries({"timed": fn}, inp, dec)
        times = []
        for i in range(args.replays):
            buf[:, :, COUNTER] = 0
            if i == args.replays - 1:
                buf.zero_()  # the printed replay's stamps only (a 1-tile CTA writes no "t 2")
            times.append(replay_us(graphs["timed"]))
        ns_all, cyc_all = buf[0].cpu(), buf[1].cpu()
        used = [c for c in range(MERGE_ROW0) if int(ns_all[c, STORE])]
        t0 = int(ns_all[:MERGE_ROW0, ENTRY][ns_all[:MERGE_ROW0, ENTRY] > 0].min())
        print(f"{cfg.label()}: {parts} parts, {len(used)} working CTAs; graph replay median "
              f"{statistics.median(times):.2f} us, last {times[-1]:.2f} us; us from the earliest entry (globaltimer)")
        cols = (ENTRY,) + tuple(range(END + 1))
        names = ("entry",) + EVENTS

        def us(c, slot):
            v = int(ns_all[c, slot])
            return (v - t0) / 1e3 if v else float("nan")

        print("   cta  " + " ".join(f"{e:>7}" for e in names))
        step = max(1, len(used) // args.rows)
        for c in used[::step][:args.rows]:
            print(f"  {c:>4}  " + " ".join(f"{us(c, slot):7.2f}" for slot in cols))
        print("  min / median / max over the working CTAs (CTAs with the event):")
        for name, slot in zip(names, cols):
            vals = sorted(us(c, slot) for c in used if int(ns_all[c, slot]))
            if vals:
                print(f"    {name:>6}: {vals[0]:7.2f} {statistics.median(vals):7.2f} {vals[-1]:7.2f}  ({len(vals)})")
        per_tile = [(int(cyc_all[c, ST + k + 1]) - int(cyc_all[c, ST + k])) for c in used for k in range(TILES - 1)
                    if int(ns_all[c, ST + k + 1])]
        if per_tile:
            print(f"  cycles between a CTA's consecutive tile issues: median {statistics.median(per_tile):.0f}, "
                  f"min {min(per_tile)}, max {max(per_tile)}")
        print(f"  last end {max(us(c, END) for c in used):.2f} us after the earliest entry", flush=True)
        mns = buf[0, MERGE_ROW0:MERGE_ROW0 + parts].cpu()
        went = [p for p in range(parts) if int(mns[p, M_GO])]
        entries = mns[:, M_ENTRY][mns[:, M_ENTRY] > 0]
        if len(entries):
            print(f"  merge: CTA entries {(int(entries.min()) - t0) / 1e3:.2f} to {(int(entries.max()) - t0) / 1e3:.2f} us; "
                  f"{len(went)} CTAs waited (m wait, m go):")
            for p in went:
                print(f"    part {p:>4}: entry {(int(mns[p, M_ENTRY]) - t0) / 1e3:6.2f}  wait "
                      f"{(int(mns[p, M_WAIT]) - t0) / 1e3:6.2f}  go {(int(mns[p, M_GO]) - t0) / 1e3:6.2f}  end "
                      f"{(int(mns[p, M_END]) - t0) / 1e3:6.2f}")
            ends = [int(mns[p, M_END]) for p in went if int(mns[p, M_END])]
            if ends:
                print(f"  merge: last end {(max(ends) - t0) / 1e3:.2f} us (row 0 CTAs that waited)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
