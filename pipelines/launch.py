"""Host glue: compile cache keyed by every static knob, torch -> CuTe tensor views, launches.

A kernel is compiled once per (variant, dtype, h_q, s_q, page_size, causal, h_kv, cluster size) against symbolic
shapes and strides (batch, pages, plan size are runtime values), so a serving engine pays the
compile once per model configuration, not per batch shape.
"""
from __future__ import annotations

import os
import threading

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # never default to another arch when compiling without a GPU

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass.cute.runtime import from_dlpack, make_fake_tensor  # noqa: E402

from pipelines.heads import group_queries  # noqa: E402

_LOCK = threading.Lock()
_CACHE: dict = {}

DTYPES = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16}


def _cute_dtype(name: str):
    try:
        return DTYPES[name]
    except KeyError:
        raise TypeError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}") from None


def _kernel_class(variant: str):
    if variant == "2wg":
        from pipelines.variant_2wg import MLADecode2WG
        return MLADecode2WG
    if variant == "3wg":
        from pipelines.variant_3wg import MLADecode3WG
        return MLADecode3WG
    raise NotImplementedError(f"pipeline {variant!r} has no kernel yet")


def _fake(dtype, rank: int, stride_div: int = 1):
    """Fake tensor matching what ``_view`` passes at run time: every extent and every stride but the
    unit one symbolic. The compiled function reads its tensor arguments as descriptors of exactly
    this dynamic/static pattern, so a static extent here would misread the runtime descriptor.
    ``stride_div`` (elements) is the alignment promised for the non-unit strides (16 B for TMA)."""
    shape = tuple(cute.sym_int32() for _ in range(rank))
    stride = tuple(cute.sym_int64(divisibility=stride_div) for _ in range(rank - 1)) + (1,)
    return make_fake_tensor(dtype, shape, stride, assumed_align=16)


def _cached_compile(key, build):
    """Compile once per key: ``build()`` returns ``(kernel object, fake args)``."""
    with _LOCK:
        fn = _CACHE.get(key)
        if fn is None:
            obj, args = build()
            options = key[-1]
            fn = cute.compile(obj, *args) if options is None else cute.compile(obj, *args, options=options)
            _CACHE[key] = fn
        return fn


def compile_decode(variant: str, dtype: str, num_heads: int, seqlen_q: int, page_size: int, causal: bool,
                   num_heads_k: int = 1, multicast: bool = True, options: str | None = None):
    """Compile (or fetch from the cache) the decode kernel for one static configuration.

    ``multicast``: allow a TMA multicast cluster where the configuration has one
    (``paged_kv.cluster_size``); the key holds the resulting cluster size, so a configuration
    without a cluster compiles once whatever the flag."""
    from pipelines import paged_kv

    causal = bool(causal) and seqlen_q > 1  # causal changes nothing for one query token: one kernel
    # m-blocks per kv head: the rows of one CTA's problem are the heads_per_kv * s_q of one kv head.
    cluster = paged_kv.cluster_size(page_size, -(-(num_heads // num_heads_k) * seqlen_q // 64), multicast)

    def build():
        cdt = _cute_dtype(dtype)
        kernel = _kernel_class(variant)(cdt, num_heads, seqlen_q, page_size, causal, num_heads_k,
                                        multicast=cluster > 1)
        i32, f32 = cutlass.Int32, cutlass.Float32
        args = (
            _fake(cdt, 4, 8),  # q [b, s_q, h_q, 576], or [b, h_kv, rows, 576] grouped (h_kv > 1)
            _fake(cdt, 4, 8),  # k [pages, page_size, h_kv, 576]
            _fake(i32, 2),  # block_table [b, max_pages]
            _fake(i32, 1),  # seqlens [b]
            _fake(i32, 2),  # metadata [parts, 8]
            _fake(i32, 1),  # num_splits [b + 1]
            _fake(cdt, 4, 8),  # out [b, s_q, h_q, 512]
            _fake(f32, 3),  # lse [b, h_q, s_q]
            _fake(f32, 3, 8),  # o_accum [splits, s_q * h_q, 512]
            _fake(f32, 2),  # lse_accum [splits, s_q * h_q]
            f32(1.0),
            cute.runtime.make_fake_stream(),
        )
        return kernel, args

    return _cached_compile((variant, dtype, num_heads, seqlen_q, page_size, causal, num_heads_k, cluster, options),
                           build)


def compile_merge(dtype: str, num_heads: int, seqlen_q: int, options: str | None = None):
    """Compile (or fetch) the split-kv merge kernel for one (dtype, h_q, s_q)."""
    def build():
        from split_k.merge_kernel import SplitMerge
        cdt = _cute_dtype(dtype)
        f32 = cutlass.Float32
        args = (_fake(f32, 3, 8), _fake(f32, 2), _fake(cutlass.Int32, 1), _fake(cdt, 4, 8), _fake(f32, 3),
                cute.runtime.make_fake_stream())
        return SplitMerge(cdt, num_heads, seqlen_q), args

    return _cached_compile(("merge", dtype, num_heads, seqlen_q, options), build)


def _view(t):
    return from_dlpack(t, assumed_align=16).mark_layout_dynamic(leading_dim=t.dim() - 1)


def launch_decode(variant, q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits, out,
                  lse, o_accum, lse_accum, softmax_scale, causal):
    import torch
    from cuda.bindings import driver as cuda

    from pipelines import paged_kv

    s_q, h_q = q.shape[1], q.shape[2]
    h_kv = k_cache.shape[2]
    dtype = str(q.dtype).replace("torch.", "")
    fn = compile_decode(variant, dtype, h_q, s_q, k_cache.shape[1], causal, h_kv, paged_kv.multicast_enabled())
    merge = compile_merge(dtype, h_q, s_q)
    q = group_queries(q, h_kv)  # a copy only when h_kv > 1 (pipelines/heads.py says why)
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    num_splits_v, out_v, lse_v, o_accum_v, lse_accum_v = (
        _view(num_splits), _view(out), _view(lse), _view(o_accum), _view(lse_accum))
    fn(_view(q), _view(k_cache), _view(block_table), _view(cache_seqlens), _view(tile_scheduler_metadata),
       num_splits_v, out_v, lse_v, o_accum_v, lse_accum_v, cutlass.Float32(softmax_scale), stream)
    # Second stage: requests with one chunk were written by the main kernel; the merge kernel skips them.
    merge(o_accum_v, lse_accum_v, num_splits_v, out_v, lse_v, stream)


def compile_planner(options: str | None = None):
    """Compile (or fetch) the split planner kernel (``split_k.planner_kernel``) with the plan's constants."""
    def build():
        from split_k.planner_kernel import SplitPlanner
        i32 = cutlass.Int32
        # seqlens [b], metadata [num_parts, 8], num_splits [b + 1]; 4-byte alignment only: the
        # kernel makes scalar accesses, and cache_seqlens may be any view of an int32 tensor.
        args = tuple(make_fake_tensor(i32, shape, stride, assumed_align=4) for shape, stride in (
            ((cute.sym_int32(),), (1,)),
            ((cute.sym_int32(), cute.sym_int32()), (cute.sym_int64(), 1)),
            ((cute.sym_int32(),), (1,))))
        return SplitPlanner(), args + (cute.runtime.make_fake_stream(),)

    return _cached_compile(("planner", options), build)


def launch_planner(cache_seqlens, tile_scheduler_metadata, num_splits):
    """Plan on the current torch stream of cache_seqlens' device into the given int32 tensors
    (validated by the caller: contiguous, b >= 1, within ``split_k.planner_kernel.check_limits``)."""
    import torch
    from cuda.bindings import driver as cuda

    fn = compile_planner()
    with torch.cuda.device(cache_seqlens.device):
        stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
        fn(*(from_dlpack(t, assumed_align=4).mark_layout_dynamic(leading_dim=t.dim() - 1)
             for t in (cache_seqlens, tile_scheduler_metadata, num_splits)), stream)
