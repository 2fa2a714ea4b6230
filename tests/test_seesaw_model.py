"""A numerical model of the seesaw pipeline's per-iteration algebra (pipelines/variant_seesaw.py) and of
lazy rescaling (pipelines/softmax.py), checked against a plain softmax on the CPU.

The model keeps what the kernel keeps: one running max per row shared by the two warpgroups, a row
sum per warpgroup, O split in two column halves, P rounded to bf16 before each P.V, m1 = max(m0, rowmax
S1) computed by WG1 from WG0's m0 alone, P0 handed over only after m1 (its bf16 values rescaled to m1,
rounded again), the max moved only by more than ``LAZY_RESCALE_LOG2`` (log2 units), and a chunk that ends on an
iteration without t1.
"""
from __future__ import annotations

import math

import pytest
import torch

from pipelines.softmax import LAZY_RESCALE_LOG2

TILE = 64
LOG2E = math.log2(math.e)


def _lazy_max(m_prev, tile_scores, c):
    """The kernel's new max: max(m_prev, rowmax), kept at m_prev unless it grew by more than the
    threshold (in log2 units after the scale)."""
    m_new = torch.maximum(m_prev, tile_scores.max(dim=1).values)
    grew = (m_new - m_prev) * c > LAZY_RESCALE_LOG2  # NaN (-inf - -inf) compares False: stays -inf
    return torch.where(grew, m_new, m_prev)


def _safe(m):
    return torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)


def _probs(s, m, c):
    p = torch.exp2(s * c - (_safe(m) * c)[:, None])
    return p.to(torch.bfloat16).to(torch.float32), p.sum(dim=1)


def _factor(m_from, m_to, c):
    return torch.exp2(m_from * c - _safe(m_to) * c)


def _chunk_state(scores, v, scale):
    """(c, half, tiles, m, l0, l1, o_l, o_r) at a chunk's start: max -inf, row sums and O halves 0."""
    rows, keys = scores.shape
    half = v.shape[1] // 2
    return (scale * LOG2E, half, -(-keys // TILE), torch.full((rows,), -math.inf), torch.zeros(rows),
            torch.zeros(rows), torch.zeros(rows, half), torch.zeros(rows, half))


def _finish(l0, l1, o_l, o_r, m, c):
    """(out, lse) from the two warpgroups' row sums and O halves (a row that saw no key: 0, +inf)."""
    total = l0 + l1
    inv = torch.where(total > 0, 1.0 / total, torch.zeros_like(total))
    out = torch.cat([o_l, o_r], dim=1) * inv[:, None]
    lse = torch.where(total > 0, (_safe(m) * c + torch.log2(total)) / LOG2E, torch.full_like(total, math.inf))
    return out, lse


def seesaw_model(scores: torch.Tensor, v: torch.Tensor, scale: float):
    """(out, lse) of one chunk as the seesaw kernel computes it (the max-first order). ``scores``: raw QK
    [rows, keys] (-inf where masked), ``v``: [keys, 512]."""
    c, half, n_tiles, m, l0, l1, o_l, o_r = _chunk_state(scores, v, scale)
    for t0 in range(0, n_tiles, 2):
        t1 = t0 + 1
        s0 = scores[:, t0 * TILE:(t0 + 1) * TILE]
        v0 = v[t0 * TILE:(t0 + 1) * TILE]
        # WG0: m0 (published at once), P0 relative to m0, O_L to m0, O_L += P0.V_L(t0).
        m0 = _lazy_max(m, s0, c)
        f0 = _factor(m, m0, c)
        p0_fp32 = torch.exp2(s0 * c - (_safe(m0) * c)[:, None])
        p0 = p0_fp32.to(torch.bfloat16).to(torch.float32)
        l0 = l0 * f0 + p0_fp32.sum(dim=1)
        o_l = o_l * f0[:, None] + p0 @ v0[:, :half]
        # WG1 on m0 alone: its row sums to m0, then its own tile against m0 (m1), O_R from m to m1 in one
        # pass and O_R += P1.V_R(t1).
        l1 = l1 * f0
        if t1 < n_tiles:
            s1 = scores[:, t1 * TILE:(t1 + 1) * TILE]
            v1 = v[t1 * TILE:(t1 + 1) * TILE]
            m1 = _lazy_max(m0, s1, c)
            g1 = _factor(m0, m1, c)
            p1, sum1 = _probs(s1, m1, c)
            l1 = l1 * g1 + sum1
            o_r = o_r * (f0 * g1)[:, None] + p1 @ v1[:, half:]
        else:
            m1 = m0
            o_r = o_r * f0[:, None]
        # WG0 on m1: its sums and O_L to m1; P0 rescaled to m1 from its bf16 copy and rounded again for WG1
        # (the kernel clears S once P is in bf16, ``clear_p``).
        g = _factor(m0, m1, c)
        l0 = l0 * g
        o_l = o_l * g[:, None]
        p0_to_m1 = (p0 * g[:, None]).to(torch.bfloat16).to(torch.float32)
        # WG1: O_R += P0.V_R(t0); WG0: O_L += P1.V_L(t1).
        o_r = o_r + p0_to_m1 @ v0[:, half:]
        if t1 < n_tiles:
            o_l = o_l + p1 @ v1[:, :half]
        m = m1
    return _finish(l0, l1, o_l, o_r, m, c)


def plain_softmax(scores, v, scale):
    s = scores.double() * scale
    lse = torch.logsumexp(s, dim=1)
    p = torch.exp(s - lse[:, None]).nan_to_num(0.0)
    out = p @ v.double()
    return out.float(), torch.where(torch.isfinite(lse), lse, torch.full_like(lse, math.inf)).float()


PROFILES = {
    "flat": lambda j: 0.0,  # the max settles after the first tile
    "ramp": lambda j: 2.3 * j,  # rises ~2.3 (log2 units) per tile: moved every few tiles, kept between
    "odd_jumps": lambda j: 9.0 * j if j % 2 else 0.0,  # every t1 tile jumps past the threshold: m1 > m0
    "even_jumps": lambda j: 0.0 if j % 2 else 9.0 * j,  # every t0 tile jumps: m0 > m, WG1 catches up
}


@pytest.mark.parametrize("keys", [64, 100, 128, 320, 1000])  # odd and even tile counts, ragged tails
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_seesaw_model_matches_softmax(keys, profile):
    gen = torch.Generator().manual_seed(keys + len(profile))
    rows = 16
    scale = 576 ** -0.5
    c = scale * LOG2E
    scores = torch.randn(rows, keys, generator=gen) * 4
    for j in range(-(-keys // TILE)):
        scores[:, j * TILE:(j + 1) * TILE] += PROFILES[profile](j) / c  # offset of tile j, in log2 units
    pad = -(-keys // TILE) * TILE - keys
    scores = torch.cat([scores, torch.full((rows, pad), -math.inf)], dim=1)  # masked tail keys
    scores[3] = -math.inf  # a row that sees no key
    v = torch.randn(scores.shape[1], 512, generator=gen)
    v[keys:] = 0.0  # zeroed V rows past the end (zero_v_rows)
    out, lse = seesaw_model(scores, v, scale)
    ref_out, ref_lse = plain_softmax(scores, v, scale)
    assert torch.isfinite(out).all()
    assert torch.equal(out[3], torch.zeros(512)) and lse[3].item() == math.inf
    torch.testing.assert_close(out, ref_out, atol=2e-2, rtol=2e-2)  # P in bf16 (8 bits of mantissa)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-5)


def test_lazy_max_keeps_the_max_below_the_threshold_and_moves_it_above():
    c = 1.0
    m = torch.tensor([0.0, 0.0, -math.inf, -math.inf])
    tile = torch.tensor([[LAZY_RESCALE_LOG2 - 0.5], [LAZY_RESCALE_LOG2 + 0.5], [3.0], [-math.inf]])
    new = _lazy_max(m, tile, c)
    assert new.tolist() == [0.0, LAZY_RESCALE_LOG2 + 0.5, 3.0, -math.inf]
    # Probabilities against the kept (stale) max stay within 2^threshold.
    p, _ = _probs(tile[:1], new[:1], c)
    assert p.max().item() <= 2 ** LAZY_RESCALE_LOG2
