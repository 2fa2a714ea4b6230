"""scripts/flashmla_pair.py on the CPU: without an importable FlashMLA it says so and exits 2 before
touching torch.cuda (nothing of FlashMLA ships with the project)."""
from __future__ import annotations

import importlib.util
import pathlib
import sys

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "flashmla_pair.py"


def _load():
    spec = importlib.util.spec_from_file_location("flashmla_pair", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_without_flashmla_exits_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "flash_mla", None)  # import flash_mla raises ImportError
    assert _load().main(["--config", "64,1,1,16,1024"]) == 2
    assert "flash_mla is not importable" in capsys.readouterr().err


def test_build_without_source_exits_2(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("flashmla_build", SCRIPT.parent / "flashmla_build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--src", str(tmp_path / "missing.tar.xz"), "--build-dir", str(tmp_path / "b")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()  # nothing built or written
