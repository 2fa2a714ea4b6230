"""Public API: FlashMLA-compatible functions and a plan/run decoder object.

Kernel path of every entry point: check the pipeline name and that its kernel exists, validate
every input (``mla.validate``), resolve ``"auto"`` for the call's shape (``resolve_pipeline``), plan
the split, allocate what the caller did not pass, then one call of the compiled decode
(``pipelines.decode_launcher``). Nothing is launched before all checks pass, and no name falls back
silently to another pipeline (``"auto"`` chooses only among the variants that serve the page size).

Planning (``planner=``): ``"device"`` runs the planner kernel (``split_k.planner_kernel``) on the
lengths where they are, with no host synchronisation; ``"host"`` copies the lengths to the host and
runs ``split_k.planner.plan`` (the reference; both give identical tensors). ``"auto"`` (the default)
is ``"device"`` for lengths on the CUDA device being planned for and ``"host"`` otherwise. What only
the host planner can check, because it reads the lengths: negative lengths (``ValueError``) and
block_table's width against the longest sequence (checked before each launch). With a device plan
those are the caller's responsibility, as with FlashMLA.

Eager calls are the hot path of an engine whenever a step does not match a captured CUDA graph, so
the checks are cached per *signature* (``MLADecoder.run``'s leaves out the dtypes and q's device: its
plan fixes them, and the compiled function checks both on every call, against its static dtypes and
the plan's own buffers): each tensor's shape, strides and dtype, q's device, the
scalar arguments with their types, the plan's host-side facts, the pipeline name and the
``MLA_PIPELINE``/``MLA_MULTICAST``/``MLA_PARTIAL_DTYPE``/``MLA_SPLIT_CLUSTER``/``MLA_GRID_MERGE``
values (``MLADecoder`` reads them once, in ``__init__`` and ``plan``). ``"auto"``'s choice is a
function of the signature (page size, s_q, h_q, h_kv, batch size, block_table's width), so it is made once per signature too. A repeated signature costs one
dictionary lookup; a new one gets every check, and a failed check is never
cached. What a signature leaves open is checked by the compiled function itself on every call,
in C, before it launches (TVM-FFI's argument decoding against the compiled signature: every
tensor's dtype, device type and device index, the static extents, stride divisibility and the
16-byte data alignment, docs/interfaces.md); when it refuses a call, the API reruns its own checks
so the error is the API's ``ValueError``/``TypeError`` naming the argument. Under ``torch.compile``
the checks run at trace time and the launch goes through the custom op ``torch.ops.mla.decode``
(``mla.ops``), which checks again when it runs.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch

import pipelines
from pipelines import auto
from split_k import planner

from . import validate
from .reference import HEAD_DIM_V

PIPELINE_ENV_VAR = "MLA_PIPELINE"
DEFAULT_PIPELINE = auto.DEFAULT  # "2wg": auto's choice where the table knows nothing
PIPELINE_CHOICES = ("auto",) + tuple(pipelines.VARIANTS)
PLANNER_CHOICES = ("auto", "device", "host")
PLANNER_DEVICE_TYPE = "cuda"
"""Device type the planner kernel runs on (read at call time, so CPU tests can substitute a fake)."""


MULTICAST_ENV_VAR = "MLA_MULTICAST"  # pipelines.paged_kv reads it when a kernel is looked up
_ENV_DATA = getattr(os.environ, "_data", None)  # CPython's encoded environment (what os.environ reads)
_ENCODE = getattr(os.environ, "encodekey", None)


def _env_reader(name: str):
    """A function returning the raw value of environment variable ``name`` (None if unset), for call
    signatures: one dict lookup instead of ``os.environ.get``'s encode/decode round trip, which
    costs as much as the rest of a cached call's checks."""
    if _ENV_DATA is not None and _ENCODE is not None:
        key = _ENCODE(name)
        return lambda: _ENV_DATA.get(key)
    return lambda: os.environ.get(name)


_pipeline_env_raw = _env_reader(PIPELINE_ENV_VAR)
_multicast_env_raw = _env_reader(MULTICAST_ENV_VAR)
PARTIAL_ENV_VAR = "MLA_PARTIAL_DTYPE"  # pipelines.launch reads it when a kernel is looked up
_partial_env_raw = _env_reader(PARTIAL_ENV_VAR)
_split_cluster_env_raw = _env_reader(planner.SPLIT_CLUSTER_ENV_VAR)
_grid_merge_env_raw = _env_reader(pipelines.GRID_MERGE_ENV_VAR)
WORKSPACE_CACHE_ENV_VAR = "MLA_WORKSPACE_CACHE"  # "0": flash_mla_with_kvcache allocates its workspace per call
_workspace_cache_env_raw = _env_reader(WORKSPACE_CACHE_ENV_VAR)
# "0" as the raw reader returns it (CPython keeps the environment encoded: bytes on POSIX).
_WORKSPACE_CACHE_OFF = getattr(os.environ, "encodevalue", str)("0") if _ENV_DATA is not None else "0"


def check_pipeline(pipeline) -> str:
    """``pipeline`` must be one of ``PIPELINE_CHOICES``; returns it."""
    if not isinstance(pipeline, str) or pipeline not in PIPELINE_CHOICES:
        raise ValueError(f"pipeline must be one of {PIPELINE_CHOICES}, got {pipeline!r}")
    return pipeline


def fixed_pipeline(pipeline) -> str | None:
    """The variant a ``pipeline=`` argument fixes for every shape: the name itself, or for ``"auto"``
    the ``MLA_PIPELINE`` environment variable when it is set to a variant (read now); None when
    ``"auto"`` chooses per shape (the variable unset, empty or ``"auto"``). Raises ``ValueError``
    listing the choices for any other name (in the argument or in the variable)."""
    if check_pipeline(pipeline) != "auto":
        return pipeline
    env = os.environ.get(PIPELINE_ENV_VAR, "").strip()
    if not env or env == "auto":
        return None
    if env not in pipelines.VARIANTS:
        raise ValueError(f"{PIPELINE_ENV_VAR} must be one of {tuple(pipelines.VARIANTS)} (or unset), got {env!r}")
    return env


def auto_candidates(page_size: int) -> tuple[str, ...]:
    """The variants ``"auto"`` chooses among for ``page_size``: those with a kernel that serve it."""
    return tuple(v for v in pipelines.available_variants() if page_size in pipelines.supported_page_sizes(v))


def _known(value):
    """``value`` as an int, or None when it is symbolic (a SymInt while torch.compile traces: reading
    it would specialise the graph on it)."""
    return value if isinstance(value, int) else None


def auto_variant(page_size: int, seq_len_q: int, num_heads_q: int, num_heads_k: int, batch_size: int | None,
                 max_pages: int | None) -> str:
    """The table's choice (``pipelines.auto.choose``) for a shape among ``auto_candidates(page_size)``;
    the KV-length proxy is the block table's capacity ``max_pages * page_size``. A None (unknown)
    batch size or width is left out of the lookup. Cached per shape: a dictionary lookup once seen."""
    batch_size, max_pages = _known(batch_size), _known(max_pages)
    return auto.choose(page_size, seq_len_q, num_heads_q, num_heads_k, batch_size,
                       None if max_pages is None else auto.kv_capacity(max_pages, page_size), auto_candidates(page_size))


def _shape_variant(fixed: str | None, shape: validate.DecodeShape) -> str:
    """The variant a validated call runs (``fixed``, else auto's choice for its shape), checked to serve
    the call's page size. While torch.compile traces, a per-shape auto is not chosen (the op chooses
    when it runs): any candidate stands for it in the page-size check."""
    if fixed is not None:
        variant = fixed
    elif torch.compiler.is_compiling():
        variant = next(iter(auto_candidates(shape.page_size)), DEFAULT_PIPELINE)
    else:
        variant = auto_variant(shape.page_size, shape.s_q, shape.h_q, shape.h_kv, shape.batch_size, shape.max_pages)
    _check_kernel_shape(shape, variant)
    return variant


def resolve_pipeline(pipeline: str = "auto", *, page_size: int | None = None, seq_len_q: int = 1,
                     num_heads_q: int | None = None, num_heads_k: int = 1, batch_size: int | None = None,
                     max_pages: int | None = None) -> str:
    """Map a ``pipeline=`` argument to the variant a call of this shape runs.

    ``"2wg"``, ``"3wg"`` and ``"seesaw"`` name a variant. ``"auto"`` means the ``MLA_PIPELINE`` environment
    variable when it is set (to a variant name), else the choice of ``pipelines/auto_table.py`` for
    the shape (``auto_variant``: page size, s_q, h_q, h_kv, batch size and the block table's width
    ``max_pages``, i.e. ``block_table.shape[1]``) among the variants with a kernel that serve the page
    size. Without ``page_size`` and ``num_heads_q`` (no shape) ``"auto"`` gives ``DEFAULT_PIPELINE``.
    Raises ``ValueError`` listing the choices for any other name (in the argument or in the
    environment variable).
    """
    fixed = fixed_pipeline(pipeline)
    if fixed is not None:
        return fixed
    if page_size is None or num_heads_q is None:
        return DEFAULT_PIPELINE
    return auto_variant(page_size, seq_len_q, num_heads_q, num_heads_k, batch_size, max_pages)


def require_kernel(variant: str) -> None:
    """Raise ``NotImplementedError`` if ``variant`` has no kernel yet (never a silent fallback)."""
    available = pipelines.available_variants()
    if variant not in available:
        raise NotImplementedError(f"pipeline {variant!r} has no kernel yet; pipelines with a kernel: "
                                  f"{tuple(available) if available else 'none'}")


def _require_pipeline(pipeline) -> str | None:
    """Check a ``pipeline=`` argument before the inputs: the name (and ``MLA_PIPELINE``), and that the
    variant it fixes, or for a per-shape ``"auto"`` at least one variant, has a kernel
    (``NotImplementedError`` naming ``DEFAULT_PIPELINE`` when none has). Returns ``fixed_pipeline``."""
    fixed = fixed_pipeline(pipeline)
    if fixed is not None:
        require_kernel(fixed)
    elif not pipelines.available_variants():
        require_kernel(DEFAULT_PIPELINE)
    return fixed


def _num_sms(device: torch.device, num_sms: int | None) -> int:
    if num_sms is not None:
        return num_sms  # split_k.planner.num_sm_parts validates it
    if device.type != "cuda":
        raise ValueError(f"num_sms is required when planning for a {device.type} device (it is read from the "
                         f"CUDA device's properties otherwise)")
    return torch.cuda.get_device_properties(device).multi_processor_count


def check_planner(planner: str) -> str:
    """``planner`` must be one of ``PLANNER_CHOICES``; returns it."""
    if not isinstance(planner, str) or planner not in PLANNER_CHOICES:
        raise ValueError(f"planner must be one of {PLANNER_CHOICES}, got {planner!r}")
    return planner


def resolve_planner(planner: str, lengths_device: torch.device, device: torch.device) -> str:
    """``"device"`` or ``"host"``: which planner runs for lengths on ``lengths_device`` planned for a
    kernel on ``device``.

    ``"auto"`` is ``"device"`` when the lengths already lie on ``device`` and it is a CUDA device,
    else ``"host"`` (CPU lengths are read without a sync anyway). ``"device"`` for lengths elsewhere
    raises ``ValueError``; ``"host"`` always plans on the host.
    """
    check_planner(planner)
    on_device = lengths_device.type == PLANNER_DEVICE_TYPE and lengths_device == device
    if planner == "auto":
        return "device" if on_device else "host"
    if planner == "device" and not on_device:
        raise ValueError(f"planner='device' needs cache_seqlens on the {PLANNER_DEVICE_TYPE.upper()} device it plans "
                         f"for ({device}), got cache_seqlens on {lengths_device}; use planner='host' or 'auto'")
    return planner


@dataclass(frozen=True)
class PlanInfo:
    """Host-side facts about a plan, kept so later calls can check against them without a sync.

    ``max_seqlen`` is None for a device plan: the lengths never reached the host, so block_table's
    width cannot be checked against the longest sequence. ``split_cluster``: the split-cluster size
    the plan was made for (``split_k.planner.split_cluster``), checked against the launch's.
    """
    max_seqlen: int | None
    num_parts: int
    split_cluster: int = 1


def _check_device_plan(cache_seqlens: torch.Tensor, num_parts: int) -> None:
    """What the planner kernel needs, checked before anything is allocated or launched."""
    from split_k import planner_kernel  # imports the CuTe DSL: only on the device path

    planner_kernel.check_limits(cache_seqlens.shape[0], num_parts)
    if cache_seqlens.shape[0] > 1 and cache_seqlens.stride(0) != 1:
        raise ValueError(f"cache_seqlens must be contiguous for the device planner, got stride "
                         f"{cache_seqlens.stride(0)} (the decode kernels need it contiguous too)")


def _empty_plan(batch_size: int, num_parts: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty(num_parts, planner.METADATA_WIDTH, dtype=torch.int32, device=device),
            torch.empty(batch_size + 1, dtype=torch.int32, device=device))


def _plan_into(cache_seqlens: torch.Tensor, num_parts: int, mode: str, metadata: torch.Tensor,
               num_splits: torch.Tensor, cluster: int = 1) -> PlanInfo:
    """Write the plan of ``cache_seqlens`` into ``metadata`` / ``num_splits`` (device tensors of the
    plan's shapes) with the ``"device"`` or ``"host"`` planner. The device planner must have passed
    ``_check_device_plan``; it makes no host sync and no allocation. ``cluster``: the split-cluster
    size (``split_k.planner.split_cluster``) the plan is made for."""
    if mode == "host":
        lengths = planner.host_lengths(cache_seqlens, "cache_seqlens")  # a CUDA tensor syncs here
        host_metadata, host_num_splits = planner.plan_clustered(lengths, num_parts, cluster)
        metadata.copy_(host_metadata)
        num_splits.copy_(host_num_splits)
        return PlanInfo(max(lengths, default=0), num_parts, cluster)
    if cache_seqlens.shape[0] == 0:  # nothing to scan: every part empty (no kernel for an empty tensor)
        metadata.zero_()
        metadata[:, planner.END_REQ] = -1
        num_splits.zero_()
    else:
        if cache_seqlens.stride(0) != 1:  # b == 1: any stride addresses the same element
            cache_seqlens = cache_seqlens.as_strided((1,), (1,))
        pipelines.run_planner(cache_seqlens, metadata, num_splits, cluster)
    return PlanInfo(None, num_parts, cluster)


def _plan(cache_seqlens: torch.Tensor, rows_per_kv: int, h_kv: int, num_sms: int, device: torch.device,
          planner_choice: str) -> tuple[torch.Tensor, torch.Tensor, PlanInfo]:
    """Plan into new tensors on ``device`` (see ``resolve_planner`` for ``planner_choice``)."""
    parts = planner.num_sm_parts(num_sms, rows_per_kv, h_kv)
    mode = resolve_planner(planner_choice, cache_seqlens.device, device)
    if mode == "device":
        _check_device_plan(cache_seqlens, parts)
    metadata, num_splits = _empty_plan(cache_seqlens.shape[0], parts, device)
    cluster = planner.split_cluster(cache_seqlens.shape[0], parts)
    info = _plan_into(cache_seqlens, parts, mode, metadata, num_splits, cluster)
    return metadata, num_splits, info


# ----------------------------------------------------------------------------------- FlashMLA API

@dataclass
class MLASchedMeta:
    """Lazy split plan (FlashMLA's newer form): empty until the first ``flash_mla_with_kvcache`` call
    that receives it, which plans from that call's ``cache_seqlens``: with the planner kernel on the
    GPU, no host sync (``planner="auto"``/``"device"``), or on the host (``planner="host"``: one
    device-to-host copy, and block_table's width is checked against the longest sequence).

    Reuse it only while the batch shape, head counts, page size, causal flag and the *values* of
    ``cache_seqlens`` stay the same; a shape or flag change raises ``ValueError``, a change of
    lengths cannot be detected without a sync (make a new object, as with FlashMLA).
    """
    num_sms: int | None = None
    planner: str = "auto"
    have_initialized: bool = False
    config: tuple | None = None  # (b, s_q, h_q, page_size, h_kv, causal)
    tile_scheduler_metadata: torch.Tensor | None = None
    num_splits: torch.Tensor | None = None
    info: PlanInfo | None = None

    _CONFIG_NAMES = ("batch size", "s_q", "h_q", "page_size", "h_kv", "causal")

    def __post_init__(self):
        check_planner(self.planner)

    def _ensure(self, shape: validate.DecodeShape, cache_seqlens: torch.Tensor) -> None:
        config = (shape.batch_size, shape.s_q, shape.h_q, shape.page_size, shape.h_kv, shape.causal)
        if self.have_initialized:
            for name, planned, got in zip(self._CONFIG_NAMES, self.config, config):
                if planned != got:
                    raise ValueError(f"tile_scheduler_metadata was planned for {name} = {planned!r}, this call has "
                                     f"{got!r}; use a new get_mla_metadata() object per configuration")
            return
        num_sms = _num_sms(shape.device, self.num_sms)
        self.tile_scheduler_metadata, self.num_splits, self.info = _plan(
            cache_seqlens, shape.rows, shape.h_kv, num_sms, shape.device, self.planner)
        self.config = config
        self.have_initialized = True


def get_mla_metadata(cache_seqlens: torch.Tensor | None = None, num_heads_per_head_k: int | None = None,
                     num_heads_k: int | None = None, *, num_sms: int | None = None, planner: str = "auto"):
    """Plan the split-kv schedule (FlashMLA's ``get_mla_metadata``).

    Classic form: ``get_mla_metadata(cache_seqlens, s_q * h_q // h_kv, h_kv)``.

    Args:
        cache_seqlens: int32 ``[b]`` key counts, usually on the GPU.
        num_heads_per_head_k: query rows per kv head, ``s_q * h_q // h_kv``.
        num_heads_k: ``h_kv`` (1 for DeepSeek MLA).
        num_sms: SM count to plan for; default: the multiprocessor count of cache_seqlens' CUDA
            device (required when cache_seqlens is on the CPU).
        planner: ``"auto"`` (default): the planner kernel for CUDA lengths (no host sync, capturable
            in a CUDA graph; ``b <= split_k.planner_kernel.MAX_BATCH``), the host planner for CPU
            lengths. ``"device"``: the kernel (CUDA lengths only). ``"host"``: copy the lengths to
            the host and plan there (syncs; rejects negative lengths; lets
            ``flash_mla_with_kvcache`` check block_table's width against the longest sequence).

    Returns:
        ``(tile_scheduler_metadata, num_splits)``: int32 ``[num_sm_parts, 8]`` and int32 ``[b + 1]``
        on cache_seqlens' device, in the layout of ``split_k.planner`` (identical for both planners).
        Pass both to ``flash_mla_with_kvcache`` unchanged.

    Newer form: ``get_mla_metadata()`` with no positional arguments returns ``(MLASchedMeta(), None)``,
    a lazy plan filled by the first ``flash_mla_with_kvcache`` call that uses it (``num_sms`` and
    ``planner`` apply to it).
    """
    check_planner(planner)
    args = (cache_seqlens, num_heads_per_head_k, num_heads_k)
    if all(a is None for a in args):
        return MLASchedMeta(num_sms=num_sms, planner=planner), None
    if any(a is None for a in args):
        raise TypeError("get_mla_metadata takes either no positional arguments (lazy form) or all of "
                        "cache_seqlens, num_heads_per_head_k, num_heads_k")
    cache_seqlens = validate.check_seqlens_tensor(cache_seqlens)
    for name, value in (("num_heads_per_head_k", num_heads_per_head_k), ("num_heads_k", num_heads_k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    n_sms = _num_sms(cache_seqlens.device, num_sms)
    metadata, num_splits, info = _plan(cache_seqlens, num_heads_per_head_k, num_heads_k, n_sms,
                                       cache_seqlens.device, planner)
    # Remembered on the tensor so flash_mla_with_kvcache can check the block_table's width (host
    # plans only) without reading the lengths again (lost if the caller copies the tensor).
    metadata._mla_plan_info = info
    return metadata, num_splits


# ----------------------------------------------------------------------------------- kernel path

_MAX_SIGNATURES = 4096
"""Entries a signature cache holds before it starts over (engines that slice block_table per step
make a new signature per width; the cache must not grow without bound)."""


def _sig(t) -> tuple:
    """What the cached checks read from a tensor besides its device: shape, strides, dtype (the
    device is in the signature for q; the compiled function checks every tensor is on q's). Raises
    AttributeError for a non-tensor, which sends the call down the checking path (which names it)."""
    return (t.shape, t.stride(), t.dtype)


def _remember(cache: dict, key, value) -> None:
    if len(cache) >= _MAX_SIGNATURES:
        cache.clear()
    cache[key] = value


# flash_mla_with_kvcache's split-kv workspaces, one per (device index, raw stream): calls on one
# stream run in stream order, so each can reuse the buffer the previous one used (one allocation of
# the three an eager call would make, ~2-4.5 us of host time).
_WORKSPACES: dict[tuple[int, int], torch.Tensor] = {}
WORKSPACE_CACHE_MAX_BYTES = 64 << 20
"""Largest workspace kept (64 MiB: up to b = 123 at h_q 128, s_q 1, with 132 plan parts). A call that needs
more allocates its own: its decode runs long enough that the allocation does not show, and keeping
such buffers per stream would hold hundreds of MB."""


def _flash_workspace(q: torch.Tensor, numel: int) -> torch.Tensor:
    """The fp32 split-kv workspace of an eager ``flash_mla_with_kvcache`` call: the current stream's
    kept buffer when it holds ``numel`` elements (grown, never shrunk, otherwise), a fresh one under
    CUDA-graph capture (a captured launch must not share memory with eager calls), off the CUDA
    device, for q on another device than the current one, above ``WORKSPACE_CACHE_MAX_BYTES``, or
    with ``MLA_WORKSPACE_CACHE=0``."""
    device = q.get_device()  # -1 off the CUDA device
    # torch._C's functions directly: torch.cuda.current_device() adds a lazy-init check (CUDA is up: q
    # is on it) and is_current_stream_capturing() a Python frame, on every eager call.
    if (device < 0 or numel > WORKSPACE_CACHE_MAX_BYTES // 4 or _workspace_cache_env_raw() == _WORKSPACE_CACHE_OFF
            or device != torch._C._cuda_getDevice() or torch._C._cuda_isCurrentStreamCapturing()):
        return q.new_empty(numel, dtype=torch.float32)
    key = (device, torch._C._cuda_getCurrentRawStream(device))
    workspace = _WORKSPACES.get(key)
    if workspace is None or workspace.numel() < numel:
        # A larger one replaces it; the old buffer goes back to torch's allocator, which reuses its
        # memory in this stream's order, after the launches already queued on it.
        _WORKSPACES.pop(key, None)
        workspace = _WORKSPACES[key] = q.new_empty(numel, dtype=torch.float32)
    return workspace


def release_workspaces() -> None:
    """Drop the split-kv workspaces ``flash_mla_with_kvcache`` keeps per device and stream (their
    memory goes back to torch's caching allocator; ``torch.cuda.empty_cache()`` returns it to the
    driver). The next call on a stream allocates again. Call it before destroying a stream that is
    not torch's own (``torch.cuda.ExternalStream``): the buffers are keyed by the raw stream handle,
    which a new stream could reuse."""
    _WORKSPACES.clear()


def _check_kernel_alignment(q, k_cache, out, workspace=None) -> None:
    """Base pointers the kernels assume 16-byte aligned, and the TMA stride multiples."""
    for name, t, mult in (("q", q, 8), ("k_cache", k_cache, 8), ("out", out, 8), ("workspace", workspace, 1)):
        validate.check_kernel_alignment(name, t, mult)


def _check_kernel_shape(shape: validate.DecodeShape, variant: str) -> None:
    validate.check_page_size(shape.page_size, pipelines.supported_page_sizes(variant), variant)


def _workspace_numel(shape: validate.DecodeShape, num_parts: int) -> int:
    # Workspace rows follow out's rows (s_idx * h_q + head) for every kv head together.
    return pipelines.workspace_numel(shape.batch_size, num_parts, shape.s_q * shape.h_q)


def _grid_merge(variant: str, shape: validate.DecodeShape, split_cluster: int, num_parts: int,
                partial_dtype=None, setting: str | None = None) -> int:
    """``pipelines.grid_merge_mode`` of a checked call (``setting``: ``pipelines.grid_merge_setting``'s
    value, None: ``MLA_GRID_MERGE`` read now; ``partial_dtype`` as ``_launcher`` takes it). Resolve it
    per call with ``_grid_merge_arg``."""
    setting = pipelines.grid_merge_setting() if setting is None else setting
    if setting == "off" or variant not in pipelines.GRID_MERGE_VARIANTS:
        return pipelines.GRID_MERGE_NEVER
    from pipelines.launch import partial_from_env, partial_name
    from split_k import merge_kernel

    name = partial_name(shape.dtype, partial_dtype if partial_dtype is not None else partial_from_env())
    cells = merge_kernel.in_grid_y(shape.s_q * shape.h_q, shape.batch_size, num_parts,
                                   merge_kernel.loads_in_flight(4 if name == "float32" else 2),
                                   merge_kernel.capacity_tiles(shape.max_pages, shape.page_size))
    return pipelines.grid_merge_mode(variant, shape.rows, shape.h_kv, split_cluster, num_parts,
                                     pipelines.device_sm_count(shape.device), setting, cells)


_grid_merge_usable = True  # False once a cooperative launch was refused in this process
COOPERATIVE_LAUNCH_TOO_LARGE = 720  # cudaErrorCooperativeLaunchTooLarge (the driver's code is the same)


def _grid_merge_refused(exc: BaseException, grid_merge: int) -> bool:
    """Whether a launch with ``grid_merge`` 1 failed because the driver refused the cooperative launch
    (the grid cannot be resident at once here: MPS limits, green contexts): then no later call of this
    process asks for the in-grid merge (a warning says so once), and the caller launches again with the
    merge kernel. Such a refusal comes before anything runs and leaves the context usable
    (scripts/grid_merge_probe.py). Any other error is the caller's to raise."""
    global _grid_merge_usable
    if grid_merge != 1:
        return False
    from cutlass.base_dsl.common import DSLCudaRuntimeError

    if not isinstance(exc, DSLCudaRuntimeError):
        return False
    code, name = getattr(exc, "_error_code", None), str(getattr(exc, "_error_name", ""))
    if code != COOPERATIVE_LAUNCH_TOO_LARGE and "COOPERATIVE" not in name.upper():
        return False
    if _grid_merge_usable:
        import warnings

        _grid_merge_usable = False
        warnings.warn(f"the in-grid split-kv merge's cooperative launch was refused ({name or code}); this "
                      f"process uses the merge kernel from now on ({pipelines.GRID_MERGE_ENV_VAR}=0 does so from "
                      f"the start)", RuntimeWarning, stacklevel=3)
    return True


def _launch_or_fall_back(exc: BaseException, launch, args: tuple, grid_merge: int) -> bool:
    """After ``launch(*args, grid_merge)`` raised ``exc`` (not a ValueError/TypeError): launch again
    with the merge kernel and return True when it was a refused cooperative launch
    (``_grid_merge_refused``); False when ``exc`` is the caller's to raise."""
    if not _grid_merge_refused(exc, grid_merge):
        return False
    launch(*args, 0)
    return True


def _capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (torch._C's query: no Python frame)."""
    return torch._C._cuda_isCurrentStreamCapturing()


def _grid_merge_arg(mode: int) -> int:
    """The entry's ``grid_merge`` argument for a call of ``mode`` (``_grid_merge``, not NEVER): eager-only
    merges in the grid only outside CUDA-graph capture; none after a refused cooperative launch
    (``_grid_merge_refused``)."""
    if not _grid_merge_usable:
        return 0
    if mode == pipelines.GRID_MERGE_EAGER:
        return 0 if _capturing() else 1
    return mode


def _launcher(variant: str, shape: validate.DecodeShape, split_cluster: int, partial_dtype=None):
    """The compiled decode for this shape and a plan made for ``split_cluster``
    (``split_k.planner.split_cluster``; ``PlanInfo.split_cluster`` of the plan)."""
    return pipelines.decode_launcher(variant, shape.dtype, shape.h_q, shape.s_q, shape.page_size, shape.causal,
                                     shape.h_kv, partial=partial_dtype,
                                     split_cluster=split_cluster)


@dataclass(frozen=True)
class _Call:
    """What a checked signature needs per call: the compiled launch and what to allocate."""
    variant: str
    launch: object
    out_shape: tuple
    lse_shape: tuple
    workspace_numel: int
    dtype: torch.dtype
    device: torch.device
    softmax_scale: float
    shape: validate.DecodeShape
    grid_merge: int = 0  # pipelines.grid_merge_mode of the call (_grid_merge_arg makes the argument)


_FLASH_CALLS: dict = {}


def clear_caches() -> None:
    """Forget every checked signature (``flash_mla_with_kvcache``'s and ``torch.ops.mla.decode``'s)
    and auto's cached lookups. Only needed when the pipeline registry or the auto table changes
    under a running process (tests do that)."""
    _FLASH_CALLS.clear()
    auto.clear_caches()
    from . import ops
    ops.clear_caches()


def _flash_key(pipeline, q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
               softmax_scale, causal, out):
    """The signature of a ``flash_mla_with_kvcache`` call (module docstring), or None when the call
    cannot be cached yet (a lazy plan not planned). One flat tuple: nested ones are hashed again on
    every lookup."""
    if isinstance(tile_scheduler_metadata, MLASchedMeta):
        sched = tile_scheduler_metadata
        if not sched.have_initialized:
            return None  # the first call plans (a host sync): the checking path does it
        plan = ("lazy", sched.config, sched.info, _sig(sched.tile_scheduler_metadata), _sig(sched.num_splits),
                num_splits is None)
    else:
        plan = (tile_scheduler_metadata.shape, tile_scheduler_metadata.stride(), tile_scheduler_metadata.dtype,
                num_splits.shape, num_splits.stride(), num_splits.dtype,
                getattr(tile_scheduler_metadata, "_mla_plan_info", None))
    return (pipeline, _pipeline_env_raw() if pipeline == "auto" else None, _multicast_env_raw(), _partial_env_raw(),
            _split_cluster_env_raw(), _grid_merge_env_raw(),
            q.shape, q.stride(), q.dtype, q.device, k_cache.shape, k_cache.stride(), k_cache.dtype,
            block_table.shape, block_table.stride(), block_table.dtype,
            cache_seqlens.shape, cache_seqlens.stride(), cache_seqlens.dtype,
            type(head_dim_v), head_dim_v, type(softmax_scale), softmax_scale, type(causal), causal,
            None if out is None else (out.shape, out.stride(), out.dtype), plan)


def _call_split_cluster(info: PlanInfo | None, shape: validate.DecodeShape, num_parts: int) -> int:
    """The split-cluster size a call with a plan of ``num_parts`` parts launches
    (``split_k.planner.split_cluster``). A plan made for another size must not be launched with this
    one (it would be read in the wrong units): checked wherever the plan's ``PlanInfo`` is known
    (metadata from ``get_mla_metadata``; not for a copy, e.g. a graph's static buffer)."""
    cluster = planner.split_cluster(shape.batch_size, num_parts)
    if info is not None and cluster != info.split_cluster:
        raise ValueError(
            f"tile_scheduler_metadata was planned for split clusters of {info.split_cluster} and this call "
            f"would launch {cluster} ({planner.SPLIT_CLUSTER_ENV_VAR} changed since get_mla_metadata); plan "
            f"again, or keep {planner.SPLIT_CLUSTER_ENV_VAR} as it was")
    return cluster


def _check_flash_call(pipeline, q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                      num_splits, softmax_scale, causal, out, *, launcher: bool = True) -> _Call:
    """Every check of a ``flash_mla_with_kvcache`` call; resolves ``pipeline`` for the call's shape
    (``resolve_pipeline``) and plans a fresh ``MLASchedMeta``. With ``launcher`` (eager calls) the
    result carries the compiled launch (loaded or compiled now)."""
    fixed = _require_pipeline(pipeline)
    shape = validate.check_decode_inputs(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale,
                                         causal, out=out, device_type=validate.KERNEL_DEVICE_TYPE)
    variant = _shape_variant(fixed, shape)
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
    # Only a host plan knows the longest sequence; the info is also absent when the caller copied
    # the metadata (e.g. into a graph's static buffer).
    if info is not None and info.max_seqlen is not None:
        validate.check_block_table_width(shape.max_pages, shape.page_size, info.max_seqlen)
    cluster = _call_split_cluster(info, shape, tile_scheduler_metadata.shape[0])
    launch = _launcher(variant, shape, cluster) if launcher else None
    return _Call(variant, launch, (shape.batch_size, shape.s_q, shape.h_q, HEAD_DIM_V), (shape.batch_size, shape.h_q, shape.s_q),
                 _workspace_numel(shape, tile_scheduler_metadata.shape[0]), shape.dtype, shape.device,
                 shape.softmax_scale, shape,
                 _grid_merge(variant, shape, cluster, tile_scheduler_metadata.shape[0]) if launcher else 0)


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
        pipeline: ``"auto"`` (the ``MLA_PIPELINE`` env var, else the variant ``pipelines/auto_table.py``
            gives this call's shape: page size, s_q, h_q, h_kv, batch size and block_table's capacity
            ``block_table.shape[1] * page_size``; ``resolve_pipeline``), ``"2wg"``, ``"3wg"`` or ``"seesaw"``.
        out: optional ``[b, s_q, h_q, 512]`` of q's dtype to write into.

    Returns:
        ``(out, lse)``: ``[b, s_q, h_q, 512]`` in q's dtype and fp32 ``[b, h_q, s_q]`` (natural log).
        Rows that see no key: ``out = 0``, ``lse = +inf``.

    Raises:
        ValueError / TypeError for invalid inputs (before any launch); NotImplementedError when the
        pipeline has no kernel yet.

    No host synchronisation, unless the metadata is a fresh ``MLASchedMeta`` planned on the host.
    block_table's width is checked against the longest sequence only for host plans (the device
    planner never sees the lengths on the host); with a device plan a too-narrow block_table is
    read out of bounds, as with FlashMLA. Allocates out (if not given) and lse on every call; the
    split-kv workspace (one fp32 buffer) is kept per device and stream and reused by the next call on
    that stream (grown when a call needs more, up to ``WORKSPACE_CACHE_MAX_BYTES``; a fresh one under
    CUDA-graph capture, above that size, or with ``MLA_WORKSPACE_CACHE=0``;
    ``mla.release_workspaces()`` drops them). Use
    ``MLADecoder`` to allocate nothing per call. The first call of a
    configuration loads (or compiles) its kernel; the checks of a call signature run once (module
    docstring). Under ``torch.compile`` this traces to ``torch.ops.mla.decode`` (plan a lazy
    ``MLASchedMeta`` before compiling).
    """
    if torch.compiler.is_compiling():
        return _flash_mla_traced(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                                 num_splits, softmax_scale, causal, pipeline, out)
    try:
        key = _flash_key(pipeline, q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                         num_splits, softmax_scale, causal, out)
        call = _FLASH_CALLS.get(key) if key is not None else None
    except (AttributeError, TypeError):  # a non-tensor or an unhashable argument: the checks name it
        key = call = None
    if call is None:
        call = _check_flash_call(pipeline, q, k_cache, block_table, cache_seqlens, head_dim_v,
                                 tile_scheduler_metadata, num_splits, softmax_scale, causal, out)
        if key is None and isinstance(tile_scheduler_metadata, MLASchedMeta):
            # Planned just now: later calls have this key, and these checks are theirs.
            key = _flash_key(pipeline, q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                             num_splits, softmax_scale, causal, out)
        if key is not None:
            _remember(_FLASH_CALLS, key, call)
    sched = None
    if isinstance(tile_scheduler_metadata, MLASchedMeta):
        sched = tile_scheduler_metadata
        tile_scheduler_metadata, num_splits = sched.tile_scheduler_metadata, sched.num_splits
    new = q.new_empty
    if out is None:
        out = new(call.out_shape, dtype=call.dtype)
    lse = new(call.lse_shape, dtype=torch.float32)
    workspace = _flash_workspace(q, call.workspace_numel)
    grid_merge = _grid_merge_arg(call.grid_merge) if call.grid_merge else 0
    try:
        call.launch(q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits, out, lse, workspace,
                    call.softmax_scale, grid_merge)
    except (ValueError, TypeError):
        # The compiled function refused an argument (dtype, device, alignment: module docstring):
        # say which, as the API says it, or pass its own message on if these checks find nothing.
        _check_flash_call(call.variant, q, k_cache, block_table, cache_seqlens, head_dim_v,
                          sched if sched is not None else tile_scheduler_metadata, None if sched else num_splits,
                          softmax_scale, causal, out, launcher=False)
        _check_kernel_alignment(q, k_cache, out, workspace)
        raise
    except Exception as exc:
        args = (q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits, out, lse, workspace,
                call.softmax_scale)
        if not _launch_or_fall_back(exc, call.launch, args, grid_merge):
            raise
    return out, lse


def _flash_mla_traced(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
                      softmax_scale, causal, pipeline, out):
    """``flash_mla_with_kvcache`` as torch.compile traces it: the checks on the traced tensors (no
    caches, no data pointers), allocations in the graph, the launch as ``torch.ops.mla.decode``."""
    from . import ops  # noqa: F401 - registers the op

    fixed = fixed_pipeline(pipeline)
    call = _check_flash_call(pipeline, q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                             num_splits, softmax_scale, causal, out, launcher=False)
    if isinstance(tile_scheduler_metadata, MLASchedMeta):
        tile_scheduler_metadata, num_splits = (tile_scheduler_metadata.tile_scheduler_metadata,
                                               tile_scheduler_metadata.num_splits)
    if out is None:
        out = torch.empty(call.out_shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(call.lse_shape, dtype=torch.float32, device=q.device)
    workspace = torch.empty(call.workspace_numel, dtype=torch.float32, device=q.device)
    # A per-shape "auto" stays "auto": the op resolves it when it runs, on the concrete shapes (a
    # symbolic batch size or block-table width is not read while tracing, which would specialise on it).
    torch.ops.mla.decode(q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits, out, lse,
                         workspace, call.softmax_scale, call.shape.causal, fixed if fixed is not None else "auto")
    return out, lse


# ------------------------------------------------------------------------------- plan/run object

class MLADecoder:
    """Plan once, run many times: host work in ``plan``, none in ``run``.

    ``plan`` validates the configuration, builds the split plan, loads (or compiles) the kernel and,
    the first time (or for another batch size, head count, s_q or device), allocates the plan
    tensors, the split-kv workspace and an lse buffer on the device. ``run`` checks the tensors'
    metadata (once per signature) and launches: no host synchronisation, and no allocation when
    ``out`` is given, so it can be captured in a CUDA graph.

    Re-planning with the same batch size, heads, s_q and device keeps every device buffer at the same
    address (the new plan is written in place), so a captured graph stays valid after ``plan`` for
    new lengths. With the device planner (the default for CUDA lengths) ``plan`` itself makes no
    host sync and, when it reuses the buffers, no allocation: it can be captured in the same graph
    as ``run`` (plan once outside the capture first, to allocate and compile), and the graph then
    re-plans from whatever ``cache_seqlens`` holds at replay. With ``planner="host"`` ``plan`` copies
    the lengths to the host (a sync): call it outside the capture.

    ``pipeline="auto"`` (unless ``MLA_PIPELINE`` names a variant) chooses per shape: ``plan`` knows
    the page size, s_q, heads and batch size but not the block table, so it loads the kernel of
    every variant the table may choose for them (``variants``: one or both), and ``run`` picks one
    per call signature from block_table's width (``variant_for``); a repeated signature costs the
    same dictionary lookup as with a named pipeline.

    Example::

        dec = MLADecoder(pipeline="auto")
        dec.plan(cache_seqlens, num_heads_q=128, seq_len_q=1, page_size=64)
        out, lse = dec.run(q, k_cache, block_table, cache_seqlens, out=out)
    """

    def __init__(self, pipeline: str = "auto", *, num_sms: int | None = None, planner: str = "auto",
                 partial_dtype=None):
        """``pipeline``: ``"auto"``/``"2wg"``/``"3wg"``/``"seesaw"`` (``MLA_PIPELINE`` read now: when it names a
        variant, "auto" is that variant; else "auto" chooses per shape, see the class docstring);
        ``num_sms``: SM count to plan for (default: the device's); ``planner``: ``"auto"``/
        ``"device"``/``"host"`` (see ``get_mla_metadata``; ``"auto"`` is the kernel for lengths on the
        planned CUDA device, the host planner otherwise); ``partial_dtype``: dtype of the split-kv
        partial outputs, ``"float32"``, ``"input"`` (q's dtype: half the partial traffic) or q's
        torch dtype; None: the ``MLA_PARTIAL_DTYPE`` environment variable, else the input dtype. (Under
        ``torch.compile`` the launch goes through ``torch.ops.mla.decode``, whose schema has no
        partial dtype: it follows ``MLA_PARTIAL_DTYPE``.)"""
        if partial_dtype is not None:
            name = str(partial_dtype).replace("torch.", "")
            if name not in ("float32", "input", "bfloat16", "float16"):
                raise ValueError(f"partial_dtype must be 'float32', 'input' or q's torch dtype, got {partial_dtype!r}")
        self._partial = partial_dtype
        self.pipeline = pipeline
        self.variant = fixed_pipeline(pipeline)
        """The variant every run launches, or None when "auto" chooses per shape (``variant_for``)."""
        self.variants: tuple[str, ...] = ()
        """The variants the current plan loaded: those ``run`` may launch."""
        self._num_sms = num_sms
        self._planner = check_planner(planner)
        self._planned: validate.DecodeShape | None = None
        self._info: PlanInfo | None = None
        self.tile_scheduler_metadata: torch.Tensor | None = None
        self.num_splits: torch.Tensor | None = None
        self._workspace = self._lse = None
        self._launches: dict = {}  # variant -> compiled launch of the plan
        self._checked: dict = {}  # run() signature that passed every check against this plan -> its launch

    def plan(self, cache_seqlens: torch.Tensor, *, num_heads_q: int, seq_len_q: int = 1, num_heads_k: int = 1,
             page_size: int = 64, dtype: torch.dtype = torch.bfloat16, head_dim_v: int = HEAD_DIM_V,
             softmax_scale: float | None = None, causal: bool = False, device=None) -> None:
        """Plan a batch (see the class docstring for what is reused and when it syncs).

        Args:
            cache_seqlens: int32 ``[b]`` key counts (CPU or GPU). ``run`` must get the same values;
                a graph that captured ``plan`` re-plans from the values at replay.
            num_heads_q: ``h_q`` (1..128 per kv head); seq_len_q: ``s_q`` (1..4);
            num_heads_k: ``h_kv`` (``num_heads_q`` must be a multiple of it).
            page_size: ``k_cache.shape[1]``, one the pipeline supports.
            dtype: q's and k_cache's dtype (bf16 or fp16).
            head_dim_v: 512. softmax_scale: default ``576 ** -0.5``. causal: bottom-right causal.
            device: where the kernel runs; default cache_seqlens' device (must be CUDA).

        Raises ValueError/TypeError for an invalid configuration (or, with the host planner, a
        negative length), NotImplementedError when the pipeline has no kernel yet; all before
        anything is allocated or launched.
        """
        if self.variant is not None:
            require_kernel(self.variant)
        elif not pipelines.available_variants():
            require_kernel(DEFAULT_PIPELINE)  # auto, and no variant has a kernel: say so
        cache_seqlens = validate.check_seqlens_tensor(cache_seqlens)
        device = torch.device(device) if device is not None else cache_seqlens.device
        if device.type == "cuda" and device.index is None:  # compare like the tensors' devices
            device = torch.device("cuda", torch.cuda.current_device())
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
        # The variants run() may launch: the fixed one, or every one auto may choose for this shape
        # whatever the block table's width (known only at run()).
        variants = ((self.variant,) if self.variant is not None else
                    auto.choices(page_size, seq_len_q, num_heads_q, num_heads_k, auto_candidates(page_size), batch=b))
        for variant in variants:
            _check_kernel_shape(shape, variant)
        shape = dataclasses.replace(shape, device=device)

        parts = planner.num_sm_parts(_num_sms(device, self._num_sms), shape.rows, shape.h_kv)
        mode = resolve_planner(self._planner, cache_seqlens.device, device)
        if mode == "host":  # read (and check) the lengths before touching any buffer
            lengths = planner.host_lengths(cache_seqlens, "cache_seqlens")
            cache_seqlens = torch.tensor(lengths, dtype=torch.int32)
        else:
            _check_device_plan(cache_seqlens, parts)
        # The first plan of a configuration loads (or compiles) its kernel; later ones, captured
        # in a CUDA graph included, find it in memory.
        cluster = planner.split_cluster(b, parts)
        launches = {v: _launcher(v, shape, cluster, self._partial) for v in variants}  # ValueError: partial_dtype
        reuse = self._reusable(shape, parts)
        if reuse:
            metadata, num_splits = self.tile_scheduler_metadata, self.num_splits
        else:
            metadata, num_splits = _empty_plan(b, parts, device)
        info = _plan_into(cache_seqlens, parts, mode, metadata, num_splits, cluster)
        if not reuse:
            self.tile_scheduler_metadata, self.num_splits = metadata, num_splits
            self._workspace = torch.empty(_workspace_numel(shape, parts), dtype=torch.float32, device=device)
            self._lse = torch.empty(shape.batch_size, shape.h_q, shape.s_q, dtype=torch.float32, device=device)
        self._planned, self._info, self._launches, self._scale = shape, info, launches, shape.softmax_scale
        self._grid_merge_setting = pipelines.grid_merge_setting()  # read once per plan, as MLA_PIPELINE
        self.variants = variants
        self._out_shape = (shape.batch_size, shape.s_q, shape.h_q, HEAD_DIM_V)
        self._checked = {}

    def _reusable(self, shape: validate.DecodeShape, num_parts: int) -> bool:
        """Whether the buffers of the previous plan fit this one exactly (same shapes, same device)."""
        old = self._planned
        return (old is not None and self._info.num_parts == num_parts
                and (old.batch_size, old.s_q, old.h_q, old.h_kv, old.device)
                == (shape.batch_size, shape.s_q, shape.h_q, shape.h_kv, shape.device))

    def _check_run(self, q, k_cache, block_table, cache_seqlens, out, lse) -> validate.DecodeShape:
        """Every check of a ``run`` call against the plan (metadata only)."""
        planned = self._planned
        shape = validate.check_decode_inputs(q, k_cache, block_table, cache_seqlens, HEAD_DIM_V,
                                             planned.softmax_scale, planned.causal, out=out, lse=lse,
                                             device_type=validate.KERNEL_DEVICE_TYPE)
        for name, want, got in (("batch size", planned.batch_size, shape.batch_size), ("s_q", planned.s_q, shape.s_q),
                                ("h_q", planned.h_q, shape.h_q), ("h_kv", planned.h_kv, shape.h_kv),
                                ("page_size", planned.page_size, shape.page_size),
                                ("dtype", planned.dtype, shape.dtype), ("device", planned.device, shape.device)):
            if want != got:
                raise ValueError(f"run() got {name} {got}, but plan() was made for {want}")
        if self._info.max_seqlen is not None:  # a host plan: the longest sequence is known
            validate.check_block_table_width(shape.max_pages, shape.page_size, self._info.max_seqlen)
        return shape

    def variant_for(self, block_table: torch.Tensor) -> str:
        """The variant ``run`` launches for a block table of ``block_table``'s width, with the planned
        shape: ``variant`` when the pipeline is fixed, else auto's choice (``resolve_pipeline``)."""
        if self._planned is None:
            raise RuntimeError("MLADecoder.variant_for called before plan()")
        if self.variant is not None:
            return self.variant
        p = self._planned
        return auto_variant(p.page_size, p.s_q, p.h_q, p.h_kv, p.batch_size, block_table.shape[1])

    def _launch_for(self, shape: validate.DecodeShape):
        """``(launch, grid_merge)``: the compiled launch of the plan for a checked ``run`` of ``shape``
        and its ``pipelines.grid_merge_mode`` (``MLA_GRID_MERGE`` as ``plan`` read it)."""
        variant = self.variant if self.variant is not None else auto_variant(
            shape.page_size, shape.s_q, shape.h_q, shape.h_kv, shape.batch_size, shape.max_pages)
        launch = self._launches.get(variant)
        if launch is None:  # plan loads every variant auto may choose (auto.choices): not expected
            launch = self._launches[variant] = _launcher(variant, self._planned, self._info.split_cluster,
                                                                 self._partial)
        return launch, _grid_merge(variant, shape, self._info.split_cluster, self._info.num_parts, self._partial,
                                   self._grid_merge_setting)

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
        inputs differ from the plan, or (host plans only) when block_table is too narrow for the
        longest planned sequence; with a device plan that width is the caller's to guarantee. The
        checks run once per signature of the arguments and plan (module docstring).
        """
        if self._planned is None:
            raise RuntimeError("MLADecoder.run called before plan()")
        if torch.compiler.is_compiling():
            return self._run_traced(q, k_cache, block_table, cache_seqlens, out, lse)
        try:  # the signature (module docstring), one flat tuple: shapes and strides
            key = (q.shape, q.stride(), k_cache.shape, k_cache.stride(), block_table.shape, block_table.stride(),
                   cache_seqlens.shape, cache_seqlens.stride(),
                   None if out is None else (out.shape, out.stride()),
                   None if lse is None else (lse.shape, lse.stride()))
            launch = self._checked.get(key)
        except (AttributeError, TypeError):
            key = launch = None
        if launch is None:
            shape = self._check_run(q, k_cache, block_table, cache_seqlens, out, lse)
            launch = self._launch_for(shape)
            if key is not None:
                _remember(self._checked, key, launch)
        launch, grid_merge = launch
        if grid_merge:  # pipelines.grid_merge_mode: eager only, or no longer usable here
            grid_merge = _grid_merge_arg(grid_merge)
        if out is None:
            out = q.new_empty(self._out_shape)
        own_lse = lse is None
        if own_lse:
            lse = self._lse
        try:
            launch(q, k_cache, block_table, cache_seqlens, self.tile_scheduler_metadata, self.num_splits, out,
                   lse, self._workspace, self._scale, grid_merge)
        except (ValueError, TypeError):
            # The compiled function refused an argument: name it as the API does (module docstring).
            self._check_run(q, k_cache, block_table, cache_seqlens, out, None if own_lse else lse)
            _check_kernel_alignment(q, k_cache, out)
            raise
        except Exception as exc:
            args = (q, k_cache, block_table, cache_seqlens, self.tile_scheduler_metadata, self.num_splits, out, lse,
                    self._workspace, self._scale)
            if not _launch_or_fall_back(exc, launch, args, grid_merge):
                raise
        return out, lse

    def _run_traced(self, q, k_cache, block_table, cache_seqlens, out, lse):
        """``run`` as torch.compile traces it: checks at trace time, launch as ``torch.ops.mla.decode``."""
        from . import ops  # noqa: F401 - registers the op

        planned = self._planned
        self._check_run(q, k_cache, block_table, cache_seqlens, out, lse)
        if out is None:
            out = torch.empty(self._out_shape, dtype=q.dtype, device=q.device)
        if lse is None:
            lse = self._lse
        # A per-shape "auto" stays "auto": the op resolves it when it runs, on the concrete shapes, as
        # _launch_for does (it reads MLA_PIPELINE then, where this decoder read it in __init__).
        torch.ops.mla.decode(q, k_cache, block_table, cache_seqlens, self.tile_scheduler_metadata, self.num_splits,
                             out, lse, self._workspace, planned.softmax_scale, planned.causal,
                             self.variant if self.variant is not None else "auto")
        return out, lse
