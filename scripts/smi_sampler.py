"""``nvidia-smi`` sampling beside a timed run (``scripts/clock_probe.py``, ``scripts/flashmla_pair.py --sustain``)."""
from __future__ import annotations

import contextlib
import subprocess


@contextlib.contextmanager
def smi_samples(fields: str, period_ms: int, units: bool = True):
    """Samples ``fields`` (``nvidia-smi --query-gpu`` names, comma-separated) every ``period_ms`` while the block
    runs. The yielded list holds the samples' CSV lines (no header; values without units unless ``units``) once
    the block is done."""
    fmt = "csv,noheader" if units else "csv,noheader,nounits"
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={fields}", f"--format={fmt}", "-lms", str(period_ms)],
                           stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        yield lines
    finally:
        smi.terminate()
        lines.extend(smi.communicate()[0].strip().splitlines())
