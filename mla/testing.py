"""Helpers for tests, the ``python -m mla`` self-check and benchmarks: random decode problems laid out
as the anchors test them, and the Hopper-GPU probe that decides whether GPU tests run."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .reference import HEAD_DIM_QK

UNUSED_PAGE_ID = 1 << 30
"""block_table value for entries past a request's last page: reading it faults, so a kernel that
reads past the end is caught."""


@dataclass
class DecodeProblem:
    """Inputs of one decode call (see ``mla.flash_mla_with_kvcache`` for shapes)."""
    q: torch.Tensor
    k_cache: torch.Tensor
    block_table: torch.Tensor
    cache_seqlens: torch.Tensor


def make_decode_problem(seqlens: Sequence[int], *, s_q: int = 1, h_q: int = 16, h_kv: int = 1,
                        page_size: int = 64, head_dim: int = HEAD_DIM_QK, dtype: torch.dtype = torch.bfloat16,
                        device="cpu", seed: int = 0, value_scale: float | None = None) -> DecodeProblem:
    """A random paged decode problem.

    Pages are assigned in a random permutation; every cache slot that holds no token (the tail of
    each request's last page) is NaN; block_table entries past a request's last page are
    ``UNUSED_PAGE_ID``. Values are drawn on the CPU from ``seed``, so the problem is the same on
    every device: standard normal, or with ``value_scale`` the anchors' distribution
    ``clamp(randn * value_scale, -1, 1)`` (FlashMLA's tests use 0.1; their tolerances, which
    ``mla.reference.compare_to_reference`` adopts, are calibrated for it).
    """
    gen = torch.Generator().manual_seed(seed)
    b = len(seqlens)
    pages_per_req = [-(-n // page_size) for n in seqlens]
    num_pages = max(sum(pages_per_req), 1)
    order = torch.randperm(num_pages, generator=gen).tolist()
    block_table = torch.full((b, max(max(pages_per_req, default=0), 1)), UNUSED_PAGE_ID, dtype=torch.int32)
    k_cache = torch.full((num_pages, page_size, h_kv, head_dim), float("nan"), dtype=dtype)
    values = _draw((num_pages, page_size, h_kv, head_dim), gen, value_scale).to(dtype)
    # Request r takes the next n_pages(r) ids of the permutation, page by page; a page's first
    # min(page_size, tokens left) slots hold values, the rest stay NaN. (Vectorised: page size 1
    # means one page per token.)
    total = sum(pages_per_req)
    assigned = torch.tensor(order[:total], dtype=torch.long)
    used = torch.empty(total, dtype=torch.long)
    next_page = 0
    for r, (n, n_pages) in enumerate(zip(seqlens, pages_per_req)):
        block_table[r, :n_pages] = assigned[next_page:next_page + n_pages].to(torch.int32)
        used[next_page:next_page + n_pages] = (n - torch.arange(n_pages) * page_size).clamp(max=page_size)
        next_page += n_pages
    filled = torch.arange(page_size).view(1, page_size) < used.view(total, 1)  # [pages, slots]
    k_cache[assigned] = torch.where(filled.view(total, page_size, 1, 1), values[assigned], k_cache[assigned])
    q = _draw((b, s_q, h_q, head_dim), gen, value_scale).to(dtype)
    cache_seqlens = torch.tensor(list(seqlens), dtype=torch.int32)
    return DecodeProblem(q.to(device), k_cache.to(device), block_table.to(device), cache_seqlens.to(device))


def _draw(shape, gen, value_scale):
    x = torch.randn(shape, generator=gen)
    return x if value_scale is None else (x * value_scale).clamp_(-1.0, 1.0)


def hopper_skip_reason() -> str | None:
    """``None`` when a CUDA device of compute capability 9.x is usable, else why GPU tests skip."""
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        return f"needs a Hopper GPU (sm_90), found {torch.cuda.get_device_name()} (sm_{major}{minor})"
    return None
