"""Pure-Python model of the 2wg kernels' synchronisation protocol (no GPU, no DSL): the committed 2wg
(``pipelines/variant_2wg.py``, two 64-token stages), its narrow kernel (``pipelines/variant_2wg_narrow.py``:
WG0 scores and releases its read of the K stage after its wgmma, WG1 does all of P.V and zeroes the V rows
of a tail tile itself, the column statistics through ``WG0_BAR``, the epilogue through a scratch behind
``WG1_BAR``) and the overlap schedule (four 32-token stages,
QK(t) and P.V(t-1) issued together, optionally WG1's P.V deferred behind them: ``defer_pv_r``). The
overlap kernel was correct on an H100 but 1.26-1.41x slower than 2wg on the compute-bound rows and was
removed (docs/perf-notes.md, thirteenth session; its code is in git history at 1611a37); its forms stay
here as models of a candidate schedule.

    python scripts/model_2wg_protocol.py [--runs N] [--seed S]

Each warp is a generator that mirrors its kernel's code path op for op: WG0's 4 warps (QK, softmax,
hand-off of P, P.V of the left half), WG1's 4 warps (P.V of the right half; warp 0 also issues the TMA
loads of Q and K at the points the kernel does: the chunk's first tiles, one refill per released stage,
the next chunk's first tiles before the epilogue). A random scheduler interleaves them one op at a time,
and TMA completions land at random later steps. The checks are those of ``model_3wg_protocol.py``
(whose primitives this reuses): mbarrier phases and arrival counts, named-barrier counts and pairing,
the same wgmma sequence in every warp of a warpgroup, every wgmma operand holding the expected tile,
no TMA or store into a buffer an unretired wgmma reads (P's registers included), no deadlock, nothing
pending at exit. Not modelled: multicast clusters and split clusters (the cross-CTA release is the
skeleton's, unchanged by these kernels).
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
P_FULL, P_EMPTY, WG0_BAR, WG1_BAR, QK_ISSUED = 1, 2, 3, 4, 5  # variant_2wg's ids (5: the overlap schedule's)

FORMS = {
    # name: (tile tokens, stages, WG0 schedule, defer_pv_r)
    "2wg": (64, 2, "eager", False),
    "overlap": (32, 4, "overlap", False),
    "overlap-defer": (32, 4, "overlap", True),
    "narrow": (64, 2, "narrow", False),
    # Broken on purpose (the model must catch them): WG1 deferred behind an eager WG0 that never
    # arrives on QK_ISSUED; an overlap WG0 that writes P(t) before the P.V of t-1 (reading P(t-1)
    # from the same registers) has retired.
    "broken:defer-on-eager": (64, 2, "eager", True),
    "broken:early-hand-off": (32, 4, "overlap-early", False),
    # A narrow WG1 that zeroes a tail tile's V rows before P_FULL, while WG0's S^T may still read the stage.
    "broken:narrow-early-zero": (64, 2, "narrow-early-zero", False),
}


class Sim2WG(base.Sim):
    def __init__(self, chunks, rng, form: str):
        super().__init__(chunks, rng, racy=False)
        self.tile, self.stages, self.wg0_form, self.defer = FORMS[form]
        self.k_full = [base.MBarrier(f"K full[{s}]", 1) for s in range(self.stages)]
        self.k_empty = [base.MBarrier(f"K empty[{s}]", 2 * WG_WARPS) for s in range(self.stages)]
        self.content = {"sQ": None, "sP": None, "scale": None, "inv": None}
        for s in range(self.stages):
            self.content[("sK", s)] = None
        for w in range(WG_WARPS):
            self.content[("rP", w)] = None  # WG0 warp w's P registers (the A operand of its RS P.V)
        self.readers = {k: set() for k in self.content}
        self.wgmma_log = {0: [], 1: []}
        self.seqlen = {r: seqlen for r, _, _, seqlen in chunks}

    def wgmma(self, actor, wg, kind, operands):
        """As the base model, but a warp's own registers (``("rP", w)``) count as one operand name when
        the warps' wgmma sequences are compared (each warp holds its own slice of P)."""
        n = self.wgmma_count.get(actor, 0)
        key = (kind, tuple("rP" if isinstance(b, tuple) and b[0] == "rP" else b for b, _ in operands))
        log = self.wgmma_log[wg]
        if n < len(log) and log[n] != key:
            raise ProtocolError(f"misaligned wgmma in WG{wg}: {actor}'s wgmma #{n} is {key}, "
                                f"another warp's is {log[n]} (illegal instruction on the GPU)")
        if n == len(log):
            log.append(key)
        self.wgmma_count[actor] = n + 1
        for buf, tag in operands:
            if self.content[buf] != tag:
                raise ProtocolError(f"{actor}: {kind} reads {buf} holding {self.content[buf]}, expected {tag}")
            self.readers[buf].add((actor, n))
        self.groups.setdefault(actor, []).append((n, [b for b, _ in operands]))

    def make_actors(self) -> dict:
        actors = {}
        for w in range(WG_WARPS):
            actors[f"WG0.w{w}"] = self.wg0_warp(w)
            actors[f"WG1.w{w}"] = self.wg1_warp(w)
        return actors

    def _next(self, index, phase):
        return (index + 1, phase) if index + 1 < self.stages else (0, phase ^ 1)

    # ------------------------------------------------------------------------------------- WG0
    def wg0_warp(self, w):
        actor = f"WG0.w{w}"
        rd, rd_phase, rel = 0, 0, 0  # k_rd (stage, phase) for full waits; k_rel (stage) for releases
        q_phase = 0
        rp = ("rP", w)

        def hand_off(r, blk, stage):
            self.write(actor, rp, ("P", r, blk))
            yield from self.nb(actor, P_EMPTY, 256, ("hand", r, blk), True)
            self.write(actor, "sP", ("P", r, blk))
            self.write(actor, "scale", ("P", r, blk))
            yield ("step",)
            yield from self.nb(actor, P_FULL, 256, ("hand", r, blk), False)
            if blk_valid(r, blk) < self.tile:  # zero_v_rows (V_L columns of the stage)
                yield from self.nb(actor, WG0_BAR, 128, ("zero", r, blk), True)

        def blk_valid(r, blk):
            return self.seqlen[r] - blk * self.tile

        def pv(r, blk, stage):
            self.wgmma(actor, 0, "PV", [(rp, ("P", r, blk)), (("sK", stage), ("K", r, blk))])

        if self.wg0_form.startswith("narrow"):
            yield from self.wg0_narrow(actor)
            return
        for r, start, stop, seqlen in self.chunks:
            yield ("mwait", self.q_full, q_phase)
            if self.wg0_form == "eager":
                for blk in range(start, stop):
                    yield ("mwait", self.k_full[rd], rd_phase)
                    self.wgmma(actor, 0, "QK", [("sQ", ("Q", r)), (("sK", rd), ("K", r, blk))])
                    rd, rd_phase = self._next(rd, rd_phase)
                    yield ("step",)
                    self.wait_group(actor, 0)
                    yield ("step",)  # softmax
                    yield from hand_off(r, blk, rel)
                    pv(r, blk, rel)
                    yield ("step",)
                    self.wait_group(actor, 0)
                    self.k_empty[rel].arrive(("K", r, blk))
                    rel = (rel + 1) % self.stages
            else:
                if start < stop:
                    yield ("mwait", self.k_full[rd], rd_phase)
                    self.wgmma(actor, 0, "QK", [("sQ", ("Q", r)), (("sK", rd), ("K", r, start))])
                    rd, rd_phase = self._next(rd, rd_phase)
                    yield ("step",)
                    self.wait_group(actor, 0)
                    yield ("step",)  # softmax
                    yield from hand_off(r, start, rel)
                for blk in range(start + 1, stop):
                    yield ("mwait", self.k_full[rd], rd_phase)
                    self.wgmma(actor, 0, "QK", [("sQ", ("Q", r)), (("sK", rd), ("K", r, blk))])
                    rd, rd_phase = self._next(rd, rd_phase)
                    pv(r, blk - 1, rel)
                    if self.defer:
                        yield from self.nb(actor, QK_ISSUED, 256, ("issued", r, blk), False)
                    yield ("step",)
                    self.wait_group(actor, 1)
                    yield ("step",)  # softmax of blk beside the P.V of blk - 1
                    if self.wg0_form == "overlap-early":
                        yield from hand_off(r, blk, (rel + 1) % self.stages)  # P(blk) before P.V(blk-1) retired
                        self.wait_group(actor, 0)
                        self.k_empty[rel].arrive(("K", r, blk - 1))
                        rel = (rel + 1) % self.stages
                        continue
                    self.wait_group(actor, 0)
                    self.k_empty[rel].arrive(("K", r, blk - 1))
                    rel = (rel + 1) % self.stages
                    yield from hand_off(r, blk, rel)
                if start < stop:
                    pv(r, stop - 1, rel)
                    yield ("step",)
                    self.wait_group(actor, 0)
                    self.k_empty[rel].arrive(("K", r, stop - 1))
                    rel = (rel + 1) % self.stages
            self.q_empty.arrive(("Q", r))
            q_phase ^= 1
            yield from self.nb(actor, P_EMPTY, 256, ("inv", r), True)
            self.write(actor, "inv", ("inv", r))
            yield from self.nb(actor, P_FULL, 256, ("inv", r), False)
            yield ("step",)  # store_chunk
        yield from self.nb(actor, P_EMPTY, 256, ("exit",), True)

    def wg0_narrow(self, actor):
        """WG0 of the narrow kernel: S^T, its K stage released at once, the column max across the 4 warps
        (``WG0_BAR``), P^T and the factors after P_EMPTY, P_FULL; at a chunk's end the column sums
        (``WG0_BAR``), then 1/sum after P_EMPTY, P_FULL."""
        rd, rd_phase = 0, 0
        q_phase = 0
        for r, start, stop, seqlen in self.chunks:
            yield ("mwait", self.q_full, q_phase)
            for blk in range(start, stop):
                yield ("mwait", self.k_full[rd], rd_phase)
                self.wgmma(actor, 0, "ST", [("sQ", ("Q", r)), (("sK", rd), ("K", r, blk))])
                yield ("step",)
                self.wait_group(actor, 0)
                self.k_empty[rd].arrive(("K", r, blk))
                rd, rd_phase = self._next(rd, rd_phase)
                yield from self.nb(actor, WG0_BAR, 128, ("colmax", r, blk), True)
                yield ("step",)  # settle_max, P to 16 bits
                yield from self.nb(actor, P_EMPTY, 256, ("hand", r, blk), True)
                self.write(actor, "sP", ("P", r, blk))
                self.write(actor, "scale", ("P", r, blk))
                yield ("step",)
                yield from self.nb(actor, P_FULL, 256, ("hand", r, blk), False)
            self.q_empty.arrive(("Q", r))
            q_phase ^= 1
            yield from self.nb(actor, WG0_BAR, 128, ("colsum", r), True)
            yield ("step",)  # lse to global memory
            yield from self.nb(actor, P_EMPTY, 256, ("inv", r), True)
            self.write(actor, "inv", ("inv", r))
            yield from self.nb(actor, P_FULL, 256, ("inv", r), False)
        yield from self.nb(actor, P_EMPTY, 256, ("exit",), True)

    # ------------------------------------------------------------------------------------- WG1
    def wg1_warp(self, w):
        actor = f"WG1.w{w}"
        producer = w == 0
        k_index, k_phase = 0, 0
        state = {"p_index": 0, "p_phase": 1, "q_phase": 1}

        def load_tile(r, blk):
            yield ("mwait", self.k_empty[state["p_index"]], state["p_phase"])
            self.k_full[state["p_index"]].arrive(("K", r, blk), tx=1)
            self.landings.append((("sK", state["p_index"]), ("K", r, blk), self.k_full[state["p_index"]]))
            state["p_index"], state["p_phase"] = self._next(state["p_index"], state["p_phase"])

        def load_head(r, start, stop):
            yield ("mwait", self.q_empty, state["q_phase"])
            self.q_full.arrive(("Q", r), tx=1)
            self.landings.append(("sQ", ("Q", r), self.q_full))
            state["q_phase"] ^= 1
            for blk in range(start, min(start + self.stages, stop)):
                yield from load_tile(r, blk)

        yield from self.nb(actor, P_EMPTY, 256, ("pre",), False)
        prefetched = False
        narrow = self.wg0_form.startswith("narrow")
        for i, (r, start, stop, seqlen) in enumerate(self.chunks):
            if not prefetched and producer:
                yield from load_head(r, start, stop)
            prefetched = False
            for blk in range(start, stop):
                if narrow:
                    yield from self.wg1_narrow_tile(actor, r, blk, k_index, k_phase)
                    k_index, k_phase = self._next(k_index, k_phase)
                    if producer and blk + self.stages < stop:
                        yield from load_tile(r, blk + self.stages)
                    continue
                yield from self.nb(actor, P_FULL, 256, ("hand", r, blk), True)
                self.read(actor, "scale", ("P", r, blk))
                yield ("mwait", self.k_full[k_index], k_phase)
                if seqlen - blk * self.tile < self.tile:
                    yield from self.nb(actor, WG1_BAR, 128, ("zero", r, blk), True)
                if self.defer and blk + 1 < stop:
                    yield from self.nb(actor, QK_ISSUED, 256, ("issued", r, blk + 1), True)
                self.wgmma(actor, 1, "PV", [("sP", ("P", r, blk)), (("sK", k_index), ("K", r, blk))])
                yield ("step",)
                self.wait_group(actor, 0)
                yield from self.nb(actor, P_EMPTY, 256, ("hand", r, blk), False)
                self.k_empty[k_index].arrive(("K", r, blk))
                k_index, k_phase = self._next(k_index, k_phase)
                if producer and blk + self.stages < stop:
                    yield from load_tile(r, blk + self.stages)
            yield from self.nb(actor, P_FULL, 256, ("inv", r), True)
            self.read(actor, "inv", ("inv", r))
            yield from self.nb(actor, P_EMPTY, 256, ("inv", r), False)
            if i + 1 < len(self.chunks):  # prefetch_next_chunk
                if producer:
                    yield from load_head(*self.chunks[i + 1][:3])
                prefetched = True
            if narrow:  # store_transposed: the scratch between two WG1 barriers
                yield from self.nb(actor, WG1_BAR, 128, ("scratch", r), True)
                yield ("step",)
                yield from self.nb(actor, WG1_BAR, 128, ("scratch loads", r), True)
            yield ("step",)  # store_chunk

    def wg1_narrow_tile(self, actor, r, blk, k_index, k_phase):
        """WG1 of the narrow kernel, one tile: P_FULL, the factors, the stage's full wait, a tail tile's V
        rows zeroed by WG1 alone (a write of the stage: WG0's S^T of it must have retired), O^T (P from
        shared memory, V from the stage), P_EMPTY, the stage released."""
        early_zero = self.wg0_form == "narrow-early-zero"
        tail = self.seqlen[r] - blk * self.tile < self.tile
        if early_zero and tail:
            yield ("mwait", self.k_full[k_index], k_phase)
            self.write(actor, ("sK", k_index), ("K", r, blk))
            yield from self.nb(actor, WG1_BAR, 128, ("zero", r, blk), True)
        yield from self.nb(actor, P_FULL, 256, ("hand", r, blk), True)
        self.read(actor, "scale", ("P", r, blk))
        yield ("mwait", self.k_full[k_index], k_phase)
        if tail and not early_zero:
            self.write(actor, ("sK", k_index), ("K", r, blk))  # the zeroed rows: still this tile
            yield from self.nb(actor, WG1_BAR, 128, ("zero", r, blk), True)
        self.wgmma(actor, 1, "OT", [("sP", ("P", r, blk)), (("sK", k_index), ("K", r, blk))])
        yield ("step",)
        self.wait_group(actor, 0)
        yield from self.nb(actor, P_EMPTY, 256, ("hand", r, blk), False)
        self.k_empty[k_index].arrive(("K", r, blk))


def chunk_list(spec, tile: int):
    """[(seqlen, first 64-token block, end block)] -> [(r, start, stop, seqlen)] in tiles of ``tile``
    tokens: the plan's range for 64-token tiles; the overlap forms' 32-token tiles split each block and
    drop the tiles past the request's end (as the removed overlap kernel did)."""
    out = []
    for r, (seqlen, start, stop) in enumerate(spec):
        per = 64 // tile
        out.append((r, start * per, min(stop * per, -(-seqlen // tile)), seqlen))
    return out


SCENARIOS = {
    "1-3-2": [(640, 9, 10), (150, 0, 3), (1000, 0, 2)],
    "5": [(300, 0, 5)],
    "2-1": [(4096, 62, 64), (20, 0, 1)],
    "5-5": [(300, 0, 5), (300, 0, 5)],
    "0-length in the middle": [(128, 0, 2), (0, 0, 0), (65, 0, 2)],
    "1-1-1-1": [(64, 0, 1), (1, 0, 1), (33, 0, 1), (200, 3, 4)],
    "9 (stage ring wraps twice)": [(576, 0, 9)],
}


def run_form(form: str, runs: int, seed: int = 0) -> dict:
    """{scenario: {error key: [count, first message]}} over ``runs`` random schedules each."""
    tile = FORMS[form][0]
    result = {}
    for name, spec in SCENARIOS.items():
        result[name] = base.collect_errors(
            lambda s, spec=spec: Sim2WG(chunk_list(spec, tile), random.Random(s), form), runs, seed)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    failed = 0
    for form in FORMS:
        for name, errors in run_form(form, args.runs, args.seed).items():
            status = "ok" if not errors else "FAIL"
            failed += bool(errors) != form.startswith("broken:")
            print(f"{form:24s} {name:28s} {args.runs} schedules: {status}")
            for key, (n, msg) in errors.items():
                print(f"    {n:4d} x {msg[:200]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
