"""Where a 64-token tile's cycles go in 2wg's 64-row kernel: per-phase SM cycles (diagnostic).

    python scripts/phase_probe.py [--config 64,128,1,128,4096 ...] [--replays 50]

The library's decode entry for each config is compiled once more with a subclass of the 64-row kernel whose
thread 0 (WG0) and thread 128 (WG1) add ``%clock64`` into per-CTA sums at these points of every tile (one
``red.global.add.u64`` each, with a count), so that the difference of two sums over the tile count is the
mean time between the two points:

- WG0: ``qk issue`` (K tile landed, before its S = Q.K^T wgmma), ``qk done`` (that group retired: the
  probe waits for it right after the issue, where the kernel waits anyway), ``hand`` (softmax and the bf16
  conversion done, before the P_EMPTY wait and P's stores), ``pv0 issue`` (P stored, O's rescale and a
  tail's V zeroing done), ``handed`` (the proxy fence and P_FULL, which the kernel issues after its P.V:
  ``MLADecode2WG.p_fence_after_pv``), ``pv0 done`` (stamped at the K stage's release, right after the
  kernel's own wait for that P.V);
- WG1: ``pv1 issue`` (P_FULL passed, O rescaled, K tile waited for), ``pv1 done`` (at its release);
- WG0: ``k wait`` (before its wait for the K tile's full barrier), so ``k wait`` to ``qk issue`` is how long
  WG0 waits for the tile's bytes (plus the stamp).

Also the earliest ``qk issue`` and latest ``pv0 done`` of each CTA (``atom.min`` / ``atom.max``), so that the
tile period is ``(last pv0 done - first qk issue - mean(pv0 done - qk issue)) / (tiles - 1)``: that includes
the chunk epilogues between a CTA's chunks. The graph of one decode (with its merge) is replayed
``--replays`` times; sums are reset before the last replay, whose numbers are printed (cycles, the mean over
the CTAs with tiles). Not a benchmark: the stamps add a few instructions per tile.
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
from cutlass import const_expr  # noqa: E402
from cutlass._mlir.dialects import llvm  # noqa: E402
from cutlass.cute.nvgpu import warpgroup  # noqa: E402

from pipelines.variant_2wg import MLADecode2WG  # noqa: E402
from probe_setup import cta_row, hook_loader  # noqa: E402

EVENTS = ("qk issue", "qk done", "hand", "handed", "pv0 issue", "pv0 done", "pv1 issue", "pv1 done", "k wait")
QK_ISSUE, QK_DONE, HAND, HANDED, PV0_ISSUE, PV0_DONE, PV1_ISSUE, PV1_DONE, K_WAIT = range(len(EVENTS))
FIRST, LAST = 2 * len(EVENTS), 2 * len(EVENTS) + 1  # earliest qk issue, latest pv0 done
SLOTS = 2 * len(EVENTS) + 2  # per CTA: (sum, count) per event, first, last
MAX_CTAS = 1024


def _add_clock(base: int, event: int):
    """``%clock64`` into this CTA's sum of ``event``, and 1 into its count; with the first / last too
    for ``qk issue`` / ``pv0 done``."""
    row = cta_row(base, SLOTS)
    addr = row + event * 16
    extra = ""
    if event == QK_ISSUE:
        extra = f"atom.global.min.u64 d, [$1+{FIRST * 8}], c;\n"
    elif event == PV0_DONE:
        extra = f"atom.global.max.u64 d, [$1+{LAST * 8}], c;\n"
    llvm.inline_asm(None, [addr.ir_value(), row.ir_value()],
                    "{\n.reg .u64 c, d;\nmov.u64 c, %clock64;\nred.global.add.u64 [$0], c;\n"
                    "red.global.add.u64 [$0+8], 1;\n" + extra + "}", "l,l", has_side_effects=True)


def probe_class(base: int):
    """The 64-row 2wg kernel with the module docstring's stamps, adding into the buffer at ``base``."""

    class Probed(MLADecode2WG):
        # One barrier pair per K stage (``MLADecode2WG.kv_groups``): the stamps assume one K wait before an
        # unbroken QK chain (``issue_qk``) and one release per warpgroup and tile.
        kv_groups = 1

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)

            @cute.jit
            def released():
                # Both warpgroups release a K stage right after waiting for their P.V of it.
                tidx, _, _ = cute.arch.thread_idx()
                if tidx == 0:
                    _add_clock(base, PV0_DONE)
                if tidx == 128:
                    _add_clock(base, PV1_DONE)

            @cute.jit
            def waiting():
                tidx, _, _ = cute.arch.thread_idx()
                if tidx == 0:
                    _add_clock(base, K_WAIT)

            hook_loader(self, released, waiting)

        @cute.jit
        def issue_qk(self, acc_s, tSrQ, tSrK, stage):
            tidx, _, _ = cute.arch.thread_idx()
            if tidx == 0:
                _add_clock(base, QK_ISSUE)
            super().issue_qk(acc_s, tSrQ, tSrK, stage)
            warpgroup.wait_group(0)  # the caller waits for it next anyway
            if tidx == 0:
                _add_clock(base, QK_DONE)

        @cute.jit
        def store_p_for_wg1(self, rP, tPsP, tScS, row_scale, s_row_scale, wg_tidx):
            if wg_tidx == 0:
                _add_clock(base, HAND)
            super().store_p_for_wg1(rP, tPsP, tScS, row_scale, s_row_scale, wg_tidx)

        @cute.jit
        def publish_p(self):
            super().publish_p()
            tidx, _, _ = cute.arch.thread_idx()
            if tidx == 0:
                _add_clock(base, HANDED)

        @cute.jit
        def issue_pv(self, acc_o, tOrP, tOrV, stage, p_in_registers: cutlass.Constexpr[bool] = False):
            # No wait here: WG0 publishes P after this issue, so a wait would serialize WG1's P.V behind
            # WG0's; the P.V's end is stamped at the stage release that follows the kernel's own wait.
            tidx, _, _ = cute.arch.thread_idx()
            if tidx % 128 == 0:
                _add_clock(base, PV0_ISSUE if const_expr(p_in_registers) else PV1_ISSUE)
            super().issue_pv(acc_o, tOrP, tOrV, stage, p_in_registers)

    if not Probed.p_fence_after_pv:
        raise SystemExit("phase_probe stamps the p_fence_after_pv order (P_FULL after WG0's P.V issue)")
    return Probed


def report(label: str, buf, last_us: float) -> None:
    rows = buf.double()
    sums, counts = rows[:, 0:2 * len(EVENTS):2], rows[:, 1:2 * len(EVENTS):2]
    used = counts[:, QK_ISSUE] > 0
    if not bool((counts[used] == counts[used, QK_ISSUE:QK_ISSUE + 1]).all()):
        print(f"{label}: event counts differ within a CTA; not reported")
        return
    n = counts[used, QK_ISSUE]
    mean = sums[used] / n[:, None]  # per CTA, mean clock of each event

    def gap(a, b):
        return float((mean[:, b] - mean[:, a]).mean())

    busy = mean[:, PV0_DONE] - mean[:, QK_ISSUE]
    period = ((rows[used, LAST] - rows[used, FIRST]) - busy) / (n - 1).clamp(min=1)
    print(f"{label}: {int(used.sum())} CTAs, {float(n.mean()):.1f} tiles each (mean); replay {last_us:.1f} us")
    print(f"  tile period {float(period.mean()):.0f} cycles (median CTA {float(period.median()):.0f})")
    parts = [("QK (issue to retired)", QK_ISSUE, QK_DONE), ("softmax + bf16", QK_DONE, HAND),
             ("P_EMPTY wait, P stores, O rescale / V zeroing", HAND, PV0_ISSUE),
             ("fence + P_FULL after WG0's P.V issue", PV0_ISSUE, HANDED), ("WG0 P.V (issue to retired)", PV0_ISSUE, PV0_DONE),
             ("WG1 P.V issue after WG0's", PV0_ISSUE, PV1_ISSUE), ("WG1 P.V (issue to retired)", PV1_ISSUE, PV1_DONE),
             ("WG0 P.V retired to WG1's", PV0_DONE, PV1_DONE), ("WG0 K full wait (k wait to qk issue)", K_WAIT, QK_ISSUE)]
    for name, a, b in parts:
        print(f"  {name:<52} {gap(a, b):8.0f}")
    print(f"  {'WG0 P.V retired to next QK issue (period - busy)':<52} {float((period - busy).mean()):8.0f}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", default=[], help="page,b,s_q,h_q,seqlen (default 64,128,1,128,4096)")
    ap.add_argument("--replays", type=int, default=50)
    args = ap.parse_args(argv)

    import torch

    from perf_table import grid
    from probe_setup import probe_graph, replay_us

    print(torch.cuda.get_device_name(0), flush=True)
    for spec in args.config or ["64,128,1,128,4096"]:
        cfg = grid.Config(*(int(x) for x in spec.split(",")))
        if cfg.h_q * cfg.s_q <= 32:
            raise SystemExit(f"{cfg.label()}: the narrow kernel runs this shape; this probe is the 64-row kernel's")
        _, buf, graph = probe_graph(cfg, probe_class, (MAX_CTAS, SLOTS))
        times = []
        for i in range(args.replays):
            if i == args.replays - 1:
                buf.zero_()
                buf[:, FIRST] = torch.iinfo(torch.int64).max
            times.append(replay_us(graph))
        report(f"{cfg.label()} (median replay {statistics.median(times):.1f} us)", buf.cpu(), times[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
