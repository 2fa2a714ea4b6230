"""Pure-Python model of the experimental seesaw2 kernel's synchronisation protocol (no GPU, no DSL):
``pipelines/variant_seesaw2.py`` (two warpgroups, per-box K barriers, refills by each column range's
last reader, QK of the next pair issued behind the P.V).

    python scripts/model_seesaw2_protocol.py [--runs N] [--seed S] [--form NAME ...]

Each warp of both warpgroups is a generator that mirrors the kernel's code path op for op (4 warps per
warpgroup; warp 0 of each is its TMA issuer): WG0 (Q and each chunk's first two tiles, QK of t0,
softmax, P0 into stage 0's RoPE block, P0.V_L(t0) RS, P1.V_L(t1) SS, QK of the next t0, refills of
V_L), WG1 (QK of t1, softmax against m0, P1 into the P tile, P1.V_R(t1) RS, P0.V_R(t0) SS, refills of
V_R + RoPE, QK of the next t1), the chunk end (SUM / INV) and WG1's last P1_FREE sync at exit. A
random scheduler interleaves the 8 warps one op at a time and TMA completions land at random later
steps (uniformly in even runs; in odd runs each warp and the TMA get a speed 0.01x-10x, so a warp far
behind its warpgroup, or late copies, are explored too). The primitives (MBarrier, NamedBarrier,
ProtocolError, the scheduler ``Sim.run``) are those of ``model_3wg_protocol.py``; this file adds what
seesaw2 needs:

- the 18 box barriers (stage s, box b; count 1: the issuer arrives with expect_tx, then issues the
  copy) waited with parity bits ph0 / ph1 per warp, flipped exactly where the kernel flips them (ph0
  after every pair, ph1 only when t1 existed), so a wait on a phase that a refill has already lapped
  blocks (or a stale one returns at once and the operand check sees the old tile);
- wgmma as a warpgroup operation whose retirement is per warp: the k-th wgmma of the 4 warps must be
  the same (kind, stage, box); it reads its smem operands from the first warp's issue, and a warp's
  ``wait_group`` retires only that warp's part (PTX defines retirement per executing thread), so a
  range is free only when every warp of the warpgroup has waited. The kernel therefore has all 4
  warps pass a warpgroup bar.sync (``wg_sync``) before warp 0 refills a range and before WG0's warps
  zero the tail rows of stage 0; ``assume:warpgroup-retire`` runs the same kernel under collective
  retirement, and ``broken:no-wg-sync`` (the kernel's first form, without the syncs) must be caught;
- data: every wgmma operand (sQ, stage s box b, the P0 region = stage 0 box 8, the P tile sP with P1,
  a warp's P registers) holds the tile / pair the code expects when issued; no TMA (checked at issue
  and at landing) or generic store (P0, P1, zero_v_rows) touches a buffer an unretired wgmma of
  either warpgroup reads; no register of an accumulator or of P is touched by the softmax while a
  wgmma uses it; every generic store into smem that a wgmma reads is followed by the writer's
  ``fence.proxy.async`` before the read; the m0 / m1 / row-sum / 1/rowsum slots read hold this
  pair's / chunk's values (per warp: a warp of one warpgroup reads the rows the same warp of the
  other wrote);
- named barriers (256 threads: SCALE0, SCALE1, P0_READY, ISSUED, P1_FREE, SUM, INV; 128: WG0 / WG1 in
  zero_v_rows): beside the base checks, one arrival per warp per phase, and every arrival of a phase
  for the same pair / chunk (P1_FREE: WG0's arrive after pair p is what WG1 syncs before the pair
  after p; WG0's pre-arrive pairs WG1's first sync, WG1's exit sync pairs WG0's last arrive);
- Q: a one-stage pipeline (full: 1 arrive + tx; empty: all 8 warps release after their pair loop);
  WG0's warp 0 reloads Q and the chunk's first tiles after ``producer_acquire``;
- termination: no deadlock, no named-barrier arrival pending at exit, every mbarrier phase complete,
  every wgmma retired, no unfenced store left.

Result (the kernel as written): every scenario passes. P1_FREE turns out redundant: SCALE0 already
orders WG1's P1 store after WG0's P.V of the previous P1 retired (forms ``p1-store-before-p1-free``,
``no-p1-free`` pass too). Without the warpgroup syncs (``broken:no-wg-sync``) the four refills, WG0's
zero_v_rows of stage 0 and the box phases (a lagging warp's wait lapped by warp 0's refill: deadlock)
race under per-warp retirement.

Not modelled: the per-page copies of a box (one copy per box: the pages of a box all complete on its
barrier with the box's total bytes, so the barrier's behaviour is the same), multicast and split
clusters (the kernel runs neither), the numerics (``tests/test_seesaw_model.py``), L2 hints, the
causal mask, what lies in the rows zero_v_rows clears (a zeroed box is tagged, not its rows).
"""
from __future__ import annotations

import argparse
import importlib.util
import pathlib
import random
import sys

_spec = importlib.util.spec_from_file_location(
    "model_3wg_protocol", pathlib.Path(__file__).resolve().parent / "model_3wg_protocol.py")
base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base)
ProtocolError = base.ProtocolError

WG_WARPS = 4
BLOCK_N = 64
N_BOXES = 9
V_L_BOXES = (0, 1, 2, 3)  # columns 0..255
V_R_BOXES = (4, 5, 6, 7)  # columns 256..511 (what P.V_R reads; WG1 waits on these of stage 0)
V_R_ROPE_BOXES = (4, 5, 6, 7, 8)  # + the RoPE block 512..575 (stage 0's holds P0)
ALL_BOXES = tuple(range(N_BOXES))
WG1_QK_ORDER = V_R_ROPE_BOXES + V_L_BOXES
# variant_seesaw2.Bar (SUM and INV are variant_seesaw's, whose finish_chunk seesaw2 reuses)
SCALE0, SCALE1, P0_READY, P1_FREE, WG0_BAR, WG1_BAR, SUM, INV, ISSUED = range(1, 10)
BAR_NAMES = {SCALE0: "SCALE0", SCALE1: "SCALE1", P0_READY: "P0_READY", ISSUED: "ISSUED", P1_FREE: "P1_FREE",
             WG0_BAR: "WG0", WG1_BAR: "WG1", SUM: "SUM", INV: "INV"}

# form name -> changes to the kernel as written (none: the kernel). ``catch``: which chunks make the
# form observable, a predicate of (tiles, last tile is a tail t0); a scenario with such a chunk must
# report an error, one without must pass. None: the form must pass everywhere.
FORMS = {
    # The kernel as written, under the stronger of the two wgmma models: a warp's wait_group retires only
    # that warp's part (PTX defines retirement per executing thread), with the kernel's warpgroup
    # bar.sync (its WG0 / WG1 id, 128 threads) before warp 0's refills and before WG0's zeroing of stage 0.
    "seesaw2": dict(catch=None, per_warp_retire=True, wg_sync=True),
    # The same under collective retirement (a wgmma retires for the whole warpgroup at once).
    "assume:warpgroup-retire": dict(catch=None, wg_sync=True),
    # P1_FREE is implied by SCALE0: WG1 stores P1 after its SCALE0 sync, and WG0 arrives on SCALE0 only
    # after its P.V reading the previous P1 retired (wait_group(0) at the end of wg0_pv_t1; in the
    # first pair nothing has read sP). So WG1 storing P1 before its P1_FREE sync, or P1_FREE dropped
    # altogether, is still correct.
    "p1-store-before-p1-free": dict(catch=None, p1_before_free=True, per_warp_retire=True, wg_sync=True),
    "no-p1-free": dict(catch=None, no_p1_free=True, per_warp_retire=True, wg_sync=True),
    # Broken on purpose (the model must catch them):
    # WG1 refills stage 0's V_R + RoPE when its P.V of t1 retired, before its P.V of t0 (P0, V_R(t0)).
    "broken:early-stage0-refill": dict(catch=lambda n, tail_t0: n >= 3, early_stage0_refill=True, per_warp_retire=True, wg_sync=True),
    # WG0 refills stage 1's V_L right after issuing P1.V_L(t1), before waiting for it.
    "broken:early-stage1-refill": dict(catch=lambda n, tail_t0: n >= 4, early_stage1_refill=True, per_warp_retire=True, wg_sync=True),
    # WG0 skips the P1_FREE arrive in a pair without t1: WG1's next P1_FREE sync never completes.
    "broken:skip-p1-free-without-t1": dict(catch=lambda n, tail_t0: n % 2 == 1, skip_p1_free_no_t1=True, per_warp_retire=True, wg_sync=True),
    # WG1's QK of the next t1 waits with ph1 instead of ph1 ^ 1 (returns at once on the old phase).
    "broken:wg1-qk-stale-phase": dict(catch=lambda n, tail_t0: n >= 4, wg1_stale_phase=True, per_warp_retire=True, wg_sync=True),
    # WG0 hands P0 to WG1's SS wgmma without fence.proxy.async.
    "broken:no-p0-fence": dict(catch=lambda n, tail_t0: n >= 1, no_p0_fence=True, per_warp_retire=True, wg_sync=True),
    # Without the warpgroup bar.sync (the first form of the kernel): under per-warp retirement every
    # refill (issued by warp 0 after its own wait, n >= 3) and WG0's zero_v_rows of stage 0 (a tail t0:
    # each warp's stores vs. the other warps' QK(t0), with only SCALE0's arrive between) race.
    "broken:no-wg-sync": dict(catch=lambda n, tail_t0: n >= 3 or tail_t0, per_warp_retire=True),
}


class PairedBarrier(base.NamedBarrier):
    """``base.NamedBarrier`` plus pairing: one arrival per warp in a phase, every arrival of a phase for
    the same hand-off (tag)."""

    def __init__(self, bid):
        super().__init__(bid)
        self.name = BAR_NAMES[bid]  # what a deadlock report shows

    def arrive(self, actor, count, tag, wait, red=None):
        name = self.name
        for other, other_tag in self.tags:
            if other == actor:
                raise ProtocolError(f"named barrier {name}: {actor} arrives twice in one phase "
                                    f"({other_tag}, then {tag})")
            if other_tag != tag:
                raise ProtocolError(f"named barrier {name}: mixed phase: {actor} arrives for {tag}, "
                                    f"{other} for {other_tag}")
        return super().arrive(actor, count, tag, wait, red)


class Wgmma:
    """One wgmma (commit group) of a warpgroup: the k-th of every warp of it."""

    def __init__(self, wg, n, key):
        self.wg, self.n, self.key = wg, n, key
        self.name = f"WG{wg} wgmma #{n} {key}"
        self.issuers = set()
        self.reads = []  # (buffer, reader entry) registered so far
        self.retired = False

    def done(self, _parity):
        """A wait_group that retires it returns only once every warp of the warpgroup issued it."""
        return len(self.issuers) == WG_WARPS


def box_bufs(stage, box):
    """The buffers of one column box. Stage 0's RoPE box also holds P0, written by WG0's 4 warps (each
    its 16 query rows): it is 4 parts, which a TMA fills and QK reads all of."""
    if (stage, box) == (0, 8):
        return [("K", 0, 8, q) for q in range(WG_WARPS)]
    return [("K", stage, box)]


def wg_warps(wg):
    return frozenset(f"WG{wg}.w{k}" for k in range(WG_WARPS))


class SimSeesaw2(base.Sim):
    def __init__(self, chunks, rng, form: str = "seesaw2"):
        super().__init__(chunks, rng, racy=False)
        self.form = FORMS[form]
        self.q_full = base.MBarrier("Q full", 1)
        self.q_empty = base.MBarrier("Q empty", 2 * WG_WARPS)
        self.box = {(s, b): base.MBarrier(f"box[{s}][{b}]", 1) for s in range(2) for b in range(N_BOXES)}
        self.named = {bid: PairedBarrier(bid) for bid in BAR_NAMES}
        self.content = {"sQ": None}
        for s in range(2):
            for b in range(N_BOXES):
                for buf in box_bufs(s, b):
                    self.content[buf] = None
        for w in range(WG_WARPS):
            for slot in ("sP", "m0", "m1", "sum", "inv"):
                self.content[(slot, w)] = None
            for wg in range(2):
                for reg in ("acc_s", "acc_o", "rP"):  # registers of a warp (wgmma accumulators, P as A)
                    self.content[(reg, f"WG{wg}.w{w}")] = None
        self.readers = {k: set() for k in self.content}
        self.ops = {0: [], 1: []}
        self.wgmma_count = {}
        self.pending = {}  # actor -> its committed groups (op numbers) not yet waited for
        self.unfenced = {}  # smem buffer -> the warp whose generic store is not yet fenced
        self.seqlen = {r: seqlen for r, _, _, seqlen in chunks}

    # ------------------------------------------------------------------------------- primitives
    def tma(self, buffers, tag, bar):
        """An issuer's elected lane arrives with expect_tx, then issues the copy (lands later)."""
        bar.arrive(tag, tx=1)
        for buf in buffers:
            if self.readers[buf]:
                raise ProtocolError(f"TMA into {buf} ({tag}) issued while {sorted(self.readers[buf])} "
                                    f"still read it")
            if buf in self.unfenced:
                raise ProtocolError(f"TMA into {buf} ({tag}) issued over {self.unfenced[buf]}'s unfenced store")
        self.landings.append((tuple(buffers), tag, bar))

    def load_boxes(self, r, blk, stage, boxes):
        for b in boxes:
            self.tma(box_bufs(stage, b), ("K", r, blk), self.box[(stage, b)])

    def land(self, idx):
        buffers, tag, bar = self.landings.pop(idx)
        for buf in buffers:
            if self.readers[buf]:
                raise ProtocolError(f"TMA overwrites {buf} with {tag} while {sorted(self.readers[buf])} read it")
            self.content[buf] = tag
        bar.complete_tx()

    def wgmma(self, actor, wg, key, operands, regs=()):
        """Issue (and commit) one wgmma group. ``operands``: [(buffer, expected tag)]; ``regs``: the
        warp's accumulator registers it writes (in use until it retires)."""
        n = self.wgmma_count.get(actor, 0)
        self.wgmma_count[actor] = n + 1
        ops = self.ops[wg]
        if n == len(ops):
            ops.append(Wgmma(wg, n, key))
        op = ops[n]
        if op.key != key:
            raise ProtocolError(f"misaligned wgmma in WG{wg}: {actor}'s wgmma #{n} is {key}, "
                                f"another warp's is {op.key} (illegal instruction on the GPU)")
        if op.retired:
            raise ProtocolError(f"{actor} issues WG{wg} wgmma #{n} {key} after another warp saw it retire")
        op.issuers.add(actor)
        for buf, tag in operands:
            if self.content[buf] != tag:
                raise ProtocolError(f"{actor}: {key} reads {buf} holding {self.content[buf]}, expected {tag}")
            if buf in self.unfenced:
                raise ProtocolError(f"{actor}: {key} reads {buf} (async proxy) before {self.unfenced[buf]}'s "
                                    f"store to it was fenced (fence.proxy.async)")
        for buf in [b for b, _ in operands] + [(reg, actor) for reg in regs]:
            self.readers[buf].add((actor, n))
            op.reads.append((buf, (actor, n)))
        self.pending.setdefault(actor, []).append(n)

    def wait_group(self, actor, wg, keep):
        """wgmma.wait_group(keep): retire this warp's groups but the ``keep`` most recent."""
        groups = self.pending.get(actor, [])
        while len(groups) > keep:
            op = self.ops[wg][groups[0]]
            if self.form.get("per_warp_retire"):
                for buf, entry in op.reads:
                    if entry[0] == actor:
                        self.readers[buf].discard(entry)
            elif not op.retired:
                yield ("mwait", op, 0)
                op.retired = True
                for buf, entry in op.reads:
                    self.readers[buf].discard(entry)
            groups.pop(0)

    def store(self, actor, buf, tag):
        """A generic store into smem that a wgmma reads later (needs the writer's proxy fence)."""
        self.write(actor, buf, tag)
        self.unfenced[buf] = actor

    def fence(self, actor):
        for buf in [b for b, a in self.unfenced.items() if a == actor]:
            del self.unfenced[buf]

    def reg(self, actor, name, tag=None):
        """The softmax / epilogue touching this warp's registers ``name`` (a new value if ``tag``)."""
        buf = (name, actor)
        if self.readers[buf]:
            raise ProtocolError(f"{actor} touches its {name} while {sorted(self.readers[buf])} use it")
        if tag is not None:
            self.content[buf] = tag

    def v_tag(self, r, blk, wg):
        """What a V box of tile ``blk`` holds when warpgroup ``wg``'s P.V reads it: the tile, with the
        rows past the end zeroed by all 4 warps of ``wg`` in the request's last tile."""
        if self.seqlen[r] - blk * BLOCK_N < BLOCK_N:
            return ("K", r, blk, "z", wg_warps(wg))
        return ("K", r, blk)

    def zero_v_rows(self, actor, stage, boxes, bid, r, blk):
        """This warp's share of the zero stores into the tail rows of ``boxes`` (a box is tagged with the
        warps that zeroed it), its proxy fence, then the warpgroup's 128-thread barrier."""
        for b in boxes:
            buf = ("K", stage, b)
            cur = self.content[buf]
            if isinstance(cur, tuple) and len(cur) == 5:
                new = cur[:4] + (cur[4] | {actor},)
            else:
                new = tuple(cur or ("?",)) + ("z", frozenset({actor}))
            self.store(actor, buf, new)
        yield ("step",)
        self.fence(actor)
        yield from self.nb(actor, bid, 128, ("zero", r, blk, stage), True)

    def wg_sync(self, actor, bid, tag):
        """The kernel's ``wg_sync``: a 128-thread barrier of the warpgroup (all its warps past their wait)
        before warp 0's refill or the warps' zeroing stores (absent in ``broken:no-wg-sync``)."""
        if self.form.get("wg_sync"):
            yield from self.nb(actor, bid, 128, tag, True)

    def qk(self, actor, wg, r, stage, order, blk, phase):
        """issue_qk_boxes: per box, wait its barrier, then one committed wgmma group (not waited)."""
        for b in order:
            yield ("mwait", self.box[(stage, b)], phase)
            self.wgmma(actor, wg, ("QK", stage, b),
                       [("sQ", ("Q", r))] + [(buf, ("K", r, blk)) for buf in box_bufs(stage, b)], regs=("acc_s",))
        yield ("step",)

    # ------------------------------------------------------------------------------------- WG0
    def wg0_warp(self, w):
        actor = f"WG0.w{w}"
        issuer = w == 0
        ph0 = ph1 = 0
        q_phase, q_prod_phase = 0, 1
        if not self.form.get("no_p1_free"):
            yield from self.nb(actor, P1_FREE, 256, ("P1 free", "start"), False)  # sP starts free
        for r, start, stop, seqlen in self.chunks:
            if issuer:  # tma_load_q (producer_acquire, arrive + tx, copy), the chunk's first two tiles
                yield ("mwait", self.q_empty, q_prod_phase)
                self.tma(["sQ"], ("Q", r), self.q_full)
                q_prod_phase ^= 1
                if start < stop:
                    self.load_boxes(r, start, 0, ALL_BOXES)
                if start + 1 < stop:
                    self.load_boxes(r, start + 1, 1, ALL_BOXES)
                yield ("step",)
            self.reg(actor, "acc_o", ("O", r))  # new_chunk_state
            yield ("mwait", self.q_full, q_phase)
            if start < stop:
                yield from self.qk(actor, 0, r, 0, ALL_BOXES, start, ph0)
                yield from self.wait_group(actor, 0, 0)
            for t0 in range(start, stop, 2):
                yield from self.wg0_iteration(actor, w, issuer, r, t0, stop, seqlen, ph0, ph1)
                ph0 ^= 1
                if t0 + 1 < stop:
                    ph1 ^= 1
            self.q_empty.arrive(("Q", r))  # consumer_release
            q_phase ^= 1
            # finish_chunk: WG1's row sums in, 1/rowsum out, then the store of O_L
            yield from self.nb(actor, SUM, 256, ("chunk", r), True)
            self.read(actor, ("sum", w), ("sum", r))
            self.write(actor, ("inv", w), ("inv", r))
            yield from self.nb(actor, INV, 256, ("chunk", r), False)
            self.reg(actor, "acc_o")
            yield ("step",)

    def wg0_iteration(self, actor, w, issuer, r, t0, stop, seqlen, ph0, ph1):
        t1 = t0 + 1
        self.reg(actor, "acc_s", ("P0", r, t0))  # softmax of S0 in place
        self.write(actor, ("m0", w), ("m0", r, t0))
        yield from self.nb(actor, SCALE0, 256, ("pair", r, t0), False)
        self.reg(actor, "acc_o")  # rescale_rows_if_needed
        if seqlen - t0 * BLOCK_N < BLOCK_N:
            yield from self.wg_sync(actor, WG0_BAR, ("zero", r, t0))
            yield from self.zero_v_rows(actor, 0, V_L_BOXES, WG0_BAR, r, t0)
        self.reg(actor, "rP", ("P0", r, t0))
        self.wgmma(actor, 0, ("PV_RS", 0), [(("rP", actor), ("P0", r, t0))] +
                   [(("K", 0, b), self.v_tag(r, t0, 0)) for b in V_L_BOXES], regs=("acc_o",))
        yield ("step",)
        yield from self.wait_group(actor, 0, 0)
        if t0 + 2 < stop:
            yield from self.wg_sync(actor, WG0_BAR, ("refill", r, t0 + 2, 0))
        if issuer and t0 + 2 < stop:
            self.load_boxes(r, t0 + 2, 0, V_L_BOXES)
            yield ("step",)
        yield from self.nb(actor, SCALE1, 256, ("pair", r, t0), True)
        self.read(actor, ("m1", w), ("m1", r, t0))
        self.reg(actor, "acc_s", ("P0 to m1", r, t0))
        self.reg(actor, "rP", ("P0 to m1", r, t0))
        self.store(actor, ("K", 0, 8, w), ("P0", r, t0))  # P0 into stage 0's RoPE block (this warp's rows)
        if not self.form.get("no_p0_fence"):
            self.fence(actor)
        yield from self.nb(actor, P0_READY, 256, ("pair", r, t0), False)
        self.reg(actor, "acc_o")
        yield from self.nb(actor, ISSUED, 256, ("pair", r, t0), True)
        if t0 + 2 < stop:
            yield from self.wg0_pv_t1(actor, issuer, r, t0, stop, seqlen, ph0, ph1, True)
        elif t1 < stop:
            yield from self.wg0_pv_t1(actor, issuer, r, t0, stop, seqlen, ph0, ph1, False)
        elif not self.form.get("no_p1_free") and not self.form.get("skip_p1_free_no_t1"):
            yield from self.nb(actor, P1_FREE, 256, ("P1 free", (r, t0)), False)

    def wg0_pv_t1(self, actor, issuer, r, t0, stop, seqlen, ph0, ph1, next_qk):
        t1 = t0 + 1
        for b in V_L_BOXES:
            yield ("mwait", self.box[(1, b)], ph1)
        if seqlen - t1 * BLOCK_N < BLOCK_N:
            yield from self.zero_v_rows(actor, 1, V_L_BOXES, WG0_BAR, r, t1)
        self.wgmma(actor, 0, ("PV_SS", 1), [(("sP", k), ("P1", r, t1)) for k in range(WG_WARPS)] +
                   [(("K", 1, b), self.v_tag(r, t1, 0)) for b in V_L_BOXES], regs=("acc_o",))
        early = self.form.get("early_stage1_refill")
        if early and issuer and t1 + 2 < stop:
            self.load_boxes(r, t1 + 2, 1, V_L_BOXES)
        if next_qk:
            yield from self.qk(actor, 0, r, 0, ALL_BOXES, t0 + 2, ph0 ^ 1)
            yield from self.wait_group(actor, 0, N_BOXES)
        else:
            yield ("step",)
            yield from self.wait_group(actor, 0, 0)
        if not self.form.get("no_p1_free"):
            yield from self.nb(actor, P1_FREE, 256, ("P1 free", (r, t0)), False)
        if t1 + 2 < stop:
            yield from self.wg_sync(actor, WG0_BAR, ("refill", r, t1 + 2, 1))
        if not early and issuer and t1 + 2 < stop:
            self.load_boxes(r, t1 + 2, 1, V_L_BOXES)
            yield ("step",)
        if next_qk:
            yield from self.wait_group(actor, 0, 0)

    # ------------------------------------------------------------------------------------- WG1
    def wg1_warp(self, w):
        actor = f"WG1.w{w}"
        issuer = w == 0
        ph0 = ph1 = 0
        q_phase = 0
        prev = "start"  # the pair whose P1_FREE arrive this warpgroup's next P1_FREE sync pairs
        for r, start, stop, seqlen in self.chunks:
            self.reg(actor, "acc_o", ("O", r))
            yield ("mwait", self.q_full, q_phase)
            if start + 1 < stop:
                yield from self.qk(actor, 1, r, 1, ALL_BOXES, start + 1, ph1)
                yield from self.wait_group(actor, 1, 0)
            for t0 in range(start, stop, 2):
                yield from self.wg1_iteration(actor, w, issuer, r, t0, stop, seqlen, ph0, ph1, prev)
                prev = (r, t0)
                ph0 ^= 1
                if t0 + 1 < stop:
                    ph1 ^= 1
            self.q_empty.arrive(("Q", r))
            q_phase ^= 1
            self.write(actor, ("sum", w), ("sum", r))
            yield from self.nb(actor, SUM, 256, ("chunk", r), False)
            yield from self.nb(actor, INV, 256, ("chunk", r), True)
            self.read(actor, ("inv", w), ("inv", r))
            self.reg(actor, "acc_o")
            yield ("step",)
        if not self.form.get("no_p1_free"):  # pairs WG0's last P1_FREE arrive
            yield from self.nb(actor, P1_FREE, 256, ("P1 free", prev), True)

    def wg1_iteration(self, actor, w, issuer, r, t0, stop, seqlen, ph0, ph1, prev):
        t1 = t0 + 1
        yield from self.nb(actor, SCALE0, 256, ("pair", r, t0), True)
        self.read(actor, ("m0", w), ("m0", r, t0))
        if t1 < stop:
            self.reg(actor, "acc_s", ("P1", r, t1))  # softmax of S1 against m0
        self.write(actor, ("m1", w), ("m1", r, t0))
        yield from self.nb(actor, SCALE1, 256, ("pair", r, t0), False)
        self.reg(actor, "acc_o")  # O_R to m1
        for b in V_R_BOXES:
            yield ("mwait", self.box[(0, b)], ph0)
        if seqlen - t0 * BLOCK_N < BLOCK_N:
            yield from self.zero_v_rows(actor, 0, V_R_BOXES, WG1_BAR, r, t0)
        if not self.form.get("no_p1_free") and not self.form.get("p1_before_free"):
            yield from self.nb(actor, P1_FREE, 256, ("P1 free", prev), True)
        yield from self.wg1_pvs(actor, issuer, r, t0, stop, seqlen, ph1, prev, t1 < stop, t1 + 2 < stop)

    def wg1_pvs(self, actor, issuer, r, t0, stop, seqlen, ph1, prev, has_t1, next_qk):
        t1 = t0 + 1
        w = int(actor[-1])
        if has_t1:
            self.reg(actor, "rP", ("P1", r, t1))
            self.store(actor, ("sP", w), ("P1", r, t1))
            self.fence(actor)
        if self.form.get("p1_before_free"):
            yield ("step",)
            yield from self.nb(actor, P1_FREE, 256, ("P1 free", prev), True)
        if has_t1:
            if seqlen - t1 * BLOCK_N < BLOCK_N:
                yield from self.zero_v_rows(actor, 1, V_R_BOXES, WG1_BAR, r, t1)
            self.wgmma(actor, 1, ("PV_RS", 1), [(("rP", actor), ("P1", r, t1))] +
                       [(("K", 1, b), self.v_tag(r, t1, 1)) for b in V_R_BOXES], regs=("acc_o",))
            yield ("step",)
        yield from self.nb(actor, P0_READY, 256, ("pair", r, t0), True)
        self.wgmma(actor, 1, ("PV_SS", 0), [(("K", 0, 8, q), ("P0", r, t0)) for q in range(WG_WARPS)] +
                   [(("K", 0, b), self.v_tag(r, t0, 1)) for b in V_R_BOXES], regs=("acc_o",))
        yield from self.nb(actor, ISSUED, 256, ("pair", r, t0), False)
        early = self.form.get("early_stage0_refill")
        if has_t1:
            yield from self.wait_group(actor, 1, 1)
            if t1 + 2 < stop:
                yield from self.wg_sync(actor, WG1_BAR, ("refill", r, t1 + 2, 1))
            if issuer and t1 + 2 < stop:
                self.load_boxes(r, t1 + 2, 1, V_R_ROPE_BOXES)
                yield ("step",)
            if early and issuer and t0 + 2 < stop:
                self.load_boxes(r, t0 + 2, 0, V_R_ROPE_BOXES)
        yield from self.wait_group(actor, 1, 0)
        if t0 + 2 < stop:
            yield from self.wg_sync(actor, WG1_BAR, ("refill", r, t0 + 2, 0))
        if not (early and has_t1) and issuer and t0 + 2 < stop:
            self.load_boxes(r, t0 + 2, 0, V_R_ROPE_BOXES)
            yield ("step",)
        if next_qk:
            phase = ph1 if self.form.get("wg1_stale_phase") else ph1 ^ 1
            yield from self.qk(actor, 1, r, 1, WG1_QK_ORDER, t1 + 2, phase)
            yield from self.wait_group(actor, 1, 0)

    # ------------------------------------------------------------------------------- scheduler
    def make_actors(self) -> dict:
        actors = {}
        for w in range(WG_WARPS):
            actors[f"WG0.w{w}"] = self.wg0_warp(w)
            actors[f"WG1.w{w}"] = self.wg1_warp(w)
        return actors

    def run(self, max_steps=200000):
        super().run(max_steps)
        for bar in [self.q_full, self.q_empty, *self.box.values()]:
            if bar.pending != bar.count or bar.tx:
                raise ProtocolError(f"{bar.name}: phase {bar.phase} incomplete at exit "
                                    f"({bar.count - bar.pending} arrivals, {bar.tx} copies pending)")
        busy = {buf: sorted(r) for buf, r in self.readers.items() if r}
        if busy or any(self.pending.values()):
            raise ProtocolError(f"wgmma not retired at exit: {busy or self.pending}")
        if self.unfenced:
            raise ProtocolError(f"unfenced stores at exit: {self.unfenced}")


class SkewedRandom(random.Random):
    """The scheduler's random source for half of the runs: each warp, and the TMA, gets a speed drawn
    once per run (0.01x to 10x), so that one warp far behind the others of its warpgroup, or copies
    landing late, are explored too (the base scheduler picks uniformly)."""

    def __init__(self, seed):
        super().__init__(seed)
        self.speed = {}

    def choice(self, seq):
        """``seq``: the scheduler's choices, ("actor", name) or ("land", index)."""
        weights = []
        for kind, x in seq:
            key = x if kind == "actor" else "TMA"
            if key not in self.speed:
                self.speed[key] = 10 ** self.uniform(-2, 1)
            weights.append(self.speed[key])
        return self.choices(seq, weights=weights)[0]


def make_rng(seed: int) -> random.Random:
    """Run ``seed``'s scheduler: uniform for even seeds, with skewed speeds for odd ones."""
    return SkewedRandom(seed) if seed % 2 else random.Random(seed)


def chunk_list(spec):
    """[(seqlen, start tile, stop tile)] -> [(r, start, stop, seqlen)]"""
    return [(r, start, stop, seqlen) for r, (seqlen, start, stop) in enumerate(spec)]


SCENARIOS = {
    # name: the chunks' tile counts; a seqlen not a multiple of 64 makes the request's last tile a tail
    # (zero_v_rows: in stage 0 when it is a t0, in stage 1 when it is a t1)
    "1": [(40, 0, 1)],
    "2": [(100, 0, 2)],
    "3": [(1000, 4, 7)],
    "4": [(256, 0, 4)],
    "5": [(300, 0, 5)],
    "0": [(0, 0, 0)],
    "3-0-2": [(190, 0, 3), (0, 0, 0), (65, 0, 2)],
    "1-1": [(64, 0, 1), (4096, 63, 64)],
    "6-1-3": [(500, 0, 6), (1, 0, 1), (700, 8, 11)],
    "2-4-2": [(4096, 10, 12), (250, 0, 4), (128, 0, 2)],
    "7": [(448, 0, 7)],
}


def expected_caught(form: str, scenario: str) -> bool:
    """Whether ``form`` must show an error in ``scenario`` (the forms' ``catch``, chunk by chunk)."""
    catch = FORMS[form]["catch"]
    if catch is None:
        return False
    for seqlen, start, stop in SCENARIOS[scenario]:
        n = stop - start
        tail_t0 = n > 0 and stop * BLOCK_N > seqlen and (n - 1) % 2 == 0  # the last tile: a partial t0
        if catch(n, tail_t0):
            return True
    return False


def run_form(form: str, runs: int, seed: int = 0, scenarios=None) -> dict:
    """{scenario: {error key: [count, first message]}} over ``runs`` random schedules each."""
    result = {}
    for name in scenarios or SCENARIOS:
        result[name] = base.collect_errors(
            lambda s, name=name: SimSeesaw2(chunk_list(SCENARIOS[name]), make_rng(s), form), runs, seed)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--form", action="append", choices=list(FORMS), help="forms to run (default: all)")
    args = ap.parse_args()
    failed = 0
    for form in args.form or FORMS:
        for name, errors in run_form(form, args.runs, args.seed).items():
            expect = expected_caught(form, name)
            status = ("caught" if errors else "NOT CAUGHT") if expect else ("ok" if not errors else "FAIL")
            failed += bool(errors) != expect
            print(f"{form:32s} {name:8s} {args.runs} schedules: {status}")
            for key, (n, msg) in errors.items():
                print(f"    {n:4d} x {msg[:220]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
