"""Public API on the CPU: pipeline flag, validation (each bad input gets its error), metadata forms,
and the glue to the compiled launch (``pipelines.decode_launcher``, through the ``fake_kernel``
fixture of conftest.py), including the per-signature check caches."""
from __future__ import annotations

import pytest
import torch

import mla
import pipelines
from mla import validate
from mla.api import PlanInfo
from mla.reference import mla_decode_reference
from mla.testing import make_decode_problem
from split_k import planner

NUM_SMS = 132


def problem(seqlens=(100, 0, 300), s_q=1, h_q=16, h_kv=1, page_size=64, dtype=torch.bfloat16, seed=0):
    return make_decode_problem(list(seqlens), s_q=s_q, h_q=h_q, h_kv=h_kv, page_size=page_size, dtype=dtype,
                               seed=seed)


def valid_args(prob):
    """Positional arguments of check_decode_inputs for a valid call."""
    return [prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, None, False]


# ----------------------------------------------------------------------------------- pipeline flag

class TestPipelineFlag:
    def test_auto_defaults_to_2wg(self, monkeypatch):
        monkeypatch.delenv("MLA_PIPELINE", raising=False)
        assert mla.resolve_pipeline("auto") == "2wg" == mla.resolve_pipeline()

    def test_env_var_overrides_auto_only(self, monkeypatch):
        monkeypatch.setenv("MLA_PIPELINE", "3wg")
        assert mla.resolve_pipeline("auto") == "3wg"
        assert mla.resolve_pipeline("2wg") == "2wg"

    def test_env_var_auto_or_empty_means_default(self, monkeypatch):
        for value in ("auto", "", " "):
            monkeypatch.setenv("MLA_PIPELINE", value)
            assert mla.resolve_pipeline("auto") == "2wg"

    @pytest.mark.parametrize("name", ["4wg", "2WG", "", None, 2])
    def test_unknown_name_lists_choices(self, name, monkeypatch):
        monkeypatch.delenv("MLA_PIPELINE", raising=False)
        with pytest.raises(ValueError, match=r"pipeline must be one of \('auto', '2wg', '3wg', 'seesaw'\)"):
            mla.resolve_pipeline(name)

    def test_unknown_env_value_names_the_variable(self, monkeypatch):
        monkeypatch.setenv("MLA_PIPELINE", "fast")
        with pytest.raises(ValueError, match=r"MLA_PIPELINE must be one of \('2wg', '3wg', 'seesaw'\)"):
            mla.resolve_pipeline("auto")

    def test_missing_kernel_raises_not_implemented_everywhere(self, no_kernel):
        prob = problem()
        meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
        for variant in ("auto", "2wg", "3wg"):
            name = "2wg" if variant == "auto" else variant
            with pytest.raises(NotImplementedError, match=f"pipeline '{name}' has no kernel yet.*none"):
                mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, meta,
                                           splits, pipeline=variant)
            with pytest.raises(NotImplementedError, match=f"pipeline '{name}' has no kernel yet"):
                mla.MLADecoder(pipeline=variant, num_sms=NUM_SMS).plan(prob.cache_seqlens, num_heads_q=16)

    def test_missing_variant_names_the_available_ones(self, monkeypatch):
        monkeypatch.setattr(pipelines, "available_variants", lambda: ["2wg"])
        with pytest.raises(NotImplementedError, match=r"'3wg' has no kernel yet.*\('2wg',\)"):
            mla.MLADecoder("3wg").plan(torch.zeros(1, dtype=torch.int32), num_heads_q=16)

    def test_unknown_pipeline_rejected_before_anything_else(self, fake_kernel):
        with pytest.raises(ValueError, match="pipeline must be one of"):
            mla.flash_mla_with_kvcache(None, None, None, None, 512, None, None, pipeline="turbo")
        with pytest.raises(ValueError, match="pipeline must be one of"):
            mla.MLADecoder(pipeline="turbo")


# ------------------------------------------------------------------------ auto: the table's choice

def entry(winner, *, page=64, s_q=1, h_q=16, h_kv=1, b=3, cap=320):
    return {"key": [page, s_q, h_q, h_kv, b, cap], "pipeline": winner, "geomean_us": {}, "configs": 1}


@pytest.fixture
def table(monkeypatch):
    """Substitutes the committed auto table (``pipelines.auto_table.ENTRIES``) for a test."""
    from pipelines import auto, auto_table

    def use(*entries):
        monkeypatch.setattr(auto_table, "ENTRIES", sorted(entries, key=lambda e: e["key"]))
        mla.api.clear_caches()

    yield use
    auto.clear_caches()


def widened(prob, columns):
    """prob with its block_table padded to ``columns`` columns (unused slots: never read)."""
    extra = columns - prob.block_table.shape[1]
    prob.block_table = torch.cat([prob.block_table, prob.block_table[:, :1].expand(-1, extra)], 1).contiguous()
    return prob


class TestAutoResolution:
    # problem(): b 3, page 64, s_q 1, h_q 16, longest request 300 keys: block_table 5 columns, capacity 320.
    # fake_kernel: 2wg serves every page size, 3wg only 64.

    def test_resolve_pipeline_reads_the_table_for_a_shape(self, fake_kernel, table):
        table(entry("3wg"), entry("2wg", cap=4096))
        resolve = mla.resolve_pipeline
        shape = dict(page_size=64, seq_len_q=1, num_heads_q=16, num_heads_k=1, batch_size=3)
        assert resolve("auto", **shape, max_pages=5) == "3wg"
        assert resolve("auto", **shape, max_pages=64) == "2wg"  # capacity 4096
        assert resolve("auto", **shape) == "3wg"  # width unknown: the first of the equally near keys
        assert resolve("auto") == "2wg"  # no shape: the default
        assert resolve("2wg", **shape, max_pages=5) == "2wg"  # a name is a name
        # page 16: 3wg does not serve it (here), so auto runs the variant that does
        assert resolve("auto", **dict(shape, page_size=16), max_pages=20) == "2wg"

    def test_env_var_takes_precedence_over_the_table(self, fake_kernel, table, monkeypatch):
        table(entry("3wg"))
        prob = problem()
        meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
        monkeypatch.setenv("MLA_PIPELINE", "2wg")
        assert mla.resolve_pipeline("auto", page_size=64, num_heads_q=16, batch_size=3, max_pages=5) == "2wg"
        mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, meta, splits)
        dec = mla.MLADecoder(num_sms=NUM_SMS)
        assert dec.variant == "2wg"
        dec.plan(prob.cache_seqlens, num_heads_q=16)
        dec.run(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens)
        monkeypatch.delenv("MLA_PIPELINE")  # the same signature without the variable: the table's choice
        mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, meta, splits)
        assert [c["variant"] for c in fake_kernel.calls] == ["2wg", "2wg", "3wg"]
        # The variable names a variant that does not serve the page size: an error, not a fallback.
        monkeypatch.setenv("MLA_PIPELINE", "3wg")
        small = problem(page_size=16)
        meta16, splits16 = mla.get_mla_metadata(small.cache_seqlens, 16, 1, num_sms=NUM_SMS)
        with pytest.raises(ValueError, match="page_size"):
            mla.flash_mla_with_kvcache(small.q, small.k_cache, small.block_table, small.cache_seqlens, 512, meta16,
                                       splits16)

    def test_flash_call_runs_the_choice_for_its_shape(self, fake_kernel, table, monkeypatch):
        table(entry("3wg"), entry("2wg", cap=4096))
        from pipelines import auto
        looked_up = []
        choose = auto.choose
        monkeypatch.setattr(auto, "choose", lambda *a, **k: (looked_up.append(a), choose(*a, **k))[1])
        prob = problem()
        meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
        for _ in range(3):
            mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, meta, splits)
        assert len(looked_up) == 1  # once per signature: repeated calls are a dictionary lookup
        widened(prob, 64)  # capacity 4096
        mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, meta, splits)
        assert [c["variant"] for c in fake_kernel.calls] == ["3wg"] * 3 + ["2wg"]
        small = problem(page_size=16)  # 3wg does not serve page 16: auto runs 2wg
        meta16, splits16 = mla.get_mla_metadata(small.cache_seqlens, 16, 1, num_sms=NUM_SMS)
        mla.flash_mla_with_kvcache(small.q, small.k_cache, small.block_table, small.cache_seqlens, 512, meta16, splits16)
        assert fake_kernel.calls[-1]["variant"] == "2wg"
        lazy, none = mla.get_mla_metadata(num_sms=NUM_SMS)  # the lazy plan: the same choice
        prob = problem()
        mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, lazy, none)
        assert fake_kernel.calls[-1]["variant"] == "3wg"

    def test_decoder_loads_every_variant_auto_may_choose_and_picks_per_width(self, fake_kernel, table):
        table(entry("3wg"), entry("2wg", cap=4096), entry("3wg", h_q=128))
        prob = problem()
        dec = mla.MLADecoder(num_sms=NUM_SMS)
        assert dec.pipeline == "auto" and dec.variant is None
        dec.plan(prob.cache_seqlens, num_heads_q=16)
        assert dec.variants == ("2wg", "3wg")
        assert {c[0] for c in fake_kernel.configs} == {"2wg", "3wg"}  # both loaded by plan, none by run
        loaded = len(fake_kernel.configs)
        assert dec.variant_for(prob.block_table) == "3wg"
        out = torch.empty(3, 1, 16, 512, dtype=torch.bfloat16)
        dec.run(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, out=out)
        dec.run(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, out=out)
        wide = widened(problem(), 64)
        assert dec.variant_for(wide.block_table) == "2wg"
        _, lse = dec.run(wide.q, wide.k_cache, wide.block_table, wide.cache_seqlens, out=out)
        assert [c["variant"] for c in fake_kernel.calls] == ["3wg", "3wg", "2wg"]
        assert len(fake_kernel.configs) == loaded
        torch.testing.assert_close(lse, mla_decode_reference(prob.q, prob.k_cache, prob.block_table,
                                                             prob.cache_seqlens)[1])
        # Only one variant possible for the shape (here every key says 3wg for h_q 128): plan loads it alone.
        big = problem(h_q=128)
        dec.plan(big.cache_seqlens, num_heads_q=128)
        assert dec.variants == ("3wg",)
        # page 16: 3wg does not serve it; auto has only 2wg to load and run
        small = problem(page_size=16)
        dec.plan(small.cache_seqlens, num_heads_q=16, page_size=16)
        assert dec.variants == ("2wg",)
        dec.run(small.q, small.k_cache, small.block_table, small.cache_seqlens)
        assert fake_kernel.calls[-1]["variant"] == "2wg"
        # a named pipeline loads that variant only
        named = mla.MLADecoder("3wg", num_sms=NUM_SMS)
        named.plan(prob.cache_seqlens, num_heads_q=16)
        assert named.variants == ("3wg",) and named.variant_for(wide.block_table) == "3wg"

    def test_torch_op_resolves_auto_per_shape(self, fake_kernel, table):
        table(entry("3wg"), entry("2wg", cap=4096))
        prob = problem()
        meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
        b, s_q, h_q = 3, 1, 16

        def args(p):
            return [p.q, p.k_cache, p.block_table, p.cache_seqlens, meta, splits,
                    torch.empty(b, s_q, h_q, 512, dtype=torch.bfloat16), torch.empty(b, h_q, s_q),
                    torch.zeros(pipelines.workspace_numel(b, meta.shape[0], s_q * h_q)), 576 ** -0.5, False, "auto"]

        torch.ops.mla.decode(*args(prob))
        torch.ops.mla.decode(*args(widened(problem(), 64)))
        assert [c["variant"] for c in fake_kernel.calls] == ["3wg", "2wg"]

    @pytest.mark.parametrize("dynamic", [False, True])
    def test_compiled_calls_choose_when_they_run(self, fake_kernel, table, dynamic):
        """Under torch.compile a per-shape auto reaches torch.ops.mla.decode as "auto" and is chosen when
        the op runs, on the concrete shapes: the same choice as eager, also for a block table whose width
        is symbolic in the graph."""
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        table(entry("3wg"), entry("2wg", cap=4096))
        prob = problem()
        meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
        dec = mla.MLADecoder(num_sms=NUM_SMS)
        dec.plan(prob.cache_seqlens, num_heads_q=16)

        def step(q, k_cache, block_table, cache_seqlens):
            o1, _ = mla.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, 512, meta, splits)
            o2, _ = dec.run(q, k_cache, block_table, cache_seqlens)
            return o1.float() + o2.float()

        compiled = torch.compile(step, fullgraph=True, backend="eager")
        if dynamic:  # block_table's width a symbol in the graph (what an engine slicing it per step gets)
            torch._dynamo.mark_dynamic(prob.block_table, 1)
        compiled(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens)
        wide = widened(problem(), 64)
        compiled(wide.q, wide.k_cache, wide.block_table, wide.cache_seqlens)
        assert [c["variant"] for c in fake_kernel.calls] == ["3wg", "3wg", "2wg", "2wg"]
        # with the width symbolic, one graph serves both widths: the choice did not specialise it
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == (1 if dynamic else 2)
        torch._dynamo.reset()



# ------------------------------------------------------------------------------------ validation

def _noncontig_last(t):
    """Same values, stride 2 in the last dim."""
    wide = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    view = wide[..., ::2]
    view.copy_(t)
    return view


def _rows_not_mergeable(t):
    """[b, s_q, h_q, d] laid out as [b, h_q, s_q, d] in memory."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def _set(index, value):
    def mutate(args):
        args[index] = value(args) if callable(value) else value
    return mutate


Q, K, BT, SL, DV, SCALE, CAUSAL = range(7)
BAD_INPUTS = [
    # (id, mutation of the valid args, kwargs, exception, message pattern)
    ("q-not-tensor", _set(Q, lambda a: a[Q].tolist()), {}, TypeError, "q must be a torch.Tensor"),
    ("k-not-tensor", _set(K, None), {}, TypeError, "k_cache must be a torch.Tensor"),
    ("bt-not-tensor", _set(BT, [[0]]), {}, TypeError, "block_table must be a torch.Tensor"),
    ("sl-not-tensor", _set(SL, [1, 2, 3]), {}, TypeError, "cache_seqlens must be a torch.Tensor"),
    ("q-fp32", _set(Q, lambda a: a[Q].float()), {}, TypeError, "q must be bfloat16 or float16, got float32"),
    ("k-dtype", _set(K, lambda a: a[K].half()), {}, TypeError, "k_cache must be bfloat16, got float16"),
    ("bt-int64", _set(BT, lambda a: a[BT].long()), {}, TypeError, "block_table must be int32, got int64"),
    ("sl-int64", _set(SL, lambda a: a[SL].long()), {}, TypeError, "cache_seqlens must be int32, got int64"),
    ("q-3d", _set(Q, lambda a: a[Q][:, 0]), {}, ValueError, "q must be 4-D"),
    ("q-dim-512", _set(Q, lambda a: a[Q][..., :512]), {}, ValueError, "q's last dim must be 576"),
    ("q-batch-0", _set(Q, lambda a: a[Q][:0]), {}, ValueError, "batch size must be >= 1"),
    ("s_q-5", _set(Q, lambda a: a[Q].repeat(1, 5, 1, 1)), {}, ValueError, r"s_q \(dim 1\) must be in 1..4, got 5"),
    ("head_dim_v", _set(DV, 576), {}, ValueError, "head_dim_v must be 512, got 576"),
    ("head_dim_v-bool", _set(DV, True), {}, ValueError, "head_dim_v must be 512"),
    ("k-3d", _set(K, lambda a: a[K][:, :, 0]), {}, ValueError, "k_cache must be 4-D"),
    ("k-dim-512", _set(K, lambda a: a[K][..., :512]), {}, ValueError, "k_cache's last dim must be 576"),
    ("k-no-pages", _set(K, lambda a: a[K][:0]), {}, ValueError, "at least one page"),
    ("h_q-not-multiple", _set(K, lambda a: a[K].repeat(1, 1, 3, 1)), {}, ValueError,
     r"h_q \(16\) must be a positive multiple of k_cache's h_kv \(3\)"),
    ("h_q-256", _set(Q, lambda a: a[Q].repeat(1, 1, 16, 1)), {}, ValueError, "h_q / h_kv must be at most 128"),
    ("bt-1d", _set(BT, lambda a: a[BT][0]), {}, ValueError, r"block_table must have shape \[b=3, max_pages\]"),
    ("bt-rows", _set(BT, lambda a: a[BT][:2]), {}, ValueError, r"block_table must have shape \[b=3, max_pages\]"),
    ("sl-shape", _set(SL, lambda a: a[SL][:2]), {}, ValueError, r"cache_seqlens must have shape \[b\] = \(3,\)"),
    ("q-last-stride", _set(Q, lambda a: _noncontig_last(a[Q])), {}, ValueError, "q must be contiguous in its last dim"),
    ("k-last-stride", _set(K, lambda a: _noncontig_last(a[K])), {}, ValueError,
     "k_cache must be contiguous in its last dim"),
    ("bt-last-stride", _set(BT, lambda a: _noncontig_last(a[BT])), {}, ValueError,
     "block_table must be contiguous in its last dim"),
    ("sl-stride", _set(SL, lambda a: _noncontig_last(a[SL])), {}, ValueError,
     "cache_seqlens must be contiguous in its last dim"),
    ("q-rows", _set(Q, lambda a: _rows_not_mergeable(a[Q].repeat(1, 2, 1, 1))), {}, ValueError,
     r"q\[b\] must be viewable as \[s_q \* h_q, d\]"),
    ("scale-zero", _set(SCALE, 0.0), {}, ValueError, "softmax_scale must be finite and > 0, got 0.0"),
    ("scale-negative", _set(SCALE, -0.1), {}, ValueError, "softmax_scale must be finite and > 0"),
    ("scale-nan", _set(SCALE, float("nan")), {}, ValueError, "softmax_scale must be finite and > 0"),
    ("scale-inf", _set(SCALE, float("inf")), {}, ValueError, "softmax_scale must be finite and > 0"),
    ("scale-str", _set(SCALE, "0.1"), {}, TypeError, "softmax_scale must be a float or None, got str"),
    ("scale-bool", _set(SCALE, True), {}, TypeError, "softmax_scale must be a float or None, got bool"),
    ("causal-int", _set(CAUSAL, 1), {}, TypeError, "causal must be a bool, got int"),
    ("k-device", _set(K, lambda a: a[K].to("meta")), {}, ValueError, "k_cache must be on q's device cpu, got meta"),
    ("bt-device", _set(BT, lambda a: a[BT].to("meta")), {}, ValueError, "block_table must be on q's device"),
    ("sl-device", _set(SL, lambda a: a[SL].to("meta")), {}, ValueError, "cache_seqlens must be on q's device"),
    ("out-device", None, dict(out=torch.empty(3, 1, 16, 512, dtype=torch.bfloat16, device="meta")), ValueError,
     "out must be on q's device"),
    ("out-not-tensor", None, dict(out=[0]), TypeError, "out must be a torch.Tensor"),
    ("out-dtype", None, dict(out=torch.empty(3, 1, 16, 512)), TypeError, "out must be bfloat16, got float32"),
    ("out-shape", None, dict(out=torch.empty(3, 1, 16, 576, dtype=torch.bfloat16)), ValueError,
     r"out must have shape \[b, s_q, h_q, 512\] = \(3, 1, 16, 512\)"),
    ("out-last-stride", None, dict(out=_noncontig_last(torch.empty(3, 1, 16, 512, dtype=torch.bfloat16))),
     ValueError, "out must be contiguous in its last dim"),
    ("lse-dtype", None, dict(lse=torch.empty(3, 16, 1, dtype=torch.bfloat16)), TypeError,
     "lse must be float32, got bfloat16"),
    ("lse-shape", None, dict(lse=torch.empty(3, 1, 16)), ValueError, r"lse must have shape \[b, h_q, s_q\]"),
    ("lse-strided", None, dict(lse=torch.empty(3, 16, 2)[..., :1]), ValueError, "lse must be contiguous"),
]


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_each_bad_input_gets_its_error(case):
    _, mutate, kwargs, exc, match = case
    args = valid_args(problem())
    if mutate:
        mutate(args)
    with pytest.raises(exc, match=match):
        validate.check_decode_inputs(*args, device_type=None, **kwargs)


def test_out_rows_must_be_mergeable():
    prob = problem(s_q=2)
    out = _rows_not_mergeable(torch.empty(3, 2, 16, 512, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"out\[b\] must be viewable"):
        validate.check_decode_inputs(*valid_args(prob), out=out, device_type=None)


def test_valid_inputs_pass_and_describe_the_call():
    prob = problem(s_q=2, h_q=8)
    out = torch.empty(3, 2, 8, 512, dtype=torch.bfloat16)
    lse = torch.empty(3, 8, 2)
    shape = validate.check_decode_inputs(*valid_args(prob), out=out, lse=lse, device_type=None)
    assert (shape.batch_size, shape.s_q, shape.h_q, shape.h_kv, shape.page_size, shape.rows) == (3, 2, 8, 1, 64, 16)
    assert shape.softmax_scale == pytest.approx(576 ** -0.5) and shape.causal is False
    # fp16, s_q = 4, an explicit numpy-style real scale, h_q = 128 per kv head, all fine.
    prob = problem(s_q=4, h_q=128, dtype=torch.float16)
    validate.check_decode_inputs(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, 0.5, True,
                                 device_type=None)


def test_kernel_path_requires_cuda_tensors(fake_kernel, monkeypatch):
    monkeypatch.setattr(validate, "KERNEL_DEVICE_TYPE", "cuda")  # the real setting
    prob = problem()
    meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
    with pytest.raises(ValueError, match="q must be a CUDA tensor, got device cpu"):
        mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, meta, splits)
    with pytest.raises(ValueError, match="device must be a CUDA device, got cpu"):
        mla.MLADecoder(num_sms=NUM_SMS).plan(prob.cache_seqlens, num_heads_q=16)
    assert not fake_kernel.calls


# ------------------------------------------------------------------------------ get_mla_metadata

class TestGetMlaMetadata:
    def test_classic_form_matches_the_planner(self):
        prob = problem(seqlens=(100, 0, 3000, 64))
        meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 2 * 64, 1, num_sms=NUM_SMS)
        want_meta, want_splits = planner.plan_default([100, 0, 3000, 64], planner.num_sm_parts(NUM_SMS, 128, 1))
        assert meta.dtype == splits.dtype == torch.int32
        assert meta.shape == (66, 8) and torch.equal(meta, want_meta) and torch.equal(splits, want_splits)
        assert meta.device == prob.cache_seqlens.device
        assert meta._mla_plan_info == PlanInfo(max_seqlen=3000, num_parts=66)

    def test_no_arguments_gives_the_lazy_form(self):
        sched, none = mla.get_mla_metadata()
        assert isinstance(sched, mla.MLASchedMeta) and none is None and not sched.have_initialized

    def test_partial_arguments_rejected(self):
        with pytest.raises(TypeError, match="either no positional arguments"):
            mla.get_mla_metadata(torch.zeros(2, dtype=torch.int32), 16)

    def test_cpu_lengths_need_num_sms(self):
        with pytest.raises(ValueError, match="num_sms is required"):
            mla.get_mla_metadata(torch.zeros(2, dtype=torch.int32), 16, 1)

    @pytest.mark.parametrize("kwargs, exc, match", [
        (dict(cache_seqlens=torch.zeros(2, dtype=torch.int64)), TypeError, "cache_seqlens must be int32"),
        (dict(cache_seqlens=torch.zeros(2, 1, dtype=torch.int32)), ValueError, "cache_seqlens must be 1-D"),
        (dict(cache_seqlens=torch.tensor([4, -3], dtype=torch.int32)), ValueError, r"cache_seqlens\[1\] = -3 is negative"),
        (dict(num_heads_per_head_k=0), ValueError, "num_heads_per_head_k must be a positive int"),
        (dict(num_heads_k=1.0), ValueError, "num_heads_k must be a positive int"),
        (dict(num_sms=0), ValueError, "num_sms must be a positive int"),
    ])
    def test_bad_arguments(self, kwargs, exc, match):
        args = dict(cache_seqlens=torch.zeros(2, dtype=torch.int32), num_heads_per_head_k=16, num_heads_k=1,
                    num_sms=NUM_SMS)
        args.update(kwargs)
        with pytest.raises(exc, match=match):
            mla.get_mla_metadata(**args)


# ------------------------------------------------------------------- kernel path, with a fake kernel

@pytest.mark.parametrize("s_q, h_q, causal", [(1, 16, False), (2, 64, True), (4, 3, True)])
def test_flash_mla_with_kvcache_end_to_end(fake_kernel, s_q, h_q, causal):
    prob = problem(seqlens=(700, 0, 2, 1500), s_q=s_q, h_q=h_q)
    meta, splits = mla.get_mla_metadata(prob.cache_seqlens, s_q * h_q, 1, num_sms=NUM_SMS)
    out, lse = mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, meta,
                                          splits, causal=causal)
    ref_out, ref_lse = mla_decode_reference(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens,
                                            causal=causal)
    assert out.dtype == torch.bfloat16 and out.shape == (4, s_q, h_q, 512) and lse.shape == (4, h_q, s_q)
    torch.testing.assert_close(out.float(), ref_out, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse, ref_lse)
    (call,) = fake_kernel.calls
    parts = meta.shape[0]
    assert call["variant"] == "2wg" and call["tile_scheduler_metadata"] is meta and call["num_splits"] is splits
    assert call["o_accum"].shape == (4 + parts, s_q * h_q, 512) and call["o_accum"].dtype == torch.float32
    assert call["lse_accum"].shape == (4 + parts, s_q * h_q) and call["lse_accum"].dtype == torch.float32
    assert call["softmax_scale"] == pytest.approx(576 ** -0.5) and call["causal"] is causal


def test_flash_mla_writes_into_given_out_and_passes_scale(fake_kernel):
    prob = problem()
    meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
    out = torch.empty(3, 1, 16, 512, dtype=torch.bfloat16)
    got, _ = mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, meta,
                                        splits, 0.25, False, pipeline="3wg", out=out)
    assert got is out
    assert fake_kernel.calls[0]["variant"] == "3wg" and fake_kernel.calls[0]["softmax_scale"] == 0.25


def test_env_var_picks_the_variant_for_auto(fake_kernel, monkeypatch):
    monkeypatch.setenv("MLA_PIPELINE", "3wg")
    prob = problem()
    meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
    mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, meta, splits)
    assert fake_kernel.calls[0]["variant"] == "3wg"


def test_lazy_metadata_is_planned_on_first_use_and_checked_after(fake_kernel):
    prob = problem(seqlens=(900, 5))
    sched, none = mla.get_mla_metadata(num_sms=NUM_SMS)
    out, lse = mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512,
                                          sched, none)
    assert sched.have_initialized
    want_meta, want_splits = planner.plan_default([900, 5], NUM_SMS)
    assert torch.equal(sched.tile_scheduler_metadata, want_meta) and torch.equal(sched.num_splits, want_splits)
    torch.testing.assert_close(lse, mla_decode_reference(prob.q, prob.k_cache, prob.block_table,
                                                         prob.cache_seqlens)[1])
    mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, sched, None)
    assert fake_kernel.calls[1]["tile_scheduler_metadata"] is sched.tile_scheduler_metadata
    with pytest.raises(ValueError, match="planned for causal = False, this call has True"):
        mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, sched, None,
                                   causal=True)
    other = problem(seqlens=(900, 5), h_q=32)
    with pytest.raises(ValueError, match="planned for h_q = 16, this call has 32"):
        mla.flash_mla_with_kvcache(other.q, other.k_cache, other.block_table, other.cache_seqlens, 512, sched, None)
    with pytest.raises(ValueError, match="num_splits must be None"):
        mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, sched,
                                   sched.num_splits)


class TestKernelPathErrors:
    """Checks that need the pipeline or the plan, each before any launch."""

    def call(self, prob, meta=None, splits=None, **kwargs):
        if meta is None:
            meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
        return mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, meta,
                                          splits, **kwargs)

    def test_unsupported_page_size(self, fake_kernel):
        with pytest.raises(ValueError, match=r"page_size \(k_cache.shape\[1\]\) is 16; pipeline '3wg' supports "
                                             r"page sizes \(64,\)"):
            self.call(problem(page_size=16), pipeline="3wg")
        with pytest.raises(ValueError, match=r"page_size \(k_cache.shape\[1\]\) is 3; pipeline '2wg' supports "
                                             r"page sizes \(1, 2, 4, 8, 16, 32, 64, 128\)"):
            self.call(problem(page_size=3))
        self.call(problem(page_size=16))  # 2wg's loaders take 16
        assert not any(c["variant"] == "3wg" for c in fake_kernel.calls)

    @pytest.mark.parametrize("h_kv, h_q, s_q", [(2, 16, 1), (3, 9, 2), (8, 64, 4)])
    def test_multiple_kv_heads_reach_the_kernel(self, fake_kernel, h_kv, h_q, s_q):
        prob = problem(seqlens=(100, 0, 900), s_q=s_q, h_q=h_q, h_kv=h_kv)
        meta, splits = mla.get_mla_metadata(prob.cache_seqlens, s_q * h_q // h_kv, h_kv, num_sms=NUM_SMS)
        out, lse = self.call(prob, meta, splits, causal=True)
        ref_out, ref_lse = mla_decode_reference(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens,
                                                causal=True)
        torch.testing.assert_close(out.float(), ref_out, atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(lse, ref_lse)
        # The workspace holds every kv head's rows in out's row order (s_idx * h_q + head).
        call = fake_kernel.calls[-1]
        assert call["o_accum"].shape == (3 + meta.shape[0], s_q * h_q, 512)
        assert call["lse_accum"].shape == (3 + meta.shape[0], s_q * h_q)

    def test_block_table_too_narrow_for_planned_lengths(self, fake_kernel):
        prob = problem(seqlens=(100, 0, 300))  # 300 tokens need 5 pages of 64
        prob.block_table = prob.block_table[:, :4].contiguous()
        with pytest.raises(ValueError, match=r"block_table has 4 columns but the longest sequence \(300 tokens, "
                                             r"page_size 64\) needs 5"):
            self.call(prob)
        assert not fake_kernel.calls

    @pytest.mark.parametrize("change, exc, match", [
        (lambda m, s: (m.long(), s), TypeError, "tile_scheduler_metadata must be int32"),
        (lambda m, s: (m, s.long()), TypeError, "num_splits must be int32"),
        (lambda m, s: (m[:, :7], s), ValueError, r"tile_scheduler_metadata must have shape \[num_parts >= 1, 8\]"),
        (lambda m, s: (m[:0], s), ValueError, r"tile_scheduler_metadata must have shape \[num_parts >= 1, 8\]"),
        (lambda m, s: (m, s[:-1]), ValueError, r"num_splits must have shape \[b \+ 1\] = \(4,\)"),
        (lambda m, s: (m.to("meta"), s), ValueError, "tile_scheduler_metadata must be on q's device cpu"),
        (lambda m, s: (m, s.to("meta")), ValueError, "num_splits must be on q's device cpu"),
        (lambda m, s: (m.t().contiguous().t(), s), ValueError, "tile_scheduler_metadata must be contiguous"),
        (lambda m, s: (m, None), TypeError, "num_splits must be a torch.Tensor"),
    ])
    def test_bad_metadata(self, fake_kernel, change, exc, match):
        prob = problem()
        meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
        with pytest.raises(exc, match=match):
            self.call(prob, *change(meta, splits))
        assert not fake_kernel.calls

    def test_copied_metadata_still_works_without_plan_info(self, fake_kernel):
        # As in a CUDA-graph setup that copies the plan into static buffers: the width check needs
        # the planned lengths and is skipped, everything else still runs.
        prob = problem()
        meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
        out, lse = self.call(prob, meta.clone(), splits.clone())
        torch.testing.assert_close(lse, mla_decode_reference(prob.q, prob.k_cache, prob.block_table,
                                                             prob.cache_seqlens)[1])


# -------------------------------------------------------------------------------------- MLADecoder

class TestMLADecoder:
    def plan(self, prob, dec=None, **kwargs):
        dec = dec or mla.MLADecoder(num_sms=NUM_SMS)
        args = dict(num_heads_q=prob.q.shape[2], seq_len_q=prob.q.shape[1], page_size=prob.k_cache.shape[1],
                    dtype=prob.q.dtype)
        args.update(kwargs)
        dec.plan(prob.cache_seqlens, **args)
        return dec

    def test_plan_then_run_matches_reference(self, fake_kernel):
        prob = problem(seqlens=(700, 0, 3, 1500), s_q=2, h_q=16)
        dec = self.plan(prob, causal=True)
        out = torch.empty(4, 2, 16, 512, dtype=torch.bfloat16)
        got_out, lse = dec.run(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, out=out)
        ref_out, ref_lse = mla_decode_reference(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens,
                                                causal=True)
        assert got_out is out
        torch.testing.assert_close(out.float(), ref_out, atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(lse, ref_lse)
        call = fake_kernel.calls[0]
        assert call["tile_scheduler_metadata"] is dec.tile_scheduler_metadata and call["causal"] is True
        assert call["o_accum"].shape == (4 + dec.tile_scheduler_metadata.shape[0], 32, 512)

    def test_run_reuses_plan_buffers(self, fake_kernel):
        prob = problem()
        dec = self.plan(prob)
        out = torch.empty(3, 1, 16, 512, dtype=torch.bfloat16)
        _, lse1 = dec.run(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, out=out)
        _, lse2 = dec.run(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, out=out)
        assert lse1 is lse2  # the decoder's own lse buffer when none is given
        a, b = fake_kernel.calls
        for key in ("workspace", "tile_scheduler_metadata", "num_splits", "lse"):
            assert a[key] is b[key]
        my_lse = torch.empty(3, 16, 1)
        assert dec.run(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, out=out, lse=my_lse)[1] is my_lse

    def test_replan_keeps_buffer_addresses_for_graph_replay(self, fake_kernel):
        prob = problem(seqlens=(100, 0, 300))
        dec = self.plan(prob)
        buffers = [dec.tile_scheduler_metadata, dec.num_splits, dec._workspace, dec._lse]
        ptrs = [t.data_ptr() for t in buffers]
        new = problem(seqlens=(4000, 10, 1))
        self.plan(new, dec)
        assert [t.data_ptr() for t in (dec.tile_scheduler_metadata, dec.num_splits, dec._workspace,
                                       dec._lse)] == ptrs
        assert torch.equal(dec.tile_scheduler_metadata, planner.plan_default([4000, 10, 1], NUM_SMS)[0])
        out, lse = dec.run(new.q, new.k_cache, new.block_table, new.cache_seqlens)
        torch.testing.assert_close(lse, mla_decode_reference(new.q, new.k_cache, new.block_table,
                                                             new.cache_seqlens)[1])
        self.plan(problem(seqlens=(5, 5)), dec)  # another batch size: new buffers
        assert dec._workspace.shape[0] == pipelines.workspace_numel(2, NUM_SMS, 16)

    def test_run_before_plan(self, fake_kernel):
        prob = problem()
        with pytest.raises(RuntimeError, match="before plan"):
            mla.MLADecoder().run(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens)

    @pytest.mark.parametrize("other, match", [
        (dict(seqlens=(100, 0)), "batch size 2, but plan.. was made for 3"),
        (dict(s_q=2), "s_q 2, but plan.. was made for 1"),
        (dict(h_q=32), "h_q 32, but plan.. was made for 16"),
        (dict(h_kv=2), "h_kv 2, but plan.. was made for 1"),
        (dict(page_size=16), "page_size 16, but plan.. was made for 64"),
        (dict(dtype=torch.float16), "dtype torch.float16, but plan.. was made for torch.bfloat16"),
    ])
    def test_run_must_match_plan(self, fake_kernel, other, match):
        dec = self.plan(problem())
        prob = problem(**other)
        with pytest.raises(ValueError, match=match):
            dec.run(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens)
        assert not fake_kernel.calls

    def test_run_must_match_planned_device(self, fake_kernel, monkeypatch):
        dec = self.plan(problem())
        monkeypatch.setattr(validate, "KERNEL_DEVICE_TYPE", None)  # let meta tensors through to the plan check
        prob = problem()
        meta = [t.to("meta") for t in (prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens)]
        with pytest.raises(ValueError, match="device meta, but plan.. was made for cpu"):
            dec.run(*meta)

    def test_run_checks_block_table_width_against_planned_lengths(self, fake_kernel):
        prob = problem(seqlens=(100, 0, 300))
        dec = self.plan(prob)
        with pytest.raises(ValueError, match="block_table has 4 columns"):
            dec.run(prob.q, prob.k_cache, prob.block_table[:, :4].contiguous(), prob.cache_seqlens)

    def test_run_validates_inputs(self, fake_kernel):
        prob = problem()
        dec = self.plan(prob)
        with pytest.raises(TypeError, match="block_table must be int32"):
            dec.run(prob.q, prob.k_cache, prob.block_table.long(), prob.cache_seqlens)
        with pytest.raises(ValueError, match="out must have shape"):
            dec.run(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens,
                    out=torch.empty(3, 1, 16, 511, dtype=torch.bfloat16))

    @pytest.mark.parametrize("kwargs, exc, match", [
        (dict(num_heads_q=0), ValueError, "num_heads_q must be a positive int"),
        (dict(seq_len_q=5), ValueError, r"s_q \(dim 1\) must be in 1..4, got 5"),
        (dict(num_heads_q=256), ValueError, "h_q / h_kv must be at most 128"),
        (dict(num_heads_q=3, num_heads_k=2), ValueError, "multiple of"),
        (dict(page_size=0), ValueError, "page_size must be a positive int"),
        (dict(page_size=256), ValueError, "pipeline '2wg' supports page sizes"),
        (dict(dtype=torch.float32), TypeError, "q must be bfloat16 or float16"),
        (dict(dtype="bf16"), TypeError, "dtype must be a torch.dtype"),
        (dict(head_dim_v=128), ValueError, "head_dim_v must be 512"),
        (dict(softmax_scale=-1.0), ValueError, "softmax_scale must be finite and > 0"),
        (dict(causal=None), TypeError, "causal must be a bool"),
        (dict(device="meta"), ValueError, "device must be a CPU device, got meta"),
    ])
    def test_plan_rejects_bad_configuration(self, fake_kernel, kwargs, exc, match):
        with pytest.raises(exc, match=match):
            self.plan(problem(), **kwargs)

    @pytest.mark.parametrize("seqlens, exc, match", [
        (torch.tensor([5, -1], dtype=torch.int32), ValueError, r"cache_seqlens\[1\] = -1 is negative"),
        (torch.tensor([5, 1]), TypeError, "cache_seqlens must be int32"),
        ([5, 1], TypeError, "cache_seqlens must be a torch.Tensor"),
    ])
    def test_plan_rejects_bad_lengths(self, fake_kernel, seqlens, exc, match):
        with pytest.raises(exc, match=match):
            mla.MLADecoder(num_sms=NUM_SMS).plan(seqlens, num_heads_q=16)

    def test_plan_needs_num_sms_off_cuda(self, fake_kernel):
        with pytest.raises(ValueError, match="num_sms is required"):
            mla.MLADecoder().plan(torch.tensor([5], dtype=torch.int32), num_heads_q=16)


def test_kernel_alignment_is_checked():
    """A view that breaks the 16-byte alignment the kernels promise TMA is refused, naming the tensor."""
    import torch
    from mla import validate

    base = torch.zeros(4, 64, 1, 576, dtype=torch.bfloat16)
    validate.check_kernel_alignment("k_cache", base, 8)
    with pytest.raises(ValueError, match="k_cache must start at a 16-byte aligned address"):
        validate.check_kernel_alignment("k_cache", base.view(-1)[1:1 + 64 * 576].view(1, 64, 1, 576), 8)
    with pytest.raises(ValueError, match="q strides must be multiples of 8"):
        validate.check_kernel_alignment("q", torch.zeros(2, 1, 16, 580, dtype=torch.bfloat16)[..., :576], 8)


@pytest.mark.parametrize("cluster", ["4", "8"])
def test_split_cluster_plan_reaches_the_kernel(fake_kernel, monkeypatch, cluster):
    """MLA_SPLIT_CLUSTER: get_mla_metadata plans for the split cluster and the decode call launches the
    kernel built for it (the fake executes the plan in units of `cluster` tiles)."""
    monkeypatch.setenv("MLA_SPLIT_CLUSTER", cluster)
    prob = problem(seqlens=(700, 0, 2, 1500), s_q=2, h_q=16)
    meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 32, 1, num_sms=NUM_SMS)
    parts = planner.num_sm_parts(NUM_SMS, 32, 1)
    want_meta, want_splits = planner.plan_clustered([700, 0, 2, 1500], parts, int(cluster))
    assert torch.equal(meta, want_meta) and torch.equal(splits, want_splits)
    out, lse = mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, meta,
                                          splits, causal=True)
    ref_out, ref_lse = mla_decode_reference(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, causal=True)
    torch.testing.assert_close(out.float(), ref_out, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse, ref_lse)
    assert fake_kernel.split_clusters == [int(cluster)]
    dec = mla.MLADecoder(num_sms=NUM_SMS)
    dec.plan(prob.cache_seqlens, num_heads_q=16, seq_len_q=2, causal=True)
    assert torch.equal(dec.tile_scheduler_metadata, want_meta)
    out2, _ = dec.run(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens)
    assert torch.equal(out2, out) and fake_kernel.split_clusters[-1] == int(cluster)


def test_split_cluster_env_var_is_checked(fake_kernel, monkeypatch):
    monkeypatch.setenv("MLA_SPLIT_CLUSTER", "3")
    prob = problem()
    with pytest.raises(ValueError, match="MLA_SPLIT_CLUSTER must be"):
        mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)


def test_split_cluster_change_between_plan_and_call_is_refused(fake_kernel, monkeypatch):
    """Metadata planned without split clusters, then MLA_SPLIT_CLUSTER set before the decode call:
    the launch would read the plan in the wrong units, so the call says so instead (host plans and
    device plans alike carry the size they were made for)."""
    prob = problem(seqlens=(700, 0, 2, 1500))
    meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
    monkeypatch.setenv("MLA_SPLIT_CLUSTER", "8")
    with pytest.raises(ValueError, match="planned for split clusters of 1 and this call would launch 8"):
        mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, meta, splits)
    assert not fake_kernel.calls
    sched, _ = mla.get_mla_metadata(num_sms=NUM_SMS)
    monkeypatch.delenv("MLA_SPLIT_CLUSTER")
    mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, sched, None)
    monkeypatch.setenv("MLA_SPLIT_CLUSTER", "4")
    with pytest.raises(ValueError, match="planned for split clusters of 1 and this call would launch 4"):
        mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, sched, None)
