"""CPU: ``pipeline="auto"`` (``pipelines.auto``): the table's derivation from a perf run, the lookup,
the committed table against its source run, and the API's per-shape choice."""
from __future__ import annotations

import pytest

from pipelines import auto



def row(pipeline, us, *, page=64, b=128, s_q=1, h_q=128, seqlen=4096, varlen=False, multicast=None, error=None):
    return {"pipeline": pipeline, "us": us, "dtype": "bf16", "page_size": page, "b": b, "s_q": s_q, "h_q": h_q,
            "seqlen": seqlen, "varlen": varlen, "multicast": multicast, "error": error}


def run_of(*rows):
    return {"rows": list(rows)}


def test_one_pipeline_gives_an_empty_table():
    assert auto.derive(run_of(row("2wg", 10.0), row("2wg", 20.0, seqlen=1024))) == []


def test_winner_is_the_geomean_over_the_keys_configs():
    # Key (64, 128, 128): 3wg wins on one length and loses on the other; geomean decides.
    r = run_of(row("2wg", 100.0), row("3wg", 80.0),
               row("2wg", 10.0, seqlen=1024), row("3wg", 11.0, seqlen=1024),
               # key (64, 16, 8): 2wg faster
               row("2wg", 5.0, b=8, h_q=16), row("3wg", 6.0, b=8, h_q=16))
    entries = auto.derive(r)
    assert [e["key"] for e in entries] == [[64, 16, 8], [64, 128, 128]]
    assert entries[0]["pipeline"] == "2wg" and entries[1]["pipeline"] == "3wg"
    assert entries[1]["configs"] == 2
    assert entries[1]["geomean_us"] == {"2wg": pytest.approx((100 * 10) ** 0.5, abs=1e-3),
                                        "3wg": pytest.approx((80 * 11) ** 0.5, abs=1e-3)}


def test_near_ties_stay_with_the_default():
    entries = auto.derive(run_of(row("2wg", 100.0), row("3wg", 99.5)))
    assert entries[0]["pipeline"] == auto.DEFAULT
    entries = auto.derive(run_of(row("2wg", 100.0), row("3wg", 98.0)))
    assert entries[0]["pipeline"] == "3wg"


def test_off_default_path_and_failed_rows_are_ignored():
    # mc-off rows are the A/B of a switch; failed rows have no time. Neither decides anything.
    r = run_of(row("2wg", 100.0, multicast=True), row("3wg", 200.0, multicast=True),
               row("2wg", 300.0, multicast=False), row("3wg", 50.0, multicast=False),
               row("2wg", 10.0, seqlen=1024), row("3wg", None, seqlen=1024, error="boom"))
    (entry,) = auto.derive(r)
    assert entry["pipeline"] == "2wg" and entry["configs"] == 1


def test_rows_key_is_rows_per_kv_head():
    # h_q 64 at s_q 2 has the rows of h_q 128 at s_q 1: one key.
    r = run_of(row("2wg", 100.0, s_q=2, h_q=64), row("3wg", 50.0, s_q=2, h_q=64))
    assert auto.derive(r)[0]["key"] == [64, 128, 128]


ENTRIES = [
    {"key": [64, 128, 128], "pipeline": "3wg", "geomean_us": {}, "configs": 1},
    {"key": [64, 16, 128], "pipeline": "2wg", "geomean_us": {}, "configs": 1},
    {"key": [1, 128, 1], "pipeline": "3wg", "geomean_us": {}, "configs": 1},
]


@pytest.mark.parametrize("page, rows, batch, want", [
    (64, 128, 128, "3wg"),  # measured
    (64, 96, 100, "3wg"),  # nearest rows: 128
    (64, 24, 128, "2wg"),  # nearest rows: 16
    (128, 128, 64, "3wg"),  # another TMA page: nearest TMA key
    (16, 16, 1, "2wg"),
    (1, 16, 128, "3wg"),  # a gather page: only gather keys count
    (4, 128, 1, "3wg"),
])
def test_choose_takes_the_nearest_key_of_the_same_loader(page, rows, batch, want):
    assert auto.choose(page, rows, batch, ["2wg", "3wg"], ENTRIES) == want


def test_choose_falls_back_to_the_default():
    assert auto.choose(64, 128, 128, ["2wg", "3wg"], []) == auto.DEFAULT  # no table
    assert auto.choose(64, 128, 128, ["2wg"], ENTRIES) == auto.DEFAULT  # winner not available
    only_tma = [e for e in ENTRIES if e["key"][0] != 1]
    assert auto.choose(1, 128, 1, ["2wg", "3wg"], only_tma) == auto.DEFAULT  # no key of that loader


def test_report_flags_rows_more_than_2_percent_slower():
    r = run_of(row("2wg", 100.0), row("3wg", 80.0), row("2wg", 10.0, seqlen=1024), row("3wg", 11.0, seqlen=1024))
    entries = auto.derive(r)  # 3wg for the key, but 10% slower at 1024
    (slow,) = auto.slower_rows(r, entries)
    assert slow[1:] == ("3wg", 11.0, "2wg", 10.0)


def test_committed_table_is_derived_from_its_source_run(capsys):
    assert auto.main(["--check"]) == 0, capsys.readouterr().out
    from pipelines import auto_table

    assert auto_table.SOURCE.startswith("perf_table/results/")


def test_render_round_trips():
    namespace = {}
    exec(auto.render("perf_table/results/x.json", ENTRIES), namespace)
    assert namespace["ENTRIES"] == ENTRIES and namespace["SOURCE"] == "perf_table/results/x.json"
