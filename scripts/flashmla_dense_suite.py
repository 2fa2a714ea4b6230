"""Run FlashMLA's own dense-decode test file, unchanged, against this library's API.

    python scripts/flashmla_dense_suite.py --tests PATH/TO/FlashMLA/tests [--dtype bf16|fp16|both]
                                           [--h-kv 1 2 3 8] [--b 1 2 6 64] [--max-cases N] [--out FILE]

``PATH/TO/FlashMLA/tests`` is the ``tests/`` folder of a checkout of deepseek-ai/FlashMLA (it holds
``test_flash_mla_dense_decoding.py`` and its ``kernelkit`` helpers; nothing of it is copied into this
repository). The file imports ``flash_mla``; this script makes that name resolve to ``mla`` (same
function names and argument positions), then:

1. collects the file's own case list by calling its ``main(dtype)`` with ``test_flash_mla`` swapped
   for a collector (so the grid, the data generator, the reference and the tolerances are the file's),
2. runs the file's ``test_flash_mla`` on every correctness and corner case (``test_performance`` is
   False); the performance cases time FlashMLA's kernel by its name through kineto, so they are
   listed as not run,
3. prints ``N passed, M failed`` and, for each failure, the case and what the file printed.

Needs a Hopper GPU, torch with CUDA and triton (kernelkit imports it). Exit status 1 on any failure.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import sys
import time
import traceback


def load_suite(tests_dir: str):
    """Import the FlashMLA test module with ``flash_mla`` bound to ``mla``."""
    import mla

    sys.modules.setdefault("flash_mla", mla)
    sys.path.insert(0, tests_dir)
    return importlib.import_module("test_flash_mla_dense_decoding")


def collect_cases(suite, torch_dtype) -> list:
    """The TestParam list the file's ``main`` would run for ``torch_dtype`` (it also sets the default
    dtype and device, as the file expects when its cases run)."""
    cases = []
    run = suite.test_flash_mla
    suite.test_flash_mla = cases.append
    try:
        suite.main(torch_dtype)
    finally:
        suite.test_flash_mla = run
    return cases


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", required=True, help="FlashMLA's tests/ folder")
    parser.add_argument("--dtype", choices=["bf16", "fp16", "both"], default="both")
    parser.add_argument("--h-kv", type=int, nargs="*", help="only these h_kv values")
    parser.add_argument("--b", type=int, nargs="*", help="only these batch sizes")
    parser.add_argument("--max-cases", type=int, default=None, help="stop after this many cases per dtype")
    parser.add_argument("--out", help="write a JSON summary here")
    args = parser.parse_args(argv)

    import torch

    suite = load_suite(args.tests)
    dtypes = {"bf16": [torch.bfloat16], "fp16": [torch.float16], "both": [torch.bfloat16, torch.float16]}[args.dtype]
    summary = {"passed": 0, "failed": 0, "not_run_performance": 0, "failures": [], "seconds": 0.0}
    t0 = time.time()
    for torch_dtype in dtypes:
        cases = collect_cases(suite, torch_dtype)
        run = [t for t in cases if not t.test_performance
               and (not args.h_kv or t.h_kv in args.h_kv) and (not args.b or t.b in args.b)]
        summary["not_run_performance"] += sum(t.test_performance for t in cases)
        if args.max_cases is not None:
            run = run[:args.max_cases]
        print(f"{torch_dtype}: {len(cases)} cases in the file, running {len(run)}", flush=True)
        for i, t in enumerate(run):
            buf = io.StringIO()
            try:
                with contextlib.redirect_stdout(buf):
                    suite.test_flash_mla(t)
                summary["passed"] += 1
            except Exception:  # an assertion of the file, or an error of ours: both are failures
                summary["failed"] += 1
                detail = buf.getvalue()[-2000:] + traceback.format_exc(limit=3)[-2000:]
                summary["failures"].append({"dtype": str(torch_dtype), "case": repr(t), "detail": detail})
                print(f"FAILED {torch_dtype} {t}\n{detail}", flush=True)
            if (i + 1) % 200 == 0:
                print(f"  {i + 1}/{len(run)} ({time.time() - t0:.0f} s)", flush=True)
    summary["seconds"] = round(time.time() - t0, 1)
    print(f"performance cases not run (they time FlashMLA's kernel by name): {summary['not_run_performance']}")
    print(f"flashmla-dense-suite: {summary['passed']} passed, {summary['failed']} failed")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
