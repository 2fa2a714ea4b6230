"""Online softmax in base 2 for one warpgroup's 64-row score tile.

Each thread of a wgmma accumulator holds 2 rows; the 4 threads of a quad share a row, so row
reductions are a quad shuffle. Scores stay unscaled in the accumulator; the softmax scale is folded
into the exp2 argument (``scale_log2 = softmax_scale * log2(e)``), one FFMA per element.
"""
from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

LN2 = math.log(2.0)
LAZY_RESCALE_LOG2 = 8.0
"""Lazy rescaling: the running max a row's probabilities are taken against moves up only when a tile's
max exceeds it by more than this (in log2 units, a factor of 256). Below that the stale max stays:
P = exp2(s - m_used) is at most 256 (exact in bf16's exponent range; O and the row sum are fp32), and
the output, rescaled by nothing, needs no FMUL pass. The row's final lse is taken against the same
max, so the result is the same softmax. After the first tiles of a request the max rarely grows by
that much, so O is almost never rescaled."""


@cute.jit
def online_softmax_step(s_mn: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor,
                        row_scale: cute.Tensor, scale_log2: Float32, lazy: cutlass.Constexpr[bool] = False,
                        tree: cutlass.Constexpr[bool] = False):
    """Turn scores ``s_mn`` (rows x cols view, in place) into unnormalised probabilities.

    Updates the running ``row_max`` (raw score units) and the thread-partial ``row_sum``, and writes
    into ``row_scale`` the factor by which earlier output rows must be multiplied.
    A row whose scores are all -inf so far keeps max -inf; its probabilities are exactly 0 and its
    factor 1 (it is computed against a max of 0 to avoid inf - inf).
    ``lazy``: keep the previous max unless the new one exceeds it by more than ``LAZY_RESCALE_LOG2``
    (then ``row_scale`` is exactly 1; see ``rescale_rows_if_needed``).
    ``tree``: the thread's row max as a pairwise tree (log2 depth) instead of one chain (same value:
    max is exact).
    """
    for i in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
        m_prev = row_max[i]
        m_new = cute.arch.warp_reduction_max(_thread_row_max(s_mn, i, tree, m_prev), threads_in_group=4)
        row_max[i], row_scale[i], row_sum[i] = settle_max(s_mn[i, None], m_prev, m_new, row_sum[i], scale_log2,
                                                          lazy)


@cute.jit
def tile_row_max(s_mn: cute.Tensor, out: cute.Tensor, tree: cutlass.Constexpr[bool] = False):
    """Each row's max over the scores ``s_mn`` alone (reduced over the quad that shares the row), for an
    ``online_softmax_step_from`` once the running max is known: max is exact, so the step gives what
    ``online_softmax_step`` gives."""
    for i in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
        out[i] = cute.arch.warp_reduction_max(_thread_row_max(s_mn, i, tree), threads_in_group=4)


@cute.jit
def online_softmax_step_from(s_mn: cute.Tensor, tile_max: cute.Tensor, row_max: cute.Tensor,
                             row_sum: cute.Tensor, row_scale: cute.Tensor, scale_log2: Float32,
                             lazy: cutlass.Constexpr[bool] = False):
    """``online_softmax_step`` with the rows' maxima over ``s_mn`` already taken (``tile_row_max``)."""
    for i in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
        m_prev = row_max[i]
        m_new = cute.arch.fmax(m_prev, tile_max[i])
        row_max[i], row_scale[i], row_sum[i] = settle_max(s_mn[i, None], m_prev, m_new, row_sum[i], scale_log2,
                                                          lazy)


def _thread_row_max(s_mn: cute.Tensor, i: int, tree: bool, init=None):
    """This thread's max over row ``i`` of ``s_mn`` (and ``init``, if given): a pairwise tree (``init`` last) or
    one chain (``init`` first). Plain Python, run while tracing like ``_tree_max``."""
    vals = [s_mn[i, j] for j in range(cute.size(s_mn, mode=[1]))]
    if tree:
        return _tree_max(vals if init is None else vals + [init])
    m = vals[0] if init is None else init
    for v in (vals[1:] if init is None else vals):
        m = cute.arch.fmax(m, v)
    return m


def _tree_max(vals: list):
    """max of ``vals`` as a pairwise tree (plain Python, run while tracing: the DSL rewrites the control
    flow of jit functions only)."""
    while len(vals) > 1:
        pairs = [cute.arch.fmax(vals[k], vals[k + 1]) for k in range(0, len(vals) - 1, 2)]
        vals = pairs + vals[len(pairs) * 2:]
    return vals[0]


@cute.jit
def settle_max(scores: cute.Tensor, m_prev: Float32, m_new: Float32, sum_prev: Float32, scale_log2: Float32,
               lazy: cutlass.Constexpr[bool]):
    """One row's online softmax step once its new max is known (``m_new``: the max over the previous
    max and every holder of the row's scores): ``scores`` (this thread's share of the row, in place)
    become unnormalised probabilities. Returns ``(max kept, factor for the earlier output, the
    thread-partial sum)``; with ``lazy`` the previous max is kept unless ``m_new`` exceeds it by more
    than ``LAZY_RESCALE_LOG2``. A row with max -inf so far gets probabilities 0 and factor 1 (taken
    against a max of 0, to avoid inf - inf)."""
    if const_expr(lazy):
        # (-inf - -inf is NaN: the comparison is false and the max stays -inf, as it should.)
        if (m_new - m_prev) * scale_log2 <= Float32(LAZY_RESCALE_LOG2):
            m_new = m_prev
    m_safe = m_new
    if m_new == -Float32.inf:
        m_safe = Float32(0.0)
    m_scaled = m_safe * scale_log2
    factor = cute.math.exp2(m_prev * scale_log2 - m_scaled, fastmath=True)
    acc = Float32(0.0)
    for j in cutlass.range_constexpr(cute.size(scores)):
        p = cute.math.exp2(scores[j] * scale_log2 - m_scaled, fastmath=True)
        scores[j] = p
        acc += p
    return m_new, factor, sum_prev * factor + acc


@cute.jit
def rescale_rows(o_mn: cute.Tensor, row_scale: cute.Tensor):
    """Multiply each row of an output accumulator view by its factor."""
    for i in cutlass.range_constexpr(cute.size(o_mn, mode=[0])):
        f = row_scale[i]
        for j in cutlass.range_constexpr(cute.size(o_mn, mode=[1])):
            o_mn[i, j] = o_mn[i, j] * f


@cute.jit
def warp_needs_rescale(row_scale: cute.Tensor):
    """Whether any thread of the warp has a factor other than exactly 1 (warp-uniform)."""
    need = False
    for i in cutlass.range_constexpr(cute.size(row_scale, mode=[0])):
        need = need or row_scale[i] != Float32(1.0)
    return cute.arch.vote_any_sync(need)


@cute.jit
def rescale_rows_if_needed(o_mn: cute.Tensor, row_scale: cute.Tensor):
    """``rescale_rows``, skipped by a whole warp when every factor of its threads is exactly 1 (the
    common case with lazy rescaling): 128 FMULs per thread less on the softmax warpgroup's path."""
    if warp_needs_rescale(row_scale):
        rescale_rows(o_mn, row_scale)


@cute.jit
def finalize_rows(row_max: cute.Tensor, row_sum: cute.Tensor, row_inv: cute.Tensor,
                  row_lse: cute.Tensor, scale_log2: Float32, empty_lse: Float32):
    """Reduce the row sums over the quad; give 1/sum and the natural-log lse of each row.

    A row that saw no key (sum 0) gets inv 0 (so its output is 0) and lse ``empty_lse``
    (+inf for a final output, -inf for a split partial so the merge weights it 0).
    """
    for i in cutlass.range_constexpr(cute.size(row_sum, mode=[0])):
        s = cute.arch.warp_reduction_sum(row_sum[i], threads_in_group=4)
        inv = Float32(0.0)
        lse = empty_lse
        if s > Float32(0.0):
            inv = cute.arch.rcp_approx(s)
            lse = (row_max[i] * scale_log2 + cute.math.log2(s, fastmath=True)) * Float32(LN2)
        row_inv[i] = inv
        row_lse[i] = lse


@cute.jit
def raise_max(row_max: cute.Tensor, row_sum: cute.Tensor, row_scale: cute.Tensor, new_max: cute.Tensor,
              scale_log2: Float32):
    """Move the running max up to ``new_max`` (>= ``row_max``, per row) with no new scores: rescale the
    thread-partial ``row_sum`` and give in ``row_scale`` the factor for the output rows (a row that has
    seen no key keeps sum 0 and output 0 whatever the factor)."""
    for i in cutlass.range_constexpr(cute.size(row_max, mode=[0])):
        m_new = new_max[i]
        m_safe = m_new
        if m_new == -Float32.inf:
            m_safe = Float32(0.0)
        factor = cute.math.exp2(row_max[i] * scale_log2 - m_safe * scale_log2, fastmath=True)
        row_scale[i] = factor
        row_sum[i] = row_sum[i] * factor
        row_max[i] = m_new
