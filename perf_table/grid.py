"""The benchmark grid: which configs are measured, and the sequence lengths of each.

A config is a shape of the decode problem (batch, query tokens, heads, KV length, page size).
Everything here is pure Python so the grid can be checked on a CPU.
"""
from __future__ import annotations

import dataclasses

import numpy as np

# The grid of issue 4 (and of the FlashMLA / FlashInfer anchors in perf_table/anchors/).
BATCHES = (1, 8, 32, 64, 128)
S_QS = (1, 2)
H_QS = (16, 32, 64, 128)
SEQLENS = (1024, 4096, 16384)
# Variable-length configs: b 128, h_q 128 (the anchors' varlen shape), these mean lengths.
VARLEN_B = 128
VARLEN_H_Q = 128
VARLEN_MEANS = (4096, 16384)
# Page 64 is the serving default (and the only one FlashMLA supports); 16 and 1 run where the
# pipeline supports them.
PAGE_SIZES = (64, 16, 1)

DTYPE = "bf16"
HEAD_DIM = 576  # K dims: 512 latent ("nope") + 64 RoPE
HEAD_DIM_V = 512

# --quick: the anchor configs of the design notes (section 2), page 64 ...
_QUICK_64 = (
    (128, 1, 16, 4096, False),
    (128, 1, 64, 4096, False),
    (128, 1, 128, 4096, False),
    (128, 2, 128, 4096, False),
    (128, 1, 128, 16384, False),
    (32, 1, 64, 4096, False),
    (8, 1, 64, 4096, False),
    (1, 1, 128, 16384, False),
    (1, 1, 16, 1024, False),
    (128, 1, 128, 8192, True),
)
# ... and the configs FlashInfer was measured on at page sizes 16 and 1.
_QUICK_SMALL_PAGES = (
    (128, 1, 16, 4096, False),
    (128, 1, 128, 4096, False),
    (1, 1, 128, 16384, False),
    (8, 1, 64, 4096, False),
)


@dataclasses.dataclass(frozen=True, order=True)
class Config:
    """One benchmark shape. ``seqlen`` is the mean length when ``varlen`` is set.

    ``multicast``: None where the kernels use no multicast cluster for this shape; True / False for
    the two rows of a shape that has one (``MLA_MULTICAST`` on / off: the A/B pair).
    """

    page_size: int
    b: int
    s_q: int
    h_q: int
    seqlen: int
    varlen: bool = False
    dtype: str = DTYPE
    multicast: bool | None = None

    @property
    def causal(self) -> bool:
        # MTP / speculative decode (s_q > 1) is causal; for s_q = 1 the flag changes nothing.
        return self.s_q > 1

    def label(self) -> str:
        """Short human-readable name, e.g. ``p64 b128 s1 h128 L4096``."""
        length = f"L~{self.seqlen} varlen" if self.varlen else f"L{self.seqlen}"
        mcast = {None: "", True: " mc-on", False: " mc-off"}[self.multicast]
        return f"p{self.page_size} b{self.b} s{self.s_q} h{self.h_q} {length}{mcast}"

    def max_pages(self) -> int:
        """Columns of the config's block table (``bench.make_inputs``): the longest request's pages
        (at least 1)."""
        return max(-(-max(self.seqlens()) // self.page_size), 1)

    def kv_capacity(self) -> int:
        """``block_table.shape[1] * page_size``: the KV-length proxy ``pipeline="auto"`` keys on
        (``pipelines.auto``). The block table is sized to the batch's longest request, so it is seqlen
        rounded up to the page for uniform lengths, the longest drawn length for varlen."""
        return self.max_pages() * self.page_size

    def seqlens(self) -> list[int]:
        """The per-request KV lengths: all ``seqlen``, or the seeded varlen draw."""
        if not self.varlen:
            return [self.seqlen] * self.b
        return varlen_lengths(self.b, self.seqlen)


def varlen_lengths(b: int, mean: int, seed: int = 0) -> list[int]:
    """Lengths drawn from N(mean, mean/2), clipped at 0, with some requests forced empty.

    Seeded by (seed, b, mean) so every run and every pipeline times the same lengths. One request
    in 32 (at least one) is set to 0 explicitly: zero-length requests occur in serving batches
    and exercise the planner's empty-request path.
    """
    rng = np.random.default_rng([seed, b, mean])
    lengths = np.clip(np.rint(rng.normal(mean, mean / 2, size=b)), 0, None).astype(np.int64)
    zeros = rng.choice(b, size=max(1, b // 32), replace=False)
    lengths[zeros] = 0
    return [int(x) for x in lengths]


def full_grid(page_sizes: tuple[int, ...] = PAGE_SIZES) -> list[Config]:
    """Every config of issue 4's grid for the given page sizes (in that order)."""
    configs = []
    for page in page_sizes:
        for b in BATCHES:
            for s_q in S_QS:
                for h_q in H_QS:
                    for seqlen in SEQLENS:
                        configs.append(Config(page, b, s_q, h_q, seqlen))
        for s_q in S_QS:
            for mean in VARLEN_MEANS:
                configs.append(Config(page, VARLEN_B, s_q, VARLEN_H_Q, mean, varlen=True))
    return configs


def quick_grid(page_sizes: tuple[int, ...] = PAGE_SIZES) -> list[Config]:
    """The anchor configs only: the design notes' FlashMLA table at page 64, FlashInfer's
    page-size configs at pages 16 and 1."""
    configs = []
    for page in page_sizes:
        shapes = _QUICK_64 if page == 64 else _QUICK_SMALL_PAGES
        configs.extend(Config(page, b, s_q, h_q, seqlen, varlen) for b, s_q, h_q, seqlen, varlen in shapes)
    return configs


def grid_page_sizes(supported: tuple[int, ...]) -> tuple[int, ...]:
    """The grid's page sizes that a pipeline supports, in grid order."""
    return tuple(p for p in PAGE_SIZES if p in supported)
