"""Run one config's decode a few times through ``MLADecoder`` (planned once), for a profiler to attach.

    MLA_MULTICAST=0 ncu -k regex:MLADecode --launch-skip 2 --launch-count 1 --metrics ... \\
        python scripts/profile_decode.py --config 64,128,1,128,4096 [--pipeline 2wg] [--calls 3]

``--config page,b,s_q,h_q,seqlen`` (bf16, uniform lengths, pages in a random order as the perf table
builds them). ``--mode M`` (one of ``scripts/entry_ab.py``'s modes) runs that kernel form on the 2wg plan
instead of the library's decoder (the graphs replayed directly, so the profiler sees the decode and merge
kernels of each replay). The decode runs ``--calls`` times with a synchronisation after each, so that a profiler
that skips the first launches (compilation, warm-up) sees a steady-state launch.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="page,b,s_q,h_q,seqlen")
    ap.add_argument("--pipeline", default="2wg")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--mode", help="a kernel form of scripts/entry_ab.py (its MODES)")
    args = ap.parse_args(argv)

    import torch

    import mla
    from perf_table import bench
    from perf_table.grid import Config

    page, b, s_q, h_q, seqlen = (int(x) for x in args.config.split(","))
    cfg = Config(page_size=page, b=b, s_q=s_q, h_q=h_q, seqlen=seqlen)
    if args.mode:
        from entry_ab import mode_entries
        from probe_setup import planned_entry

        inp, dec, _ = planned_entry(cfg)
        graphs, _ = bench.capture_entries(mode_entries(dec, [args.mode], {}), inp, dec)
        for _ in range(args.calls):
            graphs[args.mode].replay()
            torch.cuda.synchronize()
        print(f"{args.config}: {args.calls} replays of mode {args.mode}")
        return 0
    inp = bench.make_inputs(cfg)
    fn = bench.make_decode_fn(mla, args.pipeline, cfg, inp)
    for _ in range(args.calls):
        fn()
        torch.cuda.synchronize()
    print(f"{args.config}: {args.calls} decodes ({fn.variant})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
