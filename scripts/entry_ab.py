"""Kernel forms side by side on one plan (CUDA-graph replays, interleaved rounds, bf16, one process).

    python scripts/entry_ab.py [--config 64,128,1,128,4096 ...] [--mode 2wg --mode 2wg-evict-first ...]
                               [--replays 300] [--passes 2] [--json F]

For each config one ``MLADecoder`` is planned (2wg's plan; every variant reads the same plan layout);
each ``--mode`` compiles the decode entry with one kernel class (``MODES``: a variant, or a subclass
that changes one class constant), captures it in its own graph on the same inputs and plan
(``perf_table.bench.capture_entries``), and the graphs are timed in interleaved rounds, ``--passes``
times (``--calls N``: N decodes in a row per graph, medians per decode). Printed: medians and each
mode's paired ratio against the first mode (median over rounds of
its replay / the first mode's replay in the same round). Outputs are compared with the first mode's:
modes that only change a load's cache policy must match bit for bit; the others to bf16 rounding.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIGS = ((64, 128, 1, 128, 4096), (64, 128, 2, 128, 4096), (64, 128, 1, 128, 1024), (64, 64, 1, 128, 1024),
           (64, 128, 1, 128, 16384), (64, 128, 2, 64, 4096), (64, 64, 1, 64, 1024), (64, 128, 1, 16, 4096),
           (64, 1, 1, 128, 16384), (64, 8, 1, 64, 4096))

from pipelines import paged_kv  # noqa: E402,F401  (first: it pins the DSL's target arch)
from pipelines.variant_2wg import MLADecode2WG  # noqa: E402
from pipelines.variant_2wg_narrow import MLADecode2WGNarrow  # noqa: E402


def _sub(base, **attrs):
    return type(f"{base.__name__}_ab", (base,), attrs)


# mode -> (variant of the entry config, the kernel: None for the library's, a class, or a dict of class
# constants set on a subclass of the library's kernel for the configuration (``launch._kernel_class``: for
# 2wg its narrow kernel at <= 32 rows per kv head, else the 64-row one; a dict's ``_config``: DecodeConfig
# fields to override, e.g. ``cluster``), bit-identical to the first mode)
MODES = {
    "2wg": ("2wg", None, True),  # the library's 2wg (K loads evict_first; the narrow kernel at <= 32 rows)
    "2wg-wide": ("2wg", MLADecode2WG, False),  # 2wg's 64-row products whatever the row count
    "2wg-no-hint": ("2wg", dict(kv_l2_hint=None), True),
    "2wg-l2-prefetch": ("2wg", dict(l2_prefetch_ahead=2), True),  # K tiles into L2 two ahead (64-row kernel)
    "2wg-no-short": ("2wg", dict(l2_prefetch_chunk_tiles=0), True),  # short chunks not prefetched
    "2wg-l2-short6": ("2wg", dict(l2_prefetch_chunk_tiles=6), True),  # chunks <= 6 tiles into L2
    "2wg-l2-short16": ("2wg", dict(l2_prefetch_chunk_tiles=16), True),
    "2wg-evict-first": ("2wg", dict(kv_l2_hint="evict_first"), True),
    "2wg-no-pdl": ("2wg", dict(dependent_launch=False), True),  # plain launch of the decode
    "2wg-head-late": ("2wg", dict(head_pages_early=False), True),  # a chunk's first page ids after its length
    "2wg-head-in-turn": ("2wg", dict(head_tiles_in_turn=True), True),  # the first chunk's tile 1 once tile 0 landed
    "2wg-head-together": ("2wg", dict(head_tiles_in_turn=False), True),  # both head tiles at once (before)
    "2wg-refill-late": ("2wg", dict(refill_pages_early=False), True),  # pages 64/128: refill page id after the release
    "2wg-q-warp0": ("2wg", dict(q_warp_apart=False), True),  # Q's TMA from the K producer warp 0 (narrow kernel)
    "2wg-q-apart": ("2wg", dict(q_warp_apart=True), True),  # Q's TMA from a warp without K boxes (64-row kernel)
    "2wg-evict-last": ("2wg", dict(kv_l2_hint="evict_last"), True),
    "2wg-chain-max": ("2wg", dict(softmax_tree=False), True),  # 64-row kernel: the row max as one FMNMX chain
    "2wg-early-fence": ("2wg", dict(p_fence_after_pv=False), True),  # 64-row kernel: P_FULL before WG0's P.V issue
    "2wg-p-swizzled": ("2wg", dict(p_interleaved=False), True),  # 64-row kernel: P's tile 128B-swizzled
    "2wg-before-tw": ("2wg", dict(softmax_tree=False, p_fence_after_pv=False, p_interleaved=False), True),  # as before the 20th session
    "2wg-qk-ahead": ("2wg", dict(qk_ahead=True), True),  # 64-row kernel: next QK behind the P.V
    "2wg-qk-ahead-pf2": ("2wg", dict(qk_ahead=True, l2_prefetch_ahead=2), True),
    "2wg-qk-ahead-pf4": ("2wg", dict(qk_ahead=True, l2_prefetch_ahead=4), True),
    "2wg-l2-prefetch4": ("2wg", dict(l2_prefetch_ahead=4), True),
    "2wg-qk-ahead-nowait": ("2wg", dict(qk_ahead=True, qk_ahead_waits_pv=False), True),  # WG1's P.V behind the QK
    "2wg-qk-ahead-nowait-pf2": ("2wg", dict(qk_ahead=True, qk_ahead_waits_pv=False, l2_prefetch_ahead=2), True),
    "2wg-qk-ahead-nowait-pf4": ("2wg", dict(qk_ahead=True, qk_ahead_waits_pv=False, l2_prefetch_ahead=4), True),
    # K stages in two column groups, V's left half refilled after WG0's P.V alone (64-row kernel only)
    "2wg-kg1": ("2wg", dict(kv_groups=1), True),  # one barrier pair per K stage (before the 24th session)
    "2wg-kg2-sq2": ("2wg", dict(kv_groups_rows=(65, 256), kv_groups_sq=(1, 2)), True),  # groups at s_q 2 up to 256 rows
    "2wg-kg2": ("2wg", dict(kv_groups=2), True),  # the default since, where it is taken (65-128 rows, s_q 1)
    "2wg-kg2-all": ("2wg", dict(kv_groups=2, kv_groups_rows=(1, 256)), True),  # any rows (s_q 1 still)
    "2wg-kg2-rope-a": ("2wg", dict(kv_group_cols=((0, 1, 2, 3, 8), (4, 5, 6, 7))), False),  # RoPE with V_L (QK order differs)
    "2wg-kg2-whole": ("2wg", dict(kv_groups=2, kv_groups_qk_split=False), True),  # QK waits for both groups first
    "2wg-kg2-qk-ahead": ("2wg", dict(kv_groups=2, qk_ahead=True), True),
    "2wg-kg2-qk-ahead-early": ("2wg", dict(kv_groups=2, qk_ahead=True, p_fence_after_pv=False), True),  # P_FULL before WG0's P.V
    "2wg-kg2-qk-ahead-nowait": ("2wg", dict(kv_groups=2, qk_ahead=True, qk_ahead_waits_pv=False), True),
    "2wg-narrow": ("2wg", MLADecode2WGNarrow, False),  # both products transposed (at most 32 rows)
    "3wg": ("3wg", None, False),
    "seesaw": ("seesaw", None, False),  # the library's (max-first order; TMA pages: producer warpgroup, L2 ahead at 128+ rows)
    # the scoring warpgroups issue the loads, as on the gather pages (QK(t1') takes G0 first: other sums)
    "seesaw-consumer-loads": ("seesaw", dict(producer_warpgroup=False), False),
    "seesaw-evict-first": ("seesaw", dict(kv_l2_hint="evict_first"), True),  # a cache policy only: bit-identical
    "seesaw-evict-last": ("seesaw", dict(kv_l2_hint="evict_last"), True),
    "seesaw-no-l2": ("seesaw", dict(producer_l2_ahead=False), True),  # the library's without the L2 prefetch
    "seesaw-no-early": ("seesaw", dict(early_releases=False), True),  # WG0's QK(t0') not split (G0(t1) after it)
    "seesaw-mc": ("seesaw", dict(multicast_cluster=True), True),  # in a multicast cluster (the config's, 2wg's)
    # the K waits in front of a QK poll (test_wait) instead of try_wait (``k_wait_spin``, 31st session)
    "seesaw-spin": ("seesaw", dict(k_wait_spin=True), True),
    "seesaw-max-after": ("seesaw", dict(wg1_max_ahead=False), True),  # WG1's row maxima after M0 (before)
    "seesaw-producer-spin": ("seesaw", dict(producer_spin=True), True),  # the producer polls its empty barriers
    "seesaw-keep-p": ("seesaw", dict(clear_p=False), False),  # S not cleared after P's conversion (before)
    "2wg-spin": ("2wg", dict(k_wait_spin=True), True),
    "seesaw-narrow-boxes": ("seesaw", dict(kv_wide_boxes=False), True),  # one TMA copy per 64-column block (before)
    "2wg-wide-boxes": ("2wg", dict(kv_wide_boxes=True), True),  # one TMA copy per column group (or tile)
    "2wg-no-mc": ("2wg", dict(_config=dict(cluster=1)), True),  # no multicast cluster (as MLA_MULTICAST=0)
    "2wg-no-mc-wide": ("2wg", dict(_config=dict(cluster=1), kv_wide_boxes=True), True),  # and one copy per group
    "seesaw-sts": ("seesaw", dict(p_stmatrix=False), True),  # P tiles stored with 4-byte stores (before)
    # the chunk's steady pairs in a loop of their own, compiled without the per-tile checks
    "seesaw-steady": ("seesaw", dict(steady_loop=True), True),
    "seesaw-unsteady": ("seesaw", dict(steady_loop=False), True),  # the baseline once steady_loop is the default
    # the steady loop only where it covers at least 1 / 2 / 4 / 8 pairs (skeleton.steady_min_steps; the seesaw's
    # default is 2 since the thirty-eighth session)
    "seesaw-steady-min1": ("seesaw", dict(steady_min_steps=1), True),
    "seesaw-steady-min2": ("seesaw", dict(steady_min_steps=2), True),
    "seesaw-steady-min4": ("seesaw", dict(steady_min_steps=4), True),
    "seesaw-steady-min8": ("seesaw", dict(steady_min_steps=8), True),
    # no merge kernel launched after the decode (skeleton ``merge_launch``; only on plans that split no request)
    "seesaw-no-merge": ("seesaw", dict(merge_launch=False), True),
    "seesaw-chunk-merge": ("seesaw", dict(chunk_merge=True), False),  # split requests merged by their last chunk
    "seesaw-no-chunk-merge": ("seesaw", dict(chunk_merge=False), False),  # by the merge kernel (before 46th session)
    "2wg-no-merge": ("2wg", dict(merge_launch=False), True),
    # (the 64-row kernel's loops only: at <= 32 rows per kv head the narrow kernel has no steady split)
    "2wg-steady": ("2wg", dict(steady_loop=True), True),
    # and only where it covers at least 2 / 4 / 8 tiles (2wg's steps are tiles)
    "2wg-steady-min2": ("2wg", dict(steady_loop=True, steady_min_steps=2), True),
    "2wg-steady-min4": ("2wg", dict(steady_loop=True, steady_min_steps=4), True),
    "2wg-steady-min8": ("2wg", dict(steady_loop=True, steady_min_steps=8), True),
    "seesaw-late-fence": ("seesaw", dict(early_p_fence=False), True),  # P tiles' proxy fences on the hand-off path (before)
}


def mode_entries(dec, modes, compiled: dict) -> dict:
    """``{mode: compiled decode entry}`` for the configuration ``dec`` (a planned ``mla.MLADecoder``) was
    planned for, each mode's variant and kernel class (``MODES``); ``compiled`` caches them across calls."""
    import dataclasses

    from pipelines.launch import DecodeConfig, _kernel_class, compile_entry, partial_from_env

    shape = dec._planned
    base = DecodeConfig.make("2wg", shape.dtype, shape.h_q, shape.s_q, shape.page_size, shape.causal, 1,
                             paged_kv.multicast_enabled(), partial_from_env(), dec._info.split_cluster)
    entries = {}
    for mode in modes:
        variant, cls, _ = MODES[mode]
        over = {}
        if isinstance(cls, dict) and "_config" in cls:  # DecodeConfig fields the mode overrides (e.g. no cluster)
            cls = dict(cls)
            over = cls.pop("_config")
        key = (dataclasses.replace(base, variant=variant, **over), mode)
        if key not in compiled:
            if isinstance(cls, dict):
                kernel = _kernel_class(variant, key[0])
                unknown = [name for name in cls if not hasattr(kernel, name)]
                if unknown:  # a constant the kernel no longer has would be set and ignored
                    raise SystemExit(f"mode {mode}: {kernel.__name__} has no class constant {unknown}")
                cls = _sub(kernel, **cls)
            compiled[key] = compile_entry(key[0], kernel_class=cls)
        entries[mode] = compiled[key]
    return entries


def measure(cfg, modes, replays: int, passes: int, compiled: dict, calls: int = 1) -> dict:
    import torch

    import mla
    from perf_table import bench, runner

    inp = bench.make_inputs(cfg, device="cuda", seed=0)
    dec = mla.MLADecoder(pipeline="2wg")
    dec.plan(inp.cache_seqlens, num_heads_q=cfg.h_q, seq_len_q=cfg.s_q, num_heads_k=1, page_size=cfg.page_size,
             dtype=inp.q.dtype, causal=cfg.causal)
    graphs, outs = bench.capture_entries(mode_entries(dec, modes, compiled), inp, dec, calls=calls)
    first = modes[0]
    diffs = {}
    for mode in modes[1:]:
        if MODES[mode][2] and MODES[first][0] == MODES[mode][0]:
            if not torch.equal(outs[first], outs[mode]):
                raise SystemExit(f"{cfg.label()}: {mode} does not write {first}'s out bit for bit")
        diffs[mode] = float((outs[mode].float() - outs[first].float()).abs().max())
        if not bool(torch.isfinite(outs[mode]).all()):
            raise SystemExit(f"{cfg.label()}: {mode} wrote non-finite values")
    rows = []
    for p in range(passes):
        samples = bench.time_graphs_interleaved(graphs, replays=replays)
        med = {m: round(statistics.median(s) / calls, 2) for m, s in samples.items()}
        paired = {m: round(runner.paired_ratio(samples[m], samples[first]), 4) for m in modes[1:]}
        rows.append(dict(medians=med, paired=paired))
        print(f"  {cfg.label():<26} pass {p + 1}: " + ", ".join(f"{m} {v:.2f}" for m, v in med.items())
              + "  paired: " + ", ".join(f"{m} {r:.4f}" for m, r in paired.items())
              + ("  max|diff| " + ", ".join(f"{m} {d:.1e}" for m, d in diffs.items()) if p == 0 else ""), flush=True)
    return dict(config=cfg.label(), passes=rows, max_abs_diff=diffs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", action="append", default=[], help="page,b,s_q,h_q,seqlen")
    ap.add_argument("--mode", action="append", default=[], choices=sorted(MODES))
    ap.add_argument("--replays", type=int, default=300)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--calls", type=int, action="append", default=[],
                    help="decodes in a row per graph (medians are per decode): back-to-back calls, as in a model "
                         "step; repeat for several (the kernels compile once); default 1")
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    from perf_table import grid

    modes = args.mode or ["2wg", "2wg-evict-first"]
    configs = [grid.Config(*(int(x) for x in c.split(","))) for c in args.config] or [grid.Config(*c) for c in CONFIGS]
    compiled = {}
    rows = []
    for calls in args.calls or [1]:
        if len(args.calls) > 1:
            print(f"{calls} decode(s) per graph")
        rows += [dict(measure(cfg, modes, args.replays, args.passes, compiled, calls), calls=calls) for cfg in configs]
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(dict(modes=modes, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
