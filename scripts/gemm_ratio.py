"""The compute-bound decode rows against a large bf16 GEMM on the same card, in the same clock state (diagnostic)

    python scripts/gemm_ratio.py [--config 64,128,2,128,4096 ...] [--replays 100] [--sustain 5] [--gemm-n 8192]
                                 [--variant 2wg] [--sustain-each S] [--copy-mb 1024] [--l2-twin]

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

``--variant``: the library's pipeline (default 2wg; ``auto`` runs what the flag picks per shape).
``--sustain-each S``: then each graph alone for S seconds while ``nvidia-smi`` samples the SM clock and the power
(``flashmla_pair.sustained``), with ``--copy-mb`` MB device-to-device copies beside them as an HBM-only load. Why:
on a power-capped card a compute-bound decode's time is its energy per call over the cap, so the GEMM's energy per
FLOP under the same cap is a practical floor for a decode's tensor work (large tiles, few operand bytes
per FLOP); the copy's power shows what streaming the
KV cache from HBM draws on top. Prints per graph: us, MHz, W, energy per call (mJ), pJ per FLOP (per byte for the
copy) and, for a decode, its energy over the GEMM's for the same FLOPs. ``--l2-twin``: each decode also with every
request reading request 0's pages (its KV from L2, not HBM), which shows what streaming the cache costs in energy.
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
sys.path.insert(0, str(ROOT / "scripts"))

from order_probe import sm_clock_reader  # noqa: E402  (imports pipelines first: it pins the DSL's target arch)

DEFAULT = ("64,128,1,128,4096", "64,128,2,128,4096", "64,128,1,128,1024", "64,64,1,128,1024")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", default=[], help="page,b,s_q,h_q,seqlen")
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--sustain", type=float, default=5.0, help="seconds of GEMM replays before the second pass")
    ap.add_argument("--gemm-n", type=int, default=8192)
    ap.add_argument("--variant", default="2wg", help="the library's pipeline (auto: the flag's pick per shape)")
    ap.add_argument("--sustain-each", type=float, default=0.0, metavar="SECONDS",
                    help="then each graph alone for this long, with the SM clock and the power sampled")
    ap.add_argument("--copy-mb", type=int, default=1024, help="size of the HBM copy timed with --sustain-each")
    ap.add_argument("--l2-twin", action="store_true",
                    help="beside each decode, its twin whose requests all read request 0's pages (same work, the KV "
                    "from L2 instead of HBM)")
    args = ap.parse_args(argv)

    import torch

    import mla
    from perf_table import bench, grid, runner
    from perf_table.formulas import decode_flops, tflops

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
        fn = bench.make_decode_fn(mla, args.variant, cfg, inp)
        name = f"{cfg.label()} {fn.variant}"
        graphs[name] = bench.capture_graph(fn, runner.WARMUP_REPLAYS)
        flops[name] = decode_flops(cfg.s_q, cfg.h_q, inp.total_kv_tokens)
        if args.l2_twin:
            # Every request reads request 0's pages: the same FLOPs, lengths and plan, but one request's KV
            # (seqlen * 1152 bytes, in L2) instead of b requests' from HBM. Its output is not checked.
            twin = dataclasses.replace(inp, block_table=inp.block_table[:1].expand_as(inp.block_table).contiguous())
            keep.append(twin)
            graphs[name + " L2"] = bench.capture_graph(bench.make_decode_fn(mla, args.variant, cfg, twin),
                                                      runner.WARMUP_REPLAYS)
            flops[name + " L2"] = flops[name]

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
    if args.sustain_each > 0:
        sustained_energy(graphs, flops, args, bench, runner)
    return 0


def sustained_energy(graphs, flops, args, bench, runner):
    """Each graph alone under its own sustained load: time, clock, power, energy per call and per FLOP."""
    import torch

    from flashmla_pair import sustained

    words = args.copy_mb * (1 << 20) // 4
    src = torch.empty(words, device="cuda", dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    copy = bench.capture_graph(lambda: dst.copy_(src), runner.WARMUP_REPLAYS)
    print(f"each graph alone for {args.sustain_each:.1f} s (medians over the second half):", flush=True)
    for k, graph in graphs.items():  # the GEMM first (inserted first): each decode's ratio is to it
        us, mhz, watts = sustained(graph, args.sustain_each)
        pj = watts * us * 1e-6 / flops[k] * 1e12
        if k == "gemm":
            gemm_pj = pj
        ratio = "" if k == "gemm" else f"  {pj / gemm_pj:.3f} of the GEMM's energy for its FLOPs"
        print(f"  {k:<26} {us:8.1f} us {mhz:6.0f} MHz {watts:5.0f} W {watts * us * 1e-3:8.2f} mJ "
              f"{pj:6.3f} pJ/FLOP{ratio}", flush=True)
    us, mhz, watts = sustained(copy, args.sustain_each)
    moved = 2 * words * 4  # read + write
    print(f"  {'copy ' + str(args.copy_mb) + ' MB':<26} {us:8.1f} us {mhz:6.0f} MHz {watts:5.0f} W "
          f"{moved / us * 1e-3:8.0f} GB/s {watts * us * 1e-6 / moved * 1e12:6.1f} pJ/byte", flush=True)


if __name__ == "__main__":
    sys.exit(main())
