"""Timing checks behind the notes (CUDA-graph replays, interleaved rounds, bf16, one process).

    python scripts/timing_checks.py spread [--config 1,128,2,64,4096 ...] [--decoders 4] [--replays 300]
    python scripts/timing_checks.py parts  [--config 64,1,1,16,1024 ...] [--variant 2wg] [--replays 300]
    python scripts/timing_checks.py auto   [--config 64,128,1,128,4096 ...] [--per 0 1] [--passes 3] [--replays 100]
    python scripts/timing_checks.py floor  [--config 64,1,1,128,16384 ...] [--replays 300] [--passes 2]

``spread``: how far apart one kernel's time lands when it is timed through several decoders. For
each config it builds ``--decoders`` decoders of the variant ``pipeline="auto"`` resolves to, plus one
``auto`` decoder (the same kernel), each with its own ``out``, captures one graph per decoder and
times them interleaved (``perf_table.bench.time_graphs_interleaved``), twice; then the same with one
``out`` shared by all of them. The max/min of the medians is the measurement's own spread for one
kernel (what the perf table's "auto within 2%" comparison sits on).

``parts``: graph time of one decode against the number of plan parts (``num_sm_parts`` of the
device, then /2, /4, ... and x2), host-made aligned plans passed to ``flash_mla_with_kvcache``:
where the time of the latency rows goes between the main kernel's width and the merge.

``auto``: the perf runner's group for a config (2wg, 3wg, auto, and both variants with multicast off
where the config runs a cluster), timed the runner's way ``--passes`` times for each ``--per`` (replays
per graph per round; 0 = the runner's default rounds, 1 = graphs alternating replay by replay). For
every pass: auto / the faster variant by medians (the perf table's comparison) and the paired ratio
(median over rounds of auto's replay / the same round's replay of the faster variant).

``floor``: what a graph replay costs with next to no GPU work, beside the decode of each config: graphs
of one and of two one-element torch kernels, timed interleaved with the config's decode graph (the
library's default path) ``--passes`` times. The latency rows' bars are read against this floor: a
replay of the decode is the floor plus the kernels' own span.

``--config`` is ``page,b,s_q,h_q,seqlen``; without it each check runs its default configs.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SPREAD_CONFIGS = ((1, 128, 2, 64, 4096), (1, 128, 1, 16, 4096), (64, 1, 2, 32, 16384), (16, 64, 2, 64, 4096))
AUTO_CONFIGS = ((64, 128, 1, 128, 4096), (16, 64, 2, 128, 4096), (1, 32, 2, 32, 16384), (64, 1, 1, 16, 4096))
PARTS_CONFIGS = ((64, 1, 1, 16, 1024), (64, 1, 1, 16, 16384), (64, 1, 1, 128, 16384), (64, 8, 1, 64, 4096))
FLOOR_CONFIGS = PARTS_CONFIGS


def _medians(graphs: dict, replays: int) -> dict:
    from perf_table import bench

    samples = bench.time_graphs_interleaved(graphs, replays=replays)
    return {name: round(statistics.median(s), 2) for name, s in samples.items()}


def spread(cfg, decoders: int, replays: int) -> list[dict]:
    import torch

    import mla
    from perf_table import bench

    inp = bench.make_inputs(cfg, device="cuda", seed=0)
    variant = bench.make_decode_fn(mla, "auto", cfg, inp).variant
    rows = []
    for shared in (False, True):
        shared_out = torch.empty(cfg.b, cfg.s_q, cfg.h_q, 512, dtype=inp.q.dtype, device="cuda") if shared else None
        fns = {}
        for i, pipeline in enumerate(["auto"] + [variant] * decoders):
            fn = bench.make_decode_fn(mla, pipeline, cfg, inp, out=shared_out)
            assert fn.variant == variant
            fns[f"{pipeline}#{i}"] = fn
        graphs = {name: bench.capture_graph(fn) for name, fn in fns.items()}
        for rep in range(2):
            med = _medians(graphs, replays)
            vals = list(med.values())
            row = dict(config=cfg.label(), variant=variant, shared_out=shared, rep=rep, medians=med,
                       max_over_min=round(max(vals) / min(vals), 4))
            rows.append(row)
            print(f"  {cfg.label():<24} {variant} shared out {shared!s:<5} pass {rep}: "
                  f"{' '.join(f'{v:.2f}' for v in vals)}  max/min {row['max_over_min']:.3f}")
        del graphs
    return rows


def parts(cfg, variant: str, replays: int) -> dict:
    import torch

    import mla
    from perf_table import bench
    from split_k import planner

    inp = bench.make_inputs(cfg, device="cuda", seed=0)
    lengths = cfg.seqlens()
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    base = planner.num_sm_parts(num_sms, cfg.s_q * cfg.h_q, 1)
    counts = sorted({max(base // d, 1) for d in (1, 2, 4, 8, 16, 32)} | {2 * base})
    fns = {}
    for n_parts in counts:
        meta, splits = (t.cuda() for t in planner.plan(lengths, n_parts))
        out = torch.empty(cfg.b, cfg.s_q, cfg.h_q, 512, dtype=inp.q.dtype, device="cuda")
        fns[f"parts {n_parts} chunks {int(splits[-1])}"] = (
            lambda meta=meta, splits=splits, out=out: mla.flash_mla_with_kvcache(
                inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, 512, meta, splits, causal=cfg.causal,
                pipeline=variant, out=out))
    graphs = {name: bench.capture_graph(fn) for name, fn in fns.items()}
    med = _medians(graphs, replays)
    print(f"  {cfg.label():<24} (default parts {base}): " + ", ".join(f"{k}: {v:.2f}" for k, v in med.items()))
    return dict(config=cfg.label(), default_parts=base, medians=med)


def auto_check(cfg, per_values, passes: int, replays: int) -> list[dict]:
    import dataclasses

    import mla
    import pipelines
    from perf_table import bench, runner

    inp = bench.make_inputs(cfg, device="cuda", seed=0)
    members = [(v, cfg) for v in ("2wg", "3wg", "auto")]
    if pipelines.multicast_cluster(cfg.page_size, cfg.h_q * cfg.s_q) > 1:
        cfg = dataclasses.replace(cfg, multicast=True)
        members = [(v, cfg) for v in ("2wg", "3wg", "auto")]
        members += [(v, dataclasses.replace(cfg, multicast=False)) for v in ("2wg", "3wg")]
    fns, graphs = {}, {}
    for v, c in members:
        name = v + ("" if c.multicast is not False else " mc-off")
        with runner.multicast_env(c.multicast), runner.pipeline_env(v):
            fns[name] = bench.make_decode_fn(mla, v, c, inp)
            graphs[name] = bench.capture_graph(fns[name])
    resolved = fns["auto"].variant
    rows = []
    for per in per_values:
        for rep in range(passes):
            samples = bench.time_graphs_interleaved(graphs, replays=replays, per=per or None)
            med = {n: statistics.median(s) for n, s in samples.items()}
            fastest = min(("2wg", "3wg"), key=lambda n: med[n])
            row = dict(config=cfg.label(), per=per, rep=rep, auto_ran=resolved, fastest=fastest,
                       medians={n: round(m, 2) for n, m in med.items()},
                       auto_over_fastest=round(med["auto"] / med[fastest], 4),
                       auto_over_fastest_paired=round(runner.paired_ratio(samples["auto"], samples[fastest]), 4),
                       auto_over_same_kernel=round(med["auto"] / med[resolved], 4),
                       auto_over_same_kernel_paired=round(runner.paired_ratio(samples["auto"], samples[resolved]), 4))
            rows.append(row)
            print(f"  {cfg.label():<24} per {per or 'default'} pass {rep}: "
                  + " ".join(f"{n} {m:.2f}" for n, m in med.items())
                  + f" | auto ({resolved}) / fastest ({fastest}): median {row['auto_over_fastest']:.4f}"
                  f" paired {row['auto_over_fastest_paired']:.4f}")
    del graphs
    return rows


def floor(cfg, passes: int, replays: int) -> list[dict]:
    import torch

    import mla
    from perf_table import bench

    inp = bench.make_inputs(cfg, device="cuda", seed=0)
    x = torch.zeros(1, device="cuda")
    fns = {"1 kernel": lambda: x.add_(1.0), "2 kernels": lambda: (x.add_(1.0), x.add_(1.0)),
           "decode": bench.make_decode_fn(mla, "auto", cfg, inp)}
    graphs = {name: bench.capture_graph(fn) for name, fn in fns.items()}
    rows = []
    for rep in range(passes):
        med = _medians(graphs, replays)
        rows.append(dict(config=cfg.label(), rep=rep, medians=med))
        print(f"  {cfg.label():<24} pass {rep}: " + ", ".join(f"{k}: {v:.2f}" for k, v in med.items()))
    del graphs
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("check", choices=("spread", "parts", "auto", "floor"))
    ap.add_argument("--config", action="append", default=[], help="page,b,s_q,h_q,seqlen")
    ap.add_argument("--decoders", type=int, default=3)
    ap.add_argument("--variant", default="2wg")
    ap.add_argument("--replays", type=int, default=300)
    ap.add_argument("--per", type=int, nargs="+", default=[0, 1], help="auto: replays per graph per round (0: default)")
    ap.add_argument("--passes", type=int, default=3, help="auto, floor: passes")
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    import torch

    from perf_table import grid

    default = {"spread": SPREAD_CONFIGS, "parts": PARTS_CONFIGS, "auto": AUTO_CONFIGS, "floor": FLOOR_CONFIGS}[args.check]
    configs = [grid.Config(*(int(x) for x in c.split(","))) for c in args.config] or [grid.Config(*c) for c in default]
    print(f"{torch.cuda.get_device_name(0)}; us = median of {args.replays} graph replays per graph")
    rows = []
    for cfg in configs:
        if args.check == "spread":
            rows += spread(cfg, args.decoders, args.replays)
        elif args.check == "auto":
            rows += auto_check(cfg, args.per, args.passes, args.replays)
        elif args.check == "floor":
            rows += floor(cfg, args.passes, args.replays)
        else:
            rows.append(parts(cfg, args.variant, args.replays))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(dict(device=torch.cuda.get_device_name(0), check=args.check,
                                                           rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
