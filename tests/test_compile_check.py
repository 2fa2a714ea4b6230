"""CPU: every kernel variant compiles for sm_90a and its SASS shows what it promises."""
from __future__ import annotations

import pytest

from mla import compile_check


def test_count_sass_and_promises():
    sass = "HGMMA.64x64x16.F32.BF16 R0\n UTMALDG.3D [UR4]\n UTMALDG.3D.MULTICAST [UR8]\n LDL.64 R2\n"
    counts = compile_check.count_sass(sass)
    # UTMALDG counts every TMA load, multicast ones included
    assert counts["HGMMA"] == 1 and counts["UTMALDG"] == 2 and counts["UTMALDG_MULTICAST"] == 1
    assert counts["LDL"] == 1 and counts["STL"] == 0 and counts["USETMAXREG"] == 0
    assert compile_check.check_promises(counts, ("HGMMA",), ("STL",)) == []
    assert compile_check.check_promises(counts, ("USETMAXREG",), ("LDL",)) == ["no USETMAXREG", "1 LDL"]


@pytest.mark.skipif(compile_check.find_nvdisasm() is None, reason="nvdisasm not installed (test extra)")
def test_2wg_compiles_with_its_promises(capsys):
    rc = compile_check.main(["--variant", "2wg"])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = [line for line in out.splitlines() if line.startswith("2wg")]
    assert len(rows) == 2 and all(line.endswith("ok") for line in rows), out
    assert "merge" in out
    planner_rows = [line for line in out.splitlines() if line.startswith("planner")]
    assert len(planner_rows) == 1 and planner_rows[0].endswith("ok"), out
