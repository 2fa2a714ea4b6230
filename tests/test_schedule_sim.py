"""CPU: the tile-schedule probe (scripts/schedule_sim.py) still compiles, and keeps what its readings rest on."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from mla import compile_check

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.skipif(compile_check.find_nvdisasm() is None, reason="nvdisasm not installed (test extra)")
def test_schedules_compile_without_spills(tmp_path):
    # The 2wg order and the score/P.V-warpgroup order with Q in smem: no spills, wgmma grouped (not one wait per
    # HGMMA), and the latter's setmaxnreg kept by ptxas; the deferred-P.V and K-split orders (twenty-seventh session)
    # without spills and grouped too (the K split's P.V is waited behind its issue, else ptxas serializes).
    # (The RS form with Q in registers spills: the docstring.)
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "schedule_sim.py"), "--sass", str(tmp_path),
                          "--schedule", "2wg", "--schedule", "3role-ss", "--schedule", "2wg-defer",
                          "--schedule", "2wg-ksplit"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = {line.split()[0]: line for line in run.stdout.splitlines() if "LDL/STL:" in line}
    assert lines["2wg"].split("LDL/STL:")[1].split()[:2] == ["0", "0"]
    assert lines["3role-ss"].split("LDL/STL:")[1].split()[:2] == ["0", "0"]
    assert int(lines["3role-ss"].split("USETMAXREG:")[1]) == 2
    for name in ("2wg-defer", "2wg-ksplit"):
        assert lines[name].split("LDL/STL:")[1].split()[:2] == ["0", "0"]
    for name in ("2wg", "3role-ss", "2wg-defer", "2wg-ksplit"):
        waits = int(lines[name].split("WARPGROUP.DEPBAR:")[1].split()[0])
        hgmma = int(lines[name].split("HGMMA:")[1].split()[0])
        assert waits < hgmma // 4
