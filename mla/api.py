"""Public API: FlashMLA-compatible functions and a plan/run decoder object.

Kernel path of every entry point: resolve the pipeline name, check that its kernel exists, validate
every input (``mla.validate``), plan the split (``split_k.planner``), allocate what the caller did
not pass, then ``pipelines.run_decode``. Nothing is launched before all checks pass, and no name
falls back silently to another pipeline.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch

import pipelines
from split_k import planner

from . import validate
from .reference import HEAD_DIM_V

PIPELINE_ENV_VAR = "MLA_PIPELINE"
DEFAULT_PIPELINE = "2wg"
PIPELINE_CHOICES = ("auto",) + tuple(pipelines.VARIANTS)


def resolve_pipeline(pipeline: str = "auto") -> str:
    """Map a ``pipeline=`` argument to a variant name.

    ``"2wg"`` and ``"3wg"`` name a variant; ``"auto"`` means the ``MLA_PIPELINE`` environment
    variable when it is set (to a variant name), else ``"2wg"``. Raises ``ValueError`` listing the
    choices for any other name (in the argument or in the environment variable).
    """
    if not isinstance(pipeline, str) or pipeline not in PIPELINE_CHOICES:
        raise ValueError(f"pipeline must be one of {PIPELINE_CHOICES}, got {pipeline!r}")
    if pipeline != "auto":
        return pipeline
    env = os.environ.get(PIPELINE_ENV_VAR, "").strip()
    if not env or env == "auto":
        return DEFAULT_PIPELINE
    if env not in pipelines.VARIANTS:
        raise ValueError(f"{PIPELINE_ENV_VAR} must be one of {tuple(pipelines.VARIANTS)} (or unset), got {env!r}")
    return env


def require_kernel(variant: str) -> None:
    """Raise ``NotImplementedError`` if ``variant`` has no kernel yet (never a silent fallback)."""
    available = pipelines.available_variants()
    if variant not in available:
        raise NotImplementedError(f"pipeline {variant!r} has no kernel yet; pipelines with a kernel: "
                                  f"{tuple(available) if available else 'none'}")


def _num_sms(device: torch.device, num_sms: int | None) -> int:
    if num_sms is not None:
        return num_sms  # split_k.planner.num_sm_parts validates it
    if device.type != "cuda":
        raise ValueError(f"num_sms is required when planning for a {device.type} device (it is read from the "
                         f"CUDA device's properties otherwise)")
    return torch.cuda.get_device_properties(device).multi_processor_count


@dataclass(frozen=True)
class PlanInfo:
    """Host-side facts about a plan, kept so later calls can check against them without a sync."""
    max_seqlen: int
    num_parts: int


def _plan(lengths: list[int], rows_per_kv: int, h_kv: int, num_sms: int,
          device: torch.device) -> tuple[torch.Tensor, torch.Tensor, PlanInfo]:
    parts = planner.num_sm_parts(num_sms, rows_per_kv, h_kv)
    metadata, num_splits = planner.plan(lengths, parts)
    info = PlanInfo(max(lengths, default=0), parts)
    return metadata.to(device), num_splits.to(device), info


# ----------------------------------------------------------------------------------- FlashMLA API

@dataclass
class MLASchedMeta:
    """Lazy split plan (FlashMLA's newer form): empty until the first ``flash_mla_with_kvcache`` call
    that receives it, which plans from that call's ``cache_seqlens`` (one device-to-host copy).

    Reuse it only while the batch shape, head counts, page size, causal flag and the *values* of
    ``cache_seqlens`` stay the same; a shape or flag change raises ``ValueError``, a change of
    lengths cannot be detected without a sync (make a new object, as with FlashMLA).
    """
    num_sms: int | None = None
    have_initialized: bool = False
    config: tuple | None = None  # (b, s_q, h_q, page_size, h_kv, causal)
    tile_scheduler_metadata: torch.Tensor | None = None
    num_splits: torch.Tensor | None = None
    info: PlanInfo | None = None

    _CONFIG_NAMES = ("batch size", "s_q", "h_q", "page_size", "h_kv", "causal")

    def _ensure(self, shape: validate.DecodeShape, cache_seqlens: torch.Tensor) -> None:
        config = (shape.batch_size, shape.s_q, shape.h_q, shape.page_size, shape.h_kv, shape.causal)
        if self.have_initialized:
            for name, planned, got in zip(self._CONFIG_NAMES, self.config, config):
                if planned != got:
                    raise ValueError(f"tile_scheduler_metadata was planned for {name} = {planned!r}, this call has "
                                     f"{got!r}; use a new get_mla_metadata() object per configuration")
            return
        lengths = planner.host_lengths(cache_seqlens, "cache_seqlens")
        num_sms = _num_sms(shape.device, self.num_sms)
        self.tile_scheduler_metadata, self.num_splits, self.info = _plan(
            lengths, shape.rows, shape.h_kv, num_sms, shape.device)
        self.config = config
        self.have_initialized = True


def get_mla_metadata(cache_seqlens: torch.Tensor | None = None, num_heads_per_head_k: int | None = None,
                     num_heads_k: int | None = None, *, num_sms: int | None = None):
    """Plan the split-kv schedule (FlashMLA's ``get_mla_metadata``).

    Classic form: ``get_mla_metadata(cache_seqlens, s_q * h_q // h_kv, h_kv)``.

    Args:
        cache_seqlens: int32 ``[b]`` key counts, usually on the GPU; copied to the host once.
        num_heads_per_head_k: query rows per kv head, ``s_q * h_q // h_kv``.
        num_heads_k: ``h_kv`` (1 for DeepSeek MLA).
        num_sms: SM count to plan for; default: the multiprocessor count of cache_seqlens' CUDA
            device (required when cache_seqlens is on the CPU).

    Returns:
        ``(tile_scheduler_metadata, num_splits)``: int32 ``[num_sm_parts, 8]`` and int32 ``[b + 1]``
        on cache_seqlens' device, in the layout of ``split_k.planner``. Pass both to
        ``flash_mla_with_kvcache`` unchanged.

    Newer form: ``get_mla_metadata()`` with no positional arguments returns ``(MLASchedMeta(), None)``,
    a lazy plan filled by the first ``flash_mla_with_kvcache`` call that uses it.
    """
    args = (cache_seqlens, num_heads_per_head_k, num_heads_k)
    if all(a is None for a in args):
        return MLASchedMeta(num_sms=num_sms), None
    if any(a is None for a in args):
        raise TypeError("get_mla_metadata takes either no positional arguments (lazy form) or all of "
                        "cache_seqlens, num_heads_per_head_k, num_heads_k")
    cache_seqlens = validate.check_seqlens_tensor(cache_seqlens)
    for name, value in (("num_heads_per_head_k", num_heads_per_head_k), ("num_heads_k", num_heads_k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    n_sms = _num_sms(cache_seqlens.device, num_sms)
    lengths = planner.host_lengths(cache_seqlens, "cache_seqlens")
    metadata, num_splits, info = _plan(lengths, num_heads_per_head_k, num_heads_k, n_sms, cache_seqlens.device)
    # Remembered on the tensor so flash_mla_with_kvcache can check block_table's width and the
    # batch size without reading the lengths again (lost if the caller copies the tensor).
    metadata._mla_plan_info = info
    return metadata, num_splits


def _check_kernel_alignment(q, k_cache, out, lse) -> None:
    for name, t, mult in (("q", q, 8), ("k_cache", k_cache, 8), ("out", out, 8), ("lse", lse, 1)):
        validate.check_kernel_alignment(name, t, mult)


def _check_kernel_shape(shape: validate.DecodeShape, variant: str) -> None:
    validate.check_page_size(shape.page_size, pipelines.supported_page_sizes(variant), variant)


def _workspace(shape: validate.DecodeShape, num_parts: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    # Workspace rows follow out's rows (s_idx * h_q + head) for every kv head together.
    o_shape, lse_shape = planner.workspace_shapes(shape.batch_size, num_parts, shape.s_q * shape.h_q, HEAD_DIM_V)
    return (torch.empty(o_shape, dtype=torch.float32, device=device),
            torch.empty(lse_shape, dtype=torch.float32, device=device))


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits=None, softmax_scale=None, causal=False, *, pipeline="auto", out=None):
    """MLA paged decode attention (FlashMLA's ``flash_mla_with_kvcache``).

    Args:
        q: ``[b, s_q, h_q, 576]`` bf16 or fp16 on a Hopper GPU, ``1 <= s_q <= 4``,
            ``h_q <= 128`` per kv head; last dim contiguous, ``q[b]`` viewable as ``[s_q * h_q, 576]``.
        k_cache: ``[num_pages, page_size, h_kv, 576]``, q's dtype; V is its first 512 columns.
            Query head ``h`` reads kv head ``h // (h_q // h_kv)``; page_size one of
            ``pipelines.supported_page_sizes(variant)``.
        block_table: int32 ``[b, max_pages]``, page ids of each request; wide enough for the
            longest sequence. Entries past a request's last page are never read.
        cache_seqlens: int32 ``[b]`` key counts (0 allowed: those rows get out 0, lse +inf).
        head_dim_v: must be 512.
        tile_scheduler_metadata, num_splits: from ``get_mla_metadata(cache_seqlens, s_q*h_q//h_kv,
            h_kv)`` (tensors on q's device), or ``(MLASchedMeta, None)`` from ``get_mla_metadata()``.
        softmax_scale: default ``576 ** -0.5``; must be finite and > 0.
        causal: bottom-right aligned causal mask (matters for ``s_q > 1``).
        pipeline: ``"auto"`` (the ``MLA_PIPELINE`` env var, else ``"2wg"``), ``"2wg"`` or ``"3wg"``.
        out: optional ``[b, s_q, h_q, 512]`` of q's dtype to write into.

    Returns:
        ``(out, lse)``: ``[b, s_q, h_q, 512]`` in q's dtype and fp32 ``[b, h_q, s_q]`` (natural log).
        Rows that see no key: ``out = 0``, ``lse = +inf``.

    Raises:
        ValueError / TypeError for invalid inputs (before any launch); NotImplementedError when the
        pipeline has no kernel yet.

    No host synchronisation unless the metadata is a fresh ``MLASchedMeta`` (its first call plans).
    Allocates out (if not given), lse and the split-kv workspace on every call; use ``MLADecoder``
    to allocate once.
    """
    variant = resolve_pipeline(pipeline)
    require_kernel(variant)
    shape = validate.check_decode_inputs(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale,
                                         causal, out=out, device_type=validate.KERNEL_DEVICE_TYPE)
    _check_kernel_shape(shape, variant)
    _check_kernel_alignment(q, k_cache, out, None)
    if isinstance(tile_scheduler_metadata, MLASchedMeta):
        if num_splits is not None:
            raise ValueError("num_splits must be None when tile_scheduler_metadata is an MLASchedMeta")
        tile_scheduler_metadata._ensure(shape, cache_seqlens)
        info = tile_scheduler_metadata.info
        tile_scheduler_metadata, num_splits = (tile_scheduler_metadata.tile_scheduler_metadata,
                                               tile_scheduler_metadata.num_splits)
    else:
        info = getattr(tile_scheduler_metadata, "_mla_plan_info", None)
    validate.check_metadata(tile_scheduler_metadata, num_splits, shape.batch_size, shape.device)
    if info is not None:  # absent when the caller copied the metadata (e.g. into a graph's static buffer)
        validate.check_block_table_width(shape.max_pages, shape.page_size, info.max_seqlen)

    if out is None:
        out = torch.empty(shape.batch_size, shape.s_q, shape.h_q, HEAD_DIM_V, dtype=q.dtype, device=q.device)
    lse = torch.empty(shape.batch_size, shape.h_q, shape.s_q, dtype=torch.float32, device=q.device)
    o_accum, lse_accum = _workspace(shape, tile_scheduler_metadata.shape[0], q.device)
    pipelines.run_decode(variant, q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits,
                         out, lse, o_accum, lse_accum, shape.softmax_scale, shape.causal)
    return out, lse


# ------------------------------------------------------------------------------- plan/run object

class MLADecoder:
    """Plan once, run many times: host work in ``plan``, none in ``run``.

    ``plan`` validates the configuration, copies the lengths to the host once (none if they are
    already on the CPU), builds the split plan and allocates the plan tensors, the split-kv workspace
    and an lse buffer on the device. ``run`` only checks tensor metadata and launches: no host
    synchronisation, and no allocation when ``out`` is given, so it can be captured in a CUDA graph.

    Re-planning with the same batch size, heads, s_q and device keeps every device buffer at the same
    address (new values are copied in), so a captured graph stays valid after ``plan`` for new lengths
    (call ``plan`` outside the capture: it synchronises).

    Example::

        dec = MLADecoder(pipeline="auto")
        dec.plan(cache_seqlens, num_heads_q=128, seq_len_q=1, page_size=64)
        out, lse = dec.run(q, k_cache, block_table, cache_seqlens, out=out)
    """

    def __init__(self, pipeline: str = "auto", *, num_sms: int | None = None):
        """``pipeline``: ``"auto"``/``"2wg"``/``"3wg"`` (resolved now, ``MLA_PIPELINE`` read now);
        ``num_sms``: SM count to plan for (default: the device's)."""
        self.variant = resolve_pipeline(pipeline)
        self._num_sms = num_sms
        self._planned: validate.DecodeShape | None = None
        self._info: PlanInfo | None = None
        self.tile_scheduler_metadata: torch.Tensor | None = None
        self.num_splits: torch.Tensor | None = None
        self._o_accum = self._lse_accum = self._lse = None

    def plan(self, cache_seqlens: torch.Tensor, *, num_heads_q: int, seq_len_q: int = 1, num_heads_k: int = 1,
             page_size: int = 64, dtype: torch.dtype = torch.bfloat16, head_dim_v: int = HEAD_DIM_V,
             softmax_scale: float | None = None, causal: bool = False, device=None) -> None:
        """Do the host work for a batch.

        Args:
            cache_seqlens: int32 ``[b]`` key counts (CPU or GPU; a GPU tensor is copied once).
                ``run`` must get the same values.
            num_heads_q: ``h_q`` (1..128 per kv head); seq_len_q: ``s_q`` (1..4);
            num_heads_k: ``h_kv`` (``num_heads_q`` must be a multiple of it).
            page_size: ``k_cache.shape[1]``, one the pipeline supports.
            dtype: q's and k_cache's dtype (bf16 or fp16).
            head_dim_v: 512. softmax_scale: default ``576 ** -0.5``. causal: bottom-right causal.
            device: where the kernel runs; default cache_seqlens' device (must be CUDA).

        Raises ValueError/TypeError for an invalid configuration, NotImplementedError when the
        pipeline has no kernel yet or ``num_heads_k > 1``.
        """
        require_kernel(self.variant)
        cache_seqlens = validate.check_seqlens_tensor(cache_seqlens)
        device = torch.device(device) if device is not None else cache_seqlens.device
        if device.type != validate.KERNEL_DEVICE_TYPE:
            raise ValueError(f"device must be a {validate.KERNEL_DEVICE_TYPE.upper()} device, got {device}")
        for name, value in (("num_heads_q", num_heads_q), ("seq_len_q", seq_len_q),
                            ("num_heads_k", num_heads_k), ("page_size", page_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
        # Validate the configuration with the same checks run() applies, through meta tensors that
        # carry only the shapes and dtypes (no memory, no device work).
        b = cache_seqlens.shape[0]
        meta = torch.device("meta")
        shape = validate.check_decode_inputs(
            torch.empty(b, seq_len_q, num_heads_q, validate.HEAD_DIM_QK, dtype=dtype, device=meta),
            torch.empty(1, page_size, num_heads_k, validate.HEAD_DIM_QK, dtype=dtype, device=meta),
            torch.empty(b, 0, dtype=torch.int32, device=meta),
            torch.empty(b, dtype=torch.int32, device=meta),
            head_dim_v, softmax_scale, causal, device_type=None)
        _check_kernel_shape(shape, self.variant)
        shape = dataclasses.replace(shape, device=device)

        lengths = planner.host_lengths(cache_seqlens, "cache_seqlens")
        metadata, num_splits, info = _plan(lengths, shape.rows, shape.h_kv, _num_sms(device, self._num_sms), device)
        if self._reusable(shape, info):
            self.tile_scheduler_metadata.copy_(metadata)
            self.num_splits.copy_(num_splits)
        else:
            self.tile_scheduler_metadata, self.num_splits = metadata, num_splits
            self._o_accum, self._lse_accum = _workspace(shape, info.num_parts, device)
            self._lse = torch.empty(shape.batch_size, shape.h_q, shape.s_q, dtype=torch.float32, device=device)
        self._planned, self._info = shape, info

    def _reusable(self, shape: validate.DecodeShape, info: PlanInfo) -> bool:
        """Whether the buffers of the previous plan fit this one exactly (same shapes, same device)."""
        old = self._planned
        return (old is not None and self._info.num_parts == info.num_parts
                and (old.batch_size, old.s_q, old.h_q, old.h_kv, old.device)
                == (shape.batch_size, shape.s_q, shape.h_q, shape.h_kv, shape.device))

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor, cache_seqlens: torch.Tensor,
            *, out: torch.Tensor | None = None, lse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Launch the planned decode.

        Args:
            q: ``[b, s_q, h_q, 576]``, k_cache ``[num_pages, page_size, h_kv, 576]``, block_table int32
                ``[b, max_pages]``, cache_seqlens int32 ``[b]`` (the values given to ``plan``), all as
                planned (shapes, dtype, device); see ``flash_mla_with_kvcache``.
            out: optional ``[b, s_q, h_q, 512]`` of q's dtype; allocated if None.
            lse: optional fp32 ``[b, h_q, s_q]`` contiguous; if None the decoder's own lse buffer
                (allocated by ``plan``, overwritten by every run) is used and returned.

        Returns ``(out, lse)``. Raises ``RuntimeError`` before ``plan`` and ``ValueError`` when the
        inputs differ from the plan.
        """
        planned = self._planned
        if planned is None:
            raise RuntimeError("MLADecoder.run called before plan()")
        shape = validate.check_decode_inputs(q, k_cache, block_table, cache_seqlens, HEAD_DIM_V,
                                             planned.softmax_scale, planned.causal, out=out, lse=lse,
                                             device_type=validate.KERNEL_DEVICE_TYPE)
        _check_kernel_alignment(q, k_cache, out, lse)
        for name, want, got in (("batch size", planned.batch_size, shape.batch_size), ("s_q", planned.s_q, shape.s_q),
                                ("h_q", planned.h_q, shape.h_q), ("h_kv", planned.h_kv, shape.h_kv),
                                ("page_size", planned.page_size, shape.page_size),
                                ("dtype", planned.dtype, shape.dtype), ("device", planned.device, shape.device)):
            if want != got:
                raise ValueError(f"run() got {name} {got}, but plan() was made for {want}")
        validate.check_block_table_width(shape.max_pages, shape.page_size, self._info.max_seqlen)
        if out is None:
            out = torch.empty(shape.batch_size, shape.s_q, shape.h_q, HEAD_DIM_V, dtype=q.dtype, device=q.device)
        if lse is None:
            lse = self._lse
        pipelines.run_decode(self.variant, q, k_cache, block_table, cache_seqlens, self.tile_scheduler_metadata,
                             self.num_splits, out, lse, self._o_accum, self._lse_accum, planned.softmax_scale,
                             planned.causal)
        return out, lse
