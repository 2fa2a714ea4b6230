"""A/B of two split plans on the GPU: the aligned plan (the planners' default) against FlashMLA's
balanced plan, same kernel, same inputs, CUDA-graph replays timed in interleaved rounds.

    python scripts/plan_ab.py [--variant 2wg] [--replays 300] [--json PATH] [--config p64,b32,s1,h128,4096 ...]
                              [--fixed-cost N]

Without ``--config`` it takes every page-64 config of the perf grid (``perf_table.grid``) whose
aligned plan differs from the second one (the balanced plan, or the ``--fixed-cost`` one), plus three
controls whose plans are the same (their ratio shows the measurement's spread). For each config it
checks that the device planner's plan equals the host's aligned plan, that both plans give the same
output (max abs difference, against a bound of bf16 rounding), then times both graphs
(``perf_table.bench.time_graphs_interleaved``) and prints the medians and their ratio. ``--json``
writes the rows. ``--fixed-cost N``: the second plan is the aligned plan charged ``N`` tiles per chunk
instead of ``planner.FIXED_COST`` (the column keeps the name "balanced"): whether a cheaper chunk head
in the balancer would pay on a kernel.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONTROLS = ((64, 128, 1, 16, 4096), (64, 1, 1, 128, 16384), (64, 8, 1, 64, 4096))
MAX_DIFF = 2e-2  # outputs are ~0.1 in bf16; two summation orders differ by a few ulps


def second_plan(lengths, parts: int, fixed_cost: int | None):
    """The plan timed against the aligned one: the balanced plan, or with ``fixed_cost`` the aligned plan
    charged that many tiles per chunk."""
    from split_k import planner

    if fixed_cost is None:
        return planner.plan(lengths, parts, aligned=False)
    return planner.plan(lengths, parts, fixed_cost=fixed_cost)


def changed_configs(num_sms: int, fixed_cost: int | None = None) -> list:
    """Page-64 grid configs (multicast rows once) whose aligned and second plans (``second_plan``) differ."""
    from perf_table import grid
    from split_k import planner

    out = []
    for cfg in grid.full_grid((64,)):
        if cfg.multicast is False:
            continue
        lengths = cfg.seqlens()
        parts = planner.num_sm_parts(num_sms, cfg.s_q * cfg.h_q, 1)
        a, b = planner.plan(lengths, parts), second_plan(lengths, parts, fixed_cost)
        if not (a[0].equal(b[0]) and a[1].equal(b[1])):
            out.append(cfg)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", default="2wg")
    ap.add_argument("--replays", type=int, default=300)
    ap.add_argument("--json")
    ap.add_argument("--config", action="append", default=[], help="page,b,s_q,h_q,seqlen (e.g. 64,32,1,128,4096)")
    ap.add_argument("--fixed-cost", type=int, default=None,
                    help="second plan: the aligned plan with this per-chunk cost (default: the balanced plan)")
    args = ap.parse_args(argv)

    import torch

    import mla
    from perf_table import bench, grid
    from split_k import planner

    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    if args.config:
        configs = [grid.Config(*(int(x) for x in text.split(","))) for text in args.config]
    else:
        configs = changed_configs(num_sms, args.fixed_cost) + [grid.Config(*c) for c in CONTROLS]
    rows, failed = [], 0
    print(f"{torch.cuda.get_device_name(0)}, {args.variant}, {args.replays} replays; us = median of graph replays")
    print(f"{'config':<28} {'chunks a/b':>11} {'aligned':>9} {'balanced':>9} {'a/b':>6} {'max|diff|':>10}")
    for cfg in configs:
        inp = bench.make_inputs(cfg, device="cuda", seed=0)
        lengths = cfg.seqlens()
        rows_q = cfg.s_q * cfg.h_q
        parts = planner.num_sm_parts(num_sms, rows_q, 1)
        plans = {"aligned": planner.plan(lengths, parts), "balanced": second_plan(lengths, parts, args.fixed_cost)}
        device_meta, device_splits = mla.get_mla_metadata(inp.cache_seqlens, rows_q, 1, planner="device")
        same_as_device = (device_meta.cpu().equal(plans["aligned"][0])
                          and device_splits.cpu().equal(plans["aligned"][1]))
        outs, fns = {}, {}
        for name, (meta, splits) in plans.items():
            meta, splits = meta.cuda(), splits.cuda()
            out = torch.empty(cfg.b, cfg.s_q, cfg.h_q, 512, dtype=inp.q.dtype, device="cuda")

            def call(meta=meta, splits=splits, out=out):
                mla.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, 512, meta,
                                           splits, causal=cfg.causal, pipeline=args.variant, out=out)
            call()
            outs[name], fns[name] = out, call
        torch.cuda.synchronize()
        diff = (outs["aligned"].float() - outs["balanced"].float()).abs().max().item()
        ok = same_as_device and diff <= MAX_DIFF and torch.isfinite(outs["aligned"]).all().item()
        graphs = {name: bench.capture_graph(fn) for name, fn in fns.items()}
        samples = bench.time_graphs_interleaved(graphs, replays=args.replays)
        med = {name: statistics.median(s) for name, s in samples.items()}
        row = dict(config=cfg.label(), b=cfg.b, s_q=cfg.s_q, h_q=cfg.h_q, seqlen=cfg.seqlen, varlen=cfg.varlen,
                   chunks_aligned=int(plans["aligned"][1][-1]), chunks_balanced=int(plans["balanced"][1][-1]),
                   aligned_us=med["aligned"], balanced_us=med["balanced"], ratio=med["aligned"] / med["balanced"],
                   max_abs_diff=diff, device_plan_equal=same_as_device, ok=ok)
        rows.append(row)
        failed += not ok
        print(f"{cfg.label():<28} {row['chunks_aligned']:>5}/{row['chunks_balanced']:<5} {med['aligned']:9.2f} "
              f"{med['balanced']:9.2f} {row['ratio']:6.3f} {diff:10.2e}{'' if ok else '  FAIL'}")
        del graphs
    controls = {grid.Config(*c).label() for c in CONTROLS}
    changed = [r["ratio"] for r in rows if r["config"] not in controls]
    if changed:
        print(f"geomean aligned/balanced over {len(changed)} changed configs: "
              f"{statistics.geometric_mean(changed):.3f}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(dict(device=torch.cuda.get_device_name(0),
                                                           variant=args.variant, replays=args.replays, rows=rows),
                                                      indent=1))
    print("FAILED" if failed else "all outputs agree; device plans equal the host's")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
