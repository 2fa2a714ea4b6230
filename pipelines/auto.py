"""``pipeline="auto"``: which variant runs a shape, decided from one measured perf run.

Status: the table mechanism only. ``mla`` does not consult it yet (``pipeline="auto"`` means
``MLA_PIPELINE`` or ``"2wg"``); it will once a same-run 2wg/3wg full grid fills the table.

The choice may use only what is known on the host without a sync: the page size, the query rows per
kv head (``h_q * s_q / h_kv``: the m-blocks per request, and with them how compute-heavy a KV tile
is) and the batch size (with the rows, how many CTAs the split plan makes per request). KV lengths
live on the device, so they are not part of the key.

Derivation (``derive``), from ONE run file of ``python -m perf_table run`` (pipelines measured in the
same run, on the same machine, back to back, are comparable; rows of different runs are not):
1. Rows that the library runs by default: no error, ``multicast`` None or True (the ``mc-off`` rows
   are the A/B of a switch, not the default path).
2. Configs measured by at least two pipelines are grouped by key ``(page_size, rows, b)``; each
   pipeline's time on a key is the geometric mean of its times on the group's configs.
3. The key's entry is the pipeline with the lower geomean; within ``TIE`` of ``DEFAULT`` the entry is
   ``DEFAULT`` (no switching on noise).
A run that measured one pipeline only gives an empty table: every shape gets ``DEFAULT``.

Lookup (``choose``): the entry of the nearest measured key among the candidate pipelines. Nearest:
same loader (TMA pages or cp.async gather pages, ``pipelines.paged_kv``) first, then the smallest
|log2| distance in page size, then in rows, then in batch. No entry (or a winner that is not a
candidate): ``DEFAULT``.

Regenerate the committed table (``pipelines/auto_table.py``) after a full-grid run that holds both
pipelines, and read the report it prints (every row where the choice is more than ``SLOWER`` slower
than the run's fastest pipeline for that config)::

    python -m pipelines.auto perf_table/results/<device>_<date>_<commit>.json

``python -m pipelines.auto --check`` re-derives the table from the run it names and fails if the
committed file differs (the CPU tests do the same).
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
from collections.abc import Sequence

DEFAULT = "2wg"
TIE = 0.01  # a winner must be more than 1% faster (geomean over the key's configs) than DEFAULT
SLOWER = 0.02  # the report flags rows where the choice is more than 2% slower than the fastest
GATHER_PAGES = (1, 2, 4, 8)  # pipelines.paged_kv.GATHER_PAGE_SIZES (not imported: it imports the DSL)

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
TABLE_FILE = PACKAGE_DIR / "auto_table.py"
REPO_DIR = PACKAGE_DIR.parent


def shape_key(page_size: int, rows: int, batch: int) -> tuple[int, int, int]:
    """The key of a decode shape: (page size, query rows per kv head, batch size)."""
    return (int(page_size), int(rows), int(batch))


def _row_key(row: dict) -> tuple[int, int, int]:
    # The perf grid runs one kv head, so the rows per kv head are h_q * s_q.
    return shape_key(row["page_size"], row["h_q"] * row["s_q"] // row.get("h_kv", 1), row["b"])


def _config(row: dict) -> tuple:
    return (row["dtype"], row["page_size"], row["b"], row["s_q"], row["h_q"], row.get("h_kv", 1), row["seqlen"],
            row["varlen"], row.get("multicast"))


def default_path_times(run: dict) -> dict[tuple, dict[str, float]]:
    """{config: {pipeline: us}} of the run's rows on the library's default path (step 1)."""
    times: dict[tuple, dict[str, float]] = {}
    for row in run["rows"]:
        if row.get("error") is not None or row.get("us") is None or row.get("multicast") is False:
            continue
        times.setdefault(_config(row), {})[row["pipeline"]] = float(row["us"])
    return times


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def derive(run: dict) -> list[dict]:
    """The table's entries from one run: ``{"key": [page, rows, b], "pipeline": name, "geomean_us":
    {pipeline: us}, "configs": n}``, sorted by key (steps 2 and 3 of the module docstring)."""
    groups: dict[tuple, list[dict[str, float]]] = {}
    rows_by_config = {_config(r): r for r in run["rows"]}
    for config, by_pipeline in default_path_times(run).items():
        if len(by_pipeline) >= 2:
            groups.setdefault(_row_key(rows_by_config[config]), []).append(by_pipeline)
    entries = []
    for key in sorted(groups):
        configs = groups[key]
        common = sorted(set.intersection(*(set(c) for c in configs)))
        if len(common) < 2:
            continue
        geo = {p: _geomean([c[p] for c in configs]) for p in common}
        best = min(common, key=lambda p: (geo[p], p))
        if DEFAULT in geo and geo[best] > geo[DEFAULT] * (1 - TIE):
            best = DEFAULT
        entries.append({"key": list(key), "pipeline": best,
                        "geomean_us": {p: round(geo[p], 3) for p in common}, "configs": len(configs)})
    return entries


def _log2_distance(a: int, b: int) -> float:
    return abs(math.log2(a) - math.log2(b))


def choose(page_size: int, rows: int, batch: int, candidates: Sequence[str], entries: Sequence[dict] | None = None
           ) -> str:
    """The pipeline for a shape: the nearest measured key's entry, if it is one of ``candidates``
    (the available pipelines that serve ``page_size``); else ``DEFAULT``."""
    if entries is None:
        entries = load_entries()
    gather = page_size in GATHER_PAGES
    best, best_distance = None, None
    for entry in entries:
        page, key_rows, key_batch = entry["key"]
        if (page in GATHER_PAGES) != gather:
            continue
        distance = (_log2_distance(page, page_size), _log2_distance(key_rows, rows), _log2_distance(key_batch, batch))
        if best_distance is None or distance < best_distance:
            best, best_distance = entry, distance
    if best is None or best["pipeline"] not in candidates:
        return DEFAULT
    return best["pipeline"]


def slower_rows(run: dict, entries: Sequence[dict]) -> list[tuple[tuple, str, float, str, float]]:
    """(config, chosen pipeline, its us, fastest pipeline, its us) for every config measured by two or
    more pipelines where the choice is more than ``SLOWER`` slower than the fastest."""
    out = []
    rows_by_config = {_config(r): r for r in run["rows"]}
    for config, by_pipeline in sorted(default_path_times(run).items(), key=lambda kv: repr(kv[0])):
        if len(by_pipeline) < 2:
            continue
        page, rows, batch = _row_key(rows_by_config[config])
        chosen = choose(page, rows, batch, list(by_pipeline), entries)
        if chosen not in by_pipeline:
            continue
        fastest = min(by_pipeline, key=lambda p: (by_pipeline[p], p))
        if by_pipeline[chosen] > by_pipeline[fastest] * (1 + SLOWER):
            out.append((config, chosen, by_pipeline[chosen], fastest, by_pipeline[fastest]))
    return out


def render(source: str, entries: Sequence[dict]) -> str:
    """The text of ``pipelines/auto_table.py`` (deterministic)."""
    lines = [
        '"""The table of ``pipeline="auto"``, generated by ``python -m pipelines.auto SOURCE``: do not edit.',
        "",
        "``pipelines/auto.py`` says how the entries are derived from the run file SOURCE and looked up.",
        '"""',
        "",
        f"SOURCE = {source!r}",
        "",
        "# key: [page_size, rows per kv head (h_q * s_q / h_kv), batch]; pipeline: the faster one there;",
        "# geomean_us: each pipeline's geometric-mean time over the key's configs in SOURCE.",
        "ENTRIES = [",
    ]
    lines += [f"    {json.dumps(e, sort_keys=True)}," for e in entries]
    lines += ["]", ""]
    return "\n".join(lines)


def load_entries() -> list[dict]:
    """The committed table's entries."""
    from pipelines import auto_table

    return auto_table.ENTRIES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.auto", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", nargs="?", help="a run file of python -m perf_table run (path from the repo root)")
    parser.add_argument("--check", action="store_true",
                        help="re-derive from the committed table's SOURCE; exit 1 if the file differs")
    args = parser.parse_args(argv)
    if args.check:
        from pipelines import auto_table

        source = auto_table.SOURCE
    elif args.run:
        source = pathlib.Path(args.run).resolve().relative_to(REPO_DIR).as_posix()
    else:
        parser.error("give a run file, or --check")
    run = json.loads((REPO_DIR / source).read_text())
    entries = derive(run)
    text = render(source, entries)
    if args.check:
        same = TABLE_FILE.read_text() == text
        print(f"{TABLE_FILE.name}: {'up to date' if same else 'differs from a fresh derivation'} ({source})")
        return 0 if same else 1
    TABLE_FILE.write_text(text)
    pipelines_measured = sorted({r["pipeline"] for r in run["rows"]})
    print(f"wrote {TABLE_FILE.relative_to(REPO_DIR)}: {len(entries)} keys from {source} "
          f"(pipelines in the run: {', '.join(pipelines_measured)})")
    for e in entries:
        print(f"  page {e['key'][0]:>3} rows {e['key'][1]:>3} b {e['key'][2]:>3}: {e['pipeline']}  "
              + "  ".join(f"{p} {us:.1f} us" for p, us in sorted(e["geomean_us"].items())))
    slow = slower_rows(run, entries)
    print(f"rows where auto's choice is more than {SLOWER:.0%} slower than the fastest pipeline: {len(slow)}")
    for config, chosen, us, fastest, best_us in slow:
        print(f"  {config}: {chosen} {us:.1f} us, {fastest} {best_us:.1f} us (x{us / best_us:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
