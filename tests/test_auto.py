"""CPU: ``pipeline="auto"`` (``pipelines.auto``): the table's derivation from a perf run, the key, the
lookup, the committed table against its source run, and the verify report of a run with auto rows.
(The API's resolution through the table: tests/test_api.py, ``TestAutoResolution``.)"""
from __future__ import annotations

import json

import pytest

from pipelines import auto


def row(pipeline, us, *, page=64, b=128, s_q=1, h_q=128, seqlen=4096, varlen=False, multicast=None, error=None,
        resolved=None, paired=None, us_min=None):
    r = {"pipeline": pipeline, "us": us, "us_min": us_min, "dtype": "bf16", "page_size": page, "b": b, "s_q": s_q,
         "h_q": h_q, "seqlen": seqlen, "varlen": varlen, "multicast": multicast, "error": error}
    if resolved is not None:
        r["resolved"] = resolved
    if paired is not None:
        r["paired"] = paired
    return r


def run_of(*rows):
    return {"rows": list(rows)}


def test_one_pipeline_gives_an_empty_table():
    assert auto.derive(run_of(row("2wg", 10.0), row("2wg", 20.0, seqlen=1024))) == []


def test_winner_is_the_geomean_over_the_keys_configs():
    # seqlen 4090 and 4096 at page 64: one block-table capacity (4096), one key. 3wg wins on one
    # and loses on the other; the geomean decides.
    r = run_of(row("2wg", 100.0), row("3wg", 80.0),
               row("2wg", 10.0, seqlen=4090), row("3wg", 11.0, seqlen=4090),
               # key (64, 1, 16, 1, 8, 4096): 2wg faster
               row("2wg", 5.0, b=8, h_q=16), row("3wg", 6.0, b=8, h_q=16))
    entries = auto.derive(r)
    assert [e["key"] for e in entries] == [[64, 1, 16, 1, 8, 4096], [64, 1, 128, 1, 128, 4096]]
    assert entries[0]["pipeline"] == "2wg" and entries[1]["pipeline"] == "3wg"
    assert entries[1]["configs"] == 2
    assert entries[1]["geomean_us"] == {"2wg": pytest.approx((100 * 10) ** 0.5, abs=1e-3),
                                        "3wg": pytest.approx((80 * 11) ** 0.5, abs=1e-3)}


def test_near_ties_stay_with_the_default():
    entries = auto.derive(run_of(row("2wg", 100.0), row("3wg", 99.5)))
    assert entries[0]["pipeline"] == auto.DEFAULT
    entries = auto.derive(run_of(row("2wg", 100.0), row("3wg", 98.0)))
    assert entries[0]["pipeline"] == "3wg"


def test_off_default_path_failed_and_auto_rows_are_ignored():
    # mc-off rows are the A/B of a switch; failed rows have no time; auto rows measure the choice.
    # None of them decides anything.
    r = run_of(row("2wg", 100.0, multicast=True), row("3wg", 200.0, multicast=True),
               row("2wg", 300.0, multicast=False), row("3wg", 50.0, multicast=False),
               row("auto", 1.0, multicast=True, resolved="3wg"),
               row("2wg", 10.0, seqlen=1024), row("3wg", None, seqlen=1024, error="boom"))
    (entry,) = auto.derive(r)
    assert entry["pipeline"] == "2wg" and entry["configs"] == 1 and set(entry["geomean_us"]) == {"2wg", "3wg"}
    assert auto.slower_rows(r, [entry]) == []


def test_configs_with_a_disturbed_row_are_left_out_of_that_run():
    # 2wg's replays of the first config were bimodal (median 2.2x its fastest): the whole config leaves
    # the run, so the other run alone decides that key; within 1.4x a row counts.
    glitch = run_of(row("2wg", 18.9, us_min=8.6), row("seesaw", 14.3, us_min=13.9),
                    row("2wg", 100.0, us_min=72.0, seqlen=1024), row("seesaw", 110.0, us_min=100.0, seqlen=1024))
    steady = run_of(row("2wg", 9.1, us_min=8.7), row("seesaw", 11.8, us_min=10.6))
    assert auto.DISTURBED == 1.4
    assert list(auto.default_path_times(glitch)) == [auto._config(row("2wg", 1.0, seqlen=1024))]
    entries = {tuple(e["key"]): e for e in auto.derive([glitch, steady])}
    assert entries[(64, 1, 128, 1, 128, 4096)]["pipeline"] == "2wg"
    assert entries[(64, 1, 128, 1, 128, 4096)]["runs"] == 1
    assert entries[(64, 1, 128, 1, 128, 1024)]["pipeline"] == "2wg"  # 100 / 72 = 1.39: kept
    # without the rule a glitch of that kind picks the slower pipeline (geomeans 13.5 against 13.0)
    assert auto.derive([run_of(row("2wg", 20.0), row("seesaw", 14.3)), steady])[0]["pipeline"] == "seesaw"


def test_a_pipeline_without_a_cluster_meets_one_with_its_cluster_on():
    # 2wg runs 128 rows with its multicast cluster (rows say multicast True), the seesaw without one
    # (multicast None): one config, compared; the mc-off A/B row still decides nothing.
    r = run_of(row("2wg", 100.0, multicast=True), row("2wg", 90.0, multicast=False), row("seesaw", 95.0),
               row("auto", 100.0, multicast=True, resolved="2wg", paired={"2wg": 1.0, "seesaw": 1.05}))
    (entry,) = auto.derive(r)
    assert entry["pipeline"] == "seesaw" and set(entry["geomean_us"]) == {"2wg", "seesaw"}
    assert auto.slower_rows(r, [entry]) == [] and len(auto.slower_rows(r, [{**entry, "pipeline": "2wg"}])) == 1
    (line,) = auto.verify(r)
    assert line["fastest"] == "seesaw" and line["slower"] and line["paired"] == 1.05


def test_key_is_page_s_q_h_q_h_kv_batch_and_block_table_capacity():
    # s_q and h_q are separate coordinates: h_q 64 at s_q 2 is not h_q 128 at s_q 1.
    r = run_of(row("2wg", 100.0, s_q=2, h_q=64), row("3wg", 50.0, s_q=2, h_q=64),
               row("2wg", 100.0), row("3wg", 150.0))
    assert [e["key"] for e in auto.derive(r)] == [[64, 1, 128, 1, 128, 4096], [64, 2, 64, 1, 128, 4096]]
    assert auto.shape_key(64, 2, 64, 1, 128, 4096) == (64, 2, 64, 1, 128, 4096)
    assert auto.kv_capacity(17, 64) == 1088


def test_row_capacity_is_the_runners_block_table():
    from perf_table import grid

    # The row's own field (runs that record it), else the runner's block table: the longest request's
    # pages (uniform: seqlen rounded up to the page; varlen: the longest drawn length).
    assert auto.row_kv_capacity(dict(row("2wg", 1.0), kv_capacity=5000)) == 5000
    assert auto.row_kv_capacity(row("2wg", 1.0, page=64, seqlen=100)) == 128
    assert auto.row_kv_capacity(row("2wg", 1.0, page=1, seqlen=100)) == 100
    varlen = row("2wg", 1.0, page=16, seqlen=4096, varlen=True)
    assert auto.row_kv_capacity(varlen) == -(-max(grid.varlen_lengths(128, 4096)) // 16) * 16
    assert auto.row_kv_capacity(varlen) == grid.Config(16, 128, 1, 128, 4096, varlen=True).kv_capacity()


def entry(page, b, winner, *, s_q=1, h_q=128, h_kv=1, cap=4096):
    return {"key": [page, s_q, h_q, h_kv, b, cap], "pipeline": winner, "geomean_us": {}, "configs": 1}


ENTRIES = sorted([
    entry(64, 128, "3wg"),
    entry(64, 128, "2wg", h_q=16),
    entry(64, 128, "2wg", cap=1024),
    entry(64, 1, "2wg", s_q=2, h_q=16),
    entry(64, 1, "3wg", s_q=1, h_q=32),
    entry(16, 1, "3wg", h_q=16),
    entry(1, 1, "3wg"),
], key=lambda e: e["key"])


@pytest.mark.parametrize("page, s_q, h_q, h_kv, b, cap, want", [
    (64, 1, 128, 1, 128, 4096, "3wg"),  # measured
    (64, 1, 128, 1, 128, 1024, "2wg"),  # measured: same shape, shorter block table
    (64, 1, 128, 1, 128, 8192, "3wg"),  # nearest capacity: 4096
    (64, 1, 128, 1, 128, 600, "2wg"),  # nearest capacity: 1024
    (64, 1, 128, 1, 128, None, "2wg"),  # capacity unknown: left out; the first of the equally near keys
    (64, 1, 96, 1, 100, 4096, "3wg"),  # nearest heads: 128
    (64, 1, 24, 1, 128, 4096, "2wg"),  # nearest heads: 16
    (64, 2, 32, 1, 1, 4096, "2wg"),  # batch 1: s_q before heads (s_q 2 h_q 16, not s_q 1 h_q 32)
    (64, 1, 16, 1, 1, 4096, "3wg"),  # batch 1, s_q 1: the h_q 32 key
    (128, 1, 128, 1, 64, 4096, "3wg"),  # another TMA page: nearest TMA key
    (16, 1, 16, 1, 128, 1024, "3wg"),  # page 16's only key wins at page 16, whatever the rest
    (32, 1, 16, 1, 1, 4096, "3wg"),  # page 32: 16 and 64 equally near; 16 sorts first
    (1, 1, 16, 1, 128, 64, "3wg"),  # a gather page: only gather keys count
    (4, 1, 128, 1, 1, 4096, "3wg"),
    (64, 1, 256, 2, 64, 4096, "3wg"),  # h_kv 2: 128 heads per kv head, batch x h_kv 128: the b128 h_q 128 key
])
def test_choose_takes_the_nearest_key_of_the_same_loader(page, s_q, h_q, h_kv, b, cap, want):
    assert auto.choose(page, s_q, h_q, h_kv, b, cap, ["2wg", "3wg"], ENTRIES) == want


def test_choose_falls_back_to_the_default():
    assert auto.choose(64, 1, 128, 1, 128, 4096, ["2wg", "3wg"], []) == auto.DEFAULT  # no table
    assert auto.choose(64, 1, 128, 1, 128, 4096, ["2wg"], ENTRIES) == auto.DEFAULT  # winner not available
    only_tma = [e for e in ENTRIES if e["key"][0] != 1]
    assert auto.choose(1, 1, 128, 1, 1, 4096, ["2wg", "3wg"], only_tma) == auto.DEFAULT  # no key of that loader
    # the default does not serve the page size: the candidate that does
    assert auto.choose(64, 1, 128, 1, 128, 1024, ["3wg"], ENTRIES) == "3wg"
    assert auto.choose(64, 1, 128, 1, 128, 1024, [], ENTRIES) == auto.DEFAULT  # none: the caller's checks say why


def test_choices_cover_every_capacity_and_batch():
    both = ("2wg", "3wg")
    # b 128, h_q 128, page 64: 3wg at capacity 4096, 2wg at 1024
    assert auto.choices(64, 1, 128, 1, both, batch=128, entries=ENTRIES) == both
    assert auto.choices(64, 1, 128, 1, both, batch=128, kv_capacity=8192, entries=ENTRIES) == ("3wg",)
    assert auto.choices(64, 1, 16, 1, both, batch=128, entries=ENTRIES) == ("2wg",)
    # batch open too: page 64, s_q 1, h_q 16 is 3wg at batch 1 (the h_q 32 key), 2wg at batch 128
    assert auto.choices(64, 1, 16, 1, both, entries=ENTRIES) == both
    assert auto.choices(16, 2, 64, 1, both, entries=ENTRIES) == ("3wg",)
    assert auto.choices(16, 2, 64, 1, ("2wg",), entries=ENTRIES) == ("2wg",)
    assert auto.choices(1, 1, 16, 1, both, entries=[]) == ("2wg",)


def test_choices_agree_with_choose_on_a_dense_sweep():
    both = ("2wg", "3wg")
    for page in (1, 8, 16, 32, 64, 128):
        for s_q in (1, 2, 4):
            for h_q in (8, 16, 64, 128):
                for h_kv in (1, 2):
                    seen_any = set()
                    for b in (1, 2, 8, 30, 128, 1000):
                        seen = {auto.choose(page, s_q, h_q, h_kv, b, cap, both, ENTRIES)
                                for cap in (1, 64, 900, 1024, 3000, 4096, 10 ** 6)}
                        assert seen <= set(auto.choices(page, s_q, h_q, h_kv, both, batch=b, entries=ENTRIES))
                        seen_any |= seen
                    assert seen_any <= set(auto.choices(page, s_q, h_q, h_kv, both, entries=ENTRIES))


def test_committed_table_lookups():
    # Every measured key of the committed table looks up to its own entry; a variant that is not a
    # candidate is never chosen (the seesaw's keys fall back to 2wg without it); in the table's runs
    # (page 64: H100 66e0995, H200 bee8104 and H200 c2cd435, three times each, the seesaw's steady loop on) page 64
    # b128 s_q 2 h_q 128 is the seesaw's at every length (7-12% ahead), b128 s_q 1 h_q 128 2wg's at 1024 keys and
    # the seesaw's at 4096 (6%) and 16384 (11%); keys of at most 16 rows per
    # kv head are 2wg's (its narrow kernel). Lookups on it are cached.
    from pipelines import auto_table

    every = ("2wg", "3wg", "seesaw")
    entries = auto_table.ENTRIES
    assert {e["pipeline"] for e in entries} == set(every)
    for e in entries:
        page, s_q, h_q, h_kv, b, capacity = e["key"]
        assert auto.choose(page, s_q, h_q, h_kv, b, capacity, every) == e["pipeline"], e
        assert auto.choose(page, s_q, h_q, h_kv, b, capacity, ("2wg",)) == "2wg"
        without = auto.choose(page, s_q, h_q, h_kv, b, capacity, ("2wg", "3wg"))
        assert without == (e["pipeline"] if e["pipeline"] != "seesaw" else "2wg"), e
        if h_q // h_kv * s_q <= auto.NARROW_ROWS:
            assert e["pipeline"] == "2wg", e
    assert not any("measured_pipeline" in e for e in entries)  # no run predates the narrow kernel
    for seqlen in (1024, 4096, 16384):
        assert auto.choose(64, 2, 128, 1, 128, seqlen, every) == "seesaw"
    assert [auto.choose(64, 1, 128, 1, 128, n, every) for n in (1024, 4096, 16384)] == ["2wg", "seesaw", "seesaw"]
    assert auto.choices(64, 1, 128, 1, every, batch=128) == ("2wg", "seesaw")
    assert auto.choices(64, 2, 128, 1, every, batch=128) == ("seesaw",)
    three = next(e for e in entries if e["pipeline"] == "3wg")
    page, s_q, h_q, h_kv, b, _ = three["key"]
    assert "3wg" in auto.choices(page, s_q, h_q, h_kv, every)


def test_report_flags_rows_more_than_2_percent_slower():
    # seqlen 4090 and 4096: one key, 3wg's by the geomean, but 10% slower at 4090.
    r = run_of(row("2wg", 100.0), row("3wg", 80.0), row("2wg", 10.0, seqlen=4090), row("3wg", 11.0, seqlen=4090))
    entries = auto.derive(r)
    (slow,) = auto.slower_rows(r, entries)
    assert slow[1:] == ("3wg", 11.0, "2wg", 10.0)


def test_committed_table_is_derived_from_its_source_runs(capsys):
    assert auto.main(["--check"]) == 0, capsys.readouterr().out
    from pipelines import auto_table

    assert auto_table.SOURCES and all(s.startswith("perf_table/results/") for s in auto_table.SOURCES)


def test_committed_table_picks_the_faster_pipeline_over_its_sources():
    """Every entry is the pipeline with the lowest combined time of its key, or DEFAULT within TIE (step 5's
    entries: what their runs measured, ``measured_pipeline``)."""
    from pipelines import auto_table

    for e in auto_table.ENTRIES:
        if "measured_pipeline" in e:
            assert e["pipeline"] == "2wg" and e["key"][2] // e["key"][3] * e["key"][1] <= auto.NARROW_ROWS, e
            e = dict(e, pipeline=e["measured_pipeline"])
        geo = e["geomean_us"]
        best = min(geo.values())
        assert geo[e["pipeline"]] <= best / (1 - auto.TIE), e
        if e["pipeline"] != auto.DEFAULT:
            assert geo[e["pipeline"]] == best and best < geo[auto.DEFAULT] * (1 - auto.TIE), e


def test_several_runs_combine_by_their_ratios():
    """Two runs of different speed: the entry follows the geomean of the per-run ratios, and a key
    only one run measured comes from that run alone."""
    fast = run_of(row("2wg", 100.0), row("3wg", 97.0), row("2wg", 10.0, b=8), row("3wg", 9.0, b=8))
    slow = run_of(row("2wg", 200.0), row("3wg", 202.0))  # 3wg x1.01 here, x0.97 in the fast run
    by_b = {e["key"][4]: e for e in auto.derive([fast, slow])}
    assert by_b[128]["pipeline"] == "3wg" and by_b[128]["runs"] == 2 and by_b[128]["configs"] == 2
    assert by_b[128]["geomean_us"] == {"2wg": pytest.approx((100 * 200) ** 0.5, abs=1e-3),
                                       "3wg": pytest.approx((97 * 202) ** 0.5, abs=1e-3)}
    assert by_b[8]["pipeline"] == "3wg" and by_b[8]["runs"] == 1
    slower = run_of(row("2wg", 200.0), row("3wg", 210.0))  # 3wg x1.05: combined x1.009, within TIE
    assert [e["pipeline"] for e in auto.derive([fast, slower]) if e["key"][4] == 128] == ["2wg"]
    assert auto.derive(fast) == [dict(e, runs=1) for e in auto.derive([fast])]


def test_render_round_trips():
    namespace = {}
    exec(auto.render(["perf_table/results/x.json", "perf_table/results/y.json.gz"], ENTRIES), namespace)
    assert namespace["ENTRIES"] == ENTRIES
    assert namespace["SOURCES"] == ["perf_table/results/x.json", "perf_table/results/y.json.gz"]


# ------------------------------------------------------------------------------------ --verify

def verify_run():
    return run_of(
        # within 2%: auto ran the faster variant
        row("2wg", 100.0), row("3wg", 120.0), row("auto", 101.0, resolved="2wg"),
        # SLOWER, a wrong choice: the resolved variant's own row is 10% slower too
        row("2wg", 10.0, b=8), row("3wg", 9.0, b=8), row("auto", 10.0, b=8, resolved="2wg"),
        # SLOWER by noise: the resolved variant's own row is the fastest
        row("2wg", 50.0, b=1), row("3wg", 60.0, b=1), row("auto", 52.0, b=1, resolved="2wg"),
        # multicast pairs: only the default path (multicast True) counts
        row("2wg", 30.0, b=32, multicast=True), row("3wg", 31.0, b=32, multicast=True),
        row("2wg", 20.0, b=32, multicast=False), row("3wg", 21.0, b=32, multicast=False),
        row("auto", 30.5, b=32, multicast=True, resolved="2wg"),
        # not verifiable: no auto row; auto with one variant; auto failed
        row("2wg", 5.0, b=64), row("3wg", 5.0, b=64),
        row("2wg", 5.0, b=2), row("auto", 50.0, b=2, resolved="2wg"),
        row("2wg", 5.0, b=4), row("3wg", 5.0, b=4), row("auto", None, b=4, error="boom"))


def test_verify_compares_auto_with_the_faster_variant():
    lines = auto.verify(verify_run())
    by_b = {line["config"][2]: line for line in lines}
    assert sorted(by_b) == [1, 8, 32, 128]
    ok, wrong, noise, mc = by_b[128], by_b[8], by_b[1], by_b[32]
    assert (ok["ratio"], ok["slower"], ok["fastest"], ok["resolved"]) == (pytest.approx(1.01), False, "2wg", "2wg")
    assert wrong["slower"] and wrong["fastest"] == "3wg" and wrong["resolved_ratio"] == pytest.approx(10 / 9)
    assert noise["slower"] and noise["resolved_ratio"] == 1.0 and noise["ratio"] == pytest.approx(1.04)
    assert not mc["slower"] and mc["fastest_us"] == 30.0  # the mc-off rows (20 and 21 us) left out


def test_verify_cli_prints_every_config_and_exits_1_on_a_slower_row(tmp_path, capsys):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(verify_run()))
    assert auto.main(["--verify", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.count("SLOWER") == 3  # two lines and the summary
    assert ("4 configs with auto and both variants (0 disturbed, not judged); 2 within 2% of the faster variant, "
            "2 SLOWER (1 of them") in out
    assert "bf16 p64 b8 s1 h128 L4096" in out and "auto (2wg)" in out and "fastest 3wg" in out
    good = run_of(row("2wg", 100.0), row("3wg", 120.0), row("auto", 101.0, resolved="2wg"))
    path.write_text(json.dumps(good))
    assert auto.main(["--verify", str(path)]) == 0
    path.write_text(json.dumps(run_of(row("2wg", 100.0), row("3wg", 120.0))))
    assert auto.main(["--verify", str(path)]) == 1  # nothing to verify is not a pass
    assert "no config with an auto row" in capsys.readouterr().out


def test_verify_uses_the_paired_ratio_where_the_run_has_one():
    """An auto row with ``paired`` (runs from the tenth session on) is judged by its paired ratio
    against the faster variant, not by the ratio of medians; both are reported."""
    noisy = run_of(row("2wg", 100.0), row("3wg", 120.0),
                   row("auto", 104.0, resolved="2wg", paired={"2wg": 1.003, "3wg": 0.87}))
    (line,) = auto.verify(noisy)
    assert line["ratio"] == pytest.approx(1.04) and line["paired"] == 1.003 and not line["slower"]
    wrong = run_of(row("2wg", 100.0), row("3wg", 120.0),
                   row("auto", 101.0, resolved="3wg", paired={"2wg": 1.15, "3wg": 0.99}))
    (line,) = auto.verify(wrong)
    assert line["ratio"] == pytest.approx(1.01) and line["paired"] == 1.15 and line["slower"]


def test_verify_does_not_judge_a_disturbed_config():
    # auto 30% over the faster variant, but 2wg's replays were bimodal: reported, tagged, not SLOWER
    shaken = run_of(row("2wg", 18.9, us_min=8.6), row("seesaw", 11.8, us_min=10.6),
                    row("auto", 12.0, us_min=10.4, resolved="seesaw", paired={"2wg": 1.3, "seesaw": 1.0}))
    (line,) = auto.verify(shaken)
    assert line["disturbed"] and not line["slower"] and line["paired"] == 1.0
    steady = run_of(row("2wg", 9.1, us_min=8.7), row("seesaw", 11.8, us_min=10.6),
                    row("auto", 12.0, us_min=10.4, resolved="seesaw", paired={"2wg": 1.3, "seesaw": 1.0}))
    (line,) = auto.verify(steady)
    assert not line["disturbed"] and line["slower"]


def test_disturbed_is_a_median_strictly_over_1_4_times_the_fastest_replay():
    assert not auto._disturbed(row("2wg", 14.0, us_min=10.0))  # exactly 1.4x: kept
    assert auto._disturbed(row("2wg", 14.01, us_min=10.0))
    assert not auto._disturbed(row("2wg", 14.0))  # no us_min (older runs): never
    assert not auto._disturbed(row("2wg", 14.0, us_min=0.0))
    assert not auto._disturbed(row("2wg", None, us_min=10.0, error="boom"))


def test_narrow_keys_of_runs_before_the_narrow_kernel_are_2wgs():
    """Step 5: a key of at most 16 rows per kv head measured only by runs dated before the narrow 2wg
    kernel is 2wg's whatever those runs favoured; a later run's measurement stands; wider keys and runs
    without a date are untouched."""
    old = {"date": "2026-11-25T12:00:00Z"}
    new = {"date": "2026-11-26T12:00:00Z"}
    rows = (row("2wg", 10.0, h_q=16), row("3wg", 8.0, h_q=16), row("2wg", 10.0, h_q=32), row("3wg", 8.0, h_q=32))
    by_key = {tuple(e["key"][:3]): e for e in auto.derive(dict(old, **run_of(*rows)))}
    assert by_key[64, 1, 16]["pipeline"] == "2wg" and by_key[64, 1, 16]["measured_pipeline"] == "3wg"
    assert by_key[64, 1, 32]["pipeline"] == "3wg" and "measured_pipeline" not in by_key[64, 1, 32]
    for run in (dict(new, **run_of(*rows)), run_of(*rows)):
        assert {e["pipeline"] for e in auto.derive(run)} == {"3wg"}
    # one old and one new run measured the key: the new one's kernel is in the data, no override
    assert {e["pipeline"] for e in auto.derive([dict(old, **run_of(*rows)), dict(new, **run_of(*rows))])} == {"3wg"}


def test_help_renders_the_slower_threshold(capsys):
    # argparse %-formats help strings: a bare "2% slower" once printed the action's dict in its place
    with pytest.raises(SystemExit) as exc:
        auto.main(["--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"more than {auto.SLOWER * 100:.0f}% slower" in out and "option_strings" not in out
