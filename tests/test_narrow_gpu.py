"""GPU tests of the narrow 2wg kernel (``pipelines.variant_2wg_narrow``: both products transposed), which the
``"2wg"`` pipeline runs at <= 32 query rows per kv head (``test_kernel_gpu.py`` reaches it through the API on
its h16 cases; these are the shapes that exercise its column layout): its decode entry, launched on the API's plan, against the fp32 reference, for every shape it
serves (at most 32 query rows per kv head). Same poisoned inputs as the registered variants' tests (NaN in
every unused cache slot, random page order, NaN-filled out and lse). The tests run after every other
test (conftest), since their hang guard ends the process."""
from __future__ import annotations

import pytest
import torch

from mla.testing import make_decode_problem, varlen

pytestmark = pytest.mark.gpu

_COMPILED: dict = {}

# (seqlens, s_q, h_q, h_kv, causal, page_size, dtype)
CASES = [
    ([140, 20], 1, 16, 1, False, 64, torch.bfloat16),  # masked tails
    ([64], 1, 16, 1, False, 64, torch.bfloat16),  # exactly one tile
    ([20, 140, 4096, 0, 1, 63, 65, 129], 1, 16, 1, False, 64, torch.bfloat16),  # varlen with zeros
    ([0, 300, 0, 700], 1, 16, 1, False, 64, torch.bfloat16),  # zero lengths first
    ([140, 20, 300], 1, 3, 1, False, 64, torch.float16),  # odd head count: 13 padding columns
    ([140, 20], 1, 1, 1, False, 64, torch.bfloat16),
    ([20, 140, 2, 0], 2, 8, 1, True, 64, torch.bfloat16),  # causal MTP incl. seqlen < s_q
    ([20, 140, 4096, 3], 4, 4, 1, True, 64, torch.bfloat16),
    ([16384], 1, 16, 1, False, 64, torch.bfloat16),  # split over every SM, merged
    ([16384], 2, 8, 1, True, 64, torch.float16),
    ([0, 0], 1, 16, 1, False, 64, torch.bfloat16),  # every row empty
    (varlen(64, 4096, seed=1, zeros=3), 1, 16, 1, False, 64, torch.bfloat16),
    ([140, 20, 0], 1, 32, 2, False, 64, torch.bfloat16),  # 16 rows per kv head
    (varlen(32, 1000, seed=4, zeros=2), 1, 16, 8, False, 64, torch.bfloat16),  # 2 rows per kv head
    ([140, 4096, 33], 1, 16, 1, False, 1, torch.bfloat16),  # cp.async gather
    ([140, 4096, 33], 2, 8, 1, True, 16, torch.bfloat16),  # four pages per tile
    ([140, 4096, 33], 1, 16, 1, False, 32, torch.bfloat16),
    ([300, 4096, 65], 1, 16, 1, False, 128, torch.bfloat16),  # half a page per tile
    # 17-32 rows per kv head: products 32 wide, the epilogue in two passes of 16 rows
    ([140, 20, 4096, 0], 1, 32, 1, False, 64, torch.bfloat16),
    ([20, 140, 2, 0, 700], 2, 16, 1, True, 64, torch.bfloat16),  # MTP on h16: 32 rows
    ([20, 140, 4096, 3], 4, 8, 1, True, 16, torch.float16),
    ([140, 20, 300], 1, 24, 1, False, 1, torch.bfloat16),  # 24 rows: 8 padding columns, second pass half full
    ([16384], 1, 32, 1, False, 64, torch.bfloat16),  # split over every SM, merged
    (varlen(32, 1000, seed=6, zeros=2), 1, 64, 2, False, 64, torch.bfloat16),  # 32 rows per kv head
    ([300, 4096, 65], 2, 16, 1, True, 128, torch.bfloat16),
]


def _ids():
    return [f"b{len(c[0])}-sq{c[1]}-h{c[2]}-hkv{c[3]}-{'causal' if c[4] else 'full'}-p{c[5]}-{str(c[6])[6:]}"
            f"-max{max(c[0])}" for c in CASES]


def _wait_or_exit(what: str) -> None:
    """Wait for the launch; if it has not finished after ``MLA_NARROW_TEST_LIMIT_S`` seconds (default
    60; more under compute-sanitizer) -- a kernel not yet known to be correct may hang on a barrier --
    end the process: a hung kernel cannot be interrupted, and the rest of a GPU check should not wait
    behind it."""
    import os
    import sys
    import time

    limit_s = float(os.environ.get("MLA_NARROW_TEST_LIMIT_S", "60"))
    done = torch.cuda.Event()
    done.record()
    t0 = time.monotonic()
    while not done.query():
        if time.monotonic() - t0 > limit_s:
            print(f"\nnarrow kernel did not finish within {limit_s:.0f} s ({what}): exiting", file=sys.stderr,
                  flush=True)
            os._exit(3)
        time.sleep(0.001)
    torch.cuda.synchronize()


def _narrow_entry(conf):
    if conf not in _COMPILED:
        from pipelines.launch import compile_entry
        from pipelines.variant_2wg_narrow import MLADecode2WGNarrow

        _COMPILED[conf] = compile_entry(conf, kernel_class=MLADecode2WGNarrow)
    return _COMPILED[conf]


def _run(case, seed, grow=False, partial=None):
    import mla
    import pipelines
    from mla.reference import compare_to_reference, mla_decode_reference
    from pipelines.heads import group_queries
    from pipelines.launch import DecodeConfig, partial_from_env

    seqlens, s_q, h_q, h_kv, causal, page_size, dtype = case
    p = make_decode_problem(seqlens, s_q=s_q, h_q=h_q, h_kv=h_kv, page_size=page_size, dtype=dtype, device="cuda",
                            seed=seed, value_scale=0.1)
    if grow:  # test_kernel_gpu's lazy-rescale case: RoPE columns of even tiles scaled up, tile by tile
        for r, n in enumerate(seqlens):
            for tile in range(-(-n // 64)):
                if tile % 2 == 0:
                    p.k_cache[int(p.block_table[r, tile]), :, :, 512:] *= 50.0 * (tile + 1)
    meta, num_splits = mla.get_mla_metadata(p.cache_seqlens, s_q * h_q // h_kv, h_kv)
    conf = DecodeConfig.make("2wg", dtype, h_q, s_q, page_size, causal, h_kv, False, partial or partial_from_env())
    b = len(seqlens)
    out = torch.full((b, s_q, h_q, 512), float("nan"), dtype=dtype, device="cuda")
    lse = torch.full((b, h_q, s_q), float("nan"), dtype=torch.float32, device="cuda")
    workspace = torch.empty(pipelines.workspace_numel(b, meta.shape[0], s_q * h_q), dtype=torch.float32,
                            device="cuda")
    # The compiled entry reads q grouped per kv head (the API's launcher makes the same copy).
    _narrow_entry(conf)(group_queries(p.q, h_kv), p.k_cache, p.block_table, p.cache_seqlens, meta, num_splits, out, lse, workspace,
                        576 ** -0.5, 0)  # 0: the merge kernel, the default (tests/test_grid_merge_gpu.py: 1)
    _wait_or_exit(str(case)[:80])
    ref_out, ref_lse = mla_decode_reference(p.q, p.k_cache, p.block_table, p.cache_seqlens, causal=causal)
    if grow:
        assert ref_lse[torch.isfinite(ref_lse)].max() > 12  # the scaling made large, growing scores
    cmp = compare_to_reference(out, lse, ref_out, ref_lse)
    assert cmp.ok, cmp.message


@pytest.mark.parametrize("case", CASES, ids=_ids())
def test_narrow_kernel_matches_reference(case):
    seqlens, s_q, h_q, _, _, page_size, _ = case
    _run(case, hash((tuple(seqlens), s_q, h_q, page_size)) % 1000)


def test_narrow_kernel_lazy_rescale_with_growing_scores():
    _run(([4096, 1000], 1, 16, 1, False, 64, torch.bfloat16), 7, grow=True)
    _run(([4096, 1000], 1, 32, 1, False, 64, torch.bfloat16), 8, grow=True)


def test_narrow_kernel_fp32_partials():
    """The split path with fp32 partials (the default is 16-bit): b1 16384 over every SM, and a varlen batch."""
    _run(([16384], 1, 16, 1, False, 64, torch.bfloat16), 11, partial="float32")
    _run((varlen(8, 3000, seed=5, zeros=1), 2, 8, 1, True, 64, torch.float16), 12, partial="float32")
    _run(([16384, 300], 2, 16, 1, True, 64, torch.bfloat16), 13, partial="float32")  # two passes of fp32
