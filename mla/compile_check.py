"""Compile every kernel variant for sm_90a without a GPU and check its SASS for what it promises.

    python -m mla.compile_check [--variant NAME ...] [--keep DIR]

For each variant this compiles a few static configurations of the host entry the API calls (decode
and split-kv merge kernels, TVM-FFI), and the merge and planner kernels alone, with the CuTe DSL
(``CUTE_DSL_ARCH=sm_90a``, fake tensors), disassembles the cubin with ``nvdisasm`` and
counts the instructions that show the variant is on the intended path: ``HGMMA`` (wgmma) and its
shapes (``64x16x16`` / ``64x32x16`` only for 2wg at <= 32 query rows, its narrow kernel; N >= 64 everywhere
else),
``WARPGROUP.DEPBAR`` (waits for wgmma: one after every HGMMA means ptxas serialized them),
``UTMALDG`` (TMA loads), ``UTMALDG...MULTICAST``, ``UTMALDG.4D`` (a K column group in one copy),
``USETMAXREG`` (register reallocation), ``LDGSTS`` (cp.async), ``STS_ONE_BASE`` (the most 4-byte shared stores
from one base register: 16 for 2wg's 64-row kernel, whose P tile is unswizzled), ``STSM`` (stmatrix) and
``LDL``/``STL`` (local memory: register spills). The configurations cover both KV
loaders and the multicast cluster (``DECODE_CONFIGS``): what a configuration promises follows from
its page size and cluster (``loader_promises``) on top of the variant's own promises. It exits 1 if
a kernel lacks an instruction it promises, has one it must not have, has its wgmma serialized, touches
global memory before its griddepcontrol.wait (``dependent_launch_problems``), or
(3wg) does not start with the register count its setmaxnreg budgets are made for; 2 if the tools
are missing.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

COUNTED = ("HGMMA", "HGMMA_NARROW", "HGMMA_WIDE", "WGMMA_WAIT", "UTMALDG", "UTMALDG_MULTICAST", "UTMALDG_4D", "UTMAPF", "USETMAXREG", "LDGSTS", "CLUSTER_BAR",
           "LD_DSMEM", "STG_128", "GRID_BARRIER", "STS_ONE_BASE", "STSM",
           "LDL", "STL")
_PATTERNS = {
    "HGMMA": re.compile(r"\bHGMMA\b"),
    # wgmma shapes: N = 16 or 32 (the narrow 2wg kernel's transposed products, the query rows as N) and
    # N >= 64 (every product with the query rows as M: 64x64 QK, 64x256 P.V).
    "HGMMA_NARROW": re.compile(r"\bHGMMA\.64x(?:16|32)x16\b"),
    "HGMMA_WIDE": re.compile(r"\bHGMMA\.64x(?:64|128|256)x16\b"),
    "WGMMA_WAIT": re.compile(r"\bWARPGROUP\.DEPBAR\b"),
    "UTMALDG": re.compile(r"\bUTMALDG\b"),
    "UTMALDG_MULTICAST": re.compile(r"\bUTMALDG\S*MULTICAST"),
    # 4-D TMA loads: a K column group as one copy (``kv_wide_boxes``: the seesaw's 64-row boxes).
    "UTMALDG_4D": re.compile(r"\bUTMALDG\.4D\b"),
    # TMA L2 prefetch of K boxes (cp.async.bulk.prefetch.tensor): 2wg's short-chunk prefetch.
    "UTMAPF": re.compile(r"\bUTMAPF\b"),
    "USETMAXREG": re.compile(r"\bUSETMAXREG\b"),
    "LDGSTS": re.compile(r"\bLDGSTS\b"),
    # barrier.cluster.arrive, and the split cluster's 16-byte ld.shared::cluster (a generic LD.E.128:
    # nothing else in these kernels loads 16 bytes through the generic path; global loads are LDG).
    "CLUSTER_BAR": re.compile(r"\bUCGABAR_ARV\b"),
    "LD_DSMEM": re.compile(r"\bLD\.E\.128\b"),
    # 16-byte global stores: the epilogue's stores of O into 16-bit out / partials (skeleton.store_rows_16).
    "STG_128": re.compile(r"\bSTG\.E\.128\b"),
    # The in-grid merge's grid barrier (split_k.grid_sync): its arrival, a gpu-scope atomic add.
    "GRID_BARRIER": re.compile(r"\bATOMG\.E\.ADD\.STRONG\.GPU\b"),
    # stmatrix: the seesaw's P tiles (``p_stmatrix``).
    "STSM": re.compile(r"\bSTSM\b"),
    "LDL": re.compile(r"\bLDL\b"),
    "STL": re.compile(r"\bSTL\b"),
}


@dataclass(frozen=True)
class Target:
    """One kernel to compile: a name, how to compile it, and its promises.

    ``need``: instructions that must appear (count > 0); ``forbid``: ones that must not, or at most ``allow``'s
    count of them (pairs of name and count).
    """
    name: str
    kind: str  # "decode", "merge" or "planner"
    variant: str | None
    dtype: str
    h_q: int
    s_q: int
    causal: bool
    need: tuple[str, ...]
    forbid: tuple[str, ...] = ("LDL", "STL")
    page_size: int = 64
    multicast: bool = True
    split_cluster: int = 1
    registers: int | None = None  # the registers per thread the kernel must start with (None: any)
    partial: str | None = None  # split-kv partial dtype (None: the default, the input dtype)
    allow: tuple[tuple[str, int], ...] = ()


# What each pipeline variant promises in its SASS, whatever the page size. 2wg: wgmma for QK and PV,
# TMA for Q, no spills; it has no producer warpgroup, so no setmaxnreg. 3wg: the same, plus the
# register reallocation of its producer and consumer warpgroups (setmaxnreg, which ptxas drops
# silently without min_blocks_per_mp=1); no spills in any of its three register budgets.
# 3wg also promises its entry register count: its setmaxnreg budgets (pipelines.variant_3wg
# REGISTERS_*) add up to exactly 3 x 168, the pool of 384 threads at 168 registers each; a kernel
# that started with fewer would leave a consumer's setmaxnreg.inc waiting forever for registers.
# Registers per thread a kernel with a producer warpgroup starts with: 384 threads at one CTA per SM
# (= pipelines.variant_3wg.ENTRY_REGISTERS; that module imports the DSL). Its setmaxnreg budgets add up to
# 3 x this; a kernel that started with fewer would leave a setmaxnreg.inc waiting forever.
PRODUCER_ENTRY_REGISTERS = 168
PROMISES = {
    "2wg": dict(need=("HGMMA", "UTMALDG"), forbid=("LDL", "STL", "USETMAXREG")),
    "3wg": dict(need=("HGMMA", "UTMALDG", "USETMAXREG"), forbid=("LDL", "STL"),
                registers=PRODUCER_ENTRY_REGISTERS),
    "seesaw": dict(need=("HGMMA", "UTMALDG"), forbid=("LDL", "STL")),
}
# seesaw on the TMA page sizes has a producer warpgroup (pipelines.variant_seesaw.PRODUCER_REGISTERS, also
# 3 x PRODUCER_ENTRY_REGISTERS) that, where several m-blocks read each tile, prefetches the next fill of each
# stage into L2 (UTMAPF); on the gather pages its two warpgroups load (256 threads, no setmaxnreg).

# (dtype, h_q, s_q, causal, page_size, multicast) of the decode kernels checked per variant: a 2-CTA
# multicast cluster (128 rows, TMA page 64), TMA pages without a cluster (one m-block), the cp.async
# gather (page 1), and a configuration that would have a cluster with multicast switched off.
DECODE_CONFIGS = (
    ("bfloat16", 128, 1, False, 64, True),
    ("bfloat16", 16, 1, False, 64, True),  # one m-block of 16 rows (2wg: the narrow kernel, N 16), TMA pages
    ("float16", 16, 2, True, 64, True),
    ("bfloat16", 16, 1, False, 1, True),
    ("bfloat16", 64, 2, True, 16, False),
    ("bfloat16", 16, 1, False, 64, True, 8),  # a split cluster of 8 (TMA pages)
    ("bfloat16", 64, 2, True, 1, True, 4),  # a split cluster of 4 (cp.async gather), causal MTP
    ("bfloat16", 64, 1, False, 64, True, 1, "float32"),  # fp32 partials
)


def loader_promises(page_size: int, h_q: int, s_q: int, multicast: bool,
                    split_cluster: int = 1) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(need, forbid) that follow from the KV loader and the cluster: TMA pages load K with UTMALDG
    and no cp.async; gather pages with LDGSTS; a multicast cluster multicasts (UTMALDG...MULTICAST),
    a lone CTA must not; a split cluster (no multicast) synchronises its CTAs (barrier.cluster) and
    reads the peers' partials from distributed shared memory (16-byte ld.shared::cluster)."""
    from pipelines import paged_kv

    need, forbid = [], []
    if paged_kv.uses_tma(page_size):
        need.append("UTMALDG")
        forbid.append("LDGSTS")
    else:
        need.append("LDGSTS")
    if paged_kv.cluster_size(page_size, -(-h_q * s_q // 64), multicast and split_cluster == 1) > 1:
        need.append("UTMALDG_MULTICAST")
    else:
        forbid.append("UTMALDG_MULTICAST")
    if split_cluster > 1:
        need += ["CLUSTER_BAR", "LD_DSMEM"]
    else:
        forbid.append("LD_DSMEM")
    return tuple(need), tuple(forbid)


MERGE_STAGING_LDGSTS = 2
"""cp.async copies of the merge by the last chunk's staging (``SplitMerge.merge_rows``) in a decode kernel's SASS."""


def merges_by_last_chunk(variant: str, dtype: str, h_q: int, s_q: int, causal: bool, page: int, split_cluster: int,
                         partial: str | None) -> bool:
    """Whether ``variant``'s decode kernel for that configuration merges split requests by their last chunk (its
    ``can_merge_chunks``, as the compiled entry builds it)."""
    from pipelines import launch

    config = launch.DecodeConfig.make(variant, dtype, h_q, s_q, page, causal, split_cluster=split_cluster,
                                      partial=partial)
    return launch.DecodeEntry(config).decode.can_merge_chunks()


def targets(variants: list[str]) -> list[Target]:
    import pipelines
    from pipelines import paged_kv, variant_2wg_narrow

    out = []
    for v in variants:
        p = PROMISES[v]
        for dtype, h_q, s_q, causal, page, multicast, *rest in DECODE_CONFIGS:
            split_cluster = rest[0] if rest else 1
            partial = rest[1] if len(rest) > 1 else None
            # (seesaw runs no multicast cluster: pipelines.MULTICAST_VARIANTS)
            need, forbid = loader_promises(page, h_q, s_q, multicast and v in pipelines.MULTICAST_VARIANTS,
                                           split_cluster)
            if split_cluster == 1:  # O into out through skeleton.store_rows_16 (a split cluster's ranks
                need += ("STG_128",)  # store from the DSMEM exchange instead)
            if v == "2wg" and variant_2wg_narrow.serves(h_q * s_q, split_cluster):
                # At most 32 rows: the narrow kernel, both products transposed (no padding rows).
                need += ("HGMMA_NARROW",)
                forbid += ("HGMMA_WIDE",)
            else:
                need += ("HGMMA_WIDE",)
                forbid += ("HGMMA_NARROW",)
                if v == "2wg":  # the 64-row kernel: P's unswizzled tile, 16 stores from one base (MIN_COUNTS)
                    need += ("STS_ONE_BASE",)
            # The in-grid merge (pipelines.GRID_MERGE_VARIANTS, never with a split cluster) and the merge by each
            # request's last chunk (its arrival count: the same gpu-scope atomic add).
            chunk_merge = merges_by_last_chunk(v, dtype, h_q, s_q, causal, page, split_cluster, partial)
            if (v in pipelines.GRID_MERGE_VARIANTS and split_cluster == 1) or chunk_merge:
                need += ("GRID_BARRIER",)
            else:
                forbid += ("GRID_BARRIER",)
            # The merge by the last chunk stages the partials with cp.async (SplitMerge.merge_rows): on TMA pages
            # those copies, and no more (K still by TMA).
            allow = (("LDGSTS", MERGE_STAGING_LDGSTS),) if chunk_merge and paged_kv.uses_tma(page) else ()
            registers = p.get("registers")
            if v == "seesaw":
                if paged_kv.uses_tma(page):
                    need += ("USETMAXREG",)
                    registers = PRODUCER_ENTRY_REGISTERS
                    # the producer's L2 prefetch of each stage's next fill, where several m-blocks read a tile
                    if -(-h_q * s_q // 64) > 1:
                        need += ("UTMAPF",)
                    else:
                        forbid += ("UTMAPF",)
                else:
                    forbid += ("USETMAXREG",)
            if v == "2wg":  # short chunks prefetched into L2 (MLADecode2WG.l2_prefetch_chunk_tiles): TMA only
                if paged_kv.uses_tma(page):
                    need += ("UTMAPF",)
                else:
                    forbid += ("UTMAPF",)
            name = (f"{v} {'bf16' if dtype == 'bfloat16' else 'fp16'} h{h_q} s_q{s_q}{' causal' if causal else ''} "
                    f"p{page}{'' if multicast else ' mc-off'}{f' split{split_cluster}' if split_cluster > 1 else ''}"
                    f"{' fp32-partials' if partial == 'float32' else ''}")
            out.append(Target(name, "decode", v, dtype, h_q, s_q, causal,
                              need=tuple(dict.fromkeys(p["need"] + need)),
                              forbid=tuple(dict.fromkeys(p["forbid"] + forbid)), page_size=page, multicast=multicast,
                              split_cluster=split_cluster, registers=registers, partial=partial, allow=allow))
    out.append(Target("merge bf16 h128 s_q1", "merge", None, "bfloat16", 128, 1, False, need=()))
    # The planner: one CTA of scalar code; its walk must stay in registers.
    out.append(Target("planner", "planner", None, "int32", 0, 0, False, need=()))
    return out


def find_nvdisasm() -> str | None:
    """nvdisasm from PATH, else from the nvidia-cuda-nvdisasm wheel (site-packages/nvidia/*/bin)."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    for base in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for path in sorted(glob.glob(os.path.join(base, "nvidia", "*", "bin", "nvdisasm"))):
            if os.access(path, os.X_OK):
                return path
    return None


# 4-byte shared stores addressed as one base register (plus a uniform register) and an immediate offset.
_STS_BASE = re.compile(r"\bSTS \[(R\d+(?:\+UR\d+)?)\+0x[0-9a-f]+\]")
# Counts that a promise needs at least this many of (others: at least 1).
MIN_COUNTS = {
    # 2wg's 64-row kernel stores P's unswizzled tile (MLADecode2WG.p_interleaved) with its 16 stores from one
    # base register; with the swizzle each store had its own address (at most 2 shared a base).
    "STS_ONE_BASE": 16,
}


def count_sass(sass: str) -> dict[str, int]:
    counts = {k: len(_PATTERNS[k].findall(sass)) for k in COUNTED if k in _PATTERNS}
    bases: dict[str, int] = {}
    for base in _STS_BASE.findall(sass):
        bases[base] = bases.get(base, 0) + 1
    counts["STS_ONE_BASE"] = max(bases.values(), default=0)  # the most 4-byte stores sharing one base
    return {k: counts[k] for k in COUNTED}


# ptxas serializes a kernel's wgmma when it cannot keep the in-flight accumulators untouched
# (register pressure, spills, control flow inside a wgmma group: infos C7510-C7515, which the DSL does
# not show). It then waits after every HGMMA, so every kernel's overlap is gone while the results stay
# right. Our kernels wait once per wgmma group (a QK of 36 k-steps, a P.V of 4), so more than one wait
# per 4 HGMMA means serialized.
MAX_WAITS_PER_HGMMA = 0.25


# Global memory instructions (loads, stores, TMA, cp.async, atomics) a kernel launched with
# programmatic dependent launch must not issue before its griddepcontrol.wait (SASS ``ACQBULK``).
# Generic loads/stores/atomics (``LD.E``, ``ST.E``, ``ATOM.E``, ``RED.E``) may address global memory too.
# The check compares text order in the decode function, which has one top-level ACQBULK that every
# thread executes (skeleton.MLADecodeBase.kernel).
_GLOBAL_ACCESS = re.compile(r"\b(LDG|STG|UTMALDG|UTMASTG|UTMAREDG|UTMAPF|UBLKCP|UBLKRED|UBLKPF|LDGSTS|ATOMG|REDG|RED)\b"
                            r"|\b(LD|ST|ATOM|RED)\.E\b")


def sass_functions(sass: str) -> dict[str, str]:
    """nvdisasm output split by kernel: ``{function name: its text}``."""
    parts = re.split(r"^\s*\.section\s+\.text\.(\S+?),", sass, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def dependent_launch_problems(sass: str) -> list[str]:
    """The decode kernel's promise under programmatic dependent launch (``MLADecodeBase.
    dependent_launch``): its griddepcontrol.wait (``ACQBULK``) comes before its first global memory
    access, and its griddepcontrol.launch_dependents (``PREEXIT``, which lets the merge grid read the
    plan) after the wait. Empty if it holds."""
    problems = []
    decode = [text for name, text in sass_functions(sass).items() if "MLADecode" in name]
    if not decode:
        return ["no decode kernel in the SASS"]
    for text in decode:
        lines = text.splitlines()
        wait = next((i for i, line in enumerate(lines) if re.search(r"\bACQBULK\b", line)), None)
        first = next((i for i, line in enumerate(lines) if _GLOBAL_ACCESS.search(line)), None)
        trigger = next((i for i, line in enumerate(lines) if re.search(r"\bPREEXIT\b", line)), None)
        if wait is None:
            problems.append("no griddepcontrol.wait (ACQBULK)")
        elif first is not None and first < wait:
            problems.append(f"global access before griddepcontrol.wait: {lines[first].strip()}")
        if trigger is None:
            problems.append("no griddepcontrol.launch_dependents (PREEXIT)")
        elif wait is not None and trigger < wait:
            problems.append("griddepcontrol.launch_dependents before griddepcontrol.wait")
    return problems


def check_promises(counts: dict[str, int], need, forbid, allow=()) -> list[str]:
    """Return the broken promises (empty if all hold); ``allow``: (name, count) pairs, at most that many of a
    forbidden instruction."""
    allowed = dict(allow)
    problems = [f"no {k}" if MIN_COUNTS.get(k, 1) == 1 else f"{counts.get(k, 0)} {k} (< {MIN_COUNTS[k]})"
                for k in need if counts.get(k, 0) < MIN_COUNTS.get(k, 1)]
    problems += [f"{counts[k]} {k}" + (f" (> {allowed[k]})" if k in allowed else "")
                 for k in forbid if counts.get(k, 0) > allowed.get(k, 0)]
    if counts.get("HGMMA", 0) and counts.get("WGMMA_WAIT", 0) > MAX_WAITS_PER_HGMMA * counts["HGMMA"]:
        problems.append(f"wgmma serialized ({counts['WGMMA_WAIT']} waits for {counts['HGMMA']} HGMMA)")
    return problems


def compile_target(t: Target, dump_dir: str):
    from pipelines import launch

    options = f"--gpu-arch sm_90a --keep-cubin --dump-dir {dump_dir}"
    if t.kind == "decode":
        # The host entry the API calls (decode + merge kernels, TVM-FFI), so the SASS checked is the
        # SASS that runs; its cubin holds both kernels.
        config = launch.DecodeConfig.make(t.variant, t.dtype, t.h_q, t.s_q, t.page_size, t.causal,
                                          multicast=t.multicast, split_cluster=t.split_cluster, partial=t.partial)
        fn = launch.compile_entry(config, options=options)
    elif t.kind == "merge":
        fn = launch.compile_merge(t.dtype, t.h_q, t.s_q, options=options)
    else:
        fn = launch.compile_planner(options=options)
    return fn.artifacts.CUBIN


def cubin_registers(cubin: bytes) -> int | None:
    """Registers per thread of the (one) kernel in a cubin: its EIATTR_REGCOUNT attribute (section
    ``.nv.info``: entries of format byte, attribute byte, then for format 4 a u16 size and the value,
    here (function symbol, count) as two u32). None if the cubin has none."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:  # 64-bit ELF only
        return None
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx][4]
    for name_off, _, _, _, off, size, *_ in headers:
        name = cubin[strtab + name_off:cubin.index(b"\0", strtab + name_off)]
        if not name.startswith(b".nv.info"):
            continue
        pos = off
        while pos < off + size:
            fmt, attr = cubin[pos], cubin[pos + 1]
            if fmt == 0x04:  # EIFMT_SVAL: u16 size, value
                length, = struct.unpack_from("<H", cubin, pos + 2)
                if attr == 0x2F:  # EIATTR_REGCOUNT
                    return struct.unpack_from("<II", cubin, pos + 4)[1]
                pos += 4 + length
            elif fmt in (0x01, 0x02, 0x03):  # no value, u8, u16
                pos += {0x01: 2, 0x02: 3, 0x03: 4}[fmt]
            else:
                break
    return None


def disassemble(nvdisasm: str, cubin: bytes, workdir: str) -> str:
    path = os.path.join(workdir, "kernel.cubin")
    with open(path, "wb") as f:
        f.write(cubin)
    res = subprocess.run([nvdisasm, "-c", path], capture_output=True, text=True, check=True)
    return res.stdout


def main(argv: list[str] | None = None) -> int:
    import pipelines

    parser = argparse.ArgumentParser(prog="python -m mla.compile_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", choices=sorted(PROMISES),
                        help="variant to check (default: every available one)")
    parser.add_argument("--keep", help="directory to keep the cubins and SASS in")
    args = parser.parse_args(argv)
    variants = args.variant or [v for v in pipelines.available_variants() if v in PROMISES]
    missing = [v for v in pipelines.available_variants() if v not in PROMISES]
    if missing:
        print(f"compile_check: no promises recorded for variants {missing}", file=sys.stderr)
        return 1
    nvdisasm = find_nvdisasm()
    if nvdisasm is None:
        print("compile_check: nvdisasm not found (pip install nvidia-cuda-nvdisasm)", file=sys.stderr)
        return 2
    failed = False
    print(f"{'kernel':<36} {'compile s':>9} {'regs':>5} " + " ".join(f"{k:>17}" for k in COUNTED) + "  verdict")
    for t in targets(variants):
        with tempfile.TemporaryDirectory() as tmp:
            work = args.keep or tmp
            dump = os.path.join(work, re.sub(r"\W+", "_", t.name))
            os.makedirs(dump, exist_ok=True)
            start = time.time()
            cubin = compile_target(t, dump)
            secs = time.time() - start
            sass = disassemble(nvdisasm, cubin, dump)
            if args.keep:
                with open(os.path.join(dump, "kernel.sass"), "w") as f:
                    f.write(sass)
        counts = count_sass(sass)
        problems = check_promises(counts, t.need, t.forbid, t.allow)
        if t.kind == "decode":
            problems += dependent_launch_problems(sass)
        registers = cubin_registers(cubin)
        if t.registers is not None and registers != t.registers:
            problems.append(f"starts with {registers} registers per thread, not {t.registers}")
        failed |= bool(problems)
        verdict = "ok" if not problems else "FAIL: " + ", ".join(problems)
        print(f"{t.name:<36} {secs:>9.1f} {registers if registers is not None else '?':>5} "
              + " ".join(f"{counts[k]:>17}" for k in COUNTED) + f"  {verdict}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
