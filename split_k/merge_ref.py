"""Split-kv merge math in torch: the reference the merge kernel is checked against.

A chunk of a request's keys gives, for each query row, a normalised partial output ``o_i``
(``softmax`` over the chunk's keys times V) and the chunk's log-sum-exp ``lse_i`` (natural log of the
sum of ``exp(scale * q.k)`` over the chunk's keys, ``-inf`` when the row saw no key in the chunk).
The full-range result is

    lse = log(sum_i exp(lse_i))            (computed as m + log(sum_i exp(lse_i - m)), m = max_i lse_i)
    o   = sum_i exp(lse_i - lse) * o_i

A row whose every partial is ``-inf`` saw no key at all: it gets ``o = 0`` and ``lse = +inf``
(the empty-row convention of ``docs/interfaces.md``, FlashMLA's).
"""
from __future__ import annotations

import torch


def merge_partials(o_partials: torch.Tensor, lse_partials: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine ``n`` partial results of the same rows by their lse.

    Args:
        o_partials: ``[n, *rows, dv]`` floating point, partial outputs (any value where the
            matching lse is ``-inf``: such partials get weight 0, even if they hold NaN).
        lse_partials: ``[n, *rows]`` floating point, natural-log lse per partial; finite or ``-inf``.

    Returns:
        ``(o, lse)``: fp32 ``[*rows, dv]`` and fp32 ``[*rows]``. Rows with no key in any partial:
        ``o = 0``, ``lse = +inf``.
    """
    if o_partials.dim() < 2 or o_partials.shape[:-1] != lse_partials.shape:
        raise ValueError(f"o_partials must be [n, *rows, dv] and lse_partials [n, *rows], got "
                         f"{tuple(o_partials.shape)} and {tuple(lse_partials.shape)}")
    if o_partials.shape[0] == 0:
        raise ValueError("need at least one partial")
    lse_partials = lse_partials.float()
    if torch.isnan(lse_partials).any() or torch.isposinf(lse_partials).any():
        raise ValueError("partial lse must be finite or -inf (+inf marks a final empty row, not a partial)")

    lse_max = lse_partials.max(dim=0).values
    empty = torch.isneginf(lse_max)
    # Shift by the max so exp() cannot overflow; empty rows shift by 0 so that -inf - 0 = -inf.
    shift = torch.where(empty, torch.zeros_like(lse_max), lse_max)
    weights = torch.exp(lse_partials - shift)  # exp(-inf) = 0 for chunks that saw no key
    total = weights.sum(dim=0)
    lse = torch.where(empty, torch.full_like(lse_max, float("inf")), torch.log(total) + shift)
    scale = torch.where(empty, torch.zeros_like(total), weights / torch.where(empty, torch.ones_like(total), total))
    # where() instead of a plain product: 0 * NaN is NaN, and unused partials may hold garbage.
    contrib = torch.where(scale.unsqueeze(-1) > 0, o_partials.float() * scale.unsqueeze(-1), 0.0)
    return contrib.sum(dim=0), lse


def merge_workspace(o_accum: torch.Tensor, lse_accum: torch.Tensor, num_splits: torch.Tensor,
                    out: torch.Tensor, lse: torch.Tensor) -> None:
    """Do what the merge stage does: write the merged result of every *split* request into out/lse.

    Args:
        o_accum: fp32 ``[>= num_splits[b], rows, dv]`` partial outputs, row ``s_idx * h_q + head``.
        lse_accum: fp32 ``[>= num_splits[b], rows]`` partial lse (natural log, ``-inf`` = no key).
        num_splits: int ``[b + 1]`` prefix sum of chunks per request (``split_k.planner``).
        out: ``[b, s_q, h_q, dv]``, written in place (cast to its dtype) for split requests only.
        lse: fp32 ``[b, h_q, s_q]``, written in place for split requests only.

    Requests with a single chunk are left untouched: their CTA wrote out/lse directly.
    """
    b, s_q, h_q, dv = out.shape
    bounds = num_splits.tolist()
    if len(bounds) != b + 1:
        raise ValueError(f"num_splits must have b + 1 = {b + 1} entries, got {len(bounds)}")
    for r in range(b):
        first, stop = bounds[r], bounds[r + 1]
        if stop - first < 2:
            continue
        o, row_lse = merge_partials(o_accum[first:stop], lse_accum[first:stop])
        out[r].copy_(o.reshape(s_q, h_q, dv))
        lse[r].copy_(row_lse.reshape(s_q, h_q).transpose(0, 1))
