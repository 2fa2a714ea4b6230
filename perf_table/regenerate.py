"""``python -m perf_table regenerate``: rebuild README.md, table.csv and the plots from the raw runs.

Input: every ``results/*.json`` (written by ``python -m perf_table run``) and the anchor CSVs.
Output (deterministic: sorted inputs, fixed number formats, no dates of its own):
- ``README.md``: per device, the runs, a summary, and one table per page size holding the newest
  measurement of each (pipeline, config), with the anchors' times and our speed-up over them;
- ``table.csv``: the README's tables as one CSV (the newest row of each (pipeline, config) per device),
  with the same anchor columns (every row of every run stays in ``results/``);
- ``plots/<device>.png``: time or speed-up vs seqlen per h_q (needs matplotlib; skipped otherwise).
"""
from __future__ import annotations

import csv
import dataclasses
import difflib
import io
import gzip
import json
import math
import pathlib
import statistics
import tempfile

from .anchors import ANCHORS_DIR, anchor_key, family_order, load_anchors
from .runner import RESULTS_DIR, SCHEMA_VERSION, device_slug

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
README = "README.md"
CSV_NAME = "table.csv"
PLOTS_DIR = "plots"
PAIRED_DIR = "paired"  # beside results/: scripts/flashmla_pair.py --json files
# Files `--check` compares byte for byte. The PNGs are left out: their bytes depend on the
# matplotlib and FreeType versions installed, not only on the data.
CHECKED = (README, CSV_NAME)

_ROW_KEY = ("pipeline", "dtype", "page_size", "b", "s_q", "h_q", "seqlen", "varlen", "multicast")
AUTO = "auto"  # runner.AUTO: rows timing pipeline="auto" (field "resolved": the variant it ran)
AUTO_SLOWER = 0.02  # pipelines.auto.SLOWER: the bar auto must meet against the faster variant


@dataclasses.dataclass
class Run:
    """One raw JSON file."""

    file: str
    data: dict

    @property
    def device(self) -> str:
        return self.data["device"]["name"]

    @property
    def mode(self) -> str:
        """'full' or 'quick', marked partial when the run ended before its last config."""
        return self.data["mode"] + ("" if self.data["complete"] else " (partial)")

    @property
    def commit(self) -> str:
        git = self.data["git"]
        return git["short"] + ("+dirty" if git.get("dirty") else "")


def load_runs(results_dir: pathlib.Path = RESULTS_DIR) -> list[Run]:
    """Every raw run under ``results_dir``, sorted by file name: ``*.json`` as ``perf_table run`` wrote
    it, or gzip-compressed as ``*.json.gz`` (older runs are kept compressed so the checkout stays small
    enough to travel to the GPU machine), named without the ``.gz``."""
    runs = []
    paths = [*pathlib.Path(results_dir).glob("*.json"), *pathlib.Path(results_dir).glob("*.json.gz")]
    names = [p.name.removesuffix(".gz") for p in paths]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"{results_dir}: runs stored both plain and compressed: {dupes}")
    for name, path in sorted(zip(names, paths)):
        raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
        data = json.loads(raw)
        if data.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"{path}: schema {data.get('schema')!r}, this regenerate reads {SCHEMA_VERSION}")
        runs.append(Run(name, data))
    return runs


def load_paired(paired_dir: pathlib.Path) -> list[tuple[str, dict]]:
    """Every ``scripts/flashmla_pair.py --json`` file under ``paired_dir`` (``*.json`` or ``*.json.gz``),
    sorted by file name: ``(name without .gz, data)``. A missing directory holds none."""
    paths = sorted([*pathlib.Path(paired_dir).glob("*.json"), *pathlib.Path(paired_dir).glob("*.json.gz")])
    out = []
    for path in paths:
        raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
        out.append((path.name.removesuffix(".gz"), json.loads(raw)))
    return out


PAIRED_FLOOR = 0.92  # issue 8's floor, counted against the paired FlashMLA


def paired_ratios(rows: list[dict]) -> list[tuple[dict, float]]:
    """The timed rows of a ``scripts/flashmla_pair.py`` run with FlashMLA's time / ours (above 1: ours is faster);
    rows whose outputs differed were not timed and are left out."""
    return [(r, r["flash_us"] / r["ours_us"]) for r in rows if r.get("flash_us") and r.get("ours_us")]


def paired_summary(rows: list[dict]) -> dict:
    """``timed`` (count), ``geomean``, ``below`` (ratios under ``PAIRED_FLOOR``) and ``lowest`` of ``paired_ratios``
    (None where nothing was timed): the script's closing line and the README's line per file."""
    ratios = [x for _, x in paired_ratios(rows)]
    return dict(timed=len(ratios), geomean=_geomean(ratios), below=sum(x < PAIRED_FLOOR for x in ratios),
                lowest=min(ratios) if ratios else None)


def _paired_section(paired: list[tuple[str, dict]]) -> list[str]:
    """One device's paired files: a line per file, then per file its five lowest configs."""
    if not paired:
        return []
    lines = ["FlashMLA paired (same process, same card; `paired/`):", "",
             *_header(["file", "date", "commit", "FlashMLA", "ours", "configs", "geomean FlashMLA / ours",
                       f"below {PAIRED_FLOOR}", "lowest"])]
    lowest = []
    for name, data in paired:
        summary = paired_summary(data["rows"])
        variant = paired_variant(data)
        lines.append(f"| {name} | {data.get('date', '-')} | {data.get('commit', '-')} | {data.get('flashmla', '-')} "
                     f"| {variant} | {summary['timed']} of {len(data['rows'])} | {_fmt(summary['geomean'], '.3f')} "
                     f"| {summary['below']} | {_fmt(summary['lowest'], '.3f')} |")
        for r, x in sorted(paired_ratios(data["rows"]), key=lambda t: t[1])[:5]:
            _, b, s_q, h_q, seqlen, varlen = r["config"]
            # (auto's files before ``ours_ran`` do not say which variant each config ran)
            ran = r.get("ours_ran", "-" if variant == "auto" else variant)
            lowest.append(f"| {name} | {b} | {s_q} | {h_q} | {seqlen}{' varlen' if varlen else ''} | "
                          f"{r['flash_us']:.1f} | {r['ours_us']:.1f} | {ran} | {x:.3f} |")
    return [*lines, "", "Lowest paired configs (page 64):", "",
            *_header(["file", "b", "s_q", "h_q", "seqlen", "FlashMLA us", "ours us", "ours ran", "FlashMLA / ours"]),
            *lowest, ""]


def paired_variant(data: dict) -> str:
    """The pipeline a paired file timed as "ours" (``flashmla_pair.py --variant``); files written before the
    script recorded it timed its default, 2wg."""
    return data.get("variant", "2wg")


def _key(row: dict) -> tuple:
    # Rows of runs made before multicast clusters existed have no "multicast" field: no cluster (None).
    return tuple(row.get(k) for k in _ROW_KEY)


def _label(row: dict) -> str:
    """The pipeline as the tables show it: rows of a cluster config timed with multicast off say so."""
    return row["pipeline"] + (" mc-off" if row.get("multicast") is False else "")


def _pipeline_cell(row: dict) -> str:
    """``_label``, and for an auto row the variant it ran: ``auto (3wg)``."""
    if row["pipeline"] == AUTO and row.get("resolved"):
        return f"{_label(row)} ({row['resolved']})"
    return _label(row)


def _sort_key(row: dict) -> tuple:
    # Uniform lengths before varlen, then the grid's own order; pipelines side by side, multicast on first.
    return (row["varlen"], row["b"], row["s_q"], row["h_q"], row["seqlen"], row["pipeline"],
            row.get("multicast") is False)


def latest_rows(runs: list[Run]) -> list[tuple[dict, Run]]:
    """The newest row of each (pipeline, config) of ``runs`` (oldest run first: later ones win).

    A multicast A/B pair (rows with ``multicast`` true / false, timed in one run) and a row without a
    cluster (``multicast`` null or absent: a config without one, or a run from before clusters existed)
    of the same config have different keys; only the rows of the newest run that timed the config are
    kept, so an A/B pair replaces an older single row and the other way round.
    """
    newest: dict[tuple, tuple[dict, Run, int]] = {}
    for i, run in enumerate(runs):
        for row in run.data["rows"]:
            newest[_key(row)] = (row, run, i)
    last_run = {}  # config (the key less its multicast field) -> newest run that timed it
    for key, (_, _, i) in newest.items():
        last_run[key[:-1]] = max(i, last_run.get(key[:-1], -1))
    keep = [key for key, (_, _, i) in newest.items() if i == last_run[key[:-1]]]
    return [newest[k][:2] for k in sorted(keep, key=lambda k: _sort_key(newest[k][0]))]


@dataclasses.dataclass
class DeviceView:
    """What the README and the plot show of one device."""

    runs: list[Run]  # oldest first: (date, file) order
    latest: list[tuple[dict, Run]]  # newest row per (pipeline, config), in table order


def device_views(runs: list[Run]) -> dict[str, DeviceView]:
    """{device name: its view}, devices sorted by name."""
    views = {}
    for device in sorted({run.device for run in runs}):
        ordered = sorted((r for r in runs if r.device == device), key=lambda r: (r.data["date"], r.file))
        views[device] = DeviceView(ordered, latest_rows(ordered))
    return views


def plottable(latest: list[tuple[dict, Run]]) -> list[dict]:
    """Rows that go into a device's plot: page 64, uniform lengths, measured, the default kernel (not the
    multicast-off half of an A/B pair), the variants' rows (an auto row repeats one of them)."""
    return [row for row, _ in latest if row["page_size"] == 64 and not row["varlen"] and row["error"] is None
            and row.get("multicast") is not False and row["pipeline"] != AUTO]


def anchors_for(anchors: dict, device: str, row: dict) -> dict[str, float]:
    """{family: anchor us} of the anchors that timed this row's problem on this device."""
    key = anchor_key(device, row["dtype"], row["page_size"], row["b"], row["s_q"], row["h_q"], row["seqlen"],
                     row["varlen"])
    return {family: anchors[family][key].us for family in family_order(anchors) if key in anchors[family]}


def _families(anchors: dict, device: str, rows: list[dict]) -> list[str]:
    """Anchor families with at least one anchor among ``rows`` (the columns of their table)."""
    return family_order({family for row in rows for family in anchors_for(anchors, device, row)})


def _fmt(value, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def _seqlen_cell(row: dict) -> str:
    return f"{row['seqlen']} varlen" if row["varlen"] else str(row["seqlen"])


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


# ---------------------------------------------------------------------------------------------
# README

_INTRO = """\
# Performance table

Generated by `python -m perf_table regenerate` from the raw runs in `results/` and the anchors in
`anchors/`; do not edit by hand (CI checks that it regenerates byte for byte).

- Measure (GPU machine): `python -m perf_table run` (full grid, every available pipeline and page
  size) or `python -m perf_table run --quick` (anchor configs only); writes
  `results/<device>_<date>_<commit>[_quick].json` (on a machine that returns only one folder and has
  no `.git`: `--out DIR --commit SHA`, then copy the file into `results/`). Then
  `python -m perf_table regenerate`.
- Time: median of {replays} CUDA graph replays of one `mla.MLADecoder.run` call (`plan`, the split
  schedule, done once outside the graph; the split-kv merge kernel is inside), after compilation and
  warm-up. Inputs: randn/10 clamped to [-1, 1], pages in a random order; s_q > 1 is causal. The rows
  of one config (its pipelines, auto, multicast off) are replayed interleaved on the same inputs, in
  rounds of several replays of each, in orders that put every row at every position and behind
  every other row equally often (runs at commits up to dbcb534, all runs so far: the order rotated every
  round).
- GB/s counts q + KV (each token once, 576 bf16 values) + out bytes; TFLOP/s counts
  2 * s_q * h_q * sum(seqlen) * (576 + 512). These are the anchors' formulas, so the columns compare.
- % of roofline: max(bytes / copy bandwidth, FLOPs / GEMM rate) / time, with the device-to-device
  copy bandwidth (bytes read + written) and torch's bf16 GEMM 8192^3 rate measured at the start of
  the same run; `bound` says which term sets the limit.
- Anchors: FlashMLA and FlashInfer times from `anchors/` (see its README), matched on device, dtype,
  page size, b, s_q, h_q, seqlen and varlen. They were measured at page size 64 (FlashInfer also at 16
  and 1 on four configs), so rows of another page size have no anchor. `xFlashMLA` = FlashMLA's time
  / ours (above 1: we are faster). Varlen rows draw their own lengths (N(mean, mean/2), some set to
  zero), so their anchor is the same distribution, not the same batch.
- Eager (runs with `--quick`, or `--eager`): wall time per call of 300 back-to-back eager calls after
  warm-up (median of 3 rounds), beside the graph time: `eager run` = `mla.MLADecoder.run` with `out`
  given, `eager flash` = `mla.flash_mla_with_kvcache` with the metadata computed once, `eager
  plan+flash` = `mla.get_mla_metadata(..., planner="device")` then `mla.flash_mla_with_kvcache` with
  that plan (the whole eager step, planner kernel and decode; `-` in runs made before this column
  existed). Where the GPU time is small this is the host cost of a call (an engine pays it per layer
  whenever a step is not a captured graph); where it is large it is the GPU time. Tables show these
  columns when a row has them. With the default `MLA_GRID_MERGE` (runs from 558bc18 on), eager calls
  whose split-kv merge is one cell per CTA merge in the decode's grid and launch one kernel, while the
  graph time keeps the merge kernel (docs/interfaces.md, "In-grid merge").
- Each table shows the newest measurement of every (pipeline, config) for its device; `run` is the
  commit it came from. `table.csv` holds the same rows (every device and page size) with all their
  columns; every row of every run stays in `results/`.
- Configs whose m-block CTAs run as 2-CTA TMA multicast clusters (an even number of 64-row m-blocks
  at page size >= 16; 2wg and 3wg, `pipelines.MULTICAST_VARIANTS`) are timed twice in a run: as the
  library runs them, and with `MLA_MULTICAST=0` (pipeline `... mc-off`); the "Multicast A/B" table sets
  the two side by side. seesaw runs no cluster (runs from 3d39461 and before timed it with one).
- Runs that measure both pipelines also time `pipeline="auto"` on each config's default path
  (pipeline `auto (3wg)`: the variant it ran, chosen by `pipelines/auto_table.py`), right after the
  variants on the same inputs; the "Auto" line compares it with the faster variant of the same run
  and lists the configs where it is more than 2% slower: by the ratio of the medians and, for runs
  that record it, by the paired ratio (the median over rounds of auto's replay time / the faster
  variant's replay time in the same round; two timings of one kernel land within 0.6% of each other
  by this ratio, and up to 4% apart by medians). `table.csv`'s `resolved` column names the
  variant of every row, `kv_capacity` the block table's capacity (the KV length auto keys on).
- "FlashMLA paired": FlashMLA and one of our pipelines (the file's `ours` column: `--variant` of the run;
  2wg in files that predate the field, the script's default) timed in the same process on the same card and
  inputs, in interleaved rounds (`scripts/flashmla_pair.py`, with FlashMLA built from its public source by
  `scripts/flashmla_build.py`; raw files in `paired/`). These ratios carry no machine or clock difference,
  unlike the anchor columns; `FlashMLA / ours` above 1: we are faster. Outputs are compared before timing.
"""


def _header(columns: list[str]) -> list[str]:
    """A markdown table's heading line and rule."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def _runs_table(runs: list[Run]) -> list[str]:
    lines = _header(["run file", "date (UTC)", "commit", "mode", "rows", "failed", "copy GB/s", "GEMM TFLOP/s", "SMs",
                     "torch", "CUDA", "CuTe DSL"])
    for run in runs:
        d = run.data
        failed = sum(row["error"] is not None for row in d["rows"])
        lines.append(
            f"| {run.file} | {d['date']} | {run.commit} | {run.mode} | {len(d['rows'])} | {failed} | "
            f"{d['roofline']['copy_gbps']:.0f} | {d['roofline']['gemm_tflops']:.0f} | {d['device']['sm_count']} | "
            f"{d['versions']['torch']} | {d['versions']['cuda']} | {d['versions']['cutlass_dsl']} |")
    return lines


def _summary_table(latest: list[tuple[dict, Run]], anchors: dict, device: str) -> list[str]:
    families = _families(anchors, device, [row for row, _ in latest])
    lines = _header(["pipeline", "page", "rows", "failed", "median % of roofline",
                     *[c for f in families for c in (f"geomean x{f}", f"faster than {f}")]])
    groups = sorted({(_label(row), row["page_size"]) for row, _ in latest}, key=lambda g: (g[0], -g[1]))
    for pipeline, page in groups:
        rows = [row for row, _ in latest if _label(row) == pipeline and row["page_size"] == page]
        ok = [row for row in rows if row["error"] is None]
        median = statistics.median(100 * row["roofline_frac"] for row in ok) if ok else None
        line = f"| {pipeline} | {page} | {len(rows)} | {len(rows) - len(ok)} | {_fmt(median, '.1f')} |"
        for family in families:
            ratios = [a[family] / row["us"] for row in ok
                      if family in (a := anchors_for(anchors, device, row))]
            wins = sum(r > 1 for r in ratios)
            line += f" {_fmt(_geomean(ratios), '.2f')} | {f'{wins} of {len(ratios)}' if ratios else '-'} |"
        lines.append(line)
    return lines


_EAGER_FIELDS = ("eager_run_us", "eager_flash_us", "eager_plan_run_us")
_EAGER_HEADERS = ["eager run us", "eager flash us", "eager plan+flash us"]


def _has_eager(rows: list[dict]) -> bool:
    """Whether any row carries eager times (runs older than the eager column have none)."""
    return any(row.get(field) is not None for row in rows for field in _EAGER_FIELDS)


def _page_table(entries: list[tuple[dict, Run]], anchors: dict, device: str) -> list[str]:
    families = _families(anchors, device, [row for row, _ in entries])
    eager = _has_eager([row for row, _ in entries])
    lines = _header(["b", "s_q", "h_q", "seqlen", "pipeline", "us", *(_EAGER_HEADERS if eager else []),
                     "GB/s", "TFLOP/s", "% roofline", "bound", *[c for f in families for c in (f"{f} us", f"x{f}")],
                     "run"])
    for row, run in entries:
        found = anchors_for(anchors, device, row)
        ok = row["error"] is None
        cells = [str(row["b"]), str(row["s_q"]), str(row["h_q"]), _seqlen_cell(row), _pipeline_cell(row)]
        if ok:
            cells += [f"{row['us']:.1f}", *[_fmt(row.get(f), ".1f") for f in _EAGER_FIELDS if eager],
                      f"{row['gbps']:.0f}", f"{row['tflops']:.1f}", f"{100 * row['roofline_frac']:.1f}", row["bound"]]
        else:
            cells += ["FAILED", *["-" for _ in _EAGER_FIELDS if eager], "-", "-", "-", "-"]
        for family in families:
            if family in found:
                cells += [f"{found[family]:.1f}", f"{found[family] / row['us']:.2f}" if ok else "-"]
            else:
                cells += ["-", "-"]
        cells.append(run.commit)
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _multicast_table(latest: list[tuple[dict, Run]]) -> list[str]:
    """Configs timed with multicast on and off (newest of each): both times and off / on (above 1:
    multicast is faster)."""
    pairs = {}
    for row, run in latest:
        if row.get("multicast") is not None and row["error"] is None:
            key = tuple(row[k] for k in _ROW_KEY[:-1])
            pairs.setdefault(key, {})[row["multicast"]] = (row, run)
    lines = []
    for key in sorted(pairs, key=lambda k: (k[2], *_sort_key(pairs[k][next(iter(pairs[k]))][0]))):
        pair = pairs[key]
        if True in pair and False in pair:
            (on, run_on), (off, run_off) = pair[True], pair[False]
            if not lines:
                lines = _header(["page", "b", "s_q", "h_q", "seqlen", "pipeline", "us multicast", "us no multicast",
                                 "off / on", "run"])
            runs = run_on.commit if run_on.commit == run_off.commit else f"{run_on.commit}, {run_off.commit}"
            lines.append(f"| {on['page_size']} | {on['b']} | {on['s_q']} | {on['h_q']} | {_seqlen_cell(on)} | "
                         f"{on['pipeline']} | {on['us']:.1f} | {off['us']:.1f} | {off['us'] / on['us']:.3f} | {runs} |")
    return lines


def auto_comparisons(latest: list[tuple[dict, Run]]) -> list[dict]:
    """Configs whose newest auto row and two or more variant rows on the default path come from one run:
    ``{"auto": row, "fastest": the fastest variant's row, "ratio": auto / fastest, "run": Run}``, in
    table order (what ``python -m pipelines.auto --verify`` checks, per run file)."""
    groups: dict[tuple, list[tuple[dict, Run]]] = {}
    for row, run in latest:
        if row["error"] is None and row.get("multicast") is not False:
            groups.setdefault(tuple(row[k] for k in _ROW_KEY[1:-1]), []).append((row, run))
    out = []
    for entries in groups.values():
        autos = [(row, run) for row, run in entries if row["pipeline"] == AUTO]
        if not autos:
            continue
        auto_row, run = autos[0]
        variants = [row for row, r in entries if row["pipeline"] != AUTO and r is run]
        if len(variants) < 2:
            continue
        fastest = min(variants, key=lambda row: (row["us"], row["pipeline"]))
        out.append({"auto": auto_row, "fastest": fastest, "ratio": auto_row["us"] / fastest["us"], "run": run,
                    "paired": (auto_row.get("paired") or {}).get(fastest["pipeline"])})
    return sorted(out, key=lambda c: (c["auto"]["page_size"], *_sort_key(c["auto"])))


def _auto_section(latest: list[tuple[dict, Run]]) -> list[str]:
    """Auto against the faster variant of the same run: the count, the worst, and every config where auto
    is more than ``AUTO_SLOWER`` slower."""
    compared = auto_comparisons(latest)
    if not compared:
        return []

    def where(c):
        a = c["auto"]
        return f"page {a['page_size']} b{a['b']} s_q{a['s_q']} h_q{a['h_q']} {_seqlen_cell(a)}"

    slow = [c for c in compared if c["ratio"] > 1 + AUTO_SLOWER]
    worst = max(compared, key=lambda c: c["ratio"])
    paired = [c for c in compared if c["paired"] is not None]
    lines = [f"Auto (`pipeline=\"auto\"`, timed beside the variants in the same run; `python -m pipelines.auto "
             f"--verify RUN_FILE`): {len(compared)} configs; by medians {len(compared) - len(slow)} within "
             f"{AUTO_SLOWER:.0%} of the faster variant, {len(slow)} slower, worst x{worst['ratio']:.3f} ({where(worst)})."]
    if paired:
        slow_paired = [c for c in paired if c["paired"] > 1 + AUTO_SLOWER]
        worst_paired = max(paired, key=lambda c: c["paired"])
        lines[-1] += (f" By paired ratio (median over rounds of auto's replay / the faster variant's replay of the "
                      f"same round; {len(paired)} configs): {len(paired) - len(slow_paired)} within "
                      f"{AUTO_SLOWER:.0%}, {len(slow_paired)} slower, worst x{worst_paired['paired']:.3f} "
                      f"({where(worst_paired)}).")
        slow = [c for c in compared if c["ratio"] > 1 + AUTO_SLOWER
                or (c["paired"] is not None and c["paired"] > 1 + AUTO_SLOWER)]
    lines.append("")
    if slow:
        lines += _header(["page", "b", "s_q", "h_q", "seqlen", "auto ran", "auto us", "fastest", "us",
                          "auto / fastest", "paired", "run"])
        for c in slow:
            a, f = c["auto"], c["fastest"]
            pair = "-" if c["paired"] is None else f"{c['paired']:.3f}"
            lines.append(f"| {a['page_size']} | {a['b']} | {a['s_q']} | {a['h_q']} | {_seqlen_cell(a)} | "
                         f"{a.get('resolved') or '-'} | {a['us']:.1f} | {f['pipeline']} | {f['us']:.1f} | "
                         f"{c['ratio']:.3f} | {pair} | {c['run'].commit} |")
        lines.append("")
    return lines


def _failures(latest: list[tuple[dict, Run]]) -> list[str]:
    lines = []
    for row, run in latest:
        if row["error"] is not None:
            first = row["error"].splitlines()[0] if row["error"] else ""
            lines.append(f"- {_label(row)} page {row['page_size']} b{row['b']} s_q{row['s_q']} h_q{row['h_q']} "
                         f"{_seqlen_cell(row)} ({run.file}): `{first.replace('`', chr(39))}`")
    return lines


def render_readme(views: dict[str, DeviceView], anchors: dict, paired: list[tuple[str, dict]] = ()) -> str:
    """README.md text. A device's plot is linked when it has rows to plot (the data decides, not
    whether matplotlib is installed, so the text is the same everywhere)."""
    replays = sorted({run.data["timing"]["replays"] for view in views.values() for run in view.runs})
    out = [_INTRO.format(replays=" / ".join(map(str, replays)) if replays else "100")]
    if not views:
        out.append("No runs yet: `results/` holds no raw JSON.\n")
    for device, view in views.items():
        latest = view.latest
        out += [f"## {device}", "", "Runs:", "", *_runs_table(view.runs), "", "Summary (newest row per config):", "",
                *_summary_table(latest, anchors, device), ""]
        if plottable(latest):
            out += [f"![{device}]({PLOTS_DIR}/{device_slug(device)}.png)", ""]
        failures = _failures(latest)
        if failures:
            out += ["Failed configs:", "", *failures, ""]
        out += _auto_section(latest)
        out += _paired_section([(name, data) for name, data in paired if data.get("device") == device])
        multicast = _multicast_table(latest)
        if multicast:
            out += ["Multicast A/B (configs whose m-block CTAs run as 2-CTA clusters, timed with "
                    "`MLA_MULTICAST` on and off in the same run):", "", *multicast, ""]
        for page in sorted({row["page_size"] for row, _ in latest}, reverse=True):
            entries = [(row, run) for row, run in latest if row["page_size"] == page]
            out += [f"### {device}, page size {page}", "", *_page_table(entries, anchors, device), ""]
    return "\n".join(out).rstrip("\n") + "\n"


# ---------------------------------------------------------------------------------------------
# CSV

_CSV_COLUMNS = ["device", "run", "date", "commit", "mode", "pipeline", "resolved", "dtype", "page_size", "b", "s_q",
                "h_q", "seqlen", "varlen", "causal", "multicast", "kv_capacity", "total_kv_tokens", "bytes", "flops", "us", "us_min", "us_p90",
                "eager_run_us", "eager_flash_us", "eager_plan_run_us", "gbps", "tflops", "roofline_pct", "bound",
                "copy_gbps", "gemm_tflops"]
_CSV_FORMATS = {"us": ".2f", "us_min": ".2f", "us_p90": ".2f", "eager_run_us": ".2f", "eager_flash_us": ".2f",
                "eager_plan_run_us": ".2f", "gbps": ".1f", "tflops": ".2f"}


def render_csv(views: dict, anchors: dict) -> str:
    """table.csv text: the newest row of each (pipeline, config) of every device (``device_views``), devices
    by name, rows in table order. (It held every row of every run until that reached 6 MB; the raw runs in
    ``results/`` keep them.)"""
    families = family_order(anchors)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(_CSV_COLUMNS + [c for f in families for c in (f"{f}_us", f"x{f}")] + ["error"])
    for device, view in views.items():
        for row, run in view.latest:
            d = run.data
            ok = row["error"] is None
            values = {"device": run.device, "run": run.file, "date": d["date"], "commit": run.commit,
                      "mode": run.mode, "copy_gbps": f"{d['roofline']['copy_gbps']:.1f}",
                      "gemm_tflops": f"{d['roofline']['gemm_tflops']:.1f}",
                      "roofline_pct": f"{100 * row['roofline_frac']:.2f}" if ok else ""}
            for column in _CSV_COLUMNS:
                if column not in values:
                    value = row.get(column)
                    if value is None:
                        values[column] = ""
                    elif isinstance(value, bool):
                        values[column] = int(value)
                    else:
                        values[column] = format(value, _CSV_FORMATS.get(column, ""))
            found = anchors_for(anchors, run.device, row)
            extra = []
            for family in families:
                if family in found:
                    extra += [f"{found[family]:.1f}", f"{found[family] / row['us']:.3f}" if ok else ""]
                else:
                    extra += ["", ""]
            writer.writerow([values[c] for c in _CSV_COLUMNS] + extra + [row["error"] or ""])
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------
# Driver

def regenerate(results_dir: pathlib.Path = RESULTS_DIR, anchors_dir: pathlib.Path = ANCHORS_DIR,
               out_dir: pathlib.Path = PACKAGE_DIR, log=print, plots: bool = True) -> list[pathlib.Path]:
    """Write README.md, table.csv and (with ``plots``) plots/ into ``out_dir``; returns the paths written."""
    runs = load_runs(results_dir)
    anchors = load_anchors(anchors_dir)
    views = device_views(runs)
    # FlashMLA paired runs sit beside the results (``paired/``): a results directory without one has none.
    paired = load_paired(pathlib.Path(results_dir).parent / PAIRED_DIR)
    out_dir = pathlib.Path(out_dir)
    written = []
    for name, text in ((README, render_readme(views, anchors, paired)), (CSV_NAME, render_csv(views, anchors))):
        path = out_dir / name
        path.write_text(text)
        written.append(path)
    if not plots:
        return written
    try:
        from . import plots as plotting
    except ImportError as exc:
        log(f"plots skipped ({exc}); README.md and {CSV_NAME} are complete without them. "
            "pip install matplotlib to draw them.")
        return written
    plot_dir = out_dir / PLOTS_DIR
    plot_dir.mkdir(exist_ok=True)
    wanted = {plot_dir / f"{device_slug(device)}.png": device for device, view in views.items() if plottable(view.latest)}
    for stale in sorted(set(plot_dir.glob("*.png")) - set(wanted)):
        stale.unlink()
    for path, device in sorted(wanted.items()):
        plotting.plot_device(path, device, plottable(views[device].latest), anchors)
        written.append(path)
    return written


def check(results_dir: pathlib.Path = RESULTS_DIR, anchors_dir: pathlib.Path = ANCHORS_DIR,
          committed_dir: pathlib.Path = PACKAGE_DIR, log=print) -> int:
    """0 if the committed README.md and table.csv are what regenerate writes now, else 1 (with a diff)."""
    status = 0
    with tempfile.TemporaryDirectory() as tmp:
        regenerate(results_dir, anchors_dir, pathlib.Path(tmp), plots=False)
        for name in CHECKED:
            fresh = (pathlib.Path(tmp) / name).read_text()
            path = pathlib.Path(committed_dir) / name
            stored = path.read_text() if path.exists() else ""
            if fresh != stored:
                status = 1
                diff = list(difflib.unified_diff(stored.splitlines(), fresh.splitlines(), f"{path} (committed)",
                                                 f"{name} (regenerated)", lineterm="", n=1))
                log(f"{path} is out of date; run `python -m perf_table regenerate`. Diff (first 40 lines):")
                log("\n".join(diff[:40]))
    if status == 0:
        log(f"{', '.join(CHECKED)} are up to date")
    return status
