"""Pipeline variants side by side on one config (CUDA-graph replays, interleaved rounds, bf16, one process).

    python scripts/variant_ab.py [--config 64,128,1,128,4096 ...] [--variant 2wg --variant seesaw]
                                 [--replays 300] [--passes 2] [--json F]

For each config (``page,b,s_q,h_q,seqlen``) every ``--variant`` gets its own ``MLADecoder`` (planned
once, its own ``out``) and one captured graph; the graphs are timed in interleaved rounds
(``perf_table.bench.time_graphs_interleaved``), ``--passes`` times. Printed: each variant's median
and its paired ratio against the first variant (median over rounds of its replay / the first
variant's replay in the same round: ``perf_table.runner.paired_ratio``). Before timing, every
variant's ``out`` is compared with the first variant's (max abs difference; the variants round P
and sum in different orders, so they agree to bf16 rounding, not bit for bit).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
from unittest import mock

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIGS = ((64, 128, 1, 128, 4096), (64, 128, 2, 128, 4096), (64, 128, 1, 128, 1024), (64, 64, 1, 128, 1024),
           (64, 128, 1, 128, 16384), (64, 128, 2, 64, 4096), (64, 32, 2, 64, 16384), (64, 64, 1, 64, 1024),
           (64, 128, 1, 16, 4096), (64, 1, 1, 128, 16384), (64, 8, 1, 64, 4096))


def _parse(v: str) -> tuple[str, dict]:
    """``pipeline@NAME=VALUE,...``: the pipeline and the environment settings it runs under (while it is
    planned, captured and run), e.g. ``2wg@MLA_SPLIT_CLUSTER=2``."""
    pipeline, _, spec = v.partition("@")
    return pipeline, dict(kv.split("=", 1) for kv in spec.split(",") if kv)


def measure(cfg, variants, replays: int, passes: int) -> dict:
    import torch

    import mla
    from perf_table import bench, runner

    inp = bench.make_inputs(cfg, device="cuda", seed=0)
    parsed = {v: _parse(v) for v in variants}
    graphs = {}
    for v, (pipeline, settings) in parsed.items():
        with mock.patch.dict(os.environ, settings):
            graphs[v] = bench.capture_graph(bench.make_decode_fn(mla, pipeline, cfg, inp))
    # The outputs: one eager run of each variant into a fresh tensor.
    ref = None
    diffs = {}
    for v, (pipeline, settings) in parsed.items():
        with mock.patch.dict(os.environ, settings):
            dec = mla.MLADecoder(pipeline=pipeline)
            dec.plan(inp.cache_seqlens, num_heads_q=cfg.h_q, seq_len_q=cfg.s_q, num_heads_k=1, page_size=cfg.page_size,
                     dtype=inp.q.dtype, causal=cfg.causal)
            o = torch.empty(cfg.b, cfg.s_q, cfg.h_q, 512, dtype=inp.q.dtype, device="cuda")
            dec.run(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, out=o)
            torch.cuda.synchronize()
            if not bool(torch.isfinite(o).all()):
                raise SystemExit(f"{cfg.label()}: {v} wrote non-finite values")
            if ref is None:
                ref = o
            diffs[v] = float((o.float() - ref.float()).abs().max())
    rows = []
    for p in range(passes):
        samples = bench.time_graphs_interleaved(graphs, replays=replays)
        med = {v: round(statistics.median(s), 2) for v, s in samples.items()}
        first = variants[0]
        paired = {v: round(runner.paired_ratio(samples[v], samples[first]), 4) for v in variants[1:]}
        rows.append(dict(medians=med, paired=paired))
        print(f"  {cfg.label():<26} pass {p + 1}: " + ", ".join(f"{v} {m:.2f}" for v, m in med.items())
              + "  paired vs " + first + ": " + ", ".join(f"{v} {r:.4f}" for v, r in paired.items())
              + ("  max|diff| " + ", ".join(f"{v} {d:.2e}" for v, d in diffs.items() if v != first) if p == 0 else ""),
              flush=True)
    return dict(config=cfg.label(), passes=rows, max_abs_diff=diffs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", action="append", default=[], help="page,b,s_q,h_q,seqlen")
    ap.add_argument("--variant", action="append", default=[],
                    help="a pipeline, optionally with settings: 2wg@MLA_SPLIT_CLUSTER=2")
    ap.add_argument("--replays", type=int, default=300)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    from perf_table import grid

    variants = args.variant or ["2wg", "seesaw"]
    configs = [grid.Config(*(int(x) for x in c.split(","))) for c in args.config] or [grid.Config(*c) for c in CONFIGS]
    rows = [measure(cfg, variants, args.replays, args.passes) for cfg in configs]
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(dict(variants=variants, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
