"""Command line: ``python -m perf_table run [...]``, ``python -m perf_table regenerate [...]`` and
``python -m perf_table planner [...]`` (GPU time of the split planner kernel alone)."""
from __future__ import annotations

import argparse
import pathlib
import sys

from . import bench, regenerate, runner


def _replays(text: str) -> int:
    value = int(text)
    if value < runner.MIN_REPLAYS:
        raise argparse.ArgumentTypeError(f"at least {runner.MIN_REPLAYS} replays (the table's medians need them)")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m perf_table", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="measure the roofline and the grid on this GPU, write a raw JSON")
    run.add_argument("--quick", action="store_true", help="anchor configs only (about a minute)")
    run.add_argument("--pipeline", action="append", dest="pipeline", metavar="PIPELINE",
                     help="a pipeline variant to measure (repeatable; default: every available one)")
    run.add_argument("--page-size", type=int, action="append", dest="page_sizes", metavar="N",
                     help="only this page size (repeatable; default: 64, 16 and 1 where supported)")
    run.add_argument("--replays", type=_replays, default=runner.MIN_REPLAYS, help="timed graph replays per config")
    run.add_argument("--out", help="JSON path, or an existing directory to write <device>_<date>_<commit>[_quick].json "
                                   "into (default: perf_table/results/)")
    run.add_argument("--commit", help="commit to record where the checkout has no .git (the GPU machine's copy)")
    run.add_argument("--no-auto", dest="auto", action="store_false",
                     help="no pipeline='auto' rows (by default every config that two pipelines run also times auto, "
                          "the variant it resolves to recorded; python -m pipelines.auto --verify reads them)")
    eager = run.add_mutually_exclusive_group()
    eager.add_argument("--eager", dest="eager", action="store_true", default=None,
                       help="also time 300 back-to-back eager calls per config (default with --quick)")
    eager.add_argument("--no-eager", dest="eager", action="store_false", help="graph replays only")

    regen = sub.add_parser("regenerate", help="rebuild README.md, table.csv and plots/ from results/ (CPU)")
    regen.add_argument("--check", action="store_true",
                       help="write nothing; exit 1 if the committed README.md or table.csv differ from a regeneration")
    regen.add_argument("--results", type=pathlib.Path, default=runner.RESULTS_DIR, help=argparse.SUPPRESS)
    regen.add_argument("--anchors", type=pathlib.Path, default=regenerate.ANCHORS_DIR, help=argparse.SUPPRESS)
    regen.add_argument("--out-dir", type=pathlib.Path, default=regenerate.PACKAGE_DIR, help=argparse.SUPPRESS)

    plan = sub.add_parser("planner", help="time the split planner kernel alone (CUDA graph replays), print a table")
    plan.add_argument("--batch", type=int, action="append", dest="batches", metavar="B",
                      help=f"batch size (repeatable; default: {', '.join(map(str, bench.PLANNER_BATCHES))})")
    plan.add_argument("--rows", type=int, default=16, help="query rows per kv head, s_q * h_q (default 16)")
    plan.add_argument("--seqlen", type=int, default=4096, help="mean length (default 4096)")
    plan.add_argument("--replays", type=int, default=200, help="timed graph replays (default 200)")
    return parser.parse_args(argv)


def run_planner_timing(args) -> int:
    import torch

    if not torch.cuda.is_available():
        raise runner.PreflightError(f"python -m perf_table planner needs a CUDA GPU, and torch {torch.__version__} "
                                    "sees none (torch.cuda.is_available() is False)")
    print(f"split planner kernel on {torch.cuda.get_device_name()}: CUDA graph replays, microseconds")
    print(f"{'b':>6} {'rows':>5} {'parts':>6} {'median':>8} {'p10':>8} {'p90':>8} {'1-kernel graph':>15} "
          f"{'eager call':>11}")
    for b in args.batches or bench.PLANNER_BATCHES:
        r = bench.time_planner(b, rows=args.rows, mean_seqlen=args.seqlen, replays=args.replays)
        print(f"{b:>6} {r['rows']:>5} {r['num_parts']:>6} {r['median_us']:>8.2f} {r['p10_us']:>8.2f} "
              f"{r['p90_us']:>8.2f} {r['floor_us']:>15.2f} {r['eager_call_us']:>11.1f}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "planner":
        try:
            return run_planner_timing(args)
        except runner.PreflightError as exc:
            print(f"perf_table planner: {exc}", file=sys.stderr)
            return 2
    if args.command == "run":
        try:
            return runner.main(quick=args.quick, pipeline=args.pipeline, out=args.out, replays=args.replays,
                               page_sizes=args.page_sizes, commit=args.commit, eager=args.eager, auto=args.auto)
        except runner.PreflightError as exc:
            print(f"perf_table run: {exc}", file=sys.stderr)
            return 2
    if args.check:
        return regenerate.check(args.results, args.anchors, args.out_dir)
    for path in regenerate.regenerate(args.results, args.anchors, args.out_dir):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
