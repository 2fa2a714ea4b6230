"""One decode through the public API, checked against the fp32 reference: a small target for
``compute-sanitizer`` (racecheck, memcheck, synccheck) on one kernel configuration.

    python scripts/one_decode.py [--b 2] [--s-q 1] [--h-q 128] [--h-kv 1] [--seqlen 300 ...] [--page 64]
                                 [--pipeline 2wg] [--causal]

``--seqlen`` repeated gives each request its length (else every one of ``--b`` requests gets the one
value). Inputs: ``mla.testing.make_decode_problem`` (NaN in every unused cache slot). Prints PASS or
FAIL with the comparison's worst errors; exits 1 on FAIL.
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

    import torch

    import mla
    from mla.reference import compare_to_reference, mla_decode_reference
    from mla.testing import make_decode_problem

    lens = args.seqlen or [300]
    if len(lens) == 1:
        lens = lens * args.b
    p = make_decode_problem(lens, s_q=args.s_q, h_q=args.h_q, h_kv=args.h_kv, page_size=args.page,
                            device="cuda", seed=1, value_scale=0.1)
    meta, splits = mla.get_mla_metadata(p.cache_seqlens, args.s_q * args.h_q // args.h_kv, args.h_kv)
    out, lse = mla.flash_mla_with_kvcache(p.q, p.k_cache, p.block_table, p.cache_seqlens, 512, meta, splits,
                                          causal=args.causal, pipeline=args.pipeline)
    torch.cuda.synchronize()
    ref_out, ref_lse = mla_decode_reference(p.q, p.k_cache, p.block_table, p.cache_seqlens, 512,
                                            causal=args.causal)
    cmp = compare_to_reference(out, lse, ref_out, ref_lse)
    print(("PASS" if cmp.ok else "FAIL"), f"b{len(lens)} s{args.s_q} h{args.h_q} kv{args.h_kv} page {args.page}",
          f"lens {lens[:4]}{'...' if len(lens) > 4 else ''} {args.pipeline}:", cmp)
    return 0 if cmp.ok else 1


if __name__ == "__main__":
    sys.exit(main())
