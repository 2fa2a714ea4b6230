"""Byte and FLOP counts of one decode call, and where a time stands against the roofline.

The counts are those of the design notes (section 1) and of the anchors' README, so our GB/s and
TFLOP/s compare one to one with FlashMLA's and FlashInfer's:
- bytes = q + KV (each token read once, K and V share the 576-wide row) + out; lse and the
  split-kv partials are not counted (they are the kernel's overhead, not the problem's).
- FLOPs = 2 * s_q * h_q * sum(seqlen) * (576 + 512): QK^T plus PV, causal masking ignored.
"""
from __future__ import annotations

from .grid import HEAD_DIM, HEAD_DIM_V

ELEM_BYTES = {"bf16": 2, "fp16": 2}


def decode_bytes(b: int, s_q: int, h_q: int, total_kv_tokens: int, dtype: str = "bf16") -> int:
    """Bytes a decode call must move at least: q in, each KV token once, out back."""
    elem = ELEM_BYTES[dtype]
    rows = b * s_q * h_q
    return (rows * HEAD_DIM + total_kv_tokens * HEAD_DIM + rows * HEAD_DIM_V) * elem


def decode_flops(s_q: int, h_q: int, total_kv_tokens: int) -> int:
    """Matrix FLOPs of a decode call: every query row against every key of its request."""
    return 2 * s_q * h_q * total_kv_tokens * (HEAD_DIM + HEAD_DIM_V)


def gbps(nbytes: float, us: float) -> float:
    """Bytes per microsecond as GB/s (10^9 bytes per second)."""
    return nbytes / us / 1e3


def tflops(flops: float, us: float) -> float:
    """FLOPs per microsecond as TFLOP/s (10^12 per second)."""
    return flops / us / 1e6


def roofline_us(nbytes: float, flops: float, copy_gbps: float, gemm_tflops: float) -> tuple[float, str]:
    """Lower bound on the time of a call on this device, and which term sets it.

    The bound is max(bytes / copy bandwidth, FLOPs / GEMM rate), with both rates measured on the
    device in the same run (copy counting bytes read plus written, torch's bf16 GEMM 8192^3).
    Returns (microseconds, "memory" or "compute").
    """
    mem_us = nbytes / copy_gbps / 1e3
    mma_us = flops / gemm_tflops / 1e6
    return (mem_us, "memory") if mem_us >= mma_us else (mma_us, "compute")


def roofline_fraction(us: float, nbytes: float, flops: float, copy_gbps: float, gemm_tflops: float) -> float:
    """Fraction of the roofline reached: bound time / measured time (1.0 = at the roofline)."""
    bound_us, _ = roofline_us(nbytes, flops, copy_gbps, gemm_tflops)
    return bound_us / us
