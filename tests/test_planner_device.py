"""The device planner on the CPU: the kernel's Python model against the host planner (the
reference), the kernel's limits and its sm_90a compile, and the API's choice between the two
planners (through the ``fake_planner`` fixture of conftest.py). The kernel itself against the host
planner: tests/test_planner_gpu.py."""
from __future__ import annotations

import random

import pytest
import torch

import mla
from mla import api, validate
from mla.api import PlanInfo
from mla.reference import mla_decode_reference
from mla.testing import edge_plan_cases, make_decode_problem, plan_cases
from split_k import planner, planner_kernel

NUM_SMS = 132


def assert_model_matches_host(lengths, num_parts, **knobs):
    """The kernel's algorithm (Python model) writes exactly the host planner's plan; the kernel
    plans a negative length as 0, so the host planner gets the clamped lengths."""
    want_meta, want_splits = planner.plan([max(n, 0) for n in lengths], num_parts, **knobs)
    rows, splits = planner_kernel.kernel_model(lengths, num_parts, **knobs)
    assert rows == want_meta.tolist(), f"metadata differs for {len(lengths)} lengths, {num_parts} parts {knobs}"
    assert splits == want_splits.tolist(), f"num_splits differs for {len(lengths)} lengths, {num_parts} parts {knobs}"


# ------------------------------------------------------------------------------- model vs host planner

@pytest.mark.parametrize("seed", range(6))
def test_model_equals_host_planner_on_issue_cases(seed):
    for case in plan_cases(seed, 40):
        assert_model_matches_host(case.lengths, case.num_parts)


def test_model_equals_host_planner_on_edge_cases():
    for case in edge_plan_cases(NUM_SMS):
        assert_model_matches_host(case.lengths, case.num_parts)


@pytest.mark.parametrize("seed", range(60))
def test_model_equals_host_planner_on_random_knobs(seed):
    # Beyond what the kernels use: other fixed costs and tile sizes, more parts than requests, int32
    # extremes (budgets past 2^30 take the kernel's 64-bit walk), negative lengths.
    rng = random.Random(1000 + seed)
    b = rng.choice([0, 1, 2, 3, 7, 31, 32, 33, 100, 257])
    extreme = rng.random() < 0.2
    lengths = []
    for _ in range(b):
        x = rng.random()
        if x < 0.15:
            lengths.append(0)
        elif x < 0.2:
            lengths.append(-rng.randint(1, 1000))
        elif extreme:
            lengths.append(rng.choice([2**31 - 1, 2**31 - 64, 2**31 - 65, rng.randint(0, 2**31 - 1)]))
        elif x < 0.35:
            lengths.append(rng.randint(10_000, 300_000))
        else:
            lengths.append(rng.randint(1, 5000))
    num_parts = rng.choice([1, 2, 3, 7, 16, 66, 132, 133, 500, planner_kernel.MAX_PARTS])
    assert_model_matches_host(lengths, num_parts, fixed_cost=rng.choice([0, 1, 5, 7]),
                              block_n=rng.choice([planner_kernel.MIN_BLOCK_N, 16, 64]))


def test_model_walk_steps_cover_every_branch():
    # _walk_step's branches, each against the host planner's outcome on a two-request batch whose
    # first request leaves exactly that budget: whole fit, split into one more part, split into
    # several (the wrap), and a part closed unused (budget <= fixed cost) before a fit and a split.
    for lengths, parts in [([64 * 3, 64 * 2], 1), ([64 * 10, 64 * 10], 2), ([64 * 100, 64], 8),
                           ([64 * 7, 64 * 3], 3), ([64 * 2, 64 * 40], 4), ([64 * 6, 64 * 90, 0], 5)]:
        assert_model_matches_host(lengths, parts)
        assert_model_matches_host(lengths, parts, fixed_cost=0)


def test_walk_step_exhaustive_on_small_budgets():
    # _walk_step (branch-free, with cost_mod) against the host planner's own loop for one request,
    # for every budget a part can hold and every small tile count: fit, split into one or several
    # further parts, part closed unused.
    def host_step(budget, nb, target, fixed_cost):
        block = 0
        while True:
            cost = nb - block + fixed_cost
            if cost <= budget:
                return budget - cost
            if budget > fixed_cost:
                block += budget - fixed_cost
            budget = target + fixed_cost

    for fixed_cost in range(4):
        for target in range(1, 13):
            payload = target + fixed_cost
            for nb in range(41):
                costm = planner_kernel.cost_mod(nb, target, fixed_cost)
                for budget in range(payload + 1):
                    want = host_step(budget, nb, target, fixed_cost)
                    got = planner_kernel._walk_step(budget, nb + fixed_cost, costm, payload, target, fixed_cost)
                    assert got == want, (budget, nb, target, fixed_cost)
                    assert device_walk_step(budget, nb + fixed_cost, costm, payload, target, fixed_cost) == want


def device_walk_step(budget, cost, costm, payload, target, fixed_cost, bits=32):
    """The kernel's form of _walk_step (SplitPlanner._walk): a select, an unsigned min, a select."""
    mask = (1 << bits) - 1
    kept = budget - cost if budget >= cost else payload - costm
    d, d_wrapped = budget - costm, budget + (target - costm)
    split_left = min(d & mask, d_wrapped & mask)  # as unsigned: d when d >= 0, else d + target
    return kept if budget >= cost or budget <= fixed_cost else split_left


def test_check_limits():
    planner_kernel.check_limits(planner_kernel.MAX_BATCH, planner_kernel.MAX_PARTS)
    with pytest.raises(ValueError, match=f"batches of up to {planner_kernel.MAX_BATCH} requests.*planner='host'"):
        planner_kernel.check_limits(planner_kernel.MAX_BATCH + 1, 1)
    with pytest.raises(ValueError, match=f"up to {planner_kernel.MAX_PARTS} parts.*num_sms"):
        planner_kernel.check_limits(1, planner_kernel.MAX_PARTS + 1)
    with pytest.raises(ValueError, match="num_parts must be >= 1"):
        planner_kernel.check_limits(1, 0)


@pytest.mark.parametrize("knobs, match", [(dict(block_n=2), "block_n must be an int >= 4"),
                                          (dict(fixed_cost=-1), "fixed_cost must be an int in"),
                                          (dict(fixed_cost=1 << 20), "fixed_cost must be an int in")])
def test_kernel_knobs_rejected(knobs, match):
    with pytest.raises(ValueError, match=match):
        planner_kernel.SplitPlanner(**knobs)
    with pytest.raises(ValueError, match=match):
        planner_kernel.kernel_model([5], 2, **knobs)


def test_planner_kernel_compiles_for_sm90a(tmp_path):
    from pipelines import launch

    fn = launch.compile_planner(options=f"--gpu-arch sm_90a --keep-cubin --keep-ptx --dump-dir {tmp_path}")
    assert fn.artifacts.CUBIN[:4] == b"\x7fELF"
    ptx = fn.artifacts.PTX
    assert ".target sm_90a" in ptx and ".reqntid 256, 1, 1" in ptx
    assert ptx.count("bar.sync") == 5, "phases 1, 1b, 2, 3 (with the scan's) and 4: five barriers"
    # Dynamic shared memory only, sized per launch (a static array would be reserved whatever b is).
    assert ".extern .shared .align 16 .b8" in ptx
    assert not [line for line in ptx.splitlines() if ".shared" in line and "[" in line and "extern" not in line
                and not line.strip().startswith(("st.", "ld.", "atom.", "red."))]
    # The walk moves costs and budgets with vector accesses.
    assert "ld.shared.v4" in ptx and "st.shared.v4" in ptx


def test_shared_memory_follows_the_batch():
    words = planner_kernel.smem_words
    assert planner_kernel.smem_bytes(planner_kernel.MAX_BATCH, planner_kernel.MAX_PARTS) <= planner_kernel.SMEM_LIMIT
    assert planner_kernel.smem_bytes(128, 132) < 4 * 1024, "b = 128 takes a few KB, not the largest batch's"
    assert words(1, 1) == words(32, 1) < words(33, 1), "whole walk chunks"
    assert words(0, 5) == planner_kernel.HEADER_WORDS + 15


# ---------------------------------------------------------------------------------- planner choice

class TestResolvePlanner:
    cuda0, cuda1, cpu = torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cpu")

    def test_auto_is_device_for_lengths_on_the_cuda_device(self):
        assert api.resolve_planner("auto", self.cuda0, self.cuda0) == "device"
        assert api.resolve_planner("auto", self.cpu, self.cuda0) == "host"
        assert api.resolve_planner("auto", self.cuda1, self.cuda0) == "host"
        assert api.resolve_planner("auto", self.cpu, self.cpu) == "host"

    def test_explicit_choices(self):
        assert api.resolve_planner("host", self.cuda0, self.cuda0) == "host"
        assert api.resolve_planner("device", self.cuda0, self.cuda0) == "device"
        with pytest.raises(ValueError, match=r"planner='device' needs cache_seqlens on the CUDA device it plans "
                                             r"for \(cuda:0\), got cache_seqlens on cpu"):
            api.resolve_planner("device", self.cpu, self.cuda0)
        with pytest.raises(ValueError, match="got cache_seqlens on cuda:1"):
            api.resolve_planner("device", self.cuda1, self.cuda0)

    @pytest.mark.parametrize("name", ["cuda", "Device", "", None, 1])
    def test_unknown_name_everywhere(self, name):
        lengths = torch.tensor([5, 7], dtype=torch.int32)
        match = r"planner must be one of \('auto', 'device', 'host'\)"
        with pytest.raises(ValueError, match=match):
            api.resolve_planner(name, self.cuda0, self.cuda0)
        with pytest.raises(ValueError, match=match):
            mla.get_mla_metadata(lengths, 16, 1, num_sms=NUM_SMS, planner=name)
        with pytest.raises(ValueError, match=match):
            mla.get_mla_metadata(planner=name)
        with pytest.raises(ValueError, match=match):
            mla.MLADecoder(planner=name)

    def test_device_planner_refuses_cpu_lengths(self):
        with pytest.raises(ValueError, match="planner='device' needs cache_seqlens on the CUDA device"):
            mla.get_mla_metadata(torch.tensor([5], dtype=torch.int32), 16, 1, num_sms=NUM_SMS, planner="device")


# ------------------------------------------------------------------- get_mla_metadata, device planner

class TestGetMlaMetadataOnDevice:
    def test_auto_plans_with_the_kernel_without_reading_lengths(self, fake_planner, monkeypatch):
        lengths = [100, 0, 3000, 64, 70_000]
        cache_seqlens = torch.tensor(lengths, dtype=torch.int32)

        def no_host_read(*args, **kwargs):
            raise AssertionError("the device path read the lengths on the host")

        monkeypatch.setattr(planner, "host_lengths", no_host_read)
        meta, splits = mla.get_mla_metadata(cache_seqlens, 2 * 64, 1, num_sms=NUM_SMS)
        monkeypatch.undo()
        (call,) = fake_planner.calls
        assert call["tile_scheduler_metadata"] is meta and call["num_splits"] is splits
        assert call["cache_seqlens"] is cache_seqlens
        want_meta, want_splits = planner.plan_default(lengths, 66)
        assert torch.equal(meta, want_meta) and torch.equal(splits, want_splits)
        assert meta._mla_plan_info == PlanInfo(max_seqlen=None, num_parts=66)

    def test_host_option_plans_on_the_host(self, fake_planner):
        prob = make_decode_problem([100, 0, 3000])
        meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS, planner="host")
        assert not fake_planner.calls
        assert meta._mla_plan_info == PlanInfo(max_seqlen=3000, num_parts=NUM_SMS)
        assert torch.equal(meta, planner.plan_default([100, 0, 3000], NUM_SMS)[0])

    def test_empty_batch_launches_nothing(self, fake_planner):
        meta, splits = mla.get_mla_metadata(torch.zeros(0, dtype=torch.int32), 16, 1, num_sms=4)
        assert not fake_planner.calls
        assert meta.tolist() == [[0, 0, -1, 0, 0, 0, 0, 0]] * 4 and splits.tolist() == [0]

    def test_limits_raise_before_launch(self, fake_planner):
        with pytest.raises(ValueError, match=f"batches of up to {planner_kernel.MAX_BATCH} requests"):
            mla.get_mla_metadata(torch.zeros(planner_kernel.MAX_BATCH + 1, dtype=torch.int32), 16, 1, num_sms=NUM_SMS)
        with pytest.raises(ValueError, match=f"up to {planner_kernel.MAX_PARTS} parts, got num_parts = 5000"):
            mla.get_mla_metadata(torch.zeros(3, dtype=torch.int32), 16, 1, num_sms=5000)
        assert not fake_planner.calls
        # The host planner has neither limit.
        meta, _ = mla.get_mla_metadata(torch.zeros(3, dtype=torch.int32), 16, 1, num_sms=5000, planner="host")
        assert meta.shape == (5000, 8)

    def test_lengths_must_be_contiguous(self, fake_planner):
        strided = torch.arange(10, dtype=torch.int32)[::2]
        with pytest.raises(ValueError, match="cache_seqlens must be contiguous for the device planner, got stride 2"):
            mla.get_mla_metadata(strided, 16, 1, num_sms=NUM_SMS)
        assert not fake_planner.calls
        one = torch.tensor([7, 640], dtype=torch.int32)[1::2]  # b = 1: any stride names the same element
        meta, splits = mla.get_mla_metadata(one, 16, 1, num_sms=NUM_SMS)
        assert fake_planner.calls[0]["cache_seqlens"].stride(0) == 1
        want_meta, want_splits = planner.plan_default([640], NUM_SMS)
        assert torch.equal(meta, want_meta) and torch.equal(splits, want_splits)

    def test_device_plans_skip_the_block_table_width_check(self, fake_planner, fake_kernel, monkeypatch):
        checked = []
        real_check = validate.check_block_table_width
        monkeypatch.setattr(validate, "check_block_table_width", lambda *a: checked.append(a) or real_check(*a))
        prob = make_decode_problem([700, 0, 2, 1500])
        for planner_choice, want_checks in (("auto", 0), ("host", 1)):
            meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS, planner=planner_choice)
            out, lse = mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512,
                                                  meta, splits)
            assert len(checked) == want_checks
            ref_out, ref_lse = mla_decode_reference(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens)
            torch.testing.assert_close(lse, ref_lse)
            torch.testing.assert_close(out.float(), ref_out, atol=1e-2, rtol=1e-2)


def test_lazy_metadata_plans_on_the_device(fake_planner, fake_kernel):
    prob = make_decode_problem([900, 5])
    sched, _ = mla.get_mla_metadata(num_sms=NUM_SMS)
    mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, sched, None)
    assert len(fake_planner.calls) == 1 and sched.info == PlanInfo(None, NUM_SMS)
    assert torch.equal(sched.tile_scheduler_metadata, planner.plan_default([900, 5], NUM_SMS)[0])
    mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, sched, None)
    assert len(fake_planner.calls) == 1, "planned once"
    host_sched, _ = mla.get_mla_metadata(num_sms=NUM_SMS, planner="host")
    mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, host_sched, None)
    assert len(fake_planner.calls) == 1 and host_sched.info == PlanInfo(900, NUM_SMS)
    assert torch.equal(host_sched.tile_scheduler_metadata, sched.tile_scheduler_metadata)


# ------------------------------------------------------------------------ MLADecoder, device planner

class TestDecoderOnDevice:
    def plan(self, prob, dec=None):
        dec = dec or mla.MLADecoder(num_sms=NUM_SMS)
        dec.plan(prob.cache_seqlens, num_heads_q=prob.q.shape[2], seq_len_q=prob.q.shape[1])
        return dec

    def buffers(self, dec):
        return [dec.tile_scheduler_metadata, dec.num_splits, dec._workspace, dec._lse]

    def test_replan_writes_the_kernel_plan_in_place(self, fake_planner, fake_kernel):
        prob = make_decode_problem([100, 0, 300], h_q=16)
        dec = self.plan(prob)
        (first,) = fake_planner.calls
        # (the planner writes the plan's rows in place: with a split cluster, a view of the first rows)
        assert first["tile_scheduler_metadata"].data_ptr() == dec.tile_scheduler_metadata.data_ptr()
        assert first["num_splits"] is dec.num_splits and dec._info == PlanInfo(None, NUM_SMS)
        ptrs = [t.data_ptr() for t in self.buffers(dec)]
        new = make_decode_problem([4000, 10, 1], h_q=16, seed=1)
        self.plan(new, dec)
        second = fake_planner.calls[1]
        assert second["tile_scheduler_metadata"] is dec.tile_scheduler_metadata, "no new plan tensors"
        assert [t.data_ptr() for t in self.buffers(dec)] == ptrs
        want_meta, want_splits = planner.plan_default([4000, 10, 1], NUM_SMS)
        assert torch.equal(dec.tile_scheduler_metadata, want_meta) and torch.equal(dec.num_splits, want_splits)
        out, lse = dec.run(new.q, new.k_cache, new.block_table, new.cache_seqlens)
        ref_out, ref_lse = mla_decode_reference(new.q, new.k_cache, new.block_table, new.cache_seqlens)
        torch.testing.assert_close(lse, ref_lse)
        torch.testing.assert_close(out.float(), ref_out, atol=1e-2, rtol=1e-2)
        self.plan(make_decode_problem([5, 5], h_q=16), dec)  # another batch size: new buffers
        assert dec.num_splits.shape == (3,) and len(fake_planner.calls) == 3

    def test_host_option(self, fake_planner, fake_kernel):
        prob = make_decode_problem([100, 0, 300], h_q=16)
        dec = mla.MLADecoder(num_sms=NUM_SMS, planner="host")
        dec.plan(prob.cache_seqlens, num_heads_q=16)
        assert not fake_planner.calls and dec._info == PlanInfo(300, NUM_SMS)
        assert torch.equal(dec.tile_scheduler_metadata, planner.plan_default([100, 0, 300], NUM_SMS)[0])

    def test_failed_plan_leaves_the_decoder_as_it_was(self, fake_planner, fake_kernel):
        prob = make_decode_problem([100, 0, 300], h_q=16)
        dec = self.plan(prob)
        state = [t.clone() for t in self.buffers(dec)[:2]], dec._info, dec._planned
        too_many = mla.MLADecoder(num_sms=5000)
        with pytest.raises(ValueError, match="parts"):
            too_many.plan(prob.cache_seqlens, num_heads_q=16)
        assert too_many._planned is None and too_many.tile_scheduler_metadata is None
        host = mla.MLADecoder(num_sms=NUM_SMS, planner="host")
        host.plan(prob.cache_seqlens, num_heads_q=16)
        with pytest.raises(ValueError, match=r"cache_seqlens\[1\] = -4 is negative"):
            host.plan(torch.tensor([100, -4, 300], dtype=torch.int32), num_heads_q=16)
        assert host._info == PlanInfo(300, NUM_SMS)
        assert torch.equal(host.tile_scheduler_metadata, state[0][0])
        assert [torch.equal(a, b) for a, b in zip(self.buffers(dec)[:2], state[0])] == [True, True]
