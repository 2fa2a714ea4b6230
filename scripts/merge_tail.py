"""What the split-kv second stage costs after the decode kernel (CUDA-graph replays, interleaved, bf16).

    python scripts/merge_tail.py [--config 64,1,1,16,1024 ...] [--variant 2wg] [--replays 300] [--modes M,...]
                                 [--json F]

For each config one ``MLADecoder`` is planned as usual; then the decode kernel is compiled again
behind entries that differ only in what follows it, and each is captured in its own graph:

- ``merge``: the library's entry with ``grid_merge`` 0 (decode, then the merge kernel chained by
  programmatic dependent launch);
- ``grid``: the library's entry with ``grid_merge`` 1 (the decode merges in its own grid, launched
  cooperatively: no merge kernel; the variant must support it, ``pipelines.GRID_MERGE_VARIANTS``);
- ``merge-nopdl``: the same merge kernel launched plainly (it starts after the decode grid ends);
- ``none``: the decode kernel alone (the output of split requests is left unmerged: timing only);
- ``wait``: an empty grid of ``num_parts`` CTAs launched with PDL whose CTAs only execute
  ``griddepcontrol.wait``: the floor of any second kernel that reads the decode's results;
- ``exit``: the same grid with PDL but CTAs that return at once (a second stage whose CTAs all find
  nothing to do);
- ``merge-l8``: the merge with 8 splits per warp and round instead of 16 (16-bit partials), in 8-warp CTAs
  (with at most 8 loads the kernel takes fp32 partials' CTA size, ``merge_kernel.kernel_warps``);
- ``merge-w8``: the merge with 16 splits per warp and round wherever ``n_est > 8`` (16-bit partials; the
  rule before ``split_k.merge_kernel.WIDE_ABOVE``);
- ``merge-n16``: the narrow kernel (8 splits per round; 4-warp CTAs with 16-bit partials) up to ``n_est`` 16 for
  requests of any row count (the library keeps it up to 8 below ``WIDE_ABOVE_ROWS`` rows, a rule measured when
  the narrow kernel still ran 8-warp CTAs);
- ``merge-y2``: the merge with twice the CTAs per slot;
- ``merge-old``: the merge kernel module at ``$MERGE_OLD`` (a file, e.g. from ``git show``), for A/B;
- ``merge-alt``: the same for a module with today's ``SplitMerge.__call__`` signature (``max_tiles``), at
  ``$MERGE_ALT`` (an experiment's copy of ``split_k/merge_kernel.py``); ``merge-alt2``: a second one, at
  ``$MERGE_ALT2`` (three forms in one process).

``merge - none`` is the merge stage's cost in a graph; ``wait - none`` the part of it that no merge
kernel can avoid; ``exit - none`` what launching a dependent grid costs when it waits for nothing.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIGS = ((64, 1, 1, 16, 1024), (64, 1, 1, 16, 16384), (64, 1, 1, 128, 16384), (64, 8, 1, 64, 4096),
           (64, 128, 1, 128, 4096))
MODES = ("merge", "grid", "merge-nopdl", "merge-l8", "merge-w8", "merge-n16", "merge-y2", "merge-old", "merge-alt",
         "merge-alt2", "none", "wait", "exit")
DEFAULT_MODES = ("merge", "grid", "merge-nopdl", "none", "wait", "exit")


import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402

from pipelines.launch import DecodeEntry  # noqa: E402
from split_k.merge_kernel import LOADS_NARROW, WIDE_ABOVE, SplitMerge  # noqa: E402


class Tail:
    """An empty dependent grid: ``num_parts`` CTAs of one warp that wait for the decode or not."""

    def __init__(self, wait: bool):
        self.wait = wait

    @cute.jit
    def __call__(self, mMeta: cute.Tensor, stream):
        self.kernel(mMeta).launch(grid=[mMeta.shape[0], 1, 1], block=[32, 1, 1], stream=stream, use_pdl=True)

    @cute.kernel
    def kernel(self, mMeta: cute.Tensor):
        if cutlass.const_expr(self.wait):
            cute.arch.griddepcontrol_wait()


class DoubleY(SplitMerge):
    """The merge with twice the CTAs per slot."""

    @cute.jit
    def _grid_y(self, n_est, loads: cutlass.Constexpr[int], warps: cutlass.Constexpr[int]):
        return SplitMerge._grid_y(self, n_est, loads, warps) * 2


def _old_merge(var: str = "MERGE_OLD"):
    """The merge kernel module of a previous commit (or an experiment), from ``$MERGE_OLD`` (or ``var``:
    a file path), for A/B."""
    import importlib.util
    import os
    spec = importlib.util.spec_from_file_location(f"{var.lower()}_merge_kernel", os.environ[var])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class ModeEntry(DecodeEntry):
    def __init__(self, config, mode: str):
        super().__init__(config)
        self.mode = mode
        if mode == "merge-l8":
            self.merge.max_loads = LOADS_NARROW
        if mode == "merge-w8":
            self.merge.wide_above = LOADS_NARROW  # the 16-load kernel above 8 estimated chunks (before WIDE_ABOVE)
        if mode == "merge-n16":
            self.merge.wide_above = WIDE_ABOVE  # the narrow kernel up to 16 estimated chunks at any row count
        if mode == "merge-y2":
            self.merge = DoubleY(self.merge.dtype, self.merge.h_q, self.rows // self.merge.h_q, self.partial_dtype)
        if mode in ("merge-old", "merge-alt", "merge-alt2"):
            module = _old_merge({"merge-old": "MERGE_OLD", "merge-alt": "MERGE_ALT", "merge-alt2": "MERGE_ALT2"}[mode])
            self.merge = module.SplitMerge(self.merge.dtype, self.merge.h_q, self.rows // self.merge.h_q,
                                           self.partial_dtype)
        self.tail = Tail(mode == "wait")

    @cute.jit
    def __call__(self, q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits, out, lse,
                 workspace, softmax_scale, grid_merge, stream):
        o_accum, lse_accum = self.workspace_views(q, tile_scheduler_metadata, workspace)
        self.decode(q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata, num_splits, out, lse,
                    o_accum, lse_accum, softmax_scale, cutlass.Int32(0), cutlass.Int32(1), cutlass.Int32(0), stream)
        max_tiles = self.merge_tiles(block_table)
        if cutlass.const_expr(self.mode in ("merge-l8", "merge-w8", "merge-n16", "merge-y2", "merge-alt",
                                            "merge-alt2")):
            self.merge(o_accum, lse_accum, num_splits, tile_scheduler_metadata, out, lse, max_tiles, stream,
                       use_pdl=True)
        if cutlass.const_expr(self.mode == "merge-old"):  # a previous module: its own signature
            self.merge(o_accum, lse_accum, num_splits, tile_scheduler_metadata, out, lse, stream, use_pdl=True)
        if cutlass.const_expr(self.mode == "merge-nopdl"):
            self.merge(o_accum, lse_accum, num_splits, tile_scheduler_metadata, out, lse, max_tiles, stream,
                       use_pdl=False)
        if cutlass.const_expr(self.mode in ("wait", "exit")):
            self.tail(tile_scheduler_metadata, stream)


def measure(cfg, variant: str, replays: int, entry_cls, compiled: dict, modes=DEFAULT_MODES) -> dict:
    from perf_table import bench
    from pipelines.launch import TVM_FFI_OPTION, entry_args
    from probe_setup import planned_entry

    inp, dec, config = planned_entry(cfg, variant)
    fns = {}
    for mode in modes:
        if mode in ("merge", "grid"):
            fns[mode] = (dec._launches[variant], int(mode == "grid"))

        else:
            key = (config, mode)
            if key not in compiled:
                compiled[key] = cute.compile(entry_cls(config, mode), *entry_args(config), options=TVM_FFI_OPTION)
            fns[mode] = compiled[key]
    graphs, outs = bench.capture_entries(fns, inp, dec)
    # The merge modes must agree (same kernels, PDL or not): a cheap guard that the entries are right.
    diffs = {}
    for mode in [m for m in modes if m.startswith("merge-") or m == "grid"]:
        d = (outs["merge"].float() - outs[mode].float()).abs()
        diffs[mode] = (float(d.nan_to_num(nan=float("inf")).max()), int(outs[mode].isnan().sum()))
    print(f"    max |out - merge's out|, NaN count: {diffs}", flush=True)
    samples = bench.time_graphs_interleaved(graphs, replays=replays)
    med = {m: round(statistics.median(s), 2) for m, s in samples.items()}
    splits = dec.num_splits.tolist()
    n_split = sum(1 for a, b in zip(splits, splits[1:]) if b - a > 1)
    row = dict(config=cfg.label(), variant=variant, parts=int(dec.tile_scheduler_metadata.shape[0]),
               chunks=int(splits[-1]), split_requests=n_split, medians=med)
    print(f"  {cfg.label():<24} parts {row['parts']} chunks {row['chunks']} split requests {n_split}: "
          + ", ".join(f"{m} {v:.2f}" for m, v in med.items()), flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", action="append", default=[], help="page,b,s_q,h_q,seqlen")
    ap.add_argument("--variant", default="2wg")
    ap.add_argument("--replays", type=int, default=300)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES),
                    help=f"comma-separated, from {','.join(MODES)} (merge-old needs $MERGE_OLD, merge-alt "
                         "$MERGE_ALT, merge-alt2 $MERGE_ALT2)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    import torch

    from perf_table import grid

    configs = [grid.Config(*(int(x) for x in c.split(","))) for c in args.config] or [grid.Config(*c) for c in CONFIGS]
    print(f"{torch.cuda.get_device_name(0)}; us = median of {args.replays} graph replays per graph", flush=True)
    entry_cls, compiled, rows = ModeEntry, {}, []
    for p in range(args.passes):
        for cfg in configs:
            rows.append(dict(measure(cfg, args.variant, args.replays, entry_cls, compiled, args.modes.split(",")),
                             rep=p))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(dict(device=torch.cuda.get_device_name(0), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
