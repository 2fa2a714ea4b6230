"""What happens when an in-grid merge is asked of a grid the GPU cannot hold at once (a diagnostic).

    python scripts/grid_merge_probe.py

The API never passes ``grid_merge`` 1 for such a grid (``pipelines.grid_merge_mode``); this calls the
compiled entry directly with a plan for twice the device's SMs and ``grid_merge`` 1, and prints what
the cooperative launch does (an exception and its type and message, or a result), then whether the
process can still decode (a normal call afterwards, checked against the reference).
"""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))


def main() -> int:
    import torch

    import mla
    import pipelines
    from mla.reference import compare_to_reference, mla_decode_reference
    from mla.testing import make_decode_problem

    p = make_decode_problem([9000], s_q=1, h_q=16, device="cuda", seed=1, value_scale=0.1)
    sms = pipelines.device_sm_count(p.q.device)
    meta, splits = mla.get_mla_metadata(p.cache_seqlens, 16, 1, num_sms=2 * sms)
    launch = pipelines.decode_launcher("2wg", torch.bfloat16, 16, 1, 64, False, 1)
    out = torch.empty(1, 1, 16, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(1, 16, 1, device="cuda")
    ws = torch.empty(pipelines.workspace_numel(1, meta.shape[0], 16), device="cuda")
    print(f"{torch.cuda.get_device_name()}: {sms} SMs, plan of {meta.shape[0]} parts, grid_merge 1", flush=True)
    try:
        launch(p.q, p.k_cache, p.block_table, p.cache_seqlens, meta, splits, out, lse, ws, 576 ** -0.5, 1)
        torch.cuda.synchronize()
        print("no exception (the launch ran)", flush=True)
    except Exception as exc:  # noqa: BLE001 - what it raises is the question
        print(f"raised {type(exc).__module__}.{type(exc).__name__} (error code {getattr(exc, '_error_code', None)}, "
              f"name {getattr(exc, '_error_name', None)!r}): {str(exc)[:400]}", flush=True)
        print(f"the API takes it for a refused cooperative launch: {mla.api._grid_merge_refused(exc, 1)}", flush=True)
    out2, lse2 = mla.flash_mla_with_kvcache(p.q, p.k_cache, p.block_table, p.cache_seqlens, 512,
                                            *mla.get_mla_metadata(p.cache_seqlens, 16, 1))
    torch.cuda.synchronize()
    ref = mla_decode_reference(p.q, p.k_cache, p.block_table, p.cache_seqlens)
    cmp = compare_to_reference(out2, lse2, *ref)
    print(f"a normal decode afterwards: {'PASS' if cmp.ok else 'FAIL ' + cmp.message}", flush=True)
    return 0 if cmp.ok else 1


if __name__ == "__main__":
    sys.exit(main())
