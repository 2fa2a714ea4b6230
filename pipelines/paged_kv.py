"""Paged KV loaders: how one 64-token K tile (its first 512 columns are V) gets from the paged cache
into a shared-memory stage, for every page size the library serves.

This module is the one place that states the supported page sizes (``PAGE_SIZES``); the registry
(``pipelines.supported_page_sizes``), the API's validation, ``mla.compile_check`` and the test
fixtures all read it from here.

Two loaders, picked at compile time from the page size; both fill the same smem stages and complete
on the stage's "full" mbarrier that the consumers already wait on, so the math warpgroups do not know
which one ran:

- ``TmaPagedKV`` (page_size >= 16: 16, 32, 64, 128). A tile is ``64 / box_rows`` TMA boxes of
  ``box_rows = min(page_size, 64 / cluster)`` tokens x 576 dims, each box's page id read from
  block_table (a 128-token page gives a tile from one half of a page: a row offset inside the
  page). All boxes complete on the stage's one mbarrier, whose expected transaction count is the
  whole tile. With a cluster of 2 CTAs (the m-blocks of one request, see ``cluster_size``) each CTA
  issues half of every tile's boxes and multicasts them to both CTAs. Pages of 16 and 32 tokens
  (a CTA's share of the tile is several boxes) spread the boxes over producer warps, one box per
  warp (``TmaPagedKV.warp_per_box``). On every TMA path a caller may read a producer warp's page id
  of a tile early and hand it to the load (``prefetches_page``).
- ``GatherPagedKV`` (page_size < 16: 1, 2, 4, 8). No TMA box fits the 8-row swizzle atom of a page
  this small, so each token row is gathered with 16-byte cp.async (LDGSTS): 8 threads per row, 9
  chunks each, the row's address from block_table. 128 producer threads each commit their copies
  to the stage barrier with ``cp.async.mbarrier.arrive.noinc`` (the barrier's arrival count is the
  128 producers), so the stage completes when every copy has landed.

Rows past a request's end: neither loader reads outside the request's own pages (the TMA loader
loads a box past the end from a page the request owns: the last valid one, or at a chunk's head, where
the page ids are read before the length, the page of the tile's first token; the gather loader skips
those rows). What such rows hold in smem is stale or whatever the last page holds past the end (NaN in
the tests); the consumers mask their scores and zero their V rows (``MLADecodeBase.zero_v_rows``), so
nothing of it reaches P.V.
"""
from __future__ import annotations

import os

GATHER_PAGE_SIZES = (1, 2, 4, 8)
"""Page sizes loaded by the cp.async row gather."""
TMA_PAGE_SIZES = (16, 32, 64, 128)
"""Page sizes loaded by TMA boxes (at least two 8-row swizzle atoms per box)."""
PAGE_SIZES = GATHER_PAGE_SIZES + TMA_PAGE_SIZES
"""Every page size (``k_cache.shape[1]``) the kernels serve."""

MULTICAST_ENV_VAR = "MLA_MULTICAST"
"""``MLA_MULTICAST=0`` turns TMA multicast clusters off (A/B measurement, fallback); unset or 1: on."""
MULTICAST_CLUSTER = 2
"""CTAs per cluster when multicast is on. Why 2 and not 4 for 256+ rows: the split plan sizes the grid
to the SM count with one CTA per SM, and a cluster must sit in one GPC. Hopper's GPCs hold an even
number of SMs (2 per TPC), so 2-CTA clusters can fill every SM; with 4-CTA clusters a GPC of 18 SMs
leaves 2 idle, and the CTAs that do not fit run as a second wave, which costs far more than the L2
traffic a cluster of 4 saves over a cluster of 2 (the KV bytes come from HBM once either way)."""

TILE_TOKENS = 64  # tokens per K tile (BLOCK_N of the kernels)
COL_BLOCK = 64  # columns of one 128B-swizzle atom of a bf16/fp16 tile: the unit of a column group


def check_page_size(page_size: int) -> None:
    """ValueError unless ``page_size`` is one the loaders serve."""
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size not in PAGE_SIZES:
        raise ValueError(f"page_size must be one of {PAGE_SIZES}, got {page_size!r}")


def uses_tma(page_size: int) -> bool:
    """True when tiles of this page size are loaded by TMA, False for the cp.async gather."""
    check_page_size(page_size)
    return page_size in TMA_PAGE_SIZES


def multicast_enabled() -> bool:
    """The ``MLA_MULTICAST`` switch: unset, ``1``: on; ``0``: off; anything else is a ValueError."""
    value = os.environ.get(MULTICAST_ENV_VAR, "1")
    if value not in ("0", "1"):
        raise ValueError(f"{MULTICAST_ENV_VAR} must be 0 or 1 (or unset), got {value!r}")
    return value == "1"


def cluster_size(page_size: int, num_m_blocks: int, multicast: bool) -> int:
    """CTAs per cluster along grid x (the m-blocks of one plan part): 2 when multicast is wanted, the
    page size is a TMA one and the m-block count is even; else 1 (no cluster).

    An odd m-block count (129-192, 257-320 or 385-448 rows) gets no cluster: padding grid x to even
    would add CTAs beyond the SM count the planner sized the grid for (a second wave), and a cluster
    of 3 or more does not fit every GPC (see ``MULTICAST_CLUSTER``).
    """
    if multicast and uses_tma(page_size) and num_m_blocks >= MULTICAST_CLUSTER \
            and num_m_blocks % MULTICAST_CLUSTER == 0:
        return MULTICAST_CLUSTER
    return 1


# ----------------------------------------------------------------------------------------------
# Device code. The DSL is imported after the constants so that reading them costs nothing extra for
# callers that already import cutlass, and the arch is pinned before the first DSL import (a CPU-only
# machine would otherwise compile for a default arch).
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
import cutlass.pipeline as pipeline  # noqa: E402
from cutlass import Int32, const_expr  # noqa: E402
from cutlass.cute.nvgpu import cpasync  # noqa: E402
from cutlass._mlir.dialects import llvm  # noqa: E402


@cute.jit
def poll_barrier(bar, phase):
    """Wait for the mbarrier ``bar`` to complete ``phase`` by polling ``mbarrier.test_wait`` (no sleep between
    checks, unlike try_wait's ``NANOSLEEP.SYNCS``)."""
    done = cute.arch.mbarrier_test_wait(bar, phase)
    while not done:
        done = cute.arch.mbarrier_test_wait(bar, phase)


class PagedKVLoader:
    """What a loader tells the kernel (static, host side) and the calls the kernel makes (device side).

    Host side: ``make_tma`` (inside the kernel's ``@cute.jit __call__``) builds whatever descriptor the
    loader needs. Device side: ``make_pipeline`` builds the K stage pipeline; ``producer_warps``
    warps of the producer warpgroup call ``load_tile`` for every tile, in tile order, with the same
    arguments; every consumer thread calls ``consumer_wait`` / ``consumer_release`` around its reads.

    ``mK`` is the kernel's (token_in_page, dim, kv_head, page) view of k_cache; ``kv_head`` selects the
    576-wide slice of every token (0 while the kernels serve h_kv = 1).
    """

    producer_warps: int

    def __init__(self, dtype, page_size: int, head_dim: int, stages: int, cluster: int = 1,
                 by_columns: bool = False):
        check_page_size(page_size)
        self.dtype = dtype
        # by_columns: ``load_tile`` takes ``cols``, the 64-column blocks of the tile to load (the seesaw
        # pipeline fills a stage in two column groups, each completing on its own barrier).
        self.by_columns = by_columns
        self.page_size = page_size
        self.head_dim = head_dim
        self.stages = stages
        self.cluster = cluster
        self.tile_bytes = TILE_TOKENS * head_dim * dtype.width // 8

    @cute.jit
    def consumer_wait(self, pipe, state, spin: cutlass.Constexpr[bool] = False):
        """Wait until the stage of ``state`` is full. ``spin``: poll the barrier with ``mbarrier.test_wait``
        instead of ``try_wait``, whose SASS sleeps between checks (``NANOSLEEP.SYNCS``), so the warp wakes
        later than the phase completes (a kernel's ``k_wait_spin``)."""
        if const_expr(spin):
            poll_barrier(pipe.sync_object_full.get_barrier(state.index), state.phase)
        else:
            pipe.consumer_wait(state)

    @cute.jit
    def consumer_release(self, pipe, state):
        pipe.consumer_release(state)


class TmaPagedKV(PagedKVLoader):
    """TMA boxes of ``box_rows`` tokens x 576 dims, one per page (or page slice) of the tile; with a
    cluster, each CTA issues its ``1 / cluster`` of the boxes and multicasts them to every CTA.

    Who issues (``warp_per_box``). Pages of 64 and 128 tokens (and page 32 in a 2-CTA cluster): one
    box per CTA and tile, issued by one warp. Pages of 16 and 32 tokens otherwise: a CTA's share of a
    tile is 2 or 4 boxes (page 16: 4 pages x 9 column copies = 36 TMA instructions per tile), and
    each box is issued by its own producer warp (``producer_warps = boxes_per_cta``), warp w box w:

    - Why warps and not the 32 lanes of one warp: a TMA load (UTMALDG) takes its smem address,
      barrier and coordinates in *uniform* registers, issued once per warp (the SASS of the old
      single-warp path: ``UTMALDG.3D [UR16], [UR34]`` after ``R2UR`` of the page id). 32 lanes
      each issuing a box with their own page id do not issue in parallel: ptxas turns the lane-
      divergent operands into a loop over the lanes, one UTMALDG per iteration on the warp's one
      uniform datapath, so the issue stays serial. Each warp has its own uniform datapath, so 4
      warps issue their 9 copies each side by side, and the tile's last copy reaches the TMA unit
      about 4x sooner (the single warp spends ~15 uniform instructions of descriptor and smem
      address bookkeeping per copy, ~500 per tile at page 16).
    - Why not fewer copies: a copy's inner dimension is at most 64 columns, since a 128B-swizzled TMA
      box's inner dimension is at most 128 bytes. A box with a column-block dimension (64 columns,
      rows, column blocks) is one instruction, but TMA writes a box densely (column block stride
      ``rows x 64``), while the stage puts column block c at ``c x 64 x 64`` (the wgmma layout of the
      64-token tile): the two agree only for a 64-row box, i.e. not for pages of 16 or 32, nor for a
      CTA's half of a tile in a multicast cluster. Where they agree a kernel may load each column
      group as one such copy (``set_wide_groups``, the kernel's ``kv_wide_boxes``). Several pages in
      one box need consecutive pages in memory, which a random block_table does not give.
    - Barrier: the full barrier expects ``producer_warps`` arrivals, each warp's elected lane
      arrives with ``arrive.expect_tx`` of its own box's bytes (``tile_bytes / producer_warps``)
      before issuing that box (``producer_acquire``), so a warp's copies never complete ahead of
      its own expect_tx. A box of another warp (or of the peer CTA, multicast) may land before this
      warp's expect_tx: the transaction count then goes transiently negative (PTX allows
      -(2^20 - 1)), and the phase cannot complete while an arrival is missing, so it completes
      exactly when every warp has arrived and every byte has landed -- the same reasoning the
      multicast cluster already relies on for the peer's boxes.
    - Page ids read early (every TMA path): the caller may pass this warp's page id of the tile
      (``page_id``, one block_table load per warp, all lanes the same address), loaded before it waits
      for the P.V that frees the stage (variant_2wg), so the load's latency is off the path from
      "stage free" to "TMA issued". Without it, ``load_tile`` reads it itself.
    """

    def __init__(self, dtype, page_size: int, head_dim: int, stages: int, cluster: int = 1,
                 by_columns: bool = False):
        super().__init__(dtype, page_size, head_dim, stages, cluster, by_columns)
        if page_size not in TMA_PAGE_SIZES:
            raise ValueError(f"TMA loader serves page sizes {TMA_PAGE_SIZES}, got {page_size}")
        if TILE_TOKENS % cluster:
            raise ValueError(f"cluster {cluster} does not divide the {TILE_TOKENS}-token tile")
        self.rows_per_cta = TILE_TOKENS // cluster  # tile rows each CTA of the cluster issues
        # A box never spans two pages, and never more rows than this CTA's share of the tile. Both are
        # multiples of 8, so every box starts on a 128B-swizzle atom boundary of the stage.
        self.box_rows = min(page_size, self.rows_per_cta)
        self.boxes_per_cta = self.rows_per_cta // self.box_rows
        # One producer warp per box where a CTA issues several boxes per tile (pages 16 and 32; see
        # the class docstring); else one warp issues the tile (pages 64 and 128, unchanged). At most
        # 4 warps: one warpgroup (page 16 without a cluster).
        self.warp_per_box = self.boxes_per_cta > 1
        self.producer_warps = self.boxes_per_cta if self.warp_per_box else 1
        # L2 eviction priority of the K boxes (``L2_HINTS``; None: the default policy, no hint in the
        # PTX). Set by the kernel from its class constant ``MLADecodeBase.kv_l2_hint``.
        self.l2_hint = None
        # Column groups loaded as one TMA copy each (``set_wide_groups``); None: one copy per 64-column block.
        self.wide_groups = None
        if self.tile_bytes % (self.producer_warps * self.cluster):
            raise ValueError("tile bytes do not split evenly over the producer warps")

    def box_smem_layout(self, sK_layout):
        """The smem layout of one box (rows 0..box_rows-1 of stage 0): what the TMA atom writes.

        The stage layout composed with a (row, dim) -> (row, dim) map restricted to box_rows rows keeps
        the stage's strides (a box lands inside the stage tile, not as a compact tile of its own).
        """
        outer = cute.composition(sK_layout.outer,
                                 cute.make_layout((self.box_rows, self.box_cols()), stride=(1, TILE_TOKENS)))
        return cute.make_composed_layout(sK_layout.inner, 0, outer)

    def set_wide_groups(self, groups) -> bool:
        """Load each column group of a tile (``groups``: tuples of consecutive 64-column blocks, the ``cols``
        a kernel passes to ``load_tile``; ``((0, ..., 8),)`` for whole tiles) with one 4-D TMA copy (64
        columns x box rows x the group's blocks) instead of one copy per block. Only where a box is the
        tile's 64 rows (pages 64 and 128 without a cluster): the stage holds block c at ``c x 64 x 64``, which
        is where a 4-D box writes it only then. Returns whether it is on. Why: copies issue 120-150 cycles
        apart (docs/perf-notes.md, twenty-ninth session), so a group of five went out over 500-600 cycles."""
        if self.box_rows != TILE_TOKENS or self.cluster != 1:
            return False
        for g in groups:
            if tuple(g) != tuple(range(g[0], g[0] + len(g))):
                raise ValueError(f"a wide column group must be consecutive blocks, got {g}")
        self.wide_groups = tuple(tuple(g) for g in groups)
        return True

    def group_smem_layout(self, sK_layout, n_blocks: int):
        """The smem layout one wide copy of ``n_blocks`` column blocks writes (stage 0, from block 0)."""
        outer = cute.composition(sK_layout.outer, cute.make_layout(
            (self.box_rows, (COL_BLOCK, n_blocks)), stride=(1, (TILE_TOKENS, TILE_TOKENS * COL_BLOCK))))
        return cute.make_composed_layout(sK_layout.inner, 0, outer)

    def box_cols(self) -> int:
        """Columns of one copy: the whole 576 (the DSL splits it into 64-column TMA instructions), or
        one 64-column block when the tile is loaded by column groups."""
        return COL_BLOCK if self.by_columns else self.head_dim

    def make_tma(self, mK, sK_layout):
        """(atom, TMA view of mK) for boxes of this loader (call inside the host ``@cute.jit``)."""
        op = cpasync.CopyBulkTensorTileG2SMulticastOp() if const_expr(self.cluster > 1) \
            else cpasync.CopyBulkTensorTileG2SOp()
        if const_expr(self.wide_groups is not None):
            # The dim mode split into (64 columns, column block): a copy's box then spans several blocks (one
            # atom per group width; every atom's TMA view of mK is the same, so the last one is returned).
            mKb = cute.make_tensor(mK.iterator, cute.make_layout(
                (mK.shape[0], (COL_BLOCK, self.head_dim // COL_BLOCK), mK.shape[2], mK.shape[3]),
                stride=(mK.stride[0], (mK.stride[1], COL_BLOCK * mK.stride[1]), mK.stride[2], mK.stride[3])))
            atoms = []
            view = None
            for g in self.wide_groups:
                atom, view = cpasync.make_tiled_tma_atom(op, mKb, self.group_smem_layout(sK_layout, len(g)),
                                                         (self.box_rows, (COL_BLOCK, len(g))))
                atoms.append(atom)
            return tuple(atoms), view
        return cpasync.make_tiled_tma_atom(op, mK, self.box_smem_layout(sK_layout), (self.box_rows, self.box_cols()))

    def make_pipeline(self, barrier_ptr, consumer_warps: int, tx_bytes=None):
        """K stages: one producer arrive (with the tile's byte count) per stage and CTA; each consumer
        warp releases a stage once, to every CTA of the cluster (their producers multicast into it).
        ``tx_bytes``: bytes one stage of this pipeline receives per CTA (default: the whole tile; a
        column group's share when the tile is loaded by column groups)."""
        if tx_bytes is None:
            tx_bytes = self.tile_bytes
        thread = pipeline.Agent.Thread
        cta_layout = None
        if const_expr(self.cluster > 1):
            # (V, M, N, K): the cluster runs along M (grid x = m-blocks). With the default
            # mcast_mode_mn=(1, 1) lanes 0..cluster-1 of each consumer warp arrive on the empty
            # barrier of CTA rank 0..cluster-1.
            cta_layout = cute.make_layout((1, self.cluster, 1, 1))
        # One arrive.expect_tx per producer warp, each for its share of the tile: with one box per
        # warp every warp's boxes carry tile_bytes / producer_warps into this CTA's stage (in a
        # cluster: its own box and the peer's box of the same index, which multicast here too).
        return pipeline.PipelineTmaAsync.create(
            barrier_storage=barrier_ptr, num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(thread, self.producer_warps),
            consumer_group=pipeline.CooperativeGroup(thread, consumer_warps * self.cluster),
            tx_count=tx_bytes // self.producer_warps, cta_layout_vmnk=cta_layout, defer_sync=True)

    def prefetches_page(self) -> bool:
        """True: the caller may read a producer warp's page id of a tile early (``page_id``) and hand
        it to ``load_tile`` (every TMA path issues exactly one box per producer warp and tile)."""
        return True

    @cute.jit
    def box_token(self, blk: Int32, producer_tidx: Int32) -> Int32:
        """First token of the box producer warp ``producer_tidx // 32`` issues of tile ``blk`` (on the
        one-box path, warp 0: the CTA's one box)."""
        warp = Int32(0)
        if const_expr(self.warp_per_box):
            warp = cute.arch.make_warp_uniform(producer_tidx // 32)
        rank = Int32(0)
        if const_expr(self.cluster > 1):
            rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        return blk * TILE_TOKENS + (rank * self.boxes_per_cta + warp) * self.box_rows

    @cute.jit
    def page_id(self, mBlockTable: cute.Tensor, r: Int32, blk: Int32, seqlen: Int32, producer_tidx: Int32):
        """block_table entry of the box producer warp ``producer_tidx // 32`` issues for tile ``blk``
        of request ``r`` (warp-per-box path; on the one-box path, where warp 0 issues the CTA's one box,
        that box's). A box past the request's end (a tail tile, or a tile index past the last one:
        callers may ask before knowing it is needed) gets the last valid page, never an entry the
        request does not own; such rows are masked and zeroed downstream."""
        P = self.page_size
        return mBlockTable[r, cutlass.min(self.box_token(blk, producer_tidx) // P, (seqlen - 1) // P)]

    @cute.jit
    def head_page_ids(self, mBlockTable: cute.Tensor, r: Int32, blk: Int32, producer_tidx: Int32):
        """``(own, first)``: block_table entries of this warp's box of tile ``blk`` and of the tile's first
        token, read without the request's length (``pick_head_page`` chooses once it is known).

        A chunk's first tiles are loaded right after the plan row is read; ``page_id`` would first wait
        for ``cache_seqlens[r]`` (its clamp), a dependent global load between the plan and the TMA.
        These addresses need only the plan: both loads go out beside the length's. An index past
        block_table's width is not read (0 instead): such an entry is never used, since a loaded tile
        starts inside the request (its first token's entry is in the table) and a box past the end
        takes ``first``.
        Where a page holds the whole tile (``page_size >= 64``) both are the same entry, read once."""
        P = self.page_size
        width = cute.size(mBlockTable, mode=[1])
        idx = self.box_token(blk, producer_tidx) // P
        own = Int32(0)
        if idx < width:
            own = mBlockTable[r, idx]
        first = own
        if const_expr(P < TILE_TOKENS):
            idx0 = blk * TILE_TOKENS // P
            first = Int32(0)
            if idx0 < width:
                first = mBlockTable[r, idx0]
        return own, first

    @cute.jit
    def pick_head_page(self, own: Int32, first: Int32, blk: Int32, seqlen: Int32, producer_tidx: Int32) -> Int32:
        """The page to load this warp's box of tile ``blk`` (which has at least one token) from, given
        ``head_page_ids``: its own entry, or, for a box wholly past the request's end, the page of the
        tile's first token (a page the request owns; ``page_id`` gives the request's last page there:
        either way the box's rows are masked and zeroed downstream)."""
        page = own
        if const_expr(self.page_size < TILE_TOKENS):
            if self.box_token(blk, producer_tidx) >= seqlen:
                page = first
        return page

    @cute.jit
    def tma_views(self, tma_k: cute.CopyAtom, mK: cute.Tensor, sK: cute.Tensor):
        """``(tKsK, tKgK)``: the TMA partitions of the stages and of k_cache in boxes of this loader,
        indexed ``tKsK[None, box of the tile, (column block,) stage]`` and ``tKgK[None, box of the page,
        (column block,) kv_head, page]`` (column block only when built ``by_columns``)."""
        box = self.box_rows
        if const_expr(self.by_columns):
            # gK: (box, 64, boxes per page, column block, kv_head, page); sKb: (box, 64, boxes per
            # tile, column block, stage).
            gK = cute.local_tile(mK, (box, COL_BLOCK), (None, None, None, None))
            sKb = cute.make_tensor(sK.iterator, cute.composition(sK.layout, cute.make_layout(
                (box, COL_BLOCK, TILE_TOKENS // box, self.head_dim // COL_BLOCK, self.stages),
                stride=(1, TILE_TOKENS, box, TILE_TOKENS * COL_BLOCK, TILE_TOKENS * self.head_dim))))
        else:
            # gK: (box, dim, boxes per page, kv_head, page); sKb: (box, dim, boxes per tile, stage).
            gK = cute.local_tile(mK, (box, self.head_dim), (None, 0, None, None))
            # (The smem tensor's layout is the stage's outer layout, its iterator carries the swizzle.)
            sKb = cute.make_tensor(sK.iterator, cute.composition(sK.layout, cute.make_layout(
                (box, self.head_dim, TILE_TOKENS // box, self.stages),
                stride=(1, TILE_TOKENS, box, TILE_TOKENS * self.head_dim))))
        return cpasync.tma_partition(tma_k, 0, cute.make_layout(1), cute.group_modes(sKb, 0, 2),
                                     cute.group_modes(gK, 0, 2))

    @cute.jit
    def load_tile(self, tma_k: cute.CopyAtom, mK: cute.Tensor, sK: cute.Tensor, mBlockTable: cute.Tensor,
                  pipe, state, r: Int32, blk: Int32, seqlen: Int32, kv_head: Int32, producer_tidx: Int32,
                  page=None, cols=None):
        """Acquire the stage, then issue this CTA's boxes of tile ``blk`` of request ``r`` (warp-per-box
        path: this warp's box; one-box path: the CTA's one box). ``page``, if given, is the box's page
        id read earlier (``page_id``, or ``pick_head_page`` for a chunk's first tiles); else it is read
        here. ``cols`` (loader built ``by_columns``): the tile's 64-column blocks to load, one TMA copy
        each."""
        P = self.page_size
        rank = Int32(0)
        if const_expr(self.cluster > 1):
            rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        last_page = (seqlen - 1) // P  # the request's last valid page (the tile has >= 1 token)
        if const_expr(self.wide_groups is not None):
            if const_expr(page is None):
                page = self.box_pages(mBlockTable, r, blk, last_page, rank)[0]
            pipe.producer_acquire(state)
            bar = pipe.producer_get_barrier(state)
            self._copy_wide(tma_k, mK, sK, (blk * TILE_TOKENS % P) // self.box_rows, kv_head, page, state.index, bar,
                            cols)
        elif const_expr(self.warp_per_box):
            tKsK, tKgK = self.tma_views(tma_k, mK, sK)
            self._load_box_of_warp(tma_k, tKgK, tKsK, mBlockTable, pipe, state, r, blk, seqlen, kv_head, rank,
                                   producer_tidx, page, cols)
        else:
            tKsK, tKgK = self.tma_views(tma_k, mK, sK)
            self._load_boxes(tma_k, tKgK, tKsK, mBlockTable, pipe, state, r, blk, last_page, kv_head,
                             rank, cols, page)

    @cute.jit
    def prefetch_tile(self, tma_k: cute.CopyAtom, mK: cute.Tensor, sK: cute.Tensor, blk: Int32, kv_head: Int32,
                      page: Int32, producer_tidx: Int32):
        """L2 prefetch (``cp.async.bulk.prefetch.tensor.L2``, SASS ``UTMAPF``) of the box this producer
        warp loads of tile ``blk`` (every column), ``page`` its ``page_id`` read earlier: no shared memory
        and no barrier, so no stage need be free; the box's later ``load_tile`` then reads L2. Called by
        the warps that issue the tile's loads (one box per warp on every TMA path, see ``_load_boxes``)."""
        P = self.page_size
        in_page = (self.box_token(blk, producer_tidx) % P) // self.box_rows
        if const_expr(self.wide_groups is not None):
            for gi in cutlass.range_constexpr(len(self.wide_groups)):
                atom, _, tKgK = self._wide_views(tma_k, mK, sK, in_page, kv_head, page, 0, self.wide_groups[gi])
                cute.prefetch(atom, tKgK)
        else:
            tKsK, tKgK = self.tma_views(tma_k, mK, sK)
            if const_expr(self.by_columns):
                for c in cutlass.range_constexpr(self.head_dim // COL_BLOCK):
                    cute.prefetch(tma_k, tKgK[None, in_page, c, kv_head, page])
            else:
                cute.prefetch(tma_k, tKgK[None, in_page, kv_head, page])

    @cute.jit
    def _wide_views(self, tma_k, mK: cute.Tensor, sK: cute.Tensor, in_page, kv_head, page, stage, cols):
        """``(atom, tKsK, tKgK)`` of one wide copy: its TMA atom (of ``tma_k``, one per group) and the views of
        column blocks ``cols`` of row block ``in_page`` of ``page`` and of
        ``stage`` (``mK``: the wide atoms' TMA view, dim as (64 columns, column block))."""
        b0 = cols[0]
        n_blocks = len(cols)
        gK = cute.local_tile(cute.domain_offset((0, (0, b0), 0, 0), mK), (self.box_rows, (COL_BLOCK, n_blocks)),
                             (in_page, (0, 0), kv_head, page))
        sKg = cute.make_tensor(sK.iterator + cute.crd2idx((0, COL_BLOCK * b0, stage), sK.layout),
                               cute.composition(sK.layout, cute.make_layout(
                                   (self.box_rows, (COL_BLOCK, n_blocks)),
                                   stride=(1, (TILE_TOKENS, TILE_TOKENS * COL_BLOCK)))))
        atom = tma_k[self.wide_groups.index(tuple(cols))]
        tKsK, tKgK = cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(sKg, 0, 2),
                                           cute.group_modes(gK, 0, 2))
        return atom, tKsK, tKgK

    @cute.jit
    def _copy_wide(self, tma_k, mK, sK, in_page, kv_head, page, stage, bar, cols):
        """The one TMA copy of column group ``cols`` (None: the whole tile, the only group) of a box."""
        if const_expr(cols is None):
            cols = self.wide_groups[0]
        atom, tKsK, tKgK = self._wide_views(tma_k, mK, sK, in_page, kv_head, page, stage, cols)
        cute.copy(atom, tKgK, tKsK, tma_bar_ptr=bar, **self._policy())

    def _policy(self) -> dict:
        """A K copy's cache-policy keyword (``l2_hint``; none without a hint), built while tracing."""
        return {} if self.l2_hint is None else dict(cache_policy=_l2_policy(self.l2_hint))

    @cute.jit
    def _copy_box(self, tma_k, tKgK, tKsK, in_page, kv_head, page, box_idx, stage, bar, cols):
        """The TMA copies of one box (all 576 columns, or the column blocks ``cols``), multicast to the
        cluster when there is one; with the loader's ``l2_hint`` as their L2 cache policy."""
        hint = self._policy()
        if const_expr(self.by_columns):
            for c in cutlass.range_constexpr(len(cols)):
                if const_expr(self.cluster > 1):
                    cute.copy(tma_k, tKgK[None, in_page, cols[c], kv_head, page], tKsK[None, box_idx, cols[c], stage],
                              tma_bar_ptr=bar, mcast_mask=cutlass.Int16((1 << self.cluster) - 1), **hint)
                else:
                    cute.copy(tma_k, tKgK[None, in_page, cols[c], kv_head, page], tKsK[None, box_idx, cols[c], stage],
                              tma_bar_ptr=bar, **hint)
        else:
            if const_expr(self.cluster > 1):
                cute.copy(tma_k, tKgK[None, in_page, kv_head, page], tKsK[None, box_idx, stage],
                          tma_bar_ptr=bar, mcast_mask=cutlass.Int16((1 << self.cluster) - 1), **hint)
            else:
                cute.copy(tma_k, tKgK[None, in_page, kv_head, page], tKsK[None, box_idx, stage], tma_bar_ptr=bar,
                          **hint)

    @cute.jit
    def _load_box_of_warp(self, tma_k, tKgK, tKsK, mBlockTable, pipe, state, r, blk, seqlen, kv_head, rank,
                          producer_tidx, page, cols):
        """Warp w of the producers issues box w of this CTA's share: its 9 column copies, on the stage
        barrier after its own arrive.expect_tx of one box's share of the tile (``producer_acquire``:
        empty wait, then an elected arrive.expect_tx; see the class docstring for the ordering)."""
        P = self.page_size
        box = self.box_rows
        warp = cute.arch.make_warp_uniform(producer_tidx // 32)
        if const_expr(page is None):
            page = self.page_id(mBlockTable, r, blk, seqlen, producer_tidx)
        box_idx = rank * self.boxes_per_cta + warp  # box of the tile: its rows box_idx * box ...
        token = blk * TILE_TOKENS + box_idx * box
        in_page = (token % P) // box  # 0 for the pages of this path (box_rows == page_size)
        pipe.producer_acquire(state)
        bar = pipe.producer_get_barrier(state)
        self._copy_box(tma_k, tKgK, tKsK, in_page, kv_head, page, box_idx, state.index, bar, cols)

    @cute.jit
    def box_pages(self, mBlockTable: cute.Tensor, r: Int32, blk: Int32, last_page: Int32, rank: Int32):
        """block_table entries of this CTA's boxes of tile ``blk`` of request ``r`` (``rank``: its rank
        in the cluster), as one register tensor: independent loads that go out together. A box wholly
        past the end reloads the last valid page ``last_page`` (never a block_table entry the request
        does not own); its rows are masked and zeroed like any row past the end."""
        pages = cute.make_rmem_tensor(self.boxes_per_cta, Int32)
        for b in cutlass.range_constexpr(self.boxes_per_cta):
            token = blk * TILE_TOKENS + (rank * self.boxes_per_cta + b) * self.box_rows
            pages[b] = mBlockTable[r, cutlass.min(token // self.page_size, last_page)]
        return pages

    @cute.jit
    def _load_boxes(self, tma_k, tKgK, tKsK, mBlockTable, pipe, state, r, blk, last_page, kv_head,
                    rank, cols, page=None):
        """One warp issues this CTA's boxes of the tile: since warp_per_box, always exactly one box
        (pages 64 and 128, and page 32 in a 2-CTA cluster), the code as it was for those pages.
        ``page``: that box's page id, read by the caller (``page_id`` a tile early, or
        ``pick_head_page`` at a chunk's head)."""
        P = self.page_size
        box = self.box_rows
        if const_expr(page is None):
            # Page ids first: the block_table loads of all boxes go out together, before the wait for
            # the stage, instead of one dependent load ahead of each box's TMA.
            pages = self.box_pages(mBlockTable, r, blk, last_page, rank)
        else:
            assert self.boxes_per_cta == 1, "a caller's page id is one box's"
            pages = cute.make_rmem_tensor(1, Int32)
            pages[0] = page
        pipe.producer_acquire(state)
        bar = pipe.producer_get_barrier(state)
        for b in cutlass.range_constexpr(self.boxes_per_cta):
            box_idx = rank * self.boxes_per_cta + b  # box of the tile: its rows box_idx * box ...
            token = blk * TILE_TOKENS + box_idx * box
            in_page = (token % P) // box  # row block inside the page (128-token pages: 0 or 1)
            self._copy_box(tma_k, tKgK, tKsK, in_page, kv_head, pages[b], box_idx, state.index, bar, cols)


class GatherPagedKV(PagedKVLoader):
    """16-byte cp.async gather of each token row; issued by ``producer_warps`` warps (128 threads)."""

    producer_warps = 4
    threads_per_row = 8  # 8 x 16 B = one 128-byte swizzle row per warp quarter: full sectors, no bank conflicts

    def __init__(self, dtype, page_size: int, head_dim: int, stages: int, cluster: int = 1,
                 by_columns: bool = False):
        super().__init__(dtype, page_size, head_dim, stages, cluster, by_columns)
        if page_size not in GATHER_PAGE_SIZES:
            raise ValueError(f"gather loader serves page sizes {GATHER_PAGE_SIZES}, got {page_size}")
        if cluster != 1:
            raise ValueError("the cp.async gather loader does not multicast (cluster must be 1)")
        self.producer_threads = self.producer_warps * 32
        self.vec = 128 // dtype.width  # elements per 16-byte copy
        self.chunks_per_thread = head_dim // self.vec // self.threads_per_row  # 576 / 8 / 8 = 9
        self.rows_per_pass = self.producer_threads // self.threads_per_row  # 16
        self.passes = TILE_TOKENS // self.rows_per_pass  # 4
        if self.chunks_per_thread * self.vec * self.threads_per_row != head_dim:
            raise ValueError(f"head_dim {head_dim} is not a multiple of {self.vec * self.threads_per_row}")

    def make_tma(self, mK, sK_layout):
        return None, mK

    def make_pipeline(self, barrier_ptr, consumer_warps: int, tx_bytes=None):
        """Full barrier: one (cp.async-completion) arrive per producer thread; empty barrier: one
        arrive per consumer warp, like the TMA pipeline, so the consumers' code is the same.
        (``tx_bytes`` is not used: cp.async completion counts arrivals, not bytes.)"""
        thread = pipeline.Agent.Thread
        return pipeline.PipelineCpAsync.create(
            barrier_storage=barrier_ptr, num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(thread, self.producer_threads),
            consumer_group=pipeline.CooperativeGroup(thread, consumer_warps), defer_sync=True)

    @cute.jit
    def consumer_wait(self, pipe, state, spin: cutlass.Constexpr[bool] = False):
        PagedKVLoader.consumer_wait(self, pipe, state, spin)
        # cp.async writes smem through the generic proxy; wgmma reads it through the async proxy.
        # The mbarrier orders the copies before this thread; the proxy fence then orders them before
        # this thread's wgmma reads.
        cute.arch.fence_view_async_shared()

    @cute.jit
    def consumer_release(self, pipe, state):
        # PipelineCpAsync's release arrives once per calling thread; the empty barrier counts warps.
        if cute.arch.lane_idx() == 0:
            pipe.consumer_release(state)

    def prefetches_page(self) -> bool:
        return False  # every thread reads its rows' page ids in load_tile

    @cute.jit
    def load_tile(self, tma_k, mK: cute.Tensor, sK: cute.Tensor, mBlockTable: cute.Tensor, pipe, state,
                  r: Int32, blk: Int32, seqlen: Int32, kv_head: Int32, producer_tidx: Int32, page=None, cols=None):
        """Acquire the stage, then gather tile ``blk`` of request ``r``: thread t copies chunks
        ``t % 8 + 8 c`` (c < 9: chunk c of the thread lies in 64-column block c) of rows
        ``t // 8 + 16 p`` (p < 4), skipping rows past the end. ``cols``: only those column blocks."""
        if const_expr(cols is None):
            cols = tuple(range(self.chunks_per_thread))
        P = self.page_size
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), self.dtype,
                                   num_bits_per_copy=128)
        col = producer_tidx % self.threads_per_row
        row0 = producer_tidx // self.threads_per_row
        # Page ids of this thread's rows first (independent loads in flight together); a row past the
        # end looks up the last valid token's page (always a page the request owns) and is not copied.
        pages = cute.make_rmem_tensor(self.passes, Int32)
        for p in cutlass.range_constexpr(self.passes):
            token = blk * TILE_TOKENS + row0 + p * self.rows_per_pass
            pages[p] = mBlockTable[r, cutlass.min(token, seqlen - 1) // P]
        pipe.producer_acquire(state)
        for p in cutlass.range_constexpr(self.passes):
            row = row0 + p * self.rows_per_pass
            token = blk * TILE_TOKENS + row
            if token < seqlen:
                gRow = mK[token % P, None, kv_head, pages[p]]
                sRow = sK[row, None, state.index]
                for ci in cutlass.range_constexpr(len(cols)):
                    chunk = col + cols[ci] * self.threads_per_row
                    cute.copy(atom, cute.local_tile(gRow, (self.vec,), (chunk,)),
                              cute.local_tile(sRow, (self.vec,), (chunk,)))
        pipe.producer_commit(state)  # cp.async.mbarrier.arrive.noinc: arrives when this thread's copies land


L2_HINTS = ("evict_first", "evict_last", "evict_normal")
"""L2 eviction priorities a TMA loader can give its K boxes (``createpolicy.fractional``, fraction 1.0);
a kernel picks one with its class constant ``kv_l2_hint`` (2wg: evict_first, measured there)."""


@cute.jit
def _l2_policy(hint: cutlass.Constexpr[str]) -> cutlass.Int64:
    """A 64-bit L2 cache policy covering each whole access with eviction priority ``hint``
    (``createpolicy.fractional.L2::<hint>.b64``): the operand of a TMA load's ``.L2::cache_hint``."""
    if const_expr(hint not in L2_HINTS):
        raise ValueError(f"l2 hint must be one of {L2_HINTS}, got {hint!r}")
    return cutlass.Int64(llvm.inline_asm(cutlass.Int64.mlir_type, [],
                                         f"createpolicy.fractional.L2::{hint}.b64 $0, 1.0;", "=l",
                                         has_side_effects=False))


def make_loader(dtype, page_size: int, head_dim: int, stages: int, cluster: int = 1,
                by_columns: bool = False) -> PagedKVLoader:
    """The loader for ``page_size`` (TMA for >= 16, cp.async gather below); ``by_columns``: tiles are
    loaded in column groups (``load_tile(..., cols=...)``)."""
    cls = TmaPagedKV if uses_tma(page_size) else GatherPagedKV
    return cls(dtype, page_size, head_dim, stages, cluster, by_columns)
