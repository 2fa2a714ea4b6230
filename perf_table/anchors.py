"""Measured numbers of other systems (FlashMLA, FlashInfer) from the CSVs in perf_table/anchors/.

Each CSV row is one config timed by another system: columns
``system,device,date,dtype,page_size,b,s_q,h_q,seqlen,varlen,us,gbps,tflops``. A row of ours
matches an anchor on (device, dtype, page_size, b, s_q, h_q, seqlen, varlen); page size is part
of the key because the anchors were measured at page 64 (FlashInfer also at 16 and 1), and a
different page size is a different load path.
"""
from __future__ import annotations

import csv
import dataclasses
import pathlib

ANCHORS_DIR = pathlib.Path(__file__).resolve().parent / "anchors"

_COLUMNS = ("system", "device", "date", "dtype", "page_size", "b", "s_q", "h_q", "seqlen", "varlen",
            "us", "gbps", "tflops")


@dataclasses.dataclass(frozen=True)
class Anchor:
    system: str  # full name with version, e.g. "FlashMLA 9241ae3 dense sm90"
    date: str
    us: float
    source: str  # CSV file name

    @property
    def family(self) -> str:
        """The system's name without version: the column it is shown in."""
        return self.system.split()[0]


def anchor_key(device: str, dtype: str, page_size: int, b: int, s_q: int, h_q: int, seqlen: int,
               varlen: bool) -> tuple:
    """The key a measurement and an anchor share when they time the same problem."""
    return (device, dtype, int(page_size), int(b), int(s_q), int(h_q), int(seqlen), bool(varlen))


PRIMARY = "FlashMLA"  # the reference the project measures itself against


def family_order(families) -> list[str]:
    """Anchor families in display order: FlashMLA first, the others by name."""
    return sorted(families, key=lambda family: (family != PRIMARY, family))


def load_anchors(directory: pathlib.Path = ANCHORS_DIR) -> dict[str, dict[tuple, Anchor]]:
    """All anchors, as {family: {key: Anchor}}. Files are read in sorted order.

    Two rows of one family for the same key would make the table depend on which one wins, so
    that is an error rather than a silent choice.
    """
    table: dict[str, dict[tuple, Anchor]] = {}
    for path in sorted(pathlib.Path(directory).glob("*.csv")):
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if tuple(reader.fieldnames or ()) != _COLUMNS:
                raise ValueError(f"{path}: expected columns {','.join(_COLUMNS)}, got {reader.fieldnames}")
            for line, row in enumerate(reader, start=2):
                key = anchor_key(row["device"], row["dtype"], row["page_size"], row["b"], row["s_q"],
                                 row["h_q"], row["seqlen"], row["varlen"] == "1")
                anchor = Anchor(row["system"], row["date"], float(row["us"]), path.name)
                family = table.setdefault(anchor.family, {})
                if key in family:
                    raise ValueError(f"{path}:{line}: duplicate {anchor.family} anchor for {key} "
                                     f"(also in {family[key].source})")
                family[key] = anchor
    return table
