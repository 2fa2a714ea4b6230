"""Split plans of different granularity side by side on the GPU (CUDA-graph replays, interleaved rounds,
bf16, one process): does a config run faster with fewer, longer chunks than the planner's default?

    python scripts/plan_sweep.py [--config 64,1,1,16,1024 ...] [--num-sms 132 --num-sms 32 ...]
                                 [--mode 2wg --mode 2wg-l2-short16] [--replays 300] [--passes 2] [--json F]

For each config, each ``--num-sms`` value plans an ``mla.MLADecoder(num_sms=N)`` (the planner's rule
with N SMs: fewer parts, so longer chunks); plans that come out the same are timed once. Each plan runs
with each ``--mode`` (the kernel classes of ``scripts/entry_ab.py``), all captured in their own graphs
on the same inputs and timed in interleaved rounds. Printed per plan: its chunks (count x tiles) and
busy CTAs, the median us of each mode and the paired ratio against the first plan's first mode.
Outputs are checked against the first graph's (bf16 rounding: the summation order changes with the
plan) and for finiteness.
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

CONFIGS = ((64, 1, 1, 16, 1024), (64, 1, 1, 16, 16384), (64, 1, 1, 128, 16384), (64, 8, 1, 64, 4096))
MAX_DIFF = 2e-2  # outputs are ~0.1 in bf16; two summation orders differ by a few ulps


def describe(num_splits, metadata) -> str:
    """``count x tiles`` of the plan's chunks (most common sizes first) and its busy parts."""
    sizes = collections.Counter()
    busy = 0
    for row in metadata.tolist():
        br, bb, er, eb = row[:4]
        if er < br:
            continue
        busy += 1
        if br == er:
            sizes[eb - bb] += 1
        else:
            sizes["multi"] += 1
    chunks = int(num_splits[-1])
    return f"{chunks} chunks ({', '.join(f'{n}x{t}' for t, n in sizes.most_common(3))}), {busy} parts busy"


def measure(cfg, sms_values, modes, replays, passes, compiled):
    import torch

    import entry_ab
    import mla
    from perf_table import bench, runner

    inp = bench.make_inputs(cfg, device="cuda", seed=0)
    graphs, outs, labels, seen = {}, {}, {}, {}
    for n in sms_values:
        dec = mla.MLADecoder(pipeline="2wg", num_sms=n)
        dec.plan(inp.cache_seqlens, num_heads_q=cfg.h_q, seq_len_q=cfg.s_q, num_heads_k=1,
                 page_size=cfg.page_size, dtype=inp.q.dtype, causal=cfg.causal)
        key = (tuple(dec.num_splits.tolist()), tuple(map(tuple, dec.tile_scheduler_metadata.tolist())))
        if key in seen:
            print(f"  num_sms {n}: same plan as num_sms {seen[key]}")
            continue
        seen[key] = n
        entries = {f"n{n}/{mode}": entry for mode, entry in entry_ab.mode_entries(dec, modes, compiled).items()}
        g, o = bench.capture_entries(entries, inp, dec)
        graphs.update(g)
        outs.update(o)
        labels[n] = describe(dec.num_splits.cpu(), dec.tile_scheduler_metadata.cpu())
        print(f"  num_sms {n}: {labels[n]}", flush=True)
    first = next(iter(graphs))
    diffs = {}
    for name, out in outs.items():
        if not bool(torch.isfinite(out).all()):
            raise SystemExit(f"{cfg.label()}: {name} wrote non-finite values")
        diffs[name] = float((out.float() - outs[first].float()).abs().max())
        if diffs[name] > MAX_DIFF:
            raise SystemExit(f"{cfg.label()}: {name} differs from {first} by {diffs[name]:.3e}")
    rows = []
    for p in range(passes):
        samples = bench.time_graphs_interleaved(graphs, replays=replays)
        med = {m: round(statistics.median(s), 2) for m, s in samples.items()}
        paired = {m: round(runner.paired_ratio(samples[m], samples[first]), 4) for m in graphs}
        rows.append(dict(medians=med, paired=paired))
        print(f"  {cfg.label()} pass {p + 1}:", flush=True)
        for m in graphs:
            print(f"    {m:<24} {med[m]:8.2f} us  paired {paired[m]:.4f}", flush=True)
    return dict(config=cfg.label(), plans={str(k): v for k, v in labels.items()}, passes=rows,
                max_abs_diff=diffs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", action="append", default=[], help="page,b,s_q,h_q,seqlen")
    ap.add_argument("--num-sms", type=int, action="append", default=[],
                    help="SM count to plan for (repeatable; default: the device's, then 64, 32, 16, 8, 4)")
    ap.add_argument("--mode", action="append", default=[])
    ap.add_argument("--replays", type=int, default=300)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    import torch

    import entry_ab
    from perf_table import grid

    modes = args.mode or ["2wg"]
    unknown = [m for m in modes if m not in entry_ab.MODES]
    if unknown:
        ap.error(f"unknown mode(s) {unknown}; one of {sorted(entry_ab.MODES)}")
    device_sms = torch.cuda.get_device_properties(0).multi_processor_count
    sms_values = args.num_sms or [device_sms, 64, 32, 16, 8, 4]
    configs = [grid.Config(*(int(x) for x in c.split(","))) for c in args.config] or [grid.Config(*c) for c in CONFIGS]
    print(f"{torch.cuda.get_device_name(0)}, modes {modes}, {args.replays} replays")
    compiled, rows = {}, []
    for cfg in configs:
        print(cfg.label(), flush=True)
        rows.append(measure(cfg, sms_values, modes, args.replays, args.passes, compiled))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(dict(device=torch.cuda.get_device_name(0), modes=modes,
                                                           rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
