"""Compile a model configuration's decode kernels ahead, into the on-disk kernel cache.

    python -m mla.precompile [--dtype bf16 fp16] [--heads-q 128 64] [--seqlen-q 1 2] [--heads-k 1]
                             [--page-size 64] [--pipeline 2wg|3wg|auto] [--causal both|yes|no]
                             [--multicast env|on|off|both] [--jobs N]
    python -m mla.precompile --list       # what the cache holds for this toolchain and these sources
    python -m mla.precompile --prune      # delete entries of other toolchains / older sources

Every combination of the values given is one compiled entry (decode + merge kernels) keyed by
(pipeline, dtype, h_q, s_q, page size, causal, h_kv, multicast cluster size); causal only exists
for s_q > 1, where ``--causal both`` (default) compiles both; the cluster follows ``MLA_MULTICAST``
unless ``--multicast`` says otherwise (configurations without a cluster are one entry either way).
``pipeline="auto"`` may run either variant: the default (every pipeline with a kernel) covers it;
``--pipeline auto`` compiles, per configuration, only the variants the auto table
(``pipelines/auto_table.py``) may choose for it at any batch size and KV length (``MLA_PIPELINE``'s
variant when that is set). The split planner kernel (one entry for every
configuration; ``get_mla_metadata`` and ``MLADecoder.plan`` run it for CUDA lengths) comes along
unless ``--no-planner``. A serving engine sharded over tensor-parallel degrees
lists its per-GPU head counts (DeepSeek-V3's 128 heads: 128, 64, 32, 16 for TP 1, 2, 4, 8).
Entries already in the cache are loaded and verified, not recompiled. The cache is
``$MLA_CACHE_DIR``, else ``$XDG_CACHE_HOME/mla-decode``, else ``~/.cache/mla-decode`` (one
subdirectory per fingerprint of the kernel sources and toolchain); ``MLA_DISK_CACHE=0`` turns it
off, which makes this command pointless (it says so and exits 2).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import re
import shutil
import sys
import time

_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}
_CAUSAL = {"both": (False, True), "yes": (True,), "no": (False,)}


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {value}")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m mla.precompile", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--dtype", nargs="+", default=["bf16"], choices=sorted(_DTYPES), help="default: bf16")
    parser.add_argument("--heads-q", nargs="+", type=_positive, default=[128], metavar="H",
                        help="query heads per GPU (h_q); default: 128")
    parser.add_argument("--seqlen-q", nargs="+", type=_positive, default=[1], metavar="S",
                        help="query tokens per request (s_q, 1..4); default: 1")
    parser.add_argument("--heads-k", nargs="+", type=_positive, default=[1], metavar="H",
                        help="kv heads per GPU (h_kv); default: 1")
    parser.add_argument("--page-size", nargs="+", type=_positive, metavar="P",
                        help="default: every page size the pipeline supports")
    parser.add_argument("--pipeline", nargs="+",
                        help="default: every pipeline with a kernel (which covers auto). auto: per configuration, "
                             "the variants pipeline='auto' may choose for it, at any batch size and KV length "
                             "(MLA_PIPELINE's variant when that is set)")
    parser.add_argument("--causal", choices=sorted(_CAUSAL), default="both",
                        help="for s_q > 1: causal, non-causal or both (default)")
    parser.add_argument("--multicast", choices=("env", "on", "off", "both"), default="env",
                        help="TMA multicast clusters (where a configuration has one): as MLA_MULTICAST says "
                             "(default: what decodes in this environment will ask for), on, off, or both")
    parser.add_argument("--partial", choices=("env", "float32", "input", "both"), default="env",
                        help="split-kv partial dtype: as MLA_PARTIAL_DTYPE says (default: the input dtype), fp32, "
                             "the input dtype, or both")
    parser.add_argument("--no-planner", action="store_true", help="leave out the split planner kernel")
    parser.add_argument("--jobs", type=_positive, default=None,
                        help="compiles in parallel (processes); default: min(entries, cores / 2, 8)")
    parser.add_argument("--list", action="store_true", help="list the cached entries and exit")
    parser.add_argument("--prune", action="store_true",
                        help="delete cache directories of other source/toolchain fingerprints and exit")
    return parser.parse_args(argv)


def plan_configs(args: argparse.Namespace) -> tuple[list, list[str]]:
    """``(configs, skipped)``: the ``DecodeConfig`` of every valid combination, in a stable order, and
    one line per combination left out (and why). Raises ``ValueError`` for an unknown pipeline."""
    import pipelines
    from pipelines import auto, paged_kv

    multicast = {"env": (paged_kv.multicast_enabled(),), "on": (True,), "off": (False,),
                 "both": (True, False)}[args.multicast]
    from pipelines.launch import partial_from_env
    partials = {"env": (partial_from_env(),), "float32": ("float32",), "input": ("input",),
                "both": ("float32", "input")}[args.partial]
    from . import api

    available = pipelines.available_variants()
    names = args.pipeline or available
    for v in names:
        if v not in ("auto",) + tuple(pipelines.VARIANTS):
            raise ValueError(f"--pipeline must be among {('auto',) + tuple(pipelines.VARIANTS)}, got {v!r}")
        if v != "auto" and v not in available:
            raise ValueError(f"pipeline {v!r} has no kernel yet; pipelines with a kernel: {available}")
    fixed = api.fixed_pipeline("auto") if "auto" in names else None  # MLA_PIPELINE: auto is that variant
    if fixed is not None and fixed not in available:
        raise ValueError(f"{api.PIPELINE_ENV_VAR}={fixed} (what auto means here) has no kernel yet; pipelines "
                         f"with a kernel: {available}")
    configs, skipped = [], []
    for name in names:
        if name == "auto":
            pages = args.page_size or sorted({p for v in available for p in pipelines.supported_page_sizes(v)})
        else:
            pages = args.page_size or list(pipelines.supported_page_sizes(name))
        for dtype in dict.fromkeys(_DTYPES[d] for d in args.dtype):
            for h_q in args.heads_q:
                for h_kv in args.heads_k:
                    for s_q in args.seqlen_q:
                        for page in pages:
                            if name != "auto":
                                variants = (name,)
                            elif fixed is not None:
                                variants = (fixed,)
                            elif h_kv <= h_q and not h_q % h_kv:  # else skipped below, whatever the variant
                                # every variant auto may choose for this configuration, any batch and length
                                variants = auto.choices(page, s_q, h_q, h_kv, api.auto_candidates(page))
                            else:
                                variants = (api.DEFAULT_PIPELINE,)
                            for variant in variants:
                                configs += _variant_configs(variant, dtype, h_q, h_kv, s_q, page, args, multicast,
                                                            partials, skipped)
    return list(dict.fromkeys(configs)), skipped


def _variant_configs(variant, dtype, h_q, h_kv, s_q, page, args, multicast, partials, skipped) -> list:
    """The DecodeConfigs of one variant and combination, or none (and a line in ``skipped``) when the
    combination is invalid."""
    import pipelines
    from pipelines.launch import DecodeConfig

    from .validate import MAX_HEADS_PER_KV, MAX_S_Q

    configs = []
    label = f"{variant} {dtype} h_q={h_q} h_kv={h_kv} s_q={s_q} page={page}"
    why = None
    if h_q % h_kv:
        why = "h_q is not a multiple of h_kv"
    elif h_q // h_kv > MAX_HEADS_PER_KV:
        why = f"h_q / h_kv > {MAX_HEADS_PER_KV}"
    elif s_q > MAX_S_Q:
        why = f"s_q > {MAX_S_Q}"
    elif page not in pipelines.supported_page_sizes(variant):
        why = f"page size not supported by {variant} {pipelines.supported_page_sizes(variant)}"
    if why:
        if f"{label}: {why}" not in skipped:
            skipped.append(f"{label}: {why}")
        return configs
    for causal in (_CAUSAL[args.causal] if s_q > 1 else (False,)):
        for mc in multicast:
            for partial in partials:
                for split in split_clusters():
                    configs.append(DecodeConfig.make(variant, dtype, h_q, s_q, page, causal, h_kv, mc, partial,
                                                     split))
    return configs


def split_clusters() -> tuple[int, ...]:
    """The split-cluster sizes a configuration may run with under ``MLA_SPLIT_CLUSTER`` (read now): 1
    (always: plans without room for a group, or the setting off) and the setting's size."""
    from split_k import planner

    size = planner.split_cluster_setting()
    return (1,) if size == 1 else (1, size)


PLANNER = "planner"
"""The planner kernel's item in the list of things to compile (its one entry has no configuration)."""


def _label(item) -> str:
    if isinstance(item, tuple) and item and item[0] == PLANNER:
        return f"split planner kernel (units of {item[1]} tiles)"
    return "split planner kernel" if item == PLANNER else item.label()


def _lookup(item) -> dict:
    """Load or compile one entry (runs in a worker process when --jobs > 1)."""
    from pipelines import launch

    start = time.perf_counter()
    if item == PLANNER:
        result = launch.kernel_cache().lookup(launch.PLANNER_KEY, launch.compile_planner)
    elif isinstance(item, tuple) and item and item[0] == PLANNER:  # the planner of a split cluster
        result = launch.kernel_cache().lookup(launch.PLANNER_KEY + (item[1],),
                                              lambda: launch.compile_planner(split_cluster=item[1]))
    else:
        result = launch.lookup_entry(item)
    return {"source": result.source, "path": str(result.path) if result.path else None,
            "seconds": time.perf_counter() - start, "replaced": result.replaced}


def _bar(done: int, total: int, width: int = 24) -> str:
    filled = width * done // total
    return "[" + "#" * filled + "." * (width - filled) + f"] {done:>{len(str(total))}}/{total}"


def main(argv=None) -> int:
    args = parse_args(argv)
    from pipelines import cache as cache_mod
    from pipelines import launch

    try:
        enabled = cache_mod.disk_cache_enabled()
    except ValueError as exc:
        print(f"precompile: {exc}", file=sys.stderr)
        return 2
    if not enabled:
        print(f"precompile: the kernel disk cache is off ({cache_mod.DISK_CACHE_ENV}=0): nothing compiled now "
              f"would outlive this process", file=sys.stderr)
        return 2
    kernel_cache = launch.kernel_cache()
    directory = kernel_cache.directory
    if args.list:
        entries = kernel_cache.entries()
        print(f"{directory}: {len(entries)} entries")
        for e in entries:
            print(f"  {e['key']}  {e['size']} bytes  {e['created']}  {e['object']}")
        return 0
    if args.prune:
        # Only directories this cache made (a namespace name and its namespace.json): the root may
        # be a directory the user shares with other things.
        removed = [p for p in sorted(directory.parent.iterdir()) if p.is_dir() and p != directory
                   and re.fullmatch(r"[0-9a-f]{24}", p.name) and (p / "namespace.json").is_file()]
        for p in removed:
            shutil.rmtree(p)
        print(f"removed {len(removed)} stale cache directories from {directory.parent}; kept {directory.name}")
        return 0
    try:
        configs, skipped = plan_configs(args)
    except ValueError as exc:
        print(f"precompile: {exc}", file=sys.stderr)
        return 2
    for line in skipped:
        print(f"skipped {line}")
    if not configs:
        print("precompile: no valid configuration to compile", file=sys.stderr)
        return 2
    if not args.no_planner:
        configs = [PLANNER] + [(PLANNER, c) for c in split_clusters() if c > 1] + configs
    jobs = args.jobs or max(1, min(len(configs), (os.cpu_count() or 2) // 2, 8))
    jobs = min(jobs, len(configs))
    print(f"precompile: {len(configs)} entries into {directory} ({jobs} job{'s' if jobs > 1 else ''})", flush=True)
    start = time.perf_counter()
    counts = {"compiled": 0, "disk": 0, "memory": 0}
    failures = 0

    def report(i, config, outcome):
        nonlocal failures
        if isinstance(outcome, BaseException):
            failures += 1
            what = f"FAILED {type(outcome).__name__}: {str(outcome).splitlines()[0] if str(outcome) else ''}"
        else:
            counts[outcome["source"]] += 1
            source = {"compiled": "compiled", "disk": "already cached", "memory": "already cached"}[outcome["source"]]
            replaced = f" (replaced an entry: {outcome['replaced']})" if outcome["replaced"] else ""
            what = f"{source} {outcome['seconds']:6.1f} s{replaced}"
        print(f"{_bar(i, len(configs))} {_label(config):<52} {what}", flush=True)

    if jobs == 1:
        for i, config in enumerate(configs, 1):
            try:
                outcome = _lookup(config)
            except Exception as exc:  # noqa: BLE001 - reported per entry, the others still compile
                outcome = exc
            report(i, config, outcome)
    else:
        # Separate processes: each compile runs the DSL compiler (single-threaded) in its own
        # interpreter; the cache's file locks keep two processes from compiling one entry twice.
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            futures = {pool.submit(_lookup, config): config for config in configs}
            for i, future in enumerate(concurrent.futures.as_completed(futures), 1):
                try:
                    outcome = future.result()
                except Exception as exc:  # noqa: BLE001
                    outcome = exc
                report(i, futures[future], outcome)
    stored = len(kernel_cache.entries())
    info = launch.namespace_info()
    print(f"done in {time.perf_counter() - start:.1f} s: {counts['compiled']} compiled, "
          f"{counts['disk'] + counts['memory']} already cached, {failures} failed; {directory} holds {stored} "
          f"entries (kernel sources {info['sources_sha256'][:12]}, CuTe DSL {info['cutlass_dsl']}, "
          f"TVM-FFI {info['tvm_ffi']}, {info['python']}, {info['arch']})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
