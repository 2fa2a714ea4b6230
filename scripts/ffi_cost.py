"""Host cost of a TVM-FFI launch by number of tensor arguments and kernels (issue 11's host path).

    python scripts/ffi_cost.py [--calls 2000] [--rounds 5]

Compiles small host functions the way ``pipelines.launch`` compiles the decode entry (``--enable-tvm-ffi``,
the stream from TVM-FFI's environment, torch tensors passed directly): an empty one-thread kernel
launched once or twice, with 1, 5 or 10 int32 tensor arguments (symbolic extents, as the entry's are),
or with 10 tensors and an fp32 scalar, and with PDL on the second launch. Each is called back to back
``--calls`` times on the current stream, then synchronised; printed: the median over ``--rounds`` of the
wall time per call, next to torch's ``x.add_(1)`` on a 4-element tensor for scale. Tells how much of
the decode entry's ~8 us per call (docs/perf-notes.md) is argument decoding and how much is launches.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipelines import paged_kv  # noqa: E402,F401  (first: it pins the DSL's target arch)

import cuda.bindings.driver as cuda  # noqa: E402
import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass.cute.runtime import make_fake_tensor  # noqa: E402

from pipelines.launch import TVM_FFI_OPTION  # noqa: E402


class Empty:
    """Empty kernels: ``launches`` of them (the second with PDL when ``pdl``); the host functions below
    take 1, 5 or 10 tensors as positional parameters, as the decode entry takes its 10."""

    def __init__(self, launches: int, pdl: bool):
        self.launches, self.pdl = launches, pdl

    @cute.kernel
    def kernel(self, t: cute.Tensor):
        pass

    @cute.jit
    def launch(self, first: cute.Tensor, last: cute.Tensor, stream: cuda.CUstream):
        self.kernel(first).launch(grid=[1, 1, 1], block=[32, 1, 1], stream=stream)
        if cutlass.const_expr(self.launches > 1):
            self.kernel(last).launch(grid=[1, 1, 1], block=[32, 1, 1], stream=stream, use_pdl=self.pdl)


class Empty1(Empty):
    @cute.jit
    def __call__(self, t0: cute.Tensor, scale: cutlass.Float32, stream: cuda.CUstream):
        self.launch(t0, t0, stream)


class Empty5(Empty):
    @cute.jit
    def __call__(self, t0: cute.Tensor, t1: cute.Tensor, t2: cute.Tensor, t3: cute.Tensor, t4: cute.Tensor,
                 scale: cutlass.Float32, stream: cuda.CUstream):
        self.launch(t0, t4, stream)


class Empty10(Empty):
    @cute.jit
    def __call__(self, t0: cute.Tensor, t1: cute.Tensor, t2: cute.Tensor, t3: cute.Tensor, t4: cute.Tensor,
                 t5: cute.Tensor, t6: cute.Tensor, t7: cute.Tensor, t8: cute.Tensor, t9: cute.Tensor,
                 scale: cutlass.Float32, stream: cuda.CUstream):
        self.launch(t0, t9, stream)


def compile_case(n: int, launches: int, pdl: bool):
    cls = {1: Empty1, 5: Empty5, 10: Empty10}[n]
    fakes = [make_fake_tensor(cutlass.Int32, (cute.sym_int32(),), (1,), assumed_align=4) for _ in range(n)]
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return cute.compile(cls(launches, pdl), *fakes, cutlass.Float32(1.0), stream, options=TVM_FFI_OPTION)


def per_call_us(fn, calls: int, rounds: int) -> float:
    import torch

    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    walls = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(walls)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)

    import torch

    x = torch.zeros(4, device="cuda")
    print(f"{torch.cuda.get_device_name(0)}; us per call, median of {args.rounds} rounds of {args.calls} calls")
    print(f"  {'torch x.add_(1) (scale)':<40} {per_call_us(lambda: x.add_(1.0), args.calls, args.rounds):6.2f}")
    for n, launches, pdl in ((1, 1, False), (5, 1, False), (10, 1, False), (10, 2, False), (10, 2, True)):
        fn = compile_case(n, launches, pdl)
        ts = [torch.zeros(16, dtype=torch.int32, device="cuda") for _ in range(n)]
        label = f"{n} tensors, {launches} kernel(s)" + (" (2nd with PDL)" if pdl else "")
        print(f"  {label:<40} {per_call_us(lambda: fn(*ts, 1.0), args.calls, args.rounds):6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
