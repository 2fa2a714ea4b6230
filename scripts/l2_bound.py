"""How much of a config's decode time is waiting for HBM: the same kernel on a block table whose pages come
from a small pool (so every K tile is an L2 hit after its first read) beside the normal random table.

    python scripts/l2_bound.py [--config 64,128,1,128,4096 ...] [--pool 64 ...] [--replays 300]
                               [--passes 2] [--mode 2wg --mode 2wg-qk-ahead ...] [--json F]

For each config one ``MLADecoder`` is planned and one decode entry compiled (``entry_ab.MODES``); the
entry is captured in one CUDA graph per block table:
- ``hbm``: the benchmark's inputs (``perf_table.bench.make_inputs``: pages in a random order, each read once);
- ``pool P``: the same cache, q and plan, with request r's page j replaced by ``pool[(r * max_pages + j) % P]``
  (the first P page ids of the table), so the kernel does the same work on the same number of tiles but
  reads at most P distinct pages (P = 64: 4.7 MB, L2-resident on a Hopper part).
Every ``--mode`` (``entry_ab.MODES``: kernel forms) runs on every table, all graphs in the same interleaved
rounds; printed: medians and the paired ratio of each graph over the first mode's ``hbm`` graph (for one
mode the kernel and plan are the same; only where the bytes come from differs). A ratio well below 1 says the K loads' latency or bandwidth bounds the
config; about 1 says the kernel's own work does.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

CONFIGS = ((64, 128, 1, 128, 4096), (64, 128, 2, 128, 4096), (64, 64, 1, 128, 1024), (64, 1, 1, 128, 16384),
           (64, 8, 1, 64, 4096))


def pooled(inp, pool: int):
    """``inp`` with its block table drawn from the first ``pool`` page ids of its own table."""
    import torch

    bt = inp.block_table
    ids = bt.flatten()
    pool_ids = ids[:pool]
    idx = torch.arange(ids.numel(), device=bt.device) % pool
    return dataclasses.replace(inp, block_table=pool_ids[idx].reshape(bt.shape).contiguous())


def measure(cfg, modes, pools, replays: int, passes: int, compiled: dict) -> dict:
    import mla
    from entry_ab import mode_entries
    from perf_table import bench, runner

    inp = bench.make_inputs(cfg, device="cuda", seed=0)
    dec = mla.MLADecoder(pipeline="2wg")
    dec.plan(inp.cache_seqlens, num_heads_q=cfg.h_q, seq_len_q=cfg.s_q, num_heads_k=1, page_size=cfg.page_size,
             dtype=inp.q.dtype, causal=cfg.causal)
    entries = mode_entries(dec, modes, compiled)
    tables = [("hbm", inp)] + [(f"pool{p}", pooled(inp, p)) for p in pools]
    graphs = {}
    for name, tin in tables:
        g, _ = bench.capture_entries({f"{m}/{name}": entries[m] for m in modes}, tin, dec)
        graphs.update(g)
    ref = f"{modes[0]}/hbm"
    rows = []
    for i in range(passes):
        samples = bench.time_graphs_interleaved(graphs, replays=replays)
        med = {m: round(statistics.median(s), 2) for m, s in samples.items()}
        paired = {m: round(runner.paired_ratio(samples[m], samples[ref]), 4) for m in graphs if m != ref}
        rows.append(dict(medians=med, paired=paired))
        print(f"  {cfg.label():<26} pass {i + 1}: " + ", ".join(f"{m} {v:.2f}" for m, v in med.items())
              + f"  over {ref}: " + ", ".join(f"{m} {r:.4f}" for m, r in paired.items()), flush=True)
    del tables
    return dict(config=cfg.label(), modes=modes, passes=rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", action="append", default=[], help="page,b,s_q,h_q,seqlen")
    ap.add_argument("--pool", type=int, action="append", default=[], help="distinct pages (default 64)")
    ap.add_argument("--mode", action="append", default=[])
    ap.add_argument("--replays", type=int, default=300)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    from perf_table import grid

    configs = [grid.Config(*(int(x) for x in c.split(","))) for c in args.config] or [grid.Config(*c) for c in CONFIGS]
    compiled = {}
    modes = args.mode or ["2wg"]
    rows = [measure(cfg, modes, args.pool or [64], args.replays, args.passes, compiled) for cfg in configs]
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(dict(rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
