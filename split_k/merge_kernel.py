"""Second stage of split-kv: merge the partial outputs of split requests by their lse (CuTe DSL).

Which CTAs run. A request is split exactly when it crosses a part boundary of the plan, and every
chunk after its first begins a part: part ``p`` with ``begin_split >= 1`` holds chunk
``begin_split`` of request ``begin_req`` (split_k/planner.py). So the parts are the merge's *slots*:
a request of ``n`` chunks owns the ``S = n - 1`` slots ``s = begin_split - 1`` of its parts 1..n-1,
and the grid is ``[num_parts, Y]``. A CTA whose part begins no continuation chunk (part 0, parts
that start a request whole, empty parts) returns after reading one metadata row, without waiting
for the main kernel (except CTA (0, 0), below); unsplit requests are never touched. The old form (one CTA per request and
row) launched ``b * rows`` CTAs whatever the plan: 16384 mostly idle CTAs at b128/h128 (11 us on an
H200) and only 16 busy ones at b1/h16, each looping over 128 splits (17 us).

Work units. A split request's work is ``rows * 4`` row-chunks (one query row times 128 of the 512
columns: a warp covers one with one 16-byte load of fp32 per lane, 8 bytes for 16-bit partials).
A row-chunk is reduced by ``G`` warps, with ``G`` chosen per request so that a warp has at most
``L`` splits per round (``G = 1`` up to ``L`` splits, 2 up to ``2L``, 4 up to ``4L``, else 8); warp
``g`` of the ``G`` takes splits ``[gL, gL + L)`` of every block of ``GL`` (consecutive splits: the
round's partials sit at one base address plus static offsets). A CTA of ``W`` warps (8; 4 for the
narrow kernel of 16-bit partials, ``kernel_warps``) therefore takes ``R = W / G`` row-chunks at once (a
*unit*): many rows per CTA when splits are few (big batches), one row-chunk spread over the CTA's warps
when they are many (b = 1, long context); ``G`` is at most ``W`` (a warp then takes several rounds). Unit
``u`` goes to slot ``u % S`` and CTA row ``(u // S) % Y`` of the grid (a grid-stride loop covers any ``Y``).

``L`` and ``Y`` are chosen on the host without reading the plan, from ``n_est`` chunks per request:
what the split planner's cost model gives a batch of ``b`` requests that all fill the block table
(``T`` = its capacity in 64-token tiles, each chunk charged ``T`` tiles plus the planner's fixed cost
``F``): ``target = ceil(b * (T + F) / num_parts)``, ``n_est = max(min(ceil(T / target), num_parts // b), 2)``,
or, for requests longer than ``target``, ``ceil(T / t)`` with the first of ``t = target - 2, target - 1`` (at
least 1) whose ``b * ceil(T / t)`` chunks fit ``num_parts`` (the aligned plan's sizes under target)
(``estimated_chunks``; ``max(num_parts // b, 2)`` when the capacity is not given). ``L`` is 16 with
16-bit partials when ``n_est > 16`` (``WIDE_ABOVE``; ``n_est > 8`` for requests of fewer than 64 rows) and 8
otherwise (and always 8 for fp32 partials, whose loads are
twice as wide): two compiled kernels, because 16 loads in flight take 98 registers (2 CTAs of 8 warps
per SM) and 8 take 62 (4 CTAs of 8 warps, or 8 of 4): where requests have at most 8 chunks both take one
round, and the narrow kernel's occupancy wins (H200, b8 1024 keys: 0.8-1.0 us of 14-16); at 9-16 chunks of
requests of 64 rows or more its two warps per row-chunk are still as fast or faster (``WIDE_ABOVE``). ``Y`` is
the units per slot, ``ceil(units(n_est) / (n_est - 1))``, at most ``GRID_CTAS // num_parts`` (CTAs then loop over
more units: a grid of thousands of CTAs that find nothing to merge costs its waves after the decode); skewed
plans only make some CTAs loop more, and idle CTAs (but CTA (0, 0)) return without waiting for the main kernel.
The choice depends on shapes only (b, num_parts, the block table's width), so a captured graph keeps it.

Inside a warp the merge is an online softmax over the warp's own splits: each round issues the
loads of up to ``L`` splits (their lse and 4 columns of their partial per lane) before
using any, then folds them into a running ``(max, sum, acc)``. So the lse values and the partials
are fetched together (one L2 round trip per round, no separate lse pass), and no barrier precedes
the loads. With ``G > 1`` the ``G`` warps of a row-chunk combine their ``(max, sum, acc)`` through
shared memory (rescaled to the common max), and the first of them writes ``out`` and ``lse``.
The plan row's two fields are read together before the slot test (one round trip, not two).

Programmatic dependent launch: the entry launches this kernel with ``use_pdl`` and the main kernel
triggers its dependents when it starts, so this grid is scheduled while the main kernel runs;
``griddepcontrol.wait`` (a no-op without PDL) orders every read of a partial after the main
kernel's completion and memory flush. The plan tensors are inputs of both kernels, so the slot test
reads them before the wait (the main kernel lets this grid be scheduled only after its own wait, by
when the plan's writer has completed and flushed its writes; launch_dependents itself orders no
memory, so this rests on that completion, and on a grid's first loads not hitting L1 lines left by an
earlier grid, as when the main kernel was a plain launch). Idle CTAs return without waiting, except CTA (0, 0), which
waits in any case so that this grid's completion implies the main kernel's. This grid lets the next
one (the next decode, itself launched with programmatic dependent launch) be scheduled as soon as it
starts.

Layouts (docs/interfaces.md): o_accum [splits, rows, 512] fp32 or the input dtype (``partial_dtype``), lse_accum [splits, rows] fp32
natural log (-inf = no key in that chunk), num_splits [b + 1] prefix sums, tile_scheduler_metadata
[num_parts, 8], out [b, s_q, h_q, 512] (viewed as [b, rows, 512]: the API checks that the rows
merge), lse [b, h_q, s_q], with row = s_idx * h_q + head for any number of kv heads.
"""
from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync

from split_k.planner import BEGIN_REQ, BEGIN_SPLIT, BELOW_TARGET, BLOCK_N, FIXED_COST

HEAD_DIM_V = 512
THREADS = 256  # the merge kernel's CTA but for the narrow kernel of 16-bit partials (``NARROW_WARPS``)
WARPS = THREADS // 32
NARROW_WARPS = 4
"""Warps per CTA of the narrow kernel with 16-bit partials (``kernel_warps``): 128-thread CTAs, twice as many,
each half the row-chunks (and its warp groups' combine waits on 4 warps instead of 8). Paired against 8 warps
on an H100 (docs/perf-notes.md, twenty-sixth section, 2a), 4 warps / 8, us: b8 s1 h64 4096 24.26 / 24.83 and
24.29 / 24.93, b8 s2 h64 1024 16.38 / 16.83, b1 s1 h64 1024 10.91 / 11.10 and 10.91 / 11.20, b4 s1 h128 4096
-0.06 / -0.11, b32 s1 h64 1024 -0.03 / -0.09. A timing hack with 4 warps in every kernel also showed the wide
kernel: slower at ``G`` 4 (b1 s1 h128 16384 19.87 / 19.58 and 19.74 / 19.39), faster at ``G`` 1 (b1 s1 h16 1024
9.34 / 9.50 and 9.18 / 9.50), mixed at ``G`` 1 on b8 s1 h16 4096. A rule on ``G`` (the wide kernel in 4-warp CTAs
up to ``G`` 2) was then paired against this one (twenty-seventh section, 2): 0.5-0.8 us slower at 32 rows (b8 s1
h32 1024, b8 s2 h16 1024), 0.06-0.1 us faster only at b1 s1 h16 1024: not taken. 16-warp CTAs were slower on
every row. fp32 partials keep 8 warps:
their one kernel also serves requests of many chunks, where ``G`` would be capped at 4."""
LANE_COLS = 4  # columns per lane per load: 16 bytes of fp32
CHUNK = 32 * LANE_COLS  # columns a warp covers with one load per lane
CHUNKS = HEAD_DIM_V // CHUNK  # 4
# Splits a warp loads per round before using any (``L``): the wide kernel (16-bit partials, 8 bytes per
# lane each, requests of many chunks) and the narrow one (fp32 partials, 16 bytes per lane each, and
# 16-bit partials when requests have few chunks; see ``kernel_loads``).
LOADS_WIDE = 16
LOADS_NARROW = 8
WIDE_ABOVE = 16
"""``n_est`` above which 16-bit partials of requests with at least ``WIDE_ABOVE_ROWS`` rows take the wide
kernel (``wide_above``); fewer rows keep it above ``LOADS_NARROW``. At 9-16 chunks of 64-128 rows the narrow
kernel (``G = 2`` warps per row-chunk, 62 registers, then 4 CTAs of 8 warps per SM) was 0.3-1.9% faster (graph replays
interleaved in one process, two passes, an H200 and an H100: b8 s1 h64 1024, b8 s2 h32 1024, b8 s1 h64 4096,
b1 s1 h64 1024; docs/perf-notes.md, twenty-first session); with 16-32 rows it was 1-8% slower (b8 s1 h16
4096 x1.08, b8 s1 h16 1024 x1.06 on the H100), and at 128 chunks (b1 s1 h16 16384) 6% slower. Measured again
once the narrow kernel took 4-warp CTAs (``NARROW_WARPS``; twenty-seventh section, 2): still 0.2-0.5 us slower at
16-32 rows and n_est 16 (b8 s1 h32 1024 13.60 / 13.54 against 13.12 / 13.10 us, H100)."""
WIDE_ABOVE_ROWS = 64
# ``merge_rows`` (the merge by a request's last chunk, in the decode CTA): output columns per thread and step (16
# bytes of out), rows per call, most chunks of one request (the plan's parts, ``split_k.last_chunk.MAX_PARTS``).
ROW_LANE_COLS = 8
BLOCK_M_ROWS = 64
LSE_LOADS = 4  # lse values a row's thread loads at once


@cute.jit
def rows_per_batch(n: Int32, partial_bytes: cutlass.Constexpr[int], buf_bytes: cutlass.Constexpr[int]) -> Int32:
    """Rows ``merge_rows`` stages at once for a request of ``n`` chunks: 64, else the largest power of two whose
    ``n`` partial rows and their weights fit ``buf_bytes`` (at least 1; ``split_k.last_chunk.MAX_PARTS`` keeps
    one row of every chunk within the decode kernels' buffers)."""
    per_row = n * (HEAD_DIM_V * partial_bytes + 4)
    pb = Int32(BLOCK_M_ROWS)
    while (pb > 1) & (pb * per_row > buf_bytes):
        pb = pb >> 1
    return pb


def rows_per_batch_host(n: int, partial_bytes: int, buf_bytes: int) -> int:
    """``rows_per_batch`` in plain Python (tests)."""
    pb = BLOCK_M_ROWS
    while pb > 1 and pb * n * (HEAD_DIM_V * partial_bytes + 4) > buf_bytes:
        pb >>= 1
    return pb
LOG2E = math.log2(math.e)
LN2 = math.log(2.0)


SMEM_BYTES = (CHUNK + 2) * WARPS * 4
"""Shared memory of one merge CTA: the ``(CHUNK, WARPS)`` fp32 accumulators, then the warps' maxima
and sums (``smem_views``; the merge kernel's ``SharedStorage`` and the in-grid merge's P tile)."""


def smem_views(f32_ptr):
    """``(sAcc (CHUNK, WARPS), sM (WARPS), sS (WARPS))`` fp32 views from ``f32_ptr`` (16-byte aligned,
    ``SMEM_BYTES`` of room): the merge's shared memory, in the merge kernel and in the in-grid merge."""
    sAcc = cute.make_tensor(f32_ptr, cute.make_layout((CHUNK, WARPS)))
    sM = cute.make_tensor(f32_ptr + CHUNK * WARPS, cute.make_layout(WARPS))
    sS = cute.make_tensor(f32_ptr + (CHUNK + 1) * WARPS, cute.make_layout(WARPS))
    return sAcc, sM, sS


GRID_CTAS = 2048
"""Most CTAs of the merge grid (``grid_y`` caps ``Y`` at ``max(GRID_CTAS // num_parts, 1)``; the units of a
slot then take more turns of the CTAs' grid-stride loop). Why: ``Y`` is sized for requests that all split into
``n_est`` chunks, and at ``n_est`` 2 (batches of 32-128 requests) it is ``units`` itself, 64-256: grids of about
8400 CTAs. Where the plan splits nothing, all of them but one return after one plan read, yet they are scheduled
after the decode grid (whose CTAs leave no room on its SMs) in waves: paired on an H100 (``scripts/merge_tail.py``,
docs/perf-notes.md, forty-fourth session) that cost 4.4-5.9 us at b64 s1 h128 1024 and b32 s2 h128 1024 (41.9 ->
37.3 and 41.5 -> 35.7 us with 2048) and 0.5-1.1 us at b128 s1 h128 1024; with 2048 the rows whose plans split
29-60 requests took the same time (b32 s1 h128 4096, b128 s1 h128 4096 varlen, b128 s2 h128 4096), where a cap
of 1024 made them 2-8 us slower. About two waves of the narrow kernel's 4-warp CTAs on 132 SMs."""


def loads_in_flight(partial_bytes: int) -> int:
    """The most splits per round of one warp, for partials of ``partial_bytes`` bytes per element."""
    return LOADS_WIDE if partial_bytes <= 2 else LOADS_NARROW


def capacity_tiles(max_pages: int, page_size: int) -> int:
    """``T``: 64-token tiles of a request that fills a block table of ``max_pages`` pages."""
    return -(-max_pages * page_size // BLOCK_N)


def estimated_chunks(batch_size: int, num_parts: int, max_tiles: int | None = None) -> int:
    """``n_est``: chunks per request if every request held ``max_tiles`` tiles (the planner's cost
    model, module docstring); ``max(num_parts // b, 2)`` without ``max_tiles``. What the host side
    sizes for."""
    b = max(batch_size, 1)
    if max_tiles is None:
        return max(num_parts // b, 2)
    t = max(max_tiles, 1)
    parts = max(num_parts, 1)
    target = -(-b * (t + FIXED_COST) // parts)
    n = min(-(-t // target), num_parts // b)
    if t > target:  # long requests: the aligned plan's chunk sizes under target, where they fit
        for d in range(BELOW_TARGET, 0, -1):
            k = -(-t // max(target - d, 1))
            if b * k <= parts:
                n = k
                break
    return max(n, 2)


def wide_above(rows: int) -> int:
    """``n_est`` above which the wide kernel runs, for requests of ``rows`` query rows (``WIDE_ABOVE``)."""
    return WIDE_ABOVE if rows >= WIDE_ABOVE_ROWS else LOADS_NARROW


def kernel_loads(batch_size: int, num_parts: int, max_loads: int, max_tiles: int | None, rows: int) -> int:
    """``L`` of the kernel a launch runs for requests of ``rows`` rows: ``max_loads`` when ``n_est`` is above
    ``wide_above(rows)``, else 8."""
    return max_loads if estimated_chunks(batch_size, num_parts, max_tiles) > wide_above(rows) else LOADS_NARROW


def kernel_warps(loads: int, max_loads: int) -> int:
    """Warps per CTA of the merge kernel that runs ``loads`` splits per warp and round, for partials whose
    ``loads_in_flight`` is ``max_loads``: ``NARROW_WARPS`` for the narrow kernel of 16-bit partials, else 8."""
    return NARROW_WARPS if loads == LOADS_NARROW < max_loads else WARPS


def split_groups(n: int, loads: int = LOADS_WIDE, warps: int = WARPS) -> int:
    """``G``: warps sharing one row-chunk of a request with ``n`` chunks (the kernel's rule), for
    ``loads`` splits per warp and round, at most the CTA's ``warps`` (then a warp takes several rounds)."""
    return min(1 if n <= loads else 2 if n <= 2 * loads else 4 if n <= 4 * loads else 8, warps)


def units_per_request(rows: int, n: int, loads: int = LOADS_WIDE, warps: int = WARPS) -> int:
    """Units (one CTA step: ``warps / G`` row-chunks) of a split request with ``rows`` rows, ``n`` chunks."""
    per_unit = warps // split_groups(n, loads, warps)
    return -(-rows * CHUNKS // per_unit)


def grid_y(rows: int, batch_size: int, num_parts: int, max_loads: int = LOADS_WIDE,
           max_tiles: int | None = None) -> int:
    """The grid's second extent (CTAs per slot), as the host code of ``SplitMerge`` computes it: the units per
    slot at ``n_est`` chunks, at most ``GRID_CTAS // num_parts`` (at least 1)."""
    n = estimated_chunks(batch_size, num_parts, max_tiles)
    loads = kernel_loads(batch_size, num_parts, max_loads, max_tiles, rows)
    y = max(-(-units_per_request(rows, n, loads, kernel_warps(loads, max_loads)) // (n - 1)), 1)
    return min(y, max(GRID_CTAS // max(num_parts, 1), 1))


def in_grid_y(rows: int, batch_size: int, num_parts: int, max_loads: int = LOADS_WIDE,
              max_tiles: int | None = None) -> int:
    """``Y`` of the in-grid merge (``SplitMerge.in_grid_y``: ``grid_y`` with ``max_loads`` splits per
    round whatever ``n_est``): the merge cells per plan part that the part's decode CTAs take."""
    n = estimated_chunks(batch_size, num_parts, max_tiles)
    return max(-(-units_per_request(rows, n, max_loads) // (n - 1)), 1)


def unit_assignment(metadata, num_splits, rows: int, max_loads: int = LOADS_WIDE,
                    max_tiles: int | None = None) -> dict:
    """The kernel's work split in plain Python, for the CPU tests: ``{(part, cta_y): [(req, row,
    first_col, ncols, splits), ...]}`` (one entry per warp and unit; ``splits`` the chunk indices the
    warp reduces) for the plan
    ``(metadata [num_parts, 8], num_splits [b + 1])`` (lists or tensors). Every (split request, row,
    column, split) must be reduced exactly once."""
    meta = [list(map(int, m)) for m in (metadata.tolist() if hasattr(metadata, "tolist") else metadata)]
    splits = [int(x) for x in (num_splits.tolist() if hasattr(num_splits, "tolist") else num_splits)]
    y_ext = grid_y(rows, len(splits) - 1, len(meta), max_loads, max_tiles)
    loads = kernel_loads(len(splits) - 1, len(meta), max_loads, max_tiles, rows)
    warps = kernel_warps(loads, max_loads)
    work = {}
    for part, m in enumerate(meta):
        if m[BEGIN_SPLIT] < 1:
            continue
        r = m[BEGIN_REQ]
        n = splits[r + 1] - splits[r]
        slots = n - 1
        slot = m[BEGIN_SPLIT] - 1
        g_count = split_groups(n, loads, warps)
        per_unit = warps // g_count
        for cta_y in range(y_ext):
            for unit in range(cta_y * slots + slot, units_per_request(rows, n, loads, warps), y_ext * slots):
                for warp in range(warps):
                    rc = unit * per_unit + warp // g_count
                    if rc < rows * CHUNKS:
                        group = warp % g_count
                        mine = tuple(i for i0 in range(group * loads, n, g_count * loads)
                                     for i in range(i0, min(i0 + loads, n)))
                        work.setdefault((part, cta_y), []).append((r, rc // CHUNKS, (rc % CHUNKS) * CHUNK, CHUNK, mine))
    return work


class SplitMerge:
    def __init__(self, dtype, num_heads: int, seqlen_q: int, partial_dtype=cutlass.Float32):
        self.dtype = dtype
        self.partial_dtype = partial_dtype
        self.h_q = num_heads
        self.rows = num_heads * seqlen_q
        self.wide_above = wide_above(self.rows)  # an A/B sets another (scripts/merge_tail.py)
        self.max_loads = loads_in_flight(partial_dtype.width // 8)

    @cute.jit
    def __call__(self, mOaccum: cute.Tensor, mLSEaccum: cute.Tensor, mNumSplits: cute.Tensor, mMeta: cute.Tensor,
                 mO: cute.Tensor, mLSE: cute.Tensor, max_tiles: Int32, stream: cuda.CUstream,
                 use_pdl: cutlass.Constexpr[bool] = False):
        """``max_tiles``: the block table's capacity in 64-token tiles (``capacity_tiles``), for
        ``n_est`` (module docstring)."""
        @cute.struct
        class SharedStorage:  # laid out by smem_views, which the in-grid merge uses as well
            buf: cute.struct.Align[cute.struct.MemRange[Float32, SMEM_BYTES // 4], 16]

        self.shared_storage = SharedStorage
        batch = mNumSplits.shape[0] - 1
        num_parts = mMeta.shape[0]
        mO = self.out_rows(mO)
        n_est = self.n_est(max_tiles, batch, num_parts)
        # Two kernels with 16-bit partials, chosen per launch from the shapes (so a graph keeps its
        # choice): 16 splits per warp and round where requests have many chunks (``wide_above``: fewer
        # rounds and units per slot), 8 where they have fewer (62 registers instead of 98: 8 CTAs of 4 warps
        # per SM instead of 2 of 8 for the big grids of large batches). See ``kernel_loads``, ``kernel_warps``.
        if cutlass.const_expr(self.max_loads > LOADS_NARROW):
            if n_est > self.wide_above:
                self.launch(mOaccum, mLSEaccum, mNumSplits, mMeta, mO, mLSE, stream, use_pdl, n_est, self.max_loads)
            else:
                self.launch(mOaccum, mLSEaccum, mNumSplits, mMeta, mO, mLSE, stream, use_pdl, n_est,
                            LOADS_NARROW)
        else:
            self.launch(mOaccum, mLSEaccum, mNumSplits, mMeta, mO, mLSE, stream, use_pdl, n_est,
                        LOADS_NARROW)

    @cute.jit
    def out_rows(self, mO: cute.Tensor) -> cute.Tensor:
        """out [b, s_q, h_q, 512] as [b, rows, 512]: row s_idx * h_q + head is at s_idx * stride(1) +
        head * stride(2) = row * stride(2), because the API checked stride(1) == h_q * stride(2)."""
        return cute.make_tensor(mO.iterator, cute.make_layout(
            (mO.shape[0], self.rows, HEAD_DIM_V), stride=(mO.stride[0], mO.stride[2], 1)))

    @cute.jit
    def n_est(self, max_tiles: Int32, batch: Int32, num_parts: Int32) -> Int32:
        """``n_est`` as ``estimated_chunks`` computes it from the shapes (host code)."""
        t = cutlass.max(max_tiles, Int32(1))
        b = cutlass.max(batch, Int32(1))
        target = (b * (t + FIXED_COST) + num_parts - 1) // cutlass.max(num_parts, Int32(1))
        n = cutlass.min((t + target - 1) // target, num_parts // b)
        if t > target:  # the aligned plan's chunk sizes under target, where they fit (estimated_chunks)
            found = Int32(0)
            for d in cutlass.range_constexpr(BELOW_TARGET, 0, -1):
                size = cutlass.max(target - d, Int32(1))
                k = (t + size - 1) // size
                if found == 0 and b * k <= num_parts:
                    n = k
                    found = Int32(1)
        return cutlass.max(n, Int32(2))

    @cute.jit
    def in_grid_y(self, max_tiles: Int32, batch: Int32, num_parts: Int32) -> Int32:
        """``Y`` of the in-grid merge (``merge_slot`` run by the decode CTAs after a grid barrier): the
        grid's second extent for ``max_loads`` splits per round, whatever ``n_est``: there the decode
        kernel's one CTA per SM sets the occupancy, not the merge's registers."""
        return self._grid_y(self.n_est(max_tiles, batch, num_parts), self.max_loads, WARPS)

    @cute.jit
    def launch(self, mOaccum, mLSEaccum, mNumSplits, mMeta, mO, mLSE, stream, use_pdl: cutlass.Constexpr[bool],
               n_est: Int32, loads: cutlass.Constexpr[int]):
        warps = kernel_warps(loads, self.max_loads)
        # At most GRID_CTAS CTAs (``grid_y``): the merge's grid-stride loop covers a slot's units with fewer.
        y = cutlass.min(self._grid_y(n_est, loads, warps), cutlass.max(Int32(GRID_CTAS) // mMeta.shape[0], Int32(1)))
        self.kernel(mOaccum, mLSEaccum, mNumSplits, mMeta, mO, mLSE, loads, warps).launch(
            grid=[mMeta.shape[0], y, 1], block=[32 * warps, 1, 1], smem=self.shared_storage.size_in_bytes(),
            stream=stream, use_pdl=use_pdl)

    @cute.jit
    def _grid_y(self, n_est: Int32, loads: cutlass.Constexpr[int], warps: cutlass.Constexpr[int]) -> Int32:
        """CTAs per slot (``grid_y``): units per slot if every request had ``n_est`` chunks."""
        per_unit = warps // self._split_groups(n_est, loads, warps)
        units = (Int32(self.rows * CHUNKS) + per_unit - 1) // per_unit
        return cutlass.max((units + n_est - 2) // (n_est - 1), Int32(1))

    @cute.jit
    def _split_groups(self, n: Int32, loads: cutlass.Constexpr[int], warps: cutlass.Constexpr[int]) -> Int32:
        return Int32(1) << self._split_groups_log2(n, loads, warps)

    @cute.jit
    def _split_groups_log2(self, n: Int32, loads: cutlass.Constexpr[int], warps: cutlass.Constexpr[int]) -> Int32:
        """log2 of ``G`` (``split_groups``), at most log2 of the CTA's ``warps``. The kernel derives ``G``, the
        row-chunks per unit and the units from it with shifts: ``G`` from selects is not known to be a power of
        two, and ptxas divided by it (an I2F / MUFU.RCP / F2I sequence) on the path from the plan's loads to the
        first partial load."""
        lg = Int32(warps.bit_length() - 1)
        if const_expr(warps > 4):
            if n <= 4 * loads:
                lg = Int32(2)
        if const_expr(warps > 2):
            if n <= 2 * loads:
                lg = Int32(1)
        if n <= loads:
            lg = Int32(0)
        return lg

    @cute.kernel
    def kernel(self, mOaccum: cute.Tensor, mLSEaccum: cute.Tensor, mNumSplits: cute.Tensor, mMeta: cute.Tensor,
               mO: cute.Tensor, mLSE: cute.Tensor, loads: cutlass.Constexpr[int], warps: cutlass.Constexpr[int]):
        tidx, _, _ = cute.arch.thread_idx()
        part, cta_y, _ = cute.arch.block_idx()
        _, grid_y, _ = cute.arch.grid_dim()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = tidx % 32
        # The next decode (launched with programmatic dependent launch) may be scheduled now: it waits
        # in its own griddepcontrol.wait for this grid to complete before touching global memory.
        cute.arch.griddepcontrol_launch_dependents()
        # Both plan fields at once (one round trip before the branch, not one on each side of it). ``r >= 0``
        # holds for every plan row (empty parts have 0); in the condition it keeps ptxas from sinking r's
        # load below the branch, where num_splits' loads would wait for a second round trip.
        begin_split = mMeta[part, BEGIN_SPLIT]
        r = mMeta[part, BEGIN_REQ]
        if (begin_split >= 1) & (r >= 0):  # this part begins chunk begin_split of a split request: one of its slots
            storage = cutlass.utils.SmemAllocator().allocate(self.shared_storage)
            sAcc, sM, sS = smem_views(storage.buf.data_ptr())
            self.merge_slot(r, begin_split, cta_y, grid_y, warp, lane, sAcc, sM, sS,
                            mOaccum, mLSEaccum, mNumSplits, mO, mLSE, loads, True, warps)
        elif part == 0 and cta_y == 0:
            # One CTA waits even when it has nothing to merge, so that this grid completes only after
            # the main kernel has: what follows in the stream (the next decode's griddepcontrol.wait,
            # any kernel reading out) then finds every output of the call written, whether or not the
            # hardware orders a dependent grid's completion after its primary's.
            cute.arch.griddepcontrol_wait()

    @cute.jit
    def merge_slot(self, r: Int32, begin_split: Int32, cta_y: Int32, grid_y: Int32, warp: Int32, lane: Int32,
                   sAcc: cute.Tensor, sM: cute.Tensor, sS: cute.Tensor, mOaccum: cute.Tensor, mLSEaccum: cute.Tensor,
                   mNumSplits: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor, loads: cutlass.Constexpr[int],
                   pdl_wait: cutlass.Constexpr[bool], warps: cutlass.Constexpr[int] = WARPS):
        """The merge work of grid cell ``(part, cta_y)`` of a ``[num_parts, grid_y]`` grid whose part
        begins chunk ``begin_split >= 1`` of request ``r`` (module docstring), by the CTA's ``warps`` warps
        (``sAcc`` ``(CHUNK, WARPS)``, ``sM``/``sS`` ``WARPS`` fp32 in shared memory, of which the first
        ``warps`` columns are used). ``mO``: out as ``[b, rows, 512]`` (``out_rows``). ``pdl_wait``: wait for
        the main kernel (griddepcontrol.wait) before the first partial is read; the in-grid merge has waited
        on the grid barrier instead (and runs with the decode CTA's 8 warps)."""
        rows = self.rows
        base = mNumSplits[r]
        n = mNumSplits[r + 1] - base
        slots = n - 1
        slot = begin_split - 1
        lg = self._split_groups_log2(n, loads, warps)
        groups = Int32(1) << lg
        unit_lg = Int32(warps.bit_length() - 1) - lg  # log2 of the row-chunks per unit, warps // groups
        units = (rows * CHUNKS + (Int32(1) << unit_lg) - 1) >> unit_lg
        group = warp & (groups - 1)
        rPart = cute.make_rmem_tensor((LANE_COLS, loads), self.partial_dtype)
        rLse = cute.make_rmem_tensor(loads, Float32)
        acc = cute.make_rmem_tensor(LANE_COLS, Float32)

        if const_expr(pdl_wait):
            cute.arch.griddepcontrol_wait()  # partials and lse_accum come from the main kernel
        for unit in cutlass.range(cta_y * slots + slot, units, grid_y * slots, unroll=1):
            rc = (unit << unit_lg) + (warp >> lg)  # this warp's row-chunk
            # rc >= 0 and CHUNKS is a power of two: shifts, not a signed division's sign fix-up.
            row = rc >> (CHUNKS.bit_length() - 1)
            col0 = (rc & (CHUNKS - 1)) * CHUNK + lane * LANE_COLS
            active = rc < rows * CHUNKS
            # Online softmax over this warp's splits, in log2 units; m = -inf until a split with a key.
            m = -Float32.inf
            total = Float32(0.0)
            acc.fill(0.0)
            if active:
                # Warp ``group`` takes splits [group * L, group * L + L) of each block of G * L
                # splits: consecutive splits, so a round's addresses are one base plus constant
                # offsets (the split stride is static) instead of L 64-bit addresses.
                split_elems = rows * HEAD_DIM_V  # o_accum's split stride (DecodeEntry's layout)
                for i0 in cutlass.range(group * loads, n, groups * loads, unroll=1):
                    # The round's L partial slices: one 64-bit base, static offsets per split.
                    offset = cute.assume(cutlass.Int64(base + i0) * split_elems + Int32(row * HEAD_DIM_V + col0),
                                         divby=LANE_COLS)
                    gRound = cute.make_tensor(mOaccum.iterator + offset, cute.make_layout(
                        (LANE_COLS, loads), stride=(1, split_elems)))
                    # Issue every load of the round (lse and partial) before using any. The lse
                    # values stay in natural-log units until the round's max is known: scaled to
                    # log2 on load, ptxas put each multiply right behind its load, inside the
                    # load's predicate, so every lse load waited for the previous one.
                    for k in cutlass.range_constexpr(loads):
                        i = i0 + k
                        rLse[k] = -Float32.inf
                        if i < n:
                            cute.autovec_copy(gRound[None, k], rPart[None, k])
                            rLse[k] = mLSEaccum[base + i, row]
                    round_max = -Float32.inf
                    for k in cutlass.range_constexpr(loads):
                        round_max = cute.arch.fmax(round_max, rLse[k])
                    m_new = cute.arch.fmax(m, round_max * Float32(LOG2E))
                    if m_new != -Float32.inf:  # else nothing seen yet: acc, total stay 0
                        rescale = cute.math.exp2(m - m_new, fastmath=True)  # 0 when m = -inf
                        total *= rescale
                        for c in cutlass.range_constexpr(LANE_COLS):
                            acc[c] *= rescale
                        for k in cutlass.range_constexpr(loads):
                            if rLse[k] != -Float32.inf:  # a chunk without a key may hold anything
                                w = cute.math.exp2(rLse[k] * Float32(LOG2E) - m_new, fastmath=True)
                                total += w
                                for c in cutlass.range_constexpr(LANE_COLS):
                                    acc[c] += w * Float32(rPart[c, k])
                        m = m_new
            if groups > 1:
                # The row-chunk's warps combine (max, sum, acc) in shared memory.
                for c in cutlass.range_constexpr(LANE_COLS):
                    sAcc[lane * LANE_COLS + c, warp] = acc[c]
                if lane == 0:
                    sM[warp] = m
                    sS[warp] = total
                cute.arch.sync_threads()
                if group == 0:
                    m_all = m
                    for g in cutlass.range(1, groups, unroll=1):
                        m_all = cute.arch.fmax(m_all, sM[warp + g])
                    if m_all != -Float32.inf:
                        scale = cute.math.exp2(m - m_all, fastmath=True)
                        total *= scale
                        for c in cutlass.range_constexpr(LANE_COLS):
                            acc[c] *= scale
                        for g in cutlass.range(1, groups, unroll=1):
                            scale_g = cute.math.exp2(sM[warp + g] - m_all, fastmath=True)
                            total += scale_g * sS[warp + g]
                            for c in cutlass.range_constexpr(LANE_COLS):
                                acc[c] += scale_g * sAcc[lane * LANE_COLS + c, warp + g]
                    m = m_all
                cute.arch.sync_threads()  # shared memory is rewritten by the next unit
            if active and group == 0:
                # Normalise and store; a row with no key in any chunk gets out 0, lse +inf.
                inv = Float32(0.0)
                lse = Float32.inf
                if total > Float32(0.0):
                    inv = Float32(1.0) / total
                    lse = (m + cute.math.log2(total, fastmath=True)) * Float32(LN2)
                rOut = cute.make_rmem_tensor(LANE_COLS, mO.element_type)
                for c in cutlass.range_constexpr(LANE_COLS):
                    rOut[c] = (acc[c] * inv).to(mO.element_type)
                cute.autovec_copy(rOut, cute.local_tile(mO[r, row, None], (LANE_COLS,), (col0 // LANE_COLS,)))
                if (rc & (CHUNKS - 1)) == 0:
                    if lane == 0:
                        mLSE[r, row % self.h_q, row // self.h_q] = lse

    @cute.jit
    def merge_rows(self, r: Int32, row0: Int32, mtidx: Int32, nthreads: cutlass.Constexpr[int],
                   bar_id: cutlass.Constexpr[int], buf_ptr, buf_bytes: cutlass.Constexpr[int],
                   mOaccum: cute.Tensor, mLSEaccum: cute.Tensor, mNumSplits: cute.Tensor, mO: cute.Tensor,
                   mLSE: cute.Tensor):
        """Merge rows ``row0 .. row0 + 63`` (those below ``rows``) of split request ``r``: the merge by a request's
        last chunk (``split_k.last_chunk``), run by the ``nthreads`` threads of the decode CTA that stored the
        last partial (``mtidx``: this thread's index among them; named barrier ``bar_id`` of them), in the
        shared memory at ``buf_ptr`` (``buf_bytes``, 16-byte aligned, free: the decode's stages).

        The rows go in batches of ``pb`` (64 where the request's ``n`` partial blocks fit the buffer, else the
        largest power of two that fits; ``rows_per_batch``). Per batch:
        1. every thread issues cp.async copies of its share of the ``n`` partials' ``pb`` rows into shared memory;
           the first ``pb`` threads take a row each: its ``n`` lse values (loaded ``LSE_LOADS`` at a time), their
           max and sum, the weights ``exp(lse_k - lse)`` into shared memory and the row's lse into ``lse``
           (+inf and weights 0 for a row without any key);
        2. once the copies landed (and a barrier), each thread sums ``w_k * partial_k`` for its 8-column groups
           and stores them (16 bytes of ``out`` each).
        Why staged: the same merge with every load in registers, unrolled over 8 half rows and 2 splits per
        warp, ran 10-14 us slower at 2 chunks per request than the merge kernel (paired on an H100,
        docs/perf-notes.md, forty-fifth session); here the copies are in flight together from a small loop and
        the sums read shared memory."""
        rows = self.rows
        base = mNumSplits[r]
        n = mNumSplits[r + 1] - base
        nrows = cutlass.min(rows - row0, Int32(BLOCK_M_ROWS))
        pbytes = const_expr(self.partial_dtype.width // 8)
        vec = const_expr(16 // pbytes)  # partial elements per 16-byte copy
        pieces = const_expr(ROW_LANE_COLS // vec)  # copies per 8-column group
        groups = HEAD_DIM_V // ROW_LANE_COLS  # 8-column groups per row
        row_elems = const_expr(HEAD_DIM_V)
        pb = rows_per_batch(n, pbytes, buf_bytes)
        # Stage k, row i of the batch at element (k * pb + i) * 512; the weights after the n * pb rows.
        sStage = cute.make_tensor(cute.recast_ptr(buf_ptr, dtype=self.partial_dtype),
                                  cute.make_layout(buf_bytes // pbytes))
        sW = cute.make_tensor(cute.recast_ptr(buf_ptr, dtype=Float32) + n * pb * (row_elems * pbytes // 4),
                              cute.make_layout(buf_bytes // 4))
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL),
                                   self.partial_dtype, num_bits_per_copy=128)
        rL = cute.make_rmem_tensor(LSE_LOADS, Float32)
        acc = cute.make_rmem_tensor(ROW_LANE_COLS, Float32)
        rPart = cute.make_rmem_tensor(ROW_LANE_COLS, self.partial_dtype)
        rOut = cute.make_rmem_tensor(ROW_LANE_COLS, mO.element_type)
        for b0 in cutlass.range(0, nrows, pb, unroll=1):
            brows = cutlass.min(nrows - b0, pb)
            # The buffer may still be read by the previous batch or merge of this CTA.
            cute.arch.sync_warp()  # (threads of a warp branch apart in the loops and row work before)
            cute.arch.barrier(barrier_id=bar_id, number_of_threads=nthreads)
            copies = brows * groups * pieces
            for k in cutlass.range(n, unroll=1):
                for p in cutlass.range(mtidx, copies, nthreads, unroll=1):
                    i = p // (groups * pieces)
                    c = p - i * (groups * pieces)
                    dst = cute.make_tensor(sStage.iterator + cute.assume((k * pb + i) * row_elems + c * vec, divby=vec),
                                           cute.make_layout(vec))
                    cute.copy(atom, cute.local_tile(mOaccum[base + k, row0 + b0 + i, None], (vec,), (c,)), dst)
            cute.arch.cp_async_commit_group()
            if mtidx < brows:
                row = row0 + b0 + mtidx
                # The lse values LSE_LOADS at a time (one round trip each), in log2 units into the weights' slots.
                mx = -Float32.inf
                for k0 in cutlass.range(0, n, LSE_LOADS, unroll=1):
                    for j in cutlass.range_constexpr(LSE_LOADS):
                        rL[j] = -Float32.inf
                        if k0 + j < n:
                            rL[j] = mLSEaccum[base + k0 + j, row]
                    for j in cutlass.range_constexpr(LSE_LOADS):
                        if k0 + j < n:
                            sW[(k0 + j) * pb + mtidx] = rL[j] * Float32(LOG2E)
                            mx = cute.arch.fmax(mx, rL[j] * Float32(LOG2E))
                total = Float32(0.0)
                if mx != -Float32.inf:  # (else no chunk saw a key: every weight 0)
                    for k in cutlass.range(n, unroll=1):
                        w = cute.math.exp2(sW[k * pb + mtidx] - mx, fastmath=True)
                        sW[k * pb + mtidx] = w
                        total += w
                lse = Float32.inf
                inv = Float32(0.0)
                if total > Float32(0.0):
                    inv = Float32(1.0) / total
                    lse = (mx + cute.math.log2(total, fastmath=True)) * Float32(LN2)
                for k in cutlass.range(n, unroll=1):
                    w = Float32(0.0)  # (no chunk saw a key: the weights still hold -inf lse, and -inf * 0 is NaN)
                    if total > Float32(0.0):
                        w = sW[k * pb + mtidx] * inv
                    sW[k * pb + mtidx] = w
                mLSE[r, row % self.h_q, row // self.h_q] = lse
            cute.arch.cp_async_wait_group(0)
            cute.arch.sync_warp()  # (threads of a warp branch apart in the loops and row work before)
            cute.arch.barrier(barrier_id=bar_id, number_of_threads=nthreads)
            for u in cutlass.range(mtidx, brows * groups, nthreads, unroll=1):
                i = u // groups
                g = u - i * groups
                acc.fill(0.0)
                for k in cutlass.range(n, unroll=1):
                    w = sW[k * pb + i]
                    src = cute.make_tensor(
                        sStage.iterator + cute.assume((k * pb + i) * row_elems + g * ROW_LANE_COLS, divby=ROW_LANE_COLS),
                        cute.make_layout(ROW_LANE_COLS))
                    cute.autovec_copy(src, rPart)
                    for c in cutlass.range_constexpr(ROW_LANE_COLS):
                        acc[c] += w * Float32(rPart[c])
                for c in cutlass.range_constexpr(ROW_LANE_COLS):
                    rOut[c] = acc[c].to(mO.element_type)
                cute.autovec_copy(rOut, cute.local_tile(mO[r, row0 + b0 + i, None], (ROW_LANE_COLS,), (g,)))
