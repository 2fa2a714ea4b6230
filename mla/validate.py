"""Input validation for the kernel path, run before any launch.

Every failure is a ``TypeError`` (wrong type or dtype) or ``ValueError`` (wrong shape, layout,
device or value) whose message names the argument and says what was expected. The checks only
read tensor metadata (shape, dtype, strides, device), never tensor values, so they add no host
synchronisation and are safe inside CUDA-graph capture.

``check_decode_inputs(..., device_type=None)`` skips the "must be a CUDA tensor" check (while
still requiring one common device), so the rest can be exercised on CPU tensors.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from .reference import HEAD_DIM_QK, HEAD_DIM_V, default_softmax_scale

KERNEL_DEVICE_TYPE = "cuda"
"""Device type the kernels run on (the API reads it at call time)."""
Q_DTYPES = (torch.bfloat16, torch.float16)
MAX_S_Q = 4
"""Largest s_q (query tokens per request: decode plus up to 3 MTP / speculative tokens)."""
MAX_HEADS_PER_KV = 128
"""Largest h_q / h_kv: 128 heads x 4 tokens = 512 rows = 8 M tiles."""


@dataclass(frozen=True)
class DecodeShape:
    """What ``check_decode_inputs`` learned about a valid call."""
    batch_size: int
    s_q: int
    h_q: int
    h_kv: int
    page_size: int
    max_pages: int
    dtype: torch.dtype
    device: torch.device
    softmax_scale: float
    causal: bool

    @property
    def rows(self) -> int:
        """Query rows per request and kv head: ``s_q * h_q // h_kv`` (the M dimension)."""
        return self.s_q * self.h_q // self.h_kv


def _tensor(name: str, value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def _dtype(name: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    if t.dtype not in allowed:
        want = " or ".join(str(d).replace("torch.", "") for d in allowed)
        raise TypeError(f"{name} must be {want}, got {str(t.dtype).replace('torch.', '')}")


def _shape(name: str, t: torch.Tensor, expected: tuple, what: str) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {what} = {tuple(expected)}, got {tuple(t.shape)}")


def _last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim (stride 1), got strides {t.stride()}")


def check_kernel_alignment(name: str, t: torch.Tensor | None, stride_multiple: int = 1) -> None:
    """The kernels promise the compiler 16-byte aligned base pointers for q, k_cache, out and the
    workspace, and strides that are multiples of ``stride_multiple`` elements (8 for q, k_cache and
    out: 16 bytes, what TMA needs). A sliced view can break either; say so instead of faulting on
    the GPU. (The int32 tensors and lse are accessed one element at a time: element alignment,
    which torch always gives, is all they need.)"""
    if t is None:
        return
    if t.data_ptr() % 16:
        raise ValueError(f"{name} must start at a 16-byte aligned address (got a view at offset "
                         f"{t.storage_offset()} elements)")
    bad = [st for st, n in zip(t.stride(), t.shape) if st != 1 and n > 1 and st % stride_multiple]
    if bad:
        raise ValueError(f"{name} strides must be multiples of {stride_multiple} elements "
                         f"({stride_multiple * t.element_size()} bytes) except the unit one, got {t.stride()}")


def _rows_mergeable(name: str, t: torch.Tensor) -> None:
    # The kernels view t[b] as [s_q * h_q, d] (row = s_idx * h_q + head) with one row stride,
    # stride(2), which needs stride(1) == h_q * stride(2) whenever there is more than one token,
    # h_q = 1 included (then the head dim's stride is the row stride, whatever torch put there).
    s_q, h_q = t.shape[1], t.shape[2]
    if s_q > 1 and t.stride(1) != h_q * t.stride(2):
        raise ValueError(f"{name}[b] must be viewable as [s_q * h_q, d] (stride(1) == h_q * stride(2)), "
                         f"got strides {t.stride()}")


def check_softmax_scale(softmax_scale) -> float:
    """``None`` -> ``576 ** -0.5``; otherwise a finite positive real number, returned as float."""
    if softmax_scale is None:
        return default_softmax_scale()
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    scale = float(softmax_scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"softmax_scale must be finite and > 0, got {scale}")
    return scale


def check_decode_inputs(q, k_cache, block_table, cache_seqlens, head_dim_v=HEAD_DIM_V, softmax_scale=None,
                        causal=False, *, out=None, lse=None, device_type: str | None = KERNEL_DEVICE_TYPE) -> DecodeShape:
    """Validate one decode call's tensors and scalars (metadata only: no sync).

    Expects ``q [b, s_q, h_q, 576]`` bf16/fp16 with ``1 <= s_q <= 4``, ``1 <= h_q / h_kv <= 128``;
    ``k_cache [num_pages, page_size, h_kv, 576]`` of q's dtype; ``block_table [b, max_pages]`` int32;
    ``cache_seqlens [b]`` int32; ``head_dim_v == 512``; optional ``out [b, s_q, h_q, 512]`` of q's
    dtype and ``lse [b, h_q, s_q]`` fp32 contiguous; all on one device, of type ``device_type``
    unless it is None. Last dims must be contiguous and ``q[b]``/``out[b]`` viewable as
    ``[s_q * h_q, d]``.

    Page sizes a pipeline supports and the block_table width against the longest sequence are
    checked separately (``check_page_size``, ``check_block_table_width``): they need the pipeline and
    the planned lengths.
    """
    q = _tensor("q", q)
    k_cache = _tensor("k_cache", k_cache)
    block_table = _tensor("block_table", block_table)
    cache_seqlens = _tensor("cache_seqlens", cache_seqlens)

    # Device first: a tensor on the wrong device makes every later message misleading.
    named = [("q", q), ("k_cache", k_cache), ("block_table", block_table), ("cache_seqlens", cache_seqlens)]
    named += [(n, _tensor(n, t)) for n, t in (("out", out), ("lse", lse)) if t is not None]
    if device_type is not None and q.device.type != device_type:
        raise ValueError(f"q must be a {device_type.upper()} tensor, got device {q.device}")
    for name, t in named[1:]:
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")

    _dtype("q", q, Q_DTYPES)
    if q.dim() != 4:
        raise ValueError(f"q must be 4-D [b, s_q, h_q, {HEAD_DIM_QK}], got shape {tuple(q.shape)}")
    b, s_q, h_q, d = q.shape
    if d != HEAD_DIM_QK:
        raise ValueError(f"q's last dim must be {HEAD_DIM_QK} (512 latent + 64 rope), got {d}")
    if b < 1:
        raise ValueError(f"q's batch size must be >= 1, got {b}")
    if not 1 <= s_q <= MAX_S_Q:
        raise ValueError(f"q's s_q (dim 1) must be in 1..{MAX_S_Q}, got {s_q}")
    if isinstance(head_dim_v, bool) or head_dim_v != HEAD_DIM_V:
        raise ValueError(f"head_dim_v must be {HEAD_DIM_V}, got {head_dim_v!r}")

    _dtype("k_cache", k_cache, (q.dtype,))
    if k_cache.dim() != 4:
        raise ValueError(f"k_cache must be 4-D [num_pages, page_size, h_kv, {HEAD_DIM_QK}], got shape "
                         f"{tuple(k_cache.shape)}")
    num_pages, page_size, h_kv, d_k = k_cache.shape
    if d_k != HEAD_DIM_QK:
        raise ValueError(f"k_cache's last dim must be {HEAD_DIM_QK}, got {d_k}")
    if num_pages < 1 or page_size < 1:
        raise ValueError(f"k_cache must hold at least one page of at least one token, got shape {tuple(k_cache.shape)}")
    if h_kv < 1 or h_q < 1 or h_q % h_kv:
        raise ValueError(f"q's h_q ({h_q}) must be a positive multiple of k_cache's h_kv ({h_kv})")
    if h_q // h_kv > MAX_HEADS_PER_KV:
        raise ValueError(f"h_q / h_kv must be at most {MAX_HEADS_PER_KV}, got {h_q} / {h_kv}")

    _dtype("block_table", block_table, (torch.int32,))
    if block_table.dim() != 2 or block_table.shape[0] != b:
        raise ValueError(f"block_table must have shape [b={b}, max_pages], got {tuple(block_table.shape)}")
    _dtype("cache_seqlens", cache_seqlens, (torch.int32,))
    _shape("cache_seqlens", cache_seqlens, (b,), "[b]")

    for name, t in (("q", q), ("k_cache", k_cache), ("block_table", block_table), ("cache_seqlens", cache_seqlens)):
        _last_dim_contiguous(name, t)
    _rows_mergeable("q", q)

    if out is not None:
        _dtype("out", out, (q.dtype,))
        _shape("out", out, (b, s_q, h_q, HEAD_DIM_V), "[b, s_q, h_q, 512]")
        _last_dim_contiguous("out", out)
        _rows_mergeable("out", out)
    if lse is not None:
        _dtype("lse", lse, (torch.float32,))
        _shape("lse", lse, (b, h_q, s_q), "[b, h_q, s_q]")
        if not lse.is_contiguous():
            raise ValueError(f"lse must be contiguous, got strides {lse.stride()}")

    scale = check_softmax_scale(softmax_scale)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    return DecodeShape(b, s_q, h_q, h_kv, page_size, block_table.shape[1], q.dtype, q.device, scale, causal)


def check_seqlens_tensor(cache_seqlens) -> torch.Tensor:
    """``cache_seqlens`` given for planning must be an int32 ``[b]`` tensor (any device)."""
    cache_seqlens = _tensor("cache_seqlens", cache_seqlens)
    _dtype("cache_seqlens", cache_seqlens, (torch.int32,))
    if cache_seqlens.dim() != 1:
        raise ValueError(f"cache_seqlens must be 1-D [b], got shape {tuple(cache_seqlens.shape)}")
    return cache_seqlens


def check_page_size(page_size: int, supported: tuple[int, ...], pipeline: str) -> None:
    """``page_size`` (k_cache.shape[1]) must be one the pipeline's load path handles."""
    if page_size not in supported:
        raise ValueError(f"page_size (k_cache.shape[1]) is {page_size}; pipeline {pipeline!r} supports "
                         f"page sizes {tuple(supported)}")


def check_block_table_width(max_pages: int, page_size: int, max_seqlen: int) -> None:
    """``block_table`` must have a column for every page of the longest sequence."""
    need = -(-max_seqlen // page_size)
    if max_pages < need:
        raise ValueError(f"block_table has {max_pages} columns but the longest sequence ({max_seqlen} tokens, "
                         f"page_size {page_size}) needs {need}")


def check_metadata(tile_scheduler_metadata, num_splits, batch_size: int, device: torch.device) -> None:
    """The split plan must be int32 ``[num_parts, 8]`` and ``[b + 1]`` tensors on q's device."""
    tsm = _tensor("tile_scheduler_metadata", tile_scheduler_metadata)
    ns = _tensor("num_splits", num_splits)
    _dtype("tile_scheduler_metadata", tsm, (torch.int32,))
    _dtype("num_splits", ns, (torch.int32,))
    if tsm.dim() != 2 or tsm.shape[0] < 1 or tsm.shape[1] != 8:
        raise ValueError(f"tile_scheduler_metadata must have shape [num_parts >= 1, 8], got {tuple(tsm.shape)}")
    _shape("num_splits", ns, (batch_size + 1,), "[b + 1]")
    for name, t in (("tile_scheduler_metadata", tsm), ("num_splits", ns)):
        if t.device != device:
            raise ValueError(f"{name} must be on q's device {device}, got {t.device} "
                             f"(get_mla_metadata returns it on cache_seqlens' device)")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")


def check_workspace(workspace, numel: int, device: torch.device) -> None:
    """The split-kv workspace: fp32, 1-D, contiguous, on q's device, at least ``numel`` elements
    (``pipelines.workspace_numel(b, num_parts, s_q * h_q)``)."""
    ws = _tensor("workspace", workspace)
    _dtype("workspace", ws, (torch.float32,))
    if ws.dim() != 1 or ws.shape[0] < numel:
        raise ValueError(f"workspace must be 1-D with at least {numel} elements ((b + num_parts) * s_q * h_q * 513), "
                         f"got shape {tuple(ws.shape)}")
    if ws.device != device:
        raise ValueError(f"workspace must be on q's device {device}, got {ws.device}")
    _last_dim_contiguous("workspace", ws)
