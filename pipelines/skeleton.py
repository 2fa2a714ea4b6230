"""Kernel skeleton shared by the MLA decode pipeline variants.

What every variant shares lives here: static configuration, the shared-memory plan (Q resident for
the whole CTA, staged 64-token K tiles whose first 512 columns double as V, a P tile and per-row
exchange slots), the Q TMA descriptor (by row block and request), the paged-KV loader for the page
size (``pipelines.paged_kv``: TMA boxes for pages >= 16, cp.async row gather below, a multicast
cluster of the m-block CTAs where ``paged_kv.cluster_size`` says so), the walk over the split plan
(one CTA = one m-block x one part of the plan), and the epilogue that writes either the final
output or a split partial.

A variant subclass supplies the warpgroup roles (``warpgroup_roles``) and its thread count; the
skeleton dispatches to them once per request chunk. See docs/interfaces.md for the plan layout.
"""
from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup

from cutlass._mlir.dialects import llvm

from pipelines import layouts, paged_kv, softmax
from split_k import grid_sync, last_chunk, merge_kernel
from split_k.planner import BEGIN_REQ, BEGIN_SPLIT, END_REQ, GRID_COUNT_COLUMN
from split_k.planner import split_groups as split_groups_expr

SPLIT_CLUSTERS = (1, 2, 4, 8)
"""Split-cluster sizes a kernel can be built for (1: none)."""
SCRATCH_ROW = 520
"""Row stride (fp32 elements) of the split-cluster scratch, a CTA's 64 x 512 partial in its K stages:
512 + 8, so the 8 rows a warp's accumulator stores touch at once start 8 banks apart."""

HEAD_DIM = 576  # 512 latent ("nope") dims + 64 RoPE dims
HEAD_DIM_V = 512
BLOCK_M = 64  # query rows per CTA (one wgmma M)
BLOCK_N = 64  # KV tokens per tile


class MLADecodeBase:
    """Static configuration and host-side setup; ``kernel`` walks the split plan."""

    num_threads = 256
    kv_stages = 2
    # K pipelines per stage ring: 1, or 2 for a variant that fills each stage in two column groups with
    # a barrier pair each (``paged_kv`` loader ``by_columns``; variant_seesaw).
    kv_groups = 1
    # Lazy rescaling of O (softmax.LAZY_RESCALE_LOG2). A class constant, not a setting: the kernel
    # cache keys on the sources. (An A/B sets it False on the class with the disk cache off.)
    lazy_rescale = True
    # The 64-row kernels' softmax (``softmax.online_softmax_step``): the thread's row max as a pairwise tree
    # (depth 5) instead of one 17-deep chain of FMNMX, on WG0's path between its QK and its P.V; the same
    # value (max is exact). Measured on an H200 (paired A/B, docs/perf-notes.md, twentieth session): 0.98-1.00.
    # A class constant like lazy_rescale (an A/B sets it False on a subclass).
    softmax_tree = True
    # A chunk's steps in two loops, the steady ones first compiled without the per-tile checks (``steady_end``);
    # a variant that has the split defines ``steady_stop`` and sets this (class constant; see the variants).
    steady_loop = False
    # The steady loop runs only where it covers at least this many steps (pairs in the seesaw, tiles in 2wg);
    # a shorter run of steady steps goes to the second loop with the rest. Why it may pay: a CTA runs one or
    # two chunks, so each loop body's code is fetched cold about once; with two bodies a short chunk pays the
    # instruction misses twice for a few steps without the per-tile checks. The H100 grids of the
    # thirty-seventh session (docs/perf-notes.md) have the seesaw's time over 2wg's 3-10% higher with the steady
    # loop on than without at 1024-4096 keys with batches 1-32 (chunks of a few pairs), 7-12% lower on long chunks.
    # 1: every steady run; the seesaw sets 2 (measured there, thirty-eighth session).
    steady_min_steps = 1
    # 16-byte stores of O into 16-bit destinations (store_rows_16). A class constant like lazy_rescale
    # (False: one store per fragment pair, the form before; kept for the A/B).
    vector_stores = True
    # Multicast clusters: each thread arrives on the exit's cluster barrier right after its last
    # operation on the peer CTA (its last K release), before the epilogue, and only waits at exit
    # (``arrives_early``). Why: barrier.cluster.arrive has release semantics, so at the kernel's end it
    # waited for the thread's output stores to complete (ncu: "membar" stalls only with the cluster;
    # measured in docs/perf-notes.md). A variant opts in by setting it and arriving in its roles. A
    # class constant like lazy_rescale (the A/B sets it False).
    early_cluster_arrive = False
    # Clusters: each thread arrives on the start's cluster barrier right after the barrier inits, and
    # waits on it in its roles (``cluster_start_wait``) once the plan row's loads are out, instead of
    # before them: the plan's global round trip overlaps the peers' start (their launch skew and their
    # own inits). The wait still precedes every operation on a peer (a multicast box, a remote
    # release, a read of a peer's shared memory in a split cluster's epilogue). A variant opts in by
    # setting it and calling ``cluster_start_wait`` in its roles; a class constant like
    # early_cluster_arrive (an A/B sets it False).
    late_cluster_start_wait = False
    # L2 eviction priority of the K tile loads (TMA pages; ``paged_kv.L2_HINTS``, None: the default
    # policy). A class constant like lazy_rescale (an A/B sets it on a subclass).
    kv_l2_hint = None
    # Each column group of a K tile (``kv_col_groups``) loaded by one 4-D TMA copy instead of one copy per
    # 64-column block, where the loader can (``paged_kv.TmaPagedKV.set_wide_groups``: pages 64 and 128 without
    # a cluster). On in the seesaw (measured there); off in 2wg, where it can apply only without a multicast
    # cluster: 0.998-1.000 at 64 rows, and without the cluster at 128 and 256 rows within 0.5% of the
    # cluster's form (H100, paired, docs/perf-notes.md, thirty-fourth session). A class constant (an A/B sets
    # it).
    kv_wide_boxes = False
    # The K stage waits in front of a QK poll the full barrier (``paged_kv.PagedKVLoader.consumer_wait``'s
    # ``spin``) instead of ``try_wait``, whose SASS sleeps between checks (``NANOSLEEP.SYNCS``) and may wake
    # after the stage landed. Only the QK's waits: in the seesaw, with its P.V waits polling too, the gain
    # fell from 2.5-3.7% to 0.4-0.8% (a polling warp takes issue slots from the other warpgroup). 2wg and
    # seesaw read it; off in both: in 2wg within +-0.7% on four 128- and 256-row rows (thirty-first session),
    # in the seesaw's max-first order 1-4% slower (thirty-second session; paired on an H100,
    # docs/perf-notes.md). A class constant (an A/B sets it).
    k_wait_spin = False
    # Programmatic dependent launch of this kernel (``dependent_launch``): the grid may be scheduled
    # while the kernel before it in the stream (the previous decode's merge, the split planner)
    # finishes, and waits in griddepcontrol.wait, before its first global access, for that kernel to
    # complete. Back-to-back decodes then overlap the launch and the prologue (barrier init, descriptor
    # prefetch) with the previous call's tail. A class constant like lazy_rescale (an A/B sets it False).
    dependent_launch = True
    # In-grid split-kv merge (``grid_merge``): with a cooperative launch, the CTAs wait for each other
    # on a grid barrier once their partials are stored and merge the split requests themselves, so the
    # call launches no merge kernel. A variant opts in where its 256 threads are the merge's 8 warps and
    # it keeps every register after its roles (no setmaxnreg); ``DecodeEntry`` then sets ``merger`` (the
    # ``split_k.merge_kernel.SplitMerge`` whose ``merge_slot`` the CTAs run). A class constant.
    in_grid_merge = False
    merger = None
    # The split-kv merge by each request's last chunk (``split_k.last_chunk``): the CTA that stores a split
    # request's last partial merges that request's rows of its m-block (``merge_by_last_chunk``, called by the
    # variant's ``warpgroup_roles`` with the ``merge_tail`` the kernel hands it), so the call launches no merge
    # kernel. Only where ``can_merge_chunks()`` (one kv head, at most 12 m-blocks, 16-bit partials, no split
    # cluster) and the launch's gate passes (``DecodeEntry``: at most ``last_chunk.MAX_PARTS`` parts, ``MAX_EST``
    # chunks per request). A class constant (a variant opts in; an A/B sets it).
    chunk_merge = False
    # Named barrier of the threads that stored a chunk's outputs, for ``merge_by_last_chunk`` (a variant that
    # opts into ``chunk_merge`` sets an id its roles do not use, and ``merge_threads``).
    merge_barrier_id = 0
    merge_threads = 256
    # Whether a call launches the split-kv merge kernel after this one where it does not merge in its grid. Only
    # an A/B sets it False (``scripts/entry_ab.py`` modes ``*-no-merge``), to time what that launch costs on a
    # plan that splits no request; with a split request the output would lack its merge (entry_ab refuses a
    # mode whose output differs from the baseline's). A class constant.
    merge_launch = True
    # Rows of Q's shared-memory tile and TMA box: one wgmma M. A variant that serves fewer query rows
    # per CTA (the narrow 2wg kernel, 16 or 32) loads and keeps only those, which frees shared memory.
    q_tile_rows = BLOCK_M
    # Bytes of shared memory a variant's epilogue stages its output through (``storage.scratch``,
    # 16-byte aligned); 0: none.
    epilogue_scratch_bytes = 0

    def __init__(self, dtype, num_heads: int, seqlen_q: int, page_size: int, causal: bool, num_heads_k: int = 1,
                 multicast: bool = True, split_cluster: int = 1):
        if num_heads_k < 1 or num_heads % num_heads_k:
            raise ValueError(f"num_heads ({num_heads}) must be a positive multiple of num_heads_k ({num_heads_k})")
        self.dtype = dtype
        self.h_q = num_heads
        self.h_kv = num_heads_k
        self.heads_per_kv = num_heads // num_heads_k  # query heads sharing one kv head
        self.s_q = seqlen_q
        # M dimension of one CTA's problem: the query rows of one kv head, row = s_idx * heads_per_kv + j
        # (query head = kv_head * heads_per_kv + j).
        self.rows = self.heads_per_kv * seqlen_q
        self.num_m_blocks = (self.rows + BLOCK_M - 1) // BLOCK_M
        self.page_size = page_size
        self.causal = causal and seqlen_q > 1  # causal only changes anything for s_q > 1
        paged_kv.check_page_size(page_size)
        if split_cluster not in SPLIT_CLUSTERS:
            raise ValueError(f"split_cluster must be one of {SPLIT_CLUSTERS}, got {split_cluster!r}")
        # CTAs per cluster along grid y that share each chunk of the plan and reduce their partial
        # outputs through distributed shared memory (``cluster_epilogue``); 1: one CTA per chunk.
        self.split_cluster = split_cluster
        # The steady loop only without a split cluster (an opt-in, ``MLA_SPLIT_CLUSTER``): with one the seesaw's
        # split-8 kernel spilled 2 registers (compile_check, thirty-seventh session), and no grid has timed it there.
        self.steady_loop = self.steady_loop and split_cluster == 1
        if self.steady_min_steps < 1:
            raise ValueError(f"steady_min_steps must be at least 1, got {self.steady_min_steps!r}")
        # CTAs per cluster along grid x (m-blocks of one plan part share every K tile): 1 or 2. Not
        # with a split cluster: the reduction reuses the K stages, which a peer's multicast of the
        # next chunk's tiles could already be filling.
        self.cluster = paged_kv.cluster_size(page_size, self.num_m_blocks, multicast and split_cluster == 1)
        self.loader = paged_kv.make_loader(dtype, page_size, HEAD_DIM, self.kv_stages, self.cluster,
                                           by_columns=self.kv_groups > 1)
        if self.kv_l2_hint is not None and paged_kv.uses_tma(page_size):
            self.loader.l2_hint = self.kv_l2_hint
        if self.kv_wide_boxes and paged_kv.uses_tma(page_size):
            self.loader.set_wide_groups(self.kv_col_groups())

    # ------------------------------------------------------------------ host
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mBlockTable: cute.Tensor, mSeqlens: cute.Tensor,
                 mMeta: cute.Tensor, mNumSplits: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 mOaccum: cute.Tensor, mLSEaccum: cute.Tensor, softmax_scale: Float32,
                 grid_merge: Int32, merge_y: Int32, chunk_merge: Int32, stream: cuda.CUstream):
        """Inputs (torch tensors as the API holds them, last dim contiguous):
        mQ [b, s_q, h_q, 576] when h_kv == 1, else the grouped copy [b, h_kv, rows, 576];
        mK [num_pages, page_size, h_kv, 576]; mBlockTable [b, max_pages] i32; mSeqlens [b] i32;
        mMeta [num_parts, 8] i32; mNumSplits [b + 1] i32; mO [b, s_q, h_q, 512]; mLSE [b, h_q, s_q] f32;
        mOaccum [splits, s_q * h_q, 512] f32 and mLSEaccum [splits, s_q * h_q] f32 (workspace rows in
        out's row order, s_idx * h_q + head, whatever h_kv).
        ``grid_merge`` != 0 (only where ``can_merge_in_grid()``): launch cooperatively and merge the split
        requests in this grid (``grid_merge``): ``merge_y`` is the merge's grid extent ``Y``.
        ``chunk_merge`` != 0 (only where ``can_merge_chunks()``): the CTA that stores a split request's last
        partial merges it (``merge_by_last_chunk``).
        """
        dtype = self.dtype
        # The merge reads these tensors as the merge kernel does (out as [b, rows, 512], the others as
        # given), not as the kernel views below.
        mMergeO = self.merger.out_rows(mO) if const_expr(self.can_merge_in_grid() or self.can_merge_chunks()) else mO
        mMergeLSE, mMergeOaccum, mMergeLSEaccum = mLSE, mOaccum, mLSEaccum
        # Kernel views: the contiguous dim where wgmma/TMA want it, the kv head as its own mode.
        mQ = cute.make_tensor(mQ.iterator, cute.make_layout(
            (self.rows, HEAD_DIM, self.h_kv, mQ.shape[0]), stride=(mQ.stride[2], 1, mQ.stride[1], mQ.stride[0])))
        mK = cute.make_tensor(mK.iterator, cute.make_layout(
            (self.page_size, HEAD_DIM, self.h_kv, mK.shape[0]),
            stride=(mK.stride[1], 1, mK.stride[2], mK.stride[0])))
        mO = cute.make_tensor(mO.iterator, cute.make_layout(
            (self._row_mode(), HEAD_DIM_V, self.h_kv, mO.shape[0]),
            stride=(self._row_stride(mO.stride[2], mO.stride[1]), 1, self.heads_per_kv * mO.stride[2],
                    mO.stride[0])))
        mLSE = cute.make_tensor(mLSE.iterator, cute.make_layout(
            ((self.heads_per_kv, self.s_q), self.h_kv, mLSE.shape[0]),
            stride=((mLSE.stride[1], mLSE.stride[2]), self.heads_per_kv * mLSE.stride[1], mLSE.stride[0])))
        mOaccum = cute.make_tensor(mOaccum.iterator, cute.make_layout(
            (self._row_mode(), HEAD_DIM_V, self.h_kv, mOaccum.shape[0]),
            stride=(self._row_stride(mOaccum.stride[1], self.h_q * mOaccum.stride[1]), 1,
                    self.heads_per_kv * mOaccum.stride[1], mOaccum.stride[0])))
        mLSEaccum = cute.make_tensor(mLSEaccum.iterator, cute.make_layout(
            (self._row_mode(), self.h_kv, mLSEaccum.shape[0]),
            stride=(self._row_stride(mLSEaccum.stride[1], self.h_q * mLSEaccum.stride[1]),
                    self.heads_per_kv * mLSEaccum.stride[1], mLSEaccum.stride[0])))

        self.sQ_layout = layouts.smem_tile_layout(dtype, self.q_tile_rows, HEAD_DIM)
        self.sK_layout = layouts.smem_tile_layout(dtype, BLOCK_N, HEAD_DIM, self.kv_stages)
        self.sP_layout = self.p_tile_layout(dtype)

        tma_q, mQ_tma = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), mQ, self.sQ_layout, (self.q_tile_rows, HEAD_DIM))
        # TMA loader: (atom, TMA view of K); cp.async gather loader: (None, mK).
        tma_k, mK_load = self.loader.make_tma(mK, self.sK_layout)
        self.q_bytes = cute.size_in_bytes(dtype, self.sQ_layout)

        sQ_layout, sK_layout, sP_layout = self.sQ_layout, self.sK_layout, self.sP_layout
        SharedStorage = self.shared_storage_struct(dtype, sQ_layout, sK_layout, sP_layout)
        tiles = [cute.cosize(layout) * dtype.width // 8 for layout in (sQ_layout, sK_layout, sP_layout)]
        assert all(size % 1024 == 0 for size in tiles[:2]), tiles  # back to back (``merge_buffer_bytes``)
        self._merge_buffer_bytes = sum(tiles)
        if const_expr(self.can_merge_chunks()):  # one 16-bit partial row of every chunk fits (``merge_rows``)
            assert self._merge_buffer_bytes >= last_chunk.MAX_PARTS * (HEAD_DIM_V * 2 + 4), tiles

        self.shared_storage = SharedStorage
        scale_log2 = softmax_scale * Float32(math.log2(math.e))
        # One CTA per plan part, or with a split cluster ``split_cluster`` CTAs per group, the plan's
        # first ``split_groups`` rows (split_k.planner.split_groups, the same integer arithmetic).
        parts = mMeta.shape[0]
        if const_expr(self.split_cluster > 1):
            parts = split_groups_expr(mMeta.shape[0], self.split_cluster) * self.split_cluster
        self.kernel(tma_q, mQ_tma, tma_k, mK_load, mBlockTable, mSeqlens, mMeta, mNumSplits, mO, mLSE,
                    mOaccum, mLSEaccum, scale_log2, sQ_layout, sK_layout, sP_layout, grid_merge, merge_y, chunk_merge,
                    mMergeO, mMergeLSE, mMergeOaccum, mMergeLSEaccum).launch(
            grid=[self.num_m_blocks, parts, self.h_kv],
            block=[self.num_threads, 1, 1],
            # The m-block CTAs of one plan part (same chunks, same K tiles) form a cluster along x;
            # the CTAs of one split group form a cluster along y.
            cluster=self.cluster_shape(),
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=1,
            use_pdl=self.dependent_launch,
            # The grid barrier needs every CTA resident at once: a cooperative launch makes the driver
            # refuse a grid that cannot be (an error, never a hang).
            cooperative=(grid_merge != 0) if const_expr(self.can_merge_in_grid()) else False,
        )

    def shared_storage_struct(self, dtype, sQ_layout, sK_layout, sP_layout):
        """The kernel's shared-memory struct. A plain method, not traced: the DSL rewrites an ``if``
        inside a jit function into a nested function, where a class body's field would be lost."""
        mem, align = cute.struct.MemRange, cute.struct.Align
        # (Built as a dict: this module's annotations are strings, ``from __future__ import annotations``.)
        fields = {
            "mbar_q": mem[cutlass.Int64, 2],
            "mbar_k": mem[cutlass.Int64, 2 * self.kv_stages * self.kv_groups],
            "row_scale": mem[Float32, BLOCK_M],  # per-tile rescale factor (WG0 -> WG1)
            "row_inv": mem[Float32, BLOCK_M],  # 1 / row sum at the end of a chunk
            "lse_slots": mem[Float32, BLOCK_M],  # split cluster: this CTA's partial's lse
            "row_max_x": mem[Float32, 2 * BLOCK_M],  # seesaw: the two tiles' row maxima
            "row_sum_x": mem[Float32, BLOCK_M],  # seesaw: WG1's row sums at a chunk's end
            "sQ": align[mem[dtype, cute.cosize(sQ_layout)], 1024],
            "sK": align[mem[dtype, cute.cosize(sK_layout)], 1024],
            "sP": align[mem[dtype, cute.cosize(sP_layout)], 1024],
        }
        if self.can_merge_in_grid():  # the in-grid merge's shared memory lives in P's tile
            assert merge_kernel.SMEM_BYTES <= cute.cosize(sP_layout) * dtype.width // 8, "sP too small for the merge"
        if self.epilogue_scratch_bytes:  # the variant's epilogue staging (16-byte aligned)
            fields["scratch"] = align[mem[cutlass.Uint8, self.epilogue_scratch_bytes], 16]
        fields.update(self.extra_shared_fields())
        return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))

    def extra_shared_fields(self) -> dict:
        """A variant's own shared-memory fields (name: ``cute.struct`` member type), after the others."""
        return {}

    def cluster_shape(self):
        if const_expr(self.split_cluster > 1):
            return [1, self.split_cluster, 1]
        if const_expr(self.cluster > 1):
            return [self.cluster, 1, 1]
        return None

    def kv_col_groups(self) -> tuple:
        """The column groups of 64-column blocks this kernel loads a K tile in (the ``cols`` of its
        ``load_tile`` calls): the whole tile with ``kv_groups`` 1; variants with column groups override it."""
        return (tuple(range(HEAD_DIM // paged_kv.COL_BLOCK)),)

    def any_cluster(self) -> bool:
        return self.cluster > 1 or self.split_cluster > 1

    def can_merge_in_grid(self) -> bool:
        """Whether this kernel can merge in its grid (``in_grid_merge``, a merger set, 256 threads, no
        split cluster: a split cluster merges in its own epilogue)."""
        return self.in_grid_merge and self.merger is not None and self.num_threads == 256 and self.split_cluster == 1

    @cute.jit
    def cluster_start_wait(self):
        """The start's cluster barrier wait, where ``late_cluster_start_wait`` put it in the roles: every
        thread, after reading its work list and before any operation on a peer CTA. No-op otherwise."""
        if const_expr(self.any_cluster() and self.late_cluster_start_wait):
            cute.arch.cluster_wait()

    def arrives_early(self) -> bool:
        """Whether the roles arrive on the exit's cluster barrier themselves (``early_cluster_arrive``):
        only in a multicast cluster (a split cluster exchanges partials in its epilogue)."""
        return self.early_cluster_arrive and self.cluster > 1 and self.split_cluster == 1

    def _row_mode(self):
        """Shape of the row mode of an output-side view (out, o_accum, lse_accum).

        A CTA's row ``s_idx * heads_per_kv + j`` is query head ``kv_head * heads_per_kv + j`` of token
        ``s_idx``. With one kv head that is row ``s_idx * h_q + j`` of the merged ``[s_q * h_q]`` rows,
        a single strided mode (the API checks the rows merge); with several, the rows of one kv head
        are a (j, s_idx) sub-grid, and indexing the hierarchical mode with the flat row does the split.
        """
        if const_expr(self.h_kv == 1):
            return self.rows
        return (self.heads_per_kv, self.s_q)

    def _row_stride(self, head_stride, token_stride):
        if const_expr(self.h_kv == 1):
            return head_stride
        return (head_stride, token_stride)

    # ---------------------------------------------------------------- device
    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, mQ: cute.Tensor, tma_k, mK: cute.Tensor,
               mBlockTable: cute.Tensor, mSeqlens: cute.Tensor, mMeta: cute.Tensor, mNumSplits: cute.Tensor,
               mO: cute.Tensor, mLSE: cute.Tensor, mOaccum: cute.Tensor, mLSEaccum: cute.Tensor,
               scale_log2: Float32, sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout,
               sP_layout: cute.ComposedLayout, grid_merge: Int32, merge_y: Int32, chunk_merge: Int32,
               mMergeO: cute.Tensor, mMergeLSE: cute.Tensor, mMergeOaccum: cute.Tensor, mMergeLSEaccum: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        m_block, part, kv_head = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            cpasync.prefetch_descriptor(tma_q)
            if const_expr(isinstance(tma_k, tuple)):  # the loader's wide atoms (one per column group)
                for atom in tma_k:
                    cpasync.prefetch_descriptor(atom)
            elif const_expr(tma_k is not None):
                cpasync.prefetch_descriptor(tma_k)

        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        # Layouts come in as kernel arguments: IR values built on the host side cannot be captured.
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sP = storage.sP.get_tensor(sP_layout.outer, swizzle=sP_layout.inner)

        pipe_q, pipe_k = self.make_pipelines(storage)
        # Barrier inits must be visible to every thread before anyone waits on them, and in a cluster
        # to the peer CTAs too before their multicast boxes or remote releases reach this CTA.
        cute.arch.mbarrier_init_fence()
        # (A split cluster's peers read this CTA's shared memory, which needs it running.) With
        # ``late_cluster_start_wait`` the wait is in the roles; the CTA barrier here is defensive (every
        # thread also waits on the cluster barrier before touching an mbarrier, which orders the inits
        # for it) and keeps the inits visible to this CTA's threads whatever a variant's roles do first.
        if const_expr(self.any_cluster()):
            cute.arch.cluster_arrive_relaxed()
            if const_expr(self.late_cluster_start_wait):
                cute.arch.sync_threads()
            else:
                cute.arch.cluster_wait()
        else:
            cute.arch.sync_threads()
        # Launched with programmatic dependent launch: everything above touched only this CTA's
        # shared memory and the kernel parameters; every global read or write (plan, lengths, page
        # ids, Q, K, outputs, the workspace the previous call's merge may still be reading) comes
        # after the previous kernel in the stream has completed. A no-op for a plain launch.
        if const_expr(self.dependent_launch):
            cute.arch.griddepcontrol_wait()
        # Let the split-kv merge grid (launched with programmatic dependent launch) be scheduled now:
        # its CTAs read the plan and wait in griddepcontrol.wait for this grid to finish, so the
        # merge's launch latency hides behind this kernel. Only after the wait above: the merge
        # reads the plan before its own wait, so the plan's writer (the planner kernel) must have
        # completed. No-op when nothing depends on this grid.
        cute.arch.griddepcontrol_launch_dependents()

        # The roles read this CTA's work list themselves (``work_list``): a variant that resizes its
        # warpgroups' registers (setmaxnreg) reads it after doing so.
        # What the roles need for the merge by a request's last chunk (``merge_by_last_chunk``): run by the
        # threads that stored the outputs, in their branch of ``warpgroup_roles`` after their roles (a warpgroup
        # that lowered its registers with setmaxnreg must not reach the merge's code).
        merge_tail = None
        if const_expr(self.can_merge_chunks()):
            merge_tail = (chunk_merge, part, mMeta, mNumSplits, mMergeO, mMergeLSE, mMergeOaccum, mMergeLSEaccum)
        self.warpgroup_roles(tidx, m_block, kv_head, mMeta,
                             tma_q, mQ, tma_k, mK, mBlockTable, mSeqlens, mNumSplits, mO, mLSE, mOaccum,
                             mLSEaccum, sQ, sK, sP, storage, pipe_q, pipe_k, scale_log2, merge_tail)
        if const_expr(self.any_cluster()):
            # No CTA leaves while a peer may still arrive on its empty barriers (the peers' last
            # releases): every thread of both CTAs is past its last pipeline operation when it
            # arrives (here, or with ``arrives_early`` where its roles said so; the arrive's release
            # semantics order that operation before it). (Multicast boxes into this CTA all landed:
            # its consumers waited for every tile.)
            if const_expr(not self.arrives_early()):
                cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
        if const_expr(self.can_merge_in_grid()):
            if grid_merge != 0:
                self.merge_in_grid(tidx, m_block, part, kv_head, mMeta, mNumSplits, storage, merge_y, mMergeO,
                                   mMergeLSE, mMergeOaccum, mMergeLSEaccum)

    @cute.jit
    def merge_in_grid(self, tidx: Int32, m_block: Int32, part: Int32, kv_head: Int32, mMeta: cute.Tensor,
                      mNumSplits: cute.Tensor, storage, merge_y: Int32, mMergeO: cute.Tensor, mMergeLSE: cute.Tensor,
                      mMergeOaccum: cute.Tensor, mMergeLSEaccum: cute.Tensor):
        """The split-kv merge in this grid (``in_grid_merge``), after the CTA's roles stored its outputs.

        Grid cell ``(part, y)`` of the merge kernel's ``[num_parts, Y]`` grid (``SplitMerge.merge_slot``)
        goes to the CTAs of plan part ``part``: CTA ``m_block + kv_head * num_m_blocks`` takes every
        ``y`` from it in steps of ``num_m_blocks * h_kv``. Every CTA counts itself on the grid barrier
        (``split_k.grid_sync``: the plan's reserved word ``[0, GRID_COUNT_COLUMN]``); only a CTA with
        merge work (its part begins a continuation chunk and it has a ``y``) waits for the others, and
        the CTA's threads then merge. P's tile, unused from here on (the last wgmma that read it was
        waited for), holds the merge's shared memory (``merge_kernel.smem_views``, 4160 of its 8192 bytes).
        """
        nx, ny, nz = cute.arch.grid_dim()
        first_y = kv_head * self.num_m_blocks + m_block
        begin_split = mMeta[part, BEGIN_SPLIT]
        r = mMeta[part, BEGIN_REQ]
        works = Int32(0)
        if begin_split >= 1:
            if first_y < merge_y:
                works = Int32(1)
        # Every thread's stores of this CTA (out, lse, partials) come before thread 0's arrival, whose
        # release covers them (the CTA barrier orders them before it; the release is cumulative).
        cute.arch.sync_threads()
        count_addr = (mMeta.iterator + GRID_COUNT_COLUMN).toint()
        if tidx == 0:
            leader = (m_block == 0) & (part == 0) & (kv_head == 0)
            before = grid_sync.arrive(count_addr, nx * ny * nz, leader)
            if works != 0:
                grid_sync.wait(count_addr, before)
        if works != 0:
            cute.arch.sync_threads()  # thread 0's acquire, then every thread's reads of the partials
            warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            sAcc, sM, sS = merge_kernel.smem_views(cute.recast_ptr(storage.sP.data_ptr(), dtype=Float32))
            for y in cutlass.range(first_y, merge_y, nx * nz, unroll=1):
                self.merger.merge_slot(r, begin_split, y, merge_y, warp, tidx % 32, sAcc, sM, sS, mMergeOaccum,
                                       mMergeLSEaccum, mNumSplits, mMergeO, mMergeLSE, self.merger.max_loads, False)

    def can_merge_chunks(self) -> bool:
        """Whether this kernel merges split requests by their last chunk (``chunk_merge``, a merger set, no
        split cluster, ``split_k.last_chunk.fits``)."""
        return (self.chunk_merge and self.merger is not None and self.split_cluster == 1
                and last_chunk.fits(self.num_m_blocks, self.h_kv, self.merger.partial_dtype.width))

    @cute.jit
    def merge_by_last_chunk(self, merge_tail, mtidx: Int32, m_block: Int32, storage):
        """The merge by a request's last chunk (``split_k.last_chunk``), called by the ``merge_threads`` threads
        that stored this CTA's outputs (``mtidx``: this thread's index among them), after their last store.
        The part's split chunks are its first request's (chunk ``begin_split``) and, when it holds more than
        one request, its last request's chunk 0. One thread counts each in (after a barrier of the storing
        threads: the count's release covers every partial they stored); where it was the last of its
        request, the threads merge that request's rows of this m-block. No-op without ``merge_tail`` or with
        its flag 0."""
        if const_expr(merge_tail is not None):
            flag, part, mMeta, mNumSplits, mO, mLSE, mOaccum, mLSEaccum = merge_tail
            if flag != 0:
                begin_req = mMeta[part, BEGIN_REQ]
                end_req = mMeta[part, END_REQ]
                begin_split = mMeta[part, BEGIN_SPLIT]
                s_last = self.chunk_verdicts(storage)
                self.merge_barrier()
                if mtidx == 0:
                    first_last = Int32(0)
                    end_last = Int32(0)
                    if end_req >= begin_req:
                        n = mNumSplits[begin_req + 1] - mNumSplits[begin_req]
                        if n > 1:
                            if end_req > begin_req:  # counted right after its chunk (``count_first_chunk``)
                                first_last = s_last[0]
                            else:
                                first_last = last_chunk.arrive(mMeta, part, begin_split, m_block, n)
                    if end_req > begin_req:
                        n = mNumSplits[end_req + 1] - mNumSplits[end_req]
                        if n > 1:
                            end_last = last_chunk.arrive(mMeta, part, Int32(0), m_block, n)
                    s_last[0] = first_last
                    s_last[1] = end_last
                # Thread 0's acquire, then every thread's reads of the other chunks' partials.
                self.merge_barrier()
                # Q's tile, the K stages and P's tile, one run of shared memory (``merge_buffer_bytes``), free now:
                # every load into them was waited for, every read of them done.
                buf = storage.sQ.data_ptr()
                if s_last[0] != 0:
                    self.merger.merge_rows(begin_req, m_block * BLOCK_M, mtidx, self.merge_threads,
                                           self.merge_barrier_id, buf, self.merge_buffer_bytes(), mOaccum, mLSEaccum,
                                           mNumSplits, mO, mLSE)
                if s_last[1] != 0:
                    self.merger.merge_rows(end_req, m_block * BLOCK_M, mtidx, self.merge_threads,
                                           self.merge_barrier_id, buf, self.merge_buffer_bytes(), mOaccum, mLSEaccum,
                                           mNumSplits, mO, mLSE)

    @cute.jit
    def count_first_chunk(self, merge_tail, mtidx: Int32, m_block: Int32, r: Int32, begin_req: Int32, end_req: Int32,
                          begin_split: Int32, storage):
        """The count of the part's first chunk (request ``r == begin_req``, chunk ``begin_split``) where it is split
        and more requests follow in the part, right after its outputs were stored: called by the same threads as
        ``merge_by_last_chunk``, which then finds the verdict in shared memory. Why not at the end like the
        last chunk: a request's other chunk (the end of the previous part) is then usually the last, so one CTA
        seldom merges two requests at its end (measured with both counted at the end: docs/perf-notes.md,
        forty-fifth session). The merge itself waits for the end (the stages are in use until then)."""
        if const_expr(merge_tail is not None):
            flag, part, mMeta, mNumSplits = merge_tail[0], merge_tail[1], merge_tail[2], merge_tail[3]
            if flag != 0:
                if end_req > begin_req:
                    n = mNumSplits[r + 1] - mNumSplits[r]
                    if n > 1:
                        s_last = self.chunk_verdicts(storage)
                        # (This phase of the barrier is complete before anyone reaches the merge's syncs on it:
                        # a count here means a later request follows in the part, and its epilogue (the seesaw's
                        # ``finish_chunk``, barrier INV) makes the arriving warpgroup wait for the counting one,
                        # which arrives there only after this sync.)
                        # Only thread 0 reads past this barrier (its count's release covers every stored partial):
                        # the other threads' warpgroups arrive, the counting one waits. Why not one barrier that
                        # all wait on: the roles reach it from separate code (one copy per warpgroup), and an
                        # aligned ``bar.sync`` reached by the same barrier's threads at two instructions is what
                        # compute-sanitizer's synccheck reported as divergent (forty-fifth session).
                        if mtidx < 128:
                            cute.arch.barrier(barrier_id=self.merge_barrier_id, number_of_threads=self.merge_threads)
                            if mtidx == 0:
                                s_last[0] = last_chunk.arrive(mMeta, part, begin_split, m_block, n)
                        else:
                            cute.arch.barrier_arrive(barrier_id=self.merge_barrier_id,
                                                     number_of_threads=self.merge_threads)

    @cute.jit
    def chunk_verdicts(self, storage):
        """Two Int32 in shared memory: whether this CTA merges the part's first request (0) and its last (1).
        In the split cluster's lse slots, unused here (the merge by the last chunk runs without a split cluster)."""
        return cute.make_tensor(cute.recast_ptr(storage.lse_slots.data_ptr(), dtype=Int32), cute.make_layout(2))

    @cute.jit
    def merge_barrier(self):
        """The named barrier of ``merge_threads`` around the merge by the last chunk, after a warp barrier (its
        callers branch per thread just before: quad leaders' stores, thread 0's count). Every thread must reach
        it at the same instruction (an aligned ``bar.sync``): the variants call ``merge_by_last_chunk`` from one
        place for all the merging threads."""
        cute.arch.sync_warp()
        cute.arch.barrier(barrier_id=self.merge_barrier_id, number_of_threads=self.merge_threads)

    def merge_buffer_bytes(self) -> int:
        """Bytes of shared memory from Q's tile on that ``merge_by_last_chunk`` may use: Q's tile, the K stages
        and P's tile, laid out back to back (each a multiple of their 1024-byte alignment; checked on the host
        in ``__call__``, which sets ``_merge_buffer_bytes``)."""
        return self._merge_buffer_bytes

    def make_pipelines(self, storage):
        """Q (``make_q_pipeline``) and K: ``kv_stages`` stages built by the loader; consumers = every
        math warp (each releases a tile after its P.V, to every CTA of the cluster when the loader
        multicasts)."""
        pipe_q = self.make_q_pipeline(storage)
        return pipe_q, self.loader.make_pipeline(storage.mbar_k.data_ptr(), self.k_consumer_warps)

    def make_q_pipeline(self, storage):
        """Q: one stage, producer = one thread, consumers = the ``q_consumer_warps`` warps that run QK
        (local to the CTA)."""
        thread = pipeline.Agent.Thread
        return pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_q.data_ptr(), num_stages=1,
            producer_group=pipeline.CooperativeGroup(thread, 1),
            consumer_group=pipeline.CooperativeGroup(thread, self.q_consumer_warps),
            tx_count=self.q_bytes, defer_sync=True)

    @cute.jit
    def new_chunk_state(self, thr_pv, n_rows_thr: cutlass.Constexpr[int]):
        """A math warpgroup's state at the start of a chunk: its 64 x 256 fp32 O accumulator (zero) and
        that accumulator's (rows, cols) view, the running row max (-inf), the thread-partial row sum (0)
        and a slot for the rows' rescale factors."""
        acc_o = cute.make_rmem_tensor(thr_pv.partition_shape_C((BLOCK_M, HEAD_DIM_V // 2)), Float32)
        acc_o.fill(0.0)
        row_max = cute.make_rmem_tensor(n_rows_thr, Float32)
        row_sum = cute.make_rmem_tensor(n_rows_thr, Float32)
        row_scale = cute.make_rmem_tensor(n_rows_thr, Float32)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)
        return acc_o, layouts.acc_mn_view(acc_o), row_max, row_sum, row_scale

    def tiled_mmas(self):
        """The three wgmma shapes of both designs: QK (64x64, Q and K from smem), P.V for 256 output
        columns with P from registers (RS) and with P from smem (SS); V is MN-major (the K tile read
        transposed)."""
        mma_qk = sm90.make_trivial_tiled_mma(
            self.dtype, self.dtype, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K, Float32,
            (1, 1, 1), (BLOCK_M, BLOCK_N))
        mma_pv_rs = sm90.make_trivial_tiled_mma(
            self.dtype, self.dtype, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.MN, Float32,
            (1, 1, 1), (BLOCK_M, HEAD_DIM_V // 2), warpgroup.OperandSource.RMEM)
        mma_pv_ss = sm90.make_trivial_tiled_mma(
            self.dtype, self.dtype, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.MN, Float32,
            (1, 1, 1), (BLOCK_M, HEAD_DIM_V // 2))
        return mma_qk, mma_pv_rs, mma_pv_ss

    def p_tile_layout(self, dtype):
        """P's shared-memory tile (64 x 64, the P.V's A operand from shared memory): K-major, 128B swizzle."""
        return layouts.smem_tile_layout(dtype, BLOCK_M, BLOCK_N)

    @cute.jit
    def issue_qk(self, acc_s, tSrQ, tSrK, stage):
        """S = Q.K^T of the K tile in ``stage``, issued and committed as one wgmma group (not waited
        for; the caller waited for the tile). A fresh MMA object: the ACCUMULATE state set here inside
        a caller's branch or loop must not escape it."""
        mma_qk, _, _ = self.tiled_mmas()
        # A barrier wait is a loop (a branch) before the wgmma chain: the fence comes after it.
        warpgroup.fence()
        self.qk_blocks(mma_qk, acc_s, tSrQ, tSrK, stage, tuple(range(HEAD_DIM // paged_kv.COL_BLOCK)), True)
        warpgroup.commit_group()

    @cute.jit
    def qk_blocks(self, mma_qk, acc_s, tSrQ, tSrK, stage, cols: cutlass.Constexpr, starts: cutlass.Constexpr[bool]):
        """QK's k16 steps over the 64-column blocks ``cols`` of the K tile in ``stage``, in that order, issued
        (neither fenced nor committed: the caller's wait and ``warpgroup.fence`` come first, its commit
        after); ``starts``: the first step overwrites the accumulator (a chain's first blocks)."""
        steps = paged_kv.COL_BLOCK // 16
        for bi in cutlass.range_constexpr(len(cols)):
            for kk in cutlass.range_constexpr(steps):
                k = cols[bi] * steps + kk
                mma_qk.set(warpgroup.Field.ACCUMULATE, not starts or bi != 0 or kk != 0)
                cute.gemm(mma_qk, acc_s, tSrQ[None, None, k], tSrK[None, None, k, stage], acc_s)

    @cute.jit
    def issue_pv(self, acc_o, tOrP, tOrV, stage, p_in_registers: cutlass.Constexpr[bool] = False):
        """O += P.V of the K tile in ``stage`` for one warpgroup's 256 columns, issued and committed as
        one wgmma group: P from smem (SS), or with ``p_in_registers`` from registers (RS, ``tOrP`` an
        A-operand view of them). A fresh MMA object, as in ``issue_qk``."""
        _, mma_rs, mma_ss = self.tiled_mmas()
        tiled_mma = mma_rs if const_expr(p_in_registers) else mma_ss
        warpgroup.fence()
        for k in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            cute.gemm(tiled_mma, acc_o, tOrP[None, None, k], tOrV[None, None, k, stage], acc_o)
        warpgroup.commit_group()

    # ------------------------------------------------------- chunk helpers
    @cute.jit
    def work_list(self, mMeta: cute.Tensor):
        """``(begin_req, begin_block, end_req, end_block, begin_split)``: this CTA's row of the split
        plan (grid y = plan part, or part * split_cluster + rank; docs/interfaces.md)."""
        _, part, _ = cute.arch.block_idx()
        if const_expr(self.split_cluster > 1):
            part = part // self.split_cluster
        meta = mMeta[part, None]
        return meta[0], meta[1], meta[2], meta[3], meta[4]

    @cute.jit
    def chunk_start(self, r: Int32, begin_req: Int32, begin_block: Int32) -> Int32:
        """This CTA's first KV tile of request ``r`` (``chunk_bounds``' ``start``), from the plan row
        alone: no global load, so a producer can address the chunk's first tiles before the request's
        length arrives."""
        start = Int32(0)
        if r == begin_req:
            start = begin_block
        if const_expr(self.split_cluster > 1):
            start = start * self.split_cluster + self.cluster_rank()
        return start

    @cute.jit
    def chunk_bounds(self, r: Int32, begin_req: Int32, begin_block: Int32, end_req: Int32, end_block: Int32,
                     begin_split: Int32, mSeqlens: cute.Tensor, mNumSplits: cute.Tensor):
        """KV tile range [start, stop) of request r inside this part, and where its output goes.

        With a split cluster the plan counts in groups of ``split_cluster`` tiles (its ``block_n`` is
        ``64 * split_cluster``); ``start`` is then this CTA's first tile, and it takes every
        ``split_cluster``-th tile from there (``cluster_rank`` interleaves the ranks tile by tile).
        """
        seqlen = mSeqlens[r]
        n_blocks = (seqlen + BLOCK_N - 1) // BLOCK_N
        start = self.chunk_start(r, begin_req, begin_block)
        stop = n_blocks
        split_no = Int32(0)
        if r == begin_req:
            split_no = begin_split
        if r == end_req:
            stop = end_block
        if const_expr(self.split_cluster > 1):
            if r == end_req:
                stop = cutlass.min(stop * self.split_cluster, n_blocks)
        split_base = mNumSplits[r]
        is_split = (mNumSplits[r + 1] - split_base) > 1
        return seqlen, n_blocks, start, stop, is_split, split_base + split_no

    @cute.jit
    def empty_row_lse(self, is_split) -> Float32:
        """The lse of a row that saw no key in this CTA's chunk: +inf for a final output (FlashMLA's
        convention), -inf where it is merged further (a split partial, or one rank's share in a split
        cluster), so that the merge weighs it 0."""
        empty_lse = Float32.inf
        if const_expr(self.split_cluster > 1):
            empty_lse = -Float32.inf
        if is_split:
            empty_lse = -Float32.inf
        return empty_lse

    @cute.jit
    def cluster_rank(self) -> Int32:
        """This CTA's rank in its split cluster (the cluster spans grid y only)."""
        return cute.arch.block_idx_in_cluster()

    @cute.jit
    def row_limits(self, seqlen: Int32, m_block: Int32, tScS: cute.Tensor) -> cute.Tensor:
        """Per-row key limit of this thread's score rows: causal row ``s_idx`` sees keys
        ``[0, seqlen - (s_q - 1 - s_idx))``, a non-causal row all ``seqlen``."""
        n_rows = cute.size(tScS, mode=[0])
        row_limit = cute.make_rmem_tensor(n_rows, Int32)
        for i in cutlass.range_constexpr(n_rows):
            row_limit[i] = seqlen
            if const_expr(self.causal):
                s_idx = (m_block * BLOCK_M + tScS[i, 0][0]) // self.heads_per_kv
                row_limit[i] = seqlen - (self.s_q - 1 - s_idx)
        return row_limit

    def steady_loops(self, start, stop, seqlen):
        """A chunk's loops over its steps as (lo, hi, steady), for a static ``for`` (traced once per loop): with
        ``steady_loop`` the steady run [start, steady_stop) (the variant's ``steady_stop``) then the rest, else
        the one loop [start, stop)."""
        if not self.steady_loop:
            return ((start, stop, False),)
        mid = self.steady_stop(start, stop, seqlen)
        return ((start, mid, True), (mid, stop, False))

    def unless_steady(self, steady: bool, cond):
        """``cond`` (a per-step condition the steady loop's steps all meet) in the second loop, a constant True in
        the steady one, so that the branch on it folds away there."""
        return cutlass.Boolean(True) if steady else cond

    @cute.jit
    def steady_end(self, start, stop, seqlen, step: cutlass.Constexpr[int], last_offset: cutlass.Constexpr[int],
                   ahead: cutlass.Constexpr[int]):
        """Where a chunk's steady steps end, for a variant that runs them in a loop of their own compiled without
        the per-tile checks (``steady_loop``): step x (x = start, start + step, ...) is steady when its last tile
        x + last_offset ends at or below every row's key limit (tile + 1 <= (seqlen - (s_q - 1)) // BLOCK_N: no
        key masked, no V row past seqlen; its earlier tiles then neither) and x + ahead < stop (whatever the step
        issues for later tiles exists). Returns the first step past the steady run (``start`` if none, or if the
        run has fewer than ``steady_min_steps`` steps)."""
        full_tiles = cutlass.max(seqlen - (self.s_q - 1), 0) // BLOCK_N
        last = cutlass.min(full_tiles - last_offset - 1, stop - ahead - 1)  # the last steady step, if >= start
        out = start
        # (last - start) // step + 1 steady steps: at least ``steady_min_steps`` of them, or none
        if last >= start + (self.steady_min_steps - 1) * step:
            out = start + ((last - start) // step + 1) * step
        return out

    @cute.jit
    def mask_tile(self, acc_s, blk, seqlen, row_limit, tScS):
        """-inf for the keys past each row's limit (only tail tiles can have any)."""
        s_mn = layouts.acc_mn_view(acc_s)
        if (blk + 1) * BLOCK_N > seqlen - (self.s_q - 1):
            for i in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
                for j in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
                    if blk * BLOCK_N + tScS[i, j][1] >= row_limit[i]:
                        s_mn[i, j] = -Float32.inf

    @cute.jit
    def softmax_tile(self, acc_s, blk, seqlen, row_limit, tScS, row_max, row_sum, row_scale, scale_log2,
                     mask: cutlass.Constexpr[bool] = True):
        """Mask the keys past each row's limit (``mask_tile``; ``mask`` False: the caller knows the tile needs
        none), then the online softmax step in place: S becomes unnormalised P (fp32), ``row_scale`` the
        factor for O."""
        if const_expr(mask):
            self.mask_tile(acc_s, blk, seqlen, row_limit, tScS)
        softmax.online_softmax_step(layouts.acc_mn_view(acc_s), row_max, row_sum, row_scale, scale_log2,
                                    lazy=self.lazy_rescale, tree=self.softmax_tree)

    @cute.jit
    def tma_load_q(self, tma_q, mQ, sQ, pipe_q, q_state, m_block: Int32, kv_head: Int32, r: Int32):
        gQ = cute.local_tile(mQ, (self.q_tile_rows, HEAD_DIM), (m_block, 0, kv_head, r))
        tQsQ, tQgQ = cpasync.tma_partition(tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                                           cute.group_modes(gQ, 0, 2))
        pipe_q.producer_acquire(q_state)
        cute.copy(tma_q, tQgQ, tQsQ, tma_bar_ptr=pipe_q.producer_get_barrier(q_state))

    @cute.jit
    def zero_v_rows(self, sK: cute.Tensor, stage: Int32, first_row: Int32, col0: cutlass.Constexpr[int],
                    ncols: cutlass.Constexpr[int], wg_tidx: Int32, barrier_id: cutlass.Constexpr[int]):
        """Zero rows [first_row, 64) of V columns [col0, col0 + ncols) in a K stage.

        Cache slots past a sequence's end may hold anything (NaN in the tests); P is 0 there but
        0 * NaN is NaN, so the V rows that P.V reads must be real zeros. Only the last tile of a
        request can need it. The async-proxy fence + warpgroup barrier order these generic stores
        before the wgmma that reads them.
        """
        n_rows = BLOCK_N - first_row
        total = n_rows * ncols
        for idx in cutlass.range(wg_tidx, total, 128, unroll=1):
            row = first_row + idx // ncols
            col = col0 + idx % ncols
            sK[row, col, stage] = sK.element_type(0.0)
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=barrier_id, number_of_threads=128)

    @cute.jit
    def zero_tail_v_rows(self, sK: cute.Tensor, stage: Int32, valid, col0: cutlass.Constexpr[int],
                         ncols: cutlass.Constexpr[int], wg_tidx: Int32, barrier_id: cutlass.Constexpr[int],
                         steady: cutlass.Constexpr[bool] = False):
        """``zero_v_rows`` of the tile in ``stage`` where it is the request's tail: ``valid`` (seqlen - tile * 64,
        the keys left from its first row) below 64 zeroes rows [valid, 64); nothing where the caller knows the
        tile is whole (``steady``)."""
        if const_expr(not steady):
            if valid < BLOCK_N:
                self.zero_v_rows(sK, stage, valid, col0, ncols, wg_tidx, barrier_id)

    @cute.jit
    def store_rows(self, acc: cute.Tensor, tiled_mma: cute.TiledMma, wg_tidx: Int32, row_inv: cute.Tensor,
                   row_lse: cute.Tensor, write_lse: cutlass.Constexpr[bool], col0: cutlass.Constexpr[int],
                   m_block: Int32, kv_head: Int32, r: Int32, is_split, split_idx: Int32, mO: cute.Tensor,
                   mLSE: cute.Tensor, mOaccum: cute.Tensor, mLSEaccum: cute.Tensor):
        """Epilogue of one warpgroup: normalise its 64 x 256 slice of O and store it (final or partial).

        Rows past h_q * s_q (padding of the last m-block) are not stored.
        """
        thr_mma = tiled_mma.get_slice(wg_tidx)
        cO = cute.make_identity_tensor((BLOCK_M, 256))
        tOcO = layouts.acc_mn_view(thr_mma.partition_C(cO))
        acc_mn = layouts.acc_mn_view(acc)
        row_base = m_block * BLOCK_M
        if is_split:
            self.store_o(acc_mn, tOcO, wg_tidx, row_inv, col0, row_base, kv_head, split_idx, mOaccum)
        else:
            self.store_o(acc_mn, tOcO, wg_tidx, row_inv, col0, row_base, kv_head, r, mO)
        if const_expr(write_lse):
            for i in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
                row = row_base + tOcO[i, 0][0]
                if row < self.rows:
                    if wg_tidx % 4 == 0:
                        if is_split:
                            mLSEaccum[row, kv_head, split_idx] = row_lse[i]
                        else:
                            mLSE[row, kv_head, r] = row_lse[i]

    @cute.jit
    def store_o(self, acc_mn: cute.Tensor, tOcO: cute.Tensor, wg_tidx: Int32, row_inv: cute.Tensor,
                col0: cutlass.Constexpr[int], row_base: Int32, kv_head: Int32, last: Int32, mDst: cute.Tensor):
        """Store a warpgroup's normalised 64 x 256 slice of O into ``mDst[row, col, kv_head, last]``
        (``out`` or the partials; rows past h_q * s_q not stored). 16-bit destinations take 16-byte
        stores of whole 8-column blocks, gathered within each quad of lanes (``store_rows_16``); fp32
        ones (fp32 partials) keep the fragment's 8-byte pair stores, which already fill a 32-byte
        sector per quad."""
        if const_expr(self.vector_stores and mDst.element_type.width == 16):
            self.store_rows_16(acc_mn, tOcO, wg_tidx, row_inv, col0, row_base, kv_head, last, mDst)
        else:
            for i in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
                row = row_base + tOcO[i, 0][0]
                if row < self.rows:
                    inv = row_inv[i]
                    for j in cutlass.range_constexpr(cute.size(acc_mn, mode=[1])):
                        mDst[row, col0 + tOcO[i, j][1], kv_head, last] = (acc_mn[i, j] * inv).to(mDst.element_type)

    @cute.jit
    def store_rows_16(self, acc_mn: cute.Tensor, tOcO: cute.Tensor, wg_tidx: Int32, row_inv: cute.Tensor,
                      col0: cutlass.Constexpr[int], row_base: Int32, kv_head: Int32, last: Int32, mDst: cute.Tensor):
        """Store a warpgroup's normalised 64 x 256 slice of O into the 16-bit ``mDst[row, col, kv_head,
        last]`` with 16-byte stores (rows past h_q * s_q not stored).

        The wgmma fragment gives each lane of a quad (the 4 lanes sharing a row) 2 of the 8 columns of
        every 8-column block, so a direct store is 4 bytes per lane and a quad fills half a 32-byte
        sector per instruction (L2 then merges partial sectors). Instead, per group of 4 blocks, the
        quad transposes its 4 x 4 matrix of bf16/fp16 pairs (lane q ends with block 4g + q whole:
        two butterfly exchanges, 4 shuffles) and each lane stores 16 contiguous bytes: a quad writes
        64 contiguous bytes, 8 instructions per row instead of 32. The shuffles run on every lane
        (rows past the end included) so that the full-warp shuffles never diverge; only the stores
        are predicated.
        """
        q = wg_tidx % 4
        hi_bit = (q & 2) != 0
        lo_bit = (q & 1) != 0
        for i in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
            row = row_base + tOcO[i, 0][0]
            inv = row_inv[i]
            for g in cutlass.range_constexpr(cute.size(acc_mn, mode=[1]) // 8):
                # p_k: this lane's two columns of block 4g + k, packed.
                j = 8 * g
                p0 = _pack_16x2(acc_mn[i, j] * inv, acc_mn[i, j + 1] * inv, mDst.element_type)
                p1 = _pack_16x2(acc_mn[i, j + 2] * inv, acc_mn[i, j + 3] * inv, mDst.element_type)
                p2 = _pack_16x2(acc_mn[i, j + 4] * inv, acc_mn[i, j + 5] * inv, mDst.element_type)
                p3 = _pack_16x2(acc_mn[i, j + 6] * inv, acc_mn[i, j + 7] * inv, mDst.element_type)
                # Exchange with lane q ^ 2: lanes with bit 1 clear keep blocks 0-1 of both lanes,
                # the others blocks 2-3; then with lane q ^ 1 likewise for single blocks.
                p0, p2 = _swap_half(p0, p2, hi_bit, 2)
                p1, p3 = _swap_half(p1, p3, hi_bit, 2)
                p0, p1 = _swap_half(p0, p1, lo_bit, 1)
                p2, p3 = _swap_half(p2, p3, lo_bit, 1)
                if row < self.rows:
                    col = col0 + 8 * (4 * g + q)
                    ptr = mDst.iterator + cute.crd2idx((row, col, kv_head, last), mDst.layout)
                    _store_global_v4(ptr, (p0, p1, p2, p3))

    @cute.jit
    def store_chunk(self, acc: cute.Tensor, tiled_mma: cute.TiledMma, wg_tidx: Int32, math_tidx: Int32,
                    row_inv: cute.Tensor, row_lse: cute.Tensor, write_lse: cutlass.Constexpr[bool],
                    col0: cutlass.Constexpr[int], m_block: Int32, kv_head: Int32, r: Int32, is_split,
                    split_idx: Int32, mO: cute.Tensor, mLSE: cute.Tensor, mOaccum: cute.Tensor,
                    mLSEaccum: cute.Tensor, storage):
        """A math warpgroup's chunk epilogue: its 256 columns stored directly (``store_rows``), or in a
        split cluster combined with the other ranks first (``cluster_epilogue``). ``math_tidx``: the
        thread's index among the CTA's 256 math threads; ``write_lse``: this warpgroup holds the lse."""
        if const_expr(self.split_cluster > 1):
            self.cluster_epilogue(acc, tiled_mma, wg_tidx, math_tidx, row_inv, row_lse, write_lse, col0, m_block,
                                  kv_head, r, is_split, split_idx, mO, mLSE, mOaccum, mLSEaccum, storage)
        else:
            self.store_rows(acc, tiled_mma, wg_tidx, row_inv, row_lse, write_lse, col0, m_block, kv_head, r,
                            is_split, split_idx, mO, mLSE, mOaccum, mLSEaccum)

    # ------------------------------------------------------- split cluster
    @cute.jit
    def cluster_epilogue(self, acc: cute.Tensor, tiled_mma: cute.TiledMma, wg_tidx: Int32, math_tidx: Int32,
                         row_inv: cute.Tensor, row_lse: cute.Tensor, publish: cutlass.Constexpr[bool],
                         col0: cutlass.Constexpr[int], m_block: Int32, kv_head: Int32, r: Int32, is_split,
                         split_idx: Int32, mO: cute.Tensor, mLSE: cute.Tensor, mOaccum: cute.Tensor,
                         mLSEaccum: cute.Tensor, storage):
        """Epilogue of one math warpgroup in a split cluster: the ``split_cluster`` CTAs of a group
        combine their partial outputs of this chunk through distributed shared memory, and each CTA
        stores ``512 / split_cluster`` columns of the combined output (``out``, or the group's partial
        when the plan splits the request over several groups).

        1. Each thread stores its normalised O values into this CTA's scratch (the K stages, free once
           the chunk's last P.V is done), the warpgroup holding the row lse (``publish``) the lse;
           cluster barrier (release/acquire): every CTA's partial is visible to the cluster.
        2. Each CTA reads the lse and its columns of every rank's partial from the ranks' shared
           memory (``ld.shared::cluster``), weighs rank k by ``exp(lse_k - lse)`` with ``lse`` over the
           ranks (the global merge's formula) and stores the sum; cluster barrier: no CTA reuses its
           scratch, or exits, while a peer may still read it.
        Every thread of every CTA of the cluster passes both barriers, also in a CTA whose share of the
        chunk is empty (lse -inf, weight 0), and the 3wg producer (``cluster_idle``).
        """
        C = self.split_cluster
        W = HEAD_DIM_V // C
        rank = self.cluster_rank()
        s_lse = storage.lse_slots.get_tensor(cute.make_layout(BLOCK_M))
        scratch_ptr = cute.recast_ptr(storage.sK.data_ptr(), dtype=Float32)
        sO = cute.make_tensor(scratch_ptr, cute.make_layout((BLOCK_M, HEAD_DIM_V), stride=(SCRATCH_ROW, 1)))
        thr_mma = tiled_mma.get_slice(wg_tidx)
        tOcO = layouts.acc_mn_view(thr_mma.partition_C(cute.make_identity_tensor((BLOCK_M, HEAD_DIM_V // 2))))
        acc_mn = layouts.acc_mn_view(acc)
        for i in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
            row = tOcO[i, 0][0]
            if m_block * BLOCK_M + row < self.rows:  # padding rows of the last m-block are never read
                inv = row_inv[i]
                for j in cutlass.range_constexpr(cute.size(acc_mn, mode=[1])):
                    sO[row, col0 + tOcO[i, j][1]] = acc_mn[i, j] * inv
                if const_expr(publish):
                    if wg_tidx % 4 == 0:
                        s_lse[row] = row_lse[i]
        # Release (cluster scope) of the scratch and lse stores to the peers that read them next.
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()

        log2e = Float32(math.log2(math.e))
        row_base = m_block * BLOCK_M
        quads = W // 4
        # Only the rows the output has: a 16-head m-block reads 16 rows of each rank's partial, not 64
        # (the remote reads are what this step costs).
        items = min(BLOCK_M, self.rows) * quads
        for it in cutlass.range((items + 255) // 256, unroll=1):
            item = math_tidx + it * 256
            row = item // quads
            q = item - row * quads
            col = rank * W + q * 4
            if item < items and row_base + row < self.rows:
                lse_k = cute.make_rmem_tensor(C, Float32)
                lse_max = -Float32.inf
                for k in cutlass.range_constexpr(C):
                    lse_k[k] = _load_cluster_f32(s_lse.iterator + row, k)
                    lse_max = cute.arch.fmax(lse_max, lse_k[k])
                lse_safe = lse_max
                if lse_max == -Float32.inf:
                    lse_safe = Float32(0.0)  # no rank saw a key: every weight is exp(-inf) = 0
                total = Float32(0.0)
                o = cute.make_rmem_tensor(4, Float32)
                o.fill(0.0)
                for k in cutlass.range_constexpr(C):
                    w = cute.math.exp2((lse_k[k] - lse_safe) * log2e, fastmath=True)
                    total += w
                    v = _load_cluster_f32x4(scratch_ptr + (row * SCRATCH_ROW + col), k)
                    for e in cutlass.range_constexpr(4):
                        o[e] += w * v[e]
                inv_total = Float32(0.0)
                lse = -Float32.inf
                if total > Float32(0.0):
                    inv_total = cute.arch.rcp_approx(total)
                    lse = lse_max + cute.math.log2(total, fastmath=True) * Float32(softmax.LN2)
                for e in cutlass.range_constexpr(4):
                    if is_split:
                        mOaccum[row_base + row, col + e, kv_head, split_idx] = (o[e] * inv_total).to(
                            mOaccum.element_type)
                    else:
                        mO[row_base + row, col + e, kv_head, r] = (o[e] * inv_total).to(mO.element_type)
                if rank == 0:
                    if q == 0:
                        if is_split:
                            mLSEaccum[row_base + row, kv_head, split_idx] = lse
                        else:
                            if lse == -Float32.inf:
                                lse = Float32.inf  # no key at all: the unsplit convention
                            mLSE[row_base + row, kv_head, r] = lse
        # Generic-proxy reads of the scratch, then (next chunk) TMA writes into it: the proxy fence.
        # A relaxed arrive: it only has to say "my reads of the peers are done", and they are (their
        # values were used above); a releasing one would also wait for the stores to out (MEMBAR.GPU).
        cute.arch.fence_view_async_shared()
        cute.arch.cluster_arrive_relaxed()
        cute.arch.cluster_wait()

    @cute.jit
    def cluster_idle(self):
        """A warpgroup without output (the 3wg producer) passes the chunk's two cluster barriers."""
        cute.arch.cluster_arrive_relaxed()
        cute.arch.cluster_wait()
        cute.arch.cluster_arrive_relaxed()
        cute.arch.cluster_wait()


def _pack_16x2(lo: Float32, hi: Float32, dtype) -> Int32:
    """Two fp32 rounded to the 16-bit ``dtype`` (bf16 or fp16) and packed: ``lo`` in the low half,
    as the first of two consecutive elements in memory."""
    op = "cvt.rn.bf16x2.f32" if dtype is cutlass.BFloat16 else "cvt.rn.f16x2.f32"
    return Int32(llvm.inline_asm(Int32.mlir_type, [Float32(hi).ir_value(), Float32(lo).ir_value()],
                                 f"{op} $0, $1, $2;", "=r,f,f", has_side_effects=False))


def _swap_half(a: Int32, b: Int32, upper, offset: int):
    """One butterfly step of a quad transpose: lanes with ``upper`` clear send ``b`` to lane
    ``lane ^ offset`` and take its ``a`` in place of ``b``; lanes with ``upper`` set send ``a`` and take
    the partner's ``b`` in place of ``a``."""
    got = cute.arch.shuffle_sync_bfly(cutlass.select_(upper, a, b), offset=offset)
    return cutlass.select_(upper, got, a), cutlass.select_(upper, b, got)


def _store_global_v4(ptr, words):
    """One 16-byte global store of four 32-bit ``words`` at ``ptr`` (16-byte aligned)."""
    llvm.inline_asm(None, [cutlass.Int64(ptr.toint()).ir_value()] + [Int32(w).ir_value() for w in words],
                    "st.global.v4.b32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r", has_side_effects=True)


def _load_cluster_f32x4(local_ptr, rank):
    """Load 4 fp32 (16 B, 16-byte aligned) at ``local_ptr``'s offset in cluster CTA ``rank``'s shared
    memory: one request instead of four. Inline PTX (``mapa`` + ``ld.shared::cluster.v4``) with side
    effects, so it is not moved across the cluster barriers: the DSL's vector load made ptxas
    serialize every wgmma of the kernel."""
    f32 = Float32.mlir_type
    res = llvm.inline_asm(
        llvm.StructType.get_literal([f32] * 4), [Int32(local_ptr.toint()).ir_value(), Int32(rank).ir_value()],
        "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, $4, $5;\nld.shared::cluster.v4.f32 {$0, $1, $2, $3}, [ra];\n}",
        "=f,=f,=f,=f,r,r", has_side_effects=True)
    return [Float32(llvm.extractvalue(f32, res, [e])) for e in range(4)]


def _load_cluster_f32(local_ptr, rank) -> Float32:
    """Load the fp32 at ``local_ptr``'s offset in the shared memory of cluster CTA ``rank``."""
    remote = cute.arch.map_dsmem_ptr(local_ptr, rank)
    return Float32(llvm.load(Float32.mlir_type, remote.to_llvm_ptr()))
