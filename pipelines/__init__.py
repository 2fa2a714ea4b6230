"""CuTe DSL pipeline variants for MLA paged decode (sm_90a).

The contract with ``mla`` is documented in ``docs/interfaces.md``. This module is the registry:
it maps a variant name to its kernel driver. It never imports ``mla``.
"""
from __future__ import annotations

VARIANTS = ("2wg", "3wg")

# Variants whose kernel exists. Every kernel loads K through the skeleton's paged-KV loaders, so each
# serves every page size of ``pipelines.paged_kv.PAGE_SIZES`` (the one place they are stated).
_WITH_KERNEL = ("2wg",)


def available_variants() -> list[str]:
    """Variants whose kernel exists (a subset of ``VARIANTS``)."""
    return [v for v in VARIANTS if v in _WITH_KERNEL]


def supported_page_sizes(variant: str) -> tuple[int, ...]:
    """Page sizes the variant's load path handles; empty if the variant has no kernel yet."""
    if variant not in VARIANTS:
        raise ValueError(f"pipeline must be one of {VARIANTS}, got {variant!r}")
    if variant not in _WITH_KERNEL:
        return ()
    from pipelines.paged_kv import PAGE_SIZES  # imports the DSL: only when a kernel may be used

    return PAGE_SIZES


def multicast_cluster(page_size: int, rows: int) -> int:
    """CTAs per TMA multicast cluster the kernels launch for ``page_size`` and ``rows`` query rows per kv
    head (``h_q * s_q / h_kv``) while multicast is on (``MLA_MULTICAST`` unset or 1); 1 means no
    cluster, so ``MLA_MULTICAST=0`` changes nothing for that configuration."""
    from pipelines import paged_kv

    return paged_kv.cluster_size(page_size, -(-rows // 64), True)


def run_decode(variant, q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits,
               out, lse, o_accum, lse_accum, softmax_scale, causal):
    """Launch the decode kernel of ``variant`` and the split-kv merge on the current torch stream."""
    if variant not in VARIANTS:
        raise ValueError(f"pipeline must be one of {VARIANTS}, got {variant!r}")
    if variant not in _WITH_KERNEL:
        raise NotImplementedError(f"pipeline {variant!r} has no kernel yet; available: {available_variants()}")
    from pipelines.launch import launch_decode
    launch_decode(variant, q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits,
                  out, lse, o_accum, lse_accum, softmax_scale, causal)


def run_planner(cache_seqlens, tile_scheduler_metadata, num_splits):
    """Write the split plan of ``cache_seqlens`` (int32 ``[b]``, contiguous, ``b >= 1``) into
    ``tile_scheduler_metadata`` (int32 ``[num_parts, 8]``) and ``num_splits`` (int32 ``[b + 1]``) with
    the planner kernel of ``split_k.planner_kernel``, on the current stream: no host sync, no
    allocation. Inputs already validated by ``mla`` (``split_k.planner_kernel.check_limits``)."""
    from pipelines.launch import launch_planner
    launch_planner(cache_seqlens, tile_scheduler_metadata, num_splits)
