"""Does a row's time in the perf runner depend on what ran before it? (diagnostic)

    python scripts/order_probe.py [--config 64,128,1,128,1024 ...] [--replays 100] [--idle 2]

The perf runner measures each config's rows (2wg with multicast on, and off where there is a cluster)
right after the previous config's, by ``bench.time_graphs_interleaved`` on graphs of
``bench.make_decode_fn`` (``perf_table/runner.py``). This measures the given configs in the given order
the same way, in one process, then the last config again after ``--idle`` seconds with the GPU idle,
and prints each measurement's medians. On an H200 b128 s1 h128 1024 read 79-91 us in four full grids
where it measured right after b128 s1 h64 16384, and 69 us in ``scripts/clock_probe.py`` on a fresh
process (docs/perf-notes.md, nineteenth session).
"""
from __future__ import annotations

import argparse
import dataclasses
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT = ("64,128,1,64,1024", "64,128,1,64,4096", "64,128,1,64,16384", "64,128,1,128,1024")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", default=[], help="page,b,s_q,h_q,seqlen (in order)")
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--idle", type=float, default=2.0)
    ap.add_argument("--grid-before", type=int, default=0, metavar="N",
                    help="first measure the N page-64 grid configs (perf_table.grid.full_grid order, quietly) "
                         "that the runner measures before the first --config; -1: all of them")
    args = ap.parse_args(argv)

    import torch

    import mla
    import pipelines
    from perf_table import bench, grid, runner

    def measure(spec, label: str, quiet: bool = False):
        base = spec if isinstance(spec, grid.Config) else grid.Config(*(int(x) for x in spec.split(",")))
        inp = bench.make_inputs(base, seed=runner.SEED)
        rows = [dataclasses.replace(base, multicast=True), dataclasses.replace(base, multicast=False)] \
            if pipelines.multicast_cluster(base.page_size, base.h_q * base.s_q) > 1 else [base]
        graphs = {}
        for c in rows:
            with runner.multicast_env(c.multicast):
                fn = bench.make_decode_fn(mla, "2wg", c, inp)
                graphs[str(c.multicast)] = bench.capture_graph(fn, runner.WARMUP_REPLAYS)
        samples = bench.time_graphs_interleaved(graphs, args.replays)
        if quiet:
            del graphs
            torch.cuda.empty_cache()
            return
        print(f"  {label:<8} {base.label():<26} " + ", ".join(
            f"mc {k}: median {statistics.median(v):.1f} min {min(v):.1f}" for k, v in samples.items()), flush=True)
        del graphs
        torch.cuda.empty_cache()

    specs = args.config or list(DEFAULT)
    print(torch.cuda.get_device_name(0), f"{args.replays} replays per row", flush=True)
    if args.grid_before:
        first = grid.Config(*(int(x) for x in specs[0].split(",")))
        order = [c for c in grid.full_grid((first.page_size,))]
        before = order[:order.index(first)] if first in order else order
        before = before if args.grid_before < 0 else before[-args.grid_before:]
        t0 = time.perf_counter()
        for c in before:
            measure(c, "", quiet=True)
        print(f"  measured {len(before)} grid configs first ({time.perf_counter() - t0:.0f} s)", flush=True)
    for spec in specs:
        measure(spec, "in order")
    time.sleep(args.idle)
    measure(specs[-1], f"idle {args.idle:g}s")
    measure(specs[-1], "again")
    return 0


if __name__ == "__main__":
    sys.exit(main())
