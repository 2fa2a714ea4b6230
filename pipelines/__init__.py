"""CuTe DSL pipeline variants for MLA paged decode (sm_90a).

The contract with ``mla`` is documented in ``docs/interfaces.md``. This module is the registry:
it maps a variant name to its kernel driver. It never imports ``mla``.
"""
from __future__ import annotations

VARIANTS = ("2wg", "3wg", "seesaw")

# Variants whose kernel exists. Every kernel loads K through the skeleton's paged-KV loaders, so each
# serves every page size of ``pipelines.paged_kv.PAGE_SIZES`` (the one place they are stated).
# 2wg has two kernels: pipelines/variant_2wg.py, and at <= 32 query rows per kv head (without a split
# cluster) pipelines/variant_2wg_narrow.py, both products transposed (``pipelines.launch`` picks).
# 3wg (pipelines/variant_3wg.py): WG1 used to choose its per-tile wgmma order from a per-thread
# mbarrier.test_wait, so its warps could issue different wgmma in chunks of 2+ tiles ("illegal
# instruction" on an H200); the choice is now OR-reduced over the warpgroup. After that fix it passed
# scripts/diag_3wg.py (15 of 15 cases, H200, 2026-11-22) and is registered.
# seesaw (pipelines/variant_seesaw.py): correct on every GPU test (H200, 2026-11-22; its rebuilt schedule
# on an H100, 2026-11-26) but slower than 2wg on every shape measured; registered so it can be selected
# and measured, never chosen by auto until a perf run shows it faster somewhere.
_WITH_KERNEL = ("2wg", "3wg", "seesaw")


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


# Variants whose m-block CTAs share K tiles through a TMA multicast cluster where ``paged_kv.cluster_size``
# gives one (``MLA_MULTICAST`` unset or 1). seesaw never does (``MLADecodeSeesaw.multicast_cluster``): in one
# H100 perf run its 49 cluster configurations of page 64 ran 5.7% faster without the cluster (geomean; a
# multicast refill waits for both CTAs' releases, and the seesaw's iteration is bound by its refills),
# where 2wg's do not (docs/perf-notes.md, thirtieth session).
MULTICAST_VARIANTS = ("2wg", "3wg")


def multicast_cluster(page_size: int, rows: int, variant: str | None = None) -> int:
    """CTAs per TMA multicast cluster the kernels (``variant``'s, if given) launch for ``page_size`` and
    ``rows`` query rows per kv head (``h_q * s_q / h_kv``) while multicast is on (``MLA_MULTICAST``
    unset or 1); 1 means no cluster, so ``MLA_MULTICAST=0`` changes nothing for that configuration."""
    from pipelines import paged_kv

    if variant is not None and variant not in MULTICAST_VARIANTS:
        return 1
    return paged_kv.cluster_size(page_size, -(-rows // 64), True)


def _require_kernel(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"pipeline must be one of {VARIANTS}, got {variant!r}")
    if variant not in _WITH_KERNEL:
        raise NotImplementedError(f"pipeline {variant!r} has no kernel yet; available: {available_variants()}")


def workspace_numel(batch_size: int, num_parts: int, rows: int) -> int:
    """fp32 elements of the split-kv workspace ``run_decode`` takes: ``(b + num_parts) * rows * 513``
    (``o_accum [b + num_parts, rows, 512]`` then ``lse_accum [b + num_parts, rows]``, one buffer;
    ``rows = s_q * h_q``). See docs/interfaces.md, "Workspace"."""
    from split_k.planner import workspace_shapes  # the one definition of the two shapes

    o_shape, lse_shape = workspace_shapes(batch_size, num_parts, rows)
    return o_shape[0] * o_shape[1] * o_shape[2] + lse_shape[0] * lse_shape[1]


GRID_MERGE_ENV_VAR = "MLA_GRID_MERGE"
"""``MLA_GRID_MERGE``: where the decode merges split-kv in its own grid (``grid_merge_mode``) instead of
launching the merge kernel: one launch per call instead of two, about 2.5 us less host time per
eager call, but 0.4-0.7 us more GPU time where each CTA has at most one merge cell and 2-4 us more
where the merge needs more (H200, docs/perf-notes.md). Unset, ``""`` or ``auto`` (the default): eager
calls whose merge is one cell per CTA (never under CUDA-graph capture, where the launch cost is paid
once); ``1``/``on``: every call the kernel can; ``0``/``off``: never."""
GRID_MERGE_VARIANTS = ("2wg",)
"""Variants whose kernels merge in their grid (``in_grid_merge`` on the kernel classes; a CPU test
checks that the two agree)."""
# The compiled entry's ``grid_merge`` argument for a call that writes nothing of the plan (the torch op, whose schema
# declares it read-only): neither the in-grid merge nor the merge by each request's last chunk (``launch.DecodeEntry``).
PLAN_READ_ONLY = -1
GRID_MERGE_NEVER, GRID_MERGE_ALWAYS, GRID_MERGE_EAGER = 0, 1, 2
_SM_COUNTS: dict = {}


def grid_merge_setting(value: str | None = None) -> str:
    """The ``MLA_GRID_MERGE`` setting (``value``, else the environment): ``"auto"``, ``"on"`` or
    ``"off"``. Raises ``ValueError`` naming the variable for anything but unset, ``""``, ``auto``,
    ``1``, ``on``, ``0``, ``off``."""
    import os

    raw = os.environ.get(GRID_MERGE_ENV_VAR) if value is None else value
    text = "auto" if raw is None or raw.strip() == "" else raw.strip().lower()
    setting = {"auto": "auto", "1": "on", "on": "on", "0": "off", "off": "off"}.get(text)
    if setting is None:
        raise ValueError(f"{GRID_MERGE_ENV_VAR} must be auto, 0, 1, off or on (or unset), got {raw!r}")
    return setting


def device_sm_count(device) -> int:
    """Multiprocessor count of a CUDA ``device`` (cached per device index); 0 for any other device
    (nothing runs a grid there: no in-grid merge)."""
    import torch

    if device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    n = _SM_COUNTS.get(index)
    if n is None:
        n = _SM_COUNTS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return n


def grid_merge_mode(variant: str, rows_per_kv: int, num_heads_k: int, split_cluster: int, num_parts: int,
                    sm_count: int, setting: str = "auto", merge_cells: int = 1) -> int:
    """Whether a call's decode merges split-kv in its own grid: ``GRID_MERGE_NEVER`` (the merge kernel),
    ``GRID_MERGE_ALWAYS`` or ``GRID_MERGE_EAGER`` (eager calls only: the API passes the entry's
    ``grid_merge`` 0 under CUDA-graph capture). Possible where the variant's kernel does it
    (``GRID_MERGE_VARIANTS``), without a split cluster, for a grid of at most ``sm_count`` CTAs
    (``ceil(rows_per_kv / 64)`` m-blocks x ``num_parts`` x ``num_heads_k``): one CTA per SM, all resident
    at once, which the grid barrier needs (the launch is cooperative, so the driver refuses a grid the
    GPU cannot hold at once rather than leaving it waiting). A plan for the device's own SM count (the
    default) always fits; one made for more SMs does not. ``setting`` (``grid_merge_setting``): "on"
    takes every such call; "auto" only those whose merge gives each CTA at most one cell
    (``merge_cells``, the in-grid merge's cells per plan part, ``split_k.merge_kernel.in_grid_y``, at
    most the part's ``m-blocks x num_heads_k`` CTAs), and only eagerly."""
    if setting == "off" or variant not in GRID_MERGE_VARIANTS or split_cluster != 1:
        return GRID_MERGE_NEVER
    ctas_per_part = -(-rows_per_kv // 64) * num_heads_k
    if ctas_per_part * num_parts > sm_count:
        return GRID_MERGE_NEVER
    if setting == "on":
        return GRID_MERGE_ALWAYS
    return GRID_MERGE_EAGER if merge_cells <= ctas_per_part else GRID_MERGE_NEVER


def decode_launcher(variant: str, dtype, num_heads_q: int, seqlen_q: int, page_size: int, causal: bool,
                    num_heads_k: int = 1, multicast: bool | None = None, partial=None, split_cluster: int = 1):
    """The compiled decode of one static configuration, from memory, the on-disk kernel cache, or a
    fresh compile (seconds, once per machine). Returns a callable ``(q, k_cache, block_table,
    cache_seqlens, tile_scheduler_metadata, num_splits, out, lse, workspace, softmax_scale,
    grid_merge)`` that launches the decode kernel and the split-kv merge (``grid_merge`` 1: in the
    decode's grid, ``grid_merge_mode``) on the current torch stream, with no host synchronisation and
    no allocation. Inputs must already be validated by ``mla``.
    ``multicast``: allow a TMA multicast cluster; None reads ``MLA_MULTICAST`` now.
    ``partial``: dtype of the split-kv partials, ``"float32"``, ``"input"`` (q's dtype) or that dtype;
    None reads ``MLA_PARTIAL_DTYPE`` now (default: the input dtype). ``split_cluster``: the plan's
    (``split_k.planner.split_cluster``)."""
    _require_kernel(variant)
    from pipelines import paged_kv
    from pipelines.launch import DecodeConfig, decode_launcher as _launcher, partial_from_env
    if multicast is None:
        multicast = paged_kv.multicast_enabled()
    if partial is None:
        partial = partial_from_env()
    return _launcher(DecodeConfig.make(variant, dtype, num_heads_q, seqlen_q, page_size, causal, num_heads_k,
                                       multicast, partial, split_cluster))


def run_decode(variant, q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits,
               out, lse, workspace, softmax_scale, causal):
    """Launch the decode kernel of ``variant`` and the split-kv merge on the current torch stream
    (``decode_launcher`` for the configuration of these tensors, then one call)."""
    from split_k.planner import split_cluster
    cluster = split_cluster(q.shape[0], tile_scheduler_metadata.shape[0])
    launch = decode_launcher(variant, q.dtype, q.shape[2], q.shape[1], k_cache.shape[1], causal, k_cache.shape[2],
                             split_cluster=cluster)
    h_kv = k_cache.shape[2]
    mode = grid_merge_mode(variant, q.shape[1] * q.shape[2] // h_kv, h_kv, cluster, tile_scheduler_metadata.shape[0],
                           device_sm_count(q.device), grid_merge_setting())
    flag = int(mode == GRID_MERGE_ALWAYS)  # a plain helper: "auto" (eager only) is the API's
    launch(q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits, out, lse, workspace,
           float(softmax_scale), flag)


def run_planner(cache_seqlens, tile_scheduler_metadata, num_splits, split_cluster: int = 1):
    """Write the split plan of ``cache_seqlens`` (int32 ``[b]``, contiguous, ``b >= 1``) into
    ``tile_scheduler_metadata`` (int32 ``[num_parts, 8]``) and ``num_splits`` (int32 ``[b + 1]``) with
    the planner kernel of ``split_k.planner_kernel``, on the current stream: no host sync, no
    allocation. Inputs already validated by ``mla`` (``split_k.planner_kernel.check_limits``).
    ``split_cluster > 1``: the plan of ``split_k.planner.plan_clustered`` (its first rows, the rest
    made empty parts)."""
    from pipelines.launch import launch_planner
    if split_cluster > 1:
        from split_k.planner import empty_rows, split_groups
        groups = split_groups(tile_scheduler_metadata.shape[0], split_cluster)
        empty_rows(tile_scheduler_metadata[groups:])
        tile_scheduler_metadata = tile_scheduler_metadata[:groups]
    launch_planner(cache_seqlens, tile_scheduler_metadata, num_splits, split_cluster)
