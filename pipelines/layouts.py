"""Layout helpers shared by the pipeline variants: shared-memory tiles and register-fragment views.

All of these run at trace time (they build layouts, no device code of their own).
"""
from __future__ import annotations

import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90
from cutlass.cute.nvgpu import warpgroup
from cutlass.tensor_utils import LayoutEnum


def smem_tile_layout(dtype, rows: int, cols: int, stages: int | None = None):
    """Row-major (K-major for wgmma) swizzled smem layout of a ``rows x cols`` tile, optionally staged.

    The swizzle atom is chosen from the column count (128B swizzle for >= 64 bf16 columns), which is
    also what the TMA box and the wgmma descriptors expect.
    """
    atom = warpgroup.make_smem_layout_atom(sm90.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dtype, cols), dtype)
    if stages is None:
        return cute.tile_to_shape(atom, (rows, cols), order=(0, 1))
    return cute.tile_to_shape(atom, (rows, cols, stages), order=(0, 1, 2))


def v_view_layout(k_outer: cute.Layout, n_cols: int, tile_n: int, head_dim: int, stages: int):
    """Layout of ``V^T`` (``n_cols`` value dims x ``tile_n`` tokens x stages) read from the K tile.

    V is the first 512 columns of the K tile, so no copy is made: composing the K tile's
    (token, dim, stage) layout with a transposing map gives an MN-major B operand for P.V
    (the 128B-swizzled K-major atom of 8 tokens x 64 dims is, byte for byte, the MN-major atom of
    64 dims x 8 tokens). A column offset is applied by the caller by advancing the pointer by
    ``col0 * tile_n`` elements, a multiple of the 1 KB swizzle period when col0 % 64 == 0.
    """
    return cute.composition(
        k_outer, cute.make_layout((n_cols, tile_n, stages), stride=(tile_n, 1, tile_n * head_dim))
    )


def acc_mn_view(acc: cute.Tensor) -> cute.Tensor:
    """View an sm90 wgmma accumulator ((2, 2, V), MMA_M, MMA_N) as (rows, cols) of this thread.

    Mode 0 of the accumulator is (column pair, row half, column group of 8); rows are
    (row half, MMA_M) and columns (pair, group, MMA_N).
    """
    lay = cute.make_layout(acc.layout.shape)  # column-major index space of the fragment
    s, d = lay.shape, lay.stride
    mn = cute.make_layout(
        ((s[0][1], s[1]), (s[0][0], s[0][2], s[2])),
        stride=((d[0][1], d[1]), (d[0][0], d[0][2], d[2])),
    )
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, mn))


def transposed(t: cute.Tensor) -> cute.Tensor:
    """The same (rows, cols) register view with its two modes swapped: ``transposed(t)[j, i] is t[i, j]``
    (the row helpers of ``pipelines.softmax`` then serve a transposed accumulator's columns)."""
    return cute.make_tensor(t.iterator, cute.select(t.layout, mode=[1, 0]))


def acc_as_a_operand(acc: cute.Tensor) -> cute.Tensor:
    """Re-view a 16-bit copy of a QK accumulator ((2, 2, N/8), M, 1) as the A operand of an RS wgmma.

    The register order of a wgmma C fragment for 8 consecutive columns equals the order the A
    fragment expects for k16, so only the grouping changes: ((2, 2, 2), M, (N/16, 1)).
    """
    lay = acc.layout
    div = cute.logical_divide(lay, ((None, None, 2), None, None))
    s, d = div.shape, div.stride
    a = cute.make_layout(
        ((s[0][0], s[0][1], s[0][2][0]), s[1], (s[0][2][1], s[2])),
        stride=((d[0][0], d[0][1], d[0][2][0]), d[1], (d[0][2][1], d[2])),
    )
    return cute.make_tensor(acc.iterator, a)
