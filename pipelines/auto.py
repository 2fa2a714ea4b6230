"""``pipeline="auto"``: which variant runs a shape, decided from one measured perf run.

``mla`` resolves ``pipeline="auto"`` to ``MLA_PIPELINE`` when that is set to a variant, else to
``choose(...)`` for the call's shape among the available variants that serve its page size.

Key (``shape_key``): only what the host knows without a device sync: the page size, s_q, h_q,
h_kv, the batch size and, as the KV-length proxy, the block table's capacity
``block_table.shape[1] * page_size`` (the longest sequence the call can address; the lengths
themselves live on the device). Engines that size the block table to the batch's longest request
give auto the true length (rounded up to the page); engines that pass a fixed max-context width
(e.g. 128K tokens) get the choice measured for the longest contexts of the run, whatever their
requests' real lengths. ``python -m perf_table run`` sizes every block table to its batch's
longest request (``perf_table.grid.Config.kv_capacity``): uniform configs have capacity =
seqlen, varlen ones the longest drawn length rounded up to the page.

Derivation (``derive``), from one or more run files of ``python -m perf_table run`` (pipelines
measured in the same run, on the same machine, back to back, are comparable; so the runs are
combined by their ratios, never row against row of another run):
1. Rows that the library runs by default: no error, ``multicast`` None or True (the ``mc-off`` rows
   are the A/B of a switch, not the default path), and not the run's own ``auto`` rows.
   A config whose replays were disturbed is left out of that run: any of its rows has a median more
   than ``DISTURBED`` times its fastest replay (``us_min``). Steady timings sit within about 1.1x of
   their fastest replay; the few disturbed ones seen (small configs early in a run, e.g. 2wg at page
   64 b1 h16 1024 read 18.9 us with replays down to 8.6, against 9.1 in the next run) are bimodal,
   and one of them sent that key to a pipeline 30% slower.
2. In each run, configs measured by at least two pipelines are grouped by key; each pipeline's time
   on a key is the geometric mean of its times on the group's configs (with the full grid every
   config has a key of its own, so this is the config's time).
3. Over the runs that measured a key with the same pipelines, each pipeline's time is the geometric
   mean of its per-run times: the ratio of two pipelines' combined times is the geometric mean of
   their per-run ratios, so a faster or slower machine moves both alike.
4. The key's entry is the pipeline with the lower combined time; within ``TIE`` of ``DEFAULT`` the
   entry is ``DEFAULT`` (no switching on noise).
5. A key of at most ``NARROW_ROWS`` query rows per kv head that only runs dated before
   ``NARROW_SINCE`` measured is 2wg's (its ``measured_pipeline`` says what those runs favoured): they
   timed 2wg without the narrow kernel it runs there now, which beat 3wg on every such row measured
   since (see ``NARROW_SINCE``).
Why several runs: where the two pipelines are within a few percent, their ratio moves by 2-4% from
run to run (machines of one kind differ; docs/perf-notes.md, tenth session), so a table from one run
picked, on such rows, whichever pipeline that run happened to favour (page 16 b1 h128 1024 keys: 3wg
at x0.937 in the 6ee086f run, x1.02-1.045 in the four runs after it). A run that measured one
pipeline only adds nothing: with no run of two pipelines every shape gets ``DEFAULT``.

Lookup (``choose``): the entry of the nearest measured key. Nearest: same loader (TMA pages or
cp.async gather pages, ``pipelines.paged_kv``) only, then lexicographically the smallest |log2|
distance in page size, then in batch x h_kv (a kv head's CTAs walk the whole batch, so h_kv kv
heads of b requests make about the CTA work of b * h_kv requests of one kv head), then s_q, then
query heads per kv head, then block-table capacity, then h_kv; of equally near keys the first in
the table (sorted by key) wins. This order predicted held-out shapes of the 083cd93 run best
(leaving out every length of one (page, b, s_q, h_q): 19 of 372 configs got a pipeline more than
2% slower, against 27 with s_q and heads before batch and 23 for 2wg everywhere); capacity comes
last because the winner changes least along it. The grid measures h_kv 1 only, so h_kv's place is
a guess. No entry, or a winner that is not among the candidates: ``DEFAULT`` if it is a
candidate, else the first candidate.
``choices`` lists every variant ``choose`` can return for a shape when the batch size and/or the
capacity are left open (what ``MLADecoder.plan`` and ``mla.precompile --pipeline auto`` load).

Regenerate the committed table (``pipelines/auto_table.py``) from the full-grid runs that hold both
pipelines at the current kernels, and read the report it prints (per run, every row where the
choice is more than ``SLOWER`` slower than that run's fastest pipeline for that config)::

    python -m pipelines.auto perf_table/results/<device>_<date>_<commit>.json [more runs ...]

``python -m pipelines.auto --check`` re-derives the table from the runs it names (``SOURCES``) and
fails if the committed file differs (the CPU tests do the same). ``python -m pipelines.auto --verify RUN_FILE``
reads a run that also measured ``auto`` rows (``python -m perf_table run`` with both pipelines) and
prints, per config, auto's time against the faster variant's; exit 1 if any is more than ``SLOWER``
slower. The comparison is the auto row's paired ratio against the faster variant (the median over
rounds of auto's replay time / that variant's replay time in the same round; runs from the tenth
session on record it) and, for runs without it, the ratio of the two medians. Both are printed: two
timings of one kernel land within 0.6% of each other by the paired ratio, and up to 4% apart by
medians (docs/perf-notes.md, tenth session).
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import pathlib
import sys
from collections.abc import Sequence

DEFAULT = "2wg"
AUTO = "auto"  # the pipeline name of a run's auto rows
TIE = 0.01  # a winner must be more than 1% faster (geomean over the key's configs) than DEFAULT
DISTURBED = 1.4  # step 1: a config with a row whose median is over 1.4x its fastest replay is left out
SLOWER = 0.02  # the report flags rows where the choice is more than 2% slower than the fastest
GATHER_PAGES = (1, 2, 4, 8)  # pipelines.paged_kv.GATHER_PAGE_SIZES (not imported: it imports the DSL)
KEY_FIELDS = ("page_size", "s_q", "h_q", "h_kv", "batch", "kv_capacity")
# Runs dated before NARROW_SINCE measured "2wg" before it had its narrow kernel (pipelines.
# variant_2wg_narrow, which "2wg" runs at <= 32 query rows per kv head; at <= 16 since commit b4ec690).
# Paired against 3wg on an H100 (docs/perf-notes.md, sixteenth session) the narrow 2wg at <= 16 rows was
# faster on all 14 rows measured (h16 s1 and h8 s2; pages 1, 16, 64; b1-b128; 1024-16384 keys) by 1-28%,
# so a key of at most NARROW_ROWS rows per kv head that only such runs measured gets 2wg (step 5). At
# 17-32 rows the narrow kernel is within 1.3% of the 64-row 2wg on batches (1% ahead of 3wg at the one
# page-1 row measured, where the table has 3wg on some keys by 1-3%): those keys keep what was measured.
NARROW_ROWS = 16
NARROW_SINCE = "2026-11-25T22:20:00Z"

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
TABLE_FILE = PACKAGE_DIR / "auto_table.py"
REPO_DIR = PACKAGE_DIR.parent


def kv_capacity(max_pages: int, page_size: int) -> int:
    """The KV-length proxy of a call: the tokens its block table can address."""
    return int(max_pages) * int(page_size)


def shape_key(page_size: int, s_q: int, h_q: int, h_kv: int, batch: int, kv_capacity: int) -> tuple[int, ...]:
    """The key of a decode shape: (page size, s_q, h_q, h_kv, batch size, block-table capacity)."""
    return (int(page_size), int(s_q), int(h_q), int(h_kv), int(batch), int(kv_capacity))


def row_kv_capacity(row: dict) -> int:
    """The block-table capacity a perf row was measured with: its ``kv_capacity`` field, or for rows of
    runs made before the field existed, recomputed as the runner sizes the block table (the longest
    request's pages; varlen lengths redrawn with ``perf_table.grid``, the runner's own definition)."""
    if row.get("kv_capacity") is not None:
        return int(row["kv_capacity"])
    page = row["page_size"]
    if row["varlen"]:
        from perf_table.grid import varlen_lengths  # CLI / test path only: pure Python + numpy

        longest = max(varlen_lengths(row["b"], row["seqlen"]))
    else:
        longest = row["seqlen"]
    return max(-(-longest // page), 1) * page


def _row_key(row: dict) -> tuple[int, ...]:
    return shape_key(row["page_size"], row["s_q"], row["h_q"], row.get("h_kv", 1), row["b"], row_kv_capacity(row))


def _config(row: dict) -> tuple:
    # No multicast field: on the default path one pipeline runs a config with its cluster (True) and
    # another without one (None, e.g. the seesaw), and both are the same config to compare; the mc-off
    # rows (False) never reach a comparison (``_default_path``).
    return (row["dtype"], row["page_size"], row["b"], row["s_q"], row["h_q"], row.get("h_kv", 1), row["seqlen"],
            row["varlen"])


def _default_path(row: dict) -> bool:
    return row.get("error") is None and row.get("us") is not None and row.get("multicast") is not False


def default_path_times(run: dict) -> dict[tuple, dict[str, float]]:
    """{config: {pipeline: us}} of the run's variant rows on the library's default path (step 1;
    the run's ``auto`` rows are left out: they measure the choice, they do not inform it; so are the
    configs with a disturbed row, ``_disturbed``)."""
    disturbed = _disturbed_configs(run)
    times: dict[tuple, dict[str, float]] = {}
    for row in run["rows"]:
        if _default_path(row) and row["pipeline"] != AUTO and _config(row) not in disturbed:
            times.setdefault(_config(row), {})[row["pipeline"]] = float(row["us"])
    return times


def _disturbed_configs(run: dict) -> set[tuple]:
    """The configs of ``run`` with a ``_disturbed`` row."""
    return {_config(row) for row in run["rows"] if _disturbed(row)}


def _disturbed(row: dict) -> bool:
    """Step 1: the row's median is more than ``DISTURBED`` times its fastest replay (runs without
    ``us_min`` have no such rows). Any row of a config counts, its auto and mc-off rows too: a config's rows
    are replayed interleaved in the same rounds, so what disturbed one fell on the rounds of all."""
    us, us_min = row.get("us"), row.get("us_min")
    return us is not None and bool(us_min) and us > DISTURBED * us_min


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _run_key_times(run: dict) -> dict[tuple, tuple[dict[str, float], int]]:
    """Step 2 for one run: ``{key: ({pipeline: geomean us over the key's configs}, configs)}`` for the
    keys that two or more pipelines measured on every one of their configs."""
    groups: dict[tuple, list[dict[str, float]]] = {}
    rows_by_config = {_config(r): r for r in run["rows"]}
    for config, by_pipeline in default_path_times(run).items():
        if len(by_pipeline) >= 2:
            groups.setdefault(_row_key(rows_by_config[config]), []).append(by_pipeline)
    out = {}
    for key, configs in groups.items():
        common = sorted(set.intersection(*(set(c) for c in configs)))
        if len(common) >= 2:
            out[key] = ({p: _geomean([c[p] for c in configs]) for p in common}, len(configs))
    return out


def derive(runs: dict | Sequence[dict]) -> list[dict]:
    """The table's entries from one run or several: ``{"key": [page, s_q, h_q, h_kv, b, kv_capacity],
    "pipeline": name, "geomean_us": {pipeline: us}, "configs": n, "runs": r}``, sorted by key (steps 2
    to 4 of the module docstring; ``geomean_us`` is the combined time over the ``r`` runs, ``configs``
    the configs summed over them)."""
    runs = [runs] if isinstance(runs, dict) else list(runs)
    per_run = [_run_key_times(run) for run in runs]
    entries = []
    for key in sorted(set().union(*per_run)):
        measured = [times[key] for times in per_run if key in times]
        before_narrow = all(_before_narrow(run) for run, times in zip(runs, per_run) if key in times)
        common = sorted(set.intersection(*(set(geo) for geo, _ in measured)))
        if len(common) < 2:
            continue
        geo = {p: _geomean([g[p] for g, _ in measured]) for p in common}
        best = min(common, key=lambda p: (geo[p], p))
        if DEFAULT in geo and geo[best] > geo[DEFAULT] * (1 - TIE):
            best = DEFAULT
        entry = {"key": list(key), "pipeline": best, "geomean_us": {p: round(geo[p], 3) for p in common},
                 "configs": sum(n for _, n in measured), "runs": len(measured)}
        page, s_q, h_q, h_kv = key[:4]
        if before_narrow and "2wg" in common and h_q // h_kv * s_q <= NARROW_ROWS and best != "2wg":
            entry["pipeline"] = "2wg"  # step 5: the runs timed 2wg without its narrow kernel
            entry["measured_pipeline"] = best
        entries.append(entry)
    return entries


def _before_narrow(run: dict) -> bool:
    """Whether a run predates the narrow 2wg kernel (``NARROW_SINCE``; a run without a date does not)."""
    date = run.get("date")
    return date is not None and date < NARROW_SINCE


# ------------------------------------------------------------------------------------------ lookup

def _coords(page_size, s_q, h_q, h_kv, batch, capacity) -> tuple[bool, tuple]:
    """(gather loader?, the log2 coordinates in distance order: page, batch x h_kv, s_q, heads per kv
    head, capacity, h_kv). A batch or capacity of None (unknown) is None: no distance in that
    coordinate."""
    def lg(x):
        return None if x is None else math.log2(max(x, 1))  # an empty batch or block table: as 1

    return (page_size in GATHER_PAGES,
            (lg(page_size), None if batch is None else lg(batch * h_kv), lg(s_q), lg(h_q / h_kv), lg(capacity),
             lg(h_kv)))


_CAPACITY = 4  # index of the capacity in the coordinates
_BATCH = 1


def _prepare(entries: Sequence[dict]) -> list[tuple[bool, tuple, str]]:
    return [(*_coords(*e["key"]), e["pipeline"]) for e in entries]


_prepared_cache: list = [None, None]  # [entries object, its prepared form]: slower_rows reuses one table


def _prepared(entries: Sequence[dict]) -> list[tuple[bool, tuple, str]]:
    if _prepared_cache[0] is not entries:
        _prepared_cache[:] = [entries, _prepare(entries)]
    return _prepared_cache[1]


def _nearest(prepared, gather: bool, coords: tuple) -> str | None:
    best, best_distance = None, None
    for e_gather, e_coords, pipeline in prepared:
        if e_gather != gather:
            continue
        distance = tuple(0.0 if q is None else abs(q - c) for q, c in zip(coords, e_coords))
        if best_distance is None or distance < best_distance:  # strict: ties keep the earlier (smaller) key
            best, best_distance = pipeline, distance
    return best


def _pick(winner: str | None, candidates: Sequence[str]) -> str:
    if winner is not None and winner in candidates:
        return winner
    if DEFAULT in candidates or not candidates:
        return DEFAULT
    return candidates[0]


def choose(page_size: int, s_q: int, h_q: int, h_kv: int, batch: int | None, kv_capacity: int | None,
           candidates: Sequence[str], entries: Sequence[dict] | None = None) -> str:
    """The pipeline for a shape: the nearest measured key's entry, if it is one of ``candidates``
    (the available pipelines that serve ``page_size``); else ``DEFAULT`` if that is a candidate, else
    the first candidate (``DEFAULT`` when there is none: the caller's kernel checks then say why).
    ``kv_capacity``: ``block_table.shape[1] * page_size``; None for it or ``batch`` (not known, e.g.
    a symbolic size while tracing) leaves that coordinate out of the distance. ``entries``: default the committed table
    (lookups on it are cached)."""
    if entries is None:
        return _choose_committed(int(page_size), int(s_q), int(h_q), int(h_kv), None if batch is None else int(batch),
                                 None if kv_capacity is None else int(kv_capacity), tuple(candidates))
    gather, coords = _coords(page_size, s_q, h_q, h_kv, batch, kv_capacity)
    return _pick(_nearest(_prepared(entries), gather, coords), candidates)


@functools.lru_cache(maxsize=4096)
def _choose_committed(page_size, s_q, h_q, h_kv, batch, capacity, candidates):
    gather, coords = _coords(page_size, s_q, h_q, h_kv, batch, capacity)
    return _pick(_nearest(_committed_prepared(), gather, coords), candidates)


@functools.lru_cache(maxsize=1)
def _committed_prepared():
    return _prepare(load_entries())


def clear_caches() -> None:
    """Forget the cached lookups on the committed table (tests that substitute ``auto_table.ENTRIES``)."""
    _choose_committed.cache_clear()
    _choices_committed.cache_clear()
    _committed_prepared.cache_clear()


def choices(page_size: int, s_q: int, h_q: int, h_kv: int, candidates: Sequence[str], *, batch: int | None = None,
            kv_capacity: int | None = None, entries: Sequence[dict] | None = None) -> tuple[str, ...]:
    """Every pipeline ``choose`` can return for this shape when ``batch`` and/or ``kv_capacity`` are
    left open (None: any value), in ``candidates`` order. With the lexicographic nearest-key rule it
    is enough to try the open coordinates at each entry's own values (an entry chosen for some value
    is also chosen at its own: its distance there is 0 in those coordinates and unchanged in the
    others)."""
    if entries is None:
        return _choices_committed(int(page_size), int(s_q), int(h_q), int(h_kv), tuple(candidates),
                                  None if batch is None else int(batch),
                                  None if kv_capacity is None else int(kv_capacity))
    return _choices(_prepared(entries), page_size, s_q, h_q, h_kv, tuple(candidates), batch, kv_capacity)


@functools.lru_cache(maxsize=1024)
def _choices_committed(page_size, s_q, h_q, h_kv, candidates, batch, capacity):
    return _choices(_committed_prepared(), page_size, s_q, h_q, h_kv, candidates, batch, capacity)


def _choices(prepared, page_size, s_q, h_q, h_kv, candidates, batch, capacity) -> tuple[str, ...]:
    gather, coords = _coords(page_size, s_q, h_q, h_kv, batch, capacity)
    open_at = {(None if batch is not None else e_coords[_BATCH], None if capacity is not None else e_coords[_CAPACITY])
               for e_gather, e_coords, _ in prepared if e_gather == gather}
    found = set()
    for at_batch, at_capacity in open_at or {(None, None)}:
        query = list(coords)
        if at_batch is not None:
            query[_BATCH] = at_batch
        if at_capacity is not None:
            query[_CAPACITY] = at_capacity
        found.add(_pick(_nearest(prepared, gather, tuple(query)), candidates))
    return tuple(sorted(found, key=lambda p: (list(candidates).index(p) if p in candidates else len(candidates), p)))


# ----------------------------------------------------------------------------------------- reports

def slower_rows(run: dict, entries: Sequence[dict]) -> list[tuple[tuple, str, float, str, float]]:
    """(config, chosen pipeline, its us, fastest pipeline, its us) for every config measured by two or
    more pipelines where the choice is more than ``SLOWER`` slower than the fastest."""
    out = []
    rows_by_config = {_config(r): r for r in run["rows"]}
    for config, by_pipeline in sorted(default_path_times(run).items(), key=lambda kv: repr(kv[0])):
        if len(by_pipeline) < 2:
            continue
        chosen = choose(*_row_key(rows_by_config[config]), sorted(by_pipeline), entries)
        if chosen not in by_pipeline:
            continue
        fastest = min(by_pipeline, key=lambda p: (by_pipeline[p], p))
        if by_pipeline[chosen] > by_pipeline[fastest] * (1 + SLOWER):
            out.append((config, chosen, by_pipeline[chosen], fastest, by_pipeline[fastest]))
    return out


def verify(run: dict) -> list[dict]:
    """One line per default-path config of ``run`` that has an ``auto`` row and at least two variant
    rows: ``{"config", "auto_us", "resolved", "fastest", "fastest_us", "ratio" (auto / fastest, by
    medians), "paired" (the auto row's paired ratio against the fastest, None where the run has
    none), "resolved_ratio" (the resolved variant's own row / fastest, None if not measured),
    "slower" (the paired ratio, else the ratio, > 1 + SLOWER, on a config whose replays were not disturbed),
    "disturbed" (a row of the config is ``_disturbed``: its times say little either way)}``, in config order.
    ``resolved_ratio`` tells a wrong choice (above 1 + SLOWER too) from the noise between two timings
    of the same kernel (within it)."""
    times: dict[tuple, dict[str, float]] = {}
    resolved: dict[tuple, str | None] = {}
    paired: dict[tuple, dict] = {}
    disturbed = _disturbed_configs(run)
    for row in run["rows"]:
        if _default_path(row):
            times.setdefault(_config(row), {})[row["pipeline"]] = float(row["us"])
            if row["pipeline"] == AUTO:
                resolved[_config(row)] = row.get("resolved")
                paired[_config(row)] = row.get("paired") or {}
    out = []
    for config in sorted(times, key=repr):
        by_pipeline = dict(times[config])
        if AUTO not in by_pipeline:
            continue
        auto_us = by_pipeline.pop(AUTO)
        if len(by_pipeline) < 2:
            continue
        fastest = min(by_pipeline, key=lambda p: (by_pipeline[p], p))
        best = by_pipeline[fastest]
        variant = resolved.get(config)
        pair = paired[config].get(fastest)
        out.append({"config": config, "auto_us": auto_us, "resolved": variant, "fastest": fastest, "fastest_us": best,
                    "ratio": auto_us / best, "paired": pair,
                    "resolved_ratio": by_pipeline[variant] / best if variant in by_pipeline else None,
                    "slower": config not in disturbed and (pair if pair is not None else auto_us / best) > 1 + SLOWER,
                    "disturbed": config in disturbed})
    return out


def _config_label(config: tuple) -> str:
    dtype, page, b, s_q, h_q, h_kv, seqlen, varlen = config
    length = f"L~{seqlen} varlen" if varlen else f"L{seqlen}"
    return f"{dtype} p{page} b{b} s{s_q} h{h_q}{f' hkv{h_kv}' if h_kv != 1 else ''} {length}"


def print_verify(lines: list[dict], source: str) -> int:
    """Print ``verify``'s lines; returns the exit code (1 if any is SLOWER or there is nothing to verify)."""
    if not lines:
        print(f"{source}: no config with an auto row and two variant rows (run python -m perf_table run with both "
              f"pipelines)")
        return 1
    for line in lines:
        own = "-" if line["resolved_ratio"] is None else f"x{line['resolved_ratio']:.3f}"
        pair = "-" if line["paired"] is None else f"x{line['paired']:.3f}"
        print(f"  {_config_label(line['config']):<34} auto ({line['resolved'] or '?'}) {line['auto_us']:9.1f} us  "
              f"fastest {line['fastest']} {line['fastest_us']:9.1f} us  medians x{line['ratio']:.3f}  paired {pair}  "
              f"(its own row {own}){'  SLOWER' if line['slower'] else ''}"
              f"{'  disturbed (not judged)' if line.get('disturbed') else ''}")
    slow = [line for line in lines if line["slower"]]
    by_medians = [line for line in lines if line["ratio"] > 1 + SLOWER]
    noise = [line for line in slow if line["resolved_ratio"] is not None and line["resolved_ratio"] <= 1 + SLOWER]
    worst = max(lines, key=lambda line: line["ratio"])
    with_pair = [line for line in lines if line["paired"] is not None]
    paired_note = ""
    if with_pair:
        worst_pair = max(with_pair, key=lambda line: line["paired"])
        paired_note = (f"; paired ratios on {len(with_pair)} configs, worst x{worst_pair['paired']:.3f} "
                       f"({_config_label(worst_pair['config'])})")
    shaken = sum(1 for line in lines if line.get("disturbed"))
    print(f"{source}: {len(lines)} configs with auto and both variants ({shaken} disturbed, not judged); "
          f"{len(lines) - len(slow) - shaken} within {SLOWER:.0%} of the faster variant, {len(slow)} SLOWER "
          f"({len(noise)} of them where the resolved variant's "
          f"own row is within {SLOWER:.0%}: the two timings of one kernel differ, not the choice){paired_note}; "
          f"by medians {len(lines) - len(by_medians)} within, worst x{worst['ratio']:.3f} "
          f"({_config_label(worst['config'])})")
    return 1 if slow else 0


def render(sources: str | Sequence[str], entries: Sequence[dict]) -> str:
    """The text of ``pipelines/auto_table.py`` (deterministic)."""
    sources = [sources] if isinstance(sources, str) else list(sources)
    lines = [
        '"""The table of ``pipeline="auto"``, generated by ``python -m pipelines.auto SOURCES...``: do not edit.',
        "",
        "``pipelines/auto.py`` says how the entries are derived from the run files SOURCES and looked up.",
        '"""',
        "",
        "SOURCES = [",
    ]
    lines += [f"    {src!r}," for src in sources]
    lines += [
        "]",
        "",
        "# key: [page_size, s_q, h_q, h_kv, batch, kv_capacity (block_table.shape[1] * page_size)];",
        "# pipeline: the faster one there; geomean_us: each pipeline's geometric-mean time over the key's",
        "# configs, combined over the runs of SOURCES that measured the key (runs: how many).",
        "ENTRIES = [",
    ]
    lines += [f"    {json.dumps(e, sort_keys=True)}," for e in entries]
    lines += ["]", ""]
    return "\n".join(lines)


def load_entries() -> list[dict]:
    """The committed table's entries."""
    from pipelines import auto_table

    return auto_table.ENTRIES


def _load_json(path: pathlib.Path) -> dict:
    """A run file, plain or gzip-compressed (``.json.gz``, as ``perf_table/results`` stores large runs)."""
    if path.suffix == ".gz":
        import gzip

        return json.loads(gzip.decompress(path.read_bytes()))
    return json.loads(path.read_text())


def _read_run(path: str) -> tuple[str, dict]:
    resolved = pathlib.Path(path).resolve()
    try:
        source = resolved.relative_to(REPO_DIR).as_posix()
    except ValueError:
        source = str(resolved)
    return source, _load_json(resolved)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.auto", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", metavar="run",
                        help="run files of python -m perf_table run (paths from the repo root), combined by ratios")
    parser.add_argument("--check", action="store_true",
                        help="re-derive from the committed table's SOURCES; exit 1 if the file differs")
    parser.add_argument("--verify", metavar="RUN_FILE",
                        help="a run holding auto rows: auto's time vs the faster variant's per config; exit 1 if "
                             f"any is more than {SLOWER * 100:.0f}%% slower")  # %% : argparse %-formats help
    args = parser.parse_args(argv)
    if args.verify:
        source, run = _read_run(args.verify)
        return print_verify(verify(run), source)
    if args.check:
        from pipelines import auto_table

        sources = list(auto_table.SOURCES)
        runs = [_load_json(REPO_DIR / source) for source in sources]
    elif args.runs:
        sources, runs = map(list, zip(*(_read_run(path) for path in args.runs)))
    else:
        parser.error("give run files, --check or --verify RUN_FILE")
    entries = derive(runs)
    text = render(sources, entries)
    if args.check:
        same = TABLE_FILE.read_text() == text
        print(f"{TABLE_FILE.name}: {'up to date' if same else 'differs from a fresh derivation'} "
              f"({', '.join(sources)})")
        return 0 if same else 1
    TABLE_FILE.write_text(text)
    pipelines_measured = sorted({r["pipeline"] for run in runs for r in run["rows"]} - {AUTO})
    by_winner = {p: sum(e["pipeline"] == p for e in entries) for p in sorted({e["pipeline"] for e in entries})}
    print(f"wrote {TABLE_FILE.relative_to(REPO_DIR)}: {len(entries)} keys from {len(sources)} run(s) "
          f"(pipelines in the runs: {', '.join(pipelines_measured)}; entries: "
          + ", ".join(f"{p} {n}" for p, n in by_winner.items()) + ")")
    for e in entries:
        if e["pipeline"] != DEFAULT:
            print("  " + " ".join(f"{name} {value}" for name, value in zip(KEY_FIELDS, e["key"]))
                  + f": {e['pipeline']}  " + "  ".join(f"{p} {us:.1f} us" for p, us in sorted(e["geomean_us"].items())))
    for source, run in zip(sources, runs):
        slow = slower_rows(run, entries)
        print(f"{source}: rows where the table's choice is more than {SLOWER:.0%} slower than the run's fastest "
              f"pipeline: {len(slow)}")
        for config, chosen, us, fastest, best_us in slow:
            print(f"  {config}: {chosen} {us:.1f} us, {fastest} {best_us:.1f} us (x{us / best_us:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
