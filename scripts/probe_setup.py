"""Setup shared by the diagnostics that compile the library's decode entry with a kernel class of their own
(``scripts/phase_probe.py``, ``scripts/segment_probe.py``, ``scripts/mode_probe.py``, ``scripts/timeline.py``).
Needs a GPU, but for ``cta_row`` and ``hook_loader``, which run while a kernel is traced."""
from __future__ import annotations


def cta_row(base: int, slots: int):
    """Inside a kernel (while tracing): the address of this CTA's row of ``slots`` 8-byte words in the buffer
    at ``base``, rows in the order of the CTA's linear index over grid x and y."""
    import cutlass
    import cutlass.cute as cute

    bx, by, _ = cute.arch.block_idx()
    gx, _, _ = cute.arch.grid_dim()
    return cutlass.Int64(base) + (cutlass.Int64(by) * cutlass.Int64(gx) + cutlass.Int64(bx)) * slots * 8


def hook_loader(kernel, release=None, wait=None) -> None:
    """Give ``kernel``'s K loader (``kernel.loader``, in the kernel's ``__init__``) a subclass whose
    ``consumer_release`` / ``consumer_wait`` first call ``release()`` / ``wait()`` (``cute.jit`` functions
    without arguments, traced inside the kernel; None: no hook)."""
    import cutlass.cute as cute
    from cutlass import const_expr

    class Hooked(type(kernel.loader)):
        @cute.jit
        def consumer_release(self, pipe, state):
            if const_expr(release is not None):
                release()
            super().consumer_release(pipe, state)

        @cute.jit
        def consumer_wait(self, pipe, state):
            if const_expr(wait is not None):
                wait()
            super().consumer_wait(pipe, state)

    kernel.loader.__class__ = Hooked


def planned_entry(cfg, variant: str = "2wg"):
    """``(inp, dec, config)`` for a perf-grid config ``cfg`` (``perf_table.grid.Config``): its inputs (seed 0,
    on the GPU), an ``mla.MLADecoder`` of ``variant`` planned for them, and the ``DecodeConfig`` of the entry
    the decoder launches (multicast and partial dtype as the environment sets them), to compile with
    ``pipelines.launch.compile_entry(config, kernel_class=...)``."""
    import mla
    from perf_table import bench
    from pipelines import paged_kv
    from pipelines.launch import DecodeConfig, partial_from_env

    inp = bench.make_inputs(cfg, device="cuda", seed=0)
    dec = mla.MLADecoder(pipeline=variant)
    dec.plan(inp.cache_seqlens, num_heads_q=cfg.h_q, seq_len_q=cfg.s_q, num_heads_k=1, page_size=cfg.page_size,
             dtype=inp.q.dtype, causal=cfg.causal)
    shape = dec._planned
    config = DecodeConfig.make(variant, shape.dtype, shape.h_q, shape.s_q, shape.page_size, shape.causal, 1,
                               paged_kv.multicast_enabled(), partial_from_env(), dec._info.split_cluster)
    return inp, dec, config


def replay_us(graph) -> float:
    """One replay of a captured CUDA graph, timed with CUDA events (us; synchronises)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3


def replay_last_clean(graph, buf, replays: int) -> list[float]:
    """Replay ``graph`` ``replays`` times (``replay_us`` each) with ``buf`` zeroed before the last replay, so that
    ``buf`` holds that replay's stamps only; returns the replay times (us)."""
    times = []
    for i in range(replays):
        if i == replays - 1:
            buf.zero_()
        times.append(replay_us(graph))
    return times


def probe_graph(cfg, probe_class, buf_shape, variant: str = "2wg"):
    """``(config, buf, graph)``: ``cfg``'s planned entry of ``variant`` (``planned_entry``) compiled with the
    kernel class ``probe_class(buf address)`` writing into ``buf`` (int64 zeros of ``buf_shape`` on the GPU),
    captured in one CUDA graph."""
    import torch

    from perf_table import bench
    from pipelines.launch import compile_entry

    inp, dec, config = planned_entry(cfg, variant)
    buf = torch.zeros(*buf_shape, dtype=torch.int64, device="cuda")
    fn = compile_entry(config, kernel_class=probe_class(buf.data_ptr()))
    graphs, _ = bench.capture_entries({"probe": fn}, inp, dec)
    return config, buf, graphs["probe"]
