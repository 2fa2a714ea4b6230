"""Host glue: one compiled host entry per static configuration, and the kernel cache it lives in.

A decode is one call of one compiled function (``DecodeEntry``): it takes the torch tensors as the
API holds them, builds the workspace views, and launches the decode kernel and the split-kv merge
kernel on the current torch stream. It is compiled with TVM-FFI (``--enable-tvm-ffi``, stream from
the environment), so a call passes torch tensors straight through: no per-call ``from_dlpack``
views, no ``CUstream`` object, no view ops.

Compiled once per ``DecodeConfig`` (variant, dtype, h_q, s_q, page size, causal, h_kv, TMA multicast
cluster size) against symbolic batch size, page count, plan size and strides, so a serving engine
pays the compile once per model configuration, not per batch shape; compiled entries are kept on
disk across processes (``pipelines.cache``), keyed by that configuration under a fingerprint of the
kernel sources and the toolchain (``namespace``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import platform
import sys
import threading

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # never default to another arch when compiling without a GPU

import cuda.bindings.driver as cuda  # noqa: E402
import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass.cute.runtime import make_fake_tensor  # noqa: E402

from pipelines.cache import KernelCache, default_root, disk_cache_enabled  # noqa: E402
from pipelines.heads import group_queries  # noqa: E402
from split_k import last_chunk  # noqa: E402

HEAD_DIM = 576
HEAD_DIM_V = 512
DTYPES = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16}
TVM_FFI_OPTION = "--enable-tvm-ffi"
# The compiled entry's parameters, named as the API names them: TVM-FFI's own argument checks
# (dtype, rank, static extents, shared batch size, device, alignment) quote these names.
ENTRY_PARAMS = ("q", "k_cache", "block_table", "cache_seqlens", "tile_scheduler_metadata", "num_splits", "out",
                "lse", "workspace", "softmax_scale")

_PACKAGE_DIRS = (pathlib.Path(__file__).resolve().parent,
                 pathlib.Path(__file__).resolve().parent.parent / "split_k")
# Files of those directories that hold no kernel code: pipeline="auto"'s table and its tooling (a
# host-side choice between compiled entries), regenerated after every perf run; they must not
# start a fresh kernel cache.
_NOT_KERNEL_SOURCES = ("auto.py", "auto_table.py")
# CUTE_DSL_* variables that do not change generated code (paths, logging, the DSL's own caches);
# every other one is part of the namespace, so a knob that does change code never reuses an entry.
_ENV_NOT_IN_KEY = ("CUTE_DSL_CACHE_DIR", "CUTE_DSL_LOG_LEVEL", "CUTE_DSL_LOG_TO_CONSOLE", "CUTE_DSL_LOG_TO_FILE",
                   "CUTE_DSL_DISABLE_FILE_CACHING", "CUTE_DSL_JIT_CACHE_MAX_ELEMS", "CUTE_DSL_LIBS")


def _cute_dtype(name: str):
    try:
        return DTYPES[name]
    except KeyError:
        raise TypeError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}") from None


def dtype_name(dtype) -> str:
    """``torch.bfloat16`` / ``"bfloat16"`` -> ``"bfloat16"``."""
    return str(dtype).replace("torch.", "")


PARTIAL_CHOICES = ("float32", "input")
"""Split-kv partial dtypes: fp32, or the input dtype (16-bit: half the partial traffic)."""
DEFAULT_PARTIAL = "input"
"""16-bit partials by default: half the bytes of fp32 ones for the decode kernel to write and the
merge to read, and with 16-byte stores (skeleton.store_rows_16) faster wherever requests are split
(H200, 2wg: b1 s1 h128 16384 keys 25.2 -> 21.4 us, b8 s1 h64 4096 27.7 -> 23.5; docs/perf-notes.md).
Their error against fp32 partials is in docs/perf-notes.md; ``float32`` stays selectable."""
PARTIAL_ENV_VAR = "MLA_PARTIAL_DTYPE"


def partial_from_env() -> str:
    """The ``MLA_PARTIAL_DTYPE`` switch: unset: ``DEFAULT_PARTIAL``; ``float32`` or ``input``;
    anything else is a ValueError naming the variable."""
    value = os.environ.get(PARTIAL_ENV_VAR, DEFAULT_PARTIAL)
    if value not in PARTIAL_CHOICES:
        raise ValueError(f"{PARTIAL_ENV_VAR} must be one of {PARTIAL_CHOICES} (or unset), got {value!r}")
    return value


def partial_name(dtype, partial=None) -> str:
    """The partial dtype's name for inputs of ``dtype``: ``partial`` is None (``DEFAULT_PARTIAL``),
    ``"float32"``, ``"input"`` or the input dtype itself (torch dtype or name)."""
    name = DEFAULT_PARTIAL if partial is None else dtype_name(partial)
    if name == "input":
        name = dtype_name(dtype)
    if name not in ("float32", dtype_name(dtype)):
        raise ValueError(f"partial dtype must be float32 or the input dtype ({dtype_name(dtype)}), got {partial!r}")
    return name


def _kernel_class(variant: str, config: "DecodeConfig | None" = None):
    """The decode kernel's class for ``variant``; with ``config``, the ``"2wg"`` pipeline's narrow form
    where it serves the configuration (``pipelines.variant_2wg_narrow.serves``: at most 32 query rows
    per kv head, no split cluster)."""
    if variant == "2wg":
        from pipelines import variant_2wg_narrow
        from pipelines.variant_2wg import MLADecode2WG
        if config is not None and variant_2wg_narrow.serves(config.rows // config.num_heads_k, config.split_cluster):
            return variant_2wg_narrow.MLADecode2WGNarrow
        return MLADecode2WG
    if variant == "3wg":
        from pipelines.variant_3wg import MLADecode3WG
        return MLADecode3WG
    if variant == "seesaw":
        from pipelines.variant_seesaw import MLADecodeSeesaw
        return MLADecodeSeesaw
    raise NotImplementedError(f"pipeline {variant!r} has no kernel yet")


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """Everything a compiled decode entry is specialised on. Build it with ``DecodeConfig.make``,
    which normalises: ``causal`` only exists for ``s_q > 1`` (one kernel for s_q = 1), and the
    multicast switch becomes the cluster size it gives this configuration
    (``pipelines.paged_kv.cluster_size``), so a configuration without a cluster is one entry
    whatever the switch."""
    variant: str
    dtype: str
    num_heads_q: int
    seqlen_q: int
    page_size: int
    causal: bool
    num_heads_k: int = 1
    cluster: int = 1
    partial: str = "float32"  # dtype of the split-kv partial outputs: "float32" or ``dtype``
    split_cluster: int = 1  # CTAs per split group reducing through DSMEM (split_k.planner.split_cluster)

    @classmethod
    def make(cls, variant: str, dtype, num_heads_q: int, seqlen_q: int, page_size: int, causal: bool,
             num_heads_k: int = 1, multicast: bool = True, partial=None, split_cluster: int = 1) -> "DecodeConfig":
        """``partial``: dtype of the split-kv partials, ``"float32"`` or the input dtype (None: the
        default, ``DEFAULT_PARTIAL``). ``split_cluster``: the plan's split-cluster size
        (``split_k.planner.split_cluster``); a split cluster excludes the multicast cluster, and so does
        a variant outside ``pipelines.MULTICAST_VARIANTS``."""
        from pipelines import MULTICAST_VARIANTS, paged_kv

        multicast = bool(multicast) and variant in MULTICAST_VARIANTS

        # m-blocks per kv head: a CTA's rows are the heads_per_kv * s_q rows of one kv head.
        m_blocks = -(-(int(num_heads_q) // int(num_heads_k)) * int(seqlen_q) // 64)
        return cls(variant, dtype_name(dtype), int(num_heads_q), int(seqlen_q), int(page_size),
                   bool(causal) and seqlen_q > 1, int(num_heads_k),
                   paged_kv.cluster_size(int(page_size), m_blocks, bool(multicast) and int(split_cluster) == 1),
                   partial_name(dtype, partial), int(split_cluster))

    @property
    def rows(self) -> int:
        """Workspace rows per request: out's rows ``s_idx * h_q + head``, every kv head together."""
        return self.num_heads_q * self.seqlen_q

    def key(self) -> tuple:
        return ("decode",) + dataclasses.astuple(self)

    def label(self) -> str:
        causal = " causal" if self.causal else ""
        cluster = f" cluster={self.cluster}" if self.cluster > 1 else ""
        if self.split_cluster > 1:
            cluster += f" split_cluster={self.split_cluster}"
        return (f"{self.variant} {self.dtype} h_q={self.num_heads_q} s_q={self.seqlen_q} h_kv={self.num_heads_k} "
                f"page={self.page_size}{causal}{cluster}")


# ----------------------------------------------------------------------------- fake arguments

def _fake(dtype, rank: int, stride_div: int = 1):
    """Fully symbolic fake tensor (every extent and every non-unit stride), for the standalone
    kernel compile of ``compile_merge``. ``stride_div`` (elements) is the
    alignment promised for the non-unit strides (16 B for TMA)."""
    shape = tuple(cute.sym_int32() for _ in range(rank))
    stride = tuple(cute.sym_int64(divisibility=stride_div) for _ in range(rank - 1)) + (1,)
    return make_fake_tensor(dtype, shape, stride, assumed_align=16)


def entry_args(config: DecodeConfig) -> tuple:
    """Fake arguments of ``DecodeEntry`` for ``config``, in ``ENTRY_PARAMS`` order.

    Extents fixed by the configuration are static (s_q, h_q, h_kv, page size, head dims) and the
    batch size is one symbol shared by every tensor that has it, so TVM-FFI's argument decoding
    rejects a tensor that does not match the compiled configuration before any launch. Non-unit
    strides of q, k_cache and out are symbolic multiples of 8 elements (16 B, what TMA needs);
    lse and tile_scheduler_metadata are contiguous (static strides). The int32 tensors and lse are
    only read or written one element at a time, so they promise no more than element alignment.
    """
    c = config
    cdt = _cute_dtype(c.dtype)
    i32, f32 = cutlass.Int32, cutlass.Float32
    b = cute.sym_int32()

    def s8():
        return cute.sym_int64(divisibility=8)

    rows_per_kv = c.rows // c.num_heads_k
    q_shape = ((b, c.seqlen_q, c.num_heads_q, HEAD_DIM) if c.num_heads_k == 1
               else (b, c.num_heads_k, rows_per_kv, HEAD_DIM))  # the grouped copy (pipelines/heads.py)
    return (
        make_fake_tensor(cdt, q_shape, (s8(), s8(), s8(), 1), assumed_align=16),
        make_fake_tensor(cdt, (cute.sym_int32(), c.page_size, c.num_heads_k, HEAD_DIM), (s8(), s8(), s8(), 1),
                         assumed_align=16),
        make_fake_tensor(i32, (b, cute.sym_int32()), (cute.sym_int64(), 1), assumed_align=4),
        make_fake_tensor(i32, (b,), (1,), assumed_align=4),
        make_fake_tensor(i32, (cute.sym_int32(), 8), (8, 1), assumed_align=4),
        make_fake_tensor(i32, (cute.sym_int32(),), (1,), assumed_align=4),
        make_fake_tensor(cdt, (b, c.seqlen_q, c.num_heads_q, HEAD_DIM_V), (s8(), s8(), s8(), 1), assumed_align=16),
        make_fake_tensor(f32, (b, c.num_heads_q, c.seqlen_q), (c.num_heads_q * c.seqlen_q, c.seqlen_q, 1),
                         assumed_align=4),
        make_fake_tensor(f32, (cute.sym_int32(),), (1,), assumed_align=16),
        f32(1.0),
        cutlass.Int32(0),
        cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True),
    )


# --------------------------------------------------------------------------------- the entry

class DecodeEntry:
    """The compiled host function of one ``DecodeConfig``: decode kernel, then split-kv merge.

    ``workspace`` is one fp32 buffer of ``pipelines.workspace_numel`` elements (docs/interfaces.md,
    "Workspace"): ``o_accum [n, rows, 512]`` followed by ``lse_accum [n, rows]``, with
    ``n = b + num_parts`` (``b`` from q, ``num_parts`` from tile_scheduler_metadata). One buffer
    is one allocation per eager ``flash_mla_with_kvcache`` call instead of two.
    """

    def __init__(self, config: DecodeConfig, kernel_class=None):
        """``kernel_class``: the decode kernel's class instead of the variant's (A/B scripts and tests
        build a subclass that changes one class constant)."""
        from split_k.merge_kernel import SplitMerge
        from split_k.planner import BLOCK_N
        c = config
        cdt = _cute_dtype(c.dtype)
        self.rows = c.rows
        self.page_size = c.page_size
        self.block_n = BLOCK_N
        cls = kernel_class or _kernel_class(c.variant, c)
        self.decode = cls(cdt, c.num_heads_q, c.seqlen_q, c.page_size, c.causal, c.num_heads_k,
                          multicast=c.cluster > 1, split_cluster=c.split_cluster)
        self.partial_dtype = cutlass.Float32 if c.partial == "float32" else cdt
        self.merge = SplitMerge(cdt, c.num_heads_q, c.seqlen_q, self.partial_dtype)
        self.decode.merger = self.merge  # used where the kernel merges in its grid (can_merge_in_grid)

    @cute.jit
    def __call__(self, q: cute.Tensor, k_cache: cute.Tensor, block_table: cute.Tensor, cache_seqlens: cute.Tensor,
                 tile_scheduler_metadata: cute.Tensor, num_splits: cute.Tensor, out: cute.Tensor, lse: cute.Tensor,
                 workspace: cute.Tensor, softmax_scale: cutlass.Float32, grid_merge: cutlass.Int32,
                 stream: cuda.CUstream):
        """``grid_merge`` > 0: the decode kernel merges the split requests in its own grid (a
        cooperative launch, no merge kernel; only where the kernel ``can_merge_in_grid()``, else ignored).
        The caller passes it only for a grid that fits the GPU at once (``pipelines.grid_merge_mode``).
        ``grid_merge`` < 0 (``pipelines.PLAN_READ_ONLY``, the torch op): the call writes nothing of the plan, so neither
        the in-grid merge nor the merge by each request's last chunk (whose counts live in the plan's reserved
        columns): the merge kernel merges."""
        o_accum, lse_accum = self.workspace_views(q, tile_scheduler_metadata, workspace)
        merge_tiles = self.merge_tiles(block_table)
        # A kernel that cannot merge in its grid gets grid_merge 0 (the branch below then always
        # launches the merge kernel: a constant condition, folded at compile time).
        in_grid = cutlass.Int32(0)
        merge_y = cutlass.Int32(1)
        if cutlass.const_expr(self.decode.can_merge_in_grid()):
            if grid_merge > 0:
                in_grid = grid_merge
            merge_y = self.merge.in_grid_y(merge_tiles, num_splits.shape[0] - 1, tile_scheduler_metadata.shape[0])
        # The merge by each request's last chunk where the kernel does it (``can_merge_chunks``), the plan has at
        # most ``MAX_PARTS`` parts and the shapes estimate at most ``MAX_EST`` chunks per request
        # (``split_k.last_chunk``); else the merge kernel.
        chunk = cutlass.Int32(0)
        if cutlass.const_expr(self.decode.can_merge_chunks()):
            num_parts = tile_scheduler_metadata.shape[0]
            if (grid_merge >= 0) & (num_parts <= last_chunk.MAX_PARTS) & (
                    self.merge.n_est(merge_tiles, num_splits.shape[0] - 1, num_parts) <= last_chunk.MAX_EST):
                chunk = cutlass.Int32(1)
                in_grid = cutlass.Int32(0)
        self.decode(q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits, out, lse,
                    o_accum, lse_accum, softmax_scale, in_grid, merge_y, chunk, stream)
        if cutlass.const_expr(self.decode.merge_launch):  # (False only in an A/B's measurement)
            if (in_grid == 0) & (chunk == 0):
                # Second stage: requests with one chunk were written by the main kernel; the merge skips
                # them. Chained by programmatic dependent launch: the main kernel lets it be scheduled as
                # soon as every main CTA runs, so its launch overlaps the main kernel instead of following it.
                self.merge(o_accum, lse_accum, num_splits, tile_scheduler_metadata, out, lse, merge_tiles, stream,
                           use_pdl=True)

    @cute.jit
    def merge_tiles(self, block_table: cute.Tensor):
        """The block table's capacity in 64-token tiles (``split_k.merge_kernel.capacity_tiles``): the
        merge sizes itself for requests that fill it (its ``n_est``)."""
        return (block_table.shape[1] * self.page_size + self.block_n - 1) // self.block_n

    @cute.jit
    def workspace_views(self, q: cute.Tensor, tile_scheduler_metadata: cute.Tensor, workspace: cute.Tensor):
        """``(o_accum [n, rows, 512], lse_accum [n, rows])`` views of the one workspace buffer."""
        rows = self.rows
        n = tile_scheduler_metadata.shape[0] + q.shape[0]  # b + num_parts: bounds num_splits[b]
        # The split stride is a 64-bit value (b * rows * 512 can pass 2^31 elements) that the
        # compiler knows is a multiple of 512: as a plain int it would be a 32-bit constant, and
        # without the divisibility the merge kernel could not prove its 16-byte loads aligned.
        split_stride = cute.assume(cutlass.Int64(rows * HEAD_DIM_V), divby=HEAD_DIM_V)
        row_stride = cute.assume(cutlass.Int64(HEAD_DIM_V), divby=HEAD_DIM_V)
        # 16-bit partials use the front half of the same fp32 region (lse_accum stays where it is).
        o_ptr = workspace.iterator
        if cutlass.const_expr(self.partial_dtype is not cutlass.Float32):
            o_ptr = cute.recast_ptr(workspace.iterator, dtype=self.partial_dtype)
        o_accum = cute.make_tensor(o_ptr, cute.make_layout(
            (n, rows, HEAD_DIM_V), stride=(split_stride, row_stride, 1)))
        lse_accum = cute.make_tensor(workspace.iterator + cutlass.Int64(n) * (rows * HEAD_DIM_V), cute.make_layout(
            (n, rows), stride=(rows, 1)))
        return o_accum, lse_accum


def compile_entry(config: DecodeConfig, options: str | None = None, kernel_class=None):
    """``cute.compile`` of ``DecodeEntry(config, kernel_class)`` with TVM-FFI (seconds; the cache calls
    this once)."""
    opts = TVM_FFI_OPTION if not options else f"{TVM_FFI_OPTION} {options}"
    return cute.compile(DecodeEntry(config, kernel_class), *entry_args(config), options=opts)


# ------------------------------------------------------------------------------- the cache

def namespace_info() -> dict:
    """Everything besides the configuration that changes compiled code: the sources of the
    kernels (every .py of pipelines/ and split_k/ but ``_NOT_KERNEL_SOURCES``), the DSL, TVM-FFI and Python versions, the
    machine, the target arch and the DSL's code-affecting environment variables."""
    import tvm_ffi

    sources = hashlib.sha256()
    for directory in _PACKAGE_DIRS:
        for path in sorted(directory.glob("*.py")):
            if directory.name == "pipelines" and path.name in _NOT_KERNEL_SOURCES:
                continue
            sources.update(f"{directory.name}/{path.name}\0".encode())
            sources.update(path.read_bytes())
            sources.update(b"\0")
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("CUTE_DSL_") and k not in _ENV_NOT_IN_KEY}
    return {
        "sources_sha256": sources.hexdigest(),
        "cutlass_dsl": getattr(cutlass, "__version__", "unknown"),
        "tvm_ffi": getattr(tvm_ffi, "__version__", "unknown"),
        "python": f"{sys.implementation.name}-{sys.version_info[0]}.{sys.version_info[1]}",
        "machine": f"{sys.platform}-{platform.machine()}",
        "arch": os.environ.get("CUTE_DSL_ARCH", ""),
        "env": env,
        "options": TVM_FFI_OPTION,
    }


def namespace(info: dict | None = None) -> str:
    """Directory name of this toolchain + sources under the cache root (24 hex digits of sha256)."""
    info = namespace_info() if info is None else info
    return hashlib.sha256(json.dumps(info, sort_keys=True).encode()).hexdigest()[:24]


_CACHE: KernelCache | None = None
_CACHE_LOCK = threading.Lock()


def kernel_cache() -> KernelCache:
    """The process's kernel cache, created on first use from ``MLA_CACHE_DIR`` / ``MLA_DISK_CACHE``."""
    global _CACHE
    cache = _CACHE
    if cache is None:
        with _CACHE_LOCK:
            if _CACHE is None:
                info = namespace_info()
                root = default_root() if disk_cache_enabled() else None
                _CACHE = KernelCache(root, namespace(info), info=info)
            cache = _CACHE
    return cache


def reset_kernel_cache() -> None:
    """Drop the process's cache object (the next use re-reads the environment); disk entries stay."""
    global _CACHE
    with _CACHE_LOCK:
        _CACHE = None


def lookup_entry(config: DecodeConfig):
    """``pipelines.cache.Lookup`` of the compiled entry of ``config`` (memory, disk or compiled now)."""
    return kernel_cache().lookup(config.key(), lambda: compile_entry(config))


def decode_launcher(config: DecodeConfig):
    """Callable ``(q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits, out,
    lse, workspace, softmax_scale, grid_merge)`` launching the decode of ``config`` on the current torch
    stream (``grid_merge``: ``DecodeEntry.__call__``).

    With one kv head it is the compiled TVM-FFI function itself; with several it first copies q into
    the per-kv-head grouping the kernel reads (``pipelines.heads.group_queries``).
    """
    fn = kernel_cache().get(config.key(), lambda: compile_entry(config))
    if config.num_heads_k == 1:
        return fn
    h_kv = config.num_heads_k

    def launch(q, *args):
        fn(group_queries(q, h_kv), *args)

    return launch


# ------------------------------------------------------- standalone kernels (compile_check)

def compile_merge(dtype: str, num_heads: int, seqlen_q: int, options: str | None = None, partial: str = "float32"):
    """The split-kv merge kernel alone, for ``python -m mla.compile_check``."""
    from split_k.merge_kernel import SplitMerge
    cdt = _cute_dtype(dtype)
    f32 = cutlass.Float32
    pdt = f32 if partial_name(dtype, partial) == "float32" else cdt
    meta = make_fake_tensor(cutlass.Int32, (cute.sym_int32(), 8), (8, 1), assumed_align=4)
    args = (_fake(pdt, 3, 8), _fake(f32, 2), _fake(cutlass.Int32, 1), meta, _fake(cdt, 4, 8), _fake(f32, 3),
            cutlass.Int32(16), cute.runtime.make_fake_stream())
    kernel = SplitMerge(cdt, num_heads, seqlen_q, pdt)
    return cute.compile(kernel, *args) if options is None else cute.compile(kernel, *args, options=options)


# ------------------------------------------------------------------------------- the planner

def planner_args() -> tuple:
    """Fake arguments of ``split_k.planner_kernel.SplitPlanner``: seqlens ``[b]``, metadata
    ``[num_parts, 8]``, num_splits ``[b + 1]``, all int32 with 4-byte alignment only (the kernel makes
    scalar accesses, and cache_seqlens may be any view of an int32 tensor); the stream from the
    environment (TVM-FFI), as for the decode entry."""
    i32 = cutlass.Int32
    tensors = tuple(make_fake_tensor(i32, shape, stride, assumed_align=4) for shape, stride in (
        ((cute.sym_int32(),), (1,)),
        ((cute.sym_int32(), cute.sym_int32()), (cute.sym_int64(), 1)),
        ((cute.sym_int32(),), (1,))))
    return tensors + (cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True),)


def compile_planner(options: str | None = None, split_cluster: int = 1):
    """``cute.compile`` of the split planner kernel (``split_k.planner_kernel``) with TVM-FFI; for a
    split cluster it plans in units of ``split_cluster`` tiles (``split_k.planner.plan_clustered``)."""
    from split_k.planner import BLOCK_N
    from split_k.planner_kernel import SplitPlanner
    opts = TVM_FFI_OPTION if not options else f"{TVM_FFI_OPTION} {options}"
    return cute.compile(SplitPlanner(block_n=BLOCK_N * split_cluster), *planner_args(), options=opts)


PLANNER_KEY = ("planner",)


def launch_planner(cache_seqlens, tile_scheduler_metadata, num_splits, split_cluster: int = 1):
    """Plan on the current torch stream of cache_seqlens' device into the given int32 tensors
    (validated by the caller: contiguous, b >= 1, within ``split_k.planner_kernel.check_limits``).
    One TVM-FFI call: the kernel comes from the kernel cache (memory, disk, or compiled once), the
    stream and device from the tensors."""
    key = PLANNER_KEY if split_cluster == 1 else PLANNER_KEY + (split_cluster,)
    fn = kernel_cache().get(key, lambda: compile_planner(split_cluster=split_cluster))
    fn(cache_seqlens, tile_scheduler_metadata, num_splits)
