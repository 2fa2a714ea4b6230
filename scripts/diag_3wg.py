"""Device diagnostic for a pipeline variant (default 3wg): the smallest repro cases of the multi-chunk
and split paths, one subprocess per case, each with a timeout, against the fp32 reference.

    python scripts/diag_3wg.py [--variant 3wg] [--case NAME ...] [--case-timeout S] [--hang-timeout S]
                               [--budget S] [--jobs N] [--sanitizer memcheck|synccheck|racecheck] [--list]

The variant is ``--variant``, else ``$MLA_PIPELINE``, else ``3wg``. A variant that is not registered
(``pipelines._WITH_KERNEL``; 3wg is not, until it passes on a GPU) is registered inside this script's
processes only, by patching the module attribute; nothing changes for other users.

Steps: (1) compile every configuration the selected cases need, in parallel processes, into the
on-disk kernel cache (keyed by the kernel sources, so an edited kernel is never served stale);
(2) run each case in its own subprocess (a sticky CUDA error or a hang cannot spoil the next case):
the child prints ``LAUNCH`` right before the decode; no result within ``--hang-timeout`` seconds
after it is a HANG. Verdicts: PASS, FAIL (wrong numbers: the comparison's message), CRASH (CUDA
error or exception: its last line), HANG, TIMEOUT (before the launch: import/compile), SKIP (the
``--budget`` of seconds ran out). Each case prints its plan: per CTA (plan part), the chunks as
request:tiles. A summary JSON and per-case logs go to ``$OUT/diag_3wg/`` when ``$OUT`` is set.

Exit status: 0 when every case that ran passed, 1 otherwise.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import pathlib
import subprocess
import sys
import threading
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


from mla.testing import varlen  # noqa: E402  (after the sys.path insert above)


# name: (seqlens or a callable making them, s_q, h_q, h_kv, causal, dtype name, page size, num_sms or None)
# num_sms=None: the device's SM count (the real plan). Smallest and most telling cases first.
CASES = {
    # One CTA walks every chunk: several requests in a row, tile counts 5 then 5 / 4 then 3 / 1, 4, 3.
    "b2-300x2-1cta": ([300, 300], 1, 16, 1, False, "bf16", 64, 1),
    "b2-200,137-1cta": ([200, 137], 1, 16, 1, False, "bf16", 64, 1),
    "b3-64,200,130-1cta": ([64, 200, 130], 1, 16, 1, False, "bf16", 64, 1),
    # Two / three CTAs: request 1 split, so a CTA starts with a split tail or ends with a split head
    # (tiles [1, 9 | 2, 3] and [1, 8 | 3, 3 | 5]).
    "b3-64,700,130-2cta": ([64, 700, 130], 1, 16, 1, False, "bf16", 64, 2),
    "b4-64,700,130,300-3cta": ([64, 700, 130, 300], 1, 16, 1, False, "bf16", 64, 3),
    "b3-64,200,130": ([64, 200, 130], 1, 16, 1, False, "bf16", 64, None),
    # The hang: 200 requests x 300 keys at h16, 2 chunks of 5 tiles in most CTAs.
    "b200x300-h16": ([300] * 200, 1, 16, 1, False, "bf16", 64, None),
    # Split only: one long request over every SM (2 tiles per CTA) + merge.
    "split-b1-16384-h64": ([16384], 1, 64, 1, False, "bf16", 64, None),
    # Causal MTP (s_q 2): per-row key limits across chunks.
    "sq2-causal-h16": ([20, 140, 4096, 3], 2, 16, 1, True, "bf16", 64, None),
    "sq2-causal-h16-1cta": ([20, 140, 300, 3], 2, 16, 1, True, "bf16", 64, 1),
    # Page 1: the cp.async gather producer (128 threads), with one and with many CTAs.
    "page1-1cta": ([300, 300], 1, 16, 1, False, "bf16", 1, 1),
    "page1-varlen": ([20, 140, 4096, 0, 1, 63, 65, 17], 1, 16, 1, False, "bf16", 1, None),
    # Page 16: 4 rolled TMA boxes per tile.
    "page16-varlen": ([20, 140, 4096, 0, 1, 63, 65, 17], 1, 16, 1, False, "bf16", 16, None),
    # Page 64 at h128: 2 m-blocks, a 2-CTA multicast cluster, varlen with splits and several chunks.
    "page64-h128-cluster": (lambda: varlen(32, 1024, seed=6, zeros=2), 1, 128, 1, False, "bf16", 64, None),
    # The first case of tests/test_kernel_gpu.py's varlen batches (64 requests, h16).
    "varlen64x4096-h16": (lambda: varlen(64, 4096, seed=1, zeros=3), 1, 16, 1, False, "bf16", 64, None),
}


def register(variant: str) -> None:
    """Make ``variant`` available in this process only (3wg is unregistered until it passes)."""
    import pipelines
    if variant not in pipelines.VARIANTS:
        raise SystemExit(f"unknown variant {variant!r}; one of {pipelines.VARIANTS}")
    if variant not in pipelines._WITH_KERNEL:
        pipelines._WITH_KERNEL = tuple(pipelines._WITH_KERNEL) + (variant,)


def _torch_dtype(name):
    import torch
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[name]


def _config(variant, case):
    from pipelines import paged_kv
    from pipelines.launch import DecodeConfig
    _, s_q, h_q, h_kv, causal, dtype, page, _ = case
    return DecodeConfig.make(variant, _torch_dtype(dtype), h_q, s_q, page, causal, h_kv,
                             paged_kv.multicast_enabled())


def _compile_one(variant, config):
    """Worker: load or compile one configuration into the disk cache."""
    register(variant)
    from pipelines import launch
    start = time.perf_counter()
    result = launch.lookup_entry(config)
    return config.label(), result.source, time.perf_counter() - start


def run_case_child(variant: str, name: str) -> int:
    """In the subprocess: build the case, plan, launch, compare. Prints LAUNCH, then RESULT."""
    register(variant)
    import torch

    import mla
    from mla.reference import compare_to_reference, mla_decode_reference
    from mla.testing import make_decode_problem
    from split_k import planner

    seqlens, s_q, h_q, h_kv, causal, dtype, page, num_sms = CASES[name]
    if callable(seqlens):
        seqlens = seqlens()
    torch_dtype = _torch_dtype(dtype)
    p = make_decode_problem(seqlens, s_q=s_q, h_q=h_q, h_kv=h_kv, page_size=page, dtype=torch_dtype, device="cuda",
                            seed=len(seqlens) + page, value_scale=0.1)
    rows = s_q * h_q // h_kv
    meta, num_splits = mla.get_mla_metadata(p.cache_seqlens, rows, h_kv, num_sms=num_sms, planner="host")
    parts = planner.part_chunks(meta.cpu(), seqlens)
    busy = [c for c in parts if c]
    multi = sum(1 for c in busy if len(c) > 1)
    shown = "; ".join(" ".join(f"r{c.req}:{c.end_block - c.begin_block}" for c in part) for part in busy[:6])
    print(f"plan: {len(parts)} parts ({len(busy)} busy, {multi} with several chunks), "
          f"{int(num_splits[-1])} chunks for {len(seqlens)} requests; first parts: {shown}"
          f"{' ...' if len(busy) > 6 else ''}", flush=True)
    # Compile (or load) before the launch marker, so a slow compile is never taken for a hang.
    import pipelines
    pipelines.decode_launcher(variant, torch_dtype, h_q, s_q, page, causal, h_kv)
    out = torch.full((len(seqlens), s_q, h_q, 512), float("nan"), dtype=torch_dtype, device="cuda")
    torch.cuda.synchronize()
    print("LAUNCH", flush=True)
    t0 = time.perf_counter()
    out, lse = mla.flash_mla_with_kvcache(p.q, p.k_cache, p.block_table, p.cache_seqlens, 512, meta, num_splits,
                                          causal=causal, pipeline=variant, out=out)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    print(f"DONE {ms:.1f} ms", flush=True)
    ref_out, ref_lse = mla_decode_reference(p.q, p.k_cache, p.block_table, p.cache_seqlens, causal=causal)
    cmp = compare_to_reference(out, lse, ref_out, ref_lse)
    print(f"RESULT {'PASS' if cmp.ok else 'FAIL'} max|out-ref|={cmp.max_abs_out:.3g} "
          f"max|lse-ref|={cmp.max_abs_lse:.3g} cos={cmp.cos_dist:.2g} {'' if cmp.ok else cmp.message}", flush=True)
    return 0 if cmp.ok else 3


def run_case(variant, name, case_timeout, hang_timeout, sanitizer, log_dir):
    """Parent: the case in a subprocess; returns (verdict, detail, seconds, log text)."""
    cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--child", name, "--variant", variant]
    if sanitizer:
        cmd = ["compute-sanitizer", "--tool", sanitizer, "--error-exitcode", "9"] + cmd
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               PYTHONUNBUFFERED="1")
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=str(REPO), start_new_session=True)
    lines = []
    launched = []
    finished = []

    def reader():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("LAUNCH"):
                launched.append(time.perf_counter())
            elif line.startswith("DONE"):
                finished.append(time.perf_counter())

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    verdict = None
    while proc.poll() is None:
        now = time.perf_counter()
        if launched and not finished and now - launched[0] > hang_timeout:
            verdict = "HANG"
        elif now - start > case_timeout:
            verdict = "HANG" if launched else "TIMEOUT"
        if verdict:
            try:
                os.killpg(proc.pid, 9)  # the child's own session: only what this script started
            except ProcessLookupError:
                pass
            proc.wait()
            break
        time.sleep(0.2)
    th.join(timeout=5)
    seconds = time.perf_counter() - start
    text = "\n".join(lines)
    if log_dir:
        (log_dir / f"{name}.log").write_text(text + "\n")
    result = [ln for ln in lines if ln.startswith("RESULT ")]
    plan = next((ln for ln in lines if ln.startswith("plan: ")), "")
    if verdict == "HANG":
        detail = f"no result {hang_timeout:.0f} s after the launch"
    elif verdict == "TIMEOUT":
        detail = f"no launch within {case_timeout:.0f} s (import/compile)"
    elif result and proc.returncode in (0, 3):
        verdict = result[-1].split()[1]
        detail = result[-1].split(None, 2)[2] if len(result[-1].split()) > 2 else ""
    else:
        verdict = "CRASH"
        errors = [ln for ln in lines if "rror" in ln or "illegal" in ln.lower() or "CUDA" in ln]
        detail = f"exit {proc.returncode}: " + (errors[-1] if errors else (lines[-1] if lines else "no output"))
    if sanitizer and proc.returncode == 9:
        verdict = "SANITIZER"
        errs = [ln for ln in lines if ln.startswith("=========")]
        detail = errs[0] if errs else detail
    return verdict, detail, seconds, plan


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", default=None, help="default: $MLA_PIPELINE, else 3wg")
    ap.add_argument("--case", action="append", help=f"case name (repeatable); default: all of {list(CASES)}")
    ap.add_argument("--case-timeout", type=float, default=240.0, help="seconds per case in all (default 240)")
    ap.add_argument("--hang-timeout", type=float, default=25.0,
                    help="seconds after the launch before a case counts as hung (default 25)")
    ap.add_argument("--budget", type=float, default=540.0,
                    help="seconds for the whole run; later cases are skipped (default 540)")
    ap.add_argument("--jobs", type=int, default=None, help="parallel compiles (default: min(configs, cores/2))")
    ap.add_argument("--no-precompile", action="store_true", help="let each case compile its own configuration")
    ap.add_argument("--sanitizer", choices=("memcheck", "synccheck", "racecheck", "initcheck"),
                    help="run each case under compute-sanitizer with this tool")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    variant = args.variant or os.environ.get("MLA_PIPELINE", "").strip() or "3wg"
    if variant == "auto":
        variant = "2wg"
    if args.child:
        return run_case_child(variant, args.child)
    if args.list:
        for name, case in CASES.items():
            print(f"{name:24s} s_q={case[1]} h_q={case[2]} h_kv={case[3]} causal={case[4]} {case[5]} "
                  f"page={case[6]} num_sms={case[7] or 'device'}")
        return 0
    names = args.case or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; see --list")
    t_start = time.perf_counter()
    out_dir = pathlib.Path(os.environ["OUT"]) / "diag_3wg" if os.environ.get("OUT") else None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
    register(variant)
    import pipelines
    print(f"variant {variant} (registered here for this run: {pipelines.available_variants()}), "
          f"repo {REPO}, pipelines from {pipelines.__file__}", flush=True)
    try:
        rev = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--oneline"], capture_output=True, text=True)
        print(f"commit: {rev.stdout.strip()}", flush=True)
    except OSError:
        pass

    if not args.no_precompile:
        configs = list(dict.fromkeys(_config(variant, CASES[n]) for n in names))
        jobs = args.jobs or max(1, min(len(configs), (os.cpu_count() or 2) // 2))
        print(f"compiling {len(configs)} configurations ({jobs} processes) ...", flush=True)
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            futures = [pool.submit(_compile_one, variant, c) for c in configs]
            for f in concurrent.futures.as_completed(futures):
                try:
                    label, source, secs = f.result()
                    print(f"  {label}: {source} in {secs:.1f} s", flush=True)
                except Exception as exc:  # noqa: BLE001 - the case that needs it reports it again
                    print(f"  compile FAILED: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                          flush=True)
        print(f"compiled in {time.perf_counter() - t_start:.0f} s", flush=True)

    results = []
    for name in names:
        left = args.budget - (time.perf_counter() - t_start)
        if left < 20:
            results.append((name, "SKIP", "budget spent", 0.0, ""))
            print(f"{name:24s} SKIP (budget)", flush=True)
            continue
        verdict, detail, secs, plan = run_case(variant, name, min(args.case_timeout, left), args.hang_timeout,
                                               args.sanitizer, out_dir)
        results.append((name, verdict, detail, secs, plan))
        print(f"{name:24s} {verdict:8s} {secs:6.1f} s  {detail}", flush=True)
        if plan:
            print(f"{'':24s} {plan[:300]}", flush=True)
    counts = {}
    for r in results:
        counts[r[1]] = counts.get(r[1], 0) + 1
    print(f"summary ({variant}): " + ", ".join(f"{v} {n}" for v, n in sorted(counts.items())), flush=True)
    if out_dir:
        (out_dir / "summary.json").write_text(json.dumps(
            [dict(case=n, verdict=v, detail=d, seconds=round(s, 1), plan=p) for n, v, d, s, p in results], indent=1))
    ran = [r for r in results if r[1] != "SKIP"]
    return 0 if ran and all(r[1] == "PASS" for r in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
