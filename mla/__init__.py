"""MLA paged decode attention for NVIDIA Hopper (sm_90a), kernels written with the CuTe DSL.

Public API (FlashMLA-compatible names and argument positions)::

    from mla import get_mla_metadata, flash_mla_with_kvcache, MLADecoder

- ``get_mla_metadata(cache_seqlens, s_q * h_q // h_kv, h_kv)`` -> ``(tile_scheduler_metadata,
  num_splits)``; ``get_mla_metadata()`` -> ``(MLASchedMeta(), None)``, planned on first use.
- ``flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, 512, tile_scheduler_metadata,
  num_splits, softmax_scale=None, causal=False, *, pipeline="auto", out=None)`` -> ``(out, lse)``;
  its split-kv workspace is kept per device and stream (``release_workspaces()`` drops them).
- ``MLADecoder(pipeline="auto")``: ``plan(...)`` once, ``run(...)`` many times (CUDA-graph safe).
- ``mla.reference.mla_decode_reference``: the fp32 reference (CPU or GPU).
- ``torch.ops.mla.decode``: the decode as a torch custom op (``mla.ops``; registered on import), what
  the API traces to under ``torch.compile``.

``pipeline=`` picks the kernel variant: ``"2wg"`` (FlashMLA-style, two math warpgroups), ``"3wg"``
(FA3-style producer + two consumers), ``"seesaw"`` (2wg's two-tiles-per-iteration form) or ``"auto"`` (env var ``MLA_PIPELINE`` when set, else the
faster variant for the call's shape as measured into ``pipelines/auto_table.py``; ``resolve_pipeline``).
"""
from .api import (DEFAULT_PIPELINE, PIPELINE_CHOICES, PIPELINE_ENV_VAR, MLADecoder, MLASchedMeta,
                  flash_mla_with_kvcache, get_mla_metadata, release_workspaces, resolve_pipeline)
from .reference import mla_decode_reference
from . import ops  # noqa: E402,F401 - registers torch.ops.mla.decode

__all__ = [
    "get_mla_metadata", "flash_mla_with_kvcache", "MLADecoder", "MLASchedMeta", "mla_decode_reference",
    "resolve_pipeline", "release_workspaces", "PIPELINE_CHOICES", "PIPELINE_ENV_VAR", "DEFAULT_PIPELINE",
]
