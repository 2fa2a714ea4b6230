"""GPU tests of the experimental ``pipelines.variant_2wg_overlap`` kernel (not a registered variant, so
``test_kernel_gpu.py`` does not reach it): its decode entry, compiled with the overlap class on the 2wg
configuration, launched on the API's plan, against the fp32 reference. Same poisoned inputs as the
registered variants' tests (NaN in every unused cache slot, random page order, NaN-filled out)."""
from __future__ import annotations

import pytest
import torch

from mla.testing import make_decode_problem, varlen

pytestmark = pytest.mark.gpu

_COMPILED: dict = {}

# (seqlens, s_q, h_q, causal, page_size, dtype)
CASES = [
    ([140, 20], 1, 64, False, 64, torch.bfloat16),  # a masked tail in the second 32-token tile
    ([64], 1, 64, False, 64, torch.bfloat16),  # two whole 32-token tiles
    ([20, 140, 4096, 0, 1, 31, 33], 1, 16, False, 64, torch.bfloat16),  # varlen, zeros, 1 and 2 tiles
    ([4096] * 6, 1, 128, False, 64, torch.bfloat16),  # multicast cluster, long chunks
    ([140, 4096], 2, 128, True, 64, torch.float16),  # causal MTP in a cluster
    ([141, 20, 7], 4, 128, True, 64, torch.bfloat16),  # 8 m-blocks
    ([16384], 1, 128, False, 64, torch.bfloat16),  # split over every SM, merged
    ([0, 0], 1, 16, False, 64, torch.bfloat16),  # every row empty
    (varlen(64, 4096, seed=1, zeros=3), 1, 16, False, 64, torch.bfloat16),
    (varlen(128, 1024, seed=2, zeros=2), 1, 128, False, 64, torch.bfloat16),
    ([140, 4096, 33], 2, 64, True, 16, torch.bfloat16),  # page 16: two boxes per tile, one per warp
    ([140, 4096, 33], 1, 128, False, 32, torch.bfloat16),  # page 32 in a cluster
    ([300, 4096], 2, 16, True, 128, torch.bfloat16),  # page 128: a quarter of a page per tile
    ([140, 4096, 33, 0], 1, 16, False, 1, torch.bfloat16),  # cp.async gather
    ([600, 7], 4, 32, True, 8, torch.float16),
]


def _ids():
    return [f"b{len(c[0])}-sq{c[1]}-h{c[2]}-{'causal' if c[3] else 'full'}-p{c[4]}-{str(c[5])[6:]}-max{max(c[0])}"
            for c in CASES]


def _wait_or_exit(what: str) -> None:
    """Wait for the launch; if it has not finished after ``MLA_OVERLAP_TEST_LIMIT_S`` seconds (default
    60; more under compute-sanitizer) -- a kernel not yet known to be correct may hang on a barrier --
    end the process: a hung kernel cannot be interrupted, and the rest of a GPU check (the other test
    files, the sanitizers) should not wait behind it."""
    import os
    import sys
    import time

    limit_s = float(os.environ.get("MLA_OVERLAP_TEST_LIMIT_S", "60"))

    done = torch.cuda.Event()
    done.record()
    t0 = time.monotonic()
    while not done.query():
        if time.monotonic() - t0 > limit_s:
            print(f"\noverlap kernel did not finish within {limit_s:.0f} s ({what}): exiting", file=sys.stderr,
                  flush=True)
            os._exit(3)
        time.sleep(0.001)
    torch.cuda.synchronize()


def _overlap_entry(conf, defer_pv_r: bool):
    """The decode entry of ``conf`` (a 2wg configuration) with the overlap kernel (WG1's P.V deferred or
    not), compiled once."""
    key = (conf, defer_pv_r)
    if key not in _COMPILED:
        import cutlass.cute as cute

        from pipelines.launch import TVM_FFI_OPTION, DecodeEntry, entry_args
        from pipelines.variant_2wg_overlap import MLADecode2WGOverlap

        cls = type("Overlap", (MLADecode2WGOverlap,), {"defer_pv_r": defer_pv_r})
        entry = DecodeEntry(conf)
        d = entry.decode
        entry.decode = cls(d.dtype, d.h_q, d.s_q, d.page_size, d.causal, d.h_kv, multicast=d.cluster > 1,
                           split_cluster=d.split_cluster)
        _COMPILED[key] = cute.compile(entry, *entry_args(conf), options=TVM_FFI_OPTION)
    return _COMPILED[key]


@pytest.mark.parametrize("defer_pv_r", [False, True], ids=["overlap", "overlap-defer"])
@pytest.mark.parametrize("case", CASES, ids=_ids())
def test_overlap_kernel_matches_reference(case, defer_pv_r):
    import mla
    import pipelines
    from mla.reference import compare_to_reference, mla_decode_reference
    from pipelines import paged_kv
    from pipelines.launch import DecodeConfig, partial_from_env

    seqlens, s_q, h_q, causal, page_size, dtype = case
    p = make_decode_problem(seqlens, s_q=s_q, h_q=h_q, page_size=page_size, dtype=dtype, device="cuda",
                            seed=hash((tuple(seqlens), s_q, h_q, page_size)) % 1000, value_scale=0.1)
    meta, num_splits = mla.get_mla_metadata(p.cache_seqlens, s_q * h_q, 1)
    conf = DecodeConfig.make("2wg", dtype, h_q, s_q, page_size, causal, 1, paged_kv.multicast_enabled(),
                             partial_from_env())
    b = len(seqlens)
    out = torch.full((b, s_q, h_q, 512), float("nan"), dtype=dtype, device="cuda")
    lse = torch.full((b, h_q, s_q), float("nan"), dtype=torch.float32, device="cuda")
    workspace = torch.empty(pipelines.workspace_numel(b, meta.shape[0], s_q * h_q), dtype=torch.float32,
                            device="cuda")
    _overlap_entry(conf, defer_pv_r)(p.q, p.k_cache, p.block_table, p.cache_seqlens, meta, num_splits, out, lse,
                                     workspace, 576 ** -0.5)
    _wait_or_exit(f"{_ids()[CASES.index(case)]} defer_pv_r={defer_pv_r}")
    ref_out, ref_lse = mla_decode_reference(p.q, p.k_cache, p.block_table, p.cache_seqlens, causal=causal)
    cmp = compare_to_reference(out, lse, ref_out, ref_lse)
    assert cmp.ok, cmp.message

