"""``python -m mla``: report the environment and check the library on what this machine has.

With a Hopper GPU and a kernel: run small decodes through the public API for every pipeline that
has a kernel, at page sizes 1, 16, 32, 64 and 128 (``--page-size N`` narrows that, e.g. for a
compute-sanitizer run), and compare them with the fp32 reference (exit 1 on a mismatch or an error).
Otherwise say plainly why not, and check the CPU side instead: the split planner plus the merge
math against the unsplit reference (exit 1 on a mismatch). A missing kernel is reported, not a
failure.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import platform
import sys

import torch

import pipelines
from split_k import planner

from . import api
from .reference import compare_to_reference, mla_decode_reference, split_decode_reference
from .testing import hopper_skip_reason, make_decode_problem


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def report_environment() -> None:
    """Print versions, the GPU (if any) and which pipelines have a kernel."""
    dsl = _dist_version("nvidia-cutlass-dsl")
    flavors = [f"{cu} {v}" for cu in ("cu12", "cu13") if (v := _dist_version(f"nvidia-cutlass-dsl-libs-{cu}"))]
    print(f"python {platform.python_version()}, torch {torch.__version__}")
    print(f"CuTe DSL (nvidia-cutlass-dsl): {dsl or 'not installed'}"
          + (f" [libs: {', '.join(flavors)}]" if flavors else ""))
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            print(f"GPU {i}: {props.name}, sm_{props.major}{props.minor}, {props.multi_processor_count} SMs, "
                  f"{props.total_memory / 2**30:.0f} GiB")
    else:
        print("GPU: none (torch.cuda.is_available() is False)")
    available = pipelines.available_variants()
    fixed = api.fixed_pipeline("auto")
    if fixed is not None:
        auto_says = f"{fixed} ({api.PIPELINE_ENV_VAR})"
    else:
        from pipelines import auto_table
        counts = {p: sum(e["pipeline"] == p for e in auto_table.ENTRIES) for p in pipelines.VARIANTS}
        auto_says = (f"per shape from pipelines/auto_table.py ({len(auto_table.ENTRIES)} measured shapes: "
                     + (", ".join(f"{p} {n}" for p, n in counts.items() if n) or f"none: {api.DEFAULT_PIPELINE}") + ")")
    print(f"pipelines: {', '.join(pipelines.VARIANTS)}; with a kernel: {', '.join(available) or 'none yet'}; "
          f"pipeline='auto' -> {auto_says}")


# (s_q, h_q, h_kv, causal) of the GPU self-check: plain decode, causal MTP with two kv heads, and 128
# rows (two m-blocks: with a TMA page size and multicast on, a 2-CTA cluster).
GPU_CHECK_CASES = ((1, 16, 1, False), (2, 16, 2, True), (1, 128, 1, False))
# Page sizes of the GPU self-check (those a pipeline supports): the cp.async gather (1), several pages
# per TMA tile (16, 32), one page per tile (64), half a page per tile (128).
GPU_CHECK_PAGE_SIZES = (1, 16, 32, 64, 128)


GPU_CHECK_SPLIT_CLUSTERS = (1, 8)
"""Split-cluster settings of the GPU self-check: off (the default path) and clusters of 8."""


def gpu_check(page_sizes=GPU_CHECK_PAGE_SIZES) -> bool:
    """Decode b=2, ~200 keys, NaN in unused cache slots, through the public API for each pipeline with
    a kernel, each of ``page_sizes`` it supports, each of ``GPU_CHECK_CASES`` and each of
    ``GPU_CHECK_SPLIT_CLUSTERS``; compare with the reference. Returns True when all pass (and at
    least one decode ran)."""
    import os

    from pipelines import paged_kv

    ok, ran = True, 0
    multicast = paged_kv.multicast_enabled()
    saved = os.environ.get(planner.SPLIT_CLUSTER_ENV_VAR)
    try:
        for variant in pipelines.available_variants():
            for page_size in [p for p in page_sizes if p in pipelines.supported_page_sizes(variant)]:
                for s_q, h_q, h_kv, causal in GPU_CHECK_CASES:
                    for split in GPU_CHECK_SPLIT_CLUSTERS:
                        os.environ[planner.SPLIT_CLUSTER_ENV_VAR] = str(split)
                        good, done = _gpu_case(variant, page_size, s_q, h_q, h_kv, causal, split, multicast)
                        ok &= good
                        ran += done
    finally:
        if saved is None:
            os.environ.pop(planner.SPLIT_CLUSTER_ENV_VAR, None)
        else:
            os.environ[planner.SPLIT_CLUSTER_ENV_VAR] = saved
    if not ran:
        print(f"  no pipeline supports any of the page sizes {tuple(page_sizes)}: nothing checked: FAIL")
    return ok and ran > 0


def decode_case(variant: str, seqlens, page_size: int, s_q: int, h_q: int, h_kv: int, causal: bool):
    """One decode of ``variant`` through the public API on a fresh problem with these request lengths (NaN
    in every unused cache slot), compared with the fp32 reference: the ``Comparison``. Exceptions of the
    call propagate."""
    # The anchors' value distribution (randn / 10, clamped), for which the tolerances are made.
    prob = make_decode_problem(seqlens, s_q=s_q, h_q=h_q, h_kv=h_kv, page_size=page_size,
                               device="cuda", seed=1, value_scale=0.1)
    ref_out, ref_lse = mla_decode_reference(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens,
                                            causal=causal)
    metadata, num_splits = api.get_mla_metadata(prob.cache_seqlens, s_q * h_q // h_kv, h_kv)
    out, lse = api.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512,
                                          metadata, num_splits, causal=causal, pipeline=variant)
    torch.cuda.synchronize()
    return compare_to_reference(out, lse, ref_out, ref_lse)


def _gpu_case(variant, page_size, s_q, h_q, h_kv, causal, split, multicast) -> tuple[bool, int]:
    from pipelines import paged_kv

    cluster = pipelines.multicast_cluster(page_size, s_q * h_q // h_kv, variant) if multicast and split == 1 else 1
    name = (f"{variant} (page {page_size} {'TMA' if paged_kv.uses_tma(page_size) else 'cp.async'}"
            f"{f', cluster {cluster}' if cluster > 1 else ''}{f', split cluster {split}' if split > 1 else ''}, "
            f"s_q {s_q}, h_q {h_q}, h_kv {h_kv}{', causal' if causal else ''})")
    try:
        cmp = decode_case(variant, [200, 137], page_size, s_q, h_q, h_kv, causal)
    except Exception as exc:  # report every variant, then fail
        print(f"  {name}: FAIL, raised {type(exc).__name__}: {exc}")
        return False, 1
    print(f"  {name}: max |out - ref| = {cmp.max_abs_out:.3g}, max |lse - ref| = "
          f"{cmp.max_abs_lse:.3g}, cosine distance {cmp.cos_dist:.2g}: "
          f"{'PASS' if cmp.ok else 'FAIL (' + cmp.message + ')'}")
    return cmp.ok, 1


def cpu_check(num_sms: int = 132) -> bool:
    """Plan a varlen batch (with an empty request) for ``num_sms`` SMs, compute each chunk with the
    reference, merge, and compare with the unsplit reference. Returns True when it matches."""
    ok = True
    for s_q, h_q, causal in ((1, 16, False), (2, 64, True)):
        seqlens = [200, 0, 1000, 37]
        prob = make_decode_problem(seqlens, s_q=s_q, h_q=h_q, seed=2)
        parts = planner.num_sm_parts(num_sms, s_q * h_q, 1)
        metadata, num_splits = planner.plan(seqlens, parts)
        chunks = num_splits[-1].item()
        ref_out, ref_lse = mla_decode_reference(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens,
                                                causal=causal)
        out, lse, _, _ = split_decode_reference(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens,
                                                metadata, num_splits, causal=causal)
        # Both sides are fp32 sums over up to 1000 keys in different orders (and torch's CPU kernels
        # may block them differently from run to run): 1e-4 absolute is a few hundred fp32 ulps of
        # these magnitudes, and a wrong plan or merge is off by O(0.1), far outside it.
        cmp = compare_to_reference(out, lse, ref_out, ref_lse, out_atol=1e-4, out_rtol=1e-5, lse_atol=1e-4,
                                   lse_rtol=1e-6, max_cos_dist=1e-9)
        print(f"  b=4 s_q={s_q} h_q={h_q} causal={causal} lengths {seqlens}: {parts} parts, {chunks} chunks; "
              f"split+merge vs unsplit reference: max |out diff| = {cmp.max_abs_out:.2g}, "
              f"max |lse diff| = {cmp.max_abs_lse:.2g}: {'PASS' if cmp.ok else 'FAIL (' + cmp.message + ')'}")
        ok &= cmp.ok
    return ok


def main(argv: list[str] | None = None) -> int:
    from pipelines import paged_kv

    parser = argparse.ArgumentParser(prog="python -m mla", description=__doc__.split("\n\n")[0])
    parser.add_argument("--page-size", type=int, action="append", choices=paged_kv.PAGE_SIZES,
                        help=f"page size for the GPU check (repeatable; default {GPU_CHECK_PAGE_SIZES})")
    args = parser.parse_args(argv)
    report_environment()
    reason = hopper_skip_reason()
    if reason is None and pipelines.available_variants():
        print("GPU decode check through the public API against the fp32 reference:")
        return 0 if gpu_check(tuple(args.page_size or GPU_CHECK_PAGE_SIZES)) else 1
    if reason is None:
        print("Hopper GPU found, but no pipeline has a kernel yet: no GPU decode to check. "
              "Checking the reference and planner on the CPU instead:")
    else:
        print(f"No Hopper GPU here ({reason}): GPU decode not run. "
              f"Checking the reference and planner on the CPU instead:")
    return 0 if cpu_check() else 1


if __name__ == "__main__":
    sys.exit(main())
