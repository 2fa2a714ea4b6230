"""Run FlashMLA's own dense-decode test file, unchanged, against this library's API.

    python scripts/flashmla_dense_suite.py --tests PATH/TO/FlashMLA/tests [--dtype bf16|fp16|both]
                                           [--h-kv 1 2 3 8] [--b 1 2 6 64] [--max-cases N] [--out FILE]
                                           [--jobs N]

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

``--jobs N`` runs N processes side by side, each on the cases of its share of the static kernel
configurations (dtype, h_q, s_q, causal, h_kv), so each compiles only its own kernels: the file's
~5,000 cases need ~160 compiles, which dominate the time in one process. The processes share one
GPU, so each returns its cached memory after every case, and a case that runs out of GPU memory
(the file's reference takes up to ~20 GiB for b=128) is retried after a pause, up to 8 times; the
retries are counted in the summary. Only a case that still fails counts as failed.

Needs a Hopper GPU, torch with CUDA and triton (kernelkit imports it). Exit status 1 on any failure.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback
import zlib


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


def run_case(suite, t, retry_oom: bool) -> int:
    """Run one case of the file; returns how many times it was retried for lack of GPU memory."""
    import torch

    retries = 0
    while True:
        try:
            suite.test_flash_mla(t)
            return retries
        except torch.OutOfMemoryError:
            if not retry_oom or retries == 8:
                raise
            retries += 1
            torch.cuda.empty_cache()
            time.sleep(2.0 + 3.0 * random.random())  # let the other processes' cases finish
        finally:
            if retry_oom:
                torch.cuda.empty_cache()  # hand memory back to the other processes


def kernel_config(t, torch_dtype) -> tuple:
    """The static configuration a case compiles (causal only matters for s_q > 1)."""
    return (str(torch_dtype), t.h_q, t.s_q, bool(t.is_causal and t.s_q > 1), t.h_kv)


def in_shard(t, torch_dtype, shard: tuple[int, int] | None) -> bool:
    if shard is None:
        return True
    index, count = shard
    return zlib.crc32(repr(kernel_config(t, torch_dtype)).encode()) % count == index


def run_jobs(argv: list[str], jobs: int, out: str | None) -> int:
    """Run this script ``jobs`` times in parallel, one shard each, and add up their summaries."""
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for i in range(jobs):
            path = os.path.join(tmp, f"shard{i}.json")
            log = open(os.path.join(tmp, f"shard{i}.log"), "w")
            cmd = [sys.executable, os.path.abspath(__file__), *argv, "--shard", f"{i}/{jobs}", "--out", path]
            procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), path, log))
        total = {"passed": 0, "failed": 0, "not_run_performance": 0, "oom_retries": 0, "failures": [], "seconds": 0.0,
                 "jobs": jobs}
        t0 = time.time()
        broken = []
        for i, (proc, path, log) in enumerate(procs):
            proc.wait()
            log.close()
            try:
                with open(path) as f:
                    part = json.load(f)
            except (OSError, ValueError):
                broken.append(i)
                with open(log.name) as f:
                    print(f"shard {i} died (exit {proc.returncode}):\n{f.read()[-3000:]}")
                continue
            for key in ("passed", "failed", "oom_retries"):
                total[key] += part[key]
            total["not_run_performance"] = part["not_run_performance"]  # the same in every shard
            total["failures"] += part["failures"]
        total["seconds"] = round(time.time() - t0, 1)
    for fail in total["failures"][:20]:
        print(f"FAILED {fail['dtype']} {fail['case']}\n{fail['detail']}")
    print(f"performance cases not run (they time FlashMLA's kernel by name): {total['not_run_performance']}")
    if broken:
        print(f"shards that died: {broken}")
    print(f"flashmla-dense-suite: {total['passed']} passed, {total['failed']} failed ({jobs} jobs, "
          f"{total['seconds']} s, {total['oom_retries']} retries for GPU memory)")
    if out:
        with open(out, "w") as f:
            json.dump(total, f, indent=1)
    return 1 if total["failed"] or broken else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", required=True, help="FlashMLA's tests/ folder")
    parser.add_argument("--dtype", choices=["bf16", "fp16", "both"], default="both")
    parser.add_argument("--h-kv", type=int, nargs="*", help="only these h_kv values")
    parser.add_argument("--b", type=int, nargs="*", help="only these batch sizes")
    parser.add_argument("--max-cases", type=int, default=None, help="stop after this many cases per dtype")
    parser.add_argument("--out", help="write a JSON summary here")
    parser.add_argument("--jobs", type=int, default=1, help="processes side by side (shards of the kernel configs)")
    parser.add_argument("--shard", help=argparse.SUPPRESS)  # I/N: this process's share (set by --jobs)
    args = parser.parse_args(argv)
    if args.jobs > 1:
        argv = list(sys.argv[1:] if argv is None else argv)
        keep, skip = [], False
        for a in argv:  # pass everything but --jobs/--out on to the shards
            if skip:
                skip = False
                continue
            if a in ("--jobs", "--out"):
                skip = True
                continue
            if a.startswith(("--jobs=", "--out=")):
                continue
            keep.append(a)
        return run_jobs(keep, args.jobs, args.out)
    shard = tuple(int(x) for x in args.shard.split("/")) if args.shard else None

    import torch

    suite = load_suite(args.tests)
    dtypes = {"bf16": [torch.bfloat16], "fp16": [torch.float16], "both": [torch.bfloat16, torch.float16]}[args.dtype]
    summary = {"passed": 0, "failed": 0, "not_run_performance": 0, "oom_retries": 0, "failures": [], "seconds": 0.0}
    t0 = time.time()
    for torch_dtype in dtypes:
        cases = collect_cases(suite, torch_dtype)
        run = [t for t in cases if not t.test_performance and in_shard(t, torch_dtype, shard)
               and (not args.h_kv or t.h_kv in args.h_kv) and (not args.b or t.b in args.b)]
        summary["not_run_performance"] += sum(t.test_performance for t in cases)
        if args.max_cases is not None:
            run = run[:args.max_cases]
        print(f"{torch_dtype}: {len(cases)} cases in the file, running {len(run)}"
              + (f" (shard {shard[0]}/{shard[1]})" if shard else ""), flush=True)
        for i, t in enumerate(run):
            buf = io.StringIO()
            try:
                with contextlib.redirect_stdout(buf):
                    summary["oom_retries"] += run_case(suite, t, retry_oom=shard is not None)
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
