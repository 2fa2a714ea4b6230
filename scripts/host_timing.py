"""Host cost of a decode call, and the cold start of a new process with a warm kernel cache.

    python scripts/host_timing.py eager [--calls 300] [--rounds 5] [--b 1] [--h-q 16] [--seqlen 1024]
    python scripts/host_timing.py cold  [--b 1] [--h-q 16] [--seqlen 1024]
    python scripts/host_timing.py pieces [--calls 300] [--rounds 5] [--b 1] [--h-q 16] [--seqlen 1024]

``eager``: wall time per call of ``--calls`` back-to-back eager calls after warm-up (median of
``--rounds``; to the final ``torch.cuda.synchronize``, so never below the GPU time of a call) and the
host time per call (the loop alone: the enqueue cost, while the launch queue has room), bf16, s_q 1,
page 64, on the current GPU, for: ``mla.MLADecoder.run`` (planned once,
``out`` given), ``mla.flash_mla_with_kvcache`` (metadata from ``get_mla_metadata`` once),
``torch.ops.mla.decode`` (the custom op called eagerly), the compiled launch alone (no checks, no
allocation: the TVM-FFI call floor), the same entry compiled with a plain launch of the decode kernel
(``dependent_launch = False``: the A/B of its programmatic dependent launch), ``flash_mla_with_kvcache``
again with its workspace allocated per call (``MLA_WORKSPACE_CACHE=0``) and one CUDA graph replay of
``MLADecoder.run`` (the GPU time).

``pieces``: host time per call (the loop alone, median of ``--rounds`` rounds of ``--calls``) of each step of a cached
``flash_mla_with_kvcache`` call, timed separately: the signature key and its lookup, each of the three
allocations (out, lse, workspace), the compiled launch, and for scale a ``torch`` ``add_`` on a
4-element CUDA tensor (what one small eager torch op costs on this host).

``cold``: makes sure the configuration is in the kernel cache (``MLA_CACHE_DIR`` or the default),
then starts a fresh Python process that times ``import torch, mla``, the first ``get_mla_metadata``
(the planner kernel's first use), the first ``flash_mla_with_kvcache`` call from the call to the
result on the host (``torch.cuda.synchronize``), and a second call; it reports where the kernels
came from (``disk`` expected for both: exit status 1 otherwise).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _inputs(b, h_q, seqlen):
    from perf_table import bench
    from perf_table.grid import Config

    cfg = Config(64, b, 1, h_q, seqlen)
    return cfg, bench.make_inputs(cfg, device="cuda", seed=0)


def _time_calls(torch, fn, calls: int, rounds: int, warmup: int) -> tuple[list[float], list[float]]:
    """Per-call times in us of ``rounds`` rounds of ``calls`` back-to-back calls of ``fn`` (after
    ``warmup`` calls and a synchronize): ``(wall, host)`` per round, wall to the round's final
    synchronize, host the loop alone (the enqueue cost while the launch queue has room)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    wall, host = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        enqueued = time.perf_counter()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - start) * 1e6 / calls)
        host.append((enqueued - start) * 1e6 / calls)
    return wall, host


def eager(args) -> int:
    import torch

    import mla
    import pipelines

    cfg, inp = _inputs(args.b, args.h_q, args.seqlen)
    dec = mla.MLADecoder()
    dec.plan(inp.cache_seqlens, num_heads_q=args.h_q, seq_len_q=1, page_size=64, dtype=torch.bfloat16)
    out = torch.empty(args.b, 1, args.h_q, 512, dtype=torch.bfloat16, device="cuda")
    meta, splits = mla.get_mla_metadata(inp.cache_seqlens, args.h_q, 1)
    lse = torch.empty(args.b, args.h_q, 1, device="cuda")
    ws = torch.empty(pipelines.workspace_numel(args.b, meta.shape[0], args.h_q), device="cuda")
    launch = pipelines.decode_launcher("2wg", torch.bfloat16, args.h_q, 1, 64, False, 1)
    # What the decoder's eager run passes as grid_merge (pipelines.grid_merge_mode: eager-only counts).
    gm = int(dec._launch_for(dec._check_run(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, out, None))[1] != 0)
    scale = 576 ** -0.5
    q, k, bt, sl = inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens
    calls = {
        "MLADecoder.run (out given)": lambda: dec.run(q, k, bt, sl, out=out),
        "flash_mla_with_kvcache (metadata once)": lambda: mla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, splits),
        "torch.ops.mla.decode (eager)": lambda: torch.ops.mla.decode(q, k, bt, sl, meta, splits, out, lse, ws, scale,
                                                                     False, "2wg"),
        "compiled launch alone (TVM-FFI call)": lambda: launch(q, k, bt, sl, meta, splits, out, lse, ws, scale, gm),
        "compiled launch, merge kernel": lambda: launch(q, k, bt, sl, meta, splits, out, lse, ws, scale, 0),
        "compiled launch, decode without PDL": lambda: no_pdl(q, k, bt, sl, meta, splits, out, lse, ws, scale, gm),
    }
    no_pdl = _no_pdl_launch(args.h_q)
    # flash_mla_with_kvcache once more with its workspace allocated per call (MLA_WORKSPACE_CACHE=0),
    # timed right after the default form: the cost of the allocation the workspace cache saves.
    per_call_workspace = "flash_mla_with_kvcache, workspace per call"
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; b{args.b} s_q1 h{args.h_q} seqlen "
          f"{args.seqlen} bf16 page 64; {args.calls} back-to-back calls, median of {args.rounds} rounds")
    print(f"  {'':<42} {'wall':>7}    {'host':>7}   (wall: to the final synchronize, the issue's measure; it "
          f"cannot go below the GPU time. host: the loop alone, i.e. the enqueue cost while the launch queue "
          f"has room)")
    for name, fn in calls.items():
        wall, host = _time_calls(torch, fn, args.calls, args.rounds, warmup=50)
        _print_row(name, wall, host)
        if name.startswith("flash_mla_with_kvcache"):
            saved = os.environ.get(mla.api.WORKSPACE_CACHE_ENV_VAR)
            os.environ[mla.api.WORKSPACE_CACHE_ENV_VAR] = "0"
            try:
                wall, host = _time_calls(torch, calls[name], args.calls, args.rounds, warmup=50)
            finally:
                if saved is None:
                    os.environ.pop(mla.api.WORKSPACE_CACHE_ENV_VAR)
                else:
                    os.environ[mla.api.WORKSPACE_CACHE_ENV_VAR] = saved
            _print_row(per_call_workspace, wall, host)
    _graph_time(torch, dec, q, k, bt, sl, out)
    return 0


def _print_row(name, wall, host):
    print(f"  {name:<42} {statistics.median(wall):7.1f} us {statistics.median(host):7.1f} us per call  "
          f"(wall rounds: {', '.join(f'{r:.1f}' for r in wall)})")


def _no_pdl_launch(h_q):
    """The 2wg decode entry of b s_q1 h_q page 64 compiled with ``dependent_launch = False`` (a plain
    launch of the decode kernel), for the A/B beside the library's entry: a subclass of the kernel the
    library runs for this configuration (``launch._kernel_class``: 2wg's narrow kernel at <= 32 rows)."""
    from pipelines import paged_kv
    from pipelines.launch import DecodeConfig, _kernel_class, compile_entry, partial_from_env

    conf = DecodeConfig.make("2wg", "bfloat16", h_q, 1, 64, False, 1, paged_kv.multicast_enabled(),
                             partial_from_env())
    base = _kernel_class("2wg", conf)
    return compile_entry(conf, kernel_class=type(f"{base.__name__}_no_pdl", (base,), {"dependent_launch": False}))


def _graph_time(torch, dec, q, k, bt, sl, out):
    """GPU time of one ``MLADecoder.run`` (CUDA graph replays between events)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dec.run(q, k, bt, sl, out=out)
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(100)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    gpu = statistics.median(s.elapsed_time(e) * 1e3 for s, e in events)
    print(f"  {'GPU time (CUDA graph replay, events)':<42} {gpu:7.1f} us")
    return 0


_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch, mla
t1 = time.perf_counter()
sys.path.insert(0, {root!r})
from perf_table import bench
from perf_table.grid import Config
cfg = Config(64, {b}, 1, {h_q}, {seqlen})
inp = bench.make_inputs(cfg, device="cuda", seed=0)
torch.cuda.synchronize()
t_plan = time.perf_counter()
meta, splits = mla.get_mla_metadata(inp.cache_seqlens, {h_q}, 1)  # the planner kernel: loaded on first use
torch.cuda.synchronize()
t2 = time.perf_counter()
out, lse = mla.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, 512, meta, splits)
torch.cuda.synchronize()
t3 = time.perf_counter()
mla.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, 512, meta, splits)
torch.cuda.synchronize()
t4 = time.perf_counter()
from pipelines import launch
print(json.dumps(dict(import_s=t1 - t0, plan_s=t2 - t_plan, first_call_s=t3 - t2, second_call_s=t4 - t3, stats=launch.kernel_cache().stats,
                      cache=str(launch.kernel_cache().directory), finite=bool(torch.isfinite(out).all()))))
"""


def cold(args) -> int:
    child = _CHILD.format(root=str(ROOT), b=args.b, h_q=args.h_q, seqlen=args.seqlen)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    runs = []
    for label in ("warm-up process (fills the cache if needed)", "fresh process, warm cache"):
        proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, timeout=900)
        if proc.returncode:
            print(proc.stderr[-4000:], file=sys.stderr)
            return 1
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        runs.append(r)
        print(f"{label}: import torch+mla {r['import_s']:.2f} s; first get_mla_metadata {r['plan_s']:.3f} s; "
              f"first flash_mla_with_kvcache call -> result {r['first_call_s']:.3f} s; second call "
              f"{1e3 * r['second_call_s']:.2f} ms; kernels (planner + decode) {r['stats']}; "
              f"output finite: {r['finite']}; cache {r['cache']}")
    return 0 if runs[-1]["stats"]["disk"] == 2 and runs[-1]["stats"]["compiled"] == 0 else 1


def pieces(args) -> int:
    import torch

    import mla
    from mla import api

    cfg, inp = _inputs(args.b, args.h_q, args.seqlen)
    q, k, bt, sl = inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens
    meta, splits = mla.get_mla_metadata(sl, args.h_q, 1)
    mla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, splits)  # loads the kernel, caches the signature
    key = api._flash_key("auto", q, k, bt, sl, 512, meta, splits, None, False, None)
    call = api._FLASH_CALLS[key]
    dev = call.device
    out = torch.empty(call.out_shape, dtype=call.dtype, device=dev)
    lse = torch.empty(call.lse_shape, dtype=torch.float32, device=dev)
    ws = torch.empty(call.workspace_numel, dtype=torch.float32, device=dev)
    tiny = torch.zeros(4, device=dev)
    gm = api._grid_merge_arg(call.grid_merge) if call.grid_merge else 0  # what the eager call passes
    steps = {
        "flash_mla_with_kvcache (whole call)": lambda: mla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, splits),
        "signature key": lambda: api._flash_key("auto", q, k, bt, sl, 512, meta, splits, None, False, None),
        "signature key + lookup": lambda: api._FLASH_CALLS.get(
            api._flash_key("auto", q, k, bt, sl, 512, meta, splits, None, False, None)),
        "torch.empty out (device object)": lambda: torch.empty(call.out_shape, dtype=call.dtype, device=dev),
        "q.new_empty out": lambda: q.new_empty(call.out_shape, dtype=call.dtype),
        "torch.empty workspace": lambda: torch.empty(call.workspace_numel, dtype=torch.float32, device=dev),
        "compiled launch": lambda: call.launch(q, k, bt, sl, meta, splits, out, lse, ws, call.softmax_scale, gm),
        "torch add_ (4-element CUDA tensor)": lambda: tiny.add_(1.0),
    }
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; b{args.b} s_q1 h{args.h_q} seqlen "
          f"{args.seqlen}; host time per call (loop alone), median of {args.rounds} rounds of {args.calls}")
    for name, fn in steps.items():
        _, host = _time_calls(torch, fn, args.calls, args.rounds, warmup=200)
        print(f"  {name:<40} {statistics.median(host):7.2f} us")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("eager", "cold", "pieces"))
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--b", type=int, default=1)
    parser.add_argument("--h-q", type=int, default=16)
    parser.add_argument("--seqlen", type=int, default=1024)
    args = parser.parse_args(argv)
    return {"eager": eager, "cold": cold, "pieces": pieces}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
