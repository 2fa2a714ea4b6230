"""Build FlashMLA's dense Hopper decode from its public source, for paired timing (GPU machine)

    python scripts/flashmla_build.py --src .flashmla/src.tar.xz [--build-dir .flashmla_build] [--version 9241ae3]
    PYTHONPATH=.flashmla_build python scripts/flashmla_pair.py --grid

(Both paths are git-ignored: the source travels to the GPU machine as a ``carry`` path, the build stays there.)

The GPU machine has no registry, so FlashMLA cannot be pip-installed there. ``--src`` is a FlashMLA
checkout (a directory, or a .tar.xz of one) that holds at least ``csrc/`` with its ``cutlass`` submodule
filled in (``include/`` and ``tools/util/include/``); nothing of it ships with this project. This compiles
only what the dense sm90 decode needs (``sm90/decode/dense`` for bf16, the split-kv combine, the scheduler
metadata kernel) with FlashMLA's own compiler flags for sm_90a, plus a one-function binding of its
``dense_attn_decode_interface``, and writes a small ``flash_mla`` package into the build directory whose
``get_mla_metadata`` / ``flash_mla_with_kvcache`` behave as FlashMLA's public API does for dense decode
(metadata filled on the first call and reused after), which is what ``scripts/flashmla_pair.py`` calls.
Objects already built are kept (a warm machine rebuilds nothing); about 100 s on 16 cores from scratch.

Tested against FlashMLA 9241ae3 (its cutlass submodule at 147f567) with CUDA 13.0 and torch 2.x.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import pathlib
import subprocess
import sys
import sysconfig
import tarfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = ("sm90/decode/dense/instantiations/bf16.cu", "smxx/decode/combine/combine.cu",
           "smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu")
BINDING = """#include <pybind11/pybind11.h>
#include "api/dense_decode.h"
PYBIND11_MODULE(flashmla_dense, m) { m.def("dense_decode_fwd", &dense_attn_decode_interface); }
"""
PACKAGE = '''"""FlashMLA's dense decode entry (built by scripts/flashmla_build.py) behind its public API's names."""
__version__ = {version!r}
import importlib.util as _u
import pathlib as _p

_spec = _u.spec_from_file_location("flashmla_dense", _p.Path(__file__).resolve().parent.parent / "flashmla_dense.so")
_ext = _u.module_from_spec(_spec)
_spec.loader.exec_module(_ext)


class _SchedMeta:
    """Filled by the first call (FlashMLA computes its scheduler metadata there), reused after."""
    tile_scheduler_metadata = None
    num_splits = None


def get_mla_metadata(*args, **kwargs):
    return _SchedMeta(), None


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits=None, softmax_scale=None, causal=False):
    meta = tile_scheduler_metadata
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    out, lse, meta.tile_scheduler_metadata, meta.num_splits = _ext.dense_decode_fwd(
        q, k_cache, head_dim_v, cache_seqlens, block_table, softmax_scale, causal, meta.tile_scheduler_metadata,
        meta.num_splits)
    return out, lse
'''


def _nvcc_flags() -> list[str]:
    # FlashMLA's setup.py flags for its CUDA sources, sm_90a only.
    return ["-O3", "-std=c++20", "-DNDEBUG", "-D_USE_MATH_DEFINES", "-Wno-deprecated-declarations",
            "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__",
            "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "--expt-relaxed-constexpr", "--expt-extended-lambda",
            "--use_fast_math", "--ptxas-options=--register-usage-level=10", "-gencode", "arch=compute_90a,code=sm_90a",
            "--threads", "4", "-Xcompiler", "-fPIC"]


def build(src: pathlib.Path, build_dir: pathlib.Path, version: str = "unknown") -> pathlib.Path:
    import torch
    import torch.utils.cpp_extension as ext

    so = build_dir / "flashmla_dense.so"
    pkg = build_dir / "flash_mla"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(PACKAGE.format(version=version))
    if so.exists():
        return so
    t0 = time.perf_counter()
    if src.is_file():
        tree = build_dir / "src"
        if not (tree / "csrc").exists():
            tree.mkdir(parents=True, exist_ok=True)
            with tarfile.open(src) as tar:
                tar.extractall(tree)
        src = tree
    csrc = src / "csrc"
    if not (csrc / "cutlass" / "include" / "cute").is_dir():
        raise SystemExit(f"{csrc}/cutlass/include/cute is missing: fill FlashMLA's cutlass submodule")
    cuda = pathlib.Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    try:
        t_inc, t_lib = ext.include_paths(device_type="cuda"), ext.library_paths(device_type="cuda")
    except TypeError:  # older torch
        t_inc, t_lib = ext.include_paths(cuda=True), ext.library_paths(cuda=True)
    includes = [csrc, csrc / "kerutils/include", csrc / "sm90", csrc / "cutlass/include",
                csrc / "cutlass/tools/util/include", *map(pathlib.Path, t_inc), pathlib.Path(sysconfig.get_paths()["include"])]
    common = ["-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=flashmla_dense", "-DFLASH_MLA_DISABLE_FP16", "-DNDEBUG",
              f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"] + [f"-I{p}" for p in includes]
    obj = build_dir / "obj"
    obj.mkdir(exist_ok=True)
    (obj / "bind.cpp").write_text(BINDING)
    jobs = [["nvcc", "-c", *_nvcc_flags(), *common, str(csrc / s), "-o", str(obj / (pathlib.Path(s).stem + ".o"))]
            for s in SOURCES]
    # The binding includes CUTLASS host headers, which need libcu++ (CUDA 13 keeps it under include/cccl).
    jobs.append(["g++", "-c", "-O3", "-std=c++20", "-fPIC", "-Wno-deprecated-declarations", *common,
                 f"-I{cuda / 'include'}", f"-I{cuda / 'include' / 'cccl'}", str(obj / "bind.cpp"), "-o", str(obj / "bind.o")])
    jobs = [j for j in jobs if not pathlib.Path(j[-1]).exists()]
    with concurrent.futures.ThreadPoolExecutor(len(jobs) or 1) as pool:
        for job, res in zip(jobs, pool.map(lambda j: subprocess.run(j, capture_output=True, text=True), jobs)):
            if res.returncode:
                raise SystemExit(f"compile failed: {job[-3]}\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}")
    libs = [*t_lib, str(cuda / "lib64")]
    link = ["g++", "-shared", "-o", str(so), *sorted(str(p) for p in obj.glob("*.o")), *[f"-L{p}" for p in libs],
            "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-lc10_cuda", "-ltorch_cuda", "-lcudart",
            *[f"-Wl,-rpath,{p}" for p in libs]]
    res = subprocess.run(link, capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(f"link failed\n{res.stderr[-4000:]}")
    print(f"built {so} in {time.perf_counter() - t0:.0f} s", flush=True)
    return so


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", required=True, type=pathlib.Path, help="FlashMLA checkout (directory or .tar.xz)")
    ap.add_argument("--build-dir", type=pathlib.Path, default=ROOT / ".flashmla_build")
    ap.add_argument("--version", default="unknown", help="FlashMLA's commit, recorded as flash_mla.__version__")
    args = ap.parse_args(argv)
    if not args.src.exists():
        print(f"--src {args.src} does not exist", file=sys.stderr)
        return 2
    build(args.src.resolve(), args.build_dir.resolve(), args.version)
    sys.path.insert(0, str(args.build_dir.resolve()))
    import flash_mla
    print("flash_mla ready:", flash_mla.__file__, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
