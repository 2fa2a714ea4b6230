"""GPU tests of the experimental ``pipelines.variant_seesaw2`` kernel (not a registered variant, so
``test_kernel_gpu.py`` does not reach it): its decode entry, compiled with the seesaw2 class on the 2wg
configuration (multicast off: the kernel runs no cluster), launched on the API's plan, against the fp32
reference. Same poisoned inputs as the registered variants' tests (NaN in every unused cache slot, random
page order, NaN-filled out). The tests run after every other test (conftest), since their hang guard
ends the process."""
from __future__ import annotations

import pytest
import torch

from mla.testing import make_decode_problem, varlen

pytestmark = pytest.mark.gpu

_COMPILED: dict = {}

# (seqlens, s_q, h_q, h_kv, causal, page_size, dtype)
CASES = [
    ([140, 20], 1, 64, 1, False, 64, torch.bfloat16),  # 3 tiles (a pair and a lone t0), masked tails
    ([64], 1, 64, 1, False, 64, torch.bfloat16),  # one whole tile: a lone t0
    ([128, 192], 1, 64, 1, False, 64, torch.bfloat16),  # whole pairs, and a pair plus a lone t0
    ([20, 140, 4096, 0, 1, 63, 65, 129], 1, 16, 1, False, 64, torch.bfloat16),  # varlen, zeros, 1-3 tiles
    ([0, 300, 0, 700], 1, 64, 1, False, 64, torch.bfloat16),  # zero lengths first
    ([4096] * 6, 1, 128, 1, False, 64, torch.bfloat16),  # two m-blocks, long chunks
    ([140, 4096], 2, 128, 1, True, 64, torch.float16),  # causal MTP
    ([141, 20, 7], 4, 128, 1, True, 64, torch.bfloat16),  # 8 m-blocks
    ([16384], 1, 128, 1, False, 64, torch.bfloat16),  # split over every SM, merged
    ([0, 0], 1, 16, 1, False, 64, torch.bfloat16),  # every row empty
    (varlen(64, 4096, seed=1, zeros=3), 1, 16, 1, False, 64, torch.bfloat16),
    (varlen(128, 1024, seed=2, zeros=2), 1, 128, 1, False, 64, torch.bfloat16),
    ([140, 4096, 33], 2, 64, 1, True, 16, torch.bfloat16),  # page 16: four pages per column box
    ([140, 4096, 33], 1, 128, 1, False, 32, torch.bfloat16),  # page 32
    ([300, 4096, 65], 2, 16, 1, True, 128, torch.bfloat16),  # page 128: half a page per tile
]


def _ids():
    return [f"b{len(c[0])}-sq{c[1]}-h{c[2]}-hkv{c[3]}-{'causal' if c[4] else 'full'}-p{c[5]}-{str(c[6])[6:]}"
            f"-max{max(c[0])}" for c in CASES]


def _wait_or_exit(what: str) -> None:
    """Wait for the launch; if it has not finished after ``MLA_SEESAW2_TEST_LIMIT_S`` seconds (default
    60; more under compute-sanitizer) -- a kernel not yet known to be correct may hang on a barrier --
    end the process: a hung kernel cannot be interrupted, and the rest of a GPU check (the other test
    files, the sanitizers) should not wait behind it."""
    import os
    import sys
    import time

    limit_s = float(os.environ.get("MLA_SEESAW2_TEST_LIMIT_S", "60"))

    done = torch.cuda.Event()
    done.record()
    t0 = time.monotonic()
    while not done.query():
        if time.monotonic() - t0 > limit_s:
            print(f"\nseesaw2 kernel did not finish within {limit_s:.0f} s ({what}): exiting", file=sys.stderr,
                  flush=True)
            os._exit(3)
        time.sleep(0.001)
    torch.cuda.synchronize()


def _seesaw2_entry(conf):
    """The decode entry of ``conf`` (a 2wg configuration without a cluster) with the seesaw2 kernel,
    compiled once."""
    if conf not in _COMPILED:
        import cutlass.cute as cute

        from pipelines.launch import TVM_FFI_OPTION, DecodeEntry, entry_args
        from pipelines.variant_seesaw2 import MLADecodeSeesaw2

        entry = DecodeEntry(conf)
        d = entry.decode
        entry.decode = MLADecodeSeesaw2(d.dtype, d.h_q, d.s_q, d.page_size, d.causal, d.h_kv)
        _COMPILED[conf] = cute.compile(entry, *entry_args(conf), options=TVM_FFI_OPTION)
    return _COMPILED[conf]


@pytest.mark.parametrize("case", CASES, ids=_ids())
def test_seesaw2_kernel_matches_reference(case):
    import mla
    import pipelines
    from mla.reference import compare_to_reference, mla_decode_reference
    from pipelines.launch import DecodeConfig, partial_from_env

    seqlens, s_q, h_q, h_kv, causal, page_size, dtype = case
    p = make_decode_problem(seqlens, s_q=s_q, h_q=h_q, h_kv=h_kv, page_size=page_size, dtype=dtype, device="cuda",
                            seed=hash((tuple(seqlens), s_q, h_q, page_size)) % 1000, value_scale=0.1)
    meta, num_splits = mla.get_mla_metadata(p.cache_seqlens, s_q * h_q // h_kv, h_kv)
    conf = DecodeConfig.make("2wg", dtype, h_q, s_q, page_size, causal, h_kv, False, partial_from_env())
    b = len(seqlens)
    out = torch.full((b, s_q, h_q, 512), float("nan"), dtype=dtype, device="cuda")
    lse = torch.full((b, h_q, s_q), float("nan"), dtype=torch.float32, device="cuda")
    workspace = torch.empty(pipelines.workspace_numel(b, meta.shape[0], s_q * h_q), dtype=torch.float32,
                            device="cuda")
    _seesaw2_entry(conf)(p.q, p.k_cache, p.block_table, p.cache_seqlens, meta, num_splits, out, lse, workspace,
                         576 ** -0.5)
    _wait_or_exit(_ids()[CASES.index(case)])
    ref_out, ref_lse = mla_decode_reference(p.q, p.k_cache, p.block_table, p.cache_seqlens, causal=causal)
    cmp = compare_to_reference(out, lse, ref_out, ref_lse)
    assert cmp.ok, cmp.message
