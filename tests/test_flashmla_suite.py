"""scripts/flashmla_dense_suite.py on the CPU, against a stand-in for FlashMLA's test file: it must
take the file's own case list, skip only the performance cases, count failures (never hide them),
and give the same totals when sharded over processes."""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "flashmla_dense_suite.py"

FAKE_SUITE = '''
import dataclasses
import flash_mla

@dataclasses.dataclass
class TestParam:
    b: int
    s_q: int
    h_q: int
    h_kv: int
    is_causal: bool
    test_performance: bool = False

def test_flash_mla(t):
    print("running", t)
    assert flash_mla.__name__ == "mla"  # the alias is in place
    assert not (t.h_kv == 3 and t.b == 6), "out mismatch"  # the file's own assertion fails here

def main(torch_dtype):
    cases = [TestParam(b, s_q, h_q, h_kv, c) for b in (1, 6) for s_q in (1, 2) for h_q in (6, 12)
             for h_kv in (1, 2, 3) for c in (False, True) if h_q % h_kv == 0]
    cases.append(TestParam(128, 1, 128, 1, False, test_performance=True))
    for t in cases:
        test_flash_mla(t)
'''


@pytest.fixture
def suite_dir(tmp_path, monkeypatch):
    (tmp_path / "test_flash_mla_dense_decoding.py").write_text(FAKE_SUITE)
    monkeypatch.delitem(sys.modules, "test_flash_mla_dense_decoding", raising=False)
    monkeypatch.delitem(sys.modules, "flash_mla", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    return tmp_path


def _script():
    spec = importlib.util.spec_from_file_location("flashmla_dense_suite", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_runs_the_files_cases_and_counts_failures(suite_dir, tmp_path, capsys):
    out = tmp_path / "summary.json"
    rc = _script().main(["--tests", str(suite_dir), "--dtype", "bf16", "--out", str(out)])
    summary = json.loads(out.read_text())
    # 2 b x 2 s_q x (h_q 6: h_kv 1,2,3; h_q 12: 1,2,3) x 2 causal = 48 cases, one performance case.
    assert summary["passed"] + summary["failed"] == 48
    assert summary["failed"] == 8  # b=6, h_kv=3: 2 s_q x 2 h_q x 2 causal
    assert summary["not_run_performance"] == 1
    assert rc == 1
    assert "40 passed, 8 failed" in capsys.readouterr().out


def test_filters(suite_dir):
    mod = _script()
    assert mod.main(["--tests", str(suite_dir), "--dtype", "bf16", "--h-kv", "1", "2"]) == 0


def test_shards_split_the_configs_and_add_up(suite_dir, tmp_path, monkeypatch):
    # Each shard runs in its own process: make the project and the fake suite importable there.
    root = str(SCRIPT.parent.parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [root, str(suite_dir), os.environ.get("PYTHONPATH")])))
    out = tmp_path / "jobs.json"
    rc = _script().main(["--tests", str(suite_dir), "--dtype", "bf16", "--jobs", "3", "--out", str(out)])
    summary = json.loads(out.read_text())
    assert (summary["passed"], summary["failed"], summary["jobs"]) == (40, 8, 3)
    assert rc == 1
