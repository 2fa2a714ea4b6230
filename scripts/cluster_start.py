"""Multicast clusters: which part of the cluster costs time (CUDA-graph replays, interleaved, 2wg).

    python scripts/cluster_start.py [--config 64,8,1,128,1024 ...] [--replays 300] [--passes 2] [--json F]

For each config (page 64 or 128, ``h_q * s_q > 64``) one ``MLADecoder`` is planned; the decode entry is
then compiled six ways, each captured in its own graph, all on the same inputs and plan:

- ``on``: the library's kernel (2-CTA cluster, each CTA issues half of every tile's boxes and
  multicasts them; a stage is refilled once the consumers of both CTAs released it);
- ``on-late``: the same with the exit's cluster arrive at the end of the kernel (skeleton
  ``early_cluster_arrive = False``: the form before the eleventh session);
- ``on-wait-first``: the same with the start's cluster wait right after the barrier inits, before the
  plan row is read (skeleton ``late_cluster_start_wait = False``: the form before the seventeenth
  session);
- ``cl-local``: the cluster and its cross-CTA release, but every CTA loads every box of every tile
  itself (multicast mask = this CTA only): the release protocol without the shared loads;
- ``cl-idle``: the cluster is launched and synchronised at start and exit, but loads and releases are
  the CTA's own (the loader of a CTA without a cluster);
- ``off``: no cluster (``MLA_MULTICAST=0``'s kernel).

``cl-idle - off`` is what launching a cluster costs, ``cl-local - cl-idle`` the cross-CTA release, and
``on - cl-local`` sharing the loads. All modes must write the same ``out`` bit for bit (same data, same
math): checked. Printed per config: the medians and each mode's paired ratio against ``off`` (median
over rounds of one graph's replay / the other's in the same round: ``perf_table.runner.paired_ratio``).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIGS = ((64, 1, 1, 128, 1024), (64, 1, 1, 128, 16384), (64, 1, 2, 128, 16384), (64, 8, 1, 128, 1024),
           (64, 8, 2, 128, 4096), (64, 32, 2, 128, 1024), (64, 64, 2, 128, 1024), (64, 128, 1, 128, 4096))
MODES = ("on", "on-late", "on-wait-first", "cl-local", "cl-idle", "off")

from pipelines import paged_kv  # noqa: E402  (first: it pins the DSL's target arch)
from pipelines.launch import DecodeEntry  # noqa: E402
from pipelines.variant_2wg import MLADecode2WG  # noqa: E402

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Int32  # noqa: E402


class LocalFills(paged_kv.TmaPagedKV):
    """The cluster's loader (cross-CTA release), but every box of a tile loaded by this CTA for itself."""

    @cute.jit
    def load_tile(self, tma_k, mK, sK, mBlockTable, pipe, state, r, blk, seqlen, kv_head, producer_tidx,
                  page=None, cols=None):
        P = self.page_size
        box = self.box_rows
        tKsK, tKgK = self.tma_views(tma_k, mK, sK)
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        own = cutlass.Int16(Int32(1) << rank)
        last_page = (seqlen - 1) // P
        n = paged_kv.TILE_TOKENS // box
        pages = cute.make_rmem_tensor(n, Int32)
        for b in cutlass.range_constexpr(n):
            pages[b] = mBlockTable[r, cutlass.min((blk * paged_kv.TILE_TOKENS + b * box) // P, last_page)]
        pipe.producer_acquire(state)
        bar = pipe.producer_get_barrier(state)
        for b in cutlass.range_constexpr(n):
            in_page = ((blk * paged_kv.TILE_TOKENS + b * box) % P) // box
            cute.copy(tma_k, tKgK[None, in_page, kv_head, pages[b]], tKsK[None, b, state.index], tma_bar_ptr=bar,
                      mcast_mask=own)


class LateExit2WG(MLADecode2WG):
    early_cluster_arrive = False


class WaitFirst2WG(MLADecode2WG):
    late_cluster_start_wait = False


class ModeEntry(DecodeEntry):
    def __init__(self, config, mode: str):
        super().__init__(config)
        d = self.decode
        if mode in ("on-late", "on-wait-first"):
            cls = LateExit2WG if mode == "on-late" else WaitFirst2WG
            d = self.decode = cls(d.dtype, d.h_q, d.s_q, d.page_size, d.causal, d.h_kv, multicast=True,
                                  split_cluster=d.split_cluster)
        if mode == "cl-local":
            if d.loader.boxes_per_cta != 1:
                raise SystemExit("cl-local is written for pages of 64 or 128 tokens")
            d.loader = LocalFills(d.dtype, d.page_size, d.loader.head_dim, d.kv_stages, d.cluster)
        if mode == "cl-idle":
            d.loader = paged_kv.make_loader(d.dtype, d.page_size, d.loader.head_dim, d.kv_stages, 1)


def measure(cfg, replays: int, compiled: dict) -> dict:
    import dataclasses

    import torch

    import mla
    from perf_table import bench, runner
    from pipelines.launch import TVM_FFI_OPTION, DecodeConfig, entry_args, partial_from_env

    inp = bench.make_inputs(cfg, device="cuda", seed=0)
    dec = mla.MLADecoder(pipeline="2wg")
    dec.plan(inp.cache_seqlens, num_heads_q=cfg.h_q, seq_len_q=cfg.s_q, num_heads_k=1, page_size=cfg.page_size,
             dtype=inp.q.dtype, causal=cfg.causal)
    shape = dec._planned
    on = DecodeConfig.make("2wg", shape.dtype, shape.h_q, shape.s_q, shape.page_size, shape.causal, 1, True,
                           partial_from_env(), dec._info.split_cluster)
    if on.cluster < 2:
        raise SystemExit(f"{cfg.label()}: no multicast cluster for this config")
    off = dataclasses.replace(on, cluster=1)
    for mode in MODES:
        key = (on, mode)
        if key not in compiled:
            entry = DecodeEntry(on) if mode == "on" else DecodeEntry(off) if mode == "off" else ModeEntry(on, mode)
            conf = off if mode == "off" else on
            compiled[key] = cute.compile(entry, *entry_args(conf), options=TVM_FFI_OPTION)
    graphs, outs = bench.capture_entries({mode: compiled[(on, mode)] for mode in MODES}, inp, dec)
    same = {m: bool(torch.equal(outs["off"], outs[m])) for m in MODES if m != "off"}
    if not all(same.values()):
        raise SystemExit(f"{cfg.label()}: outputs differ from the multicast-off kernel's: {same}")
    samples = bench.time_graphs_interleaved(graphs, replays=replays)
    med = {m: round(statistics.median(s), 2) for m, s in samples.items()}
    paired = {f"{m}/off": round(runner.paired_ratio(samples[m], samples["off"]), 4) for m in MODES if m != "off"}
    splits = dec.num_splits.tolist()
    row = dict(config=cfg.label(), parts=int(dec.tile_scheduler_metadata.shape[0]), chunks=int(splits[-1]),
               medians=med, paired=paired)
    print(f"  {cfg.label():<26} parts {row['parts']:>3} chunks {row['chunks']:>4}: "
          + ", ".join(f"{m} {v:.2f}" for m, v in med.items()) + "  paired "
          + ", ".join(f"{k} {v:.4f}" for k, v in paired.items()), flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", action="append", default=[], help="page,b,s_q,h_q,seqlen")
    ap.add_argument("--replays", type=int, default=300)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    import torch

    from perf_table import grid

    configs = [grid.Config(*(int(x) for x in c.split(","))) for c in args.config] or [grid.Config(*c) for c in CONFIGS]
    print(f"{torch.cuda.get_device_name(0)}; us = median of {args.replays} graph replays per graph", flush=True)
    compiled, rows = {}, []
    for p in range(args.passes):
        for cfg in configs:
            rows.append(dict(measure(cfg, args.replays, compiled), rep=p))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(dict(device=torch.cuda.get_device_name(0), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
