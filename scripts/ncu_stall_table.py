"""Tables from the per-instruction CSVs of ``scripts/ncu_stalls.sh`` (ncu's source page, SASS), on any machine.

    python scripts/ncu_stall_table.py A.sass.csv [B.sass.csv ...] [--top 20] [--runs] [--range 500:1000]

For each CSV: the kernel's warp stall samples by reason (percent of all samples); with ``--runs`` the
instruction index ranges of equal execution count (a loop body, a branch) with their samples; the ``--top``
instructions by samples, each with its three largest stall reasons; with ``--range a:b`` (instruction
indices, repeatable) the samples by reason inside that range. A sample is one warp's state at one sampling
point, so a range's samples over its execution count compare forms of one kernel, not absolute cycles.
"""
from __future__ import annotations

import argparse
import csv
import sys


def load(path: str):
    rows = list(csv.reader(open(path)))
    start = next(i for i, r in enumerate(rows) if "Source" in r and "Address" in r)
    hdr, data = rows[start], rows[start + 1:]
    col = {h: i for i, h in enumerate(hdr)}
    stalls = [(h[len("stall_"):], i) for h, i in col.items() if h.startswith("stall_") and "Not Issued" not in h]
    out = []
    for r in data:
        if len(r) < len(hdr):
            continue
        num = lambda k: float(r[col[k]] or 0)  # noqa: E731
        out.append(dict(src=r[col["Source"]], samples=num("Warp Stall Sampling (All Samples)"),
                        executed=r[col["Instructions Executed"]],
                        stalls={name: float(r[i] or 0) for name, i in stalls}))
    return out


def by_reason(instrs) -> dict:
    tot = {}
    for ins in instrs:
        for k, v in ins["stalls"].items():
            tot[k] = tot.get(k, 0.0) + v
    return dict(sorted(((k, v) for k, v in tot.items() if v), key=lambda kv: -kv[1]))


def fmt_reasons(reasons: dict, total: float, n: int = 8) -> str:
    return ", ".join(f"{k} {v:.0f} ({100 * v / total:.1f}%)" for k, v in list(reasons.items())[:n]) if total else "-"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--runs", action="store_true")
    ap.add_argument("--range", action="append", default=[])
    args = ap.parse_args(argv)
    for path in args.csv:
        ins = load(path)
        total = sum(i["samples"] for i in ins)
        print(f"{path}: {len(ins)} instructions, {total:.0f} samples")
        print("  by reason: " + fmt_reasons(by_reason(ins), total, 12))
        if args.runs:
            start = 0
            for j in range(1, len(ins) + 1):
                if j == len(ins) or ins[j]["executed"] != ins[start]["executed"]:
                    smp = sum(i["samples"] for i in ins[start:j])
                    if smp >= 0.005 * total:
                        print(f"  run [{start}, {j}) executed {ins[start]['executed']:>6}: {smp:6.0f} samples  "
                              f"{ins[start]['src'][:48]}")
                    start = j
        for rg in args.range:
            a, b = (int(x) for x in rg.split(":"))
            part = ins[a:b]
            smp = sum(i["samples"] for i in part)
            print(f"  range [{a}, {b}): {smp:.0f} samples: " + fmt_reasons(by_reason(part), smp))
        for j in sorted(range(len(ins)), key=lambda j: -ins[j]["samples"])[:args.top]:
            top = sorted(ins[j]["stalls"].items(), key=lambda kv: -kv[1])[:3]
            print(f"  {j:5d} {ins[j]['samples']:6.0f}  {ins[j]['src'][:56]:56s} "
                  + " ".join(f"{k}={v:.0f}" for k, v in top if v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
