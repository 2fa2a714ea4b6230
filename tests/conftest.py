"""Shared test setup.

- ``@pytest.mark.gpu`` tests are skipped, with the reason, unless a Hopper (sm_90) GPU is usable.
- ``fake_kernel``: makes the kernel path runnable on the CPU, for testing the API glue (validation
  order, planning, allocation, what reaches ``pipelines.run_decode``) without a GPU. It marks the
  pipelines as available with fixed page sizes, lets the kernel path accept CPU tensors, and replaces
  ``pipelines.run_decode`` with the contract's executable model (``split_decode_reference``),
  recording every call.
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
from mla.testing import hopper_skip_reason

# 2wg: the loaders' page sizes (what the real registry says); 3wg: a narrower fake set, to test that
# the page size is checked per pipeline.
FAKE_PAGE_SIZES = {"2wg": paged_kv.PAGE_SIZES, "3wg": (64,)}


def pytest_collection_modifyitems(config, items):
    reason = hopper_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class FakeKernel:
    """Stands in for ``pipelines.run_decode``: checks the buffers it is handed and fills out/lse by
    executing the split plan with the reference."""

    def __init__(self):
        self.calls: list[dict] = []

    def __call__(self, variant, q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits,
                 out, lse, o_accum, lse_accum, softmax_scale, causal):
        self.calls.append(dict(variant=variant, q=q, tile_scheduler_metadata=tile_scheduler_metadata,
                               num_splits=num_splits, out=out, lse=lse, o_accum=o_accum, lse_accum=lse_accum,
                               softmax_scale=softmax_scale, causal=causal))
        ref_out, ref_lse, _, _ = split_decode_reference(q, k_cache, block_table, cache_seqlens,
                                                        tile_scheduler_metadata, num_splits,
                                                        softmax_scale=softmax_scale, causal=causal)
        out.copy_(ref_out)
        lse.copy_(ref_lse)


@pytest.fixture
def fake_kernel(monkeypatch):
    kernel = FakeKernel()
    monkeypatch.setattr(pipelines, "available_variants", lambda: list(FAKE_PAGE_SIZES))
    monkeypatch.setattr(pipelines, "supported_page_sizes", lambda variant: FAKE_PAGE_SIZES[variant])
    monkeypatch.setattr(pipelines, "run_decode", kernel)
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

    def __call__(self, cache_seqlens, tile_scheduler_metadata, num_splits):
        from split_k.planner_kernel import kernel_model

        self.calls.append(dict(cache_seqlens=cache_seqlens, tile_scheduler_metadata=tile_scheduler_metadata,
                               num_splits=num_splits))
        assert cache_seqlens.stride(0) == 1, "the kernel is compiled for unit-stride lengths"
        rows, splits = kernel_model(cache_seqlens.tolist(), tile_scheduler_metadata.shape[0])
        tile_scheduler_metadata.copy_(torch.tensor(rows, dtype=torch.int32))
        num_splits.copy_(torch.tensor(splits, dtype=torch.int32))


@pytest.fixture
def fake_planner(monkeypatch):
    planner = FakePlanner()
    monkeypatch.setattr(api, "PLANNER_DEVICE_TYPE", "cpu")
    monkeypatch.setattr(pipelines, "run_planner", planner)
    return planner
