"""``torch.ops.mla.decode``: the decode as a torch custom op, for ``torch.compile`` and CUDA graphs.

Schema::

    mla::decode(Tensor q, Tensor k_cache, Tensor block_table, Tensor cache_seqlens,
                Tensor tile_scheduler_metadata, Tensor num_splits, Tensor(a!) out, Tensor(b!) lse,
                Tensor(c!) workspace, float softmax_scale, bool causal, str pipeline) -> ()

It writes ``out [b, s_q, h_q, 512]`` (q's dtype), ``lse [b, h_q, s_q]`` (fp32, contiguous) and the
split-kv ``workspace`` (fp32, 1-D, ``pipelines.workspace_numel(b, num_parts, s_q * h_q)``
elements) and returns nothing: the outputs are the caller's buffers, which is what a CUDA graph
and an engine's preallocated outputs want. The other arguments are those of
``mla.flash_mla_with_kvcache`` (metadata from ``get_mla_metadata``); ``pipeline`` is ``"2wg"``,
``"3wg"`` or ``"auto"``: ``MLA_PIPELINE`` when set, else the variant ``pipelines/auto_table.py`` gives
the call's shape (``mla.resolve_pipeline``), resolved when the op runs, once per signature (the
signature holds every shape the choice reads, block_table's width included).

``mla.flash_mla_with_kvcache`` and ``mla.MLADecoder.run`` call it when traced by
``torch.compile``, so a model step calling the API compiles with ``fullgraph=True``; eagerly they
launch directly (the dispatcher would add its own per-call cost). Its checks are the API's, cached
per signature the same way, except the block_table width against the longest sequence: that needs
the plan's host-side lengths, which the op does not see (the API checks it before calling the op).
The fake implementation runs the same checks on fake tensors, so a bad call fails at trace time
with the same ``ValueError``/``TypeError``.
It always launches the split-kv merge kernel, neither the in-grid merge (``MLA_GRID_MERGE``) nor the seesaw's
merge by each request's last chunk: both write words of ``tile_scheduler_metadata`` (a barrier word, arrival
counts that return to 0), which the schema declares read-only.
"""
from __future__ import annotations

import torch

import pipelines

from . import api, validate
from .reference import HEAD_DIM_V

_CALLS: dict = {}


def clear_caches() -> None:
    _CALLS.clear()


def _check(q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits, out, lse, workspace,
           softmax_scale, causal, pipeline, *, launcher: bool, any_device: bool = False):
    device_type = None if any_device else validate.KERNEL_DEVICE_TYPE  # read now: tests change it
    fixed = api._require_pipeline(pipeline)
    shape = validate.check_decode_inputs(q, k_cache, block_table, cache_seqlens, HEAD_DIM_V, softmax_scale, causal,
                                         out=out, lse=lse, device_type=device_type)
    if out is None or lse is None:  # the schema has them as tensors; a direct Python call might not
        raise TypeError(f"{'out' if out is None else 'lse'} must be a torch.Tensor, got NoneType")
    variant = api._shape_variant(fixed, shape)  # "auto": the table's choice for this call's shape
    validate.check_metadata(tile_scheduler_metadata, num_splits, shape.batch_size, shape.device)
    validate.check_workspace(workspace, api._workspace_numel(shape, tile_scheduler_metadata.shape[0]), shape.device)
    cluster = api._call_split_cluster(getattr(tile_scheduler_metadata, "_mla_plan_info", None), shape,
                                      tile_scheduler_metadata.shape[0])
    return api._launcher(variant, shape, cluster) if launcher else None


def decode(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor, cache_seqlens: torch.Tensor,
           tile_scheduler_metadata: torch.Tensor, num_splits: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
           workspace: torch.Tensor, softmax_scale: float, causal: bool, pipeline: str) -> None:
    """MLA paged decode into ``out``/``lse`` (module docstring)."""
    args = (q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits, out, lse, workspace)
    try:  # the signature, as mla.api keys it: every tensor's shape, strides and dtype, q's device
        key = (tuple(api._sig(t) for t in args), q.device, type(softmax_scale), softmax_scale, type(causal), causal,
               pipeline, api._pipeline_env_raw() if pipeline == "auto" else None, api._multicast_env_raw(), api._partial_env_raw(),
               api._split_cluster_env_raw())
        launch = _CALLS.get(key)
    except (AttributeError, TypeError):  # non-tensors, unhashables: the checks name them
        key = launch = None
    if launch is None:
        launch = _check(*args, softmax_scale, causal, pipeline, launcher=True)
        if key is not None:
            api._remember(_CALLS, key, launch)
    try:
        # PLAN_READ_ONLY: the op merges with the merge kernel alone; the in-grid merge and the merge by the last
        # chunks write words of the plan, which the schema declares read-only (docs/interfaces.md, "In-grid merge").
        launch(q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits, out, lse, workspace,
               float(softmax_scale), pipelines.PLAN_READ_ONLY)
    except (ValueError, TypeError):
        # The compiled function refused an argument (device, dtype, alignment): name it as the API does.
        _check(*args, softmax_scale, causal, pipeline, launcher=False)
        api._check_kernel_alignment(q, k_cache, out, workspace)
        raise


def _decode_fake(q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits, out, lse, workspace,
                 softmax_scale, causal, pipeline):
    # Nothing to allocate (the outputs are the caller's); the checks make a bad traced call fail
    # here, with the eager call's message, instead of at run time. Meta tensors stand for any
    # device (shape inference), so only their device type is not checked.
    _check(q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits, out, lse, workspace,
           softmax_scale, causal, pipeline, launcher=False, any_device=q.device.type == "meta")


SCHEMA = ("decode(Tensor q, Tensor k_cache, Tensor block_table, Tensor cache_seqlens, Tensor tile_scheduler_metadata, "
          "Tensor num_splits, Tensor(a!) out, Tensor(b!) lse, Tensor(c!) workspace, float softmax_scale, bool causal, "
          "str pipeline) -> ()")
_MUTATED = (6, 7, 8)  # out, lse, workspace

# Registered through torch.library's low-level API rather than torch.library.custom_op: the latter
# wraps every call in Python autograd and version-bump layers whose argument handling alone costs
# more than the whole decode launch (a compiled graph without CUDA graphs pays it per layer). Here
# the backend kernel is the function above, autograd falls back to torch's C++ default (the op has
# no gradient), and the ADInplaceOrView kernel does what it must for a mutating op: bump the
# version counters of the tensors it writes.
_LIB = torch.library.Library("mla", "DEF")
_LIB.define(SCHEMA)
_LIB.impl("decode", decode, "CompositeExplicitAutograd")
_OP = torch.ops.mla.decode.default
_AFTER_INPLACE_OR_VIEW = torch._C._after_ADInplaceOrView_keyset


def _bump_versions(keyset, *args):
    torch.autograd.graph.increment_version([args[i] for i in _MUTATED])
    return _OP.redispatch(keyset & _AFTER_INPLACE_OR_VIEW, *args)


_LIB.impl("decode", _bump_versions, "ADInplaceOrView", with_keyset=True)
torch.library.register_fake("mla::decode", _decode_fake, lib=_LIB)
