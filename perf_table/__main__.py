"""Command line: ``python -m perf_table run [...]`` and ``python -m perf_table regenerate [...]``."""
from __future__ import annotations

import argparse
import pathlib
import sys

from . import regenerate, runner


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
    run.add_argument("--pipeline", help="one pipeline variant (default: every available one)")
    run.add_argument("--page-size", type=int, action="append", dest="page_sizes", metavar="N",
                     help="only this page size (repeatable; default: 64, 16 and 1 where supported)")
    run.add_argument("--replays", type=_replays, default=runner.MIN_REPLAYS, help="timed graph replays per config")
    run.add_argument("--out", help="JSON path, or an existing directory to write <device>_<date>_<commit>[_quick].json "
                                   "into (default: perf_table/results/)")
    run.add_argument("--commit", help="commit to record where the checkout has no .git (the GPU machine's copy)")
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
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "run":
        try:
            return runner.main(quick=args.quick, pipeline=args.pipeline, out=args.out, replays=args.replays,
                               page_sizes=args.page_sizes, commit=args.commit, eager=args.eager)
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
