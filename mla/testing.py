"""Helpers for tests, the ``python -m mla`` self-check and benchmarks: random decode problems laid out
as the anchors test them, the Hopper-GPU probe that decides whether GPU tests run, and random split
planner inputs (``plan_cases``)."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

import torch

from split_k import planner

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


def varlen(b: int, mean: int, seed: int, zeros: int = 1) -> list[int]:
    """Seeded lengths ~ N(mean, mean/2) clipped at 0 and rounded, with ``zeros`` of them forced to 0
    (the GPU tests' and ``scripts/diag_3wg.py``'s varlen batches)."""
    g = torch.Generator().manual_seed(seed)
    lens = (torch.randn(b, generator=g) * (mean / 2) + mean).clamp(min=0).round().int().tolist()
    for i in range(min(zeros, b)):
        lens[(i * 7919) % b] = 0
    return lens


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


# ------------------------------------------------------------------------------------ plan cases

PLAN_CASE_NUM_SMS = 132
"""SM count the plan cases use when none is given (H100 SXM / H200)."""


@dataclass(frozen=True)
class PlanCase:
    """One input of the split planner: lengths and the rows they are planned for."""
    lengths: list[int]
    s_q: int
    h_q: int
    num_parts: int

    def __str__(self) -> str:
        longest = max(self.lengths, default=0)
        return f"b{len(self.lengths)}-sq{self.s_q}-h{self.h_q}-parts{self.num_parts}-max{longest}"


def plan_cases(seed: int, count: int, num_sms: int = PLAN_CASE_NUM_SMS) -> list[PlanCase]:
    """Random planner inputs as the issue asks for them: b in 1..1024 (skewed small), some zero
    lengths, lengths up to 128k (and a few past it), rows from s_q 1..4 and h_q 1..128, hence
    different ``num_parts``; plus the shapes that stress the plan's corners (every length zero,
    one long request, all-equal lengths, a long tail). Deterministic in ``seed``. Shared by the CPU
    tests of the kernel's Python model and the GPU tests of the kernel, so a new corner case added
    here is checked by both.
    """
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        b = rng.choice([1, 2, 3, 5, 8, 16, 33, 64, 100, 128, 129, 255, 256, 500, 1000, 1024])
        kind = i % 6
        if kind == 0:  # mixed, with zeros
            lengths = [0 if rng.random() < 0.2 else rng.randint(1, 8192) for _ in range(b)]
        elif kind == 1:  # long tail up to 128k+
            lengths = [rng.randint(100_000, 140_000) if rng.random() < 0.1 else rng.randint(0, 4096)
                       for _ in range(b)]
        elif kind == 2:  # all equal
            lengths = [rng.choice([1, 64, 65, 4096, 131072])] * b
        elif kind == 3:  # short, many fit one part
            lengths = [rng.randint(0, 200) for _ in range(b)]
        elif kind == 4:  # one or two long requests among short ones
            lengths = [rng.randint(0, 300) for _ in range(b)]
            for _ in range(min(2, b)):
                lengths[rng.randrange(b)] = rng.randint(64_000, 131_072)
        else:  # every length zero, or a single request
            lengths = [0] * b if rng.random() < 0.5 else [rng.randint(0, 131_072)]
        s_q, h_q = rng.randint(1, 4), rng.choice([1, 3, 16, 32, 63, 64, 65, 126, 128])
        cases.append(PlanCase(lengths, s_q, h_q, planner.num_sm_parts(num_sms, s_q * h_q, 1)))
    return cases


def edge_plan_cases(num_sms: int = PLAN_CASE_NUM_SMS) -> list[PlanCase]:
    """Planner corners beyond ``plan_cases``: int32-extreme lengths whose budgets reach 2^30 (where
    the kernel switches its walk from 32-bit to 64-bit arithmetic) or stop just below it, the
    largest batch the kernel plans, more parts than tiles, many parts for one request, every
    length zero, aligned plans (whole requests, even splits of long ones) and their fallback. ``num_parts`` is set directly where the corner needs it."""
    from split_k import planner_kernel

    top = 2**31 - 1  # ceil(top / 64) = 2^25 tiles
    cap_tiles = planner_kernel.CAP - planner.FIXED_COST * 33  # with one part: payload = CAP - 1 + extra
    rng = random.Random(12345)
    cases = []
    # 40 x 2^25 tiles: payload past 2^30 for one part, below it for more; 80 and 97: splits in the
    # 64-bit walk.
    for count, parts in ((40, 1), (40, 2), (40, 3), (40, num_sms), (80, 2), (97, 3)):
        cases.append(PlanCase([top] * count, 1, 16, parts))
    for extra in (0, 1):  # payload CAP - 1 (32-bit walk) and CAP (64-bit walk)
        last = cap_tiles - 1 + extra - 31 * 2**25
        cases.append(PlanCase([top] * 31 + [last * 64], 1, 16, 1))
    b = planner_kernel.MAX_BATCH
    for parts in (num_sms, planner_kernel.MAX_PARTS):
        cases.append(PlanCase([rng.choice([0, rng.randint(1, 4096)]) for _ in range(b)], 1, 16, parts))
    cases.append(PlanCase([1, 0, 1], 1, 16, num_sms))
    cases.append(PlanCase([131072], 1, 16, planner_kernel.MAX_PARTS))
    cases.append(PlanCase([0] * 1000, 1, 16, num_sms))
    # Whole requests (planner.aligned_params): capacity above the payload; the walk's padding past
    # b (33 requests, one per part, exactly num_parts parts) must not count as parts; too many parts
    # for whole requests, so the balanced walk runs after the whole one.
    cases.append(PlanCase([1024] * 64, 1, 16, num_sms))
    cases.append(PlanCase([1024] * 33, 1, 16, 33))
    cases.append(PlanCase([640] * 3, 1, 16, 2))
    cases.append(PlanCase([640] * 40 + [64] * 5, 1, 16, 20))
    # Aligned plans with long requests (planner.aligned_params): even splits (b32 h128 4096; b32 s2
    # h64 16384, whose chunk size is above target), long and whole requests with zeros beside them,
    # and long requests whose further chunks alone outnumber the parts (the clamped sums).
    cases.append(PlanCase([4096] * 32, 1, 128, 66))
    cases.append(PlanCase([16384] * 32, 2, 64, 66))
    cases.append(PlanCase([640, 0, 6400, 0, 0, 640, 64 * 100], 1, 16, 9))
    cases.append(PlanCase([top] * 3 + [0, 0], 1, 16, 4))
    cases.append(PlanCase([top] + [64] * 300, 1, 16, planner_kernel.MAX_PARTS))
    return cases
