"""One decode through the public API, checked against the fp32 reference: a small target for
``compute-sanitizer`` (racecheck, memcheck, synccheck) on one kernel configuration.

    python scripts/one_decode.py [--b 2] [--s-q 1] [--h-q 128] [--h-kv 1] [--seqlen 300 ...] [--page 64]
                                 [--pipeline 2wg] [--causal]

``--seqlen`` repeated gives each request its length (else every one of ``--b`` requests gets the one
value). The check is ``python -m mla``'s (``mla.__main__.decode_case``: NaN in every unused cache slot, the
anchors' value distribution). Prints PASS or FAIL with the comparison's worst errors; exits 1 on FAIL.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--b", type=int, default=2)
    ap.add_argument("--s-q", type=int, default=1)
    ap.add_argument("--h-q", type=int, default=128)
    ap.add_argument("--h-kv", type=int, default=1)
    ap.add_argument("--seqlen", type=int, action="append", default=[])
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--pipeline", default="2wg")
    ap.add_argument("--causal", action="store_true")
    args = ap.parse_args(argv)

    from mla.__main__ import decode_case

    lens = args.seqlen or [300]
    if len(lens) == 1:
        lens = lens * args.b
    cmp = decode_case(args.pipeline, lens, args.page, args.s_q, args.h_q, args.h_kv, args.causal)
    print(("PASS" if cmp.ok else "FAIL"), f"b{len(lens)} s{args.s_q} h{args.h_q} kv{args.h_kv} page {args.page}",
          f"lens {lens[:4]}{'...' if len(lens) > 4 else ''} {args.pipeline}:", cmp)
    return 0 if cmp.ok else 1


if __name__ == "__main__":
    sys.exit(main())
