"""``python -m perf_table run``: measure the roofline and the grid, write one raw JSON per run.

The orchestration (which configs, what a row holds, how failures are recorded, the JSON layout) is
plain Python and takes the timing function as an argument, so it is tested on a CPU with a fake
one; ``main`` wires it to the GPU measurements of ``bench``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import importlib.metadata
import json
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
import traceback
from typing import Callable, Iterable

from . import formulas, grid
from .anchors import anchor_key, family_order, load_anchors

SCHEMA_VERSION = 1
PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
RESULTS_DIR = PACKAGE_DIR / "results"
MIN_REPLAYS = 100
# A config that takes longer than this (compile included; the slowest should take a few seconds) is
# taken for a hung kernel: the run writes what it has and exits rather than wait for an outer kill.
CONFIG_TIMEOUT_S = 120
WARMUP_REPLAYS = 3
SEED = 0

TIMING = {
    "method": "CUDA graph of one mla.MLADecoder.run call (plan() once, outside the graph; out "
              "preallocated), replayed back to back behind a spin kernel; CUDA events around each "
              "replay; median reported. All rows of one config (its pipelines, auto, its multicast-off "
              "pipelines) are captured together and replayed in interleaved rounds (2 rounds per row, "
              "ceil(replays / rounds) replays of each per round), each round in the next order of a "
              "Williams design (every row at every position and behind every other row equally often), "
              "so drift during the measurement and the clock a row leaves to the next fall on all of them "
              "alike; an auto row's 'paired' holds, per "
              "variant of its config, the median over i of auto's i-th replay time / that variant's i-th "
              "(taken in the same round)",
    "eager_calls_before_capture": 2,
    "warmup_replays": WARMUP_REPLAYS,
    "replays_per_round": "ceil(replays / (2 * rows of the config))",
    "l2_flushed": False,
}
EAGER_TIMING = {
    "eager": "wall time per call of back-to-back eager calls (perf_counter around the calls and a final "
             "synchronize), median of the rounds: eager_run_us = mla.MLADecoder.run (planned once, out "
             "given), eager_flash_us = mla.flash_mla_with_kvcache (metadata from get_mla_metadata once, "
             "out allocated per call), eager_plan_run_us = mla.get_mla_metadata(planner=\"device\") + "
             "mla.flash_mla_with_kvcache per call (the planner kernel and the decode, out allocated per call)",
    "eager_calls": 300,
    "eager_warmup": 20,
    "eager_rounds": 3,
}
INPUTS = {
    "values": "randn/10 clamped to [-1, 1] (q and KV)",
    "pages": "random permutation of the page pool; unused block_table slots = page 0",
    "seed": SEED,
    "varlen": "lengths from N(mean, mean/2) rounded, clipped at 0, b//32 (>= 1) requests set to 0; "
              "numpy seed (0, b, mean)",
    "causal": "s_q > 1",
    "multicast": "configs with a multicast cluster (pipelines.multicast_cluster > 1) run twice, MLA_MULTICAST=1 "
                 "then 0 (row field multicast true / false); null: no cluster for that config",
    "order": "config by config; a config's rows back to back on the same input tensors: each pipeline on the "
             "default path, then auto, then the multicast-off rows",
    "auto": "pipeline 'auto' rows (where two pipelines are measured): mla.MLADecoder(pipeline='auto') with "
            "MLA_PIPELINE unset, on each config's default path; 'resolved' names the variant it ran (on variant "
            "rows: the variant); 'kv_capacity' = block_table.shape[1] * page_size, the length auto keys on "
            "(block tables are sized to the batch's longest request)",
}
AUTO = "auto"  # the pipeline name of auto rows (pipelines.auto.AUTO)
PIPELINE_ENV_VAR = "MLA_PIPELINE"  # mla.PIPELINE_ENV_VAR (unset while auto rows are timed)


class PreflightError(Exception):
    """The run cannot start (no GPU, no kernel, unknown pipeline). The message says why."""


def require_gpu(cuda_available: bool, torch_version: str) -> None:
    """PreflightError unless torch sees a CUDA device."""
    if not cuda_available:
        raise PreflightError(
            f"python -m perf_table run needs a CUDA GPU, and torch {torch_version} sees none "
            "(torch.cuda.is_available() is False). Run it on the GPU machine; "
            "`python -m perf_table regenerate` is the part that runs on a CPU.")


def select_variants(available: list[str], known: Iterable[str], requested: str | Iterable[str] | None) -> list[str]:
    """The pipeline variants to measure (``requested``: one name, several, or None for every available
    one), or a PreflightError saying why there are none."""
    known = tuple(known)
    if not available:
        raise PreflightError(
            f"no pipeline variant has a kernel yet: pipelines.VARIANTS = {list(known)}, "
            "pipelines.available_variants() = []. Nothing to measure.")
    if requested is not None:
        names = [requested] if isinstance(requested, str) else list(dict.fromkeys(requested))
        for name in names:
            if name not in available:
                raise PreflightError(
                    f"--pipeline {name!r} is not available; available: {available} "
                    f"(known: {list(known)})")
        return names
    return list(available)


def build_plan(variants: list[str], supported_page_sizes: Callable[[str], tuple[int, ...]], quick: bool,
               page_sizes: Iterable[int] | None = None,
               multicast_cluster: Callable[..., int] = lambda page_size, rows, variant=None: 1,
               auto: bool = True) -> list[tuple[str, grid.Config]]:
    """(pipeline, config) pairs in run order: page size by page size, config by config (the grid's
    order), a config's rows back to back (``run_one`` times them on the same inputs).

    A variant runs the grid's page sizes (64, 16, 1) that it supports, narrowed to ``page_sizes``
    when given. A variant for which ``multicast_cluster(page_size, h_q * s_q, variant)`` is a cluster
    (> 1) runs the config twice, multicast on then off (the A/B pair); the others once. With ``auto``,
    a config that two or more variants run also gets an ``"auto"`` row on its default path
    (multicast on where any of them has a cluster): ``pipeline="auto"``'s choice, timed beside the
    variants it chooses between. Per config: each variant's default-path row, the auto row, then each
    clustered variant's multicast-off row.
    """
    wanted = set(page_sizes) if page_sizes else set(grid.PAGE_SIZES)
    pages_of = {v: set(grid.grid_page_sizes(tuple(supported_page_sizes(v)))) & wanted for v in variants}
    plan = []
    for page in grid.PAGE_SIZES:
        measured = [v for v in variants if page in pages_of[v]]
        if not measured:
            continue
        for cfg in grid.quick_grid((page,)) if quick else grid.full_grid((page,)):
            clustered = [v for v in measured if multicast_cluster(cfg.page_size, cfg.h_q * cfg.s_q, v) > 1]
            on = dataclasses.replace(cfg, multicast=True)
            plan += [(v, on if v in clustered else cfg) for v in measured]
            if auto and len(measured) >= 2:
                plan.append((AUTO, on if clustered else cfg))
            plan += [(v, dataclasses.replace(cfg, multicast=False)) for v in clustered]
    return plan


def _config_fields(variant: str, cfg: grid.Config, resolved: str | None = None) -> dict:
    return {"pipeline": variant, "resolved": variant if variant != AUTO else resolved, "dtype": cfg.dtype,
            "page_size": cfg.page_size, "b": cfg.b, "s_q": cfg.s_q, "h_q": cfg.h_q, "seqlen": cfg.seqlen,
            "varlen": cfg.varlen, "causal": cfg.causal, "multicast": cfg.multicast, "kv_capacity": cfg.kv_capacity()}


def paired_with(auto_cfg, cfg) -> bool:
    """Whether a variant row timed as ``cfg`` is one an auto row timed as ``auto_cfg`` (the same config) is
    paired with: the same multicast setting, or both on the library's default path (a variant without a
    cluster, multicast None, beside an auto row of a cluster config, multicast True); never an mc-off A/B row
    against a default-path one."""
    if cfg == auto_cfg:
        return True
    return (cfg.multicast is not False and auto_cfg.multicast is not False
            and dataclasses.replace(cfg, multicast=None) == dataclasses.replace(auto_cfg, multicast=None))


def paired_ratio(a: list[float], b: list[float]) -> float:
    """Median over rounds of ``a[i] / b[i]``: two graphs' replay times taken in the same rounds
    (``bench.time_graphs_interleaved`` returns samples in round order). Where two rows run the same
    kernel this sits much closer to 1 than the ratio of their medians, which carries each median's
    own spread (docs/perf-notes.md, tenth session)."""
    return statistics.median(x / y for x, y in zip(a, b))


def measure_row(variant: str, cfg: grid.Config, total_kv_tokens: int, samples_us: list[float],
                roofline: dict, eager: dict | None = None, resolved: str | None = None,
                paired: dict | None = None) -> dict:
    """One row of the raw JSON from the replay times of a config: every figure the table shows.
    ``eager``: ``{"run_us": ..., "flash_us": ..., "plan_run_us": ...}`` eager wall times per call, when
    measured (``plan_run_us`` may be absent). ``resolved``: the variant an ``"auto"`` row ran.
    ``paired``: for an auto row, ``{variant: paired_ratio(auto, variant)}`` over the variants timed
    with it (same multicast setting)."""
    us = statistics.median(samples_us)
    nbytes = formulas.decode_bytes(cfg.b, cfg.s_q, cfg.h_q, total_kv_tokens, cfg.dtype)
    flops = formulas.decode_flops(cfg.s_q, cfg.h_q, total_kv_tokens)
    bound_us, bound = formulas.roofline_us(nbytes, flops, roofline["copy_gbps"], roofline["gemm_tflops"])
    ordered = sorted(samples_us)
    row = _config_fields(variant, cfg, resolved)
    row.update({
        "total_kv_tokens": total_kv_tokens,
        "bytes": nbytes,
        "flops": flops,
        "replays": len(samples_us),
        "us": us,
        "us_min": ordered[0],
        "us_p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "gbps": formulas.gbps(nbytes, us),
        "tflops": formulas.tflops(flops, us),
        "roofline_us": bound_us,
        "bound": bound,
        "roofline_frac": bound_us / us,
        "eager_run_us": eager["run_us"] if eager else None,
        "eager_flash_us": eager["flash_us"] if eager else None,
        "eager_plan_run_us": eager.get("plan_run_us") if eager else None,
        "error": None,
    })
    if paired:
        row["paired"] = {v: round(r, 5) for v, r in paired.items()}
    return row


def error_row(variant: str, cfg: grid.Config, error: str) -> dict:
    """A row for a config that did not produce a time; regenerate shows it as failed."""
    row = _config_fields(variant, cfg)
    row.update({"us": None, "error": error})
    return row


def anchor_note(anchors: dict, device: str, cfg: grid.Config, us: float) -> str:
    """' | FlashMLA 224.1 us x1.02' for each anchor of this config on this device ('' if none)."""
    key = anchor_key(device, cfg.dtype, cfg.page_size, cfg.b, cfg.s_q, cfg.h_q, cfg.seqlen, cfg.varlen)
    notes = [f" | {family} {anchors[family][key].us:.1f} us x{anchors[family][key].us / us:.2f}"
             for family in family_order(anchors) if key in anchors[family]]
    return "".join(notes)


def run_plan(plan: list[tuple[str, grid.Config]], bench: Callable[[str, grid.Config], tuple[int, list[float]]],
             roofline: dict, *, log: Callable[[str], None] = print, healthy: Callable[[], bool] = lambda: True,
             after_each: Callable[[list[dict]], None] = lambda rows: None, anchors: dict | None = None,
             device: str = "") -> list[dict]:
    """Time every (variant, config) of ``plan`` with ``bench``; one row each, failures included.

    ``bench(variant, cfg)`` returns (total KV tokens, per-replay microseconds), optionally followed by
    the eager times as ``measure_row`` takes them (or None) and a dict of extra facts (``"resolved"``:
    the variant an auto row ran). An exception in one config is recorded
    as that row's error and the run goes on; once ``healthy()`` says the CUDA context is gone, the
    remaining configs are recorded as not run rather than as fake failures.
    ``after_each(rows)`` runs after every config with the rows so far.
    """
    rows = []
    start = time.monotonic()
    lost = None
    for i, (variant, cfg) in enumerate(plan, start=1):
        head = f"[{i:>3}/{len(plan)}] {variant:>4} {cfg.label():<31}"
        if lost is not None:
            rows.append(error_row(variant, cfg, f"not run: CUDA context lost at {lost}"))
        else:
            try:
                total, samples, *rest = bench(variant, cfg)
                eager = rest[0] if rest else None
                extra = rest[1] if len(rest) > 1 else {}
                row = measure_row(variant, cfg, total, samples, roofline, eager, extra.get("resolved"),
                                  extra.get("paired"))
                rows.append(row)
                eager_note = (f" | eager run {row['eager_run_us']:.1f} us, flash {row['eager_flash_us']:.1f} us"
                              if row["eager_run_us"] is not None else "")
                if variant == AUTO:
                    eager_note = f" | ran {row['resolved']}" + eager_note
                if row["eager_plan_run_us"] is not None:
                    eager_note += f", plan+flash {row['eager_plan_run_us']:.1f} us"
                log(f"{head} {row['us']:9.1f} us {row['gbps']:6.0f} GB/s {row['tflops']:6.1f} TFLOP/s "
                    f"{100 * row['roofline_frac']:5.1f}% of roofline ({row['bound']})"
                    f"{anchor_note(anchors or {}, device, cfg, row['us'])}{eager_note}"
                    f"  [{time.monotonic() - start:.0f} s]")
            except Exception as exc:  # noqa: BLE001 - every failure becomes a visible failed row
                error = f"{type(exc).__name__}: {exc}"[:1000]
                rows.append(error_row(variant, cfg, error))
                log(f"{head} FAILED {error.splitlines()[0] if error else ''}")
                traceback.print_exc(file=sys.stderr)
                if not healthy():
                    lost = f"{variant} {cfg.label()}"
                    log(f"CUDA context lost after {lost}: the remaining configs are recorded as not run")
        after_each(rows)
    return rows


MULTICAST_ENV_VAR = "MLA_MULTICAST"  # pipelines.paged_kv.MULTICAST_ENV_VAR (perf_table does not import the DSL)


@contextlib.contextmanager
def _env(name: str, value: str | None):
    """Environment variable ``name`` set to ``value`` (None: unset) inside the block, restored after."""
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


@contextlib.contextmanager
def multicast_env(multicast: bool | None):
    """``MLA_MULTICAST`` set to 1 / 0 for a config's A/B row (restored after); None leaves it alone."""
    if multicast is None:
        yield
        return
    with _env(MULTICAST_ENV_VAR, "1" if multicast else "0"):
        yield


@contextlib.contextmanager
def pipeline_env(variant: str):
    """For an ``"auto"`` row, ``MLA_PIPELINE`` unset (auto's own choice is what is timed), restored
    after; a named variant ignores the variable, so it is left alone."""
    if variant != AUTO:
        yield
        return
    with _env(PIPELINE_ENV_VAR, None):
        yield


def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3' (file names, plot names)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def git_info(repo_root: pathlib.Path = REPO_ROOT, override: str | None = None) -> dict:
    """Commit and dirty flag of the checkout; ``override`` names the commit where git is absent.

    The GPU machine gets a copy of the working tree, with no .git or with a .git that can lag the tree (a
    session's later commits did not reach it: it named the session's first HEAD, dirty), hence the override
    (--commit), which wins wherever HEAD is not that commit. ``dirty`` is None when it cannot be known.
    """
    def git(*args):
        return subprocess.run(["git", "-C", str(repo_root), *args], capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    if override:
        if commit is None or not commit.startswith(override):
            commit, dirty = override, None
    commit = commit or "unknown"
    return {"commit": commit, "short": commit[:7] if commit != "unknown" else "nogit", "dirty": dirty}


def result_path(results_dir: pathlib.Path, device_name: str, date: str, short_commit: str, quick: bool) -> pathlib.Path:
    """results/<device-slug>_<date>_<shortcommit>[_quick].json"""
    return pathlib.Path(results_dir) / f"{device_slug(device_name)}_{date}_{short_commit}{'_quick' if quick else ''}.json"


def build_record(*, device: dict, versions: dict, git: dict, date: str, quick: bool, replays: int,
                 roofline: dict, rows: list[dict], complete: bool = True, eager: bool = False) -> dict:
    """The raw JSON of one run: where, when, with what, the roofline, and every row.

    ``complete`` is False in the copies written while the run goes on (and in the last one, if the
    run ended early), so a partial file is never mistaken for a whole grid.
    """
    return {
        "schema": SCHEMA_VERSION,
        "complete": complete,
        "device": device,
        "date": date,
        "git": git,
        "versions": versions,
        "mode": "quick" if quick else "full",
        "timing": dict(TIMING, replays=replays, **(EAGER_TIMING if eager else {})),
        "inputs": INPUTS,
        "roofline": roofline,
        "rows": rows,
    }


def dumps_record(record: dict) -> str:
    """JSON text with one row per line: small diffs, readable in review, still plain JSON."""
    head = json.dumps({k: v for k, v in record.items() if k != "rows"}, indent=1, sort_keys=True)
    rows = ",\n".join("  " + json.dumps(row, sort_keys=True) for row in record["rows"])
    return head[:-2] + ',\n "rows": [\n' + rows + "\n ]\n}\n"


def _versions(torch) -> dict:
    # The DSL's version from its distribution metadata: importing cutlass here, before the kernel
    # path sets CUTE_DSL_ARCH, could change how it later compiles.
    try:
        dsl = importlib.metadata.version("nvidia-cutlass-dsl")
    except importlib.metadata.PackageNotFoundError:
        dsl = "not installed"
    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cutlass_dsl": dsl}


def main(quick: bool = False, pipeline: str | list[str] | None = None, out: str | None = None, replays: int = MIN_REPLAYS,
         page_sizes: list[int] | None = None, commit: str | None = None, eager: bool | None = None,
         auto: bool = True) -> int:
    """Run the benchmark on the current GPU; returns the process exit code. ``eager`` (default: on
    for ``quick``) also times back-to-back eager calls of each config (``EAGER_TIMING``). ``auto``:
    also time ``pipeline="auto"`` where two pipelines are measured (``build_plan``)."""
    import torch

    eager = quick if eager is None else eager
    require_gpu(torch.cuda.is_available(), torch.__version__)
    try:
        import pipelines
    except Exception as exc:  # noqa: BLE001
        raise PreflightError(f"cannot import pipelines: {type(exc).__name__}: {exc}") from exc
    variants = select_variants(pipelines.available_variants(), pipelines.VARIANTS, pipeline)
    try:
        import mla
    except Exception as exc:  # noqa: BLE001
        raise PreflightError(f"cannot import mla (the public API being measured): {type(exc).__name__}: {exc}") from exc
    plan = build_plan(variants, pipelines.supported_page_sizes, quick, page_sizes, pipelines.multicast_cluster, auto)
    if not plan:
        raise PreflightError(f"nothing to run: variants {variants} support page sizes "
                             f"{ {v: pipelines.supported_page_sizes(v) for v in variants} }, grid has {grid.PAGE_SIZES}")

    from . import bench

    props = torch.cuda.get_device_properties(0)
    device = {"name": props.name, "sm_count": props.multi_processor_count,
              "compute_capability": f"{props.major}.{props.minor}",
              "memory_gib": round(props.total_memory / 2**30, 1)}
    now = datetime.datetime.now(datetime.timezone.utc)
    git = git_info(override=commit)
    versions = _versions(torch)
    # --out: a file, or a directory to write the usual name into (the GPU machine returns only $OUT).
    if out and not pathlib.Path(out).is_dir():
        path = pathlib.Path(out)
    else:
        path = result_path(pathlib.Path(out) if out else RESULTS_DIR, props.name, now.strftime("%Y-%m-%d"),
                           git["short"], quick)
    log = lambda line: print(line, flush=True)  # noqa: E731
    log(f"perf_table: {props.name} ({props.multi_processor_count} SMs), commit {git['short']}"
        f"{' (dirty)' if git['dirty'] else ''}, torch {versions['torch']} CUDA {versions['cuda']}, "
        f"CuTe DSL {versions['cutlass_dsl']}; {len(plan)} configs ({'quick' if quick else 'full'}), "
        f"{replays} replays each{', eager calls timed' if eager else ''} -> {path}")
    if git["dirty"]:
        log(f"perf_table: warning: the checkout differs from its HEAD {git['short']}, which the run records; "
            "pass --commit to name the code that runs")

    roofline = bench.measure_roofline()
    log(f"roofline: copy {roofline['copy_gbps']:.0f} GB/s (read+write), "
        f"bf16 GEMM {roofline['gemm_n']}^3 {roofline['gemm_tflops']:.0f} TFLOP/s")

    def save(rows, complete):
        record = build_record(device=device, versions=versions, git=git, date=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
                              quick=quick, replays=replays, roofline=roofline, rows=rows, complete=complete,
                              eager=eager)
        path.write_text(dumps_record(record))

    rows_so_far: list[dict] = []

    def hung(variant, cfg):
        # Runs on a timer thread while the main thread is stuck in the GPU call.
        log(f"{variant} {cfg.label()} still running after {CONFIG_TIMEOUT_S} s: taken for a hang; "
            f"writing the {len(rows_so_far)} rows measured so far to {path} and exiting")
        save(rows_so_far + [error_row(variant, cfg, f"timed out after {CONFIG_TIMEOUT_S} s (hung?)")], False)
        os._exit(3)

    shared = {}  # the current config's inputs: its rows (pipelines, auto, multicast off) time the same tensors

    def inputs(cfg):
        key = dataclasses.replace(cfg, multicast=None)
        if key not in shared:
            shared.clear()  # the previous config's tensors go before this one's are made
            shared[key] = bench.make_inputs(cfg, seed=SEED)
        return shared[key]

    # All rows of one config (its pipelines, auto, and the multicast-off pipelines: the same-run A/Bs)
    # are timed together: each captured once, then replayed in interleaved rounds in balanced orders
    # (bench.time_graphs_interleaved), so clock and temperature drift does not favour the row timed
    # first, and the SM clock a row leaves behind does not always fall on the same next row. The first row of a group measures the group; the others take their samples from it.
    def group_key(cfg):
        return dataclasses.replace(cfg, multicast=None)

    group_of: dict = {}
    for v, c in plan:
        group_of.setdefault(group_key(c), []).append((v, c))
    measured: dict = {}  # the current group's {(variant, cfg): (fn, samples) or exception}

    def measure_group(key):
        measured.clear()
        graphs, fns = {}, {}
        for v, c in group_of[key]:
            try:
                with multicast_env(c.multicast), pipeline_env(v):
                    fns[v, c] = bench.make_decode_fn(mla, v, c, inputs(c), num_sms=props.multi_processor_count)
                    graphs[v, c] = bench.capture_graph(fns[v, c], WARMUP_REPLAYS)
            except Exception as exc:  # noqa: BLE001 - that row records it
                measured[v, c] = exc
        if graphs:
            # The default rounds (about 10 replays of each graph per round), not per=1: alternating
            # the graphs replay by replay made each replay follow another graph's, and which graph a
            # replay follows moved its time by up to 4% (docs/perf-notes.md, tenth session).
            timed = bench.time_graphs_interleaved(graphs, replays)
            for vc, samples in timed.items():
                paired = None
                if vc[0] == AUTO:
                    paired = {v: paired_ratio(samples, other) for (v, c), other in timed.items()
                              if v != AUTO and paired_with(vc[1], c)}
                measured[vc] = (fns[vc], samples, paired)

    def run_one(variant, cfg):
        timer = threading.Timer(CONFIG_TIMEOUT_S * len(group_of[group_key(cfg)]), hung, (variant, cfg))
        timer.daemon = True
        timer.start()
        try:
            if (variant, cfg) not in measured:  # the first row of its group (measure_group clears the last)
                measure_group(group_key(cfg))
            result = measured[variant, cfg]
            if isinstance(result, Exception):
                raise result
            fn, samples, paired = result
            inp = inputs(cfg)
            extra = {"resolved": fn.variant, "paired": paired}
            if not eager:
                return inp.total_kv_tokens, samples, None, extra
            # The switch is read at every launch: hold it for the eager calls too.
            with multicast_env(cfg.multicast), pipeline_env(variant):
                flash = bench.make_flash_fn(mla, variant, cfg, inp, num_sms=props.multi_processor_count)
                plan_flash = bench.make_plan_flash_fn(mla, variant, cfg, inp, num_sms=props.multi_processor_count)
                timing = (EAGER_TIMING["eager_calls"], EAGER_TIMING["eager_warmup"], EAGER_TIMING["eager_rounds"])
                times = {"run_us": bench.time_eager(fn, *timing), "flash_us": bench.time_eager(flash, *timing),
                         "plan_run_us": bench.time_eager(plan_flash, *timing)}
            return inp.total_kv_tokens, samples, times, extra
        finally:
            timer.cancel()

    def after_each(rows):
        # Keep the file current (a run cut short still leaves its rows), and hand the config's
        # buffers back before the next one allocates (the largest KV cache is 2.4 GB).
        rows_so_far[:] = rows
        save(rows, complete=False)
        try:
            torch.cuda.empty_cache()
        except RuntimeError:
            pass  # the context is broken; run_plan records the remaining configs as not run

    path.parent.mkdir(parents=True, exist_ok=True)
    rows = run_plan(plan, run_one, roofline, log=log, healthy=bench.cuda_healthy, after_each=after_each,
                    anchors=load_anchors(), device=props.name)
    save(rows, complete=True)
    failed = sum(row["error"] is not None for row in rows)
    log(f"wrote {path} ({len(rows)} rows, {failed} failed); next: python -m perf_table regenerate")
    return 1 if failed else 0
