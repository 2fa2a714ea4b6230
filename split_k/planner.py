"""Split-kv planner: which CTA processes which KV tiles of which request.

This module is the one place where the plan's layout is documented; ``docs/interfaces.md`` is the
binding contract it implements.

Problem shape. Request ``r`` of a batch of ``b`` has ``seqlen_r`` keys, cut into KV tiles of
``block_n`` (= 64) tokens: ``n_blocks(r) = ceil(seqlen_r / block_n)`` tiles, 0 for an empty request.
Its ``rows = s_q * h_q`` query rows are cut into M tiles of 64 rows. The kernel launches
``num_m_blocks * h_kv * num_sm_parts`` CTAs; every (m-block, kv-head) pair walks the *same* plan, so
the plan only splits the KV dimension.

``num_sm_parts(num_sms, rows_per_kv, h_kv) = max(num_sms // h_kv // ceil(rows_per_kv / 64), 1)``
(FlashMLA's rule): enough parts that one wave of CTAs fills the GPU.

``tile_scheduler_metadata``: int32 ``[num_parts, 8]``, one row per part (one CTA's work list):

====  ===========  ==========================================================================
idx   name         meaning
====  ===========  ==========================================================================
0     begin_req    first request of the part
1     begin_block  first KV tile of ``begin_req``
2     end_req      last request of the part (inclusive)
3     end_block    one past the last KV tile of ``end_req`` (exclusive)
4     begin_split  chunk index (within ``begin_req``) of the part's first chunk
5-7   reserved     0 (row 0's column 7: the in-grid merge's barrier word, 0 or 2^31 after a decode)
====  ===========  ==========================================================================

A part processes requests ``begin_req..end_req``. For a request strictly inside the range the
chunk is ``[0, n_blocks)`` with chunk index 0; ``begin_req``'s chunk starts at ``begin_block`` with
chunk index ``begin_split``; ``end_req``'s chunk stops at ``end_block``. An empty part is
``[0, 0, -1, 0, 0, 0, 0, 0]`` so that the kernel's loop ``for r in [begin_req, end_req]`` runs zero
times; empty parts only occur after all work has been handed out (at the tail).

``num_splits``: int32 ``[b + 1]``, a prefix sum: request ``r`` has
``num_splits[r + 1] - num_splits[r] >= 1`` chunks, and chunk ``j`` of request ``r`` owns workspace
row ``num_splits[r] + j``. A request with one chunk is *not split*: its CTA writes ``out``/``lse``
directly. Split requests write partials (``o_accum[b + num_parts, rows, 512]`` in the input dtype by
default or fp32, docs/interfaces.md "Partial dtype";
``lse_accum[b + num_parts, rows]``, natural log, ``-inf`` for a row that saw no key) and the merge
stage combines them. ``num_splits[b] <= b + num_parts - 1`` because consecutive parts share at
most one request, so the workspace is sized without reading the plan back.

Every KV tile of every request is covered exactly once; a zero-length request is one chunk
``[0, 0)`` of exactly one part and is never split.

Balancing (FlashMLA's scheme). A chunk of ``k`` tiles costs ``k + fixed_cost`` (the fixed term
stands for the per-chunk work that does not scale with the length: loading Q, the epilogue and, for
split requests, the merge). With ``total = sum(n_blocks(r) + fixed_cost)`` each part gets a budget
``payload = ceil(total / num_parts) + fixed_cost`` and parts are filled in request order: a request
whose remaining cost fits the part's remaining budget is taken whole (no split when it fits);
otherwise the part takes as many tiles as its budget allows after paying the fixed cost, and the
rest of the request continues in the next part. Bounds (checked by the tests):

- every part costs at most ``payload``;
- every non-empty part but the last non-empty one costs at least ``ceil(total / num_parts)``;
- everything fits in ``num_parts`` parts: a part ends either full (a split, which adds one
  ``fixed_cost`` of work for the continuation chunk) or with at most ``fixed_cost`` budget unused
  (no split), so the parts before the last lose at most ``fixed_cost`` each against ``payload``,
  which is exactly the slack the budget carries.

Aligned plans (our addition to FlashMLA's scheme). A split costs more than the balancer's
``fixed_cost`` charges: the split chunks write partials that the merge stage reads back, and a part
that ends inside one request and begins inside the next pays two chunk heads. The balanced plan does
that in many plans: where requests are just longer than ``payload`` it cuts each into uneven chunks
(34 + 30 tiles at b32 s1 h128 4096 keys), at longer lengths parts straddle two requests (97 chunks
for 32 requests at 16384 keys), and where requests are just shorter it still cuts most of them. The
aligned plan never puts pieces of two requests in one part:

- ``capacity = min(max(payload, longest request cost), payload + fixed_cost)``;
- a request that costs at most ``capacity`` is *whole*: packed in order into parts of ``capacity``
  (a request that does not fit in the rest of a part opens the next one);
- a longer request is *long*: it closes the current part and is cut into ``k`` chunks of ``c``
  tiles (the last one shorter), one part each, with ``k = ceil(tiles / t)``, ``c = ceil(tiles / k)``
  and then ``k = ceil(tiles / c)`` (``long_chunks``): the fewest chunks of at most ``t`` tiles, as
  even as whole tiles allow, none empty;
- ``t`` is the smallest chunk size from ``target - 2`` (at least 1: ``BELOW_TARGET``, shorter chunks
  that use parts the rounding of ``target`` leaves empty) to ``target + fixed_cost`` (at most the
  capacity; ``chunk_tile_candidates``) for which the parts the packing opens plus the long requests'
  further chunks fit in ``num_parts``.

If no ``t`` fits, the balanced plan stands (``aligned_params``). Every part of an aligned plan costs at most ``capacity <=
payload + fixed_cost``. Without long requests it packs every request whole (where the balanced plan
splits nothing as well, the two plans are the same); with uniform long requests it is the even
split (``k`` equal chunks per request). Measured on an H200 (docs/perf-notes.md, 2wg, page 64,
uniform lengths): whole requests with the capacity ``fixed_cost`` above ``payload``: b64 s1 h64
1024 keys 52.0 -> 43.3 us, b96 s1 h64 2048 95.9 -> 75.8, b32 s1 h128 1024 45.9 -> 39.9, b32 s2 h64
1024 45.8 -> 40.3 (b64 s1 h16 1024 36.3 -> 37.3); with it 8 or more above, the balanced plan was
faster (b48 s1 h64 1024 39.1 vs 41.8). Long requests, balanced -> aligned (2026-11-25, 22 grid
configs, geomean x0.978): b32 s2 h64 4096 83.1 -> 79.4 us, b32 s1 h128 4096 82.5 -> 79.0, b64 s1 h128
16384 557.7 -> 513.6, b128 s1 h64 16384 663.6 -> 614.1; b32 s2 h64 16384 267.2 -> 268.6 (the worst).

The plan is a pure function of the lengths (deterministic) and runs on the host. The layout only
needs the lengths and a scan over requests, so a device-side planner (one warp doing the same scan,
as FlashMLA does) can produce the same tensors later without a host sync.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import torch

BLOCK_M = 64
"""Query rows per M tile."""
BLOCK_N = 64
"""Tokens per KV tile, whatever the page size."""
FIXED_COST = 5
"""Per-chunk overhead, in KV tiles, that the balancer charges (FlashMLA's value)."""
CHUNK_CANDIDATES = 8
"""Most chunk sizes the aligned plan tries for its long requests (``chunk_tile_candidates``)."""
BELOW_TARGET = 2
"""Chunk sizes under the balanced ``target`` that the aligned plan tries first (``chunk_tile_candidates``):
where whole chunks of ``target`` tiles leave parts empty (``b`` long requests of ``n`` tiles need
``ceil(n / target)`` chunks each, which rounds down what ``num_parts / b`` allows), one or two tiles less per
chunk fills them. Measured on an H200 (paired, docs/perf-notes.md, twentieth session): b8 s1 h16 4096 104 ->
128 chunks x0.88, b32 s1 h64 1024 x0.90, b4 s1 h64 4096 x0.96, b1 s1 h128 4096 x0.96, b8 s1 h64 4096 x0.99."""
METADATA_WIDTH = 8
"""int32 fields per part in ``tile_scheduler_metadata``."""

# Field indices of a tile_scheduler_metadata row.
BEGIN_REQ, BEGIN_BLOCK, END_REQ, END_BLOCK, BEGIN_SPLIT = range(5)
GRID_COUNT_COLUMN = 7
"""Reserved column whose row-0 word the in-grid merge's barrier counts on (``split_k.grid_sync``): the
planners write 0 there; each decode with the in-grid merge adds 2^31 (its low 31 bits stay 0)."""


def num_sm_parts(num_sms: int, rows_per_kv: int, h_kv: int) -> int:
    """Number of parts (CTAs per m-block and kv head) to split the batch's KV work into.

    ``rows_per_kv = s_q * h_q // h_kv`` query rows share one KV head (FlashMLA's
    ``num_heads_per_head_k``); they need ``ceil(rows_per_kv / 64)`` M tiles, each of which walks the
    whole plan, so one wave of ``num_sms`` CTAs holds ``num_sms // h_kv // m_blocks`` parts.
    """
    for name, value in (("num_sms", num_sms), ("rows_per_kv", rows_per_kv), ("h_kv", h_kv)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    m_blocks = -(-rows_per_kv // BLOCK_M)
    return max(num_sms // h_kv // m_blocks, 1)


SPLIT_CLUSTER_ENV_VAR = "MLA_SPLIT_CLUSTER"
"""``MLA_SPLIT_CLUSTER``: unset, ``0``, ``1`` or ``off``: no split clusters (the default); 2, 4 or 8:
split clusters of that size wherever the plan has room for one group (``split_cluster``)."""
SPLIT_CLUSTER_SIZES = (2, 4, 8)


def split_cluster_setting(value: str | None = None) -> int:
    """The ``MLA_SPLIT_CLUSTER`` setting (``value``, else the environment) as a cluster size, 1 for
    off. Raises ``ValueError`` naming the variable for anything else."""
    raw = os.environ.get(SPLIT_CLUSTER_ENV_VAR) if value is None else value
    text = "1" if raw is None or raw.strip() == "" else raw.strip().lower()
    if text in ("0", "1", "off"):
        return 1
    if text in tuple(str(c) for c in SPLIT_CLUSTER_SIZES):
        return int(text)
    raise ValueError(f"{SPLIT_CLUSTER_ENV_VAR} must be 0, 1, off or one of {SPLIT_CLUSTER_SIZES}, got {raw!r}")


def split_cluster(batch_size: int, num_parts: int, setting: str | None = None) -> int:
    """CTAs per split cluster for a plan of ``num_parts`` parts over ``batch_size`` requests; 1: none.

    A split cluster lets ``c`` CTAs share every chunk of the plan (tile by tile) and combine their
    partial outputs in distributed shared memory, so a request split over ``c`` CTAs needs no global
    partials and no merge (docs/interfaces.md, "Split clusters"). Off unless ``MLA_SPLIT_CLUSTER``
    asks for it: on an H200 it was faster than the plain plan by more than 3% on 12 of 54
    batch/heads/length points and slower on 37 (docs/perf-notes.md), so no shape gets it by default. The plan and the launch
    both call this with the same ``(batch_size, num_parts)`` (num_parts =
    tile_scheduler_metadata.shape[0]), so they agree as long as ``MLA_SPLIT_CLUSTER`` does not change
    between planning and the decode call. ``batch_size`` is part of the signature for a rule that
    depends on it.
    """
    c = split_cluster_setting(setting)
    return c if c > 1 and split_groups(num_parts, c) >= 1 else 1


def split_groups(num_parts, cluster: int):
    """Groups of ``cluster`` CTAs that a split-cluster plan of ``num_parts`` parts uses.

    ``num_parts`` CTAs (per m-block and kv head) fill the SMs one CTA each; clusters of ``cluster``
    CTAs must each sit in one GPC, and on a 132-SM H100/H200 at most 120 CTAs of the decode kernel
    are resident in clusters of 4 or 8 (15 clusters of 8, 30 of 4; 66 of 2, measured with
    ``cudaOccupancyMaxActiveClusters``), so a group count past ``10/11`` of the parts would leave a
    cluster waiting for a second wave. Works on Python ints and on the DSL's Int32 alike (the
    kernel's launch computes its grid with it).
    """
    if cluster == 1:
        return num_parts
    if cluster == 2:
        return num_parts // 2
    return num_parts * 10 // 11 // cluster


def host_lengths(seqlens: Sequence[int] | torch.Tensor, name: str = "seqlens") -> list[int]:
    """Key counts as a host list of non-negative ints (a CUDA tensor is copied, which syncs).

    Raises ``ValueError`` naming ``name`` for a non-integer or negative entry.
    """
    if isinstance(seqlens, torch.Tensor):
        if seqlens.dim() != 1 or seqlens.dtype.is_floating_point or seqlens.dtype.is_complex:
            raise ValueError(f"{name} must be a 1-D integer tensor, got {seqlens.dtype} {tuple(seqlens.shape)}")
        lengths = seqlens.tolist()
    else:
        lengths = list(seqlens)
    for r, n in enumerate(lengths):
        if isinstance(n, bool) or not isinstance(n, int):
            raise ValueError(f"{name}[{r}] must be an int, got {n!r}")
        if n < 0:
            raise ValueError(f"{name}[{r}] = {n} is negative")
    return lengths


def n_blocks(seqlen: int, block_n: int = BLOCK_N) -> int:
    """KV tiles of a request with ``seqlen`` keys."""
    return -(-seqlen // block_n)


def plan(seqlens: Sequence[int] | torch.Tensor, num_parts: int, block_n: int = BLOCK_N,
         fixed_cost: int = FIXED_COST, aligned: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Split the batch's KV tiles into ``num_parts`` balanced work lists.

    Args:
        seqlens: ``[b]`` key counts (list of ints or an integer tensor; a CUDA tensor is copied to
            the host, which synchronises).
        num_parts: number of parts, usually ``num_sm_parts(...)``.
        block_n: tokens per KV tile (64 for the kernels).
        fixed_cost: per-chunk overhead in tiles charged by the balancer (>= 0).
        aligned: take the aligned plan where it fits (module docstring); False gives the balanced
            plan alone (FlashMLA's), for comparisons. The kernels' planners always try it.

    Returns:
        ``(tile_scheduler_metadata, num_splits)``: CPU int32 tensors ``[num_parts, 8]`` and
        ``[b + 1]`` in the layout of this module's docstring.
    """
    lengths = host_lengths(seqlens)
    if isinstance(num_parts, bool) or not isinstance(num_parts, int) or num_parts < 1:
        raise ValueError(f"num_parts must be a positive int, got {num_parts!r}")
    if isinstance(block_n, bool) or not isinstance(block_n, int) or block_n < 1:
        raise ValueError(f"block_n must be a positive int, got {block_n!r}")
    if isinstance(fixed_cost, bool) or not isinstance(fixed_cost, int) or fixed_cost < 0:
        raise ValueError(f"fixed_cost must be a non-negative int, got {fixed_cost!r}")

    blocks = [n_blocks(n, block_n) for n in lengths]
    params = aligned_params(blocks, num_parts, fixed_cost) if aligned else None
    if params is not None:
        metadata, num_splits = _aligned_plan(blocks, num_parts, fixed_cost, *params)
    else:
        metadata, num_splits = _balanced_plan(blocks, num_parts, fixed_cost)
    return (torch.tensor(metadata, dtype=torch.int32).reshape(num_parts, METADATA_WIDTH),
            torch.tensor(num_splits, dtype=torch.int32))


def _balanced_plan(blocks: list[int], num_parts: int, fixed_cost: int) -> tuple[list[list[int]], list[int]]:
    """FlashMLA's balanced plan (module docstring) as metadata rows and num_splits lists."""
    b = len(blocks)
    _, payload = _budget(blocks, num_parts, fixed_cost)
    metadata = [[0, 0, -1, 0, 0, 0, 0, 0] for _ in range(num_parts)]
    num_splits = [0] * (b + 1)
    req, block, split = 0, 0, 0  # cursor: next tile to hand out is `block` of request `req`
    for part in range(num_parts):
        if req == b:
            break  # all work handed out; the remaining parts stay empty
        begin = (req, block, split)
        budget = payload
        while req < b:
            cost = blocks[req] - block + fixed_cost
            if cost <= budget:  # the rest of the request fits: take it whole
                budget -= cost
                num_splits[req + 1] = num_splits[req] + split + 1
                req, block, split = req + 1, 0, 0
                continue
            if budget > fixed_cost:  # take what the budget allows; the rest goes to the next part
                block += budget - fixed_cost
                split += 1
            break
        if block > 0:
            end_req, end_block = req, block
        else:
            end_req, end_block = req - 1, blocks[req - 1]
        metadata[part][:5] = [begin[0], begin[1], end_req, end_block, begin[2]]

    if req != b:  # unreachable by the budget argument in the module docstring
        raise AssertionError(f"planner left requests {req}..{b - 1} unassigned")
    return metadata, num_splits


def _aligned_plan(blocks: list[int], num_parts: int, fixed_cost: int, capacity: int,
                  chunk_tiles: int) -> tuple[list[list[int]], list[int]]:
    """The aligned plan (module docstring) for ``aligned_params``' ``(capacity, chunk_tiles)``: whole
    requests packed in order into parts of ``capacity``, each long request in ``long_chunks`` parts
    of its own. The caller checked that it fits ``num_parts``."""
    b = len(blocks)
    begins = [(0, 0, 0)] if b else []  # (req, block, split) each part begins with
    num_splits = [0] * (b + 1)
    for r, (nb, opens) in enumerate(zip(blocks, _aligned_opens(blocks, capacity, fixed_cost))):
        if opens:
            begins.append((r, 0, 0))
        k, c = long_chunks(nb, chunk_tiles) if nb + fixed_cost > capacity else (1, nb)
        begins.extend((r, j * c, j) for j in range(1, k))
        num_splits[r + 1] = num_splits[r] + k
    if len(begins) > num_parts:  # aligned_params counted these parts
        raise AssertionError(f"aligned plan needs {len(begins)} parts, has {num_parts}")
    metadata = [[0, 0, -1, 0, 0, 0, 0, 0] for _ in range(num_parts)]
    for part, (req, block, split) in enumerate(begins):
        next_req, next_block = begins[part + 1][:2] if part + 1 < len(begins) else (b, 0)
        end_req, end_block = (next_req, next_block) if next_block > 0 else (next_req - 1, blocks[next_req - 1])
        metadata[part][:5] = [req, block, end_req, end_block, split]
    return metadata, num_splits


def empty_rows(metadata: torch.Tensor) -> None:
    """Make every row of ``metadata`` an empty part (in place)."""
    metadata.zero_()
    metadata[:, END_REQ] = -1


def plan_clustered(seqlens: Sequence[int] | torch.Tensor, num_parts: int, cluster: int,
                   fixed_cost: int = FIXED_COST) -> tuple[torch.Tensor, torch.Tensor]:
    """``plan`` for a split cluster of ``cluster`` CTAs (``cluster == 1``: ``plan`` itself).

    The first ``split_groups(num_parts, cluster)`` rows are the plan of that many parts in units of
    ``cluster`` tiles (``block_n = 64 * cluster``): a group's CTAs share each of its chunks tile by tile,
    so a chunk of k units costs a group about k tiles' time. The other rows are empty parts. The
    metadata keeps ``num_parts`` rows, so the workspace and every shape stay those of the plain plan.
    """
    if cluster == 1:
        return plan(seqlens, num_parts, fixed_cost=fixed_cost)
    groups = split_groups(num_parts, cluster)
    if groups < 1:
        raise ValueError(f"no room for a split cluster of {cluster} in {num_parts} parts")
    group_metadata, num_splits = plan(seqlens, groups, block_n=BLOCK_N * cluster, fixed_cost=fixed_cost)
    metadata = torch.empty(num_parts, METADATA_WIDTH, dtype=torch.int32)
    empty_rows(metadata)
    metadata[:groups] = group_metadata
    return metadata, num_splits


def plan_default(seqlens: Sequence[int] | torch.Tensor, num_parts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The plan the API makes for ``num_parts`` parts: ``plan_clustered`` with the split cluster of
    ``split_cluster(b, num_parts)`` (``MLA_SPLIT_CLUSTER`` read now)."""
    lengths = host_lengths(seqlens)
    return plan_clustered(lengths, num_parts, split_cluster(len(lengths), num_parts))


@dataclass(frozen=True)
class Chunk:
    """One unit of a part's work: tiles ``[begin_block, end_block)`` of request ``req``.

    ``split`` is the chunk's index within its request; a split request writes workspace row
    ``num_splits[req] + split``.
    """
    part: int
    req: int
    begin_block: int
    end_block: int
    split: int


def part_chunks(metadata: torch.Tensor, seqlens: Sequence[int] | torch.Tensor,
                block_n: int = BLOCK_N) -> list[list[Chunk]]:
    """Decode ``tile_scheduler_metadata`` the way the kernel walks it.

    Returns one list of ``Chunk`` per part, in the order the part's CTA processes them. Used by
    the tests and by ``mla.reference.split_decode_reference`` (the contract's executable model).
    """
    lengths = host_lengths(seqlens)
    rows = metadata.tolist()
    result = []
    for part, (begin_req, begin_block, end_req, end_block, begin_split, *_) in enumerate(rows):
        chunks = []
        for r in range(begin_req, end_req + 1):
            first, last = r == begin_req, r == end_req
            chunks.append(Chunk(
                part=part, req=r,
                begin_block=begin_block if first else 0,
                end_block=end_block if last else n_blocks(lengths[r], block_n),
                split=begin_split if first else 0))
        result.append(chunks)
    return result


def workspace_shapes(batch_size: int, num_parts: int, rows: int,
                     head_dim_v: int = 512) -> tuple[tuple[int, int, int], tuple[int, int]]:
    """Shapes of ``(o_accum, lse_accum)`` (both fp32): ``[b + num_parts, rows, head_dim_v]`` and
    ``[b + num_parts, rows]``; ``b + num_parts`` bounds ``num_splits[b]`` for any lengths."""
    n = batch_size + num_parts
    return (n, rows, head_dim_v), (n, rows)


def chunk_cost(chunk: Chunk, fixed_cost: int = FIXED_COST) -> int:
    """Cost the balancer charges for ``chunk``: its tiles plus the fixed per-chunk overhead."""
    return chunk.end_block - chunk.begin_block + fixed_cost


def _budget(blocks: list[int], num_parts: int, fixed_cost: int) -> tuple[int, int]:
    total = sum(blocks) + fixed_cost * len(blocks)
    target = -(-total // num_parts)
    return target, target + fixed_cost


def aligned_capacity(blocks: list[int], num_parts: int, fixed_cost: int) -> tuple[int, int]:
    """``(capacity, parts the packing opens)`` of the aligned plan (module docstring): the part
    capacity ``min(max(payload, longest cost), payload + fixed_cost)``, and how many parts the walk
    in request order opens when every request holds ``min(cost, capacity)`` of a part (a request
    that does not fit in the rest of a part opens the next one). A long request's further chunks,
    one part each, come on top (``aligned_params``). ``(0, 0)`` for an empty batch."""
    if not blocks:
        return 0, 0
    return _aligned_capacity(blocks, _budget(blocks, num_parts, fixed_cost)[1], fixed_cost)


def _aligned_capacity(blocks: list[int], payload: int, fixed_cost: int) -> tuple[int, int]:
    """``aligned_capacity`` for a non-empty batch whose balanced ``payload`` is known."""
    capacity = min(max(payload, max(blocks) + fixed_cost), payload + fixed_cost)
    return capacity, 1 + sum(_aligned_opens(blocks, capacity, fixed_cost))


def _aligned_opens(blocks: list[int], capacity: int, fixed_cost: int) -> list[bool]:
    """The aligned packing walk: per request, whether it opens a part because its share
    ``min(cost, capacity)`` does not fit in what is left of the current one (part 0 is open at the
    start)."""
    opens, budget = [], capacity
    for nb in blocks:
        held = min(nb + fixed_cost, capacity)
        opens.append(budget < held)
        budget = (capacity if budget < held else budget) - held
    return opens


def chunk_tile_candidates(target: int, fixed_cost: int) -> list[int]:
    """Chunk sizes (tiles) the aligned plan tries for its long requests, smallest first: ``BELOW_TARGET``
    sizes under the balanced ``target`` (at least 1; repeats allowed), then from ``target`` (a chunk costs
    at most ``payload``) up to ``target + fixed_cost`` (at most the capacity), at most ``CHUNK_CANDIDATES``
    values in all (every one from ``target`` for ``fixed_cost <= 5``)."""
    return [max(target + off, 1) if off < 0 else target + off for off in chunk_tile_offsets(fixed_cost)]


def chunk_tile_offsets(fixed_cost: int) -> list[int]:
    """``chunk_tile_candidates`` relative to ``target`` (what the device planner adds to its ``target``; the
    negative ones are clamped at 1 tile): ``-BELOW_TARGET .. -1``, then ``0 .. fixed_cost`` in at most
    ``CHUNK_CANDIDATES - BELOW_TARGET`` steps."""
    steps = min(fixed_cost, CHUNK_CANDIDATES - BELOW_TARGET - 1)
    above = [(i * fixed_cost) // steps for i in range(steps + 1)] if steps else [0]
    return list(range(-BELOW_TARGET, 0)) + above


def long_chunks(nb: int, chunk_tiles: int) -> tuple[int, int]:
    """``(k, c)``: a long request of ``nb`` tiles is cut into ``k`` chunks of ``c`` tiles (the last one
    ``nb - (k - 1) * c``, at least 1): the fewest chunks of at most ``chunk_tiles``, as even as whole
    tiles allow (``c = ceil(nb / k)``; ``k`` is then recounted from ``c`` so that no chunk is empty)."""
    k = -(-nb // chunk_tiles)
    c = -(-nb // k)
    return -(-nb // c), c


def aligned_params(blocks: list[int], num_parts: int, fixed_cost: int) -> tuple[int, int] | None:
    """``(capacity, chunk_tiles)`` of the aligned plan for these tile counts, or None where the
    balanced plan stands: the smallest of ``chunk_tile_candidates`` for which the parts the packing
    opens plus every long request's further chunks fit in ``num_parts``. None for an empty batch."""
    if not blocks:
        return None
    target, payload = _budget(blocks, num_parts, fixed_cost)
    capacity, opened = _aligned_capacity(blocks, payload, fixed_cost)
    longs = [nb for nb in blocks if nb + fixed_cost > capacity]  # target >= 1 whenever there is one
    if not longs:  # nothing is cut: the chunk size is moot (``target``, as before the sizes below it)
        return (capacity, target) if opened <= num_parts else None
    for tiles in chunk_tile_candidates(target, fixed_cost):
        if opened + sum(long_chunks(nb, tiles)[0] - 1 for nb in longs) <= num_parts:
            return capacity, tiles
    return None


def balance_budget(seqlens: Sequence[int] | torch.Tensor, num_parts: int, block_n: int = BLOCK_N,
                   fixed_cost: int = FIXED_COST) -> tuple[int, int]:
    """``(ceil(total / num_parts), payload)`` for these lengths: every non-empty part but the last
    costs at least the first, every part at most the second (see the module docstring)."""
    return _budget([n_blocks(n, block_n) for n in host_lengths(seqlens)], num_parts, fixed_cost)
