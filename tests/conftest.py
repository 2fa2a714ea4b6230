"""Shared test setup.

- ``@pytest.mark.gpu`` tests are skipped, with the reason, unless a Hopper (sm_90) GPU is usable.
- ``fake_kernel``: makes the kernel path runnable on the CPU, for testing the API glue (validation
  order, planning, allocation, what reaches the compiled launch) without a GPU. It marks the
  pipelines as available with fixed page sizes, lets the kernel path accept CPU tensors, and replaces
  ``pipelines.decode_launcher`` with launchers running the contract's executable model
  (``split_decode_reference``), recording every configuration asked for and every call.
- Every test starts with the API's signature caches empty (``mla.api.clear_caches``): the fixtures
  change the pipeline registry, which the caches assume fixed for a process.
- ``fake_planner``: makes the device-planner path runnable on the CPU: CPU lengths count as "on the
  device" and ``pipelines.run_planner`` is replaced by the planner kernel's Python model
  (``split_k.planner_kernel.kernel_model``) writing into the given tensors, recording every call.
"""
from __future__ import annotations

import pytest
import torch

import pipelines
from mla import api, validate
from pipelines import paged_kv
from mla.reference import split_decode_reference
from split_k import planner as planner_module
from mla.testing import hopper_skip_reason

# 2wg: the loaders' page sizes (what the real registry says); 3wg: a narrower fake set, to test that
# the page size is checked per pipeline.
FAKE_PAGE_SIZES = {"2wg": paged_kv.PAGE_SIZES, "3wg": (64,)}


def pytest_collection_modifyitems(config, items):
    # The experimental narrow kernel's GPU tests run last: their hang guard ends the process if a
    # launch never finishes, and every other test should have run by then.
    items.sort(key=lambda item: getattr(getattr(item, "module", None), "__name__", "").endswith("test_narrow_gpu"))
    reason = hopper_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def workspace_views(workspace, batch_size: int, num_parts: int, rows: int):
    """``(o_accum [n, rows, 512], lse_accum [n, rows])`` of the one-buffer workspace, n = b + parts
    (docs/interfaces.md, "Workspace")."""
    n = batch_size + num_parts
    o_accum = workspace[: n * rows * 512].view(n, rows, 512)
    lse_accum = workspace[n * rows * 512: n * rows * 513].view(n, rows)
    return o_accum, lse_accum


def check_entry_args(config: tuple, q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits, out,
                     lse, workspace):
    """What the compiled entry's TVM-FFI argument decoding checks on every call (docs/interfaces.md,
    "Compiled signatures"), as a model: dtype, rank, one device (of the kernel device type), the
    static extents of the configuration and the shared batch size, unit last strides, stride
    multiples of 8 for q/k_cache/out, contiguous lse and metadata, 16-byte data alignment of q,
    k_cache, out and workspace. Raises ValueError naming the parameter, as TVM-FFI does."""
    variant, dtype, h_q, s_q, page_size, causal, h_kv = config
    b = q.shape[0] if q.dim() else None
    i32, f32 = torch.int32, torch.float32
    specs = [("q", q, dtype, (b, s_q, h_q, 576), 16, 8), ("k_cache", k_cache, dtype, (None, page_size, h_kv, 576), 16, 8),
             ("block_table", block_table, i32, (b, None), 4, 1), ("cache_seqlens", cache_seqlens, i32, (b,), 4, 1),
             ("tile_scheduler_metadata", tile_scheduler_metadata, i32, (None, 8), 4, 1),
             ("num_splits", num_splits, i32, (None,), 4, 1), ("out", out, dtype, (b, s_q, h_q, 512), 16, 8),
             ("lse", lse, f32, (b, h_q, s_q), 4, 1), ("workspace", workspace, f32, (None,), 16, 1)]
    for i, (name, t, want_dtype, shape, align, stride_div) in enumerate(specs):
        where = f"on argument #{i} ({name}) of the compiled entry"
        if t.data_ptr() % align:
            raise ValueError(f"Misaligned Tensor data {where}, expected data alignment={align} bytes")
        if t.dim() != len(shape):
            raise ValueError(f"Mismatched Tensor {where}, expected ndim={len(shape)}")
        if t.device.type != validate.KERNEL_DEVICE_TYPE or t.device != q.device:
            raise ValueError(f"Mismatched Tensor {where}, expected device {q.device}")
        if t.dtype != want_dtype:
            raise ValueError(f"Mismatched Tensor {where}, expected dtype={want_dtype}")
        for dim, (got, want) in enumerate(zip(t.shape, shape)):
            if want is not None and got != want:
                raise ValueError(f"Mismatched {name}.shape[{dim}] {where}, expected {want}")
        for dim, (st, n) in enumerate(zip(t.stride(), t.shape)):
            if n != 1 and (st != 1 if dim == t.dim() - 1 else st % stride_div):
                raise ValueError(f"Mismatched {name}.strides[{dim}] {where}")
    for i, name, t in ((7, "lse", lse), (4, "tile_scheduler_metadata", tile_scheduler_metadata)):
        if not t.is_contiguous():
            raise ValueError(f"Mismatched {name}.strides on argument #{i} ({name}) of the compiled entry, "
                             f"expected contiguous")


class FakeKernel:
    """Stands in for ``pipelines.decode_launcher``: each launcher it hands out checks the buffers it
    is given and fills out/lse (and the workspace partials) by executing the split plan with the
    reference. ``configs`` lists the configurations asked for, ``calls`` every launch."""

    def __init__(self):
        self.configs: list[tuple] = []
        self.split_clusters: list[int] = []
        self.calls: list[dict] = []

    def __call__(self, variant, dtype, num_heads_q, seqlen_q, page_size, causal, num_heads_k=1, partial=None,
                 split_cluster=1):
        causal = bool(causal) and seqlen_q > 1  # as pipelines.launch.DecodeConfig normalises it
        self.configs.append((variant, dtype, num_heads_q, seqlen_q, page_size, causal, num_heads_k))
        self.split_clusters.append(split_cluster)

        config = self.configs[-1]

        def launch(q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits, out, lse, workspace,
                   softmax_scale, grid_merge):
            check_entry_args(config, q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits,
                             out, lse, workspace)
            b, s_q, h_q = q.shape[0], q.shape[1], q.shape[2]
            parts = tile_scheduler_metadata.shape[0]
            assert workspace.dtype == torch.float32 and workspace.numel() >= pipelines.workspace_numel(
                b, parts, s_q * h_q)
            o_accum, lse_accum = workspace_views(workspace, b, parts, s_q * h_q)
            self.calls.append(dict(variant=variant, q=q, tile_scheduler_metadata=tile_scheduler_metadata,
                                   num_splits=num_splits, out=out, lse=lse, workspace=workspace, o_accum=o_accum,
                                   lse_accum=lse_accum, softmax_scale=softmax_scale, causal=causal,
                                   grid_merge=grid_merge))
            ref_out, ref_lse, ref_oacc, ref_lacc = split_decode_reference(
                q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits,
                softmax_scale=softmax_scale, causal=causal, block_n=planner_module.BLOCK_N * split_cluster)
            out.copy_(ref_out)
            lse.copy_(ref_lse)
            o_accum.copy_(ref_oacc)
            lse_accum.copy_(ref_lacc)

        return launch


@pytest.fixture(autouse=True)
def _fresh_signature_caches():
    import mla.api
    mla.api.clear_caches()
    yield
    mla.api.clear_caches()


@pytest.fixture
def fake_kernel(monkeypatch):
    kernel = FakeKernel()
    monkeypatch.setattr(pipelines, "available_variants", lambda: list(FAKE_PAGE_SIZES))
    monkeypatch.setattr(pipelines, "supported_page_sizes", lambda variant: FAKE_PAGE_SIZES[variant])
    monkeypatch.setattr(pipelines, "decode_launcher", kernel)
    monkeypatch.setattr(validate, "KERNEL_DEVICE_TYPE", "cpu")
    monkeypatch.delenv("MLA_PIPELINE", raising=False)
    return kernel


@pytest.fixture
def no_kernel(monkeypatch):
    """No pipeline has a kernel (the state before the kernels land)."""
    monkeypatch.setattr(pipelines, "available_variants", lambda: [])
    monkeypatch.delenv("MLA_PIPELINE", raising=False)


class FakePlanner:
    """Stands in for ``pipelines.run_planner``: writes the kernel model's plan into the given tensors
    (in place, as the kernel does) and records what it was handed."""

    def __init__(self):
        self.calls: list[dict] = []

    def __call__(self, cache_seqlens, tile_scheduler_metadata, num_splits, split_cluster=1):
        from split_k.planner_kernel import kernel_model
        if split_cluster > 1:  # as pipelines.run_planner: the first rows, in units of split_cluster tiles
            groups = planner_module.split_groups(tile_scheduler_metadata.shape[0], split_cluster)
            planner_module.empty_rows(tile_scheduler_metadata[groups:])
            tile_scheduler_metadata = tile_scheduler_metadata[:groups]

        self.calls.append(dict(cache_seqlens=cache_seqlens, tile_scheduler_metadata=tile_scheduler_metadata,
                               num_splits=num_splits))
        assert cache_seqlens.stride(0) == 1, "the kernel is compiled for unit-stride lengths"
        rows, splits = kernel_model(cache_seqlens.tolist(), tile_scheduler_metadata.shape[0],
                                    block_n=planner_module.BLOCK_N * split_cluster)
        tile_scheduler_metadata.copy_(torch.tensor(rows, dtype=torch.int32))
        num_splits.copy_(torch.tensor(splits, dtype=torch.int32))


@pytest.fixture
def fake_planner(monkeypatch):
    planner = FakePlanner()
    monkeypatch.setattr(api, "PLANNER_DEVICE_TYPE", "cpu")
    monkeypatch.setattr(pipelines, "run_planner", planner)
    return planner
