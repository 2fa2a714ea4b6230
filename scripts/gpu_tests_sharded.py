"""Run GPU tests in several pytest processes at once, so a whole pipeline's kernel tests fit one device
call: the time per test is mostly the compilation of its configuration (CPU), which the device
machine's 16 cores can do side by side while the one GPU runs the small decodes.

    python scripts/gpu_tests_sharded.py [--shards 8] [--timeout 540] [-k EXPR] [PATH ...]

Collects the ``-m gpu`` tests of PATH (default ``tests/``) matching ``-k``, deals them to ``--shards``
processes in collection order (neighbouring parameter sets share configurations, so each process
compiles about 1/shards of them; the on-disk kernel cache's lock lets a second process load what a
first compiled), and runs each with ``pytest -q -p no:cacheprovider`` under ``--timeout`` seconds.
Each shard's log goes to ``$OUT/shard-N.log`` (or /tmp/gpu-tests-sharded). Prints one line per shard
and the failed tests; exit status 0 only when every collected test passed.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent


def collect(paths, expr):
    cmd = [sys.executable, "-m", "pytest", "--co", "-q", "-m", "gpu", "-p", "no:cacheprovider", *paths]
    if expr:
        cmd += ["-k", expr]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    ids = [ln.strip() for ln in proc.stdout.splitlines() if "::" in ln]
    if proc.returncode not in (0, 5) or not ids:
        sys.exit(f"collection failed or empty (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return ids


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", default=["tests/"])
    ap.add_argument("-k", dest="expr", default=None, help="pytest -k expression")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=540.0, help="seconds for every shard together")
    args = ap.parse_args(argv)
    out = pathlib.Path(os.environ.get("OUT") or "/tmp/gpu-tests-sharded")
    out.mkdir(parents=True, exist_ok=True)
    ids = collect(args.paths, args.expr)
    n = max(1, min(args.shards, len(ids)))
    # Contiguous blocks: a block's tests mostly share their configurations.
    size = -(-len(ids) // n)
    shards = [ids[i:i + size] for i in range(0, len(ids), size)]
    print(f"{len(ids)} tests in {len(shards)} shards", flush=True)
    t0 = time.perf_counter()
    procs = []
    for i, shard in enumerate(shards):
        log = open(out / f"shard-{i}.log", "w")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "-rf", *shard]
        procs.append((i, shard, log, subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)))
    failed_all, ok = [], True
    for i, shard, log, proc in procs:
        left = max(1.0, args.timeout - (time.perf_counter() - t0))
        try:
            proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        text = (out / f"shard-{i}.log").read_text(errors="replace")
        summary = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)]
        failed = re.findall(r"^FAILED (\S+)", text, flags=re.M) + re.findall(r"^ERROR (\S+)", text, flags=re.M)
        failed_all += failed
        passed = int(m.group(1)) if summary and (m := re.search(r"(\d+) passed", summary[-1])) else 0
        done = proc.returncode == 0 and passed == len(shard)
        ok &= done
        status = "ok" if done else ("timeout" if proc.returncode in (-9, 137) else f"exit {proc.returncode}")
        print(f"shard {i}: {len(shard)} tests, {status}, {summary[-1].strip() if summary else 'no summary'}",
              flush=True)
    for f in failed_all:
        print(f"FAILED {f}")
    print(f"total {time.perf_counter() - t0:.0f} s; {'all passed' if ok else 'NOT all passed'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
