"""Pure-Python model of the 3wg kernel's synchronisation protocol (no GPU, no DSL).

    python scripts/model_3wg_protocol.py [--runs N] [--seed S] [--racy]

Each warp of ``pipelines/variant_3wg.py`` is a generator that mirrors the kernel's code path op for
op: the producer warp (TMA: Q per request, then the chunk's K tiles), WG1's 4 warps (QK, softmax,
P hand-off, P.V left) and WG2's 4 warps (P.V right). A random scheduler interleaves them one op at a
time, and TMA completions land at random later steps. The model checks what the hardware needs:

- mbarriers: phase parity waits (consumer phase 0, producer phase 1, as ``make_pipeline_state``),
  arrival counts (K empty: 8 consumer warps; Q empty: WG1's 4 warps; full: 1 arrive + tx), and that
  every arrival of one phase is for the same tile / request (an arrival counted into the wrong phase
  shows up as a mixed phase);
- named barriers: the same thread count from every user of an id within a phase, no more arrivals
  than the count, and pairing (which hand-off each P_FULL / P_EMPTY phase belongs to);
- wgmma: the k-th wgmma of every warp of a warpgroup is the same instruction (kind, stage), which
  ``wgmma.mma_async.sync.aligned`` requires; a mismatch is what the GPU reports as an illegal
  instruction (or hangs on);
- data: every wgmma operand (sQ, a K stage, sP) holds the tile the code expects when issued, and no
  TMA or generic store overwrites a buffer an unretired wgmma (or WG2's row factors read) still uses;
- termination: no deadlock (every warp finishes), no pending named-barrier arrivals at exit.

``--racy`` models the kernel before the fix: each WG1 warp takes the overlap branch from its own
``mbarrier.test_wait`` result. Without it, the warps agree through a barrier reduction (the fix).
"""
from __future__ import annotations

import argparse
import random
import sys

BLOCK_N = 64
STAGES = 2
WG_WARPS = 4
P_FULL, P_EMPTY, QK_WG, PV_WG, LANDED = 1, 2, 3, 4, 5  # Bar ids of variant_3wg


class ProtocolError(Exception):
    pass


class MBarrier:
    def __init__(self, name, count):
        self.name, self.count = name, count
        self.phase = 0
        self.pending = count
        self.tx = 0
        self.tags = []

    def arrive(self, tag, tx=0):
        self.tags.append(tag)
        if len(set(self.tags)) > 1:
            raise ProtocolError(f"{self.name} phase {self.phase}: arrivals of different owners {self.tags}")
        self.pending -= 1
        self.tx += tx
        if self.pending < 0:
            raise ProtocolError(f"{self.name}: more than {self.count} arrivals in phase {self.phase}")
        self._maybe_complete()

    def complete_tx(self):
        self.tx -= 1
        self._maybe_complete()

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count
            self.tags = []

    def done(self, parity):
        """try_wait.parity: the phase of this parity has completed (the current one has the other)."""
        return self.phase % 2 != parity


class NamedBarrier:
    def __init__(self, bid):
        self.bid = bid
        self.count = None
        self.arrived = 0
        self.waiters = []
        self.tags = []
        self.red = False
        self.generation = 0

    def arrive(self, actor, count, tag, wait, red=None):
        if self.arrived and count != self.count:
            raise ProtocolError(f"named barrier {self.bid}: {actor} uses count {count}, phase started with {self.count}")
        if self.arrived == 0:
            self.count = count
            self.red = False
        self.arrived += 32
        self.tags.append((actor, tag))
        if red is not None:
            self.red = self.red or red
        if self.arrived > self.count:
            raise ProtocolError(f"named barrier {self.bid}: {self.arrived} arrivals for count {self.count}")
        gen = self.generation
        if wait:
            self.waiters.append(actor)
        if self.arrived == self.count:
            self.generation += 1
            self.arrived = 0
            self.waiters = []
            self.last_tags = self.tags
            self.last_red = self.red
            self.tags = []
        return gen


class Sim:
    def __init__(self, chunks, rng, racy):
        self.chunks = chunks  # [(r, start, stop, seqlen)]
        self.rng = rng
        self.racy = racy
        self.q_full = MBarrier("Q full", 1)
        self.q_empty = MBarrier("Q empty", WG_WARPS)
        self.k_full = [MBarrier(f"K full[{s}]", 1) for s in range(STAGES)]
        self.k_empty = [MBarrier(f"K empty[{s}]", 2 * WG_WARPS) for s in range(STAGES)]
        self.named = {i: NamedBarrier(i) for i in (P_FULL, P_EMPTY, QK_WG, PV_WG, LANDED)}
        # buffer -> content tag; buffer -> set of (actor, group) readers not yet retired
        self.content = {"sQ": None, "sP": None, "scale": None, "inv": None}
        for s in range(STAGES):
            self.content[("sK", s)] = None
        self.readers = {k: set() for k in self.content}
        self.landings = []  # pending TMA completions: (buffer, tag, barrier)
        self.wgmma_log = {1: [], 2: []}  # per warpgroup: the sequence of wgmma ops (first warp to issue each)
        self.wgmma_count = {}  # actor -> number of wgmma issued
        self.groups = {}  # actor -> list of committed, unretired groups [(group id, [buffers])]
        self.hand_offs = 0
        self.log = []

    # ---------------------------------------------------------------- primitives used by the warps
    def wgmma(self, actor, wg, kind, operands):
        """operands: [(buffer, expected tag)]. Checks alignment across the warpgroup and the data."""
        n = self.wgmma_count.get(actor, 0)
        self.wgmma_count[actor] = n + 1
        key = (kind, tuple(b for b, _ in operands))
        log = self.wgmma_log[wg]
        if n < len(log):
            if log[n] != key:
                raise ProtocolError(f"misaligned wgmma in WG{wg}: {actor}'s wgmma #{n} is {key}, "
                                    f"another warp's is {log[n]} (illegal instruction on the GPU)")
        else:
            log.append(key)
        for buf, tag in operands:
            if self.content[buf] != tag:
                raise ProtocolError(f"{actor}: {kind} reads {buf} holding {self.content[buf]}, expected {tag}")
            self.readers[buf].add((actor, n))
        self.groups.setdefault(actor, []).append((n, [b for b, _ in operands]))

    def wait_group(self, actor, keep):
        groups = self.groups.get(actor, [])
        while len(groups) > keep:
            n, bufs = groups.pop(0)
            for b in bufs:
                self.readers[b].discard((actor, n))

    def write(self, actor, buf, tag):
        if self.readers[buf]:
            raise ProtocolError(f"{actor} overwrites {buf} ({self.content[buf]} -> {tag}) while "
                                f"{sorted(self.readers[buf])} still read it")
        self.content[buf] = tag

    def read(self, actor, buf, tag):
        if self.content[buf] != tag:
            raise ProtocolError(f"{actor} reads {buf} holding {self.content[buf]}, expected {tag}")

    def land(self, idx):
        buf, tag, bar = self.landings.pop(idx)
        if self.readers[buf]:
            raise ProtocolError(f"TMA overwrites {buf} with {tag} while {sorted(self.readers[buf])} read it")
        self.content[buf] = tag
        bar.complete_tx()

    # ---------------------------------------------------------------- the warps
    def producer(self):
        q_phase, k_index, k_phase = 1, 0, 1
        for r, start, stop, seqlen in self.chunks:
            yield ("mwait", self.q_empty, q_phase)
            self.q_full.arrive(("Q", r), tx=1)
            self.landings.append(("sQ", ("Q", r), self.q_full))
            q_phase ^= 1
            for blk in range(start, stop):
                yield ("mwait", self.k_empty[k_index], k_phase)
                self.k_full[k_index].arrive(("K", r, blk), tx=1)
                self.landings.append((("sK", k_index), ("K", r, blk), self.k_full[k_index]))
                k_index += 1
                if k_index == STAGES:
                    k_index, k_phase = 0, k_phase ^ 1
                yield ("step",)

    def nb(self, actor, bid, count, tag, wait, red=None):
        bar = self.named[bid]
        gen = bar.arrive(actor, count, tag, wait, red)
        if wait:
            yield ("nbwait", bar, gen)
            return bar.last_red if red is not None else None
        return None

    def wg1_warp(self, w):
        actor = f"WG1.w{w}"
        k_index, k_phase, q_phase = 0, 0, 0

        def hand_off(r, blk):
            yield from self.nb(actor, P_EMPTY, 256, ("hand", r, blk), True)
            self.write(actor, "sP", ("P", r, blk))
            self.write(actor, "scale", ("P", r, blk))
            yield ("step",)
            yield from self.nb(actor, P_FULL, 256, ("hand", r, blk), False)
            yield from self.nb(actor, QK_WG, 128, ("own", r, blk), True)

        for r, start, stop, seqlen in self.chunks:
            yield ("mwait", self.q_full, q_phase)
            if start < stop:
                yield ("mwait", self.k_full[k_index], k_phase)
                self.wgmma(actor, 1, "QK", [("sQ", ("Q", r)), (("sK", k_index), ("K", r, start))])
                yield ("step",)
                self.wait_group(actor, 0)
                if start + 1 == stop:
                    self.q_empty.arrive(("Q", r))
                yield ("step",)
                yield from hand_off(r, start)
            else:
                self.q_empty.arrive(("Q", r))
            for blk in range(start, stop):
                n_index, n_phase = (k_index + 1, k_phase) if k_index + 1 < STAGES else (0, k_phase ^ 1)
                has_next = blk + 1 < stop
                valid = seqlen - blk * BLOCK_N
                if valid < BLOCK_N:
                    # zero_v_rows: generic stores to columns 0..255 of the stage (WG2 reads 256..511)
                    yield from self.nb(actor, QK_WG, 128, ("zero", r, blk), True)
                yield ("step",)
                landed = has_next and self.k_full[n_index].done(n_phase)  # mbarrier.test_wait, per thread
                if not self.racy:  # warpgroup_any: bar.red.or over WG1's 128 threads, every tile
                    landed = yield from self.nb(actor, LANDED, 128, ("landed", r, blk), True, red=landed)
                if landed:
                    yield ("mwait", self.k_full[n_index], n_phase)
                    self.wgmma(actor, 1, "QK", [("sQ", ("Q", r)), (("sK", n_index), ("K", r, blk + 1))])
                    self.wgmma(actor, 1, "PV", [("sP", ("P", r, blk)), (("sK", k_index), ("K", r, blk))])
                    yield ("step",)
                    self.wait_group(actor, 1)
                    if blk + 2 == stop:
                        self.q_empty.arrive(("Q", r))
                    yield ("step",)
                    self.wait_group(actor, 0)
                    self.k_empty[k_index].arrive(("K", r, blk))
                else:
                    self.wgmma(actor, 1, "PV", [("sP", ("P", r, blk)), (("sK", k_index), ("K", r, blk))])
                    yield ("step",)
                    self.wait_group(actor, 0)
                    self.k_empty[k_index].arrive(("K", r, blk))
                    if has_next:
                        yield ("mwait", self.k_full[n_index], n_phase)
                        self.wgmma(actor, 1, "QK", [("sQ", ("Q", r)), (("sK", n_index), ("K", r, blk + 1))])
                        yield ("step",)
                        self.wait_group(actor, 0)
                        if blk + 2 == stop:
                            self.q_empty.arrive(("Q", r))
                if has_next:
                    yield from hand_off(r, blk + 1)
                k_index, k_phase = n_index, n_phase
            q_phase ^= 1
            yield from self.nb(actor, P_EMPTY, 256, ("inv", r), True)
            self.write(actor, "inv", ("inv", r))
            yield from self.nb(actor, P_FULL, 256, ("inv", r), False)
            yield ("step",)  # store_rows
        yield from self.nb(actor, P_EMPTY, 256, ("exit",), True)

    def wg2_warp(self, w):
        actor = f"WG2.w{w}"
        k_index, k_phase = 0, 0
        yield from self.nb(actor, P_EMPTY, 256, ("pre",), False)
        for r, start, stop, seqlen in self.chunks:
            for blk in range(start, stop):
                yield from self.nb(actor, P_FULL, 256, ("hand", r, blk), True)
                self.read(actor, "scale", ("P", r, blk))
                yield ("mwait", self.k_full[k_index], k_phase)
                if seqlen - blk * BLOCK_N < BLOCK_N:
                    yield from self.nb(actor, PV_WG, 128, ("zero", r, blk), True)
                self.wgmma(actor, 2, "PV", [("sP", ("P", r, blk)), (("sK", k_index), ("K", r, blk))])
                yield ("step",)
                self.wait_group(actor, 0)
                yield from self.nb(actor, P_EMPTY, 256, ("hand", r, blk), False)
                self.k_empty[k_index].arrive(("K", r, blk))
                k_index += 1
                if k_index == STAGES:
                    k_index, k_phase = 0, k_phase ^ 1
            yield from self.nb(actor, P_FULL, 256, ("inv", r), True)
            self.read(actor, "inv", ("inv", r))
            yield from self.nb(actor, P_EMPTY, 256, ("inv", r), False)
            yield ("step",)

    # ---------------------------------------------------------------- scheduler
    def make_actors(self) -> dict:
        """The warps of the modelled kernel: name -> generator (a subclass models another kernel)."""
        actors = {"producer": self.producer()}
        for w in range(WG_WARPS):
            actors[f"WG1.w{w}"] = self.wg1_warp(w)
            actors[f"WG2.w{w}"] = self.wg2_warp(w)
        return actors

    def run(self, max_steps=200000):
        actors = self.make_actors()
        blocked = {a: None for a in actors}  # actor -> op it waits on (None: runnable)
        alive = set(actors)

        def ready(op):
            if op is None:
                return True
            if op[0] == "mwait":
                return op[1].done(op[2])
            if op[0] == "nbwait":
                return op[1].generation > op[2]
            return True

        for _ in range(max_steps):
            runnable = [a for a in alive if ready(blocked[a])]
            choices = [("actor", a) for a in runnable] + [("land", i) for i in range(len(self.landings))]
            if not choices:
                if alive:
                    detail = {a: (blocked[a][0], getattr(blocked[a][1], "name", getattr(blocked[a][1], "bid", None)))
                              for a in sorted(alive)}
                    raise ProtocolError(f"deadlock: {detail}")
                break
            kind, x = self.rng.choice(choices)
            if kind == "land":
                self.land(x)
                continue
            try:
                op = next(actors[x])
                blocked[x] = op if op[0] in ("mwait", "nbwait") else None
            except StopIteration:
                alive.discard(x)
        else:
            raise ProtocolError("step limit")
        for bid, bar in self.named.items():
            if bar.arrived:
                raise ProtocolError(f"named barrier {bid}: {bar.arrived} arrivals pending at exit: {bar.tags}")


def chunk_list(spec):
    """[(seqlen, start, stop)] -> [(r, start, stop, seqlen)]"""
    return [(r, start, stop, seqlen) for r, (seqlen, start, stop) in enumerate(spec)]


SCENARIOS = {
    # tile counts [1, 3, 2]: first chunk a split tail, the middle a whole request, the last a split head
    "1-3-2": [(640, 9, 10), (150, 0, 3), (1000, 0, 2)],
    "5": [(300, 0, 5)],
    "2-1": [(4096, 62, 64), (20, 0, 1)],
    "5-5 (200x300 keys)": [(300, 0, 5), (300, 0, 5)],
    "0-length in the middle": [(128, 0, 2), (0, 0, 0), (65, 0, 2)],
    "1-1-1-1": [(64, 0, 1), (1, 0, 1), (63, 0, 1), (200, 3, 4)],
}


def collect_errors(make_sim, runs: int, seed: int = 0) -> dict:
    """{error key: [count, first message]} over ``runs`` schedules, ``make_sim(schedule_seed)`` building
    each run's simulator (this model's and the 2wg model's)."""
    errors = {}
    for i in range(runs):
        try:
            make_sim(seed * 100003 + i).run()
        except ProtocolError as e:
            msg = str(e)
            errors.setdefault(msg.split(":")[0], [0, msg])[0] += 1
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--racy", action="store_true", help="per-warp test_wait (the kernel before the fix)")
    args = ap.parse_args()
    failed = 0
    for name, spec in SCENARIOS.items():
        errors = collect_errors(lambda seed: Sim(chunk_list(spec), random.Random(seed), args.racy), args.runs,
                                args.seed)
        status = "ok" if not errors else "FAIL"
        failed += bool(errors)
        print(f"{name:28s} {args.runs} schedules: {status}")
        for key, (n, msg) in errors.items():
            print(f"    {n:4d} x {msg[:220]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
