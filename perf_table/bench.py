"""GPU measurements: the device roofline, the inputs of a config, CUDA-graph replay timing and the
wall time of back-to-back eager calls.

torch is imported by the functions that need it, so the rest of perf_table (and its tests) runs on
a machine without a GPU. ``make_inputs`` also works on the CPU, which is how it is tested.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time

from .formulas import gbps, tflops
from .grid import HEAD_DIM, HEAD_DIM_V, Config

# Device roofline: a copy far larger than L2 (50 MB on H100/H200), and the GEMM of the design
# notes' anchors.
COPY_BYTES = 1 << 30
GEMM_N = 8192
ROOFLINE_REPS = 20
# Eager calls: what an engine pays per layer when a step does not match a captured graph.
EAGER_CALLS = 300
EAGER_WARMUP = 20
EAGER_ROUNDS = 3


@dataclasses.dataclass
class Inputs:
    """Device tensors of one config, shaped as ``mla.MLADecoder.run`` takes them."""

    q: object            # [b, s_q, h_q, 576]
    k_cache: object      # [num_pages, page_size, 1, 576]
    block_table: object  # int32 [b, max_pages]
    cache_seqlens: object  # int32 [b]
    total_kv_tokens: int


def _uniformish(torch, shape, generator, device, dtype):
    # randn/10 clamped to [-1, 1], as the anchors: realistic magnitudes (and never all zeros,
    # which would understate the power draw of the tensor cores).
    x = torch.randn(shape, generator=generator, device=device, dtype=dtype)
    return x.div_(10).clamp_(-1, 1)


def make_inputs(cfg: Config, device="cuda", seed: int = 0) -> Inputs:
    """Fresh random q and paged KV for ``cfg``, pages in a random order, built on ``device``.

    (``mla.testing.make_decode_problem`` builds on the CPU page by page, with NaN tails for
    correctness tests: far too slow for the 2.1M pages of b128 x 16384 at page size 1.)

    Each request gets ceil(seqlen / page_size) pages drawn from one random permutation of the
    pool, so consecutive pages of a request are scattered as in a long-running server. Unused
    block_table slots point at page 0 (a valid page: they are never read, but a stray read must not
    fault while timing).
    """
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[cfg.dtype]
    lengths = cfg.seqlens()
    pages = [math.ceil(n / cfg.page_size) for n in lengths]
    total_pages = max(sum(pages), 1)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)

    q = _uniformish(torch, (cfg.b, cfg.s_q, cfg.h_q, HEAD_DIM), gen, device, dtype)
    k_cache = _uniformish(torch, (total_pages, cfg.page_size, 1, HEAD_DIM), gen, device, dtype)
    perm = torch.randperm(total_pages, generator=gen, device=device).to(torch.int32)
    pages_t = torch.tensor(pages, device=device)
    max_pages = cfg.max_pages()  # = max(pages): the block table fits the longest request (Config.kv_capacity)
    assert max_pages == max(max(pages), 1)
    used = torch.arange(max_pages, device=device)[None, :] < pages_t[:, None]
    block_table = torch.zeros(cfg.b, max_pages, dtype=torch.int32, device=device)
    # Boolean-mask assignment fills in row-major order: request r gets the next pages[r] ids.
    block_table[used] = perm[: sum(pages)]
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)
    return Inputs(q, k_cache, block_table, cache_seqlens, sum(lengths))


def make_decode_fn(mla, variant: str, cfg: Config, inp: Inputs, num_sms: int | None = None, out=None):
    """A zero-argument callable running one decode through the public API, planned once.

    ``mla.MLADecoder.plan`` does the host work (split plan, workspace) here, outside the timed
    region, as the anchors computed FlashMLA's scheduler metadata once; with ``out`` preallocated,
    ``run`` neither synchronises nor allocates, so it can be captured in a CUDA graph. ``num_sms``:
    SM count to plan for (default: the device's); ``out``: the output tensor to write (default: one
    allocated here). ``variant`` may be ``"auto"``; the callable's ``variant`` attribute names the
    variant it runs.
    """
    import torch

    decoder = mla.MLADecoder(pipeline=variant, num_sms=num_sms)
    decoder.plan(inp.cache_seqlens, num_heads_q=cfg.h_q, seq_len_q=cfg.s_q, num_heads_k=1,
                 page_size=cfg.page_size, dtype=inp.q.dtype, causal=cfg.causal)
    if out is None:
        out = torch.empty(cfg.b, cfg.s_q, cfg.h_q, HEAD_DIM_V, dtype=inp.q.dtype, device=inp.q.device)

    def call():
        decoder.run(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, out=out)

    call.variant = decoder.variant_for(inp.block_table)  # the variant it runs (what "auto" chose)
    return call


def make_flash_fn(mla, variant: str, cfg: Config, inp: Inputs, num_sms: int | None = None):
    """A zero-argument callable running ``mla.flash_mla_with_kvcache`` on ``inp``, with the metadata
    computed once here (``get_mla_metadata``) and ``out`` allocated by each call, as FlashMLA's own
    ``flash_mla_with_kvcache`` is usually called."""
    meta, splits = mla.get_mla_metadata(inp.cache_seqlens, cfg.s_q * cfg.h_q, 1, num_sms=num_sms)

    def call():
        mla.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, HEAD_DIM_V, meta, splits,
                                   causal=cfg.causal, pipeline=variant)

    return call


def make_plan_flash_fn(mla, variant: str, cfg: Config, inp: Inputs, num_sms: int | None = None):
    """A zero-argument callable running one eager decode step as an engine without a captured graph
    would: ``mla.get_mla_metadata(..., planner="device")`` (the planner kernel, no host sync) and
    then ``mla.flash_mla_with_kvcache`` with that fresh plan, ``out`` allocated by the call."""
    rows = cfg.s_q * cfg.h_q

    def call():
        meta, splits = mla.get_mla_metadata(inp.cache_seqlens, rows, 1, num_sms=num_sms, planner="device")
        mla.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, HEAD_DIM_V, meta, splits,
                                   causal=cfg.causal, pipeline=variant)

    return call


def time_eager(fn, calls: int = EAGER_CALLS, warmup: int = EAGER_WARMUP, rounds: int = EAGER_ROUNDS,
               clock=time.perf_counter, synchronize=None) -> float:
    """Wall time per call, in microseconds, of ``calls`` back-to-back eager calls of ``fn`` (after
    ``warmup`` calls and a synchronize; the clock stops after a final synchronize), median of
    ``rounds`` rounds. When the host is the bottleneck (small problems) this is the host cost of a
    call; otherwise it is the GPU time, since the queue never drains."""
    if synchronize is None:
        import torch
        synchronize = torch.cuda.synchronize
    for _ in range(warmup):
        fn()
    synchronize()
    per_call = []
    for _ in range(rounds):
        start = clock()
        for _ in range(calls):
            fn()
        synchronize()
        per_call.append((clock() - start) * 1e6 / calls)
    return statistics.median(per_call)


def _backlog(torch, n_calls: int):
    # Queue a spin kernel first so the CPU enqueues the timed launches while the GPU is busy:
    # each replay then starts as soon as the previous one ends, and the events measure GPU time,
    # not launch latency. ~20 us of lead per call covers the CPU cost of a graph launch + 2 events.
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(int(n_calls * 20e-6 * 1.5e9))


def time_graph(fn, replays: int = 100, warmup: int = 3) -> list[float]:
    """Per-replay times in microseconds of ``fn`` captured in one CUDA graph.

    ``fn`` runs twice eagerly first (the first call compiles the kernel), then is captured once;
    the graph is replayed ``warmup`` times untimed and ``replays`` times between CUDA events.
    """
    graph = capture_graph(fn, warmup)
    times = replay_times(graph, replays)
    del graph
    return times


def replay_times(graph, replays: int) -> list[float]:
    """Microseconds of ``replays`` back-to-back replays of a captured graph, behind the backlog kernel,
    CUDA events around each (the method of ``time_graph``)."""
    import torch

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    _backlog(torch, replays)
    for start, end in zip(starts, ends):
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]


def capture_graph(fn, warmup: int = 3):
    """``fn`` run twice eagerly (the first call compiles), captured in one CUDA graph, replayed
    ``warmup`` times untimed; returns the graph, which keeps ``fn`` (and so what it references) alive."""
    import torch

    fn()
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    # The graph replays the addresses fn's tensors had at capture; tensors made outside the capture
    # (an out, an lse, a decoder's plan and workspace that only fn's closure references) must live
    # as long as the graph, or the allocator hands their memory to the next caller's tensors.
    graph.keepalive = fn
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    return graph


def capture_entries(entries: dict, inp: Inputs, dec, calls: int = 1) -> tuple[dict, dict]:
    """One graph (``capture_graph``) per compiled decode entry of ``entries`` (``{name: fn}`` or
    ``{name: (fn, grid_merge)}``, the signature of ``pipelines.launch.DecodeEntry``; ``grid_merge``
    defaults to what the decoder's ``run`` passes in a graph), each launched on ``inp`` with the plan, workspace
    and softmax scale of the planned ``mla.MLADecoder`` ``dec``, and writing its own ``out`` and lse
    (A/B scripts: several builds of one config's kernel on the same inputs); ``calls`` launches in a
    row per graph (back-to-back decodes, as the layers of a model step: what a dependent launch of
    the decode overlaps). Returns ``(graphs, outs)``, both keyed by name."""
    import torch

    out_shape = (*inp.q.shape[:3], 512)  # [b, s_q, h_q, 512]
    fns, outs = {}, {}
    for name, fn in entries.items():
        out = outs[name] = torch.empty(out_shape, dtype=inp.q.dtype, device=inp.q.device)
        lse = torch.empty_like(dec._lse)
        # An entry given as (fn, grid_merge) runs with that argument; a bare fn with what the decoder's run
        # passes under graph capture (pipelines.grid_merge_mode: 1 only for an in-grid merge on every call).
        fn, grid_merge = fn if isinstance(fn, tuple) else (fn, int(dec._launch_for(dec._planned)[1] == 1))
        def run(fn=fn, out=out, lse=lse, grid_merge=grid_merge):
            for _ in range(calls):
                fn(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, dec.tile_scheduler_metadata,
                   dec.num_splits, out, lse, dec._workspace, dec._scale, grid_merge)
        fns[name] = run
    graphs = {name: capture_graph(fn) for name, fn in fns.items()}
    torch.cuda.synchronize()
    return graphs, outs


def round_orders(n: int) -> list[list[int]]:
    """Orders of ``n`` graphs for successive rounds (a Williams design): over the list every graph takes
    every position equally often and directly follows every other graph equally often (``n`` orders for
    even ``n``, ``2 n`` for odd ``n``; for 2 graphs the plain alternation). Why not a rotation: a graph
    runs at the SM clock the graphs just before it left, and a graph that draws less power (a plan that
    leaves SMs idle) raises it; a rotation puts each graph behind the same other one in every round, so
    that graph's timing carries the bias (measured: a plan read 5% faster behind a half-idle plan,
    docs/perf-notes.md, twenty-fifth session)."""
    base = [0] + [(k + 1) // 2 if k % 2 else n - k // 2 for k in range(1, n)]
    rows = [[(x + i) % n for x in base] for i in range(n)]
    return rows if n % 2 == 0 else rows + [row[::-1] for row in rows]


def time_graphs_interleaved(graphs: dict, replays: int = 100, rounds: int | None = None,
                            per: int | None = None) -> dict[str, list[float]]:
    """Per-replay times in microseconds of several captured graphs (``{name: graph}``), measured in
    rounds, each round in the next order of ``round_orders`` (every graph first, middle and last equally
    often, and behind every other graph equally often), so that a drift in clocks or temperature during
    the measurement (a compute-bound config slows down as the GPU heats), or the clock a graph leaves to
    the next one, falls on every graph alike instead of on whichever is timed last or behind a given one.
    Each round replays every graph ``per`` times in a row (default: ``ceil(replays / rounds)`` with
    ``rounds`` default two per graph, a whole number of passes through the design for any count; a
    ``rounds`` or ``per`` given otherwise may end inside a pass); ``per=1`` alternates the graphs replay by
    replay, so sample ``i`` of every graph comes from the same round (the finest pairing). The design
    balances neighbours within a round; where several rounds share one backlog (``per`` <= 5) the last
    graph of a round also precedes the first of the next, unbalanced. Returns ``{name: samples}``, about
    ``replays`` samples each, in round order."""
    import torch

    names = list(graphs)
    if per is None:
        rounds = rounds or 2 * len(names)
        per = -(-replays // rounds)
    else:
        rounds = -(-replays // per)
    # Rounds are enqueued in batches of about 10 replays per graph behind one backlog, then read back:
    # the GPU runs a batch's replays back to back, and the host does not wait after every round.
    batch = max(1, 10 // per)
    samples: dict[str, list[float]] = {n: [] for n in names}
    orders = round_orders(len(names))
    for first in range(0, rounds, batch):
        visits = []
        for r in range(first, min(first + batch, rounds)):
            for name in (names[i] for i in orders[r % len(orders)]):
                visits.append((name, [torch.cuda.Event(enable_timing=True) for _ in range(per)],
                               [torch.cuda.Event(enable_timing=True) for _ in range(per)]))
        _backlog(torch, per * len(visits))
        for name, starts, ends in visits:
            for start, end in zip(starts, ends):
                start.record()
                graphs[name].replay()
                end.record()
        torch.cuda.synchronize()
        for name, starts, ends in visits:
            samples[name] += [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    return samples


PLANNER_BATCHES = (1, 64, 128, 512, 1024)
"""Batch sizes ``python -m perf_table planner`` times by default (the issue's target is b = 128)."""


def time_planner(batch_size: int, rows: int = 16, mean_seqlen: int = 4096, replays: int = 200,
                 seed: int = 0) -> dict:
    """The split planner kernel alone: ``mla.get_mla_metadata(cache_seqlens, rows, 1,
    planner="device")`` captured in a CUDA graph (the graph holds only the planner kernel), median
    and 10th/90th percentiles of ``replays`` replays, in microseconds. For scale, the same for a
    graph of one tiny torch kernel (``floor_us``: what any one-kernel graph costs here), and the
    eager host time of one ``get_mla_metadata`` call (``eager_call_us``: wall time per call over
    back-to-back calls, dominated by the host-side launch path). Lengths ~ N(mean, mean/2)
    clipped at 0, seeded.
    """
    import time

    import torch

    import mla

    gen = torch.Generator().manual_seed(seed)
    lengths = (torch.randn(batch_size, generator=gen) * (mean_seqlen / 2) + mean_seqlen).clamp(min=0).round()
    cache_seqlens = lengths.to(torch.int32).cuda()
    num_parts = mla.get_mla_metadata(cache_seqlens, rows, 1, planner="device")[0].shape[0]
    samples = sorted(time_graph(lambda: mla.get_mla_metadata(cache_seqlens, rows, 1, planner="device"),
                                replays=replays))
    tiny = torch.zeros(1, device="cuda")
    floor = statistics.median(time_graph(lambda: tiny.add_(1.0), replays=replays))
    calls = 200
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        mla.get_mla_metadata(cache_seqlens, rows, 1, planner="device")
    torch.cuda.synchronize()
    eager = (time.perf_counter() - start) / calls * 1e6
    return {
        "batch_size": batch_size, "rows": rows, "num_parts": num_parts, "mean_seqlen": mean_seqlen,
        "median_us": statistics.median(samples), "p10_us": samples[len(samples) // 10],
        "p90_us": samples[(9 * len(samples)) // 10], "floor_us": floor, "eager_call_us": eager,
        "replays": replays,
    }


def _median_event_us(torch, fn, reps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))


def measure_roofline(copy_bytes: int = COPY_BYTES, gemm_n: int = GEMM_N, reps: int = ROOFLINE_REPS) -> dict:
    """The device's practical limits, measured now: copy GB/s (read + write) and bf16 GEMM TFLOP/s."""
    import torch

    src = torch.randn(copy_bytes // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_us = _median_event_us(torch, lambda: dst.copy_(src), reps)
    del src, dst
    a = torch.randn(gemm_n, gemm_n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(gemm_n, gemm_n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(a)
    gemm_us = _median_event_us(torch, lambda: torch.mm(a, b, out=c), reps)
    del a, b, c
    torch.cuda.empty_cache()
    return {
        "copy_bytes": 2 * copy_bytes,  # read + written
        "copy_us": copy_us,
        "copy_gbps": gbps(2 * copy_bytes, copy_us),
        "gemm_n": gemm_n,
        "gemm_us": gemm_us,
        "gemm_tflops": tflops(2 * gemm_n**3, gemm_us),
        "reps": reps,
    }


def cuda_healthy() -> bool:
    """False once the CUDA context is broken (a sticky error such as an illegal address)."""
    import torch

    try:
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001 - any failure here means the context is unusable
        return False
