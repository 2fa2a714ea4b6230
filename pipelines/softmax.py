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


@cute.jit
def online_softmax_step(s_mn: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor,
                        row_scale: cute.Tensor, scale_log2: Float32, floor_max=None):
    """Turn scores ``s_mn`` (rows x cols view, in place) into unnormalised probabilities.

    Updates the running ``row_max`` (raw score units) and the thread-partial ``row_sum``, and writes
    into ``row_scale`` the factor by which earlier output rows must be multiplied.
    A row whose scores are all -inf so far keeps max -inf; its probabilities are exactly 0 and its
    factor 1 (it is computed against a max of 0 to avoid inf - inf).
    ``floor_max`` (optional, per row): the new max is at least this (the seesaw schedule's second
    tile takes the first tile's max into account, so both tiles end on one max).
    """
    for i in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
        m_prev = row_max[i]
        m_new = m_prev
        if const_expr(floor_max is not None):
            m_new = cute.arch.fmax(m_new, floor_max[i])
        for j in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
            m_new = cute.arch.fmax(m_new, s_mn[i, j])
        m_new = cute.arch.warp_reduction_max(m_new, threads_in_group=4)
        m_safe = m_new
        if m_new == -Float32.inf:
            m_safe = Float32(0.0)
        m_scaled = m_safe * scale_log2
        factor = cute.math.exp2(m_prev * scale_log2 - m_scaled, fastmath=True)
        row_scale[i] = factor
        row_max[i] = m_new
        acc = Float32(0.0)
        for j in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
            p = cute.math.exp2(s_mn[i, j] * scale_log2 - m_scaled, fastmath=True)
            s_mn[i, j] = p
            acc += p
        row_sum[i] = row_sum[i] * factor + acc


@cute.jit
def rescale_rows(o_mn: cute.Tensor, row_scale: cute.Tensor):
    """Multiply each row of an output accumulator view by its factor."""
    for i in cutlass.range_constexpr(cute.size(o_mn, mode=[0])):
        f = row_scale[i]
        for j in cutlass.range_constexpr(cute.size(o_mn, mode=[1])):
            o_mn[i, j] = o_mn[i, j] * f


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
