"""Our decode beside an installed FlashMLA, paired on one card (diagnostic)

    python scripts/flashmla_pair.py [--config 64,128,1,128,4096 ...] [--grid] [--replays 100] [--variant 2wg]
                                    [--also seesaw ...] [--mc-off] [--rest S] [--json F] [--commit SHA]

The perf table's FlashMLA column comes from another run on another machine of the same kind, and the
compute-bound rows move by up to 10% with the card's recent load (docs/perf-notes.md, nineteenth
session). This times FlashMLA and the library in the same process, on the same inputs, in interleaved
rounds (``perf_table.bench.time_graphs_interleaved``), so a ratio carries no machine or clock difference.

FlashMLA is whatever ``import flash_mla`` finds (its public API: ``get_mla_metadata`` then
``flash_mla_with_kvcache``, called as the anchors were: metadata made once and reused, page size 64, one
kv head; both the older API that returns metadata tensors and the newer one that fills them on the first
call work). Nothing of FlashMLA ships with this project; without it the script says so and exits 2.

Per config (``perf_table.grid.Config``; ``--grid``: the page-64 full grid): the perf runner's inputs
(``bench.make_inputs``, its seed), one call of each to compare the outputs (max abs difference printed;
above 1e-2 the config is reported and not timed), then one CUDA graph each, replayed interleaved:
FlashMLA; the library's ``--variant`` (2wg by default) as ``bench.make_decode_fn`` runs it, with its default
cluster choice; each ``--also`` variant; with ``--mc-off``, ``--variant`` with ``MLA_MULTICAST=0`` where the
shape has a cluster. Prints the medians and FlashMLA's time over each (above 1: ours is faster), then the
geomean over ``--variant``'s rows and the count below 0.92 (issue 8's floor, here against a paired FlashMLA).
``--rest S``: after that timing, the GPU idles S seconds and the same graphs are timed again (interleaved, as
before): both kernels from a rested clock, a condition the perf runner's back-to-back configs never see (a few
seconds of load bring an H200's SM clock from about 1.9 to about 1.6 GHz and a second idle brings it back,
docs/perf-notes.md, nineteenth session); the anchors' history is not known, so this shows how far the condition
alone moves FlashMLA's rows against its anchor column and ours against the bars.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipelines import paged_kv  # noqa: E402,F401  (first: it pins the DSL's target arch)

MAX_DIFF = 1e-2


def sustained(graph, seconds: float, batch: int = 20) -> tuple[float, float, float]:
    """``graph`` replayed back to back for ``seconds`` (batches of ``batch`` between CUDA events) while
    ``nvidia-smi`` samples the SM clock and the power draw every 50 ms. Returns the medians over the second half
    (the clock settles under a kernel's own load in well under a second): us per replay, MHz, W. Why: a
    kernel's clock follows its own power draw, so two kernels' times compare as cycles only at their own clocks
    (interleaved replays share one clock state)."""
    import torch

    from smi_sampler import smi_samples

    times = []
    with smi_samples("clocks.sm,power.draw", 50, units=False) as lines:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(batch):
                graph.replay()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) * 1e3 / batch)
    samples = [tuple(float(x) for x in line.split(",")) for line in lines if line.count(",") == 1]
    half = samples[len(samples) // 2:] or [(float("nan"), float("nan"))]
    return (statistics.median(times[len(times) // 2:]), statistics.median(m for m, _ in half),
            statistics.median(w for _, w in half))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", default=[], help="page,b,s_q,h_q,seqlen[,varlen 0|1]")
    ap.add_argument("--grid", action="store_true", help="every page-64 config of the perf grid")
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--variant", default="2wg", help="the library's pipeline timed as 'ours' (default 2wg)")
    ap.add_argument("--also", action="append", default=[], metavar="VARIANT",
                    help="another pipeline to time beside them (its own column, named by the variant)")
    ap.add_argument("--mc-off", action="store_true", help="also time --variant with MLA_MULTICAST=0 where there is a cluster")
    ap.add_argument("--sustain", type=float, default=0.0, metavar="SECONDS",
                    help="then replay each graph alone for this long while nvidia-smi samples the SM clock and the "
                    "power (every 50 ms): its time, clock and cycles per call under its own sustained load")
    ap.add_argument("--rest", type=float, default=0.0, metavar="SECONDS",
                    help="then idle this long and time the same graphs again (rested clock; rows get rested_* keys)")
    ap.add_argument("--json", default=None, help="write the rows here (perf_table/paired/ holds such files; "
                    "python -m perf_table regenerate shows them)")
    ap.add_argument("--commit", default=None, help="the commit measured, for --json (default: git's, if any)")
    args = ap.parse_args(argv)
    try:
        import flash_mla
    except ImportError as exc:
        print(f"flash_mla is not importable ({exc}): install FlashMLA to pair against it", file=sys.stderr)
        return 2

    import torch

    import mla
    import pipelines
    from perf_table import bench, grid, regenerate, runner

    if args.grid:
        cfgs = grid.full_grid((64,))
    else:
        cfgs = [grid.Config(*(int(x) for x in s.split(","))) for s in args.config]
    print(torch.cuda.get_device_name(0), f"{args.replays} replays per graph, interleaved; FlashMLA from "
          f"{pathlib.Path(flash_mla.__file__).parent}", flush=True)
    rows = []
    t0 = time.perf_counter()
    for cfg in cfgs:
        inp = bench.make_inputs(cfg, seed=runner.SEED)
        meta = flash_mla.get_mla_metadata(inp.cache_seqlens, cfg.s_q * cfg.h_q, 1)

        def flash_fn(inp=inp, meta=meta, causal=cfg.causal):
            return flash_mla.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, 512,
                                                    *meta, causal=causal)

        ref = flash_fn()[0]
        outs = {"ours": torch.empty_like(ref)}
        fns = {"flash": flash_fn, "ours": bench.make_decode_fn(mla, args.variant, cfg, inp, out=outs["ours"])}
        for extra in args.also:
            outs[extra] = torch.empty_like(ref)
            fns[extra] = bench.make_decode_fn(mla, extra, cfg, inp, out=outs[extra])
        if args.mc_off and pipelines.multicast_cluster(cfg.page_size, cfg.h_q * cfg.s_q, args.variant) > 1:
            outs["ours-mc-off"] = torch.empty_like(ref)
            with runner.multicast_env(False):
                fns["ours-mc-off"] = bench.make_decode_fn(mla, args.variant, cfg, inp, out=outs["ours-mc-off"])
        graphs = {}
        for name, fn in fns.items():  # capture_graph calls fn eagerly first: each out holds its result
            with runner.multicast_env(False if name == "ours-mc-off" else None):
                graphs[name] = bench.capture_graph(fn, runner.WARMUP_REPLAYS)
        # ours_ran: the variant "ours" ran (what ``auto`` resolved to for this config)
        row = dict(config=[cfg.page_size, cfg.b, cfg.s_q, cfg.h_q, cfg.seqlen, int(cfg.varlen)],
                   ours_ran=getattr(fns["ours"], "variant", args.variant))
        for name, out in outs.items():
            row[f"maxdiff_{name}"] = (out.float() - ref.float()).abs().max().item()
        rows.append(row)
        if any(k.startswith("maxdiff") and not v <= MAX_DIFF for k, v in row.items()):
            print(f"{cfg.label():<30} outputs differ from FlashMLA's: {row}; not timed", flush=True)
        else:
            samples = bench.time_graphs_interleaved(graphs, args.replays)
            med = {k: statistics.median(v) for k, v in samples.items()}
            row.update({f"{k}_us": v for k, v in med.items()})
            extra = "".join(f"  {k} {med[k]:8.1f} x{med['flash'] / med[k]:.3f}" for k in med if k not in ("flash", "ours"))
            print(f"{cfg.label():<30} flash {med['flash']:8.1f}  ours {med['ours']:8.1f}  x{med['flash'] / med['ours']:.3f}"
                  f"{extra}  maxdiff {row['maxdiff_ours']:.1e}", flush=True)
            if args.rest > 0:
                torch.cuda.synchronize()
                time.sleep(args.rest)
                rested = {k: statistics.median(v) for k, v in bench.time_graphs_interleaved(graphs, args.replays).items()}
                row.update({f"rested_{k}_us": v for k, v in rested.items()})
                print(f"  rested {args.rest:g} s: " + "  ".join(f"{k} {v:8.1f}" for k, v in rested.items())
                      + f"  x{rested['flash'] / rested['ours']:.3f}", flush=True)
            if args.sustain > 0:
                for name, graph in graphs.items():
                    row[f"sustained_{name}"] = sustained(graph, args.sustain)
                    us, mhz, watts = row[f"sustained_{name}"]
                    print(f"  sustained {name:<8} {us:8.1f} us  {mhz:6.0f} MHz  {watts:5.0f} W  "
                          f"{us * mhz / 1e3:8.1f} k cycles", flush=True)
        del graphs, fns, outs, inp, ref
        torch.cuda.empty_cache()
    summary = regenerate.paired_summary(rows)
    if summary["timed"]:
        print(f"{summary['timed']} of {len(rows)} configs timed in {time.perf_counter() - t0:.0f} s: geomean flash/ours "
              f"{summary['geomean']:.3f}, below {regenerate.PAIRED_FLOOR}: {summary['below']}, "
              f"min {summary['lowest']:.3f}", flush=True)
    if args.json:
        header = dict(device=torch.cuda.get_device_name(0), date=time.strftime("%Y-%m-%d", time.gmtime()),
                      commit=runner.git_info(override=args.commit)["short"],
                      flashmla=getattr(flash_mla, "__version__", "unknown"), replays=args.replays,
                      variant=args.variant)
        pathlib.Path(args.json).write_text(json.dumps(dict(header, rows=rows), indent=1))
    return 0 if summary["timed"] == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
