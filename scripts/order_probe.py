"""Does a row's time in the perf runner depend on what ran before it? (diagnostic)

    python scripts/order_probe.py [--config 64,128,1,128,1024 ...] [--replays 100] [--idle 2]

The perf runner measures each config's rows (2wg with multicast on, and off where there is a cluster)
right after the previous config's, by ``bench.time_graphs_interleaved`` on graphs of
``bench.make_decode_fn`` (``perf_table/runner.py``). This measures the given configs in the given order
the same way, in one process, then the last config again after ``--idle`` seconds with the GPU idle,
and prints each measurement's medians, with the SM clock right after it (a one-warp kernel's
``%clock64`` over ``%globaltimer``). On an H200 b128 s1 h128 1024 read 79-91 us in four full grids
where it measured right after b128 s1 h64 16384, and 69 us in ``scripts/clock_probe.py`` on a fresh
process (docs/perf-notes.md, nineteenth session).
"""
from __future__ import annotations

import argparse
import dataclasses
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipelines import paged_kv  # noqa: E402,F401  (first: it pins the DSL's target arch)

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass._mlir.dialects import llvm  # noqa: E402
from cutlass.cute.runtime import make_fake_tensor  # noqa: E402

DEFAULT = ("64,128,1,64,1024", "64,128,1,64,4096", "64,128,1,64,16384", "64,128,1,128,1024")


def clock_kernel():
    """A compiled one-warp kernel that spins about 2M SM cycles and writes its ``%clock64`` and
    ``%globaltimer`` deltas into a 2-element int64 tensor: the SM clock right now is their ratio (the
    clock nvidia-smi reports is not what the SMs ran at under the decode, docs/perf-notes.md)."""
    from pipelines.launch import TVM_FFI_OPTION

    class Clock:
        @cute.kernel
        def kernel(self, out: cute.Tensor):
            addr = out.iterator.toint()
            llvm.inline_asm(None, [addr.ir_value()],
                            "{\n.reg .u64 t0, t1, c0, c1, c;\n.reg .pred p;\nmov.u64 t0, %globaltimer;\n"
                            "mov.u64 c0, %clock64;\nspin:\nmov.u64 c, %clock64;\nsub.u64 c, c, c0;\n"
                            "setp.lt.u64 p, c, 2000000;\n@p bra spin;\nmov.u64 c1, %clock64;\n"
                            "mov.u64 t1, %globaltimer;\nsub.u64 c1, c1, c0;\nsub.u64 t1, t1, t0;\n"
                            "st.global.u64 [$0], c1;\nst.global.u64 [$0+8], t1;\n}", "l", has_side_effects=True)

        @cute.jit
        def __call__(self, out: cute.Tensor, stream):
            self.kernel(out).launch(grid=[1, 1, 1], block=[32, 1, 1], stream=stream)

    fake = make_fake_tensor(cutlass.Int64, (2,), (1,), assumed_align=16)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return cute.compile(Clock(), fake, stream, options=TVM_FFI_OPTION)


def sm_clock_reader():
    """A callable that returns the SM clock right now in MHz (``clock_kernel`` compiled once, its two counters
    read back after a synchronisation)."""
    import torch

    clock = clock_kernel()
    clk = torch.zeros(2, dtype=torch.int64, device="cuda")

    def sm_mhz() -> float:
        clock(clk)
        torch.cuda.synchronize()
        cycles, ns = clk.tolist()
        return cycles / ns * 1e3

    return sm_mhz


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", default=[], help="page,b,s_q,h_q,seqlen (in order)")
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--idle", type=float, default=2.0)
    ap.add_argument("--grid-before", type=int, default=0, metavar="N",
                    help="first measure the N page-64 grid configs (perf_table.grid.full_grid order, quietly) "
                         "that the runner measures before the first --config; -1: all of them")
    args = ap.parse_args(argv)

    import torch

    import mla
    import pipelines
    from perf_table import bench, grid, runner

    def measure(spec, label: str, quiet: bool = False):
        base = spec if isinstance(spec, grid.Config) else grid.Config(*(int(x) for x in spec.split(",")))
        inp = bench.make_inputs(base, seed=runner.SEED)
        rows = [dataclasses.replace(base, multicast=True), dataclasses.replace(base, multicast=False)] \
            if pipelines.multicast_cluster(base.page_size, base.h_q * base.s_q) > 1 else [base]
        graphs = {}
        for c in rows:
            with runner.multicast_env(c.multicast):
                fn = bench.make_decode_fn(mla, "2wg", c, inp)
                graphs[str(c.multicast)] = bench.capture_graph(fn, runner.WARMUP_REPLAYS)
        samples = bench.time_graphs_interleaved(graphs, args.replays)
        mhz = None if quiet else sm_mhz()
        del graphs
        torch.cuda.empty_cache()
        if not quiet:
            print(f"  {label:<8} {base.label():<26} " + ", ".join(
                f"mc {k}: median {statistics.median(v):.1f} min {min(v):.1f}" for k, v in samples.items())
                + f"; SM clock right after: {mhz:.0f} MHz", flush=True)

    sm_mhz = sm_clock_reader()

    specs = args.config or list(DEFAULT)
    print(torch.cuda.get_device_name(0), f"{args.replays} replays per row", flush=True)
    if args.grid_before:
        first = grid.Config(*(int(x) for x in specs[0].split(",")))
        order = grid.full_grid((first.page_size,))
        before = order[:order.index(first)] if first in order else order
        before = before if args.grid_before < 0 else before[-args.grid_before:]
        t0 = time.perf_counter()
        for c in before:
            measure(c, "", quiet=True)
        print(f"  measured {len(before)} grid configs first ({time.perf_counter() - t0:.0f} s)", flush=True)
    for spec in specs:
        measure(spec, "in order")
    time.sleep(args.idle)
    measure(specs[-1], f"idle {args.idle:g}s")
    measure(specs[-1], "again")
    return 0


if __name__ == "__main__":
    sys.exit(main())
