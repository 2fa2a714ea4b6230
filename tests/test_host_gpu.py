"""GPU: the host path for real (Hopper GPU; ``python -m pytest -m gpu``).

- The kernel cache across processes: a second process loads the entry from disk and decodes the
  same result; a damaged entry is recompiled and replaced.
- ``torch.library.opcheck`` on ``torch.ops.mla.decode``; ``torch.compile(fullgraph=True)`` of a step
  calling the API equals eager; ``flash_mla_with_kvcache`` captured in a CUDA graph.
- Launches follow torch's current stream (TVM-FFI environment stream).
- The per-call host cost stays far below the old path's (~180 us per ``MLADecoder.run``).
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest
import torch

pytestmark = pytest.mark.gpu

ROOT = pathlib.Path(__file__).resolve().parent.parent

_CHILD = r"""
import json, time, torch, mla
from mla.testing import make_decode_problem
from mla.reference import mla_decode_reference
p = make_decode_problem([700, 33, 0, 2000], s_q=1, h_q=16, device="cuda", seed=3)
meta, splits = mla.get_mla_metadata(p.cache_seqlens, 16, 1)
torch.cuda.synchronize()
start = time.perf_counter()
out, lse = mla.flash_mla_with_kvcache(p.q, p.k_cache, p.block_table, p.cache_seqlens, 512, meta, splits)
torch.cuda.synchronize()
first = time.perf_counter() - start
ref_out, ref_lse = mla_decode_reference(p.q, p.k_cache, p.block_table, p.cache_seqlens)
from pipelines import launch
print(json.dumps(dict(stats=launch.kernel_cache().stats, first_call_s=first,
                      err=float((out.float() - ref_out).abs().max()),
                      out=out.float().sum().item(), lse=[float(x) for x in lse.flatten()[:8]])))
"""


def _child(cache_dir):
    env = dict(os.environ, MLA_CACHE_DIR=str(cache_dir), PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("MLA_DISK_CACHE", None)
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_second_process_loads_from_disk_and_a_damaged_entry_is_recompiled(tmp_path):
    # Two entries per process: the planner kernel (get_mla_metadata on CUDA lengths) and the decode.
    first = _child(tmp_path)
    assert first["stats"]["compiled"] == 2 and first["stats"]["disk"] == 0, first
    second = _child(tmp_path)
    assert second["stats"]["disk"] == 2 and second["stats"]["compiled"] == 0, second
    for r in (first, second):
        assert r["err"] < 2e-2, r
    assert (second["out"], second["lse"]) == (first["out"], first["lse"])  # same kernel, same result
    print(f"first call, warm cache, new process: {second['first_call_s']:.3f} s")
    (obj,) = tmp_path.glob("*/decode-*.o")
    obj.write_bytes(b"\0" * 64)  # garbage
    third = _child(tmp_path)
    assert third["stats"]["compiled"] == 1 and third["stats"]["replaced"] == 1, third
    assert third["out"] == first["out"]
    assert _child(tmp_path)["stats"]["disk"] == 2


def _problem(seqlens=(700, 33, 0, 2000), s_q=2, h_q=16, seed=5, poison=True):
    """A paged problem with the anchors' value distribution (the tolerances are made for it) and NaN
    in every unused cache slot unless ``poison`` is False."""
    from mla.testing import make_decode_problem

    p = make_decode_problem(list(seqlens), s_q=s_q, h_q=h_q, device="cuda", seed=seed, value_scale=0.1)
    if not poison:
        p.k_cache = torch.nan_to_num(p.k_cache)
    return p


def _fresh_q(q):
    return (torch.randn_like(q, dtype=torch.float32) * 0.1).clamp(-1, 1).to(q.dtype)


def test_opcheck():
    import mla
    import pipelines

    p = _problem(poison=False)  # opcheck compares runs element by element: keep NaN out of unused slots
    meta, splits = mla.get_mla_metadata(p.cache_seqlens, 32, 1)
    b = p.q.shape[0]
    args = (p.q, p.k_cache, p.block_table, p.cache_seqlens, meta, splits,
            torch.empty(b, 2, 16, 512, dtype=torch.bfloat16, device="cuda"), torch.empty(b, 16, 2, device="cuda"),
            torch.zeros(pipelines.workspace_numel(b, meta.shape[0], 32), device="cuda"), 576 ** -0.5, True, "2wg")
    result = torch.library.opcheck(torch.ops.mla.decode.default, args)
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compiled_step_equals_eager(mode):
    """A step calling flash_mla_with_kvcache and MLADecoder.run, compiled with fullgraph=True
    (inductor; with "reduce-overhead" also replayed as CUDA graphs), gives the eager result."""
    import mla

    torch._dynamo.reset()
    p = _problem()
    meta, splits = mla.get_mla_metadata(p.cache_seqlens, 32, 1)
    dec = mla.MLADecoder()
    dec.plan(p.cache_seqlens, num_heads_q=16, seq_len_q=2, causal=True)
    out = torch.empty(4, 2, 16, 512, dtype=torch.bfloat16, device="cuda")

    def step(q, k_cache, block_table, cache_seqlens):
        o1, lse1 = mla.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, 512, meta, splits, causal=True)
        o2, lse2 = dec.run(q * 0.5, k_cache, block_table, cache_seqlens, out=out)
        return o1 * 2, lse1.clone(), o2.clone(), lse2.clone()

    args = (p.q, p.k_cache, p.block_table, p.cache_seqlens)
    want = step(*args)
    compiled = torch.compile(step, fullgraph=True, mode=mode)
    for _ in range(3):  # reduce-overhead records on the first calls, replays after
        got = compiled(*args)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_flash_mla_captured_in_a_cuda_graph():
    import mla
    from mla.reference import compare_to_reference, mla_decode_reference

    p = _problem(s_q=1, h_q=64)
    meta, splits = mla.get_mla_metadata(p.cache_seqlens, 64, 1)
    mla.flash_mla_with_kvcache(p.q, p.k_cache, p.block_table, p.cache_seqlens, 512, meta, splits)  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = mla.flash_mla_with_kvcache(p.q, p.k_cache, p.block_table, p.cache_seqlens, 512, meta, splits)
    p.q.copy_(_fresh_q(p.q))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref_out, ref_lse = mla_decode_reference(p.q, p.k_cache, p.block_table, p.cache_seqlens)
    cmp = compare_to_reference(out, lse, ref_out, ref_lse)
    assert cmp.ok, cmp.message


def test_launch_follows_the_current_stream():
    """On a side stream held busy, q is rewritten and decoded on that stream: the decode must see
    the new q, which it only does if it was queued behind the copy on the same stream."""
    import mla
    from mla.reference import compare_to_reference, mla_decode_reference

    p = _problem(s_q=1, h_q=16)
    dec = mla.MLADecoder()
    dec.plan(p.cache_seqlens, num_heads_q=16, seq_len_q=1)
    out = torch.full((4, 1, 16, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    dec.run(p.q, p.k_cache, p.block_table, p.cache_seqlens, out=out)
    new_q = _fresh_q(p.q)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU spin on the side stream
        p.q.copy_(new_q)
        _, lse = dec.run(p.q, p.k_cache, p.block_table, p.cache_seqlens, out=out)
    side.synchronize()
    ref_out, ref_lse = mla_decode_reference(p.q, p.k_cache, p.block_table, p.cache_seqlens)
    cmp = compare_to_reference(out, lse, ref_out, ref_lse)
    assert cmp.ok, cmp.message


def test_back_to_back_calls_without_sync_match_the_reference(monkeypatch):
    """Eager calls queued back to back, nothing between them on the stream (every q and output is
    made before the first call), no synchronisation: each decode is launched with programmatic
    dependent launch right behind the previous call's merge, and ``flash_mla_with_kvcache`` reuses
    one workspace per stream, so a decode that touched global memory before the previous merge
    finished reading the partials would corrupt that call's output. Long requests over 132-part
    plans make every merge read many partials; the second shape needs a larger workspace (the kept
    one grows while the first shape's calls are queued)."""
    import mla
    from mla import api
    from mla.reference import compare_to_reference, mla_decode_reference

    monkeypatch.delenv(api.WORKSPACE_CACHE_ENV_VAR, raising=False)
    problems = [_problem(seqlens=(9000,), s_q=1, h_q=64, seed=11),
                _problem(seqlens=(5000, 300, 7000), s_q=2, h_q=64, seed=12)]
    metas = [mla.get_mla_metadata(p.cache_seqlens, p.q.shape[1] * 64, 1) for p in problems]
    order = [0, 0, 0, 0, 1, 0, 1, 0, 1, 1, 0, 1]
    qs = [_fresh_q(problems[i].q) for i in order]
    torch.cuda.synchronize()
    calls = []
    for i, q in zip(order, qs):
        p, (meta, splits) = problems[i], metas[i]
        out, lse = mla.flash_mla_with_kvcache(q, p.k_cache, p.block_table, p.cache_seqlens, 512, meta, splits,
                                              causal=True)
        calls.append((p, q, out, lse))
    torch.cuda.synchronize()
    for p, q, out, lse in calls:
        ref_out, ref_lse = mla_decode_reference(q, p.k_cache, p.block_table, p.cache_seqlens, causal=True)
        cmp = compare_to_reference(out, lse, ref_out, ref_lse)
        assert cmp.ok, cmp.message
    # MLADecoder.run back to back: one plan and one workspace for every call, an out and lse each.
    p = problems[1]
    dec = mla.MLADecoder()
    dec.plan(p.cache_seqlens, num_heads_q=64, seq_len_q=2, causal=True)
    qs = [_fresh_q(p.q) for _ in range(8)]
    outs = [torch.empty(3, 2, 64, 512, dtype=torch.bfloat16, device="cuda") for _ in qs]
    lses = [torch.empty(3, 64, 2, device="cuda") for _ in qs]
    torch.cuda.synchronize()
    for q, out, lse in zip(qs, outs, lses):
        dec.run(q, p.k_cache, p.block_table, p.cache_seqlens, out=out, lse=lse)
    torch.cuda.synchronize()
    for q, out, lse in zip(qs, outs, lses):
        ref_out, ref_lse = mla_decode_reference(q, p.k_cache, p.block_table, p.cache_seqlens, causal=True)
        cmp = compare_to_reference(out, lse, ref_out, ref_lse)
        assert cmp.ok, cmp.message


def test_flash_workspace_is_kept_per_stream(monkeypatch):
    import mla
    from mla import api

    monkeypatch.delenv(api.WORKSPACE_CACHE_ENV_VAR, raising=False)
    mla.release_workspaces()
    small, large = _problem(seqlens=(700,), s_q=1, h_q=16), _problem(s_q=1, h_q=16)
    plans = {id(p): mla.get_mla_metadata(p.cache_seqlens, 16, 1) for p in (small, large)}

    def call(p):
        return mla.flash_mla_with_kvcache(p.q, p.k_cache, p.block_table, p.cache_seqlens, 512, *plans[id(p)])

    call(large)
    (key, first), = api._WORKSPACES.items()
    call(small)  # needs less: the same buffer
    call(large)
    assert api._WORKSPACES == {key: first}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call(small)
    assert len(api._WORKSPACES) == 2 and api._WORKSPACES[key] is first  # its own buffer on another stream
    torch.cuda.synchronize()
    # Under capture a fresh one (the graph's memory pool), the cached buffers untouched.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(small)
    assert len(api._WORKSPACES) == 2 and api._WORKSPACES[key] is first
    monkeypatch.setenv(api.WORKSPACE_CACHE_ENV_VAR, "0")
    mla.release_workspaces()
    call(small)
    assert api._WORKSPACES == {}
    monkeypatch.delenv(api.WORKSPACE_CACHE_ENV_VAR)
    monkeypatch.setattr(api, "WORKSPACE_CACHE_MAX_BYTES", 4 * 1024)  # smaller than any workspace: none kept
    call(small)
    assert api._WORKSPACES == {}
