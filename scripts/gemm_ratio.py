"""The compute-bound decode rows against a large bf16 GEMM on the same card, in the same clock state (diagnostic)

    python scripts/gemm_ratio.py [--config 64,128,2,128,4096 ...] [--replays 100] [--sustain 5] [--gemm-n 8192]

Issue 8's per-row bars are absolute times; what they ask of the tensor cores depends on the clock the
card runs at, which depends on its recent load (docs/perf-notes.md, nineteenth session: about 1.6 GHz
after a few seconds of tensor work, 1.83-1.98 GHz rested). This captures one CUDA graph of
``torch.mm`` on two ``--gemm-n`` square bf16 matrices (the GEMM the anchors' roofline names) and one
graph per config of the library's decode (``bench.make_decode_fn``, 2wg, the library's default cluster
choice), then measures all of them interleaved (``bench.time_graphs_interleaved``) twice: after two
seconds idle ("rested") and right after ``--sustain`` seconds of GEMM replays ("sustained"), reading the
SM clock after each (``order_probe.sm_clock_reader``). It prints each graph's median time, its TFLOP/s
(``perf_table.formulas.tflops``; the decode's counts 2 * b * s_q * h_q * seqlen * (576 + 512)), and the
decode's TFLOP/s as a fraction of the GEMM's measured in the same rounds.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from order_probe import sm_clock_reader  # noqa: E402  (imports pipelines first: it pins the DSL's target arch)

DEFAULT = ("64,128,1,128,4096", "64,128,2,128,4096", "64,128,1,128,1024", "64,64,1,128,1024")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", default=[], help="page,b,s_q,h_q,seqlen")
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--sustain", type=float, default=5.0, help="seconds of GEMM replays before the second pass")
    ap.add_argument("--gemm-n", type=int, default=8192)
    args = ap.parse_args(argv)

    import torch

    import mla
    from perf_table import bench, grid, runner
    from perf_table.formulas import tflops

    sm_mhz = sm_clock_reader()

    n = args.gemm_n
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(a)
    graphs = {"gemm": bench.capture_graph(lambda: torch.mm(a, b, out=c), runner.WARMUP_REPLAYS)}
    flops = {"gemm": 2 * n ** 3}
    keep = []
    for spec in args.config or list(DEFAULT):
        cfg = grid.Config(*(int(x) for x in spec.split(",")))
        inp = bench.make_inputs(cfg, seed=runner.SEED)
        keep.append(inp)
        name = cfg.label()
        graphs[name] = bench.capture_graph(bench.make_decode_fn(mla, "2wg", cfg, inp), runner.WARMUP_REPLAYS)
        flops[name] = 2 * cfg.b * cfg.s_q * cfg.h_q * cfg.seqlen * (576 + 512)

    print(torch.cuda.get_device_name(0), f"{args.replays} replays per graph, interleaved", flush=True)
    for phase in ("rested", "sustained"):
        if phase == "rested":
            torch.cuda.synchronize()
            time.sleep(2.0)
        else:
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < args.sustain:
                for _ in range(50):
                    graphs["gemm"].replay()
                torch.cuda.synchronize()
        samples = bench.time_graphs_interleaved(graphs, args.replays)
        mhz = sm_mhz()
        med = {k: statistics.median(v) for k, v in samples.items()}
        gemm_tf = tflops(flops["gemm"], med["gemm"])
        print(f"{phase}: SM clock right after {mhz:.0f} MHz; gemm {n}^3 {med['gemm']:.1f} us = {gemm_tf:.0f} TFLOP/s",
              flush=True)
        for k in graphs:
            if k == "gemm":
                continue
            tf = tflops(flops[k], med[k])
            print(f"  {k:<26} {med[k]:8.1f} us  {tf:5.0f} TFLOP/s  {tf / gemm_tf:.3f} of the GEMM", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
