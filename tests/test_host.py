"""CPU: the host path around the compiled launch.

- Checks cached per call signature: a repeated signature skips them, a new one (any shape, stride,
  dtype, device, scalar type or value, plan) gets every check, bad inputs still raise naming the
  argument, and the data-pointer alignment is tested on every call.
- ``torch.ops.mla.decode``: schema, fake implementation (FakeTensorMode and meta), eager calls,
  ``torch.library.opcheck``, and ``torch.compile(fullgraph=True)`` of functions calling the API.
"""
from __future__ import annotations

import dataclasses
import types

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import mla
import pipelines
from mla import api, validate
from mla.reference import mla_decode_reference
from mla.testing import make_decode_problem

NUM_SMS = 8


def problem(seqlens=(100, 0, 300), s_q=1, h_q=16, dtype=torch.bfloat16, seed=0):
    return make_decode_problem(list(seqlens), s_q=s_q, h_q=h_q, dtype=dtype, seed=seed)


@pytest.fixture
def counted(monkeypatch):
    """Counts the calls of ``validate.check_decode_inputs`` (the per-tensor checks)."""
    calls = []
    real = validate.check_decode_inputs

    def counting(*args, **kwargs):
        calls.append(args[0].shape if hasattr(args[0], "shape") else None)
        return real(*args, **kwargs)

    monkeypatch.setattr(validate, "check_decode_inputs", counting)
    return calls


def flash(prob, meta, splits, **kwargs):
    return mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, meta, splits,
                                      **kwargs)


# ------------------------------------------------------------------------ signature caches

class TestFlashSignatureCache:
    def test_repeated_signature_checks_once_and_launches_each_time(self, fake_kernel, counted):
        prob = problem()
        meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
        for _ in range(3):
            out, lse = flash(prob, meta, splits)
        assert len(counted) == 1 and len(fake_kernel.calls) == 3 and len(fake_kernel.configs) == 1
        torch.testing.assert_close(lse, mla_decode_reference(prob.q, prob.k_cache, prob.block_table,
                                                             prob.cache_seqlens)[1])
        # New tensors with the same signature: still one check.
        other = problem(seed=1)
        flash(other, meta, splits)
        assert len(counted) == 1 and fake_kernel.calls[-1]["q"] is other.q

    def test_every_part_of_the_signature_counts(self, fake_kernel, counted):
        prob = problem(s_q=2)
        meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 32, 1, num_sms=NUM_SMS)
        flash(prob, meta, splits)
        variants = [
            dict(causal=True),  # a scalar's value
            dict(softmax_scale=0.5),
            dict(softmax_scale=0.25),
            dict(out=torch.empty(3, 2, 16, 512, dtype=torch.bfloat16)),  # an optional tensor appears
            dict(pipeline="3wg"),
        ]
        for kwargs in variants:
            flash(prob, meta, splits, **kwargs)
        assert len(counted) == 1 + len(variants)
        # a stride change (same shape): q laid out with a padded last dim
        padded = torch.empty(3, 2, 16, 640, dtype=torch.bfloat16)[..., :576]
        padded.copy_(prob.q)
        mla.flash_mla_with_kvcache(padded, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, meta, splits)
        assert len(counted) == 2 + len(variants)

    @pytest.mark.parametrize("change, exc, match", [
        (dict(causal=1), TypeError, "causal must be a bool, got int"),  # 1 == True: the key has the type
        (dict(softmax_scale=True), TypeError, "softmax_scale must be a float or None, got bool"),
        (dict(softmax_scale=float("nan")), ValueError, "softmax_scale must be finite"),  # nan != nan
        (dict(head_dim_v=512.0), None, None),  # 512.0 == 512 and is accepted by the check: fine either way
        (dict(head_dim_v=True), ValueError, "head_dim_v must be 512"),
    ])
    def test_equal_but_different_scalars_are_checked(self, fake_kernel, change, exc, match):
        prob = problem()
        meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
        args = dict(causal=True, softmax_scale=1.0, head_dim_v=512)
        mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, args["head_dim_v"],
                                   meta, splits, args["softmax_scale"], args["causal"])
        args.update(change)
        call = lambda: mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table,  # noqa: E731
                                                  prob.cache_seqlens, args["head_dim_v"], meta, splits,
                                                  args["softmax_scale"], args["causal"])
        if exc is None:
            call()
        else:
            with pytest.raises(exc, match=match):
                call()

    def test_bad_inputs_raise_after_a_good_call_with_the_same_shapes(self, fake_kernel):
        prob = problem()
        meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
        flash(prob, meta, splits)
        launched = len(fake_kernel.calls)
        with pytest.raises(TypeError, match="k_cache must be bfloat16, got float16"):
            mla.flash_mla_with_kvcache(prob.q, prob.k_cache.half(), prob.block_table, prob.cache_seqlens, 512, meta,
                                       splits)
        with pytest.raises(ValueError, match="block_table must be on q's device cpu, got meta"):
            mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table.to("meta"), prob.cache_seqlens, 512,
                                       meta, splits)
        with pytest.raises(ValueError, match="block_table has 4 columns"):
            mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table[:, :4].contiguous(),
                                       prob.cache_seqlens, 512, meta, splits)
        with pytest.raises(TypeError, match="cache_seqlens must be a torch.Tensor, got list"):
            mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table, [100, 0, 300], 512, meta, splits)
        with pytest.raises(TypeError, match="num_splits must be a torch.Tensor"):
            flash(prob, meta, None)
        # The same metadata values in a copy lose the plan's host facts: checked again, and the
        # width check (which needs them) is skipped exactly as on the first call of such a copy.
        flash(prob, meta.clone(), splits)
        assert len(fake_kernel.calls) == launched + 1

    def test_compiled_refusals_get_the_api_message(self, fake_kernel, counted, monkeypatch):
        """A device or dtype the signature does not hold (here block_table's device) reaches the
        compiled function, whose argument check refuses it; the API then names it its own way."""
        prob = problem()
        meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
        flash(prob, meta, splits)
        with pytest.raises(ValueError, match="block_table must be on q's device cpu, got meta"):
            mla.flash_mla_with_kvcache(prob.q, prob.k_cache, prob.block_table.to("meta"), prob.cache_seqlens, 512,
                                       meta, splits)
        assert len(counted) == 2  # the cached check, then the diagnosis after the refusal
        # A refusal the API's checks cannot explain is passed on as it is.
        refusing = lambda *args: (_ for _ in ()).throw(ValueError("Mismatched Tensor on argument #5"))  # noqa: E731
        monkeypatch.setitem(api._FLASH_CALLS, next(iter(api._FLASH_CALLS)),
                            dataclasses.replace(next(iter(api._FLASH_CALLS.values())), launch=refusing))
        with pytest.raises(ValueError, match="Mismatched Tensor on argument #5"):
            flash(prob, meta, splits)

    def test_failed_checks_are_not_cached(self, fake_kernel, counted):
        prob = problem()
        meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
        for _ in range(2):
            with pytest.raises(ValueError, match="softmax_scale must be finite and > 0"):
                flash(prob, meta, splits, softmax_scale=-1.0)
        assert len(counted) == 2 and not fake_kernel.calls

    def test_alignment_is_tested_on_every_call(self, fake_kernel):
        prob = problem()
        meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
        n = prob.q.numel()
        base = torch.zeros(n + 8, dtype=torch.bfloat16)
        aligned = base[:n].view(prob.q.shape)
        shifted = base[1:n + 1].view(prob.q.shape)  # same shape and strides, 2 bytes off
        assert aligned.stride() == shifted.stride()
        mla.flash_mla_with_kvcache(aligned, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, meta, splits)
        with pytest.raises(ValueError, match="q must start at a 16-byte aligned address"):
            mla.flash_mla_with_kvcache(shifted, prob.k_cache, prob.block_table, prob.cache_seqlens, 512, meta, splits)
        out = torch.zeros(3 * 16 * 512 + 8, dtype=torch.bfloat16)[1:3 * 16 * 512 + 1].view(3, 1, 16, 512)
        with pytest.raises(ValueError, match="out must start at a 16-byte aligned address"):
            flash(prob, meta, splits, out=out)
        assert len(fake_kernel.calls) == 1

    def test_lazy_metadata_checks_its_plan_on_cached_calls(self, fake_kernel, counted):
        prob = problem(seqlens=(900, 5))
        sched, none = mla.get_mla_metadata(num_sms=NUM_SMS)
        flash(prob, sched, none)
        flash(prob, sched, none)
        assert len(counted) == 1 and len(fake_kernel.calls) == 2
        assert fake_kernel.calls[1]["tile_scheduler_metadata"] is sched.tile_scheduler_metadata
        with pytest.raises(ValueError, match="planned for causal = False, this call has True"):
            flash(prob, sched, none, causal=True)
        # A second plan object of the same configuration plans its own lengths.
        other, _ = mla.get_mla_metadata(num_sms=NUM_SMS)
        flash(problem(seqlens=(70, 3000)), other, None)
        assert other.info.max_seqlen == 3000 and sched.info.max_seqlen == 900

    def test_cache_is_bounded(self, fake_kernel, monkeypatch):
        monkeypatch.setattr(api, "_MAX_SIGNATURES", 3)
        prob = problem()
        meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
        for scale in (0.1, 0.2, 0.3, 0.4, 0.5):
            flash(prob, meta, splits, softmax_scale=scale)
            assert len(api._FLASH_CALLS) <= 3


class TestDecoderSignatureCache:
    def plan(self, prob, **kwargs):
        dec = mla.MLADecoder(num_sms=NUM_SMS)
        dec.plan(prob.cache_seqlens, num_heads_q=prob.q.shape[2], seq_len_q=prob.q.shape[1], **kwargs)
        return dec

    def test_run_checks_a_signature_once(self, fake_kernel, counted):
        prob = problem()
        dec = self.plan(prob)
        planned_checks = len(counted)  # plan() checks its configuration through meta tensors
        out = torch.empty(3, 1, 16, 512, dtype=torch.bfloat16)
        for _ in range(3):
            dec.run(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, out=out)
        assert len(counted) == planned_checks + 1 and len(fake_kernel.calls) == 3
        dec.run(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens)  # no out: another signature
        assert len(counted) == planned_checks + 2
        # plan() loads the kernel once; run() only launches.
        assert len(fake_kernel.configs) == 1

    def test_replan_checks_again(self, fake_kernel):
        prob = problem(seqlens=(100, 0, 300))
        dec = self.plan(prob)
        narrow = prob.block_table[:, :2].contiguous()  # 2 pages: enough for 100 tokens, not 300
        with pytest.raises(ValueError, match="block_table has 2 columns"):
            dec.run(prob.q, prob.k_cache, narrow, prob.cache_seqlens)
        short = problem(seqlens=(100, 0, 120))
        dec.plan(short.cache_seqlens, num_heads_q=16)
        dec.run(short.q, short.k_cache, short.block_table[:, :2].contiguous(), short.cache_seqlens)
        dec.plan(prob.cache_seqlens, num_heads_q=16)  # the long lengths again: the narrow table is refused
        with pytest.raises(ValueError, match="block_table has 2 columns"):
            dec.run(prob.q, prob.k_cache, narrow, prob.cache_seqlens)

    def test_bad_inputs_raise_after_a_good_call(self, fake_kernel):
        prob = problem()
        dec = self.plan(prob)
        dec.run(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens)
        with pytest.raises(TypeError, match="q must be bfloat16 or float16, got float32"):
            dec.run(prob.q.float(), prob.k_cache, prob.block_table, prob.cache_seqlens)
        with pytest.raises(ValueError, match="lse must be contiguous"):
            dec.run(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, lse=torch.empty(3, 16, 2)[..., :1])
        with pytest.raises(ValueError, match="h_q 32, but plan.. was made for 16"):
            other = problem(h_q=32)
            dec.run(other.q, other.k_cache, other.block_table, other.cache_seqlens)
        n = prob.q.numel()
        shifted = torch.zeros(n + 8, dtype=torch.bfloat16)[1:n + 1].view(prob.q.shape)
        with pytest.raises(ValueError, match="q must start at a 16-byte aligned address"):
            dec.run(shifted, prob.k_cache, prob.block_table, prob.cache_seqlens)
        assert len(fake_kernel.calls) == 1


def test_single_token_rows_must_merge_for_one_head():
    """h_q = 1, s_q > 1: the kernels step over tokens with stride(2); a view whose token stride is
    not that (a head sliced out of a wider tensor) is refused, naming the tensor."""
    prob = problem(s_q=2, h_q=1)
    wide = torch.zeros(3, 2, 4, 576, dtype=torch.bfloat16)
    sliced = wide[:, :, 1:2]
    assert sliced.stride(1) != sliced.stride(2)
    with pytest.raises(ValueError, match=r"q\[b\] must be viewable as \[s_q \* h_q, d\]"):
        validate.check_decode_inputs(sliced, prob.k_cache, prob.block_table, prob.cache_seqlens, device_type=None)
    validate.check_decode_inputs(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, device_type=None)


# ---------------------------------------------------------------------------- the custom op

def op_args(prob, meta, splits, *, out=None, lse=None, workspace=None, scale=0.05, causal=False, pipeline="2wg"):
    b, s_q, h_q, _ = prob.q.shape
    device = prob.q.device
    out = torch.empty(b, s_q, h_q, 512, dtype=prob.q.dtype, device=device) if out is None else out
    lse = torch.empty(b, h_q, s_q, device=device) if lse is None else lse
    if workspace is None:
        workspace = torch.zeros(pipelines.workspace_numel(b, meta.shape[0], s_q * h_q), device=device)
    return [prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, meta, splits, out, lse, workspace, scale,
            causal, pipeline]


def test_op_schema_declares_what_it_writes():
    schema = str(torch.ops.mla.decode.default._schema)
    assert schema.startswith("mla::decode(Tensor q, Tensor k_cache, Tensor block_table, Tensor cache_seqlens, "
                             "Tensor tile_scheduler_metadata, Tensor num_splits, Tensor(a")
    for name in ("out", "lse", "workspace"):
        assert f"!) {name}" in schema
    assert schema.endswith("float softmax_scale, bool causal, str pipeline) -> ()")


def test_op_fake_implementation_checks_shapes_without_launching(monkeypatch):
    """Under FakeTensorMode (what torch.compile traces with) the op runs its checks on fake CUDA
    tensors and launches nothing; a bad shape fails with the eager message."""
    launched = []
    monkeypatch.setattr(pipelines, "decode_launcher", lambda *a: launched.append(a))
    prob = problem(s_q=2)
    meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 32, 1, num_sms=NUM_SMS)
    def like(t, device="cuda"):  # a fake tensor of t's shape and dtype (no data, no GPU needed)
        return torch.empty(t.shape, dtype=t.dtype, device=device)

    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake = types.SimpleNamespace(**{name: like(getattr(prob, name))
                                        for name in ("q", "k_cache", "block_table", "cache_seqlens")})
        fmeta, fsplits = like(meta), like(splits)
        args = op_args(fake, fmeta, fsplits, causal=True)
        assert torch.ops.mla.decode(*args) is None
        bad = op_args(fake, fmeta, fsplits, out=torch.empty(3, 2, 16, 576, dtype=torch.bfloat16, device="cuda"))
        with pytest.raises(ValueError, match=r"out must have shape \[b, s_q, h_q, 512\]"):
            torch.ops.mla.decode(*bad)
        small = op_args(fake, fmeta, fsplits, workspace=torch.empty(100, device="cuda"))
        with pytest.raises(ValueError, match="workspace must be 1-D with at least"):
            torch.ops.mla.decode(*small)
        cpu = op_args(fake, fmeta, fsplits)
        cpu[0] = like(prob.q, "cpu")
        with pytest.raises(ValueError, match="q must be a CUDA tensor, got device cpu"):
            torch.ops.mla.decode(*cpu)
    assert not launched


def test_op_meta_tensors_pass_shape_checks():
    prob = problem()
    meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 16, 1, num_sms=NUM_SMS)
    for name in ("q", "k_cache", "block_table", "cache_seqlens"):
        setattr(prob, name, getattr(prob, name).to("meta"))
    args = op_args(prob, meta.to("meta"), splits.to("meta"))
    assert torch.ops.mla.decode(*args) is None
    args[4] = args[4][:, :7]
    with pytest.raises(ValueError, match=r"tile_scheduler_metadata must have shape \[num_parts >= 1, 8\]"):
        torch.ops.mla.decode(*args)


def test_op_eager_writes_out_and_lse(fake_kernel):
    prob = problem(seqlens=(700, 0, 5), s_q=2)
    meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 32, 1, num_sms=NUM_SMS)
    args = op_args(prob, meta, splits, causal=True, scale=576 ** -0.5)
    torch.ops.mla.decode(*args)
    torch.ops.mla.decode(*args)
    ref_out, ref_lse = mla_decode_reference(prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens, causal=True)
    torch.testing.assert_close(args[6].float(), ref_out, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(args[7], ref_lse)
    assert len(fake_kernel.calls) == 2 and len(fake_kernel.configs) == 1  # the second call: cached checks
    assert fake_kernel.calls[0]["workspace"] is args[8]
    with pytest.raises(ValueError, match="workspace must be 1-D with at least"):
        torch.ops.mla.decode(*op_args(prob, meta, splits, workspace=torch.empty(10)))
    with pytest.raises(ValueError, match="pipeline must be one of"):
        torch.ops.mla.decode(*op_args(prob, meta, splits, pipeline="fast"))
    ws = torch.zeros(pipelines.workspace_numel(3, meta.shape[0], 32) + 4)[1:]
    with pytest.raises(ValueError, match="workspace must start at a 16-byte aligned address"):
        torch.ops.mla.decode(*op_args(prob, meta, splits, workspace=ws))
    assert len(fake_kernel.calls) == 2


def test_opcheck(fake_kernel):
    """torch.library.opcheck: schema (declared mutations), autograd registration, fake tensor,
    AOT dispatch with dynamic shapes; the launch is the reference model (fake_kernel)."""
    prob = problem(seqlens=(100, 0, 300), s_q=2)
    prob.k_cache = torch.nan_to_num(prob.k_cache)
    meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 32, 1, num_sms=NUM_SMS)
    result = torch.library.opcheck(torch.ops.mla.decode.default, op_args(prob, meta, splits, causal=True))
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_step_calling_the_api_equals_eager(fake_kernel, backend):
    """A model step calling both entry points compiles with fullgraph=True (the API traces to
    torch.ops.mla.decode) and gives the eager result."""
    torch._dynamo.reset()
    prob = problem(seqlens=(100, 0, 300), s_q=2)
    meta, splits = mla.get_mla_metadata(prob.cache_seqlens, 32, 1, num_sms=NUM_SMS)
    dec = mla.MLADecoder(num_sms=NUM_SMS)
    dec.plan(prob.cache_seqlens, num_heads_q=16, seq_len_q=2, causal=True)

    def step(q, k_cache, block_table, cache_seqlens, out):
        o1, lse1 = mla.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, 512, meta, splits,
                                              causal=True)
        o2, lse2 = dec.run(q, k_cache, block_table, cache_seqlens, out=out)
        return o1.float() + o2.float(), lse1, lse2 + 0  # some math around the op calls

    args = (prob.q, prob.k_cache, prob.block_table, prob.cache_seqlens,
            torch.empty(3, 2, 16, 512, dtype=torch.bfloat16))
    want = step(*args)
    eager_calls = len(fake_kernel.calls)
    got = torch.compile(step, fullgraph=True, backend=backend)(*args)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert len(fake_kernel.calls) == 2 * eager_calls  # the compiled step launched both decodes
    # A bad input fails at trace time with the eager message.
    torch._dynamo.reset()
    with pytest.raises(Exception, match="block_table must be int32"):
        torch.compile(step, fullgraph=True, backend=backend)(prob.q, prob.k_cache, prob.block_table.long(),
                                                             prob.cache_seqlens, args[4])
