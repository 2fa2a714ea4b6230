"""CPU: the compiled-kernel cache (pipelines/cache.py) and its keys (pipelines/launch.py).

Most tests use stand-ins for compile / export / load (bytes on disk), which exercise the cache's
own logic: keying, memory and disk hits, locking across threads and processes, and corrupt
entries. ``test_real_kernel_round_trip`` compiles a small real CuTe DSL kernel with TVM-FFI,
stores it with the real ``export_to_c`` and loads it in a fresh process through the real
``cute.runtime.load_module``.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import pathlib
import subprocess
import sys
import threading
import time

import pytest

from pipelines import cache as cache_mod
from pipelines.cache import KernelCache

ROOT = pathlib.Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------ stand-ins

class Compiled:
    """What ``compile_fn`` returns in these tests: bytes that export writes and load reads back."""

    def __init__(self, payload: bytes):
        self.payload = payload


def export(compiled, path, name):
    pathlib.Path(path).write_bytes(compiled.payload + name.encode())


class Loaded:
    def __init__(self, data):
        self.data = data

    def __call__(self):
        return self.data


def load(path, name):
    data = pathlib.Path(path).read_bytes()
    if not data.endswith(name.encode()):
        raise RuntimeError("symbol not found")
    return Loaded(data[: -len(name)])


def make_cache(root, namespace="ns0"):
    return KernelCache(root, namespace, export=export, load=load, in_memory=lambda c: Loaded(c.payload),
                       info={"what": "test"})


def counting_compile(counter: list, payload=b"kernel"):
    def compile_fn():
        counter.append(1)
        return Compiled(payload)
    return compile_fn


KEY = ("decode", "2wg", "bfloat16", 16, 1, 64, False, 1)


# --------------------------------------------------------------------------------- basics

def test_memory_hit_compiles_once(tmp_path):
    compiles = []
    cache = make_cache(tmp_path)
    first = cache.lookup(KEY, counting_compile(compiles))
    second = cache.lookup(KEY, counting_compile(compiles))
    assert first.source == "compiled" and second.source == "memory" and first.fn is second.fn
    assert first.fn() == b"kernel" and len(compiles) == 1
    assert cache.get(KEY, counting_compile(compiles)) is first.fn and len(compiles) == 1
    assert cache.stats["compiled"] == 1 and cache.stats["memory"] == 1


def test_second_cache_object_loads_from_disk(tmp_path):
    """A new KernelCache on the same root is a new process's view: it loads, it does not compile."""
    compiles = []
    stored = make_cache(tmp_path).lookup(KEY, counting_compile(compiles))
    fresh = make_cache(tmp_path).lookup(KEY, counting_compile(compiles))
    assert fresh.source == "disk" and fresh.fn() == b"kernel" and len(compiles) == 1
    assert fresh.path == stored.path and stored.path.parent == tmp_path / "ns0"
    manifest = json.loads(stored.path.with_suffix(".json").read_text())
    assert manifest["key"] == repr(KEY) and manifest["namespace"] == "ns0" and manifest["size"] > 0
    assert json.loads((tmp_path / "ns0" / "namespace.json").read_text())["what"] == "test"
    entries = make_cache(tmp_path).entries()
    assert [e["key"] for e in entries] == [repr(KEY)]


def test_keys_and_namespaces_are_separate_entries(tmp_path):
    compiles = []
    make_cache(tmp_path).lookup(KEY, counting_compile(compiles, b"a"))
    other_key = KEY[:-1] + (2,)
    assert make_cache(tmp_path).lookup(other_key, counting_compile(compiles, b"b")).fn() == b"b"
    # Another namespace (another source or toolchain fingerprint) never sees the first entries.
    other_ns = make_cache(tmp_path, "ns1").lookup(KEY, counting_compile(compiles, b"c"))
    assert other_ns.source == "compiled" and other_ns.fn() == b"c" and len(compiles) == 3
    assert make_cache(tmp_path).lookup(KEY, counting_compile(compiles)).fn() == b"a"


def test_names_are_stable_and_distinct():
    assert cache_mod.entry_name(KEY) == cache_mod.entry_name(tuple(KEY))
    assert cache_mod.entry_name(KEY) != cache_mod.entry_name(KEY[:-1] + (2,))
    assert cache_mod.entry_name(KEY).startswith("decode-2wg-bfloat16-16-1-64-False-1-")
    name = cache_mod.function_name(KEY)
    assert name.isidentifier() and name != cache_mod.function_name(KEY[:-1] + (2,))


def test_disk_off_keeps_memory_only(tmp_path):
    compiles = []
    cache = KernelCache(None, "ns0", export=export, load=load, in_memory=lambda c: Loaded(c.payload))
    assert cache.lookup(KEY, counting_compile(compiles)).source == "compiled"
    assert cache.lookup(KEY, counting_compile(compiles)).source == "memory" and len(compiles) == 1
    assert not any(tmp_path.iterdir()) and cache.entries() == []


def test_unwritable_root_falls_back_to_memory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    compiles = []
    with pytest.warns(RuntimeWarning, match="kernel disk cache unusable"):
        result = make_cache(blocker).lookup(KEY, counting_compile(compiles))
    assert result.source == "compiled" and result.fn() == b"kernel" and result.path is None


# ----------------------------------------------------------------------------- corruption

def _stored(tmp_path):
    result = make_cache(tmp_path).lookup(KEY, counting_compile([]))
    return result.path, result.path.with_suffix(".json")


@pytest.mark.parametrize("damage, reason", [
    (lambda obj, man: obj.write_bytes(obj.read_bytes()[:5]), "object is 5 bytes"),  # truncated
    (lambda obj, man: obj.write_bytes(b"X" * len(obj.read_bytes())), "sha256 mismatch"),  # garbage, same size
    (lambda obj, man: obj.unlink(), "object unreadable"),
    (lambda obj, man: man.write_text("{not json"), "manifest is not valid JSON"),
    (lambda obj, man: man.write_text("[1, 2]"), "manifest is not a JSON object"),
    (lambda obj, man: man.write_text(man.read_text().replace("'decode'", "'merge'")), "manifest key"),
    (lambda obj, man: man.write_text(man.read_text().replace('"format": 1', '"format": 0')), "manifest format"),
])
def test_corrupt_entry_is_recompiled_never_loaded(tmp_path, damage, reason):
    obj, man = _stored(tmp_path)
    damage(obj, man)
    loads = []

    def guarded_load(path, name):
        data = pathlib.Path(path).read_bytes()
        loads.append(data)
        return load(path, name)

    compiles = []
    cache = KernelCache(tmp_path, "ns0", export=export, load=guarded_load, in_memory=lambda c: Loaded(c.payload))
    with pytest.warns(RuntimeWarning, match=reason):
        result = cache.lookup(KEY, counting_compile(compiles, b"fresh"))
    assert result.source == "compiled" and result.replaced and reason in result.replaced
    assert result.fn() == b"fresh" and len(compiles) == 1
    # Only the re-stored, verified object was ever handed to the loader.
    assert loads == [b"fresh" + cache_mod.function_name(KEY).encode()]
    assert make_cache(tmp_path).lookup(KEY, counting_compile(compiles)).source == "disk" and len(compiles) == 1


def test_entry_that_fails_to_load_is_recompiled(tmp_path):
    obj, _ = _stored(tmp_path)
    attempts = []

    def flaky_load(path, name):
        attempts.append(path)
        if len(attempts) <= 2:  # the lock-free look and the look under the lock
            raise OSError("cannot link")
        return load(path, name)

    cache = KernelCache(tmp_path, "ns0", export=export, load=flaky_load, in_memory=lambda c: Loaded(c.payload))
    with pytest.warns(RuntimeWarning, match="load failed"):
        result = cache.lookup(KEY, counting_compile([], b"again"))
    assert result.source == "compiled" and result.fn() == b"again" and len(attempts) == 3


# -------------------------------------------------------------------------------- locking

def test_threads_compile_one_key_once(tmp_path):
    compiles = []

    def slow_compile():
        compiles.append(1)
        time.sleep(0.3)
        return Compiled(b"kernel")

    cache = make_cache(tmp_path)
    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.lookup(KEY, slow_compile))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(compiles) == 1 and len(results) == 4
    assert sorted(r.source for r in results) == ["compiled", "memory", "memory", "memory"]
    assert all(r.fn() == b"kernel" for r in results)


def _process_lookup(root: str, log: str, barrier, queue):
    # A separate process: its own KernelCache on the shared root (as two engine processes would).
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from test_kernel_cache import Compiled, make_cache

    def slow_compile():
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(1.0)
        return Compiled(b"kernel")

    barrier.wait()
    result = make_cache(pathlib.Path(root)).lookup(KEY, slow_compile)
    queue.put((result.source, result.fn()))


def test_processes_compile_one_key_once(tmp_path):
    """Two processes asking for the same key at the same time: one compiles, the other waits on the
    file lock and loads the stored entry; both get a working result."""
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    log = tmp_path / "compiles.log"
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env_path]))
    try:
        procs = [ctx.Process(target=_process_lookup, args=(str(tmp_path / "cache"), str(log), barrier, queue))
                 for _ in range(2)]
        for p in procs:
            p.start()
        results = [queue.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(timeout=60)
    finally:
        os.environ["PYTHONPATH"] = env_path
    assert all(p.exitcode == 0 for p in procs)
    assert len(log.read_text().split()) == 1  # one compile
    assert sorted(results) == [("compiled", b"kernel"), ("disk", b"kernel")]


# ------------------------------------------------------------------------ environment

def test_root_and_switch_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(cache_mod.CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_mod.default_root() == tmp_path / "xdg" / "mla-decode"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_mod.default_root() == tmp_path / "home" / ".cache" / "mla-decode"
    monkeypatch.setenv(cache_mod.CACHE_DIR_ENV, str(tmp_path / "mine"))
    assert cache_mod.default_root() == tmp_path / "mine"
    for value, want in (("", True), ("1", True), ("on", True), ("0", False), ("False", False), ("off", False)):
        monkeypatch.setenv(cache_mod.DISK_CACHE_ENV, value)
        assert cache_mod.disk_cache_enabled() is want
    monkeypatch.setenv(cache_mod.DISK_CACHE_ENV, "nope")
    with pytest.raises(ValueError, match="MLA_DISK_CACHE must be one of"):
        cache_mod.disk_cache_enabled()


# ------------------------------------------------------------------ keys of the decode entry

def test_decode_config_key_normalises_and_distinguishes():
    from pipelines.launch import DecodeConfig

    base = DecodeConfig.make("2wg", "torch.bfloat16", 16, 1, 64, True)
    assert base == DecodeConfig.make("2wg", "bfloat16", 16, 1, 64, False)  # causal means nothing for s_q = 1
    assert base == DecodeConfig.make("2wg", "bfloat16", 16, 1, 64, False, multicast=False)  # no cluster anyway
    assert base.key() == ("decode", "2wg", "bfloat16", 16, 1, 64, False, 1, 1, "bfloat16", 1)  # 16-bit partials
    assert DecodeConfig.make("2wg", "bfloat16", 16, 1, 64, False, partial="float32").partial == "float32"
    # A split cluster is its own kernel, and it excludes the multicast cluster.
    assert DecodeConfig.make("2wg", "bfloat16", 16, 1, 64, False, split_cluster=8).key()[-1] == 8
    h128 = DecodeConfig.make("2wg", "bfloat16", 128, 1, 64, False)
    assert h128.cluster == 2 and DecodeConfig.make("2wg", "bfloat16", 128, 1, 64, False, split_cluster=4).cluster == 1
    # 16-bit partials: "input" names the input dtype; any other dtype is refused.
    assert DecodeConfig.make("2wg", "bfloat16", 16, 1, 64, False, partial="input").partial == "bfloat16"
    assert DecodeConfig.make("2wg", "float16", 16, 1, 64, False, partial="torch.float16").partial == "float16"
    with pytest.raises(ValueError, match="partial dtype"):
        DecodeConfig.make("2wg", "bfloat16", 16, 1, 64, False, partial="float16")
    # 128 rows at a TMA page size: two m-blocks, a 2-CTA cluster unless multicast is off.
    assert DecodeConfig.make("2wg", "bfloat16", 128, 1, 64, False).cluster == 2
    assert DecodeConfig.make("2wg", "bfloat16", 128, 1, 64, False, multicast=False).cluster == 1
    assert DecodeConfig.make("seesaw", "bfloat16", 128, 1, 64, False).cluster == 1  # no multicast cluster
    others = [DecodeConfig.make("2wg", "float16", 16, 1, 64, False), DecodeConfig.make("2wg", "bfloat16", 32, 1, 64, False),
              DecodeConfig.make("2wg", "bfloat16", 16, 2, 64, False), DecodeConfig.make("2wg", "bfloat16", 16, 2, 64, True),
              DecodeConfig.make("2wg", "bfloat16", 16, 1, 16, False), DecodeConfig.make("2wg", "bfloat16", 16, 1, 64, False, 2),
              DecodeConfig.make("3wg", "bfloat16", 16, 1, 64, False),
              DecodeConfig.make("2wg", "bfloat16", 128, 1, 64, False), DecodeConfig.make("2wg", "bfloat16", 128, 1, 64,
                                                                                        False, multicast=False),
              DecodeConfig.make("2wg", "bfloat16", 16, 1, 64, False, partial="float32")]
    keys = {base.key()} | {c.key() for c in others}
    assert len(keys) == 1 + len(others)


def test_namespace_changes_with_sources_versions_arch_and_knobs(monkeypatch, tmp_path):
    import cutlass
    import tvm_ffi

    from pipelines import launch

    base = launch.namespace()
    assert base == launch.namespace() and len(base) == 24
    # A kernel source changes: copy the two packages, edit one file.
    copies = []
    for directory in launch._PACKAGE_DIRS:
        dst = tmp_path / directory.name
        dst.mkdir()
        for path in directory.glob("*.py"):
            (dst / path.name).write_bytes(path.read_bytes())
        copies.append(dst)
    monkeypatch.setattr(launch, "_PACKAGE_DIRS", tuple(copies))
    assert launch.namespace() == base  # same bytes, same namespace
    for name in ("auto.py", "auto_table.py"):  # pipeline="auto"'s table is no kernel source
        table = tmp_path / "pipelines" / name
        table.write_text(table.read_text() + "\n# regenerated\n")
    assert launch.namespace() == base
    skeleton = tmp_path / "pipelines" / "skeleton.py"
    skeleton.write_text(skeleton.read_text() + "\n# a comment is a change too\n")
    edited = launch.namespace()
    assert edited != base
    merge = tmp_path / "split_k" / "merge_kernel.py"
    merge.write_text(merge.read_text() + "\n")
    assert launch.namespace() not in (base, edited)
    monkeypatch.setattr(launch, "_PACKAGE_DIRS", launch._PACKAGE_DIRS)
    monkeypatch.undo()
    assert launch.namespace() == base

    for module, attr in ((cutlass, "__version__"), (tvm_ffi, "__version__")):
        monkeypatch.setattr(module, attr, "0.0.0-test")
        assert launch.namespace() != base
        monkeypatch.undo()
    assert launch.namespace() == base
    monkeypatch.setattr(sys, "version_info", (3, 99, 0, "final", 0))
    assert launch.namespace() != base
    monkeypatch.undo()
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_100a")
    assert launch.namespace() != base
    monkeypatch.undo()
    monkeypatch.setenv("CUTE_DSL_SOME_CODEGEN_KNOB", "1")
    assert launch.namespace() != base
    monkeypatch.undo()
    monkeypatch.setenv("CUTE_DSL_LOG_LEVEL", "10")  # logging does not change code
    assert launch.namespace() == base


def test_kernel_cache_follows_the_environment(monkeypatch, tmp_path):
    from pipelines import launch

    monkeypatch.setenv("MLA_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MLA_DISK_CACHE", raising=False)
    launch.reset_kernel_cache()
    try:
        cache = launch.kernel_cache()
        assert cache is launch.kernel_cache()
        assert cache.directory == tmp_path / launch.namespace()
        monkeypatch.setenv("MLA_DISK_CACHE", "0")
        launch.reset_kernel_cache()
        assert launch.kernel_cache().directory is None
    finally:
        launch.reset_kernel_cache()


# ------------------------------------------------------------------------- a real kernel

_TOY = r'''
import os, sys, json
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
import cutlass, cutlass.cute as cute
import cuda.bindings.driver as cuda
from pipelines.cache import KernelCache

class Copy:
    @cute.jit
    def __call__(self, src: cute.Tensor, dst: cute.Tensor, stream: cuda.CUstream):
        self.kernel(src, dst).launch(grid=[1, 1, 1], block=[32, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, src: cute.Tensor, dst: cute.Tensor):
        t, _, _ = cute.arch.thread_idx()
        dst[t] = src[t]

def compile_fn():
    n = cute.sym_int32()
    src = cute.runtime.make_fake_tensor(cutlass.Float32, (n,), (1,), assumed_align=16)
    dst = cute.runtime.make_fake_tensor(cutlass.Float32, (n,), (1,), assumed_align=16)
    return cute.compile(Copy(), src, dst, cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True),
                        options="--enable-tvm-ffi")

result = KernelCache(sys.argv[1], "toy").lookup(("toy", "copy", 1), compile_fn)
import torch
try:
    result.fn(torch.zeros(32), torch.zeros(32))  # CPU tensors: the compiled argument check refuses them
    error = None
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"
print(json.dumps({"source": result.source, "type": type(result.fn).__name__, "error": error}))
'''


def test_real_kernel_round_trip(tmp_path):
    """A real TVM-FFI kernel: compiled and stored by one process, loaded from disk by the next, and
    callable there (its compiled argument check answers, naming the expected device)."""
    script = tmp_path / "toy.py"
    script.write_text(_TOY)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(script), str(tmp_path / "cache")], capture_output=True, text=True,
                              env=env, timeout=600, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert [r["source"] for r in runs] == ["compiled", "disk"]
    for r in runs:
        assert r["type"] == "Function" and "expected device_type=cuda" in r["error"], r
    objects = list((tmp_path / "cache" / "toy").glob("*.o"))
    assert len(objects) == 1 and objects[0].stat().st_size > 1000
