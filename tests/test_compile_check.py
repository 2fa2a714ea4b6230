"""CPU: every kernel variant compiles for sm_90a and its SASS shows what it promises."""
from __future__ import annotations

import re

import pytest

import pipelines
from mla import compile_check


def test_count_sass_and_promises():
    sass = "HGMMA.64x64x16.F32.BF16 R0\n UTMALDG.3D [UR4]\n UTMALDG.3D.MULTICAST [UR8]\n LDL.64 R2\n"
    counts = compile_check.count_sass(sass)
    # UTMALDG counts every TMA load, multicast ones included
    assert counts["HGMMA"] == 1 and counts["UTMALDG"] == 2 and counts["UTMALDG_MULTICAST"] == 1
    assert counts["LDL"] == 1 and counts["STL"] == 0 and counts["USETMAXREG"] == 0
    assert compile_check.check_promises(counts, ("HGMMA",), ("STL",)) == []
    assert compile_check.check_promises(counts, ("USETMAXREG",), ("LDL",)) == ["no USETMAXREG", "1 LDL"]
    # a forbidden instruction up to an allowed count (the merge by the last chunk's cp.async staging)
    assert compile_check.check_promises(counts, (), ("LDL",), (("LDL", 1),)) == []
    assert compile_check.check_promises(counts, (), ("LDL",), (("LDL", 0),)) == ["1 LDL (> 0)"]


def test_stores_from_one_base_need_sixteen():
    # 2wg's 64-row kernel stores P's unswizzled tile as 16 4-byte stores from one base register.
    one_base = "".join(f" STS [R178+0x{0x36800 + 0x80 * i:x}], R{152 + i} ;\n" for i in range(16))
    counts = compile_check.count_sass(one_base + " STS [R21+UR8+0x30], R1 ;\n STS.U16 [R22], RZ ;\n")
    assert counts["STS_ONE_BASE"] == 16
    assert compile_check.check_promises(counts, ("STS_ONE_BASE",), ()) == []
    swizzled = "".join(f" STS [R{180 + i}], R{152 + i} ;\n" for i in range(14)) + " STS [R21+UR8+0x30], R1 ;\n" * 2
    counts = compile_check.count_sass(swizzled)
    assert counts["STS_ONE_BASE"] == 2
    assert compile_check.check_promises(counts, ("STS_ONE_BASE",), ()) == ["2 STS_ONE_BASE (< 16)"]


def test_serialized_wgmma_breaks_a_promise():
    # ptxas's fallback: a wait after every HGMMA. One wait per wgmma group is the normal shape.
    serialized = "HGMMA.64x64x16.F32.BF16 R0\n WARPGROUP.DEPBAR.LE gsb0, 0x0 ;\n" * 8
    counts = compile_check.count_sass(serialized)
    assert counts["HGMMA"] == 8 and counts["WGMMA_WAIT"] == 8
    assert compile_check.check_promises(counts, ("HGMMA",), ()) == ["wgmma serialized (8 waits for 8 HGMMA)"]
    grouped = "HGMMA.64x64x16.F32.BF16 R0\n" * 8 + " WARPGROUP.DEPBAR.LE gsb0, 0x1 ;\n WARPGROUP.DEPBAR.LE gsb0, 0x0 ;\n"
    assert compile_check.check_promises(compile_check.count_sass(grouped), ("HGMMA",), ()) == []


@pytest.mark.skipif(compile_check.find_nvdisasm() is None, reason="nvdisasm not installed (test extra)")
@pytest.mark.parametrize("variant", sorted(compile_check.PROMISES))
def test_variant_compiles_with_its_promises(variant, capsys):
    rc = compile_check.main(["--variant", variant])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = [line for line in out.splitlines() if line.startswith(variant + " ")]
    assert len(rows) == len(compile_check.DECODE_CONFIGS) and all(line.endswith("ok") for line in rows), out
    assert "merge" in out
    planner_rows = [line for line in out.splitlines() if line.startswith("planner")]
    assert len(planner_rows) == 1 and planner_rows[0].endswith("ok"), out

    def count(row, key):  # a row: name (with spaces), compile s, the COUNTED counts, "ok"
        return dict(zip(compile_check.COUNTED, map(int, row.split()[-1 - len(compile_check.COUNTED):-1])))[key]

    multicast_rows = [r for r in rows if " h128 " in r and " mc-off" not in r]
    if variant in pipelines.MULTICAST_VARIANTS:
        assert multicast_rows and all(count(r, "UTMALDG_MULTICAST") > 0 for r in multicast_rows), out
    else:  # seesaw runs no multicast cluster
        assert all(count(r, "UTMALDG_MULTICAST") == 0 for r in rows), out
    # The seesaw loads each K column group as one 4-D copy where a box is the tile's 64 rows (page 64, no
    # cluster) and stores its P tiles with stmatrix (kv_wide_boxes, p_stmatrix); 2wg and 3wg do neither.
    if variant == "seesaw":
        assert all(count(r, "UTMALDG_4D") > 0 for r in rows if " p64 " in r), out
        assert all(count(r, "UTMALDG_4D") == 0 for r in rows if " p64 " not in r), out
        assert all(count(r, "STSM") > 0 for r in rows), out
    else:
        assert all(count(r, "UTMALDG_4D") == 0 and count(r, "STSM") == 0 for r in rows), out
    gather_rows = [r for r in rows if " p1 " in r]
    assert gather_rows and all(count(r, "LDGSTS") > 0 for r in gather_rows), out
    # Split clusters: cluster barriers and 16-byte distributed-shared-memory reads; nothing else
    # reads distributed shared memory.
    split_rows = [r for r in rows if " split" in r]
    assert len(split_rows) == 2 and all(count(r, "CLUSTER_BAR") > 0 and count(r, "LD_DSMEM") > 0
                                        for r in split_rows), out
    assert all(count(r, "LD_DSMEM") == 0 for r in rows if " split" not in r), out
    # 3wg resizes its warpgroups' registers (one decrease, one increase per consumer warpgroup) from
    # exactly the 168 per thread its budgets are made for, and so does seesaw where a producer warpgroup
    # loads (the TMA pages; its gather pages, p1, have none); 2wg has no producer warpgroup.
    def has_producer(r):
        return variant == "3wg" or (variant == "seesaw" and not re.search(r" p1\b", r))
    assert all((count(r, "USETMAXREG") > 0) == has_producer(r) for r in rows), out
    assert all(r.split()[-2 - len(compile_check.COUNTED)] == "168" for r in rows if has_producer(r)), out


def test_3wg_register_promise_matches_its_budgets():
    from pipelines import variant_3wg

    assert compile_check.PROMISES["3wg"]["registers"] == variant_3wg.ENTRY_REGISTERS == 65536 // 384 // 8 * 8
    for budget in (variant_3wg.REGISTERS_TMA, variant_3wg.REGISTERS_GATHER):
        assert sum(budget) == 3 * variant_3wg.ENTRY_REGISTERS and all(r % 8 == 0 and 24 <= r <= 256 for r in budget)


def test_seesaw_register_promise_matches_its_budget():
    from pipelines import variant_seesaw

    budget = variant_seesaw.MLADecodeSeesaw.PRODUCER_REGISTERS
    assert compile_check.PRODUCER_ENTRY_REGISTERS == 65536 // 384 // 8 * 8
    assert sum(budget) == 3 * compile_check.PRODUCER_ENTRY_REGISTERS and all(r % 8 == 0 and 24 <= r <= 256
                                                                              for r in budget)


def test_every_variant_with_a_kernel_has_promises():
    import pipelines

    assert set(pipelines.available_variants()) <= set(compile_check.PROMISES)
    for t in [t for t in compile_check.targets(["3wg"]) if t.variant == "3wg"]:
        assert "USETMAXREG" in t.need and {"LDL", "STL"} <= set(t.forbid), t


def test_loader_promises():
    # What a configuration must show follows from its page size and cluster.
    assert compile_check.loader_promises(64, 128, 1, True) == (("UTMALDG", "UTMALDG_MULTICAST"), ("LDGSTS", "LD_DSMEM"))
    assert compile_check.loader_promises(64, 128, 1, False) == (("UTMALDG",), ("LDGSTS", "UTMALDG_MULTICAST", "LD_DSMEM"))
    assert compile_check.loader_promises(16, 64, 1, True) == (("UTMALDG",), ("LDGSTS", "UTMALDG_MULTICAST", "LD_DSMEM"))
    assert compile_check.loader_promises(128, 64, 4, True) == (("UTMALDG", "UTMALDG_MULTICAST"), ("LDGSTS", "LD_DSMEM"))
    assert compile_check.loader_promises(64, 64, 3, True) == (("UTMALDG",), ("LDGSTS", "UTMALDG_MULTICAST", "LD_DSMEM"))
    assert compile_check.loader_promises(1, 128, 1, True) == (("LDGSTS",), ("UTMALDG_MULTICAST", "LD_DSMEM"))
    assert compile_check.loader_promises(8, 16, 1, True) == (("LDGSTS",), ("UTMALDG_MULTICAST", "LD_DSMEM"))
    # A split cluster: no multicast (even at 128 rows), cluster barriers and DSMEM reads.
    assert compile_check.loader_promises(64, 128, 1, True, 8) == (
        ("UTMALDG", "CLUSTER_BAR", "LD_DSMEM"), ("LDGSTS", "UTMALDG_MULTICAST"))
    names = [t.name for t in compile_check.targets(["2wg"])]
    assert any(" p1" in n for n in names) and any("mc-off" in n for n in names)
    (gather,) = [t for t in compile_check.targets(["2wg"]) if t.page_size == 1 and t.split_cluster == 1]
    assert "LDGSTS" in gather.need and "UTMALDG" in gather.need and "UTMALDG_MULTICAST" in gather.forbid
    # 16-byte stores of O wherever O goes through store_rows_16 (not from a split cluster's exchange).
    for t in compile_check.targets(["2wg", "3wg"]):
        if t.kind == "decode":
            assert ("STG_128" in t.need) == (t.split_cluster == 1), t


def test_exit_arrive_moves_into_the_roles_only_for_2wg_multicast_clusters():
    """2wg arrives on the exit's cluster barrier after its last K release (skeleton
    ``early_cluster_arrive``) exactly when it runs in a multicast cluster; a split cluster (whose
    epilogue exchanges partials between the CTAs) and the other variants keep the arrive at the end."""
    import cutlass

    from pipelines.variant_2wg import MLADecode2WG
    from pipelines.variant_3wg import MLADecode3WG

    bf = cutlass.BFloat16
    assert MLADecode2WG(bf, 128, 1, 64, False).arrives_early()
    assert MLADecode2WG(bf, 64, 2, 16, True).arrives_early()
    assert not MLADecode2WG(bf, 128, 1, 64, False, multicast=False).arrives_early()
    assert not MLADecode2WG(bf, 64, 1, 64, False).arrives_early()  # one m-block: no cluster
    assert not MLADecode2WG(bf, 128, 1, 1, False).arrives_early()  # cp.async pages: no cluster
    assert not MLADecode2WG(bf, 16, 1, 64, False, split_cluster=4).arrives_early()
    assert not MLADecode3WG(bf, 128, 1, 64, False).arrives_early()


def test_producer_warps_and_early_page_reads_follow_the_measured_choices():
    """Which WG1 warp issues Q (``q_producer_warp``: apart from the K producers in the narrow kernel only,
    as measured; the last warp where all four issue K boxes), and that refills read their page id a tile
    early on every TMA path (``reads_refill_page_early``) but never on the cp.async gather."""
    import cutlass

    from pipelines.variant_2wg import MLADecode2WG
    from pipelines.variant_2wg_narrow import MLADecode2WGNarrow

    bf = cutlass.BFloat16
    assert MLADecode2WGNarrow(bf, 16, 1, 64, False).q_producer_warp() == 1  # K: warp 0
    assert MLADecode2WGNarrow(bf, 16, 1, 32, False).q_producer_warp() == 2  # K: warps 0-1
    assert MLADecode2WGNarrow(bf, 16, 1, 16, False).q_producer_warp() == 3  # K: all four
    assert MLADecode2WGNarrow(bf, 16, 1, 1, False).q_producer_warp() == 3  # the gather: all four
    assert MLADecode2WG(bf, 128, 1, 64, False).q_producer_warp() == 0  # the 64-row kernel: warp 0
    assert MLADecode2WG(bf, 64, 1, 16, False).q_producer_warp() == 0
    for page in (16, 32, 64, 128):
        assert MLADecode2WG(bf, 64, 1, page, False).reads_refill_page_early()
        assert MLADecode2WGNarrow(bf, 16, 1, page, False).reads_refill_page_early()
    assert not MLADecode2WG(bf, 64, 1, 1, False).reads_refill_page_early()
    late = type("Late", (MLADecode2WG,), {"refill_pages_early": False})
    assert not late(bf, 64, 1, 64, False).reads_refill_page_early()  # the form before: one box, read late
    assert late(bf, 64, 1, 16, False).reads_refill_page_early()  # several boxes: always early


def test_l2_hint_reaches_every_k_load_only_when_set():
    """``kv_l2_hint`` (2wg: evict_first) gives each K box's TMA load the policy of a ``createpolicy`` as
    its ``.L2::cache_hint`` operand (0 without it); Q's loads keep 0. A gather loader (page 1) takes
    no hint."""
    import re

    from pipelines.launch import DecodeConfig
    from pipelines.variant_2wg import MLADecode2WG

    assert MLADecode2WG.kv_l2_hint == "evict_first"
    hinted = MLADecode2WG
    plain = type("Plain2WG", (MLADecode2WG,), {"kv_l2_hint": None})
    conf = DecodeConfig.make("2wg", "bfloat16", 64, 1, 64, False)
    ptx = {name: _entry_ptx(conf, cls) for name, cls in (("default", plain), ("hinted", None))}
    # The DSL gives every TMA load a cache-policy operand, a register set to 0 unless a policy is given;
    # with the hint, the K loads take createpolicy's instead and only Q's load keeps a 0.
    def zero_policy_loads(text):
        zeros = set(re.findall(r"mov\.b64\s+(%rd\d+), 0;", text))
        ops = re.findall(r"cp\.async\.bulk\.tensor[^;]*, (%rd\d+);", text)
        return len(ops), sum(op in zeros for op in ops)

    assert "createpolicy.fractional.L2::evict_first.b64" in ptx["hinted"] and "createpolicy" not in ptx["default"]
    n_default, zero_default = zero_policy_loads(ptx["default"])
    n_hinted, zero_hinted = zero_policy_loads(ptx["hinted"])
    assert n_default == zero_default == n_hinted > 1
    # A 576-wide box goes out as 9 copies of 64 columns: Q's call sites keep 0, K's (whole tiles) hint.
    assert 0 < zero_hinted < n_hinted and zero_hinted % 9 == 0 and (n_hinted - zero_hinted) % 9 == 0
    assert not hasattr(hinted(cutlass_bf16(), 64, 1, 1, False).loader, "l2_hint")  # cp.async gather: no TMA


def _entry_ptx(conf, kernel_class=None) -> str:
    """The PTX of the decode entry of ``conf`` (``kernel_class``: a subclass instead of the variant's)."""
    import glob
    import os
    import tempfile

    import cutlass.cute as cute

    from pipelines.launch import DecodeEntry, entry_args

    with tempfile.TemporaryDirectory() as dump:
        fn = cute.compile(DecodeEntry(conf, kernel_class), *entry_args(conf),
                          options=f"--gpu-arch sm_90a --keep-ptx --dump-dir {dump}")
        assert fn is not None
        (path,) = glob.glob(os.path.join(dump, "*.ptx"))  # the kept PTX
        with open(path) as f:
            return f.read()


def cutlass_bf16():
    import cutlass

    return cutlass.BFloat16


@pytest.mark.parametrize("attr, value, method", [("l2_prefetch_ahead", 2, "prefetches_l2"),
                                                   ("l2_prefetch_chunk_tiles", 8, "prefetches_short_chunks")])
def test_l2_prefetch_forms_issue_k_box_prefetches(attr, value, method):
    """The 2wg L2 prefetch forms (``l2_prefetch_ahead``, off by default; ``l2_prefetch_chunk_tiles``, 8 by
    default): a kernel with the form on issues TMA L2 prefetches (``cp.async.bulk.prefetch.tensor...L2``)
    of K boxes, 9 per 576-wide box like the loads; with both forms off it issues none, and a gather page
    size (no TMA) never prefetches."""
    import re

    from pipelines.launch import DecodeConfig
    from pipelines.variant_2wg import MLADecode2WG

    assert (MLADecode2WG.l2_prefetch_ahead, MLADecode2WG.l2_prefetch_chunk_tiles) == (0, 8)
    off = type("NoPrefetch2WG", (MLADecode2WG,), {"l2_prefetch_ahead": 0, "l2_prefetch_chunk_tiles": 0})
    prefetching = type("Prefetch2WG", (off,), {attr: value})
    conf = DecodeConfig.make("2wg", "bfloat16", 128, 1, 64, False)  # a multicast cluster: each CTA its half
    ptx = {name: _entry_ptx(conf, cls) for name, cls in (("off", off), ("prefetch", prefetching))}
    pattern = re.compile(r"cp\.async\.bulk\.prefetch\.tensor\S*L2")
    assert not pattern.search(ptx["off"])
    n = len(pattern.findall(ptx["prefetch"]))
    assert n > 0 and n % 9 == 0
    assert getattr(prefetching(cutlass_bf16(), 128, 1, 64, False), method)()
    assert not getattr(prefetching(cutlass_bf16(), 128, 1, 1, False), method)()  # cp.async gather: no TMA
    assert not getattr(off(cutlass_bf16(), 128, 1, 64, False), method)()


@pytest.mark.parametrize("waits_pv", [True, False])
def test_qk_ahead_issues_the_next_qk_behind_the_pv(waits_pv):
    """``MLADecode2WG.qk_ahead`` (off by default, an A/B option): WG0 issues the next tile's QK (36 more
    wgmma: the chunk's first QK before the loop, the next ones in it; the chunk's last P.V peeled, 4 more)
    with its P.V still in flight (``wgmma.wait_group`` 1), and waits for WG1's P.V issue on the
    ``BAR_PV_ISSUED`` named barrier only with ``qk_ahead_waits_pv``."""
    import re

    from pipelines.launch import DecodeConfig
    from pipelines.variant_2wg import BAR_PV_ISSUED, MLADecode2WG

    assert MLADecode2WG.qk_ahead is False and MLADecode2WG.qk_ahead_waits_pv is True
    ahead = type("Ahead2WG", (MLADecode2WG,), {"qk_ahead": True, "qk_ahead_waits_pv": waits_pv})
    conf = DecodeConfig.make("2wg", "bfloat16", 128, 1, 64, False)
    ptx = {name: _entry_ptx(conf, cls) for name, cls in (("base", MLADecode2WG), ("ahead", ahead))}
    count = {name: len(re.findall(r"wgmma\.mma_async", text)) for name, text in ptx.items()}
    assert count["ahead"] == count["base"] + 36 + 4
    assert re.search(r"wgmma\.wait_group\.sync\.aligned\s+1;", ptx["ahead"])
    assert not re.search(r"wgmma\.wait_group\.sync\.aligned\s+1;", ptx["base"])
    named = re.compile(rf"\bbar(?:rier)?\.sync(?:\.aligned)?\s+{BAR_PV_ISSUED},")
    assert bool(named.search(ptx["ahead"])) is waits_pv
    assert not named.search(ptx["base"])


def test_kv_groups_two_column_groups_where_taken():
    """``MLADecode2WG.kv_groups`` 2 (the default where a CTA has 65-128 rows per kv head from s_q 1, TMA pages,
    no split cluster): each K stage fills as two column groups on their own barrier pairs (twice the K stage
    barriers), WG0's QK waits for the second group halfway (one more ``wgmma.fence``) with the same wgmma;
    one group elsewhere and in the narrow kernel."""
    import re

    from pipelines.launch import DecodeConfig
    from pipelines.variant_2wg import MLADecode2WG
    from pipelines.variant_2wg_narrow import MLADecode2WGNarrow

    bf16 = cutlass_bf16()
    assert MLADecode2WG(bf16, 128, 1, 64, False).kv_groups == 2  # 128 rows, a multicast cluster
    assert MLADecode2WG(bf16, 128, 1, 16, False).kv_groups == 2  # page 16
    assert MLADecode2WG(bf16, 64, 2, 64, True).kv_groups == 1  # 128 rows from two query positions
    assert MLADecode2WG(bf16, 128, 1, 64, False, 1, False).kv_groups == 2  # no multicast
    assert MLADecode2WG(bf16, 64, 1, 64, False).kv_groups == 1  # 64 rows
    assert MLADecode2WG(bf16, 128, 2, 64, True).kv_groups == 1  # 256 rows
    assert MLADecode2WG(bf16, 128, 1, 1, False).kv_groups == 1  # cp.async gather
    assert MLADecode2WG(bf16, 128, 1, 64, False, 1, True, 8).kv_groups == 1  # split cluster
    assert MLADecode2WGNarrow(bf16, 16, 1, 64, False).kv_groups == 1
    one = type("One2WG", (MLADecode2WG,), {"kv_groups": 1})
    conf = DecodeConfig.make("2wg", "bfloat16", 128, 1, 64, False)
    ptx = {name: _entry_ptx(conf, cls) for name, cls in (("one", one), ("two", MLADecode2WG))}
    count = {name: {what: len(re.findall(pattern, text)) for what, pattern in (
        ("init", r"mbarrier\.init"), ("fence", r"wgmma\.fence"), ("mma", r"wgmma\.mma_async"))}
        for name, text in ptx.items()}
    k_barriers = 2 * 2 * MLADecode2WG.kv_stages  # a full and an empty barrier per stage and group
    assert count["two"]["init"] == count["one"]["init"] + k_barriers // 2
    assert count["two"]["fence"] == count["one"]["fence"] + 1
    assert count["two"]["mma"] == count["one"]["mma"]


def test_dependent_launch_order_in_sass():
    """The decode kernel's griddepcontrol.wait (ACQBULK) must precede its first global access and its
    launch_dependents (PREEXIT); other kernels in the cubin (the merge) are not held to it."""
    def sass(decode_body, merge_body="PREEXIT ;\n LDG.E R0, desc[UR4][R2.64] ;\n ACQBULK ;\n"):
        return (f"\t.section\t.text.kernel_SplitMerge_x,\"ax\",@progbits\n{merge_body}"
                f"\t.section\t.text.kernel_MLADecode2WG_y,\"ax\",@progbits\n{decode_body}")

    good = " SYNCS.EXCH.64 URZ, [UR57], UR4 ;\n BAR.SYNC 0x0 ;\n ACQBULK ;\n PREEXIT ;\n LDG.E R6, desc[UR4][R8.64] ;\n"
    assert compile_check.dependent_launch_problems(sass(good)) == []
    early_load = " LDG.E R6, desc[UR4][R8.64] ;\n ACQBULK ;\n PREEXIT ;\n"
    assert compile_check.dependent_launch_problems(sass(early_load))[0].startswith("global access before")
    early_tma = " UTMALDG.2D [UR8], [UR4] ;\n ACQBULK ;\n PREEXIT ;\n"
    assert compile_check.dependent_launch_problems(sass(early_tma))[0].startswith("global access before")
    early_trigger = " PREEXIT ;\n ACQBULK ;\n STG.E [R2.64], R0 ;\n"
    assert compile_check.dependent_launch_problems(sass(early_trigger)) == [
        "griddepcontrol.launch_dependents before griddepcontrol.wait"]
    assert compile_check.dependent_launch_problems(sass(" LDG.E R6, desc[UR4][R8.64] ;\n")) == [
        "no griddepcontrol.wait (ACQBULK)", "no griddepcontrol.launch_dependents (PREEXIT)"]
    assert compile_check.dependent_launch_problems("") == ["no decode kernel in the SASS"]


@pytest.mark.skipif(compile_check.find_nvdisasm() is None, reason="nvdisasm not installed (test extra)")
def test_narrow_kernel_transposes_both_products():
    """The narrow 2wg kernel (pipelines/variant_2wg_narrow.py): both products are 64 x N wgmmas with N the
    16 or 32 columns that hold the rows, 36 for S^T (one per 16 of the 576 dims) and 32 for O^T (8 blocks
    of 64 value dims x 4 k-steps of 16 tokens), and nothing 64 rows wide; no local memory, wgmma not
    serialized, the epilogue's 16-byte stores, the PDL order kept; the "2wg" pipeline builds it at <= 32
    rows per kv head (not for a split cluster); more rows, or a split cluster, are refused."""
    import re
    import tempfile

    from pipelines import launch
    from pipelines.launch import DecodeConfig, compile_entry
    from pipelines.variant_2wg import MLADecode2WG
    from pipelines.variant_2wg_narrow import NARROW, MLADecode2WGNarrow

    for h_q, s_q, width in ((16, 1, 16), (16, 2, 32)):
        conf = DecodeConfig.make("2wg", "bfloat16", h_q, s_q, 64, s_q > 1)
        assert launch._kernel_class("2wg", conf) is MLADecode2WGNarrow
        with tempfile.TemporaryDirectory() as dump:
            fn = compile_entry(conf, options=f"--gpu-arch sm_90a --keep-cubin --dump-dir {dump}")
            sass = compile_check.disassemble(compile_check.find_nvdisasm(), fn.artifacts.CUBIN, dump)
        shapes = re.findall(r"HGMMA\.(\d+x\d+x\d+)", sass)
        assert shapes.count(f"64x{width}x16") == 36 + 32 and len(shapes) == 68, (h_q, s_q)
        counts = compile_check.count_sass(sass)
        assert compile_check.check_promises(counts, ("HGMMA_NARROW", "UTMALDG", "STG_128"),
                                            ("HGMMA_WIDE", "LDL", "STL", "LDGSTS")) == []
        assert counts["WGMMA_WAIT"] <= 4
        assert compile_check.dependent_launch_problems(sass) == []
    # Which configurations get it: rows per kv head, not h_q.
    for h_q, s_q, h_kv, split_cluster, narrow in ((16, 1, 1, 1, True), (8, 2, 1, 1, True), (4, 4, 1, 1, True),
                                                  (1, 1, 1, 1, True), (32, 1, 2, 1, True), (128, 1, 8, 1, True),
                                                  (16, 2, 1, 1, True), (32, 1, 1, 1, True), (8, 4, 1, 1, True),
                                                  (64, 1, 2, 1, True), (24, 1, 1, 1, True),
                                                  (16, 3, 1, 1, False), (64, 1, 1, 1, False), (128, 1, 1, 1, False),
                                                  (16, 1, 1, 4, False)):
        c = DecodeConfig.make("2wg", "bfloat16", h_q, s_q, 64, False, h_kv, True, None, split_cluster)
        assert (launch._kernel_class("2wg", c) is MLADecode2WGNarrow) is narrow, (h_q, s_q, h_kv, split_cluster)
        if not narrow:
            assert launch._kernel_class("2wg", c) is MLADecode2WG
    assert MLADecode2WGNarrow(cutlass_bf16(), 16, 1, 64, False).width == 16
    assert MLADecode2WGNarrow(cutlass_bf16(), 24, 1, 64, False).width == 32
    with pytest.raises(ValueError, match="at most 32 query rows"):
        MLADecode2WGNarrow(cutlass_bf16(), 2 * NARROW, 1, 64, False)
    with pytest.raises(ValueError, match="at most 32 query rows"):
        MLADecode2WGNarrow(cutlass_bf16(), 16, 3, 64, True)  # 48 rows of MTP
    assert MLADecode2WGNarrow(cutlass_bf16(), 64, 1, 64, False, 2).rows == NARROW  # 32 rows per kv head
    with pytest.raises(ValueError, match="split-cluster"):
        MLADecode2WGNarrow(cutlass_bf16(), 16, 1, 64, False, 1, True, 4)
    with pytest.raises(ValueError, match="l2_prefetch_ahead"):  # the 64-row kernel's per-tile prefetch only
        type("Prefetching", (MLADecode2WGNarrow,), {"l2_prefetch_ahead": 2})(cutlass_bf16(), 16, 1, 64, False)


def _decode_sass(variant: str, h_q: int, s_q: int, causal: bool, **constants) -> str:
    """The SASS of ``variant``'s decode kernel at page 64, compiled from a subclass of its kernel class with
    ``constants`` set; the split-merge kernels of the same entry left out."""
    import tempfile

    from pipelines import launch
    from pipelines.variant_2wg import MLADecode2WG
    from pipelines.variant_seesaw import MLADecodeSeesaw

    config = launch.DecodeConfig.make(variant, "bfloat16", h_q, s_q, 64, causal)
    kernel = type("Probed", ({"seesaw": MLADecodeSeesaw, "2wg": MLADecode2WG}[variant],), constants)
    with tempfile.TemporaryDirectory() as d:
        fn = launch.compile_entry(config, options=f"--gpu-arch sm_90a --keep-cubin --dump-dir {d}",
                                  kernel_class=kernel)
        sass = compile_check.disassemble(compile_check.find_nvdisasm(), fn.artifacts.CUBIN, d)
    return "\n".join(body for name, body in compile_check.sass_functions(sass).items() if "Probed" in name)


def _seesaw_sass(**constants) -> str:
    """The seesaw's decode kernel at h128 s2 causal (the compute-bound MTP shape): ``_decode_sass``."""
    return _decode_sass("seesaw", 128, 2, True, **constants)


@pytest.mark.skipif(compile_check.find_nvdisasm() is None, reason="nvdisasm not installed (test extra)")
def test_seesaw_computes_each_exponential_once():
    # S is carried around the seesaw's loop; with its fp32 P left in S's registers ptxas recomputed each tile's
    # 32 exponentials per warpgroup to keep them alive (docs/perf-notes.md, thirty-second session).
    # ``clear_p`` zeroes S once P is in bf16: the kernel then holds each tile's exponentials once. The form that
    # keeps P recomputes at least one tile's 32 (64 more when this test was written, 59 more at dee28ff); the
    # library's count (72 per copy of the iteration in the decode kernel at h128 s2 causal, two copies with the
    # steady loop) must not grow back.
    from pipelines.variant_seesaw import MLADecodeSeesaw

    copies = 2 if MLADecodeSeesaw.steady_loop else 1
    # (without the merge by the last chunk, whose weights add exponentials outside the loop)
    exps = {clear: len(re.findall(r"MUFU\.EX2", _seesaw_sass(clear_p=clear, chunk_merge=False)))
            for clear in (True, False)}
    assert exps[True] + 32 <= exps[False] and exps[True] <= 72 * copies, exps


@pytest.mark.skipif(compile_check.find_nvdisasm() is None, reason="nvdisasm not installed (test extra)")
@pytest.mark.parametrize("variant,h_q,s_q,causal", [("seesaw", 128, 2, True), ("2wg", 128, 1, False)])
def test_steady_loop_compiles_two_iteration_bodies_without_spills_or_serialized_wgmma(variant, h_q, s_q, causal):
    # ``steady_loop`` (the seesaw's default, 2wg's off) traces each warpgroup's iteration twice: the steady
    # loop without the per-tile checks, then the rest with them. Both bodies must keep the library kernel's
    # promises: no local-memory spills and wgmma chains that are not serialized (ptxas serializes every
    # wgmma, a WARPGROUP.DEPBAR behind each HGMMA, when a group stays in flight across a branch).
    counts = {}
    for steady in (False, True):
        text = _decode_sass(variant, h_q, s_q, causal, steady_loop=steady)
        counts[steady] = dict(hgmma=len(re.findall(r"\bHGMMA\.", text)),
                              depbar=len(re.findall(r"WARPGROUP\.DEPBAR", text)),
                              spills=len(re.findall(r"\b(STL|LDL)\b", text)))
    assert counts[True]["hgmma"] > counts[False]["hgmma"], counts  # a second copy of the iteration
    for c in counts.values():
        assert c["spills"] == 0 and c["depbar"] * 8 <= c["hgmma"], counts


def test_steady_loop_is_off_with_a_split_cluster_and_needs_one_step():
    # With a split cluster (opt-in) the seesaw's steady form spilled (split 8: 2 LDL / 2 STL), so those
    # kernels keep one loop; a threshold below one step would move the second loop's start before the chunk's.
    from pipelines.variant_seesaw import MLADecodeSeesaw

    assert MLADecodeSeesaw.steady_loop
    assert MLADecodeSeesaw(cutlass_bf16(), 16, 1, 64, False).steady_loop
    for c in (2, 4, 8):
        assert not MLADecodeSeesaw(cutlass_bf16(), 16, 1, 64, False, split_cluster=c).steady_loop
    low = type("Low", (MLADecodeSeesaw,), {"steady_min_steps": 0})
    with pytest.raises(ValueError, match="steady_min_steps"):
        low(cutlass_bf16(), 128, 1, 64, False)


def test_2wg_steady_loop_refuses_qk_ahead():
    # WG0's qk_ahead loop has no steady split: with both on only WG1's loop would be split, so the pair is
    # refused when the kernel is built (before any compile or launch) instead of measuring half the option.
    from pipelines.variant_2wg import MLADecode2WG

    both = type("Both", (MLADecode2WG,), {"steady_loop": True, "qk_ahead": True})
    with pytest.raises(ValueError, match="steady_loop.*qk_ahead"):
        both(cutlass_bf16(), 128, 1, 64, False)
    type("Steady", (MLADecode2WG,), {"steady_loop": True})(cutlass_bf16(), 128, 1, 64, False)  # alone: built
