"""fp32 reference for MLA paged decode, on CPU or GPU.

Semantics (the same as the kernels', see ``docs/interfaces.md``):

- ``q [b, s_q, h_q, 576]``, ``k_cache [num_pages, page_size, h_kv, 576]``; V is the first
  ``head_dim_v`` (512) columns of K. Token ``t`` of request ``r`` lives at
  ``k_cache[block_table[r, t // page_size], t % page_size]``; only tokens ``t < cache_seqlens[r]``
  are read, so unused slots and unused block_table entries may hold anything (NaN, huge ids).
- Query head ``h`` reads kv head ``h // (h_q // h_kv)`` (the reference supports ``h_kv > 1``).
- ``softmax_scale`` defaults to ``576 ** -0.5``; ``lse`` is the natural log of
  ``sum exp(softmax_scale * q.k)`` over the visible keys.
- ``causal`` is aligned bottom-right: query token ``i`` of ``s_q`` sees keys
  ``[0, seqlen - (s_q - 1 - i))``, so with ``s_q > 1`` the first query tokens may see no key.
- A query row that sees no key (zero-length request, or a causal row before the first key) gets
  ``out = 0`` and ``lse = +inf`` (FlashMLA's convention). Partial results over a key range
  (``request_partial``) use ``lse = -inf`` for such rows instead, which is what the merge expects.

Everything is computed in fp32 whatever the input dtype, one request at a time (host loop; the
lengths are read to the host).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from split_k import merge_ref, planner

HEAD_DIM_QK = 576
HEAD_DIM_V = 512


def default_softmax_scale() -> float:
    """``576 ** -0.5``, FlashMLA's default (1/sqrt of the QK head dim)."""
    return HEAD_DIM_QK ** -0.5


def _check_shapes(q, k_cache, block_table, cache_seqlens, head_dim_v):
    if q.dim() != 4 or k_cache.dim() != 4:
        raise ValueError(f"q must be [b, s_q, h_q, d] and k_cache [num_pages, page_size, h_kv, d], got "
                         f"{tuple(q.shape)} and {tuple(k_cache.shape)}")
    b, _, h_q, d = q.shape
    h_kv = k_cache.shape[2]
    if k_cache.shape[3] != d:
        raise ValueError(f"q and k_cache head dims differ: {d} vs {k_cache.shape[3]}")
    if not 0 < head_dim_v <= d:
        raise ValueError(f"head_dim_v must be in 1..{d}, got {head_dim_v}")
    if h_kv < 1 or h_q % h_kv:
        raise ValueError(f"h_q ({h_q}) must be a multiple of h_kv ({h_kv})")
    if block_table.dim() != 2 or block_table.shape[0] != b or tuple(cache_seqlens.shape) != (b,):
        raise ValueError(f"block_table must be [b={b}, max_pages] and cache_seqlens [b], got "
                         f"{tuple(block_table.shape)} and {tuple(cache_seqlens.shape)}")


def request_partial(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor, seqlen: int,
                    req: int, begin: int, end: int, *, head_dim_v: int = HEAD_DIM_V,
                    softmax_scale: float | None = None, causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of request ``req``'s queries over its keys ``[begin, min(end, seqlen))``.

    Args:
        q, k_cache, block_table: as in ``mla_decode_reference``.
        seqlen: the request's key count (``cache_seqlens[req]``); positions for the causal mask are
            absolute, so a chunk sees exactly the keys the full range would show it.

    Returns:
        ``(o, lse)``: fp32 ``[s_q, h_q, head_dim_v]`` normalised over the chunk, and fp32
        ``[h_q, s_q]`` natural-log lse; rows with no visible key in the chunk: ``o = 0``,
        ``lse = -inf``.
    """
    _, s_q, h_q, d = q.shape
    page_size, h_kv = k_cache.shape[1], k_cache.shape[2]
    scale = default_softmax_scale() if softmax_scale is None else float(softmax_scale)
    device = q.device
    end = min(end, seqlen)
    begin = max(begin, 0)
    n = max(end - begin, 0)
    if n and (end - 1) // page_size >= block_table.shape[1]:
        raise ValueError(f"block_table has {block_table.shape[1]} pages per request but request {req} "
                         f"needs {-(-seqlen // page_size)} (seqlen {seqlen}, page_size {page_size})")
    pos = torch.arange(begin, end, device=device)
    pages = block_table[req].to(device=device, dtype=torch.long)[pos // page_size]
    keys = k_cache[pages, pos % page_size].float()                     # [n, h_kv, d]
    keys = keys.repeat_interleave(h_q // h_kv, dim=1)                  # [n, h_q, d]
    scores = torch.einsum("shd,nhd->shn", q[req].float(), keys) * scale  # [s_q, h_q, n]
    if causal:
        # Query token i sees keys t < seqlen - (s_q - 1 - i) (bottom-right aligned).
        limit = seqlen - (s_q - 1) + torch.arange(s_q, device=device)
        visible = pos.view(1, n) < limit.view(s_q, 1)                   # [s_q, n]
        scores = scores.masked_fill(~visible.view(s_q, 1, n), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1) if n else torch.full((s_q, h_q), float("-inf"), device=device)
    empty = torch.isneginf(lse)
    # Rows with no key: subtract 0 instead of -inf so that exp() gives 0, not NaN.
    probs = torch.exp(scores - torch.where(empty, torch.zeros_like(lse), lse).unsqueeze(-1))
    o = torch.einsum("shn,nhd->shd", probs, keys[..., :head_dim_v])
    return o, lse.transpose(0, 1).contiguous()


def mla_decode_reference(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                         cache_seqlens: torch.Tensor, head_dim_v: int = HEAD_DIM_V,
                         softmax_scale: float | None = None, causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged MLA decode in fp32 (CPU or GPU, any float dtype, any page size, ``h_kv >= 1``).

    Args:
        q: ``[b, s_q, h_q, d]`` (d = 576 for MLA).
        k_cache: ``[num_pages, page_size, h_kv, d]``, same device as q.
        block_table: int ``[b, max_pages]``; entries past a request's last page are never read.
        cache_seqlens: int ``[b]`` key counts (0 allowed); read to the host.
        head_dim_v: V width, the first ``head_dim_v`` columns of K (512).
        softmax_scale: defaults to ``d ** -0.5`` with d = 576.
        causal: bottom-right aligned causal mask (matters for ``s_q > 1``).

    Returns:
        ``(out, lse)``: fp32 ``[b, s_q, h_q, head_dim_v]`` and fp32 ``[b, h_q, s_q]``; rows that see
        no key: ``out = 0``, ``lse = +inf``.
    """
    _check_shapes(q, k_cache, block_table, cache_seqlens, head_dim_v)
    b, s_q, h_q, _ = q.shape
    out = torch.empty(b, s_q, h_q, head_dim_v, dtype=torch.float32, device=q.device)
    lse = torch.empty(b, h_q, s_q, dtype=torch.float32, device=q.device)
    for r, seqlen in enumerate(planner.host_lengths(cache_seqlens, "cache_seqlens")):
        out[r], lse[r] = request_partial(q, k_cache, block_table, seqlen, r, 0, seqlen, head_dim_v=head_dim_v,
                                         softmax_scale=softmax_scale, causal=causal)
    lse[torch.isneginf(lse)] = float("inf")
    return out, lse


def split_decode_reference(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                           cache_seqlens: torch.Tensor, tile_scheduler_metadata: torch.Tensor,
                           num_splits: torch.Tensor, head_dim_v: int = HEAD_DIM_V,
                           softmax_scale: float | None = None, causal: bool = False,
                           block_n: int = planner.BLOCK_N):
    """Execute a split plan the way the kernels do, in fp32 torch: the contract's executable model.

    Walks every part's chunks (``split_k.planner.part_chunks``), computes each chunk with
    ``request_partial``, writes a not-split request's result straight into out/lse (empty rows:
    ``out = 0``, ``lse = +inf``) and a split request's chunk into workspace row
    ``num_splits[r] + split`` (row order ``s_idx * h_q + head``, whatever ``h_kv``: every kv head
    walks the same plan and writes its own query heads' rows), then merges with
    ``split_k.merge_ref.merge_workspace``.

    Raises ``ValueError`` when the plan breaks the contract in a way visible here: a chunk index
    outside its request's ``num_splits`` range, a workspace row or a not-split request written
    twice, or a request some of whose chunks are missing.

    Returns:
        ``(out, lse, o_accum, lse_accum)``: fp32 ``[b, s_q, h_q, dv]``, ``[b, h_q, s_q]``, and the
        workspace ``[b + num_parts, rows, dv]``, ``[b + num_parts, rows]`` (NaN in rows no chunk wrote).
    """
    _check_shapes(q, k_cache, block_table, cache_seqlens, head_dim_v)
    b, s_q, h_q, _ = q.shape
    rows = s_q * h_q
    lengths = planner.host_lengths(cache_seqlens, "cache_seqlens")
    bounds = num_splits.tolist()
    if len(bounds) != b + 1 or bounds[0] != 0:
        raise ValueError(f"num_splits must be a prefix sum of b + 1 = {b + 1} entries starting at 0, got {bounds}")
    parts = planner.part_chunks(tile_scheduler_metadata.cpu(), lengths, block_n)
    o_shape, lse_shape = planner.workspace_shapes(b, len(parts), rows, head_dim_v)
    nan = float("nan")
    # NaN everywhere nothing is written, so a missed row shows up in any comparison.
    o_accum = torch.full(o_shape, nan, device=q.device)
    lse_accum = torch.full(lse_shape, nan, device=q.device)
    out = torch.full((b, s_q, h_q, head_dim_v), nan, device=q.device)
    lse = torch.full((b, h_q, s_q), nan, device=q.device)
    written: set[int] = set()
    chunks_seen = [0] * b
    for chunk in (c for part in parts for c in part):
        r = chunk.req
        n_chunks = bounds[r + 1] - bounds[r]
        if not 0 <= chunk.split < n_chunks:
            raise ValueError(f"part {chunk.part}: chunk {chunk.split} of request {r}, which has {n_chunks} chunks")
        row = bounds[r] + chunk.split
        if row in written:
            raise ValueError(f"part {chunk.part}: workspace row {row} (request {r}, chunk {chunk.split}) written twice")
        written.add(row)
        chunks_seen[r] += 1
        o, chunk_lse = request_partial(q, k_cache, block_table, lengths[r], r, chunk.begin_block * block_n,
                                       chunk.end_block * block_n, head_dim_v=head_dim_v,
                                       softmax_scale=softmax_scale, causal=causal)
        if n_chunks == 1:
            out[r] = o
            lse[r] = torch.where(torch.isneginf(chunk_lse), float("inf"), chunk_lse)
        else:
            o_accum[row] = o.reshape(rows, head_dim_v)
            lse_accum[row] = chunk_lse.transpose(0, 1).reshape(rows)
    for r in range(b):
        if chunks_seen[r] != bounds[r + 1] - bounds[r]:
            raise ValueError(f"request {r} has {bounds[r + 1] - bounds[r]} chunks in num_splits but the plan "
                             f"walks {chunks_seen[r]}")
    merge_ref.merge_workspace(o_accum, lse_accum, num_splits, out, lse)
    return out, lse, o_accum, lse_accum


@dataclass(frozen=True)
class Comparison:
    """Result of ``compare_to_reference``; ``ok`` is the verdict, ``message`` says why not."""
    ok: bool
    max_abs_out: float
    max_abs_lse: float
    cos_dist: float
    message: str


def compare_to_reference(out: torch.Tensor, lse: torch.Tensor, ref_out: torch.Tensor, ref_lse: torch.Tensor, *,
                         out_atol: float = 8e-4, out_rtol: float = 2 / 128, lse_atol: float = 1e-6,
                         lse_rtol: float = 8 / 65536, max_cos_dist: float = 5e-6) -> Comparison:
    """Compare a kernel's ``(out, lse)`` with the reference, with the upstream tolerances.

    Each out element must be within ``max(out_atol, out_rtol * |ref|)``, the cosine distance of the
    whole out tensor below ``max_cos_dist``; each finite lse within ``max(lse_atol, lse_rtol * |ref|)``
    and infinite lse (empty rows) equal. NaN anywhere fails.
    """
    out, ref_out = out.float(), ref_out.float().to(out.device)
    lse, ref_lse = lse.float(), ref_lse.float().to(lse.device)
    problems = []
    if out.shape != ref_out.shape or lse.shape != ref_lse.shape:
        return Comparison(False, float("inf"), float("inf"), float("inf"),
                          f"shape mismatch: out {tuple(out.shape)} vs {tuple(ref_out.shape)}, "
                          f"lse {tuple(lse.shape)} vs {tuple(ref_lse.shape)}")
    if torch.isnan(out).any() or torch.isnan(lse).any():
        problems.append("NaN in the result")
    out_err = (out - ref_out).abs()
    max_abs_out = out_err.nan_to_num(float("inf")).max().item() if out.numel() else 0.0
    if (out_err > torch.clamp(out_rtol * ref_out.abs(), min=out_atol)).any():
        problems.append(f"out off by up to {max_abs_out:.3g}")
    a, r = out.flatten().double(), ref_out.flatten().double()
    denom = (a.norm() * r.norm()).item()
    if denom == 0:  # an all-zero tensor (every row empty): identical or maximally far
        cos_dist = 0.0 if torch.equal(a, r) else 1.0
    else:
        cos_dist = 1.0 - (a @ r).item() / denom
    if cos_dist > max_cos_dist:
        problems.append(f"cosine distance {cos_dist:.3g}")
    finite = torch.isfinite(ref_lse)
    if not torch.equal(torch.isposinf(lse), torch.isposinf(ref_lse)) or not torch.isfinite(lse[finite]).all():
        problems.append("empty rows (lse = +inf) differ")
    lse_err = (lse[finite] - ref_lse[finite]).abs()
    max_abs_lse = lse_err.nan_to_num(float("inf")).max().item() if lse_err.numel() else 0.0
    if (lse_err > torch.clamp(lse_rtol * ref_lse[finite].abs(), min=lse_atol)).any():
        problems.append(f"lse off by up to {max_abs_lse:.3g}")
    return Comparison(not problems, max_abs_out, max_abs_lse, cos_dist, "; ".join(problems) or "ok")
