"""CPU: ``python -m mla.precompile`` (which configurations, and a real compile into a fresh cache
that a second run, a new process, finds on disk)."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from mla import precompile

ROOT = pathlib.Path(__file__).resolve().parent.parent


def configs(argv):
    found, skipped = precompile.plan_configs(precompile.parse_args(argv))
    return [c.key()[1:] for c in found], skipped


def test_every_combination_once_causal_only_where_it_exists(monkeypatch):
    monkeypatch.delenv("MLA_MULTICAST", raising=False)
    # Split clusters (the last field): off by default; MLA_SPLIT_CLUSTER=c adds size c beside 1.
    monkeypatch.setenv("MLA_SPLIT_CLUSTER", "8")
    assert [c[-1] for c in configs(["--heads-q", "16", "--page-size", "64", "--pipeline", "2wg"])[0]] == [1, 8]
    monkeypatch.delenv("MLA_SPLIT_CLUSTER", raising=False)
    found, skipped = configs(["--dtype", "bf16", "fp16", "bfloat16", "--heads-q", "128", "16", "--seqlen-q", "1", "2",
                              "--page-size", "64", "--pipeline", "2wg"])
    assert skipped == []
    # (..., h_kv, cluster): 128 rows and more at a TMA page size run as 2-CTA multicast clusters.
    assert found == [
        ("2wg", "bfloat16", 128, 1, 64, False, 1, 2, "bfloat16", 1), ("2wg", "bfloat16", 128, 2, 64, False, 1, 2, "bfloat16", 1),
        ("2wg", "bfloat16", 128, 2, 64, True, 1, 2, "bfloat16", 1), ("2wg", "bfloat16", 16, 1, 64, False, 1, 1, "bfloat16", 1),
        ("2wg", "bfloat16", 16, 2, 64, False, 1, 1, "bfloat16", 1), ("2wg", "bfloat16", 16, 2, 64, True, 1, 1, "bfloat16", 1),
        ("2wg", "float16", 128, 1, 64, False, 1, 2, "float16", 1), ("2wg", "float16", 128, 2, 64, False, 1, 2, "float16", 1),
        ("2wg", "float16", 128, 2, 64, True, 1, 2, "float16", 1), ("2wg", "float16", 16, 1, 64, False, 1, 1, "float16", 1),
        ("2wg", "float16", 16, 2, 64, False, 1, 1, "float16", 1), ("2wg", "float16", 16, 2, 64, True, 1, 1, "float16", 1),
    ]
    assert configs(["--seqlen-q", "2", "--causal", "yes", "--page-size", "64", "--pipeline", "2wg"])[0] == [
        ("2wg", "bfloat16", 128, 2, 64, True, 1, 2, "bfloat16", 1)]
    # Multicast: the environment's switch by default; both where a cluster exists, one entry elsewhere.
    monkeypatch.setenv("MLA_MULTICAST", "0")
    assert configs(["--page-size", "64", "--pipeline", "2wg"])[0] == [("2wg", "bfloat16", 128, 1, 64, False, 1, 1, "bfloat16", 1)]
    assert configs(["--page-size", "64", "1", "--multicast", "both", "--pipeline", "2wg"])[0] == [
        ("2wg", "bfloat16", 128, 1, 64, False, 1, 2, "bfloat16", 1), ("2wg", "bfloat16", 128, 1, 64, False, 1, 1, "bfloat16", 1),
        ("2wg", "bfloat16", 128, 1, 1, False, 1, 1, "bfloat16", 1)]
    # Partial dtypes: MLA_PARTIAL_DTYPE by default (the input dtype), or both.
    assert configs(["--page-size", "64", "--heads-q", "16", "--partial", "both", "--pipeline", "2wg"])[0] == [
        ("2wg", "bfloat16", 16, 1, 64, False, 1, 1, "float32", 1), ("2wg", "bfloat16", 16, 1, 64, False, 1, 1, "bfloat16", 1)]
    # Default page sizes: every one the pipeline supports.
    import pipelines
    assert {c[4] for c in configs([])[0]} == set(pipelines.supported_page_sizes("2wg"))
    # Every pipeline with a kernel by default.
    assert {c[0] for c in configs(["--page-size", "64"])[0]} == set(pipelines.available_variants())


def test_auto_compiles_what_auto_may_choose(monkeypatch):
    from pipelines import auto, auto_table

    monkeypatch.setenv("MLA_SPLIT_CLUSTER", "1")
    monkeypatch.setenv("MLA_MULTICAST", "1")
    monkeypatch.delenv("MLA_PIPELINE", raising=False)
    # page 64: 3wg at batch 1, 2wg at batch 128; page 16: 2wg everywhere
    monkeypatch.setattr(auto_table, "ENTRIES", [
        {"key": [16, 1, 16, 1, 8, 4096], "pipeline": "2wg", "geomean_us": {}, "configs": 1},
        {"key": [64, 1, 16, 1, 1, 4096], "pipeline": "3wg", "geomean_us": {}, "configs": 1},
        {"key": [64, 1, 16, 1, 128, 4096], "pipeline": "2wg", "geomean_us": {}, "configs": 1},
        {"key": [64, 1, 128, 1, 128, 4096], "pipeline": "2wg", "geomean_us": {}, "configs": 1}])
    auto.clear_caches()
    try:
        found, skipped = configs(["--pipeline", "auto", "--heads-q", "16", "128", "--page-size", "64", "16", "3"])
        assert found == [("2wg", "bfloat16", 16, 1, 64, False, 1, 1, "bfloat16", 1),
                         ("3wg", "bfloat16", 16, 1, 64, False, 1, 1, "bfloat16", 1),
                         ("2wg", "bfloat16", 16, 1, 16, False, 1, 1, "bfloat16", 1),
                         ("2wg", "bfloat16", 128, 1, 64, False, 1, 2, "bfloat16", 1),
                         # batch 1 is nearer the batch-1 key than h_q 128 is to h_q 16 (batch comes first)
                         ("3wg", "bfloat16", 128, 1, 64, False, 1, 2, "bfloat16", 1),
                         ("2wg", "bfloat16", 128, 1, 16, False, 1, 2, "bfloat16", 1)]
        assert skipped == ["2wg bfloat16 h_q=16 h_kv=1 s_q=1 page=3: page size not supported by 2wg "
                           "(1, 2, 4, 8, 16, 32, 64, 128)", "2wg bfloat16 h_q=128 h_kv=1 s_q=1 page=3: page size "
                           "not supported by 2wg (1, 2, 4, 8, 16, 32, 64, 128)"]
        # auto beside a named pipeline: the union, once each
        both = configs(["--pipeline", "auto", "3wg", "--heads-q", "16", "--page-size", "64"])[0]
        assert [c[0] for c in both] == ["2wg", "3wg"]
        # MLA_PIPELINE set: auto is that variant
        monkeypatch.setenv("MLA_PIPELINE", "3wg")
        assert [c[0] for c in configs(["--pipeline", "auto", "--heads-q", "16", "128", "--page-size", "64"])[0]] == [
            "3wg", "3wg"]
        monkeypatch.setenv("MLA_PIPELINE", "2wg")
        assert [c[0] for c in configs(["--pipeline", "auto", "--heads-q", "16", "--page-size", "64"])[0]] == ["2wg"]
    finally:
        auto.clear_caches()


def test_invalid_combinations_are_reported_not_compiled(monkeypatch):
    monkeypatch.setenv("MLA_SPLIT_CLUSTER", "1")
    found, skipped = configs(["--heads-q", "256", "6", "--heads-k", "1", "4", "--seqlen-q", "1", "5",
                              "--page-size", "64", "--pipeline", "2wg"])
    assert found == [("2wg", "bfloat16", 256, 1, 64, False, 4, 1, "bfloat16", 1), ("2wg", "bfloat16", 6, 1, 64, False, 1, 1, "bfloat16", 1)]
    assert "2wg bfloat16 h_q=256 h_kv=1 s_q=1 page=64: h_q / h_kv > 128" in skipped
    assert "2wg bfloat16 h_q=6 h_kv=4 s_q=1 page=64: h_q is not a multiple of h_kv" in skipped
    assert "2wg bfloat16 h_q=6 h_kv=1 s_q=5 page=64: s_q > 4" in skipped
    assert configs(["--page-size", "3", "--pipeline", "2wg"])[0] == [] and configs(["--page-size", "3", "--pipeline", "2wg"])[1][0].endswith(
        "page=3: page size not supported by 2wg (1, 2, 4, 8, 16, 32, 64, 128)")
    import pipelines
    monkeypatch.setattr(pipelines, "_WITH_KERNEL", ("2wg",))  # a variant without a kernel is refused
    with pytest.raises(ValueError, match="has no kernel yet"):
        configs(["--pipeline", "3wg"])
    with pytest.raises(ValueError, match=r"--pipeline must be among \('auto', '2wg', '3wg', 'seesaw'\)"):
        configs(["--pipeline", "4wg"])
    with pytest.raises(SystemExit):
        precompile.parse_args(["--heads-q", "0"])


def _run(args, cache_dir, **env):
    env.setdefault("MLA_SPLIT_CLUSTER", "1")  # the expectations below count the entries without split clusters
    env = dict(os.environ, MLA_CACHE_DIR=str(cache_dir), PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), **env)
    return subprocess.run([sys.executable, "-m", "mla.precompile", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=900)


def test_precompile_stores_and_a_new_process_finds_it(tmp_path):
    args = ["--heads-q", "16", "--page-size", "64", "--jobs", "1", "--pipeline", "2wg"]
    first = _run(args, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "2 entries into" in first.stdout and "] 1/2 split planner kernel" in first.stdout
    assert "] 2/2 2wg bfloat16 h_q=16 s_q=1 h_kv=1 page=64" in first.stdout
    assert " compiled " in first.stdout and "2 compiled, 0 already cached, 0 failed" in first.stdout
    (namespace,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    (obj,) = namespace.glob("decode-*.o")
    assert obj.stat().st_size > 10_000 and obj.with_suffix(".json").exists()
    assert len(list(namespace.glob("planner-*.o"))) == 1
    second = _run(args, tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "already cached" in second.stdout and "0 compiled, 2 already cached" in second.stdout
    listing = _run(["--list"], tmp_path)
    assert "2 entries" in listing.stdout and "('decode', '2wg', 'bfloat16', 16, 1, 64, False, 1, 1, 'bfloat16', 1)" in listing.stdout
    assert "('planner',)" in listing.stdout
    # A damaged entry is replaced, not loaded.
    obj.write_bytes(obj.read_bytes()[: obj.stat().st_size // 2])
    third = _run(args + ["--no-planner"], tmp_path)
    assert third.returncode == 0 and "replaced an entry" in third.stdout and "1 compiled" in third.stdout
    # Stale namespaces (other sources or toolchains) are pruned, the current one kept.
    stale = tmp_path / "0123456789abcdef01234567"
    stale.mkdir()
    (stale / "namespace.json").write_text("{}")
    (tmp_path / "not-ours").mkdir()  # a directory the cache did not make is left alone
    pruned = _run(["--prune"], tmp_path)
    assert "removed 1 stale" in pruned.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([namespace.name, "not-ours"])


def test_precompile_refuses_when_the_disk_cache_is_off(tmp_path):
    off = _run(["--heads-q", "16", "--page-size", "64"], tmp_path, MLA_DISK_CACHE="0")
    assert off.returncode == 2 and "disk cache is off" in off.stderr
    bad = _run(["--heads-q", "16", "--page-size", "64"], tmp_path, MLA_DISK_CACHE="maybe")
    assert bad.returncode == 2 and "MLA_DISK_CACHE must be one of" in bad.stderr
