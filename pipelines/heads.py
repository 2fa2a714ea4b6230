"""Query rows of one kv head: how the kernels see q when several query heads share a kv head.

Pure torch / Python (no DSL import), so the mapping is testable on the CPU.

A CTA works on the query rows of one request and one kv head ``g``: the ``heads_per_kv = h_q // h_kv``
query heads ``g * heads_per_kv + j`` of every query token ``s_idx``, as rows
``row = s_idx * heads_per_kv + j`` (FlashMLA's grouping). With one kv head these are exactly the rows
of ``q[b].view(s_q * h_q, 576)``, so q is used in place. With several, the rows of one kv head are
not one strided run when ``s_q > 1`` (token-major ``[s_q, h_q]``), which a TMA box needs, so the API
first copies q into ``[b, h_kv, rows, 576]`` (``group_queries``). Outputs need no copy: the kernels
write row ``row`` of kv head ``g`` to ``out[b, s_idx, head]`` (``row_to_head``) through a strided view.
"""
from __future__ import annotations


def row_to_head(row: int, kv_head: int, heads_per_kv: int) -> tuple[int, int]:
    """``(s_idx, query head)`` of row ``row`` of kv head ``kv_head``."""
    s_idx, j = divmod(row, heads_per_kv)
    return s_idx, kv_head * heads_per_kv + j


def group_queries(q, h_kv: int):
    """``q [b, s_q, h_q, d]`` -> the kernels' Q input: q itself when ``h_kv == 1``, else a copy
    ``[b, h_kv, s_q * h_q // h_kv, d]`` whose ``[:, g, row]`` is the query of ``row_to_head(row, g, .)``."""
    if h_kv == 1:
        return q
    b, s_q, h_q, d = q.shape
    hpg = h_q // h_kv
    # Splitting the head dim is always a view; the transpose + reshape makes the (one) copy.
    return q.view(b, s_q, h_kv, hpg, d).transpose(1, 2).reshape(b, h_kv, s_q * hpg, d)
