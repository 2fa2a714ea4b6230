"""A/B of split plans on the GPU: the default plan against plans made with a smaller ``fixed_cost``
(shorter, more chunks where requests are split) or without the aligned plan's chunk sizes under ``target``
(``--prev``: ``planner.BELOW_TARGET`` 0, the rule before the twentieth session) or FlashMLA's balanced plan
(``--balanced F``) or a plan of ``K`` whole requests per part (``--whole K``: no request split, no merge;
where ``ceil(b / K)`` parts suffice), same kernel, same inputs, CUDA-graph replays timed in interleaved rounds.
A plan that leaves SMs idle draws less power and raises the SM clock for the graph replayed after it: under the
rotation the timing used before 688ae06 that favoured one plan by 4-9% (docs/perf-notes.md, twenty-fifth session);
the balanced round orders remove the bias, but beside such a plan the pass-to-pass spread stays about 3%, so time
two plans at a time where it matters.

    python scripts/chunk_ab.py [--cost 4 --cost 2 ...] [--prev] [--balanced 0 ...] [--whole 4 ...] [--replays 300]
                               [--passes 2] [--config 64,8,1,64,4096 ...]

For each config the plans of ``split_k.planner.plan(lengths, parts, fixed_cost=F)`` for the default F and
each ``--cost`` (identical plans are timed once; with ``--prev`` no other cost unless given), each passed to
``mla.flash_mla_with_kvcache`` as its
metadata; outputs are compared with the default plan's (two summation orders: a few bf16 ulps). Printed per
plan: the chunks it makes, the longest chunk (tiles), the graph replay median and its ratio to the default.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIGS = ((64, 8, 1, 64, 4096), (64, 1, 1, 128, 16384), (64, 1, 1, 16, 16384), (64, 1, 1, 16, 1024),
           (64, 4, 1, 64, 4096), (64, 8, 1, 128, 4096), (64, 16, 1, 64, 4096), (64, 8, 1, 16, 4096))
MAX_DIFF = 2e-2


def whole_plan(lengths, num_parts: int, k: int):
    """``(metadata, num_splits)``: requests ``k p .. k p + k - 1`` whole in part ``p``, the other parts empty;
    None where ``ceil(b / k)`` parts do not fit ``num_parts``."""
    import torch

    from split_k import planner

    if k < 1:
        raise SystemExit(f"--whole must be at least 1, got {k}")
    b = len(lengths)
    if -(-b // k) > num_parts:
        return None
    meta = torch.empty(num_parts, planner.METADATA_WIDTH, dtype=torch.int32)
    planner.empty_rows(meta)
    for p in range(-(-b // k)):
        last = min(b, (p + 1) * k) - 1
        meta[p, :planner.BEGIN_SPLIT + 1] = torch.tensor([p * k, 0, last, planner.n_blocks(lengths[last]), 0],
                                                         dtype=torch.int32)
    return meta, torch.arange(b + 1, dtype=torch.int32)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cost", action="append", type=int, default=[], help="fixed_cost of another plan (default 4, 3, 2)")
    ap.add_argument("--prev", action="store_true", help="also the plan without chunk sizes under target")
    ap.add_argument("--balanced", action="append", type=int, default=[],
                    help="also the balanced plan (FlashMLA's; aligned=False) with this fixed_cost")
    ap.add_argument("--whole", action="append", type=int, default=[],
                    help="also the plan of this many whole requests per part")
    ap.add_argument("--replays", type=int, default=300)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--config", action="append", default=[], help="page,b,s_q,h_q,seqlen")
    ap.add_argument("--pipeline", default="2wg", help="the decode pipeline every plan runs (default 2wg)")
    args = ap.parse_args(argv)

    import torch

    import mla
    from perf_table import bench, grid
    from split_k import planner

    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    configs = [grid.Config(*(int(x) for x in t.split(","))) for t in args.config] or [grid.Config(*c) for c in CONFIGS]
    costs = [planner.FIXED_COST] + [c for c in (args.cost or ([] if args.prev else [4, 3, 2])) if c != planner.FIXED_COST]
    print(f"{torch.cuda.get_device_name(0)}, {args.pipeline}, {args.replays} replays x {args.passes} passes")
    for cfg in configs:
        inp = bench.make_inputs(cfg, device="cuda", seed=0)
        lengths = cfg.seqlens()
        parts = planner.num_sm_parts(num_sms, cfg.s_q * cfg.h_q, 1)
        plans = {}

        def add(name, plan):  # a plan equal to one already listed is timed once, under the first name
            if not any(plan[0].equal(m) and plan[1].equal(s) for m, s in plans.values()):
                plans[name] = plan

        for cost in costs:
            add(f"F={cost}", planner.plan(lengths, parts, fixed_cost=cost))
        for cost in args.balanced:
            add(f"bal F={cost}", planner.plan(lengths, parts, fixed_cost=cost, aligned=False))
        for k in args.whole:
            plan = whole_plan(lengths, parts, k)
            if plan is None:
                print(f"  {cfg.label()}: {k} whole requests per part need more than {parts} parts; not timed")
            else:
                add(f"whole {k}", plan)
        if args.prev:
            below, planner.BELOW_TARGET = planner.BELOW_TARGET, 0
            try:
                add("prev", planner.plan(lengths, parts))
            finally:
                planner.BELOW_TARGET = below
        fns, outs, shape = {}, {}, {}
        for name, (meta, splits) in plans.items():
            chunks = planner.part_chunks(meta, lengths)
            longest = max(sum(c.end_block - c.begin_block for c in p) for p in chunks)
            shape[name] = (int(splits[-1]), longest)
            meta, splits = meta.cuda(), splits.cuda()
            out = torch.empty(cfg.b, cfg.s_q, cfg.h_q, 512, dtype=inp.q.dtype, device="cuda")

            def call(meta=meta, splits=splits, out=out):
                mla.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, 512, meta,
                                           splits, causal=cfg.causal, pipeline=args.pipeline, out=out)
            call()
            fns[name], outs[name] = call, out
        torch.cuda.synchronize()
        first = next(iter(plans))
        for name in plans:
            d = (outs[name].float() - outs[first].float()).abs().max().item()
            if d > MAX_DIFF or not torch.isfinite(outs[name]).all():
                raise SystemExit(f"{cfg.label()}: plan {name} differs by {d}")
        graphs = {name: bench.capture_graph(fn) for name, fn in fns.items()}
        for p in range(args.passes):
            samples = bench.time_graphs_interleaved(graphs, replays=args.replays)
            med = {n: statistics.median(s) for n, s in samples.items()}
            print(f"  {cfg.label():<26} pass {p + 1}: " + ", ".join(
                f"{n} ({shape[n][0]} chunks, parts <= {shape[n][1]} tiles) {med[n]:.2f} x{med[n] / med[first]:.3f}"
                for n in plans), flush=True)
        del graphs
    return 0


if __name__ == "__main__":
    sys.exit(main())
