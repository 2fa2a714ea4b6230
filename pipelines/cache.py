"""Compiled-kernel cache: in memory for this process, on disk across processes.

A compiled host entry (``cute.compile`` with TVM-FFI) is expensive (seconds) and a pure function of
the kernel sources, the toolchain and the static configuration, so it is compiled once per machine:

- **Memory**: ``key -> callable``. A hit is one dictionary lookup, no lock (the decode API calls
  this on every eager call it has not already cached itself).
- **Disk**: ``<root>/<namespace>/<name>.o`` (``export_to_c``: host code with the cubin embedded) and
  ``<name>.json`` (manifest: the key, the object's size and sha256). The namespace is a fingerprint
  of everything besides the key that changes the compiled code (``pipelines.launch.namespace``), so
  a source or version change lands in a new directory and never loads an old object.
- **Several processes**: a miss takes an exclusive ``flock`` on ``<name>.lock``, looks again (another
  process may have stored it meanwhile), and only then compiles; files are written to a temporary
  name and renamed into place (the manifest last), so a reader sees a complete entry or none.
- **Corruption**: an entry is loaded only if its manifest parses, names this key and namespace, and
  the object's size and sha256 match it (checked *before* the object reaches the loader, which
  would otherwise link arbitrary bytes into the process). Anything else is recompiled and replaced.

The cache is generic: ``get(key, compile_fn)`` works for any key (a tuple of str/int/bool) and any
``compile_fn`` returning a compiled TVM-FFI function (decode entry, merge, a planner kernel, ...).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import re
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

FORMAT = 1
"""Manifest format; part of every namespace, so a change of the layout starts a new directory."""

CACHE_DIR_ENV = "MLA_CACHE_DIR"
DISK_CACHE_ENV = "MLA_DISK_CACHE"
_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")


def default_root() -> pathlib.Path:
    """``$MLA_CACHE_DIR``, else ``$XDG_CACHE_HOME/mla-decode``, else ``~/.cache/mla-decode``."""
    explicit = os.environ.get(CACHE_DIR_ENV, "").strip()
    if explicit:
        return pathlib.Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = pathlib.Path(xdg).expanduser() if xdg else pathlib.Path.home() / ".cache"
    return base / "mla-decode"


def disk_cache_enabled() -> bool:
    """``MLA_DISK_CACHE``: unset or 1/true/on/yes = on, 0/false/off/no = off; anything else is an error
    (a typo must not silently turn the cache off or on)."""
    value = os.environ.get(DISK_CACHE_ENV, "").strip().lower()
    if not value or value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{DISK_CACHE_ENV} must be one of {_TRUE + _FALSE} (or unset), got {value!r}")


def entry_name(key: tuple) -> str:
    """File stem of a key: a readable slug plus 16 hex digits of sha256(repr(key))."""
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9]+", "-", "_".join(str(part) for part in key)).strip("-")[:80]
    return f"{slug}-{digest}"


def function_name(key: tuple) -> str:
    """C symbol the entry is exported under (must be an identifier)."""
    return "mla_" + hashlib.sha256(repr(key).encode()).hexdigest()[:24]


@dataclass
class Lookup:
    """What ``KernelCache.lookup`` did: the callable and where it came from.

    ``source``: ``"memory"``, ``"disk"`` (loaded from a stored entry), ``"compiled"`` (compiled now
    and stored, or kept in memory when the disk cache is off or unwritable). ``path``: the object
    file (None without disk). ``replaced``: why a stored entry was not used (``None`` if there was
    none or it was used), e.g. ``"sha256 mismatch"``.
    """
    fn: Any
    source: str
    path: pathlib.Path | None = None
    seconds: float = 0.0
    replaced: str | None = None


def _export(compiled, path: str, name: str) -> None:
    compiled.export_to_c(path, function_name=name)


def _load(path: str, name: str):
    import cutlass.cute as cute
    return getattr(cute.runtime.load_module(path, enable_tvm_ffi=True), name)


def _in_memory(compiled):
    # TVM-FFI compiles come wrapped for keyword arguments; the raw tvm_ffi.Function behind it is
    # the same code with a cheaper call (positional only, as the API calls it).
    raw = getattr(compiled, "__tvm_ffi_object__", None)
    fn = raw() if callable(raw) else None
    return fn if fn is not None else compiled


class KernelCache:
    """See the module docstring. ``root=None`` keeps everything in memory (disk cache off).

    ``export(compiled, path, name)``, ``load(path, name)`` and ``in_memory(compiled)`` default to
    the CuTe DSL's ``export_to_c`` / ``cute.runtime.load_module(..., enable_tvm_ffi=True)``; tests
    substitute cheap stand-ins to exercise keying, locking and corruption handling.
    """

    def __init__(self, root: pathlib.Path | str | None, namespace: str, *, export: Callable = _export,
                 load: Callable = _load, in_memory: Callable = _in_memory, info: dict | None = None,
                 log: Callable[[str], None] | None = None):
        self.namespace = namespace
        self.directory = pathlib.Path(root) / namespace if root is not None else None
        self._export, self._load, self._in_memory = export, load, in_memory
        self._info = info or {}
        self._log = log
        self._memory: dict = {}
        # One lock for every miss in this process: compiles are seconds long and the DSL compiler is
        # not documented as thread-safe; hits never take it.
        self._miss_lock = threading.RLock()
        self.stats = {"memory": 0, "disk": 0, "compiled": 0, "replaced": 0}

    # ------------------------------------------------------------------ public
    def get(self, key: tuple, compile_fn: Callable[[], Any]):
        """The callable for ``key``, compiling with ``compile_fn()`` only if no valid entry exists."""
        fn = self._memory.get(key)
        if fn is not None:
            return fn
        return self.lookup(key, compile_fn).fn

    def lookup(self, key: tuple, compile_fn: Callable[[], Any]) -> Lookup:
        """Like ``get``, and says where the callable came from (``Lookup``)."""
        fn = self._memory.get(key)
        if fn is not None:
            self.stats["memory"] += 1
            return Lookup(fn, "memory", self._paths(key)[0] if self.directory else None)
        with self._miss_lock:
            fn = self._memory.get(key)
            if fn is not None:
                self.stats["memory"] += 1
                return Lookup(fn, "memory", self._paths(key)[0] if self.directory else None)
            start = time.perf_counter()
            result = self._lookup_disk(key, compile_fn) if self.directory is not None else None
            if result is None:  # disk cache off, or the directory is unusable
                result = Lookup(self._in_memory(compile_fn()), "compiled")
            result.seconds = time.perf_counter() - start
            self.stats[result.source] += 1
            self.stats["replaced"] += result.replaced is not None
            self._memory[key] = result.fn
            return result

    def clear_memory(self) -> None:
        """Forget the in-memory entries (the disk entries stay)."""
        with self._miss_lock:
            self._memory.clear()

    def entries(self) -> list[dict]:
        """Manifests of the valid-looking entries stored under this namespace (for reports)."""
        if self.directory is None or not self.directory.is_dir():
            return []
        out = []
        for path in sorted(self.directory.glob("*.json")):
            if path.name == "namespace.json":
                continue
            try:
                manifest = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(manifest, dict) and manifest.get("format") == FORMAT:
                out.append(manifest)
        return out

    # ------------------------------------------------------------------ disk
    def _paths(self, key: tuple) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
        stem = self.directory / entry_name(key)
        return stem.with_suffix(".o"), stem.with_suffix(".json"), stem.with_suffix(".lock")

    def _lookup_disk(self, key: tuple, compile_fn) -> Lookup | None:
        obj, manifest, lock = self._paths(key)
        name = function_name(key)
        # Lock-free first look: a warm cache never touches a lock file.
        fn, why = self._load_verified(key, obj, manifest, name)
        if fn is not None:
            return Lookup(fn, "disk", obj)
        try:
            self._ensure_directory()
            lock_file = open(lock, "a+b")
        except OSError as exc:
            self._warn(f"kernel disk cache unusable ({exc}); compiling in memory only")
            return None
        with lock_file, _flock(lock_file):
            fn, why_locked = self._load_verified(key, obj, manifest, name)  # stored while we waited?
            if fn is not None:
                return Lookup(fn, "disk", obj)
            why = why_locked or why
            if why not in (None, "missing"):
                self._warn(f"kernel cache entry {obj.name}: {why}; recompiling it")
            compiled = compile_fn()
            try:
                self._store(key, compiled, obj, manifest, name)
            except OSError as exc:
                self._warn(f"could not store {obj.name} in the kernel disk cache ({exc}); keeping it in memory")
                return Lookup(self._in_memory(compiled), "compiled", None,
                              replaced=why if why != "missing" else None)
            # Run what a later process will run: the stored object, loaded and verified.
            fn, why_after = self._load_verified(key, obj, manifest, name)
            if fn is None:
                self._warn(f"kernel cache entry {obj.name} failed to load right after storing it ({why_after}); "
                           f"using the in-process compile")
                fn = self._in_memory(compiled)
            return Lookup(fn, "compiled", obj, replaced=why if why != "missing" else None)

    def _load_verified(self, key, obj: pathlib.Path, manifest_path: pathlib.Path, name: str):
        """``(fn, None)`` for a valid entry, else ``(None, reason)``; never loads unverified bytes."""
        try:
            text = manifest_path.read_text()
        except FileNotFoundError:
            return None, "missing"
        except OSError as exc:
            return None, f"manifest unreadable ({exc})"
        try:
            manifest = json.loads(text)
        except ValueError:
            return None, "manifest is not valid JSON"
        if not isinstance(manifest, dict):
            return None, "manifest is not a JSON object"
        for field, want in (("format", FORMAT), ("namespace", self.namespace), ("key", repr(key)),
                            ("function", name), ("object", obj.name)):
            if manifest.get(field) != want:
                return None, f"manifest {field} is {manifest.get(field)!r}, expected {want!r}"
        try:
            data = obj.read_bytes()
        except OSError as exc:
            return None, f"object unreadable ({exc})"
        if len(data) != manifest.get("size"):
            return None, f"object is {len(data)} bytes, manifest says {manifest.get('size')}"
        if hashlib.sha256(data).hexdigest() != manifest.get("sha256"):
            return None, "sha256 mismatch"
        try:
            fn = self._load(str(obj), name)
        except Exception as exc:  # noqa: BLE001 - a verified object that will not load is recompiled
            return None, f"load failed ({type(exc).__name__}: {exc})"
        return fn, None

    def _ensure_directory(self) -> None:
        fresh = not self.directory.is_dir()
        self.directory.mkdir(parents=True, exist_ok=True)
        info_path = self.directory / "namespace.json"
        if fresh or not info_path.exists():
            _atomic_write(info_path, json.dumps(dict(self._info, namespace=self.namespace, format=FORMAT),
                                                indent=1, sort_keys=True).encode())

    def _store(self, key, compiled, obj: pathlib.Path, manifest_path: pathlib.Path, name: str) -> None:
        tmp = obj.with_name(f".{obj.stem}.{os.getpid()}.{threading.get_ident()}.tmp.o")  # export needs ".o"
        try:
            self._export(compiled, str(tmp), name)
            data = tmp.read_bytes()
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, obj)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        manifest = {"format": FORMAT, "namespace": self.namespace, "key": repr(key), "function": name,
                    "object": obj.name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                    "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        # The manifest goes last: until it is in place, readers treat the entry as missing.
        _atomic_write(manifest_path, json.dumps(manifest, indent=1, sort_keys=True).encode())

    def _warn(self, message: str) -> None:
        if self._log is not None:
            self._log(message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


@contextlib.contextmanager
def _flock(f):
    fcntl.flock(f.fileno(), fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _atomic_write(path: pathlib.Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
